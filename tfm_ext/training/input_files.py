"""The input files a run reads, checked before it reads them.

What TensorFlow 2.20's `tf.data.TFRecordDataset` does with a damaged file
(measured; each record is framed as an 8-byte length, a 4-byte checksum of
the length, the data, a 4-byte checksum of the data):

* cut within a record's 12-byte header: the file ends there, silently; the
  records before it are read, no error, no warning;
* cut after a header (within the data or its checksum): `DataLossError`
  "truncated record at <byte>", naming no file;
* a header or data that does not match its checksum: `DataLossError`
  "corrupted record at <byte>", naming no file;
* cut exactly between two records: a shorter, valid file (nothing can tell);
* a named pipe (FIFO): the open waits for a writer without end, and the
  next epoch's open again (refused, as is a device or a socket);
* a directory: `FailedPreconditionError` "<path>; Is a directory"; a file
  gone: `NotFoundError` "<path>; No such file or directory", both when the
  iterator first reaches it, which names the path.

No option of `TFRecordDataset` (`buffer_size`, `compression_type`,
`num_parallel_reads`) makes a cut header an error. So before the run builds
its pipelines, `check` walks the framing of every local TFRecord file of
`task.train_data` (and `task.validation_data` when the mode evaluates): one
12-byte read per record, its header, never its data; the file must end
where its last record does. That finds every cut but one between records,
whatever reads the files (TFM's `InputReader`, a task's own pipeline), since
it goes by the config's `input_path`, not by the pipeline, and it fails the
run before its first step, not an epoch in. It costs a read of one disk
block per record, never the data (about 1,300 for a 140 MB ImageNet
shard), with 16 files walked at once: a seek per record from a cold disk. Checking each file's end
inside the pipeline would read nothing more, but only in pipelines built
with our dataset function, not in a TFM task's own.

An object store (`gs://`, `s3://`) is not walked: that is a request per
record. Each object is only looked up (there, not a directory): an object is
written whole (an upload that fails leaves none), so a cut-short object is
one its writer cut, not a copy interrupted on the way.

A task that makes its data reads no files: TFM's convention is a
`use_synthetic_data` field, on the data config (our ImageNet experiment) or
on the task config for all of its data (TFM's ranking task). Then neither
this check nor `tfm_ext.config.checks`' (a pattern that matches no file) looks
at `input_path` (`reads_files`).

A file is taken for a TFRecord file when the data config's `file_type` is
"tfrecord" (TFM's default) and its first header's checksum matches: a task
that reads another format from `input_path` is left alone.

A problem is a `RunFailed` (exit 3) naming the field, the file and what is
wrong. A file checked once in a process, unchanged since (size and
modification time), is not read again.
"""

import concurrent.futures
import dataclasses
import os
import stat
import struct
import time
from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from official.core import input_reader

from tfm_ext.base.errors import RunFailed
from tfm_ext.model_dir import files

_HEADER_BYTES = 12  # The data's length (uint64) and its masked CRC-32C.
_FOOTER_BYTES = 4  # The data's masked CRC-32C.
_PARALLEL_FILES = 16
_SHOWN = 5  # Files named in one message; the rest are counted.


@dataclasses.dataclass(frozen=True)
class Framing:
  """What the walk of one file found.

  `records` is None where the file was not walked (an object store, another
  format); `problem` is empty for a file that frames.
  """
  records: Optional[int]
  problem: str = ""
  size: int = 0


# (local path, size, mtime in ns) -> its framing: a file is walked once.
_walked: Dict[Tuple[str, int, int], Framing] = {}


def check_framing(params, *, trains: bool, evaluates: bool) -> None:
  """Raises `RunFailed` for a damaged input file the run would read.

  `task.train_data` when the mode `trains`, `task.validation_data` when it
  `evaluates`; see the module docstring.
  """
  task = params.task
  if trains and reads_files(task, task.train_data):
    check_data("task.train_data", task.train_data, need_records=True)
  if evaluates and reads_files(task, task.validation_data):
    check_data("task.validation_data", task.validation_data)


def reads_files(task, data) -> bool:
  """Whether the task reads the files of `data`, one of its data configs.

  Not where it makes synthetic data instead: `use_synthetic_data` is true
  on `data` or on `task` (see the module docstring).
  """
  return not any(getattr(config, "use_synthetic_data", False) is True
                 for config in (data, task))


def check_data(where: str, data, need_records: bool = False) -> None:
  """Checks the files of `data`, the data config at `where`.

  With `need_records`, files that are all empty are an error too (nothing to
  train on); an empty validation set is `tfm_ext.training.eval_count`'s to report.
  """
  files = matched_files(data)
  if not files:
    return
  start = time.monotonic()
  framings = _framings(files, walk=_is_tfrecord(data))
  bad = [(path, f.problem) for path, f in zip(files, framings) if f.problem]
  pattern = f"{where}.input_path={getattr(data, 'input_path', '')!r}"
  if bad:
    shown = "; ".join(f"{path} {problem}" for path, problem in bad[:_SHOWN])
    more = f"; and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
    raise RunFailed(
        f"{pattern}: {shown}{more}. Copy or regenerate the file, or leave it "
        "out of input_path, then relaunch.")
  if need_records and all(f.size == 0 for f in framings):
    raise RunFailed(
        f"{pattern}: every file it names is empty (0 bytes): "
        f"{', '.join(files[:_SHOWN])}. There is nothing to read; point "
        "input_path at files that hold records.")
  walked = [f.records for f in framings if f.records is not None]
  if walked:
    logging.info("Checked the framing of %d TFRecord file(s) of %s: %d "
                 "records, in %.2f s.", len(walked), where, sum(walked),
                 time.monotonic() - start)


