"""One trainer per `model_dir`: a lease that a second trainer respects.

Two trainers on one `model_dir` would interleave their checkpoints and best
list, so a training run's chief holds `model_dir/trainer_lease.json` from
before it builds anything until it ends, however it ends:

    {"owner": "vm-3:4121:5e1d...", "host": "vm-3", "pid": 4121,
     "pid_space": "<boot id>/pid:[4026531836]", "pid_start": 81234,
     "token": "9f0c...", "started": 1764560000.0,
     "beats": 4, "heartbeat": 1764560042.5}

A thread rewrites it every `heartbeat_seconds`, counting `beats` and
stamping `heartbeat` (`time.time()`, for people and messages): the lease
and each claim below are records of `tfm_ext.model_dir.claim`, which
writes, renews, reads and judges them. Evaluators and the other workers of
a multi-worker job take no lease. `acquire` judges a lease it finds,
liveness before clocks:

* none, or one that does not parse: it takes the lease;
* held on this machine (same host name, kernel boot and pid namespace, so
  the pid names one process; the same start time, so a reused pid is not
  the holder) by a process that is gone: it takes the lease at once. That
  is what a SIGKILLed trainer leaves, so its relaunch is never held up;
* held on this machine by a process that runs: it refuses with a
  `UsageError` (exit 2) that names the holder, whatever the clocks say (a
  clock stepped forward makes no live holder look stale);
* otherwise (another host, or a holder stopped by SIGSTOP or a debugger):
  a heartbeat stamped within `3 * heartbeat_seconds` of this host's clock
  (either way): it refuses at once. A clock can only make it refuse here,
  never take a lease (`claim.Judge.alive`: the rule of every record);
* else it watches the lease, a beat at a time, until the holder beats
  again (refuse) or the lease has not changed for `stale_seconds` on this
  trainer's monotonic clock (take it, with a warning). The holder's beat
  counter is compared with itself, never its stamp with this host's clock;
  so a trainer that just started watches for `stale_seconds` before it
  takes over, however old the stamp reads (its log says so). A lease of an
  older version has no counter: its stamp, rewritten every beat, serves as
  one, compared with itself too.

Taking the lease is exclusive by construction, on a local disk and on a
bucket alike, with nothing but `tf.io.gfile` and no assumption on timing:
a trainer that found no live holder writes a claim of its own,
`model_dir/trainer_lease_claims/<token>.json` (a new object, never written
over, the holder's fields), then lists the claims:

* only its own (and claims judged gone, by the rules above; a claim is
  rewritten every `heartbeat_seconds` while its trainer waits, so that a
  claim of another host is judged by its counter too): it takes the
  lease, writes `trainer_lease.json` and deletes the gone claims;
* `trainer_lease.json` names another live holder, or another live claim has
  a smaller token: it deletes its claim and refuses, naming the trainer
  that takes the lease (as the lease says within `_WINNER_SECONDS`, else
  the smallest claim). A smaller claim of another host whose stamp is not
  within `3 * heartbeat_seconds` (left by a trainer that died while it
  took the lease?) is watched instead, as a lease is, until it changes,
  goes, or is judged gone;
* its token is the smallest of the live claims: it lists again a moment
  later (`POLL_SECONDS`), until the others have withdrawn (it takes the
  lease) or one of them has taken it (it refuses).

Of two trainers that both take the lease, each listed the claims after its
own claim was written and saw none of the other's; but whichever wrote its
claim second listed after the first's claim was there, and a claim is only
deleted by its trainer withdrawing or releasing, or by a trainer that
judges it gone. So two live trainers cannot both take it, however long
either takes between its steps. It needs only what GCS, S3 and a local
disk give: a write, once it returns, is in every later listing (TF's GCS
client caches stats, not listings, by default: `GCS_MATCHING_PATHS_CACHE_
MAX_AGE` is 0). A conditional create (`ifGenerationMatch=0`) would be one
request less, but gfile has none for files (TF's `mkdir` on `gs://` sends
it, and fake-gcs-server ignores it there), and GCS's JSON API would need
the credentials TF's client keeps to itself. Nor does any of it wait a
fixed time: the claims cost a start a few requests (a write, a listing, the
record), not a settle delay.

The heartbeat reads
the lease before rewriting it: a holder that finds another trainer's token,
or no lease at all (its own heartbeat went stale while the process was
suspended, and another trainer took the lease and maybe released it since;
a user who deleted it), has lost it and stops beating. Each read of
`trainer_lease.json` survives TF's GCS stat cache (`claim.read` reads a
record that is not whole, or reads as "inconsistent", again).

A lost lease is fenced: the holder proves it still holds the lease, by
reading it back and finding its own token, before every write it makes
into `model_dir`, not only at its heartbeat: `assert_held` runs before each
checkpoint save (`tfm_ext.model_dir.checkpointing`), each record
(`tfm_ext.model_dir.files` runs it before any write under `model_dir`
while the lease is held) and as
the first action after each loop (`check`). A trainer that was suspended
or partitioned and wakes up raises `LeaseLost` at its first write and
writes nothing. What stays open is the time between that read and the
write it guards (milliseconds): a process stopped exactly there writes one
object when it wakes.

A lost lease is also what explains any other error its holder meets: one
suspended inside a save whose temporary files the new holder deleted
wakes to TensorFlow's `NotFoundError`. The lease tells the run's error
boundary (`tfm_ext.base.failures.explain_with`): while it is lost (found so
at a check, a beat, or `release`), whatever the run raises is `LeaseLost`,
exit 2 and one line; the original error and its traceback go to the log.

The heartbeat and staleness may be set by the environment
(`TFM_EXT_LEASE_HEARTBEAT_SECONDS`, `TFM_EXT_LEASE_STALE_SECONDS`:
`tfm_ext.base.settings`), for tests and for clusters whose hosts' clocks
or pauses need more room.

What it cannot see: a holder on this machine that runs but is hung holds
the lease until it is killed (its pid is its liveness); a holder on
another host whose beats stop reaching the bucket for `stale_seconds` (a
partition, a paused VM) loses the lease and stops at its next check; a
dead holder whose clock led this host's by up to `3 * heartbeat_seconds`
is refused for that long (a refusal, never a takeover).
"""

