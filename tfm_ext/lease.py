"""One trainer per `model_dir`: a lease that a second trainer respects.

Two trainers on one `model_dir` would interleave their checkpoints and best
list, so a training run's chief holds `model_dir/trainer_lease.json` from
before it builds anything until it ends, however it ends:

    {"host": "vm-3", "pid": 4121, "pid_space": "<boot id>/pid:[4026531836]",
     "token": "9f0c...", "started": 1764560000.0, "heartbeat": 1764560042.5}

A thread rewrites `heartbeat` (`time.time()`) every `heartbeat_seconds`.
Evaluators and the other workers of a multi-worker job take no lease.
`acquire` judges a lease it finds:

* none, or one that does not parse: it takes the lease;
* held on this machine (same host name, kernel boot and pid namespace, so
  the pid names one process) by a process that is gone: it takes the lease
  at once. That is what a SIGKILLed trainer leaves, so its relaunch is
  never held up;
* a heartbeat older than `stale_seconds` by this host's clock: it takes the
  lease, with a warning;
* a heartbeat that came within `3 * heartbeat_seconds`: it refuses with a
  `UsageError` (exit 2) that names the holder;
* in between (the holder missed beats; on another host its pid says
  nothing): it watches the lease, a beat at a time, until the holder beats
  again (refuse) or its heartbeat goes stale (take it).

Everything goes through `tf.io.gfile`, so it holds on a bucket, which has no
exclusive create: taking is writing the lease whole, waiting
`settle_seconds`, then reading it back; of two trainers that write within
that time the later write wins and the other refuses. The heartbeat reads
the lease before rewriting it: a holder that finds another trainer's token,
or no lease at all (its own heartbeat went stale while the process was
suspended, and another trainer took the lease and maybe released it since;
a writer slower than `settle_seconds`; a user who deleted it), has lost it
and stops beating.

A lost lease is fenced: the holder proves it still holds the lease, by
reading it back and finding its own token, before every write it makes
into `model_dir`, not only at its heartbeat: `assert_held` runs before each
checkpoint save (`tfm_ext.checkpointing`), each record (`tfm_ext._files`
runs it before any write under `model_dir` while the lease is held) and as
the first action after each loop (`check`). A trainer that was suspended
or partitioned and wakes up raises `LeaseLost` at its first write and
writes nothing. What stays open is the time between that read and the
write it guards (milliseconds): a process stopped exactly there writes one
object when it wakes.

The heartbeat and staleness may be set by the environment
(`TFM_EXT_LEASE_HEARTBEAT_SECONDS`, `TFM_EXT_LEASE_STALE_SECONDS`), for
tests and for clusters whose hosts' clocks or pauses need more room.

What it cannot see: clocks that disagree between hosts by about
`stale_seconds` or more (a live holder whose clock lags looks stale; the
holder then stops at its next beat; a dead one whose clock leads holds a
relaunch on another host up to that much longer).
"""

import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf

from tfm_ext import _files
from tfm_ext.errors import UsageError

FILENAME = "trainer_lease.json"
HEARTBEAT_SECONDS = float(
    os.environ.get("TFM_EXT_LEASE_HEARTBEAT_SECONDS", "10"))
STALE_SECONDS = float(os.environ.get("TFM_EXT_LEASE_STALE_SECONDS", "60"))
SETTLE_SECONDS = 0.5
# A heartbeat this many beats old is missed: the holder may be gone.
_MISSED_BEATS = 3


class LeaseLost(UsageError):
  """This trainer no longer holds the lease of its model_dir: stop writing."""


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
  for read, path in ((read_text, "/proc/sys/kernel/random/boot_id"),
                     (os.readlink, "/proc/self/ns/pid")):
    try:
      parts.append(read(path))
    except OSError:
      parts.append("")
  return "/".join(parts) if any(parts) else ""


def _utc(seconds: float) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


