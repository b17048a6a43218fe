"""Which of several evaluators on one model_dir evaluates a checkpoint.

`continuous_eval` claims a checkpoint before evaluating it, in
`model_dir/eval_claims/<checkpoint>.json`, renews the claim while it
evaluates and releases it once its ledger record is written; the others
leave a live claim alone. A claim is won as the trainer lease is
(`Claims`: bids, the smallest live token wins), with no timing assumption.
A claim, a bid and a presence (below) are records of
`tfm_ext.model_dir.claim`, which writes, renews, reads and judges them
through `tf.io.gfile`, so they hold on a bucket.

A lost claim is fenced: each claim an evaluator wins carries a token of its
own, and before each write of the checkpoint's evaluation (its best
checkpoint, its summaries, its record) the evaluator reads the claim back
and finds its owner and that token (`holds`, `check`). An evaluator that
was suspended (SIGSTOP, a paused VM) longer than `claim_stale_seconds`
(`tfm_ext.base.settings`) while evaluating, whose claim another
evaluator took over, then recorded and maybe released, finds another
owner, another token, or no claim at all, and writes nothing more of it
(`ClaimLost`); nor does it renew a claim that is no longer its own. What
stays open is the time between that read and the write it guards
(milliseconds), as for the trainer lease (`tfm_ext.model_dir.lease`): an
object store has no conditional write to close it.

An evaluator is also present on the model_dir from its start, before it
waits for its trainer or builds anything (`announce`), until its loop ends
(`announced`): `model_dir/evaluators/<owner>.json`, its heartbeat rewritten
every `evaluator_heartbeat_seconds`, removed when it stops (one killed, or
stopped by a signal before its loop, leaves it: its heartbeat ages). The
trainer reads it (`live_evaluators`) to keep the checkpoints a live
evaluator has not evaluated yet (`tfm_ext.model_dir.retention`). A
presence is live by the trainer lease's rule
(`tfm_ext.model_dir.claim.Judge`): on the reader's machine,
its process runs (whatever the clocks say); elsewhere, or stopped, its beat
counter changed within `evaluator_stale_seconds` of the reader's monotonic
clock (`claim.Unchanged`; no clocks are compared). A trainer reads presences
once a save: a record it reads for the first time is live, and one its
next save finds unchanged after more than `evaluator_stale_seconds` is gone
(an evaluator killed on another host keeps checkpoints for one save
interval at most). Each rewrite has the same length (padded): TensorFlow's
GCS client caches an object's length, and another process reads a record of
the same length whole and current.

The renewal period and staleness may be set by the environment
(`TFM_EXT_CLAIM_RENEW_SECONDS`, `TFM_EXT_CLAIM_STALE_SECONDS`,
`TFM_EXT_EVALUATOR_HEARTBEAT_SECONDS`, `TFM_EXT_EVALUATOR_STALE_SECONDS`),
for tests and for clusters whose pauses need more room.
"""

import atexit
import contextlib
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from absl import logging
import tensorflow as tf

from tfm_ext.base import settings
from tfm_ext.model_dir import files
from tfm_ext.model_dir import claim

CLAIMS = "eval_claims"
# Where evaluators that want the same checkpoint bid for it at once:
# `<checkpoint>.<token>.json`, each written once and deleted once decided.
BIDS = "eval_claim_bids"
# How often a bid with the smallest token lists the bids again while
# larger ones are still there (they withdraw as soon as they see it).
BID_POLL_SECONDS = 0.05
# An evaluator rewrites its claim every `claim_renew_seconds` while it
# evaluates; a claim that has not changed for `claim_stale_seconds` is its
# dead evaluator's (`tfm_ext.base.settings`).


def process_owner() -> str:
  """This process's evaluator id: its owner id (`claim.Process.id`,
  `host:pid:tag`), the one every record of this process holds.

  An evaluator rebuilt in the same process (an in-process restart) takes
  its own claims back at once; a process forked after the import (a
  launcher forked from one that imported it, a sweep's workers) is another
  evaluator, not its parent.
  """
  return claim.Process.this().id

PRESENCE = "evaluators"
# Every presence record is padded to this many bytes (see the module).
_PRESENCE_BYTES = 1024
# The presence records of this process, by path.
_present: Dict[str, "_Presence"] = {}
_present_lock = threading.Lock()
_exit_hooked = False


class ClaimLost(Exception):
  """The claim on a checkpoint is no longer this evaluator's (`Claims.check`).

  Another evaluator took it over while this one stalled: that one
  evaluates and records the checkpoint, this one writes nothing of it.
  """


