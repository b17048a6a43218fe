"""Exactly-once continuous evaluation beside a training job.

The evaluator lists every checkpoint the trainer's `CheckpointManager`
records (not only the latest, as `tf.train.checkpoints_iterator` does), and
evaluates each one it has not evaluated before, oldest first. What it has
evaluated is a ledger, `model_dir/eval_ledger/<checkpoint>.json`, one record
written whole after each evaluation (an object store has no append), so a
restarted evaluator skips it; an older evaluator's `eval_ledger.jsonl` is
read too.

The evaluator is present on the model_dir from its start, before it waits
for its trainer or builds anything (`eval_claims.announce`, in the
launcher), until its loop ends (`eval_claims.announced`); the trainer keeps
each checkpoint that no evaluator has recorded yet past `max_to_keep`, up to
`2 x max_to_keep` in all (`tfm_ext.model_dir.retention`). A checkpoint
deleted before it was read (rotated away before any evaluator was present,
or beyond that bound, or by a user) is skipped with a warning and recorded
as "missing" (a trainer in mode `train` records those it rotated away while
no evaluator was present, and the evaluator warns of them as it starts and
ends): gone is decided by listing its files, which an object store answers
fresh, not by a stat that TF's GCS client may answer from its cache. A
restore that fails while the files are there is tried again for
`settings.stale_read_seconds` (an object rewritten by another process reads
inconsistent until TF's stat cache ages; a server that did not answer); one
that still fails is "unreadable" (cut short, zeroed). Neither is looked for
again. One whose evaluation read no batch
(`tfm_ext.training.eval_count.EmptyEvaluation`: a validation set smaller
than one batch with `drop_remainder`, an empty file) is recorded as
"empty", without metrics and never ranked, with a warning that says why;
the evaluator goes on. Each record that is not "evaluated" says why.

Several evaluators may share a model_dir: before evaluating a checkpoint an
evaluator claims it (`eval_claims.Claims`,
`model_dir/eval_claims/<checkpoint>.json`), and the others leave it alone
while the claim is renewed. A claim is won as the trainer lease is, with
no wait (bids: the smallest live token wins), and each round claims this
evaluator's share of what is waiting, so that an evaluator keeps up with a
trainer that saves every second. An evaluator that died holding a claim stops
renewing it; the claim is taken over once it has not changed for
`claim_stale_seconds` (`tfm_ext.base.settings`; at once, on the same host,
when the claimant's process is gone). Every write of an evaluation is fenced by its
claim (`Claims.check`): before the evaluator's `eval_end` (where TFM's
trainer exports the best checkpoint), before Orbit writes the validation
summaries and before the ledger record. One that was suspended past that
time, its claim taken over, writes nothing of that evaluation, with a
warning: no best checkpoint, TensorBoard point, progress line or record.

However it ends, the evaluator says what became of the checkpoints it knew
of in one end line, and its run summary's `evaluations` holds the same
count (`Tally`): evaluated here, by other evaluators, and each one not
evaluated, with its status and why.

A training mode that finishes writes `model_dir/training_complete.json`
(`tfm_ext.model_dir.run_summary`); the evaluator stops as soon as the checkpoint at
that step is in the ledger, and every checkpoint listed before it (one that
another evaluator claimed is waited for, and taken over if that one
stalled). Without a marker it stops at `train_steps`, or
after `continuous_eval_timeout` seconds without a new checkpoint.

A crash between an evaluation and its ledger record evaluates that
checkpoint again on restart: exactly once holds for every checkpoint whose
evaluation completed and was recorded. So does a ledger record that is not
whole (skipped with a warning).
"""

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from absl import logging
import orbit
import tensorflow as tf

from tfm_ext.base import errors
from tfm_ext.base import signalled
from tfm_ext.model_dir import files
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import eval_claims
from tfm_ext.model_dir import eval_ledger
from tfm_ext.model_dir import run_summary
from tfm_ext.base import failures
from tfm_ext.training import eval_count
from tfm_ext.base.logs import scalars
from tfm_ext.base import settings

# The statuses of a checkpoint whose evaluation ran to its end.
_EVALUATION_RAN = ("evaluated", "empty")
POLL_SECONDS = 1.0


