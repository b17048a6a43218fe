"""Console progress: one line per event, as Keras and Lightning users expect.

`TrainProgress` and `EvalProgress` are Orbit actions (plain callables on the
controller's outputs). They read the global step once per loop, never per
step, so they add no device-to-host sync inside the training loop. Orbit's
controller prints each of its own lines to stdout and logs it too;
`quiet_orbit_controller` keeps them in the log only, so each event reaches
the console once.
"""

import io
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, TextIO

from absl import flags as absl_flags
from absl import logging
from orbit import controller as orbit_controller
import tensorflow as tf

from tfm_ext.config import environment
from tfm_ext.model_dir import _files
# Callers take the numbers of logs from here (`continuous_eval`, `notify`...).
from tfm_ext.actions.logs import scalars


def quiet_orbit_controller() -> None:
  """Sends Orbit's controller lines to the absl log only, not also stdout.

  Orbit prints and logs each line through its module's `_log` and has no
  public switch; the progress actions print their own lines, so each event
  would reach the console twice. This is the one place that replaces it.
  """
  orbit_controller._log = logging.info  # pylint: disable=protected-access


def examples_per_second(steps: int, seconds: float,
                        global_batch_size: int) -> Optional[float]:
  """Examples a second of `steps` global batches in `seconds` (None if 0).

  Every replica's step sees `global_batch_size / num_replicas_in_sync`
  rows, so a step is one global batch whatever the strategy.
  """
  if steps <= 0 or seconds <= 0:
    return None
  return steps * global_batch_size / seconds


def _format_logs(logs: Mapping[str, float]) -> str:
  return " | ".join(f"{k} {v:.4g}" for k, v in logs.items())


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class TrainProgress:
  """Prints `step N/T | <logs> | X ex/s | ETA h:mm:ss` after each train loop.

  Also measures what the run summary reports: time to the first step (from
  `start_time`) and examples per second in steady state, that is, over all
  loops after the first, which includes tracing.
  """

  def __init__(self, *, global_step, total_steps: int, global_batch_size: int,
               start_time: float, clock: Callable[[], float] = time.time,
               stream: Optional[TextIO] = None):
    self._global_step = global_step
    self._total_steps = total_steps
    self._batch = global_batch_size
    self._start_time = start_time
    self._clock = clock
    self._stream = stream or sys.stdout
    self._last: Optional[tuple] = None  # (step, time) at the previous loop end.
    self._steady: Optional[tuple] = None  # (step, time) at the first loop end.
    self._smoothed: Optional[tuple] = None  # (steps, seconds) a loop, averaged.
    self.time_to_first_step: Optional[float] = None
    self.examples_per_second: Optional[float] = None
    # Seconds left, as the last line said (None until a second loop ended).
    self.eta_seconds: Optional[float] = None
    self.last_logs: Dict[str, float] = {}

  def __call__(self, output: Mapping[str, Any]) -> None:
    now = self._clock()
    step = int(self._global_step.numpy())
    if self._last is not None and step == self._last[0] and not output:
      return  # A loop that ran no step (a signal came before it): no news.
    self.last_logs = scalars(output)
    parts = [f"step {step}/{self._total_steps}"]
    if self.last_logs:
      parts.append(_format_logs(self.last_logs))
    if self._steady is None:
      self._steady = (step, now)
      self.time_to_first_step = now - self._start_time
      parts.append(f"first step after {self.time_to_first_step:.1f}s")
    else:
      loop_rate = self._smoothed_rate(step - self._last[0],
                                      now - self._last[1])
      if loop_rate is not None:
        parts.append(f"{loop_rate:.0f} ex/s")
      steady_steps, steady_seconds = (step - self._steady[0],
                                      now - self._steady[1])
      steady_rate = examples_per_second(steady_steps, steady_seconds,
                                        self._batch)
      if steady_rate is not None:
        self.examples_per_second = steady_rate
        # From steps, not examples: a task may leave global_batch_size 0.
        remaining = max(self._total_steps - step, 0)
        self.eta_seconds = remaining * steady_seconds / steady_steps
        parts.append(f"ETA {_format_duration(self.eta_seconds)}")
    self._last = (step, now)
    print(" | ".join(parts), file=self._stream, flush=True)

  def _smoothed_rate(self, steps: int, seconds: float) -> Optional[float]:
    """Examples a second over recent loops, weighted toward the latest.

    Steps and seconds are averaged separately (exponentially, weight
    `SMOOTHING` on the latest loop), so a loop that also saved a checkpoint
    or evaluated moves the figure by a fraction, not by the whole gap
    between a small model's plain loop and that one.
    """
    if steps <= 0 or seconds <= 0:
      return None
    if self._smoothed is None:
      self._smoothed = (float(steps), seconds)
    else:
      self._smoothed = tuple(
          SMOOTHING * new + (1 - SMOOTHING) * old
          for new, old in zip((steps, seconds), self._smoothed))
    return examples_per_second(*self._smoothed, self._batch)