class Lease:
  """This process's claim on `model_dir`; see the module docstring.

  Args:
    model_dir: the run's model_dir (a local path or a bucket).
    clock: `time.time`, for the heartbeat and staleness.
    sleep: `time.sleep`, for the settle delay and watching a lease.
    is_alive: whether a pid of this machine runs (`pid_alive`).
    host, pid, space: who this process is (`socket.gethostname()`,
      `os.getpid()`, `pid_space()`).
    heartbeat_seconds, stale_seconds, settle_seconds: see the module
      docstring.
    beat_in_background: start the heartbeat thread once acquired (tests
      call `beat` themselves).
  """

  def __init__(self, model_dir: str, *,
               clock: Callable[[], float] = time.time,
               sleep: Callable[[float], None] = time.sleep,
               is_alive: Callable[[int], bool] = pid_alive,
               host: Optional[str] = None, pid: Optional[int] = None,
               space: Optional[str] = None,
               heartbeat_seconds: float = HEARTBEAT_SECONDS,
               stale_seconds: float = STALE_SECONDS,
               settle_seconds: float = SETTLE_SECONDS,
               beat_in_background: bool = True):
    self.model_dir = model_dir
    self.path = os.path.join(model_dir, FILENAME)
    self._clock, self._sleep, self._is_alive = clock, sleep, is_alive
    self._host = socket.gethostname() if host is None else host
    self._pid = os.getpid() if pid is None else pid
    self._space = pid_space() if space is None else space
    self._heartbeat_seconds = heartbeat_seconds
    self._stale_seconds = stale_seconds
    self._settle_seconds = settle_seconds
    self._beat_in_background = beat_in_background
    self._token = secrets.token_hex(8)
    self._started = 0.0
    self._lost: Optional[str] = None
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._unfence: Callable[[], None] = lambda: None

  def acquire(self) -> "Lease":
    """Takes the lease or raises `UsageError` naming its holder; see above."""
    held = self._live_holder(self._read())
    if held is not None:
      raise UsageError(self._in_use_message(held))
    self._started = self._clock()
    tf.io.gfile.makedirs(self.model_dir)
    self._write()
    self._sleep(self._settle_seconds)
    held = self._read()
    if not self._ours(held):
      raise UsageError(self._in_use_message(held) if held else (
          f"{self.path} vanished as this trainer took it: is another "
          f"trainer starting on {self.model_dir}? Relaunch to retry."))
    if self._beat_in_background:
      self._thread = threading.Thread(target=self._beat_until_stopped,
                                      name="tfm_ext_lease", daemon=True)
      self._thread.start()
    self._unfence = _files.fence(self.model_dir, self.assert_held,
                                 exempt=self.path)
    return self

  def beat(self) -> None:
    """Rewrites the heartbeat, unless the lease is no longer this trainer's."""
    if self._lost is None and self._still_held():
      self._write()

  def assert_held(self) -> None:
    """Raises `LeaseLost` unless the lease in `model_dir` is still ours.

    Reads the lease back: called before every write the holder makes.
    Once `release`d it checks nothing: what the process does after its run
    (TFM's post-run evaluation) is no longer the trainer's.
    """
    if self._stop.is_set():
      return
    if self._lost is None:
      self._still_held()
    if self._lost is not None:
      raise LeaseLost(self._lost)

  def check(self, output=None) -> None:
    """An Orbit action: `assert_held`, after each loop, before its save."""
    del output
    self.assert_held()

  def _still_held(self) -> bool:
    """Whether the lease read back is ours; records why it is lost if not."""
    held = self._read()
    if self._ours(held):
      return True
    taken = (f"Another trainer took over {self.model_dir} ({self.path}: "
             f"{self._describe(held)})" if held is not None else
             f"{self.path} was deleted under this trainer (by a user, or by "
             "another trainer that took it over and finished)")
    self._lost = (
        f"{taken}, judging this one gone: this trainer's heartbeat went "
        "stale (a suspended process? clocks that disagree between hosts?) "
        f"or both started within {self._settle_seconds:g}s. This trainer "
        "stops without saving, so that one trainer writes the model_dir.")
    logging.error("%s", self._lost)
    return False

  def release(self) -> None:
    """Stops the heartbeat and deletes the lease, if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    self._unfence()
    try:
      if self._ours(self._read()):
        tf.io.gfile.remove(self.path)
    except tf.errors.OpError as e:
      logging.warning("Could not delete %s (%s); the next trainer takes it "
                      "over once this process is gone.", self.path, e)

  def _beat_until_stopped(self) -> None:
    while not self._stop.wait(self._heartbeat_seconds):
      try:
        self.beat()
      except tf.errors.OpError as e:  # A bucket's transient error.
        logging.warning("Trainer lease heartbeat failed: %s", e)

  def _live_holder(self, held: Optional[Dict[str, Any]]
                   ) -> Optional[Dict[str, Any]]:
    """The lease of a live holder, after watching `held`; None if gone."""
    while held is not None:
      gone = self._gone_because(held)
      if gone:
        logging.warning("Taking over %s: %s (%s).", self.path, gone,
                        self._describe(held))
        return None
      age = self._clock() - held["heartbeat"]
      if age <= _MISSED_BEATS * self._heartbeat_seconds:
        return held
      logging.warning("%s: last heartbeat %.0fs ago; waiting until it beats "
                      "again or is %.0fs old.", self._describe(held), age,
                      self._stale_seconds)
      self._sleep(self._heartbeat_seconds)
      now = self._read()
      if now is not None and (now["token"], now["heartbeat"]) != (
          held["token"], held["heartbeat"]):
        return now  # It beat again, or another trainer just took it.
      held = now
    return None

  def _gone_because(self, held: Dict[str, Any]) -> str:
    """Why the holder of `held` is gone, or "" when it may be alive."""
    age = self._clock() - held["heartbeat"]
    if age > self._stale_seconds:
      return f"its heartbeat is {age:.0f}s old"
    here = held["host"] == self._host and held.get("pid_space") == self._space
    if here and held["pid"] == self._pid:
      return "its pid is this process's: an earlier run of it left the lease"
    if here and not self._is_alive(held["pid"]):
      return "its process is gone"
    return ""

  def _in_use_message(self, held: Dict[str, Any]) -> str:
    return (
        f"{self.model_dir} is in use by another trainer "
        f"({self._describe(held)}); one trainer per model_dir. Wait for it "
        "to finish, stop it, or train in another model_dir. If that job is "
        f"gone, delete {self.path}, or relaunch once its heartbeat is "
        f"{self._stale_seconds:.0f}s old.")

  def _describe(self, held: Dict[str, Any]) -> str:
    return (f"host {held['host']}, pid {held['pid']}, started "
            f"{_utc(held['started'])}, last heartbeat "
            f"{self._clock() - held['heartbeat']:.0f}s ago")

  def _ours(self, held: Optional[Dict[str, Any]]) -> bool:
    return held is not None and held["token"] == self._token

  def _write(self) -> None:
    _files.write_json(self.path, {
        "host": self._host, "pid": self._pid, "pid_space": self._space,
        "token": self._token, "started": self._started,
        "heartbeat": self._clock()})

  def _read(self) -> Optional[Dict[str, Any]]:
    """The lease in `model_dir`; None when there is none or it is not one."""
    try:
      held = _files.read_json(self.path)
    except tf.errors.NotFoundError:
      return None
    except ValueError:
      logging.warning("%s does not parse: read as no lease.", self.path)
      return None
    fields = {"host": str, "pid": int, "token": str, "started": (int, float),
              "heartbeat": (int, float)}
    if not (isinstance(held, dict)
            and all(isinstance(held.get(k), t) for k, t in fields.items())
            and held["pid"] > 0):  # os.kill(0 or less) means a group.
      logging.warning("%s is not a trainer lease: read as none.", self.path)
      return None
    return held


def acquire(model_dir: str, **kwargs) -> Lease:
  """Takes `model_dir`'s trainer lease (`Lease(model_dir, **kwargs)`)."""
  return Lease(model_dir, **kwargs).acquire()
