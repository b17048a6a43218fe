"""Which of several evaluators on one model_dir evaluates a checkpoint.

`continuous_eval` claims a checkpoint before evaluating it, in
`model_dir/eval_claims/<checkpoint>.json`, renews the claim while it
evaluates and releases it once its ledger record is written; the others
leave a live claim alone. A claim and a presence (below) are records of
`tfm_ext.model_dir.claim`, which writes, renews, reads and judges them through
`tf.io.gfile`, so they hold on a bucket.

A lost claim is fenced: each claim an evaluator wins carries a token of its
own, and before it records the checkpoint the evaluator reads the claim back
and finds its owner and that token (`holds`). An evaluator that was
suspended (SIGSTOP, a paused VM) longer than `STALE_CLAIM_SECONDS` while
evaluating, whose claim another evaluator took over, then recorded and
maybe released, finds another owner, another token, or no claim at all, and
records nothing; nor does it renew a claim that is no longer its own. What
stays open is the time between that read and the write it guards
(milliseconds), as for the trainer lease (`tfm_ext.model_dir.lease`): an object store
has no conditional write to close it.

An evaluator is also present on the model_dir while it runs
(`announced`): `model_dir/evaluators/<owner>.json`, its heartbeat rewritten
every `PRESENCE_HEARTBEAT_SECONDS`, removed when it stops. The trainer reads
it (`live_evaluators`) to keep the checkpoints a live evaluator has not
evaluated yet (`tfm_ext.model_dir.retention`). A presence is live by the trainer
lease's rule (`tfm_ext.model_dir.claim.Judge`): on the reader's machine,
its process runs (whatever the clocks say); elsewhere, or stopped, its
heartbeat is younger than `PRESENCE_STALE_SECONDS` by the reader's clock (a
trainer reads presences once a save, with no watch of its own: the one
record still judged by comparing clocks, where a wrong clock keeps or
sweeps a checkpoint early, never takes a lease). Each rewrite has the same length (padded): TensorFlow's
GCS client caches an object's length, and another process reads a record of
the same length whole and current.

The renewal period and staleness may be set by the environment
(`TFM_EXT_CLAIM_RENEW_SECONDS`, `TFM_EXT_CLAIM_STALE_SECONDS`,
`TFM_EXT_EVALUATOR_HEARTBEAT_SECONDS`, `TFM_EXT_EVALUATOR_STALE_SECONDS`),
for tests and for clusters whose pauses need more room.
"""

import contextlib
import os
import secrets
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional

from absl import logging
import tensorflow as tf

from tfm_ext.config import environment
from tfm_ext.model_dir import _files
from tfm_ext.model_dir import claim

CLAIMS = "eval_claims"
# A claim is written, then read back this much later: longer than any
# evaluator takes from reading a claim to writing its own (see `Claims`).
CLAIM_SETTLE_SECONDS = 1.0
# An evaluator rewrites its claim this often while it evaluates; a claim
# that has not changed for STALE_CLAIM_SECONDS is its dead evaluator's.
CLAIM_RENEW_SECONDS = environment.seconds("TFM_EXT_CLAIM_RENEW_SECONDS", 5)
STALE_CLAIM_SECONDS = environment.seconds("TFM_EXT_CLAIM_STALE_SECONDS", 30)
# One id per process: an evaluator rebuilt in the same process (an
# in-process restart) takes its own claims back at once.
_process_owner = ("", -1)


def process_owner() -> str:
  """This process's evaluator id: host, pid and a random tag.

  Made on first use in each process: one forked after the import (a
  launcher forked from one that imported it, a sweep's workers) is another
  evaluator, not its parent.
  """
  global _process_owner
  owner, pid = _process_owner
  if pid != os.getpid():
    pid = os.getpid()
    owner = f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}"
    _process_owner = (owner, pid)
  return owner

PRESENCE = "evaluators"
PRESENCE_HEARTBEAT_SECONDS = environment.seconds(
    "TFM_EXT_EVALUATOR_HEARTBEAT_SECONDS", 5)
PRESENCE_STALE_SECONDS = environment.seconds(
    "TFM_EXT_EVALUATOR_STALE_SECONDS", 30)
# Every presence record is padded to this many bytes (see the module).
_PRESENCE_BYTES = 1024
# Model dirs this process is present on, and how many `announced` blocks.
_present: Dict[str, int] = {}
_present_lock = threading.Lock()


