"""Exactly-once continuous evaluation beside a training job.

The evaluator lists every checkpoint the trainer's `CheckpointManager`
records (not only the latest, as `tf.train.checkpoints_iterator` does), and
evaluates each one it has not evaluated before, oldest first. What it has
evaluated is a ledger, `model_dir/eval_ledger/<checkpoint>.json`, one record
written whole after each evaluation (an object store has no append), so a
restarted evaluator skips it; an older evaluator's `eval_ledger.jsonl` is
read too.

While it runs, the evaluator is present on the model_dir
(`eval_claims.announced`), and the trainer keeps each checkpoint that no
evaluator has recorded yet past `max_to_keep`, up to `2 x max_to_keep` in all
(`tfm_ext.model_dir.retention`). A checkpoint deleted before it was read (rotated away
before any evaluator was present, or beyond that bound, or by a user) is
skipped with a warning and recorded as "missing" (a trainer in mode `train`
records those it rotated away while no evaluator was present, and the
evaluator warns of them as it starts and ends): gone is decided by listing
its files, which an object store answers fresh, not by a stat that TF's GCS
client may answer from its cache. A restore that fails while the files are
there is tried again for `_files.STALE_READ_SECONDS` (an object rewritten by
another process reads inconsistent until TF's stat cache ages; a server
that did not answer); one that still fails is "unreadable" (cut short,
zeroed). Neither is looked for again. One
whose evaluation read no batch (`tfm_ext.training.eval_count.EmptyEvaluation`: a
validation set smaller than one batch with `drop_remainder`, an empty file)
is recorded as "empty", without metrics and never ranked, with a warning
that says why; the evaluator goes on.

Several evaluators may share a model_dir: before evaluating a checkpoint an
evaluator claims it (`eval_claims.Claims`,
`model_dir/eval_claims/<checkpoint>.json`), and the others leave it alone
while the claim is renewed. An evaluator that died holding a claim stops
renewing it; the claim is taken over once it has not changed for
`eval_claims.STALE_CLAIM_SECONDS` (at once, on the same host, when the
claimant's process is gone). An evaluator records a checkpoint only if the
claim is still its own when it writes the record (`Claims.holds`): one that
was suspended past that time, its claim taken over, evaluates on but
records nothing, with a warning.

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

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Set

from absl import logging
import orbit
import tensorflow as tf

from tfm_ext import errors
from tfm_ext.actions import console
from tfm_ext.model_dir import _files
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import eval_claims
from tfm_ext.model_dir import run_summary
from tfm_ext.run import failures
from tfm_ext.training import eval_count

LEDGER = "eval_ledger"
LEGACY_LEDGER = "eval_ledger.jsonl"
_ENTRY_KEYS = ("checkpoint", "global_step", "status")
# The statuses of a checkpoint whose evaluation ran to its end.
_EVALUATION_RAN = ("evaluated", "empty")
# The `why` of a "missing" record the trainer wrote for a checkpoint it
# rotated away while no evaluator was present (`tfm_ext.model_dir.retention`).
UNWATCHED = ("rotated away by max_to_keep while no evaluator was present on "
             "the model_dir")
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


def recorded_checkpoints(model_dir: str) -> Set[str]:
  """The names of the checkpoints the ledger holds a record of, any status.

  One listing, no record read (what the trainer asks at each save). An
  older evaluator's `eval_ledger.jsonl` is not looked at.
  """
  try:
    names = tf.io.gfile.listdir(os.path.join(model_dir, LEDGER))
  except tf.errors.NotFoundError:
    return set()
  return {n[:-len(".json")] for n in names if n.endswith(".json")}


def record_missing(model_dir: str, checkpoint_path: str, why: str,
                   by: str) -> None:
  """Records `checkpoint_path`, deleted before it was evaluated, as missing.

  Unless a record of it is there by now: an evaluation recorded a moment
  ago stays.
  """
  name = os.path.basename(checkpoint_path)
  if tf.io.gfile.exists(os.path.join(model_dir, LEDGER, name + ".json")):
    return
  _files.write_record(os.path.join(model_dir, LEDGER), name,
                      _entry(checkpoint_path, "missing", {}, by, why))


def _entry(checkpoint_path: str, status: str, metrics: Mapping[str, float],
           evaluator: str, why: str = "") -> Dict[str, Any]:
  entry = {"checkpoint": os.path.basename(checkpoint_path),
           "global_step": checkpoint_state.step_of(checkpoint_path),
           "status": status, "metrics": dict(metrics),
           "evaluator": evaluator, "time": time.time()}
  if why:
    entry["why"] = why
  return entry


def read_ledger(model_dir: str) -> List[Dict[str, Any]]:
  """The ledger's entries, one per checkpoint, oldest first.

  `{"checkpoint": "ckpt-20", "global_step": 20, "status": "evaluated",
  "empty", "missing" or "unreadable", "metrics": {...}, "evaluator": ...,
  "time": ...}`. A record that is not whole is skipped with a warning: its
  checkpoint is evaluated again.
  """
  records = _files.read_records(
      os.path.join(model_dir, LEDGER), _ENTRY_KEYS,
      legacy_file=os.path.join(model_dir, LEGACY_LEDGER))
  entries = {e["checkpoint"]: e for e in records}  # The latest counts.
  return sorted(entries.values(), key=lambda e: e["global_step"])


class EvalLedger:
  """The checkpoints this model_dir's evaluators have dealt with."""

  def __init__(self, model_dir: str):
    self._model_dir = model_dir
    self.directory = os.path.join(model_dir, LEDGER)
    self.entries: Dict[str, Dict[str, Any]] = {
        e["checkpoint"]: e for e in read_ledger(model_dir)}

  def catch_up(self) -> None:
    """Reads the records written since: one listing, a read of each new one."""
    for name in recorded_checkpoints(self._model_dir) - set(self.entries):
      self.recorded_elsewhere(name)

  def __contains__(self, checkpoint_path: str) -> bool:
    return os.path.basename(checkpoint_path) in self.entries

  def recorded_elsewhere(self, checkpoint_path: str) -> bool:
    """Whether another evaluator has recorded it since this ledger was read.

    Reads that one record, not the whole ledger.
    """
    name = os.path.basename(checkpoint_path)
    try:
      entry = _files.read_object(os.path.join(self.directory, name + ".json"),
                                 _ENTRY_KEYS)
    except (tf.errors.NotFoundError, ValueError):
      return False  # Not there, or not whole: not recorded.
    self.entries[name] = entry
    return True

  def record(self, checkpoint_path: str, status: str,
             metrics: Optional[Mapping[str, float]] = None,
             evaluator: str = "") -> None:
    entry = _entry(checkpoint_path, status, metrics or {}, evaluator)
    _files.write_record(self.directory, entry["checkpoint"], entry)
    self.entries[entry["checkpoint"]] = entry

  def evaluated_steps(self) -> List[int]:
    return sorted(e["global_step"] for e in self.entries.values()
                  if e["status"] == "evaluated")