import dataclasses
import os
import secrets
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf

from tfm_ext.base import settings
from tfm_ext.base import signalled
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files
from tfm_ext.model_dir import claim
from tfm_ext.base import failures

FILENAME = "trainer_lease.json"
CLAIMS = "trainer_lease_claims"
_CLAIM_SUFFIX = ".json"
# A trainer that waits for the lease says so after this long, then at
# twice the time it has waited.
SAY_WAITING_SECONDS = 10.0
# How often a claim with the smallest token lists the claims again.
POLL_SECONDS = 0.2
# How long a trainer that withdrew its claim waits to name the winner.
_WINNER_SECONDS = 5.0
# A heartbeat this many beats old is missed: the holder may be gone.
_MISSED_BEATS = 3
# Where a pid names one process, as every record's owner (`tfm_ext.model_dir.claim`).
pid_alive = claim.pid_alive
pid_space = claim.pid_space
# What a lease (or a claim) holds; `beats` and `pid_start` too, but older
# versions wrote neither.
_FIELDS = {"host": str, "pid": int, "token": str, "started": (int, float),
           "heartbeat": (int, float)}


class LeaseLost(UsageError):
  """This trainer no longer holds the lease of its model_dir: stop writing."""
  refusal = False  # It ran: its log stays.


def _utc(seconds: float) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


