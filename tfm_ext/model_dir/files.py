"""How tfm_ext writes and reads its records in model_dir, local or a bucket.

Every record goes through `tf.io.gfile`, so `model_dir` may be a local path
or an object store (`gs://`, `s3://`; TensorFlow's in-memory `ram://` in
the tests). An object store has no append and no atomic rename (a rename is
a copy and a delete), and a listing may lag behind a write, so:

* a whole-file record (`write_json`) is never seen half-written: on a
  local path it is a temp file and a rename (atomic on POSIX); in an
  object store one write of the object, which the store makes visible
  whole when the write is closed;
* a log of events is a directory of records, one object each
  (`write_record`), never a file appended to. `read_records` skips, with a
  warning, a record it cannot parse (cut short, binary garbage, not an
  object, a value of the wrong type); a caller must not expect the listing
  to hold what it wrote a moment ago.

A whole-file record that is damaged reads as `Damaged` (`read_object`), a
`ValueError` whose message names the file and what is wrong with it, for
the caller to rebuild the record or refuse the run.

While a trainer holds the lease of a `model_dir` (`tfm_ext.model_dir.lease`), every
write under it first runs the lease's check (`fence`): a trainer that lost
the lease raises there and writes nothing.
"""

import contextlib
import json
import os
import threading
import time
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from absl import logging
import tensorflow as tf

from tensorflow.python.lib.io import file_io  # pylint: disable=g-direct-tensorflow-import

from tfm_ext.base import values
from tfm_ext.base import settings
from tfm_ext.base import signalled

_FILE_SCHEME = "file://"
_RECORD_SUFFIX = ".json"


# Directory -> (the check a write under it runs first, the exempt path).
_fences: Dict[str, Tuple[Callable[[], None], str]] = {}
_fences_lock = threading.Lock()


def fence(directory: str, check: Callable[[], None],
          exempt: str = "") -> Callable[[], None]:
  """Runs `check` before every write under `directory` but `exempt`.

  Returns the function that lifts the fence.
  """
  key = directory.rstrip("/") + "/"
  with _fences_lock:
    _fences[key] = (check, exempt)

  def lift():
    with _fences_lock:
      if _fences.get(key, (None,))[0] is check:
        del _fences[key]
  return lift


def check_fence(path: str) -> None:
  """Runs the fence's check of the directory `path` is under, if any."""
  with _fences_lock:
    fences = list(_fences.items())
  for directory, (check, exempt) in fences:
    if path.startswith(directory) and path != exempt:
      check()


def in_directory(directory: str, path: str) -> bool:
  """Whether `path` names an entry of `directory` itself (not a deeper one).

  A record that names files (the checkpoint state file, a manifest) is
  followed only for those: a copied model_dir's state file names the
  original's checkpoints by absolute path, and a run that rotated them
  deleted another run's files. A bare name is `directory`'s entry, as a
  state file holds it; any other relative path is the working directory's,
  as a manager of a relative `directory` holds its checkpoints
  (`run/ckpt-5`); `..` and a URL's scheme are normalized.
  """
  def normal(p):
    scheme, sep, rest = p.rpartition("://")
    return scheme + sep + (os.path.normpath(rest or "/") if sep
                           else os.path.abspath(p))
  bare = not ("://" in path or os.path.isabs(path) or os.path.dirname(path))
  full = os.path.join(directory, path) if bare else path
  return os.path.dirname(normal(full)) == normal(directory)


def local_path(path: str) -> Optional[str]:
  """`path` on the local file system, or None for another scheme (`gs://`)."""
  if path.startswith(_FILE_SCHEME):
    return path[len(_FILE_SCHEME):]
  return None if "://" in path else path


def unusable_path(path: str) -> str:
  """Why TensorFlow's file systems cannot take `path`; "" if they can.

  They take UTF-8 only: a path of other bytes (which Python reads from the
  command line as surrogate escapes) raises `UnicodeEncodeError` at the
  first file call. On a local disk, a name longer than the file system
  allows (`NAME_MAX`, 255 bytes on most) fails at the first write, with
  `ENAMETOOLONG` on whichever file that is.
  """
  try:
    path.encode("utf-8")
  except UnicodeEncodeError as e:
    raw = path[e.start:e.end].encode("utf-8", "surrogateescape")
    return (f"its bytes {raw!r} (at character {e.start}) are not UTF-8, and "
            "TensorFlow's file systems take UTF-8 paths only")
  local = local_path(path)
  if local is None:
    return ""
  existing = os.path.abspath(local)
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  try:
    longest = os.pathconf(existing, "PC_NAME_MAX")
  except (OSError, ValueError):
    longest = 255
  for name in local.split(os.sep):
    size = len(name.encode("utf-8"))
    if size > longest:
      return (f"its name {name[:24]!r}... is {size} bytes long, and this "
              f"file system takes at most {longest}")
  return ""