def listed_checkpoints(model_dir: str) -> List[str]:
  """The checkpoints to evaluate, oldest first.

  Those the manager's state file lists (none while it is missing or
  damaged: `checkpoint_state.repair` rebuilds it). Once training is
  complete, also every `ckpt-<step>` file up to its final step: what the
  repair left out of the state file as unreadable is then recorded as such,
  and the final checkpoint is not waited for.
  """
  listed, _ = checkpoint_state.read_state(model_dir)
  paths = set(listed or [])
  final = run_summary.training_complete_step(model_dir)
  if final is not None:
    paths.update(p for p in checkpoint_state.checkpoint_files(model_dir)
                 if checkpoint_state.step_of(p) <= final)
  return sorted(paths, key=checkpoint_state.step_of)





def evaluate_continuously(controller: orbit.Controller, *, model_dir: str,
                          eval_steps: int, train_steps: int, timeout: float,
                          should_stop: Callable[[], bool] = lambda: False,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], None] = time.sleep,
                          evaluations: Optional[Dict[str, Any]] = None):
  """Evaluates each new checkpoint once; returns the last eval output.

  Once among all the evaluators of `model_dir`: each skips what the ledger
  holds or another has claimed (see the module docstring). Raises
  `UsageError` when no checkpoint appears within `timeout` seconds.
  `should_stop` is polled between evaluations (a preemption signal).
  However it ends, it prints its end line (`Tally.line`) and fills
  `evaluations` with the same count (`Tally.fields`: the run summary's).
  """
  claims = eval_claims.Claims(model_dir, clock=clock, sleep=sleep)
  # Present before the first listing (from the launcher's start on:
  # `eval_claims.announce`): what the trainer rotates away from then on
  # waits for this evaluator (see the module docstring).
  with eval_claims.announced(model_dir, claims.owner):
    ledger = eval_ledger.EvalLedger(model_dir)
    done = _Done(warned=_warn_unwatched(ledger, set()))
    ended = False
    try:
      output = _evaluate_each(controller, claims, ledger, done, model_dir,
                              eval_steps, train_steps, timeout, should_stop,
                              clock, sleep)
      ended = True
      return output
    finally:
      if ended:  # Else no more reads: what it knows is what it says.
        ledger.catch_up()
        _warn_unwatched(ledger, done.warned)
      tally = eval_ledger.Tally.of(ledger.entries.values(), claims.owner,
                                   done.seen, done.listed, done.lost)
      said = tally.line()
      (logging.warning if tally.missed else logging.info)("%s", said)
      print(said, flush=True)
      if evaluations is not None:
        evaluations.clear()
        evaluations.update(tally.fields())


@dataclasses.dataclass
class _Done:
  """What one evaluator has met: checkpoints listed, claims lost, warned."""
  warned: Set[str]
  seen: Set[str] = dataclasses.field(default_factory=set)
  listed: List[str] = dataclasses.field(default_factory=list)  # The last.
  lost: List[str] = dataclasses.field(default_factory=list)


# At most this many claims held at once, each renewed (a write every
# `claim_renew_seconds`) while it waits for its evaluation.
CLAIMED_AHEAD = 8


def _evaluate_each(controller, claims, ledger, done, model_dir, eval_steps,
                   train_steps, timeout, should_stop, clock, sleep):
  """`evaluate_continuously`, once this evaluator is present.

  Each round claims this evaluator's share of what no evaluator has
  recorded (`_share`; `Claims.acquire_each`), evaluates
  it oldest first, and lists again at once: a trainer that saves every
  second is kept up with. It sleeps `POLL_SECONDS` only after a round that
  found nothing to evaluate.
  """
  last_new = clock()
  output = None
  while not should_stop():
    listed = done.listed = listed_checkpoints(model_dir)
    if set(listed) - done.seen:
      done.seen.update(listed)
      last_new = clock()
    ledger.catch_up()
    todo = [path for path in listed if path not in ledger]
    won = (claims.acquire_each(todo, limit=_share(len(todo), model_dir))
           if todo and not should_stop() else [])
    with claims.renewed(*won):
      try:
        for path in won:
          if should_stop():
            break
          output = _evaluate_one(controller, claims, ledger, done, path,
                                 eval_steps, sleep) or output
          last_new = clock()  # A long evaluation is not idle time.
      finally:
        for path in won:
          claims.release(path)
    if _finished(model_dir, ledger, train_steps, listed):
      break
    if won:
      continue
    waited = clock() - last_new
    if waited > timeout:
      if not ledger.entries:
        raise errors.no_checkpoint(model_dir, timeout)
      logging.warning("No new checkpoint for %.0f s; stopping.", waited)
      break
    # Idle: the real sleep ends at a signal (`should_stop` is then true).
    (signalled.sleep if sleep is time.sleep else sleep)(POLL_SECONDS)
  return output


