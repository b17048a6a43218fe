"""Whether a `model_dir` can be used, checked before anything is written.

Every mode writes into `model_dir` (a checkpoint, a record, a summary, the
log), so before the first byte goes anywhere `check` makes sure it can:

* its path holds no glob metacharacter (`*`, `?`, `[`): TensorFlow's
  `CheckpointManager` and the best-checkpoint exporter delete old
  checkpoints by `glob(prefix + ".*")`, so `job[1]`'s cleanup would match
  and delete `job1`'s checkpoints, and never its own;
* on a local disk: it is a directory, or can be made one (its nearest
  existing ancestor is a directory), on a file system mounted writable,
  that this user may write to;
* elsewhere (`gs://`, `s3://`...): the store answers a stat of it within
  `STORE_TIMEOUT_SECONDS` (with the credentials at hand); a store that
  refuses, or does not answer, is refused with what to check.

Each problem is a `UsageError` of one paragraph (exit 2). A path that
passed is not checked again in this process.
"""

import os
import threading
from typing import Optional

import tensorflow as tf

from tfm_ext import _files
from tfm_ext.errors import UsageError

GLOB_CHARACTERS = "*?["
# A stat of a bucket takes well under a second where the store answers;
# TensorFlow's own retries of an unreachable host take longer.
STORE_TIMEOUT_SECONDS = 30.0

# Less free space than this on a local model_dir's disk cannot hold a
# checkpoint of any model: refused before the first write.
MIN_FREE_BYTES = 1 << 20
# Stores whose first path element is a bucket that must exist.
BUCKETS = ("gs", "s3")

_checked = set()


def check(model_dir: str, *,
          store_timeout: float = STORE_TIMEOUT_SECONDS) -> None:
  """Raises `UsageError` if `model_dir` cannot be written; writes nothing."""
  if model_dir in _checked:
    return
  if not model_dir:
    raise UsageError("--model_dir is empty: give the directory to write to.")
  found = sorted(set(GLOB_CHARACTERS) & set(model_dir))
  if found:
    raise UsageError(
        f"--model_dir={model_dir!r} holds {' and '.join(map(repr, found))}: "
        "TensorFlow deletes old checkpoints by a glob of their path, which "
        "would match other directories' checkpoints (for 'job[1]': job1's) "
        "and never this one's. Use a path without *, ? and [.")
  local = _files.local_path(model_dir)
  if local is not None:
    _check_local(model_dir, local)
  else:
    _check_store(model_dir, store_timeout)
  _checked.add(model_dir)


def _check_local(model_dir: str, path: str) -> None:
  path = os.path.abspath(path)
  existing = path
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  what = ("--model_dir" if existing == path
          else f"--model_dir={model_dir!r}: its parent")
  if not os.path.isdir(existing):
    kind = "a file" if os.path.exists(existing) else "a dangling link"
    raise UsageError(
        f"{what} {existing!r} is {kind}, not a directory. Give a directory "
        "(it is made if missing).")
  try:
    stat = os.statvfs(existing)
  except OSError:
    stat = None
  if stat is not None and stat.f_flag & os.ST_RDONLY:
    raise UsageError(
        f"{what} {existing!r} is on a read-only file system. Give a "
        "directory where this job may write.")
  free = stat.f_bavail * stat.f_frsize if stat is not None else None
  if free is not None and free < MIN_FREE_BYTES:
    raise UsageError(
        f"{what} {existing!r} is on a file system with {free} bytes free: "
        "too little for a checkpoint. Free space, or give a directory on "
        "another disk.")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(
        f"{what} {existing!r} is not writable by this user (uid "
        f"{os.getuid()}). Give a directory where this job may write, or "
        "change its permissions.")


def _check_store(model_dir: str, timeout: float) -> None:
  """Stats `model_dir` in a thread; refuses an error or no answer in time."""
  result = {}

  scheme, _, rest = model_dir.partition("://")
  bucket = f"{scheme}://{rest.split('/')[0]}" if scheme in BUCKETS else ""

  def stat():
    try:
      # TensorFlow's makedirs in a missing bucket retries without end.
      result["bucket"] = not bucket or tf.io.gfile.isdir(bucket)
      if not result["bucket"]:
        return
      result["exists"] = tf.io.gfile.exists(model_dir)
      if result["exists"]:
        result["isdir"] = tf.io.gfile.isdir(model_dir)
    except Exception as e:  # pylint: disable=broad-except
      result["error"] = e

  thread = threading.Thread(target=stat, daemon=True,
                            name="tfm_ext_model_dir_check")
  thread.start()
  thread.join(timeout)
  advice = ("Check the bucket's name, the credentials at hand "
            "(GOOGLE_APPLICATION_CREDENTIALS, gcloud auth) and the network.")
  if thread.is_alive():
    raise UsageError(
        f"--model_dir={model_dir!r} did not answer within {timeout:.0f}s. "
        + advice)
  error: Optional[BaseException] = result.get("error")
  if error is not None:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else (
        type(error).__name__)
    raise UsageError(f"--model_dir={model_dir!r} cannot be used: {reason}. "
                     + advice)
  if not result.get("bucket"):
    raise UsageError(f"--model_dir={model_dir!r}: the bucket {bucket} does "
                     "not exist, or these credentials may not see it. "
                     + advice)
  if result.get("exists") and not result.get("isdir"):
    raise UsageError(f"--model_dir={model_dir!r} is an object, not a "
                     "directory. Give a directory.")