def evaluate_continuously(controller: orbit.Controller, *, model_dir: str,
                          eval_steps: int, train_steps: int, timeout: float,
                          should_stop: Callable[[], bool] = lambda: False,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], None] = time.sleep):
  """Evaluates each new checkpoint once; returns the last eval output.

  Once among all the evaluators of `model_dir`: each skips what the ledger
  holds or another has claimed (see the module docstring). Raises
  `UsageError` when no checkpoint appears within `timeout` seconds.
  `should_stop` is polled between evaluations (a preemption signal).
  """
  claims = eval_claims.Claims(model_dir, clock=clock, sleep=sleep)
  # Present before the first listing: what the trainer rotates away from
  # now on waits for this evaluator (see the module docstring).
  with eval_claims.announced(model_dir, claims.owner):
    return _evaluate_each(controller, claims, model_dir, eval_steps,
                          train_steps, timeout, should_stop, clock, sleep)


def _evaluate_each(controller, claims, model_dir, eval_steps, train_steps,
                   timeout, should_stop, clock, sleep):
  """`evaluate_continuously`, once this evaluator is present."""
  ledger = EvalLedger(model_dir)
  warned = _warn_unwatched(ledger, set())
  seen = set()
  last_new = clock()
  output = None
  while not should_stop():
    listed = listed_checkpoints(model_dir)
    for path in listed:
      if path not in seen:
        seen.add(path)
        last_new = clock()
      if (path in ledger or should_stop() or ledger.recorded_elsewhere(path)
          or not claims.acquire(path)):
        continue
      try:
        # Another evaluator may have recorded it and let its claim go
        # between the ledger read above and this claim.
        if ledger.recorded_elsewhere(path):
          continue
        with claims.renewed(path):
          status = _restore(controller, path, sleep)
          logs = None
          if status is None:
            logs, status = _evaluate(controller, eval_steps, path)
            output = logs or output
        last_new = clock()  # A long evaluation is not idle time.
        if not claims.holds(path):
          logging.warning(
              "The claim on %s was taken over while this evaluator held it "
              "(suspended for over %.0f s?): the evaluator that took it "
              "over records it, this one does not.", path,
              eval_claims.STALE_CLAIM_SECONDS)
          continue
        ledger.record(path, status, console.scalars(logs or {}),
                      evaluator=claims.owner)
      finally:
        claims.release(path)
    if _finished(model_dir, ledger, train_steps, listed):
      break
    waited = clock() - last_new
    if waited > timeout:
      if not ledger.entries:
        raise errors.no_checkpoint(model_dir, timeout)
      logging.warning("No new checkpoint for %.0f s; stopping.", waited)
      break
    sleep(POLL_SECONDS)
  ledger.catch_up()
  _warn_unwatched(ledger, warned)
  said = tally(ledger, claims.owner, seen)
  (logging.warning if "not evaluated" in said else logging.info)("%s", said)
  print(said, flush=True)
  return output