def _share(waiting: int, model_dir: str) -> int:
  """How many of `waiting` checkpoints this evaluator claims in one round.

  Its share among the evaluators present on `model_dir`, so that a second
  evaluator finds work, at most `CLAIMED_AHEAD`.
  """
  if waiting <= 1:
    return waiting
  present = max(len(eval_claims.live_evaluators(model_dir)), 1)
  return min(-(-waiting // present), CLAIMED_AHEAD)


def _evaluate_one(controller, claims, ledger, done, path, eval_steps, sleep):
  """Evaluates and records `path`, claimed; its eval output, or None.

  Each write is fenced by the claim (`Claims.check`): one taken over
  while this evaluator evaluated (it was suspended past
  `claim_stale_seconds`: `tfm_ext.base.settings`) is left to the
  evaluator that took it over, with a warning, and nothing of this
  evaluation is written.
  """
  # Another evaluator may have recorded it and let its claim go between
  # the ledger read and this claim.
  if ledger.recorded_elsewhere(path):
    return None
  try:
    logs, status, why = None, *_restore(controller, path, sleep)
    if status is None:
      logs, status, why = _evaluate(controller, claims, eval_steps, path)
    claims.check(path)
    ledger.record(path, status, scalars(logs or {}),
                  evaluator=claims.owner, why=why)
    return logs
  except eval_claims.ClaimLost:
    done.lost.append(os.path.basename(path))
    logging.warning(
        "The claim on %s was taken over while this evaluator held it "
        "(suspended for over %.0f s?): the evaluator that took it over "
        "evaluates and records it; this one wrote nothing of its evaluation "
        "(no best checkpoint, validation summary or ledger record).", path,
        settings.get().claim_stale_seconds)
    return None


def _warn_unwatched(ledger: eval_ledger.EvalLedger,
                    warned: Set[str]) -> Set[str]:
  """Warns of the checkpoints the trainer rotated away unevaluated.

  Those its ledger records say no evaluator was present for
  (`UNWATCHED`), less `warned`; returns all it has warned of.
  """
  names = [e["checkpoint"] for e in ledger.entries.values()
           if e.get("why") == eval_ledger.UNWATCHED
           and e["checkpoint"] not in warned]
  if names:
    logging.warning(
        "%d checkpoint(s) were deleted by the trainer's max_to_keep while no "
        "evaluator was present, and were never evaluated: %s (recorded as "
        "missing in %s). Start continuous_eval with the training job, or "
        "raise max_to_keep, to evaluate every checkpoint.", len(names),
        eval_ledger.ranges(names), ledger.directory)
  return warned | set(names)


# The `why` of a checkpoint whose evaluation read no batch.
_EMPTY = ("its evaluation read no batch of task.validation_data (the "
          "warning in the log says why)")


def _evaluate(controller: orbit.Controller, claims: eval_claims.Claims,
              eval_steps: int, path: str):
  """`(logs, status, why)` of evaluating `path`, restored.

  Status "evaluated", or "empty" (with a warning) for an evaluation that
  read no batch; the exporter never saw it (`eval_count`). Raises
  `eval_claims.ClaimLost` before the evaluation writes anything if the
  claim on `path` is no longer this evaluator's (`_fenced`).
  """
  eval_count.watch(controller.evaluator)
  try:
    with _fenced(controller, lambda: claims.check(path)):
      return controller.evaluate(steps=eval_steps), "evaluated", ""
  except eval_count.EmptyEvaluation as e:
    logging.warning("%s Recorded %s as empty, without metrics and out of "
                    "the best-checkpoint ranking; evaluating on.", e,
                    os.path.basename(path))
    return None, "empty", _EMPTY


@contextlib.contextmanager
def _fenced(controller: orbit.Controller,
            check: Callable[[], None]) -> Iterator[None]:
  """`check()` before each write of an evaluation, while the block runs.

  Orbit's `Controller.evaluate` runs the evaluator, then the eval actions,
  then writes the validation summaries. The writes are the evaluator's
  `eval_end` (where TFM's trainer exports the best checkpoint; after it,
  the actions: the progress line, metrics.csv, a notification) and the
  summaries: `check` runs before each, and what it raises ends the
  evaluation there. A task's own summaries written inside its batches are
  not fenced.
  """
  patched = []
  for owner, name in ((controller.evaluator, "eval_end"),
                      (controller.eval_summary_manager, "write_summaries")):
    method = getattr(owner, name, None)
    if method is None:
      continue

    def fenced(*args, _method=method, **kwargs):
      check()
      return _method(*args, **kwargs)

    setattr(owner, name, fenced)
    patched.append((owner, name, method))
  try:
    yield
  finally:
    for owner, name, method in patched:
      setattr(owner, name, method)


def _restore(controller: orbit.Controller, path: str,
             sleep: Callable[[float], None] = time.sleep
             ) -> Tuple[Optional[str], str]:
  """Restores `path`: `(None, "")`, or the status to record and why."""

  def restore(checkpoint_path):
    with controller.strategy.scope():
      # An evaluator has no optimizer slots to fill: partial by design.
      controller.checkpoint_manager.checkpoint.restore(
          checkpoint_path).expect_partial()

  return _restore_outcome(restore, path, sleep=sleep)


# What a restore raises for a checkpoint cut short (IndexError), or that
# TF's stat cache has the wrong length for; `tf.errors.OpError` is the rest.
_RESTORE_ERRORS = (tf.errors.OpError, IndexError)
# TensorFlow's errors that say the store did not answer, not that the
# checkpoint is bad: tried again on a local disk too.
_TRANSIENT = failures.TRANSIENT + (tf.errors.DeadlineExceededError,
                                   tf.errors.ResourceExhaustedError)


def restore_status(restore: Callable[[str], None], path: str, *,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic
                   ) -> Optional[str]:
  """Calls `restore(path)`; None, or "missing" or "unreadable" if it fails.

  "missing" when its files are no longer listed. A failure while they are
  is tried again until `settings.stale_read_seconds` have passed (on an object
  store whatever it raised, since a stale length reads as inconsistent or
  cut short; on a local disk only `_TRANSIENT` errors); then "unreadable".
  """
  return _restore_outcome(restore, path, sleep=sleep, clock=clock)[0]


def _restore_outcome(restore: Callable[[str], None], path: str, *,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic
                     ) -> Tuple[Optional[str], str]:
  """`restore_status`, with why: `(status or None, why)`."""
  deadline = None
  while True:
    try:
      restore(path)
      return None, ""
    except _RESTORE_ERRORS as e:
      failures.forget_failed_restore(e)
      cause = checkpoint_state.first_line(e)
      if not _listed(path):
        logging.warning("Checkpoint %s vanished before it was evaluated; "
                        "recorded as missing and skipped: %s", path, cause)
        return "missing", f"deleted before it was read ({cause})"
      deadline = deadline or clock() + settings.get().stale_read_seconds
      retried = (isinstance(e, _TRANSIENT)
                 or files.local_path(path) is None)
      if not retried or clock() > deadline:
        logging.warning("Checkpoint %s cannot be read (%s); recorded as "
                        "unreadable and skipped.", path, cause)
        return "unreadable", f"its files do not read ({cause})"
      logging.info("Reading checkpoint %s failed (%s); trying again.", path,
                   cause)
      sleep(1.0)


def _listed(path: str) -> bool:
  """Whether the index of checkpoint `path` is listed.

  TensorFlow's rotation deletes the index first: an index without its data
  is damage (unreadable), not a rotation. A listing, not `exists`: TF's GCS
  client answers a stat of an object another process deleted from its
  cache (`GCS_STAT_CACHE_MAX_AGE`); and a pattern, since a name alone
  may be answered by such a stat.
  """
  return path + ".index" in tf.io.gfile.glob(path + ".*")


def _finished(model_dir: str, ledger: eval_ledger.EvalLedger, train_steps: int,
              listed: List[str]) -> bool:
  """Whether the training's last checkpoint is recorded, and all before it.

  A checkpoint that another evaluator claimed is waited for: that one
  records it, or stops renewing its claim, which is then taken over.
  """
  if not all(path in ledger or ledger.recorded_elsewhere(path)
             for path in listed):
    return False
  evaluated = [e["global_step"] for e in ledger.entries.values()
               if e["status"] in _EVALUATION_RAN]
  final = run_summary.training_complete_step(model_dir)
  last = max((e["global_step"] for e in ledger.entries.values()), default=-1)
  if final is not None:
    return last >= final
  return bool(evaluated) and max(evaluated) >= train_steps
