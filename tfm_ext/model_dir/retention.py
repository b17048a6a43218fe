"""Retention that waits for the evaluator, bounded: what a save may delete.

TensorFlow's `CheckpointManager` deletes the oldest checkpoint past
`max_to_keep` at each save, evaluated or not: an evaluator beside a trainer
that saves faster than it evaluates finds most checkpoints gone. The
trainer's manager (`tfm_ext.model_dir.checkpointing.FencedManager`) asks `Retention`
at each sweep which of those to keep instead, and records what it lets go
unevaluated:

* while an evaluator is live on the model_dir (its presence record,
  `eval_claims.live_evaluators`), a checkpoint past `max_to_keep` that the
  ledger holds no record of (`eval_ledger.recorded_checkpoints`) is
  kept, and stays listed in the state file, where the evaluator finds it;
* at most `max_to_keep` are kept so, `2 x max_to_keep` checkpoints in all;
  beyond that the oldest waiting is deleted, with a warning, and recorded
  in the ledger as "missing" (its `why` says so);
* with no live evaluator (none started, its process gone, or, on another
  host, its heartbeat seen unchanged for `evaluator_stale_seconds`) nothing
  extra is kept, as TensorFlow would; what was kept is deleted at the next
  save. A `--mode=train` job (`records_unwatched`) records each checkpoint
  it so deletes that the ledger lacks as "missing"
  (`eval_ledger.UNWATCHED`), so an evaluator started later can say
  which it never saw.

What it guarantees: from the first save that finds an evaluator present
(the trainer logs "Evaluator <owner> is live: from ckpt-<step> on"), each
checkpoint the state file lists is deleted only once the ledger holds it,
or beyond the bound, or once no evaluator is live; and the model_dir never
holds more than `2 x max_to_keep` managed checkpoints. An evaluator is
present from its start, before it waits for the trainer or builds its model
(`eval_claims.announce`): one started before its trainer is waited for from
the trainer's first save on. What is best effort: checkpoints rotated away
before any evaluator was present cannot be evaluated (one started after the
trainer finished sees the last `max_to_keep`), nor can those beyond the
bound (an evaluator slower than the trainer for `max_to_keep` checkpoints
in a row; one claims what waits a batch at a time, and keeps up with a
trainer that saves every second); a checkpoint an
evaluator records in the milliseconds between the trainer's check and its
"missing" record is recorded missing; and a trainer that has finished keeps
what it kept, listed, until its next run's first save: it never waits for
an evaluator, and never deletes after it stops.

The sweep runs in the save's write callback, so a save costs one listing
(`evaluators/`) more, and while an evaluator is live, a read of each
presence record and a listing of the ledger; a `train` job's save that
rotates a checkpoint away with no evaluator live, a listing of the ledger
and a record. Only the chief sweeps
`model_dir`: the other workers of a multi-worker job save to a temp dir of
their own, where no evaluator is present.
"""

import os
import time
from typing import Callable, List, Sequence, Set

from absl import logging

from tfm_ext.model_dir import claim
from tfm_ext.model_dir import eval_claims
from tfm_ext.model_dir import eval_ledger

# What the trainer writes as the evaluator of a "missing" ledger record.
TRAINER = "trainer"


class Retention:
  """Which checkpoints past `max_to_keep` a sweep of `directory` keeps."""

  def __init__(self, directory: str, max_to_keep: int, *,
               records_unwatched: bool = False,
               clock: Callable[[], float] = time.monotonic):
    self._dir = directory
    self._max = max_to_keep
    self._records_unwatched = records_unwatched
    # How long each presence record has been seen unchanged, on `clock`.
    self._presences = claim.Unchanged(clock)
    self._seen: Set[str] = set()  # Evaluators live at the last sweep.
    # What the last split let go unevaluated (`record_deleted`).
    self._dropped: List[str] = []
    self._unwatched: List[str] = []
    self._told_unwatched = False

  def kept(self, managed: Sequence[str]) -> List[str]:
    """Of `managed`, the manager's checkpoints oldest first, those to keep.

    The checkpoints past `max_to_keep` that a live evaluator has not
    recorded, within the bound. The sweep deletes the others past
    `max_to_keep`; `record_deleted` then records those the ledger lacks.
    """
    excess = list(managed)[:max(len(managed) - self._max, 0)]
    self._dropped, self._unwatched = [], []
    if not self._max or not excess:
      return []
    live = eval_claims.live_evaluators(self._dir, seen=self._presences)
    self._log_changes(live, excess)
    if not live and not self._records_unwatched:
      return []
    recorded = eval_ledger.recorded_checkpoints(self._dir)
    waiting = [p for p in excess if os.path.basename(p) not in recorded]
    if not live:
      self._unwatched = waiting
      return []
    cut = max(len(waiting) - self._max, 0)
    self._dropped = waiting[:cut]
    return waiting[cut:]

  def record_deleted(self) -> None:
    """Records what the last split let go unevaluated, now deleted, as missing.

    Those dropped beyond the bound, with a warning; with `records_unwatched`,
    those rotated away while no evaluator was present, quietly: an
    evaluator started later warns of them (`continuous_eval`).
    """
    ledger = os.path.join(self._dir, eval_ledger.LEDGER)
    if self._dropped:
      why = (f"deleted by the trainer before any evaluator recorded it: "
             f"{2 * self._max} checkpoints (2 x max_to_keep) are kept at "
             "most while an evaluator is live")
      logging.warning(
          "Deleted %s, %s; recorded as missing in %s. The evaluator is slower "
          "than the trainer: a larger max_to_keep or checkpoint_interval, or "
          "a second evaluator, lets it keep up.",
          ", ".join(os.path.basename(p) for p in self._dropped),
          why[len("deleted "):], ledger)
      for path in self._dropped:
        eval_ledger.record_missing(self._dir, path, why, by=TRAINER)
    if self._unwatched and not self._told_unwatched:
      self._told_unwatched = True
      logging.info(
          "No evaluator is present: checkpoints past max_to_keep are deleted "
          "unevaluated and recorded as missing in %s, where a continuous_eval "
          "started later finds them.", ledger)
    for path in self._unwatched:
      eval_ledger.record_missing(self._dir, path, eval_ledger.UNWATCHED,
                                     by=TRAINER)
    self._dropped, self._unwatched = [], []

  def _log_changes(self, live, excess: Sequence[str]) -> None:
    """Logs an evaluator the trainer waits for from now on, or no longer."""
    owners = {r["owner"] for r in live}
    for owner in sorted(owners - self._seen):
      logging.info(
          "Evaluator %s is live: from %s on, each checkpoint is kept until "
          "the ledger holds it (at most %d in all, 2 x max_to_keep).", owner,
          os.path.basename(excess[0]), 2 * self._max)
    for owner in sorted(self._seen - owners):
      logging.info("Evaluator %s is gone or stale: checkpoints past "
                   "max_to_keep are no longer kept for it.", owner)
    self._seen = owners