def record_count(data) -> Optional[int]:
  """The records the files of `data` hold; None where that is not known."""
  files = matched_files(data)
  if not files or not _is_tfrecord(data):
    return None
  framings = _framings(files, walk=True)
  if any(f.records is None or f.problem for f in framings):
    return None
  return sum(f.records for f in framings)


def matched_files(data) -> List[str]:
  """The files `data.input_path` names, as TFM's `InputReader` matches them.

  Empty for TFDS, a combined dataset (a `Config` of paths), no input_path,
  or a pattern that matches nothing (`tfm_ext.config.checks` refuses that).
  """
  input_path = getattr(data, "input_path", "")
  if (getattr(data, "tfds_name", "") or not input_path
      or not isinstance(input_path, (str, list, tuple))):
    return []
  try:
    return input_reader.match_files(input_path)
  except ValueError:
    return []


def framing(path: str, walk: bool = True) -> Framing:
  """The `Framing` of the file at `path` (walked only if local and `walk`)."""
  local = files.local_path(path)
  if local is None:
    return _look_up(path)
  try:
    info = os.stat(local)
  except FileNotFoundError:
    return Framing(None, "does not exist (deleted or moved after it was "
                   "listed?)")
  except OSError as e:
    return Framing(None, f"cannot be read: {e.strerror}")
  if stat.S_ISDIR(info.st_mode):
    return Framing(None, _DIRECTORY)
  if not stat.S_ISREG(info.st_mode):
    # Opening a pipe waits for its writer, without end; reading a device
    # may not end. TensorFlow reads each file again every epoch.
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(info.st_mode) else
            "a socket" if stat.S_ISSOCK(info.st_mode) else "a device")
    return Framing(None, f"is {kind}, not a file: input_path takes regular "
                   "files, which TensorFlow reads again every epoch")
  if not walk:
    return Framing(None, size=info.st_size)
  key = (local, info.st_size, info.st_mtime_ns)
  if key not in _walked:
    _walked[key] = _walk(local, info.st_size)
  return _walked[key]


_DIRECTORY = ("is a directory: input_path takes files or patterns of files, "
              "such as 'dir/*' or 'dir/train-*'")


def _framings(files: Sequence[str], walk: bool) -> List[Framing]:
  if len(files) == 1:
    return [framing(files[0], walk)]
  with concurrent.futures.ThreadPoolExecutor(
      min(_PARALLEL_FILES, len(files))) as pool:
    return list(pool.map(lambda path: framing(path, walk), files))


def _is_tfrecord(data) -> bool:
  return getattr(data, "file_type", "tfrecord") == "tfrecord"


def _look_up(path: str) -> Framing:
  """An object store's file: there, and not a directory; not read."""
  try:
    if tf.io.gfile.isdir(path):
      return Framing(None, _DIRECTORY)
    return Framing(None, size=tf.io.gfile.stat(path).length)
  except tf.errors.NotFoundError:
    return Framing(None, "does not exist (deleted or moved after it was "
                   "listed?)")
  except tf.errors.OpError as e:
    return Framing(None, f"cannot be read: {e.message}")


def _walk(path: str, size: int, verify: bool = False) -> Framing:
  """Follows the record headers of the file at `path` to its end.

  With `verify` each header's checksum is checked too: a walk that failed
  is run again so, to tell a file cut short from one corrupted before.
  """
  offset = records = 0
  try:
    with open(path, "rb", buffering=0) as f:
      while offset < size:
        header = os.pread(f.fileno(), _HEADER_BYTES, offset)
        framed = len(header) == _HEADER_BYTES and _length_framed(header)
        if records == 0 and len(header) == _HEADER_BYTES and not framed:
          return Framing(None, size=size)  # Not a TFRecord file.
        if verify and not framed and len(header) == _HEADER_BYTES:
          return Framing(records, (
              f"is corrupted: the header of record {records + 1} (at byte "
              f"{offset}) does not match its checksum"), size)
        if len(header) < _HEADER_BYTES:
          problem = (
              f"is cut short: it ends {len(header)} byte(s) into the header "
              f"of record {records + 1} (at byte {offset}), after {records} "
              "whole record(s); TensorFlow would read those and skip the "
              "rest without a word")
          return _walk(path, size, True) if not verify else Framing(
              records, problem, size)
        end = offset + _HEADER_BYTES + _length(header) + _FOOTER_BYTES
        if end > size:
          problem = (f"is cut short: record {records + 1} (at byte {offset}) "
                     f"needs {end - size} byte(s) more than the file's {size}")
          return _walk(path, size, True) if not verify else Framing(
              records, problem, size)
        offset, records = end, records + 1
  except OSError as e:
    return Framing(None, f"cannot be read: {e.strerror}", size)
  return Framing(records, size=size)


def _length(header: bytes) -> int:
  return struct.unpack("<Q", header[:8])[0]


def _length_framed(header: bytes) -> bool:
  """Whether a header's length matches its checksum, as TFRecords frame it."""
  return struct.unpack("<I", header[8:12])[0] == _masked_crc32c(header[:8])


def _crc32c_table() -> List[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC32C_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
  """TFRecord's masked CRC-32C (Castagnoli) of `data`."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
