"""A record one process owns in model_dir: how it is written, renewed and judged.

tfm_ext keeps several small JSON records in `model_dir`, each owned by one
process while it runs: the trainer lease and its claims (`tfm_ext.model_dir.lease`),
an evaluator's claim on a checkpoint and its presence
(`tfm_ext.model_dir.eval_claims`). An interrupted export names its partial copy after
its owner the same way (`tfm_ext.model_dir.export`). They are one mechanism:

* the owner is a `Process`: its host, its pid, and its pid space (kernel
  boot and pid namespace), where the pid names one process;
* the owner writes its record whole (`Record.write`, through
  `tfm_ext.model_dir._files`; `pad_to` gives each rewrite the same length, so that
  another process reads it whole and current through TensorFlow's GCS stat
  cache, which caches an object's length);
* one heartbeat thread rewrites it (`Record.start_heartbeat`) every period,
  until it is stopped or finds the record no longer its owner's;
* another process reads it fresh (`read`: `_files.read_object` reads again
  a record that reads cut short or "inconsistent" while that cache may be
  stale), and asks a `Judge` whether its owner is gone, and why: it has
  not been renewed for `stale_seconds` (by its heartbeat on the reader's
  clock, or as the reader saw it unchanged: `Unchanged`); or, on the
  reader's machine, its pid runs no process (a SIGKILLed owner is gone at
  once). A record that does not read whole is no record.

What each record means, who may take it over and what fences its owner's
writes is its user's: `tfm_ext.model_dir.lease`, `tfm_ext.model_dir.eval_claims`.
"""

import dataclasses
import hashlib
import json
import math
import os
import socket
import threading
from typing import Any, Callable, Dict, Hashable, Optional, Tuple

from absl import logging
import tensorflow as tf

from tfm_ext.model_dir import _files