def tally(ledger: "EvalLedger", owner: str, seen: Set[str]) -> str:
  """The evaluator's end line: what it evaluated, what no one did, why.

  Of the checkpoints in the ledger and those this evaluator saw listed
  (`seen`): evaluated here or by other evaluators, and not evaluated:
  missing, unreadable or empty, as recorded, and seen but recorded by no
  evaluator (this one stopped first).
  """
  entries = list(ledger.entries.values())
  here = sum(e["status"] == "evaluated" and e.get("evaluator") == owner
             for e in entries)
  others = sum(e["status"] == "evaluated" for e in entries) - here
  not_evaluated = []
  for status in ("missing", "unreadable", "empty"):
    names = [e["checkpoint"] for e in entries if e["status"] == status]
    whys = sorted({e.get("why") or "" for e in entries
                   if e["status"] == status} - {""})
    if names:
      not_evaluated.append(f"{len(names)} {status} ({_ranges(names)}"
                           + (f": {'; '.join(whys)}" if whys else "") + ")")
  unrecorded = [os.path.basename(p) for p in seen
                if os.path.basename(p) not in ledger.entries]
  if unrecorded:
    not_evaluated.append(f"{len(unrecorded)} never recorded "
                         f"({_ranges(unrecorded)}: this evaluator stopped "
                         "first)")
  line = (f"continuous_eval | {here} checkpoint(s) evaluated here, {others} "
          "by other evaluators")
  if not_evaluated:
    line += f" | not evaluated: {', '.join(not_evaluated)}"
  return line