class Traces:
  """What a job finds in a local `directory`, to take back if it is refused.

  A refused job (a usage error, exit 2) leaves the model_dir as it found
  it: a start makes a log file and directories (`logs/`, the lease's
  claims) before some refusals can be known (an unknown model name is
  found when the task builds it). `take_back` deletes the job's own files
  and the empty directories it added, unless it added a record: then
  nothing. A bucket has no directories, and its log is copied only at the
  end: there is nothing to take back.
  """

  def __init__(self, directory: str):
    self._local = local_path(directory)
    self._existed = bool(self._local) and os.path.isdir(self._local)
    self._found = set(os.listdir(self._local)) if self._existed else set()

  def take_back(self, own: Sequence[str]) -> bool:
    """Deletes `own` files and the empty directories added since; see above.

    Returns whether it did: False if the job added a file that is not
    `own` (a record), or the directory is not local.
    """
    if not self._local or not os.path.isdir(self._local):
      return False
    own = {os.path.abspath(p) for p in own if p}
    added = [os.path.join(self._local, name)
             for name in os.listdir(self._local) if name not in self._found]
    files = [top for top in added if not os.path.isdir(top)] + [
        os.path.join(root, name) for top in added
        for root, _, names in os.walk(top) for name in names]
    if any(os.path.abspath(f) not in own for f in files):
      return False
    for path in own:
      _remove_quietly(path)
    for top in added:
      for root, _, _ in sorted(os.walk(top), reverse=True):
        _remove_quietly(root, directory=True)
    if not self._existed:
      _remove_quietly(self._local, directory=True)
    return True