class Lease:
  """This process's claim on `model_dir`; see the module docstring.

  Args:
    model_dir: the run's model_dir (a local path or a bucket).
    clock: `time.time`, for the heartbeat's stamp (and whether a stamp
      is fresh enough to refuse at once).
    monotonic: `time.monotonic`, for how long a lease or claim has not
      changed (staleness).
    sleep: `signalled.sleep`, for watching a lease and the claims: it
      returns at once when a stop signal comes, and `interrupt` then ends
      the wait.
    status: what a pid of this machine is (`claim.process_status`).
    host, pid, space, start: who this process is (by default
      `claim.Process.this()`'s; `start`: `claim.pid_start(pid)`).
    heartbeat_seconds, stale_seconds, poll_seconds: see the module
      docstring (the first two: by default `tfm_ext.base.settings`').
    beat_in_background: start the heartbeat thread once acquired (tests
      call `beat` themselves).
    interrupt: called after every sleep while this trainer waits for the
      lease (a stale holder, a competing claim, the winner's name); what it
      raises (a signal came: the run's `check_start`) withdraws the claim
      and ends the wait.
  """

  def __init__(self, model_dir: str, *,
               clock: Callable[[], float] = time.time,
               monotonic: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = signalled.sleep,
               status: Callable[[int, Optional[int]], str] = (
                   claim.process_status),
               host: Optional[str] = None, pid: Optional[int] = None,
               space: Optional[str] = None, start: Optional[int] = None,
               heartbeat_seconds: Optional[float] = None,
               stale_seconds: Optional[float] = None,
               poll_seconds: float = POLL_SECONDS,
               beat_in_background: bool = True,
               interrupt: Callable[[], None] = lambda: None):
    self.model_dir = model_dir
    self._interrupt = interrupt
    self.path = os.path.join(model_dir, FILENAME)
    self._clock, self._monotonic, self._sleep = clock, monotonic, sleep
    this = claim.Process.this()
    pid = this.pid if pid is None else pid
    self._me = dataclasses.replace(
        this, host=this.host if host is None else host, pid=pid,
        space=this.space if space is None else space,
        start=claim.pid_start(pid) if start is None else start)
    timings = settings.get()
    heartbeat_seconds = (timings.lease_heartbeat_seconds
                         if heartbeat_seconds is None else heartbeat_seconds)
    stale_seconds = (timings.lease_stale_seconds if stale_seconds is None
                     else stale_seconds)
    self._judge = claim.Judge(
        stale_seconds, me=self._me, status=status,
        stale_reason="it has not changed for {age:.0f}s as this trainer "
        "watched it",
        own_pid_reason="its pid is this process's: an earlier run of it left "
        "the lease", fresh_seconds=_MISSED_BEATS * heartbeat_seconds,
        clock=clock)
    # How long each lease and claim has not changed, on `monotonic`.
    self._unchanged = claim.Unchanged(monotonic)
    self._heartbeat_seconds = heartbeat_seconds
    self._stale_seconds = stale_seconds
    self._poll_seconds = poll_seconds
    self._beat_in_background = beat_in_background
    self._token = secrets.token_hex(8)
    self.claims = os.path.join(model_dir, CLAIMS)
    self._claim = claim.Record(
        os.path.join(self.claims, self._token + _CLAIM_SUFFIX), self._fields)
    self._lease = claim.Record(self.path, self._fields)
    self._started = 0.0
    self._lost: Optional[str] = None
    self._released = False
    self._unfence: Callable[[], None] = lambda: None
    self._unexplain: Callable[[], None] = lambda: None

  def acquire(self) -> "Lease":
    """Takes the lease or raises `UsageError` naming its holder; see above."""
    held = self._live_holder(self._read())
    if held is not None:
      raise UsageError(self._in_use_message(held))
    self._started = self._clock()
    try:
      tf.io.gfile.makedirs(self.claims)
      self._claim.write()
    except tf.errors.NotFoundError:
      # A refused job took back the empty directory it had made
      # (`files.Traces`) between the two: make it again.
      tf.io.gfile.makedirs(self.claims)
      self._claim.write()
    try:
      self._contend()
      self._lease.write()
    except BaseException:
      self._withdraw()
      raise
    if self._beat_in_background:
      self._lease.start_heartbeat(
          self._heartbeat_seconds, ours=self._holds, name="tfm_ext_lease",
          failed="Trainer lease heartbeat failed")
    self._unfence = files.fence(self.model_dir, self.assert_held,
                                 exempt=self.path)
    self._unexplain = failures.explain_with(self.explain, self.model_dir)
    return self

  def _contend(self) -> None:
    """Returns once this trainer's claim wins; raises `UsageError` if not."""
    waited = watched = False
    renewed = started = self._monotonic()
    say_after = SAY_WAITING_SECONDS
    while True:
      self._interrupt()
      held, live, gone = self._look()
      if held is not None:
        raise UsageError(self._in_use_message(held))  # One took it.
      if not live:
        for other in gone:
          logging.warning("Deleting the claim %s of a trainer that is gone "
                          "(%s).", other["path"], self._describe(other))
          claim.remove(other["path"])
        return
      first = min(live, key=lambda c: c["token"])
      if first["token"] < self._token and (
          self._judge.alive(first)):
        self._withdraw()
        raise UsageError(self._in_use_message(self._winner(first)))
      if first["token"] < self._token and not watched:
        logging.warning(
            "The claim %s (%s) has not been rewritten for a while: watching "
            "it for %.0fs before deleting it (hosts' clocks are not "
            "compared).", first["path"], self._describe(first),
            self._stale_seconds)
        watched = True
      elif not waited:
        logging.info("Another trainer is taking %s at once (%s): waiting "
                     "for it to withdraw.", self.model_dir,
                     self._describe(live[0]))
        waited = True
      waiting = self._monotonic() - started
      if waiting >= say_after:
        message = (f"waiting for the trainer lease of {self.model_dir} "
                   f"({waiting:.0f}s): another trainer claims it "
                   f"({self._describe(first)})")
        logging.warning(message)
        print(message, file=sys.stderr, flush=True)
        say_after = 2 * waiting
      self._sleep(self._poll_seconds)
      if self._monotonic() - renewed >= self._heartbeat_seconds:
        self._claim.renew()  # A beat: this claim's trainer still waits.
        renewed = self._monotonic()

  def _look(self) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]],
                           List[Dict[str, Any]]]:
    """The lease if its holder is live, and the other claims: live, gone."""
    held = self._read()
    claims = self._other_claims()
    # A holder's claim is judged by its lease, which holds its heartbeat.
    gone = [c for c in claims if (
        self._gone_because(held) if held is not None
        and held["token"] == c["token"] else self._gone_because(c, c["path"]))]
    live = [c for c in claims if c not in gone]
    if held is not None and self._gone_because(held):
      held = None
    return held, live, gone

  def _winner(self, first: Dict[str, Any]) -> Dict[str, Any]:
    """Who takes the lease now that this trainer withdrew, for its message.

    `first`, the claim with the smallest token, takes it unless a third
    trainer had already taken it: the lease says so within a few polls.
    """
    for _ in range(int(_WINNER_SECONDS / self._poll_seconds)):
      self._sleep(self._poll_seconds)
      self._interrupt()
      held, live, _ = self._look()
      if held is not None:
        return held
      if not live:
        break
      first = min(live, key=lambda c: c["token"])
    return first

  def _other_claims(self) -> List[Dict[str, Any]]:
    """The claims in `claims` but this trainer's, each with its `path`."""
    return claim.bids(self.claims, "", self._claim.path, self._read)

  def _withdraw(self) -> None:
    """Deletes this trainer's claim, if it can (a gone claim is ignored)."""
    try:
      self._claim.remove()
    except tf.errors.OpError as e:
      logging.warning("Could not delete %s (%s); it is ignored once this "
                      "process is gone.", self._claim.path, e)

  def beat(self) -> None:
    """Writes the next beat, unless the lease is no longer this trainer's."""
    self._lease.renew(ours=self._holds)

  def _holds(self) -> bool:
    """Whether this trainer has not lost the lease, reading it back."""
    return self._lost is None and self._still_held()

  def assert_held(self) -> None:
    """Raises `LeaseLost` unless the lease in `model_dir` is still ours.

    Reads the lease back: called before every write the holder makes.
    Once `release`d it checks nothing: what the process does after its run
    (TFM's post-run evaluation) is no longer the trainer's.
    """
    if self._released:
      return
    if self._lost is None:
      self._still_held()
    if self._lost is not None:
      raise LeaseLost(self._lost)

  def explain(self, error: BaseException) -> Optional[LeaseLost]:
    """`LeaseLost` if the lease is lost: what explains `error` then.

    For the run's error boundary (`failures.explain_with`): a holder that
    lost the lease meets errors of that (a save whose temporary files the
    new holder deleted); the lost lease is what the user must hear.
    """
    del error
    if self._lost is None and not self._released:
      try:  # Asked before `release` (an error classified inside the run).
        self._still_held()
      except tf.errors.OpError:
        pass  # Unknown: the error speaks for itself.
    return LeaseLost(self._lost) if self._lost is not None else None

  def after_loop(self, output=None) -> None:
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
        f"{taken}, judging this one gone: this trainer's heartbeat stopped "
        "changing for the stale time (a suspended process? a partition?). "
        "This trainer stops without saving, so that one trainer writes the "
        "model_dir.")
    logging.error("%s", self._lost)
    return False

  def release(self) -> None:
    """Stops the heartbeat and deletes the lease, if it is still ours.

    The claim goes first: while the lease still names this live process, a
    trainer starting meanwhile refuses instead of finding its claim. A
    lease found lost here stays the explanation of what the run raised
    (`explain`), for the error boundary that comes after.
    """
    self._released = True
    self._lease.stop_heartbeat()
    self._unfence()
    try:
      self._claim.remove()
      if self._lost is None and self._still_held():
        tf.io.gfile.remove(self.path)
        self._unexplain()
    except tf.errors.OpError as e:
      logging.warning("Could not delete %s (%s); the next trainer takes it "
                      "over once this process is gone.", self.path, e)

  def _live_holder(self, held: Optional[Dict[str, Any]]
                   ) -> Optional[Dict[str, Any]]:
    """The lease of a live holder, after watching `held`; None if gone."""
    watching = False
    while held is not None:
      gone = self._gone_because(held)
      if gone:
        logging.warning("Taking over %s: %s (%s).", self.path, gone,
                        self._describe(held))
        return None
      if self._judge.alive(held):
        return held
      if not watching:
        logging.warning(
            "%s: watching its lease for %.0fs before taking it over: a "
            "holder is gone once its heartbeat has not changed for that "
            "long as this trainer watches it (hosts' clocks are not "
            "compared).", self._describe(held), self._stale_seconds)
        watching = True
      logging.warning("%s: last heartbeat %.0fs ago; waiting until it beats "
                      "again or is %.0fs old.", self._describe(held),
                      self._clock() - held["heartbeat"], self._stale_seconds)
      self._sleep(self._heartbeat_seconds)
      self._interrupt()
      now = self._read()
      if now is not None and _version(now) != _version(held):
        return now  # It beat again, or another trainer just took it.
      held = now
    return None

  def _gone_because(self, record: Dict[str, Any],
                    key: Optional[str] = None) -> str:
    """Why the trainer of the lease (or the claim at `key`) is gone.

    "" when it may be alive. Its age is how long this trainer has seen it
    unchanged (`claim.Unchanged`, on `monotonic`).
    """
    age = self._unchanged.age(key or self.path, _version(record))
    return self._judge.gone_because(record, age)

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

  def _fields(self, beats: int) -> Dict[str, Any]:
    """This trainer's lease (or claim) at its `beats`-th beat, stamped now."""
    return {**self._me.fields(), "token": self._token, "started": self._started,
            "beats": beats, "heartbeat": self._clock()}

  def _read(self, path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The lease (or a claim at `path`); None if none or it is not one."""
    try:
      return claim.read(path or self.path, _FIELDS)
    except files.Damaged as e:
      logging.warning("%s: read as no lease.", e)
      return None


def _version(record: Dict[str, Any]) -> Tuple[Any, ...]:
  """What changes at each beat of a lease or claim: its token and counter.

  The stamp too: an older version's lease has no counter, and its stamp,
  rewritten every beat, serves as one (compared with itself, never with
  this host's clock).
  """
  return record["token"], record.get("beats"), record["heartbeat"]


def acquire(model_dir: str, **kwargs) -> Lease:
  """Takes `model_dir`'s trainer lease (`Lease(model_dir, **kwargs)`)."""
  return Lease(model_dir, **kwargs).acquire()