def _warn_unwatched(ledger: "EvalLedger", warned: Set[str]) -> Set[str]:
  """Warns of the checkpoints the trainer rotated away unevaluated.

  Those its ledger records say no evaluator was present for
  (`UNWATCHED`), less `warned`; returns all it has warned of.
  """
  names = [e["checkpoint"] for e in ledger.entries.values()
           if e.get("why") == UNWATCHED and e["checkpoint"] not in warned]
  if names:
    logging.warning(
        "%d checkpoint(s) were deleted by the trainer's max_to_keep while no "
        "evaluator was present, and were never evaluated: %s (recorded as "
        "missing in %s). Start continuous_eval with the training job, or "
        "raise max_to_keep, to evaluate every checkpoint.", len(names),
        _ranges(names), ledger.directory)
  return warned | set(names)


def _ranges(names: List[str]) -> str:
  """`ckpt-10, ckpt-20 ... ckpt-90`: at most the first two and the last."""
  names = sorted(names, key=checkpoint_state.step_of)
  if len(names) <= 3:
    return ", ".join(names)
  return f"{names[0]}, {names[1]} ... {names[-1]}"


def _evaluate(controller: orbit.Controller, eval_steps: int, path: str):
  """`(logs, status)` of evaluating `path`, restored: "evaluated" or "empty".

  An evaluation that read no batch is "empty", with a warning; the
  exporter never saw it (`eval_count`).
  """
  eval_count.watch(controller.evaluator)
  try:
    return controller.evaluate(steps=eval_steps), "evaluated"
  except eval_count.EmptyEvaluation as e:
    logging.warning("%s Recorded %s as empty, without metrics and out of "
                    "the best-checkpoint ranking; evaluating on.", e,
                    os.path.basename(path))
    return None, "empty"


def _restore(controller: orbit.Controller, path: str,
             sleep: Callable[[float], None] = time.sleep) -> Optional[str]:
  """Restores `path`; returns None, or the status to record if it cannot."""

  def restore(checkpoint_path):
    with controller.strategy.scope():
      # An evaluator has no optimizer slots to fill: partial by design.
      controller.checkpoint_manager.checkpoint.restore(
          checkpoint_path).expect_partial()

  return restore_status(restore, path, sleep=sleep)


# What a restore raises for a checkpoint cut short (IndexError), or that
# TF's stat cache has the wrong length for; `tf.errors.OpError` is the rest.
_RESTORE_ERRORS = (tf.errors.OpError, IndexError)
# TensorFlow's errors that say the store did not answer, not that the
# checkpoint is bad: tried again on a local disk too.
_TRANSIENT = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
              tf.errors.AbortedError, tf.errors.ResourceExhaustedError)


def restore_status(restore: Callable[[str], None], path: str, *,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic
                   ) -> Optional[str]:
  """Calls `restore(path)`; None, or "missing" or "unreadable" if it fails.

  "missing" when its files are no longer listed. A failure while they are
  is tried again until `_files.STALE_READ_SECONDS` have passed (on an object
  store whatever it raised, since a stale length reads as inconsistent or
  cut short; on a local disk only `_TRANSIENT` errors); then "unreadable".
  """
  deadline = None
  while True:
    try:
      restore(path)
      return None
    except _RESTORE_ERRORS as e:
      failures.forget_failed_restore(e)
      cause = checkpoint_state.first_line(e)
      if not _listed(path):
        logging.warning("Checkpoint %s vanished before it was evaluated; "
                        "recorded as missing and skipped: %s", path, cause)
        return "missing"
      deadline = deadline or clock() + _files.STALE_READ_SECONDS
      retried = (isinstance(e, _TRANSIENT)
                 or _files.local_path(path) is None)
      if not retried or clock() > deadline:
        logging.warning("Checkpoint %s cannot be read (%s); recorded as "
                        "unreadable and skipped.", path, cause)
        return "unreadable"
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


def _finished(model_dir: str, ledger: EvalLedger, train_steps: int,
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