def _remove_quietly(path: str, directory: bool = False) -> None:
  try:
    (os.rmdir if directory else os.remove)(path)
  except OSError:
    pass  # Not empty (another job's), or gone: it is not ours to take.


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` whole: a reader never sees it half-written.

  TensorFlow's rule for the file system decides, as for its own checkpoint
  state file: a temp file and a rename where it says the rename is atomic
  (a local disk, HDFS, `ram://`, where a write over a longer file would
  also leave that file's tail; TensorFlow 2.20 says so for `gs://` too,
  where the rename is a server-side copy and a delete), else one write of
  the object.
  gfile has no fsync: a record survives a killed process, as TensorFlow's
  own files do, not necessarily a power cut.
  """
  check_fence(path)
  file_io.atomic_write_string_to_file(path, text)


def write_bytes(path: str, data: bytes) -> None:
  """Writes `data` (a PNG, say) to `path` whole, as `write_text` does."""
  check_fence(path)
  file_io.atomic_write_string_to_file(path, data)


def write_json(path: str, value: Any) -> None:
  """Writes `value` as indented JSON to `path`, whole (`write_text`)."""
  write_text(path, json.dumps(value, indent=2) + "\n")


# The run's looks after a stop signal, while it waits on a store
# (`listening`); the innermost last.
_looks: List[Callable[[], None]] = []


@contextlib.contextmanager
def listening(look: Callable[[], None]) -> Iterator[None]:
  """Within it, a store wait of the main thread ends by `look` at a signal.

  A store wait (`read_bytes` reading a record again while a cache may be
  stale, `tfm_ext.model_dir.usable.within` waiting for a store to answer)
  sleeps with `signalled.sleep` and then calls `heard`, which runs `look`
  (the run's `SignalWatcher.check_start`) once a stop signal came: `look`
  raises, and the wait ends with it, within a poll. The driver listens
  while the run starts (its checks, the lease, the parts built), where
  nothing a wait reads has been acted on yet. Elsewhere (the loop, where a
  signal stops the run after the step and its save; a heartbeat's thread)
  a wait goes on to its bound: a record read in it is never taken for
  damaged because a signal cut its wait short.
  """
  _looks.append(look)
  try:
    yield
  finally:
    _looks.remove(look)


def heard() -> None:
  """Runs the innermost look of `listening` if a stop signal came.

  Only from the main thread, where the run waits; it returns when no look
  listens or the look did not raise.
  """
  if (_looks and signalled.came()
      and threading.current_thread() is threading.main_thread()):
    _looks[-1]()


def _pause(seconds: float) -> None:
  """Sleeps `seconds` between two reads of a store wait; see `listening`."""
  end = time.monotonic() + seconds
  if _looks and threading.current_thread() is threading.main_thread():
    signalled.sleep(seconds)
    heard()
  time.sleep(max(end - time.monotonic(), 0.0))  # A look that did not raise.


# TensorFlow's GCS client caches an object's length for
# GCS_STAT_CACHE_MAX_AGE seconds (5 by default): another process's rewrite
# then reads as "File contents are inconsistent" (shorter) or cut short at
# the old length (longer). A record that reads so is read again, once the
# cache has aged, before it is taken for damaged.


def read_bytes(path: str, whole: Callable[[bytes], bool] = lambda _: True
               ) -> bytes:
  """The bytes at `path`, read again while a store's cache may be stale.

  On an object store, a read that raises TensorFlow's `InternalError`, or
  whose bytes `whole` rejects, is retried until
  `settings.stale_read_seconds` have passed; the last read is returned (or
  raises). A local path is read once. While the run starts, a stop signal
  ends the wait (`listening`).
  """
  deadline = None
  while True:
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
      if whole(data) or local_path(path) is not None:
        return data
    except tf.errors.InternalError:
      if local_path(path) is not None:
        raise
      data = None
    deadline = deadline or (time.monotonic()
                            + settings.get().stale_read_seconds)
    if time.monotonic() > deadline:
      if data is None:
        with tf.io.gfile.GFile(path, "rb") as f:  # Raises what it raises.
          return f.read()
      return data
    _pause(0.5)


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def read_json(path: str) -> Any:
  return json.loads(read_bytes(path, _parses).decode("utf-8"))


def _parses(data: bytes) -> bool:
  try:
    json.loads(data.decode("utf-8"))
    return True
  except ValueError:
    return False


class Damaged(ValueError):
  """A record in model_dir that is not what tfm_ext wrote there."""


# `{key: type}` of a record's required values; a bare sequence of keys takes
# any type.
Required = Union[Sequence[str], Mapping[str, Union[type, tuple]]]


def read_object(path: str, required: Required = ()) -> Dict[str, Any]:
  """The JSON object at `path`, holding `required`.

  Raises:
    Damaged: it is not UTF-8 JSON text, not an object, or lacks a required
      value (a missing file raises `tf.errors.NotFoundError`).
  """
  data = read_bytes(path, lambda data: _decode(data, required)[0] is not None)
  value, problem = _decode(data, required)
  if value is None:
    raise Damaged(f"{path} is damaged: {problem}")
  return value


def write_record(directory: str, name: str, value: Dict[str, Any]) -> None:
  """Adds `directory/<name>.json` to a set of records; see `read_records`."""
  tf.io.gfile.makedirs(directory)
  write_json(os.path.join(directory, name + _RECORD_SUFFIX), value)


def read_records(directory: str, required: Required,
                 legacy_file: Optional[str] = None) -> List[Dict[str, Any]]:
  """The records in `directory` that parse and hold `required`, by name.

  A record that does not (cut short, binary garbage, not ours) is skipped
  with a warning; one listed but gone by the time it is read is skipped
  too. The lines of `legacy_file`, the append-only JSON-lines file that
  tfm_ext kept before one object per record, come first.
  """
  records = _read_json_lines(legacy_file, required) if legacy_file else []
  if not tf.io.gfile.isdir(directory):
    return records
  for name in sorted(tf.io.gfile.listdir(directory)):
    if not name.endswith(_RECORD_SUFFIX):
      continue  # A local temp file that a crash left, or a stray object.
    path = os.path.join(directory, name)
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    except tf.errors.NotFoundError:
      logging.warning("Skipping record %s: listed, then gone.", path)
      continue
    record = _parse(data, required, path)
    if record is not None:
      records.append(record)
  return records


def _read_json_lines(path: str, required: Required) -> List[Dict[str, Any]]:
  if not tf.io.gfile.exists(path):
    return []
  with tf.io.gfile.GFile(path, "rb") as f:
    lines = f.read().split(b"\n")
  records = []
  for number, line in enumerate(lines, 1):
    if line.strip():
      record = _parse(line, required, f"{path}:{number}")
      if record is not None:
        records.append(record)
  return records


def _parse(data: bytes, required: Required,
           where: str) -> Optional[Dict[str, Any]]:
  record, problem = _decode(data, required)
  if record is None:
    logging.warning("Skipping %s: not a whole record (cut short by a "
                    "crash?): %s; %.80r", where, problem, data)
  return record


def _decode(data: bytes,
            required: Required) -> Tuple[Optional[Dict[str, Any]], str]:
  """`data` as a JSON object holding `required`, or None and what is wrong."""
  try:
    value = json.loads(data.decode("utf-8"))
  except UnicodeDecodeError:
    return None, "not UTF-8 text"
  except ValueError as e:
    return None, f"not JSON ({e})"
  if not isinstance(value, dict):
    return None, f"JSON {type(value).__name__}, not an object"
  types = (required if isinstance(required, Mapping)
           else dict.fromkeys(required, object))
  missing = [key for key in types if key not in value]
  if missing:
    return None, "no " + ", ".join(missing)
  # JSON's true and false are not numbers.
  wrong = [f"{key}={value[key]!r}" for key, kind in types.items()
           if not values.is_a(value[key], kind)]
  if wrong:
    return None, "wrong type: " + ", ".join(wrong)
  return value, ""
