"""A record one process owns in model_dir: how it is written, renewed and judged.

tfm_ext keeps several small JSON records in `model_dir`, each owned by one
process while it runs: the trainer lease and its claims
(`tfm_ext.model_dir.lease`), an evaluator's claim on a checkpoint, its
bids and its presence (`tfm_ext.model_dir.eval_claims`), and an export's
record of the copy it writes (`tfm_ext.model_dir.export`: a copy an
interrupted export left is deleted once its owner is gone). They are one
mechanism:

* the owner is a `Process`: its host, its pid, its pid space (kernel
  boot and pid namespace), where the pid names one process, and its start
  time in that boot (`pid_start`), so that a reused pid is another process.
  Its id, `host:pid:tag` (`Process.id`, a random tag per process), is the
  `owner` every record holds;
* the owner writes its record whole (`Record.write`, through
  `tfm_ext.model_dir.files`; `pad_to` gives each rewrite the same length,
  so that another process reads it whole and current through TensorFlow's
  GCS stat cache, which caches an object's length);
* one heartbeat thread rewrites it (`Record.start_heartbeat`) every period,
  counting its beats (`Record.beats`), until it is stopped or finds the
  record no longer its owner's;
* another process reads it fresh (`read`: `files.read_object` reads again
  a record that reads cut short or "inconsistent" while that cache may be
  stale), and asks a `Judge` whether its owner is gone, and why. Liveness
  comes before clocks:

  - on the reader's machine (same host name and pid space) its process is
    looked at: gone (no such pid, a zombie, or another process under a
    reused pid) is gone at once, a SIGKILLed owner's relaunch is never held
    up; one that runs holds its record whatever any clock says; one that
    is stopped (SIGSTOP, a debugger) is judged as another machine's;
  - otherwise it is gone once it has not changed for `stale_seconds` as
    the reader watched it, on the reader's monotonic clock (`Unchanged`:
    the owner's beat counter and stamps are compared with themselves,
    never a wall-clock stamp with the reader's clock). A reader that just
    started has seen nothing yet: it watches for `stale_seconds` first;
  - a clock may only ever say an owner is alive: a reader that would take
    a record over (the lease) refuses at once where its stamp is within a
    few beats of the reader's clock (`Judge.alive`).

  A record that does not read whole is no record;
* a record only one process may take (the trainer lease, an evaluator's
  claim on a checkpoint) is won by bids, with no timing assumption: each
  contender writes a bid of its own (a new object), lists the others
  (`bids`), and the smallest live token wins; the others withdraw.

What each record means, who may take it over and what fences its owner's
writes is its user's: `tfm_ext.model_dir.lease`,
`tfm_ext.model_dir.eval_claims`.
"""

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import secrets
import socket
import threading
import time
from typing import (Any, Callable, Dict, Hashable, Iterator, List, Optional,
                    Tuple)

from absl import logging
import tensorflow as tf

from tfm_ext.model_dir import files


# What `process_status` finds of a pid of this machine.
RUNNING, STOPPED, GONE = "running", "stopped", "gone"


def _stat(pid: int) -> Optional[Tuple[str, int]]:
  """The state letter and start time (clock ticks since boot) of `pid`.

  None where `/proc` does not say (no `/proc`, the process just ended).
  """
  try:
    with open(f"/proc/{pid}/stat") as f:
      # The fields follow the command name, which may hold spaces or ")":
      # the state is field 3, the start time field 22 (proc(5)).
      fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])
  except (OSError, IndexError, ValueError):
    return None