def pid_alive(pid: int) -> bool:
  """Whether process `pid` of this pid namespace runs (a zombie does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process.
  try:
    with open(f"/proc/{pid}/stat") as f:
      # The state follows the command name, which may hold spaces or ")".
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return True


def pid_space() -> str:
  """Where a pid names one process: this kernel boot and pid namespace.

  Two containers with the host's network share its name, not their pids.
  Empty where `/proc` does not say (the host name alone then decides).
  """
  def read_text(path):
    with open(path, encoding="ascii") as f:
      return f.read().strip()

  parts = []
  for read_part, path in ((read_text, "/proc/sys/kernel/random/boot_id"),
                          (os.readlink, "/proc/self/ns/pid")):
    try:
      parts.append(read_part(path))
    except OSError:
      parts.append("")
  return "/".join(parts) if any(parts) else ""


@dataclasses.dataclass(frozen=True)
class Process:
  """The owner of a record: a pid, and where that pid names one process."""
  host: str
  pid: int
  space: str

  @classmethod
  def this(cls) -> "Process":
    return cls(socket.gethostname(), os.getpid(), pid_space())

  def fields(self) -> Dict[str, Any]:
    """As a record holds them."""
    return {"host": self.host, "pid": self.pid, "pid_space": self.space}

  @property
  def machine(self) -> str:
    """The host and pid space, short: a part of a file name."""
    where = f"{self.host}/{self.space}"
    return hashlib.sha256(where.encode()).hexdigest()[:8]


class Judge:
  """Whether, and why, the owner of a record another process wrote is gone.

  A record is gone when its `age` is over `stale_seconds`, or when it names
  a process of `me`'s machine (the same host and pid space) that `is_alive`
  says runs no more. A record of `me`'s own pid is gone only if
  `own_pid_reason` says why (the lease: an earlier run of this process
  left it); an evaluator's claim of this process may be another
  evaluator's of the same process.

  Args:
    stale_seconds: the age past which a record is gone (by default never).
    me: the reading process (`Process.this()`).
    is_alive: whether a pid of this machine runs (`pid_alive`).
    stale_reason: why a stale record is gone, formatted with its `age`.
    own_pid_reason: why a record of `me.pid` is gone; "" if it is not.
  """

  def __init__(self, stale_seconds: float = math.inf, *,
               me: Optional[Process] = None,
               is_alive: Callable[[int], bool] = pid_alive,
               stale_reason: str = "its heartbeat is {age:.0f}s old",
               own_pid_reason: str = ""):
    self.stale_seconds = stale_seconds
    self.me = Process.this() if me is None else me
    self._is_alive = is_alive
    self._stale_reason = stale_reason
    self._own_pid_reason = own_pid_reason

  def gone_because(self, record: Dict[str, Any], age: float = 0.0) -> str:
    """Why the owner of `record`, `age` seconds old, is gone; "" if alive."""
    if age > self.stale_seconds:
      return self._stale_reason.format(age=age)
    pid = record.get("pid")
    if not (record.get("host") == self.me.host
            and record.get("pid_space") == self.me.space
            and isinstance(pid, int) and pid > 0):
      return ""  # Another machine's pid says nothing here.
    if pid == self.me.pid:
      return self._own_pid_reason
    return "" if self._is_alive(pid) else "its process is gone"


class Unchanged:
  """How long this reader has seen each record unchanged, on its own clock.

  The age of a record whose writer's clock is not compared with the
  reader's: it starts when the reader first sees the record's `version`.
  """

  def __init__(self, clock: Callable[[], float]):
    self._clock = clock
    self._seen: Dict[Hashable, Tuple[Hashable, float]] = {}

  def age(self, key: Hashable, version: Hashable) -> float:
    now = self._clock()
    seen = self._seen.get(key)
    if seen is None or seen[0] != version:
      self._seen[key] = (version, now)
      return 0.0
    return now - seen[1]


def read(path: str, required: _files.Required) -> Optional[Dict[str, Any]]:
  """The record at `path`, read fresh; None if there is none.

  Raises:
    _files.Damaged: it does not read whole, lacks a `required` value, or
      its required `pid` is no process's (`os.kill(0)` means a group).
  """
  try:
    record = _files.read_object(path, required)
  except tf.errors.NotFoundError:
    return None
  if "pid" in required and record["pid"] <= 0:
    raise _files.Damaged(f"{path} is damaged: pid={record['pid']}")
  return record


def remove(path: str) -> None:
  """Deletes the record at `path`; one already gone is fine."""
  try:
    tf.io.gfile.remove(path)
  except tf.errors.NotFoundError:
    pass


class Record:
  """The record at `path` this process owns: written whole, renewed.

  Args:
    path: where it is.
    fields: the record as of its `beats`-th heartbeat (0: first written).
    pad_to: pads its JSON to this many bytes, so that every rewrite has
      the same length (see the module docstring); 0 writes it indented.
  """

  def __init__(self, path: str, fields: Callable[[int], Dict[str, Any]], *,
               pad_to: int = 0):
    self.path = path
    self._fields = fields
    self._pad_to = pad_to
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def write(self, beats: int = 0) -> None:
    if self._pad_to:
      _files.write_text(self.path, json.dumps(self._fields(beats)).ljust(
          self._pad_to))
    else:
      _files.write_json(self.path, self._fields(beats))

  def renew(self, beats: int = 0,
            ours: Callable[[], bool] = lambda: True) -> bool:
    """Rewrites the record, if `ours()` finds it still this process's."""
    if not ours():
      return False
    self.write(beats)
    return True

  def remove(self) -> None:
    remove(self.path)

  def start_heartbeat(self, seconds: float, *, name: str, failed: str,
                      ours: Callable[[], bool] = lambda: True) -> None:
    """Renews the record every `seconds` until stopped or no longer `ours`.

    A storage error (a bucket's transient one) is logged after `failed`;
    the next beat tries again.
    """
    def beat_until_stopped():
      beats = 0
      while not self._stop.wait(seconds):
        beats += 1
        try:
          if not self.renew(beats, ours):
            return
        except tf.errors.OpError as e:
          logging.warning("%s: %s", failed, str(e).splitlines()[0])

    self._stop.clear()
    self._thread = threading.Thread(target=beat_until_stopped, name=name,
                                    daemon=True)
    self._thread.start()

  def stop_heartbeat(self) -> None:
    """Stops the heartbeat; once this returns, it writes no more."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