class Claims:
  """Which of several evaluators on one model_dir evaluates a checkpoint.

  The trainer lease's timing-free rule (`tfm_ext.model_dir.lease`), a
  checkpoint at a time. An evaluator that finds no live claim on a
  checkpoint bids for it: it writes a bid of its own,
  `eval_claim_bids/<checkpoint>.<token>.json` (a new object, never written
  over), and lists the checkpoint's bids. A live bid with a smaller token
  wins: this one withdraws. With no other live bid, it reads the claim
  again and, finding none live, writes it (`eval_claims/<checkpoint>.json`)
  and only then deletes its bid. With larger live bids only, it lists
  again a moment later (`BID_POLL_SECONDS`): they withdraw, or one of them
  had won (it wrote the claim while its bid stood). Of two evaluators that
  both win, each listed the bids after its own was written and saw none of
  the other's: but whichever wrote its bid second listed after the first's
  was there, and a bid goes only once its claim is written or it lost. So
  two live evaluators cannot both win, however long either takes between
  its steps; nothing waits a fixed time.

  A winner renews its claim while it evaluates (`renewed`); a claim or bid
  seen unchanged for `claim_stale_seconds` on this evaluator's clock (no
  two machines' clocks are compared: `claim.Unchanged`), or on this
  machine one whose process is gone, is its dead evaluator's and is taken
  over. A claim is this evaluator's while the file holds its owner and the
  token of its bid (`holds`).
  """

  def __init__(self, model_dir: str, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep,
               owner: Optional[str] = None):
    self._dir = os.path.join(model_dir, CLAIMS)
    self._bids = os.path.join(model_dir, BIDS)
    self._clock = clock
    self._sleep = sleep
    self.owner = owner or process_owner()
    # Another's claim is stale once seen unchanged so long on `clock`.
    self._unchanged = claim.Unchanged(clock)
    self._me = claim.Process.this()
    self._judge = claim.Judge(settings.get().claim_stale_seconds, me=self._me,
                              stale_reason="not renewed for {age:.0f} s")
    # Checkpoint -> the token of this evaluator's latest claim on it.
    self._tokens: Dict[str, str] = {}
    # Checkpoint -> its claim while `renewed` renews it.
    self._renewing: Dict[str, claim.Record] = {}

  def acquire(self, checkpoint_path: str) -> bool:
    """Whether this evaluator now holds the claim on `checkpoint_path`."""
    return bool(self.acquire_each([checkpoint_path]))

  def acquire_each(self, checkpoint_paths: Sequence[str],
                   limit: Optional[int] = None) -> List[str]:
    """Claims those of `checkpoint_paths` with no live claim; the won.

    At most `limit` (all by default), the first in the order given, each
    bid for as the class says. Alone, a bid costs a write, a listing, a
    read and a delete, and no wait: an evaluator keeps up with a trainer
    that saves every second.
    """
    won = []
    for path in checkpoint_paths:
      if limit is not None and len(won) >= limit:
        break
      name = os.path.basename(path)
      if self._claimed_by_another(name, say=True):
        continue
      if self._bid(name):
        won.append(path)
    return won

  def _claimed_by_another(self, name: str, say: bool = False) -> bool:
    """Whether another live evaluator holds the claim on `name`."""
    held = self._read(name)
    if held is None or held.get("owner") == self.owner:
      return False
    gone = self._gone_because(name, held)
    if gone and say:
      logging.warning("Taking over the claim on %s of evaluator %s: %s.",
                      name, held.get("owner"), gone)
    return not gone

  def _bid(self, name: str) -> bool:
    """Bids for the claim on `name` (see the class); whether it won."""
    how = claim.Bidding(self._judge, self._unchanged, self._sleep, self._clock,
                        BID_POLL_SECONDS, settings.get().claim_renew_seconds)
    with claim.bid(self._bids, name,
                   lambda token, beats: self._fields(name, token, beats), how,
                   settled=lambda: self._claimed_by_another(name)) as token:
      if token:
        self._tokens[name] = token
        self._write(name, renewals=0)
      return bool(token)

  def holds(self, checkpoint_path: str) -> bool:
    """Whether the claim on `checkpoint_path` is still this evaluator's.

    Reads the claim back: called before each write the claim guards.
    """
    name = os.path.basename(checkpoint_path)
    return self._ours(name, self._read(name))

  def check(self, checkpoint_path: str) -> None:
    """Raises `ClaimLost` unless the claim is still this evaluator's (`holds`).

    The fence before a write the claim guards: an evaluation's export,
    its summaries, its ledger record (`tfm_ext.run.continuous_eval`).
    """
    if not self.holds(checkpoint_path):
      raise ClaimLost(checkpoint_path)

  @contextlib.contextmanager
  def renewed(self, *checkpoint_paths: str) -> Iterator[None]:
    """Renews each claim every `claim_renew_seconds` while the block runs.

    Or until it is released (`release`) or found no longer this
    evaluator's: one taken over while this one stalled (and maybe released
    since) is not its to renew.
    """
    names = [os.path.basename(p) for p in checkpoint_paths]
    for name in names:
      record = self._record(name)
      record.start_heartbeat(
          settings.get().claim_renew_seconds,
          ours=lambda name=name: self._ours(name, self._read(name)),
          name=f"claim {name}", failed=f"Could not renew the claim on {name}")
      self._renewing[name] = record
    try:
      yield
    finally:
      for name in names:
        record = self._renewing.pop(name, None)
        if record is not None:
          record.stop_heartbeat()

  def release(self, checkpoint_path: str) -> None:
    """Removes this evaluator's claim (once its ledger record is written).

    Its renewal stops first: a renewal after the removal would write the
    claim back.
    """
    name = os.path.basename(checkpoint_path)
    record = self._renewing.pop(name, None)
    if record is not None:
      record.stop_heartbeat()
    if self._ours(name, self._read(name)):
      claim.remove(self._path(name))
    self._tokens.pop(name, None)

  def _ours(self, name: str, held: Optional[Dict[str, Any]]) -> bool:
    """Whether `held`, the claim on `name` as read, is this one's last win."""
    return (held is not None and held.get("owner") == self.owner
            and held.get("token") == self._tokens.get(name))

  def _gone_because(self, name: str, held: Dict[str, Any]) -> str:
    """Why the evaluator of claim `held` is gone; "" when it may be alive."""
    version = (held.get("owner"), held.get("token"), held.get("renewals"))
    return self._judge.gone_because(held, self._unchanged.age(name, version))

  def _path(self, name: str) -> str:
    return os.path.join(self._dir, name + ".json")

  def _read(self, name: str) -> Optional[Dict[str, Any]]:
    return _read(self._path(name))

  def _record(self, name: str) -> claim.Record:
    """This evaluator's claim on `name`, as of its `renewals`-th renewal."""
    return claim.Record(self._path(name), lambda renewals: self._fields(
        name, self._tokens.get(name, ""), renewals))

  def _fields(self, name: str, token: str, renewals: int) -> Dict[str, Any]:
    """A claim's or a bid's: the checkpoint, this owner, the token."""
    return {"checkpoint": name, **self._me.fields(), "owner": self.owner,
            "token": token, "renewals": renewals, "time": time.time()}

  def _write(self, name: str, renewals: int) -> None:
    tf.io.gfile.makedirs(self._dir)
    self._record(name).write(renewals)