def pid_alive(pid: int) -> bool:
  """Whether process `pid` of this pid namespace runs (a zombie does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process.
  stat = _stat(pid)
  return stat is None or stat[0] != "Z"


def pid_start(pid: int) -> Optional[int]:
  """When process `pid` started, in clock ticks since boot; None if unknown."""
  stat = _stat(pid)
  return None if stat is None else stat[1]


def process_status(pid: int, start: Optional[int] = None) -> str:
  """What process `pid` of this machine is: `RUNNING`, `STOPPED` or `GONE`.

  `GONE`: no such pid, a zombie, or, given the `start` it had, another
  process that reuses the pid. `STOPPED`: stopped by a signal or a
  debugger (it makes no progress until continued). A process frozen some
  other way (a cgroup freezer) reads as running.
  """
  if not pid_alive(pid):
    return GONE
  stat = _stat(pid)
  if stat is None:
    return RUNNING  # `os.kill` says it is there; `/proc` says no more.
  state, started = stat
  if start is not None and started != start:
    return GONE
  return STOPPED if state in ("T", "t") else RUNNING


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


# This process's tag, made on first use in each process (`_tag`).
_process_tag = ("", -1)


def _tag() -> str:
  """A random tag of this process: one forked after it was made (a
  launcher forked from one that imported tfm_ext, a sweep's workers) is
  another owner, with a tag of its own."""
  global _process_tag
  tag, pid = _process_tag
  if pid != os.getpid():
    _process_tag = tag, pid = secrets.token_hex(4), os.getpid()
  return tag


@dataclasses.dataclass(frozen=True)
class Process:
  """The owner of a record: a pid, where that pid names one process, and
  when that process started (None: unknown; the pid alone then decides).

  `id`, `host:pid:tag`, is the one owner id every record holds (`owner`):
  the tag tells apart two processes that one pid named in turn.
  """
  host: str
  pid: int
  space: str
  start: Optional[int] = None
  tag: str = ""

  @classmethod
  def this(cls) -> "Process":
    return cls(socket.gethostname(), os.getpid(), pid_space(),
               pid_start(os.getpid()), _tag())

  @property
  def id(self) -> str:  # pylint: disable=invalid-name
    return f"{self.host}:{self.pid}:{self.tag}"

  def fields(self) -> Dict[str, Any]:
    """As a record holds them (`pid_start` only when known)."""
    fields = {"owner": self.id, "host": self.host, "pid": self.pid,
              "pid_space": self.space}
    if self.start is not None:
      fields["pid_start"] = self.start
    return fields

  @property
  def machine(self) -> str:
    """The host and pid space, short: a part of a file name."""
    where = f"{self.host}/{self.space}"
    return hashlib.sha256(where.encode()).hexdigest()[:8]


class Judge:
  """Whether the owner of a record another process wrote is gone, or alive.

  The one liveness rule of every record (see the module docstring), with
  three answers:

  - gone (`gone_because` says why): a record naming a process of `me`'s
    machine (the same host and pid space) that `status` finds gone; or
    one of another machine, with no pid, or of a stopped process whose
    `age`, how long the reader has seen it unchanged on its own monotonic
    clock (`Unchanged`), is over `stale_seconds`. A record of `me`'s own
    process is gone only if `own_pid_reason` says why (the lease: an
    earlier run of this process left it); else its age decides (an
    evaluator's claim of this process may be another evaluator's of the
    same process);
  - alive (`alive`): a process of this machine that runs, whatever any
    clock says; or, given `fresh_seconds`, a record whose `heartbeat`
    stamp is that close to the reader's `clock`, either way (a clock can
    only make a reader refuse at once, never take a record over);
  - neither: not known yet. A reader that must take the record over (the
    lease) watches it until it is one of the two; to every other reader
    it is live.

  Args:
    stale_seconds: the age past which a record is gone (by default never).
    me: the reading process (`Process.this()`).
    status: what a pid of this machine, started at a time (or None), is
      (`process_status`).
    stale_reason: why a stale record is gone, formatted with its `age`.
    own_pid_reason: why a record of `me`'s process is gone; "" if it is
      not.
    fresh_seconds: how close a `heartbeat` stamp to `clock` is alive (by
      default none is).
    clock: the reader's wall clock, for `fresh_seconds` (`time.time`).
  """

  def __init__(self, stale_seconds: float = math.inf, *,
               me: Optional[Process] = None,
               status: Callable[[int, Optional[int]], str] = process_status,
               stale_reason: str = "it has not changed for {age:.0f}s",
               own_pid_reason: str = "",
               fresh_seconds: float = -1.0,
               clock: Callable[[], float] = time.time):
    self.stale_seconds = stale_seconds
    self.me = Process.this() if me is None else me
    self._status = status
    self._stale_reason = stale_reason
    self._own_pid_reason = own_pid_reason
    self._fresh_seconds = fresh_seconds
    self._clock = clock

  def gone_because(self, record: Dict[str, Any], age: float = 0.0) -> str:
    """Why the owner of `record`, seen unchanged `age` seconds, is gone.

    "" if it may be alive.
    """
    status = self.status_here(record)
    if status == GONE:
      return "its process is gone"
    if status == "me" and self._own_pid_reason:
      return self._own_pid_reason
    if status == RUNNING:
      return ""
    if age > self.stale_seconds:
      return self._stale_reason.format(age=age)
    return ""

  def alive(self, record: Dict[str, Any]) -> bool:
    """Whether the owner of `record` is known to be alive (see above)."""
    if self.status_here(record) == RUNNING:
      return True
    stamp = record.get("heartbeat")
    return (isinstance(stamp, (int, float)) and not isinstance(stamp, bool)
            and abs(self._clock() - stamp) <= self._fresh_seconds)

  def status_here(self, record: Dict[str, Any]) -> str:
    """`RUNNING`, `STOPPED` or `GONE` for a process of this machine, "me"
    for this very process, "" where the record's pid says nothing here."""
    pid = record.get("pid")
    if not (record.get("host") == self.me.host
            and record.get("pid_space") == self.me.space
            and _is_int(pid) and pid > 0):
      return ""  # Another machine's pid says nothing here.
    # An older record has no start time: the pid alone decides.
    start = record.get("pid_start")
    start = start if _is_int(start) else None
    if pid == self.me.pid and start in (None, self.me.start):
      return "me"
    return self._status(pid, start)


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


