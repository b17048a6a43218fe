"""The run's log file: the full absl log in `model_dir/logs/`, the console kept
to progress lines and warnings.

`hold_log` keeps what is logged while a job is prepared off the console;
`log_to_files` opens the file and writes it there first. A `model_dir` in
a bucket gets its log copied in when the job ends (absl writes local files
only).
"""

import io
import itertools
import os
import shutil
import sys
import tempfile
from typing import Callable, List, Optional

from absl import flags as absl_flags
from absl import logging
import tensorflow as tf

from tfm_ext.model_dir import files


def hold_log() -> None:
  """Keeps the absl log off the console until `log_to_files` opens its file.

  Without a log file absl writes every record to stderr, so what is logged
  while a job is prepared (TensorFlow's `Using MirroredStrategy ...`, twice
  with TensorFlow's own handler) would reach the console. Held in memory
  instead, those records begin the log file; warnings and errors reach the
  console at once. A job that ends before it opens a log file (bad flags, an
  unusable model_dir) writes them nowhere. `--logtostderr` and
  `--alsologtostderr` keep absl's behaviour.
  """
  flags = absl_flags.FLAGS
  _quiet_tensorflow_logger()
  if flags.logtostderr or flags.alsologtostderr:
    return
  handler = logging.get_absl_handler().python_handler
  if handler.stream is sys.stderr:
    handler.stream = io.StringIO()
  if not flags["stderrthreshold"].present:
    flags.stderrthreshold = "warning"


def _quiet_tensorflow_logger() -> None:
  """Sends TensorFlow's Python records through absl's handler alone.

  TensorFlow's logger has a stderr handler of its own; without it its
  records reach the absl handler, and so the file, like the others.
  """
  tf_logger = tf.get_logger()
  for handler in list(tf_logger.handlers):
    tf_logger.removeHandler(handler)


def log_to_files(model_dir: Optional[str]) -> Callable[..., List[str]]:
  """Keeps the console to progress lines and warnings; the rest goes to a file.

  The full absl log goes to `model_dir/logs/` (absl's default log dir when
  `model_dir` is None: a non-chief worker). `--alsologtostderr` or
  `--logtostderr` bring it back to the console, `--stderrthreshold` tunes it.

  absl writes local files only: for a `model_dir` in a bucket (`gs://`...)
  the log goes to a local temp dir (`tfm_ext_logs_*` in `$TMPDIR`), and the
  function returned copies it into `model_dir/logs/` and deletes the temp
  dir. Call that when the job ends, however it ends (a no-op where the log
  is already in place); what is logged after it is not kept. It returns
  the local files the log left in `model_dir` (the log and absl's link to
  it); `keep=False` (a refused job) copies nothing into a bucket.
  """
  flags = absl_flags.FLAGS
  if flags.logtostderr or flags.alsologtostderr:
    return lambda keep=True: []
  log_dir = bucket_dir = None
  if model_dir:
    logs = os.path.join(model_dir, "logs")
    log_dir = files.local_path(logs)
    if log_dir is None:
      bucket_dir, log_dir = logs, tempfile.mkdtemp(prefix="tfm_ext_logs_")
    os.makedirs(log_dir, exist_ok=True)
  handler = logging.get_absl_handler().python_handler
  held = handler.stream
  link = os.path.join(log_dir, "tfm_ext.INFO") if log_dir else ""
  previous = os.readlink(link) if link and os.path.islink(link) else None
  logging.get_absl_handler().use_absl_log_file("tfm_ext", log_dir)
  if isinstance(held, io.StringIO):  # `hold_log`'s records come first.
    handler.stream.write(held.getvalue())
  _quiet_tensorflow_logger()
  if not flags["stderrthreshold"].present:
    flags.stderrthreshold = "warning"
  path = logging.get_log_file_name()
  if bucket_dir is None:
    def finish(keep=True):
      if keep or not model_dir:
        return []
      if previous is None:  # absl's link to the latest log: ours.
        return [path, link]
      _point(link, previous)  # The log before this one's is the latest.
      return [path]

    return finish

  def finish(keep=True):
    if keep:
      _copy_log(path, bucket_dir, temp_dir=log_dir)
    else:
      shutil.rmtree(log_dir, ignore_errors=True)
    return []

  return finish


def _point(link: str, target: str) -> None:
  """Makes `link` a symbolic link to `target`, replacing it in one step."""
  temp = f"{link}.{os.getpid()}"
  try:
    os.symlink(target, temp)
    os.replace(temp, link)
  except OSError:
    pass  # The link only points at a log: the logs stay.


def _copy_log(path: str, log_dir: str, temp_dir: Optional[str] = None) -> None:
  """Copies the log file `path` into `log_dir`, then deletes `temp_dir`.

  absl names a log by program, host, user, second and pid: two runs of one
  process within a second share a name. The later copy takes the first of
  `name.1`, `name.2`... that is free rather than overwrite the earlier one.
  A copy that fails keeps `temp_dir`, and the warning says where the log is.
  """
  logging.flush()
  target = os.path.join(log_dir, os.path.basename(path))
  try:
    tf.io.gfile.makedirs(log_dir)
    for n in itertools.count(1):
      if not tf.io.gfile.exists(target):
        break
      target = os.path.join(log_dir, f"{os.path.basename(path)}.{n}")
    tf.io.gfile.copy(path, target)
  except tf.errors.OpError as e:
    # The job's own exit code matters more than its log: warn, go on.
    logging.warning("Could not copy the log to %s: %s. It is kept at %s.",
                    target, str(e).splitlines()[0], path)
    return
  if temp_dir:
    # absl keeps the file open: later records go to the deleted file.
    shutil.rmtree(temp_dir, ignore_errors=True)