def _read(path: str) -> Optional[Dict[str, Any]]:
  """The claim or bid at `path`; None if none, or cut short (no live one)."""
  try:
    return claim.read(path, {"owner": str})
  except files.Damaged:
    return None


class _Presence:
  """A presence record of this process, and how many holds it has."""

  def __init__(self, path: str, owner: str):
    here = claim.Process.this().fields()
    since = time.time()
    self.path = path
    self.record = claim.Record(path, lambda beats: {
        **here, "owner": owner, "since": since, "beats": beats,
        "heartbeat": time.time()}, pad_to=_PRESENCE_BYTES)
    self.holds = 1
    # Written by `announce`, not yet held by an `announced` block.
    self.early = False
    # The local directories its start made (`evaluators/`, the model_dir).
    self._made: List[str] = []

  def start(self) -> None:
    directory = files.local_path(os.path.dirname(self.path))
    while directory and not os.path.isdir(directory):
      self._made.append(directory)
      directory = os.path.dirname(directory)
    tf.io.gfile.makedirs(os.path.dirname(self.path))
    self.record.write()
    self.record.start_heartbeat(
        settings.get().evaluator_heartbeat_seconds, name="presence",
        failed=f"Could not renew this evaluator's presence {self.path}")

  def end(self, tidy: bool = False) -> None:
    """Removes the record, and with `tidy` the directories `start` made.

    Those left empty: an evaluator that ends before its loop leaves no
    trace.
    """
    self.record.stop_heartbeat()
    try:
      self.record.remove()
    except tf.errors.OpError as e:
      logging.warning("Could not remove this evaluator's presence %s (a "
                      "trainer takes it for gone once its heartbeat is %.0f s "
                      "old): %s", self.path,
                      settings.get().evaluator_stale_seconds,
                      str(e).splitlines()[0])
    for directory in self._made if tidy else ():
      try:
        os.rmdir(directory)
      except OSError:
        break  # Not empty: the trainer's (or another job's) by now.


