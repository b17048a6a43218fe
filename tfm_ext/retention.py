"""Retention that waits for the evaluator, bounded: what a save may delete.

TensorFlow's `CheckpointManager` deletes the oldest checkpoint past
`max_to_keep` at each save, evaluated or not: an evaluator beside a trainer
that saves faster than it evaluates finds most checkpoints gone. The
trainer's manager (`tfm_ext.checkpointing.FencedManager`) asks `Retention`
at each sweep which of those to keep instead:

* while an evaluator is live on the model_dir (its presence record,
  `eval_claims.live_evaluators`), a checkpoint past `max_to_keep` that the
  ledger holds no record of (`continuous_eval.recorded_checkpoints`) is
  kept, and stays listed in the state file, where the evaluator finds it;
* at most `max_to_keep` are kept so, `2 x max_to_keep` checkpoints in all;
  beyond that the oldest waiting is deleted, with a warning, and recorded
  in the ledger as "missing" (its `why` says so);
* with no live evaluator (none started, or its heartbeat stale: killed, its
  host gone) nothing extra is kept, as TensorFlow would; what was kept is
  deleted at the next save.

What it guarantees: from the first save that finds an evaluator present
(the trainer logs "Evaluator <owner> is live: from ckpt-<step> on"), each
checkpoint the state file lists is deleted only once the ledger holds it,
or beyond the bound, or once no evaluator is live; and the model_dir never
holds more than `2 x max_to_keep` managed checkpoints. What is best
effort: checkpoints rotated away before any evaluator was present cannot be
evaluated (an evaluator is present from the start of its evaluation loop,
once built: one started after the trainer finished sees the last
`max_to_keep`), nor can those beyond the bound (an evaluator slower than
the trainer for `max_to_keep` checkpoints in a row); a checkpoint an
evaluator records in the milliseconds between the trainer's check and its
"missing" record is recorded missing; and a trainer that has finished keeps
what it kept, listed, until its next run's first save: it never waits for
an evaluator, and never deletes after it stops.

The sweep runs in the save's write callback, so a save costs one listing
(`evaluators/`) more, and while an evaluator is live, a read of each
presence record and a listing of the ledger. Only the chief sweeps
`model_dir`: the other workers of a multi-worker job save to a temp dir of
their own, where no evaluator is present.
"""

import os
import time
from typing import Callable, List, Sequence, Set, Tuple

from absl import logging

from tfm_ext import continuous_eval
from tfm_ext import eval_claims

# What the trainer writes as the evaluator of a "missing" ledger record.
TRAINER = "trainer"


class Retention:
  """Which checkpoints past `max_to_keep` a sweep of `directory` keeps."""

  def __init__(self, directory: str, max_to_keep: int, *,
               clock: Callable[[], float] = time.time):
    self._dir = directory
    self._max = max_to_keep
    self._clock = clock
    self._seen: Set[str] = set()  # Evaluators live at the last sweep.

  def split(self, managed: Sequence[str]) -> Tuple[List[str], List[str]]:
    """`(kept, dropped)` of `managed`, the manager's checkpoints, oldest first.

    `kept`: the checkpoints past `max_to_keep` to keep for a live
    evaluator. `dropped`: those an evaluator was waited for but that go
    beyond the bound (deleted by the sweep: `record_dropped` records them).
    """
    excess = list(managed)[:max(len(managed) - self._max, 0)]
    if not self._max or not excess:
      return [], []
    live = eval_claims.live_evaluators(self._dir, clock=self._clock)
    self._log_changes(live, excess)
    if not live:
      return [], []
    recorded = continuous_eval.recorded_checkpoints(self._dir)
    waiting = [p for p in excess if os.path.basename(p) not in recorded]
    cut = max(len(waiting) - self._max, 0)
    return waiting[cut:], waiting[:cut]

  def record_dropped(self, dropped: Sequence[str]) -> None:
    """Records `dropped`, now deleted, as missing in the ledger, warning."""
    if not dropped:
      return
    why = (f"deleted by the trainer before any evaluator recorded it: "
           f"{2 * self._max} checkpoints (2 x max_to_keep) are kept at most "
           "while an evaluator is live")
    logging.warning(
        "Deleted %s, %s; recorded as missing in %s. The evaluator is slower "
        "than the trainer: a larger max_to_keep or checkpoint_interval, or a "
        "second evaluator, lets it keep up.",
        ", ".join(os.path.basename(p) for p in dropped), why[len("deleted "):],
        os.path.join(self._dir, continuous_eval.LEDGER))
    for path in dropped:
      continuous_eval.record_missing(self._dir, path, why, by=TRAINER)

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