class Unchanged:
  """How long this reader has seen each record unchanged, on its own clock.

  The age of a record whose writer's clock is not compared with the
  reader's: it starts when the reader first sees the record's `version`
  (its owner's token and beat counter, say), so a reader that just started
  sees every record as new. `clock` is the reader's monotonic clock
  (`time.monotonic`), which no step of the wall clock moves.
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


def read(path: str, required: files.Required) -> Optional[Dict[str, Any]]:
  """The record at `path`, read fresh; None if there is none.

  Raises:
    files.Damaged: it does not read whole, lacks a `required` value, or
      its required `pid` is no process's (`os.kill(0)` means a group).
  """
  try:
    record = files.read_object(path, required)
  except tf.errors.NotFoundError:
    return None
  if "pid" in required and record["pid"] <= 0:
    raise files.Damaged(f"{path} is damaged: pid={record['pid']}")
  return record


def bids(directory: str, prefix: str, mine: str,
         read: Callable[[str], Optional[Dict[str, Any]]]
         ) -> List[Dict[str, Any]]:
  """The bids in `directory` named `<prefix><token>.json` but `mine`.

  How a record is taken with no timing assumption (the trainer lease's
  `trainer_lease_claims/`, an evaluator's `eval_claim_bids/`): each
  contender writes a bid of its own, a new object, then lists the others;
  the smallest live token wins. Each bid is what `read` reads at its path
  (None: gone since the listing, or not whole), with its `token` and
  `path`.
  """
  try:
    names = tf.io.gfile.listdir(directory)
  except tf.errors.NotFoundError:
    return []
  found = []
  for name in sorted(names):
    path = os.path.join(directory, name)
    # A local temp file (`<bid>.tmp<hex>`) is a bid not yet written.
    if (path == mine or not name.startswith(prefix)
        or not name.endswith(_BID_SUFFIX)):
      continue
    record = read(path)
    if record is not None:
      found.append(dict(record, token=name[len(prefix):-len(_BID_SUFFIX)],
                        path=path))
  return found


_BID_SUFFIX = ".json"


@dataclasses.dataclass(frozen=True)
class Bidding:
  """How a contender bids (`bid`): who judges the others' bids, and how it
  waits for larger ones to withdraw.

  Attributes:
    judge: whether another bid's owner is gone.
    unchanged: how long each other bid has been seen unchanged.
    sleep: waits between listings.
    clock: the monotonic clock `unchanged` reads.
    poll_seconds: how often the bids are listed again while larger ones
      are there.
    renew_seconds: how often a waiting bid beats, so that others do not
      judge it stale.

  A bid waits on in spite of a stop signal: a larger bid that saw this one
  has lost, and gives up what it bid for to this one.
  """
  judge: Judge
  unchanged: Unchanged
  sleep: Callable[[float], None]
  clock: Callable[[], float]
  poll_seconds: float
  renew_seconds: float


@contextlib.contextmanager
def bid(directory: str, name: str,
        fields: Callable[[str, int], Dict[str, Any]], how: Bidding, *,
        settled: Callable[[], bool]) -> Iterator[str]:
  """Bids for `name` in `directory`; yields the winning token, "" if lost.

  The one rule by which a single process of several takes something with
  no timing assumption (an evaluator's claim on a checkpoint, the export
  of a best checkpoint): this one writes a bid of its own,
  `<name>.<token>.json` with `fields(token, beats)` (a new object, never
  written over), and lists `name`'s other bids. A live bid with a smaller
  token wins: this one loses. With no other live bid, it has won unless
  `settled()` says another already did what the bid is for. With larger
  live bids only, it lists again every `how.poll_seconds`: they withdraw,
  or one of them won before this bid was written and is at work (its bid
  goes once its work is done, and `settled()` then says so). The bid
  stays until the block ends: whoever bids while the winner works sees it.
  Of two that both win, each listed after its own bid was written and saw
  none of the other's; but whichever wrote second listed after the first's
  was there. Bids of gone owners are ignored, and deleted by a winner.
  The winner's bid beats every `how.renew_seconds` until the block ends.
  Each bid holds its `renewals` (its beats): what another reader watches.
  """
  token = secrets.token_hex(8)
  mine = Record(os.path.join(directory, f"{name}.{token}{_BID_SUFFIX}"),
                lambda beats: fields(token, beats))
  tf.io.gfile.makedirs(directory)
  mine.write()
  try:
    won = _contest(directory, name, token, mine, how, settled)
    if won:  # Beats while the winner works, however long it takes.
      mine.start_heartbeat(how.renew_seconds, name=f"bid {name}",
                           failed=f"Could not renew the bid {mine.path}")
    yield won
  finally:
    mine.stop_heartbeat()
    try:
      mine.remove()
    except tf.errors.OpError as e:
      logging.warning("Could not delete the bid %s (%s); it is ignored once "
                      "this process is gone.", mine.path, e)


def _contest(directory: str, name: str, token: str, mine: "Record",
             how: Bidding, settled: Callable[[], bool]) -> str:
  """`bid`'s wait: the token if `mine` won, else ""."""
  renewed = how.clock()
  while True:
    live, gone = [], []
    for other in bids(directory, name + ".", mine.path, _any_bid):
      version = (other["token"], other.get("renewals"))
      why = how.judge.gone_because(
          other, how.unchanged.age(other["path"], version))
      (gone if why else live).append(other)
    if any(other["token"] < token for other in live):
      return ""
    if not live:
      if settled():
        return ""
      for other in gone:
        remove(other["path"])
      return token
    how.sleep(how.poll_seconds)  # Larger bids: they withdraw.
    if how.clock() - renewed >= how.renew_seconds:
      mine.renew()  # A beat: this bid still waits.
      renewed = how.clock()


def live_bids(directory: str, judge: Judge) -> List[str]:
  """The names with a bid in `directory` whose owner may be alive.

  Read once: a bid of another machine counts as live (see `Judge`).
  """
  return sorted({other["path"].rsplit("/", 1)[-1].rsplit(".", 2)[0]
                 for other in bids(directory, "", "", _any_bid)
                 if not judge.gone_because(other)})


def _any_bid(path: str) -> Optional[Dict[str, Any]]:
  """The bid at `path`; None if none, or cut short (no live one)."""
  try:
    return read(path, {"owner": str})
  except files.Damaged:
    return None


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
      The counter is what a reader on another machine watches (`Unchanged`).
    pad_to: pads its JSON to this many bytes, so that every rewrite has
      the same length (see the module docstring); 0 writes it indented.
  """

  def __init__(self, path: str, fields: Callable[[int], Dict[str, Any]], *,
               pad_to: int = 0):
    self.path = path
    self._fields = fields
    self._pad_to = pad_to
    self.beats = 0
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def write(self, beats: int = 0) -> None:
    """Writes the record as of its `beats`-th heartbeat."""
    self.beats = beats
    if self._pad_to:
      files.write_text(self.path, json.dumps(self._fields(beats)).ljust(
          self._pad_to))
    else:
      files.write_json(self.path, self._fields(beats))

  def renew(self, ours: Callable[[], bool] = lambda: True) -> bool:
    """Writes the next beat, if `ours()` finds the record still this one's.

    A beat whose write fails is counted all the same: the next one writes
    a counter its readers have not seen.
    """
    if not ours():
      return False
    self.write(self.beats + 1)
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
      while not self._stop.wait(seconds):
        try:
          if not self.renew(ours):
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