def announce(model_dir: str, owner: Optional[str] = None) -> None:
  """This evaluator is present on `model_dir` from now on.

  An evaluator's start, before it waits for its trainer and builds its
  task, model and datasets (the launcher's `continuous_eval`): a trainer
  that saves meanwhile keeps each checkpoint for it
  (`tfm_ext.model_dir.retention`), as it does once the evaluation loop
  runs. The presence is then held by the first `announced` block of this
  process on `model_dir` (the evaluation loop), and removed when that block
  ends, or when the process exits before one (a run refused, failed or
  stopped first). A second call adds nothing.
  """
  path = _presence_path(model_dir, owner)
  with _present_lock:
    if path in _present:
      return
    presence = _present[path] = _Presence(path, owner or process_owner())
    presence.early = True
  try:
    presence.start()
  except BaseException:
    _let_go(presence, tidy=True)
    raise
  global _exit_hooked
  if not _exit_hooked:
    _exit_hooked = True
    atexit.register(_end_at_exit)


@contextlib.contextmanager
def announced(model_dir: str, owner: Optional[str] = None) -> Iterator[None]:
  """This evaluator is present on `model_dir` while the block runs.

  Writes its presence record before the block (or takes over the one
  `announce` wrote), rewrites its heartbeat every
  `evaluator_heartbeat_seconds`, removes it after. Re-entrant: a block
  inside another of the same process and model_dir adds nothing.
  """
  path = _presence_path(model_dir, owner)
  with _present_lock:
    presence = _present.get(path)
    new = presence is None
    if new:
      presence = _present[path] = _Presence(path, owner or process_owner())
    elif presence.early:
      presence.early = False  # `announce`'s hold is this block's now.
    else:
      presence.holds += 1
  try:
    if new:
      presence.start()
    yield
  finally:
    _let_go(presence)


def _let_go(presence: _Presence, tidy: bool = False) -> None:
  """Drops one hold of `presence`; the last one removes it."""
  with _present_lock:
    presence.holds -= 1
    last = presence.holds == 0
    if last:
      del _present[presence.path]
  if last:
    presence.end(tidy)


def _end_at_exit() -> None:
  """Removes what `announce` wrote and no `announced` block took over."""
  for presence in [p for p in list(_present.values()) if p.early]:
    _let_go(presence, tidy=True)


def _presence_path(model_dir: str, owner: Optional[str]) -> str:
  return os.path.join(model_dir, PRESENCE,
                      _file_name(owner or process_owner()) + ".json")


def live_evaluators(model_dir: str,
                    seen: Optional[claim.Unchanged] = None
                    ) -> List[Dict[str, Any]]:
  """The presence records of the evaluators live on `model_dir`.

  A record gone between the listing and its read, or not whole, is not
  live; see the module docstring for the rule. `seen` is how long the
  reader has seen each record unchanged (its beat counter), on the
  reader's monotonic clock: a reader that reads again (a trainer at each
  save) keeps one; by default, this process's.
  """
  directory = os.path.join(model_dir, PRESENCE)
  try:
    names = tf.io.gfile.listdir(directory)
  except tf.errors.NotFoundError:
    return []
  seen = _seen_here if seen is None else seen
  judge = claim.Judge(settings.get().evaluator_stale_seconds)
  live = []
  for name in sorted(names):
    if not name.endswith(".json"):
      continue
    path = os.path.join(directory, name)
    try:
      record = claim.read(path, {"owner": str, "beats": int})
    except files.Damaged:
      continue
    if record is None:
      continue
    age = seen.age(path, (record["owner"], record.get("since"),
                          record["beats"]))
    if not judge.gone_because(record, age):
      live.append(record)
  return live


# How long this process has seen each presence record unchanged.
_seen_here = claim.Unchanged(time.monotonic)


def _file_name(owner: str) -> str:
  """`owner` as an object name: no "/" (a host name has none anyway)."""
  return owner.replace("/", "_")