class Claims:
  """Which of several evaluators on one model_dir evaluates a checkpoint.

  An object store has no create-if-absent, so a claim is won, not taken:
  an evaluator that finds no live claim writes its own, waits
  `CLAIM_SETTLE_SECONDS`, and reads the claim back; the last writer wins.
  Two that both found none wrote within the settle time of each other, so
  each reads back the later one's, and only that one goes on. A winner
  renews its claim while it evaluates (`renewed`); a claim seen unchanged
  for `STALE_CLAIM_SECONDS` on this evaluator's clock (no two machines'
  clocks are compared: `claim.Unchanged`), or on this machine one whose
  process is gone, is taken over. A claim is this evaluator's while the
  file holds its owner and the token of its last win (`holds`).
  """

  def __init__(self, model_dir: str, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep,
               owner: Optional[str] = None):
    self._dir = os.path.join(model_dir, CLAIMS)
    self._sleep = sleep
    self.owner = owner or process_owner()
    # Another's claim is stale once seen unchanged so long on `clock`.
    self._unchanged = claim.Unchanged(clock)
    self._me = claim.Process.this()
    self._judge = claim.Judge(STALE_CLAIM_SECONDS, me=self._me,
                              stale_reason="not renewed for {age:.0f} s")
    # Checkpoint -> the token of this evaluator's latest claim on it.
    self._tokens: Dict[str, str] = {}

  def acquire(self, checkpoint_path: str) -> bool:
    """Whether this evaluator now holds the claim on `checkpoint_path`."""
    name = os.path.basename(checkpoint_path)
    held = self._read(name)
    if held is not None and held.get("owner") != self.owner:
      gone = self._gone_because(name, held)
      if not gone:
        return False
      logging.warning("Taking over the claim on %s of evaluator %s: %s.",
                      name, held.get("owner"), gone)
    self._tokens[name] = secrets.token_hex(8)
    self._write(name, renewals=0)
    self._sleep(CLAIM_SETTLE_SECONDS)
    return self._ours(name, self._read(name))

  def holds(self, checkpoint_path: str) -> bool:
    """Whether the claim on `checkpoint_path` is still this evaluator's.

    Reads the claim back: called before each write the claim guards.
    """
    name = os.path.basename(checkpoint_path)
    return self._ours(name, self._read(name))

  @contextlib.contextmanager
  def renewed(self, checkpoint_path: str) -> Iterator[None]:
    """Renews the claim every `CLAIM_RENEW_SECONDS` while the block runs."""
    name = os.path.basename(checkpoint_path)
    record = self._record(name)
    # One taken over while this one stalled (and maybe released since) is
    # not ours to renew.
    record.start_heartbeat(
        CLAIM_RENEW_SECONDS, ours=lambda: self._ours(name, self._read(name)),
        name=f"claim {name}", failed=f"Could not renew the claim on {name}")
    try:
      yield
    finally:
      record.stop_heartbeat()

  def release(self, checkpoint_path: str) -> None:
    """Removes this evaluator's claim (once its ledger record is written)."""
    name = os.path.basename(checkpoint_path)
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
    try:
      return claim.read(self._path(name), {"owner": str})
    except _files.Damaged:
      return None  # A claim cut short: no live claim.

  def _record(self, name: str) -> claim.Record:
    """This evaluator's claim on `name`, as of its `renewals`-th renewal."""
    return claim.Record(self._path(name), lambda renewals: {
        "checkpoint": name, "owner": self.owner,
        "token": self._tokens.get(name, ""), **self._me.fields(),
        "renewals": renewals, "time": time.time()})

  def _write(self, name: str, renewals: int) -> None:
    tf.io.gfile.makedirs(self._dir)
    self._record(name).write(renewals)


@contextlib.contextmanager
def announced(model_dir: str, owner: Optional[str] = None) -> Iterator[None]:
  """This evaluator is present on `model_dir` while the block runs.

  Writes its presence record before the block, rewrites its heartbeat every
  `PRESENCE_HEARTBEAT_SECONDS`, removes it after. Re-entrant: a block
  inside another of the same process and model_dir adds nothing.
  """
  owner = owner or process_owner()
  path = os.path.join(model_dir, PRESENCE, _file_name(owner) + ".json")
  with _present_lock:
    _present[path] = _present.get(path, 0) + 1
    first = _present[path] == 1
  if not first:
    try:
      yield
    finally:
      with _present_lock:
        _present[path] -= 1
    return
  here = claim.Process.this().fields()
  since = time.time()
  record = claim.Record(path, lambda beats: {
      "owner": owner, **here, "since": since, "beats": beats,
      "heartbeat": time.time()}, pad_to=_PRESENCE_BYTES)
  try:
    tf.io.gfile.makedirs(os.path.dirname(path))
    record.write()
    record.start_heartbeat(
        PRESENCE_HEARTBEAT_SECONDS, name="presence",
        failed=f"Could not renew this evaluator's presence {path}")
    yield
  finally:
    record.stop_heartbeat()
    with _present_lock:
      _present[path] -= 1
    try:
      record.remove()
    except tf.errors.OpError as e:
      logging.warning("Could not remove this evaluator's presence %s (a "
                      "trainer takes it for gone once its heartbeat is %.0f s "
                      "old): %s", path, PRESENCE_STALE_SECONDS,
                      str(e).splitlines()[0])


def live_evaluators(model_dir: str, clock: Callable[[], float] = time.time
                    ) -> List[Dict[str, Any]]:
  """The presence records of the evaluators live on `model_dir`.

  A record gone between the listing and its read, or not whole, is not
  live; see the module docstring for the rule.
  """
  directory = os.path.join(model_dir, PRESENCE)
  try:
    names = tf.io.gfile.listdir(directory)
  except tf.errors.NotFoundError:
    return []
  judge = claim.Judge(PRESENCE_STALE_SECONDS)
  live = []
  for name in sorted(names):
    if not name.endswith(".json"):
      continue
    try:
      record = claim.read(os.path.join(directory, name),
                          {"owner": str, "heartbeat": (int, float)})
    except _files.Damaged:
      continue
    if record is not None and not judge.gone_because(
        record, clock() - record["heartbeat"]):
      live.append(record)
  return live


def _file_name(owner: str) -> str:
  """`owner` as an object name: no "/" (a host name has none anyway)."""
  return owner.replace("/", "_")