# Weight of the latest loop in the ex/s of the progress line.
SMOOTHING = 0.3

# A training loop longer than this says where it is, this often.
LOOP_PROGRESS_SECONDS = environment.seconds("TFM_EXT_LOOP_PROGRESS_SECONDS",
                                            30.0, zero=True)


class LoopTicker:
  """Prints `step N/T | in loop | X ex/s | ETA h:mm:ss` inside a long loop.

  TFM's ImageNet configs run thousands of steps a loop: the loop's line
  (`TrainProgress`) comes once in many minutes. `around(train)` wraps the
  trainer's `train(num_steps)`: while a loop runs, a thread of the host
  reads the global step every `every_seconds` (0: never) and prints the
  rate and the time left since the loop began. The step's own work is not
  touched: a read of one variable every 30 s. Where a loop runs on a
  device that answers only at its end (a TPU), the thread waits with it
  and says nothing.
  """

  def __init__(self, *, global_step, total_steps: int, global_batch_size: int,
               every_seconds: float = LOOP_PROGRESS_SECONDS,
               clock: Callable[[], float] = time.monotonic,
               stream: Optional[TextIO] = None):
    self._global_step = global_step
    self._total_steps = total_steps
    self._batch = global_batch_size
    self._every = every_seconds
    self._clock = clock
    self._stream = stream or sys.stdout
    self.lines = 0

  def around(self, train: Callable[[Any], Any]) -> Callable[[Any], Any]:
    if self._every <= 0:
      return train

    def train_saying_progress(num_steps):
      if int(num_steps) <= 1:  # The first step's loop: its own line says.
        return train(num_steps)
      done = threading.Event()
      thread = threading.Thread(
          target=self._tick, args=(done, int(self._global_step.numpy()),
                                   self._clock()),
          name="tfm_ext_loop_progress", daemon=True)
      thread.start()
      try:
        return train(num_steps)
      finally:
        done.set()

    return train_saying_progress

  def _tick(self, done: threading.Event, start_step: int,
            start: float) -> None:
    while not done.wait(self._every):
      try:
        step = int(self._global_step.numpy())
      except Exception:  # pylint: disable=broad-except
        return  # The run is ending; its own lines say how.
      seconds = self._clock() - start
      steps = step - start_step
      if done.is_set():
        return
      if steps <= 0:  # Still tracing, or waiting for its input: no rate.
        continue
      parts = [f"step {step}/{self._total_steps}", "in loop"]
      rate = examples_per_second(steps, seconds, self._batch)
      if rate is not None:
        parts.append(f"{rate:.0f} ex/s")
      remaining = max(self._total_steps - step, 0)
      parts.append(f"ETA {_format_duration(remaining * seconds / steps)}")
      print(" | ".join(parts), file=self._stream, flush=True)
      self.lines += 1


class EvalTicker:
  """Prints `eval @ step N | batch b/B | ETA h:mm:ss` during a long evaluation.

  `begin` at the start of an evaluation, `tick` after each batch (from the
  host: `CustomTrainer.eval_reduce`); a line every `every_seconds`, so an
  evaluation shorter than that prints none. `total` of -1 or None (the whole
  validation set) gives no ETA.
  """

  def __init__(self, *, total: Optional[int], every_seconds: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               stream: Optional[TextIO] = None):
    self._total = total if total and total > 0 else None
    self._every = every_seconds
    self._clock = clock
    self._stream = stream or sys.stdout
    self._step = self._batches = 0
    self._start = self._printed = 0.0

  def begin(self, global_step: int) -> None:
    self._step, self._batches = global_step, 0
    self._start = self._printed = self._clock()

  def tick(self) -> None:
    self._batches += 1
    now = self._clock()
    if now - self._printed < self._every:
      return
    self._printed = now
    parts = [f"eval @ step {self._step}", f"batch {self._batches}" + (
        f"/{self._total}" if self._total else "")]
    if self._total:
      left = (self._total - self._batches) * (now - self._start) / self._batches
      parts.append(f"ETA {_format_duration(left)}")
    print(" | ".join(parts), file=self._stream, flush=True)


class EvalProgress:
  """Prints `eval @ step N | <logs>` after each evaluation."""

  def __init__(self, *, global_step, stream: Optional[TextIO] = None):
    self._global_step = global_step
    self._stream = stream or sys.stdout
    self.last_logs: Dict[str, float] = {}

  def __call__(self, output: Mapping[str, Any]) -> None:
    self.last_logs = scalars(output)
    step = int(self._global_step.numpy())
    print(f"eval @ step {step} | {_format_logs(self.last_logs)}",
          file=self._stream, flush=True)


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
    log_dir = _files.local_path(logs)
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
