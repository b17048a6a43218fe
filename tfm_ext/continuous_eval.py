"""Exactly-once continuous evaluation beside a training job.

The evaluator lists every checkpoint the trainer's `CheckpointManager`
records (not only the latest, as `tf.train.checkpoints_iterator` does), and
evaluates each one it has not evaluated before, oldest first. What it has
evaluated is a ledger, `model_dir/eval_ledger/<checkpoint>.json`, one record
written whole after each evaluation (an object store has no append), so a
restarted evaluator skips it; an older evaluator's `eval_ledger.jsonl` is
read too. A checkpoint that `max_to_keep` deleted before it was read is
skipped with a warning (and recorded, so it is not looked for again).

A training mode that finishes writes `model_dir/training_complete.json`
(`mark_training_complete`); the evaluator stops as soon as it has evaluated
the checkpoint at that step. Without a marker it stops at `train_steps`, or
after `continuous_eval_timeout` seconds without a new checkpoint.

A crash between an evaluation and its ledger line evaluates that checkpoint
again on restart: exactly once holds for every checkpoint whose evaluation
completed and was recorded. So does a ledger record that is not whole
(skipped with a warning).
"""

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from absl import logging
import orbit
import tensorflow as tf

from tfm_ext import _files
from tfm_ext import console
from tfm_ext.errors import UsageError

LEDGER = "eval_ledger"
LEGACY_LEDGER = "eval_ledger.jsonl"
_ENTRY_KEYS = ("checkpoint", "global_step", "status")
COMPLETE_MARKER = "training_complete.json"
POLL_SECONDS = 1.0


def mark_training_complete(model_dir: str, global_step: int) -> None:
  """Tells evaluators that no checkpoint after `global_step` will come."""
  _files.write_json(
      os.path.join(model_dir, COMPLETE_MARKER),
      {"global_step": int(global_step), "time": time.time()})


def clear_training_complete(model_dir: str) -> None:
  """Removes the marker: a training run is (again) in progress."""
  path = os.path.join(model_dir, COMPLETE_MARKER)
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)


def training_complete_step(model_dir: str) -> Optional[int]:
  """The step `mark_training_complete` recorded, or None."""
  try:
    return int(_files.read_json(os.path.join(model_dir,
                                             COMPLETE_MARKER))["global_step"])
  except (tf.errors.NotFoundError, ValueError, KeyError, TypeError):
    return None


def checkpoint_step(path: str) -> int:
  return int(path.rsplit("-", 1)[-1])


def listed_checkpoints(model_dir: str) -> List[str]:
  """Every checkpoint the manager's state file lists, oldest first."""
  state = tf.train.get_checkpoint_state(model_dir)
  if state is None:
    return []
  paths = set(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path:
    paths.add(state.model_checkpoint_path)
  return sorted((os.path.join(model_dir, os.path.basename(p)) for p in paths),
                key=checkpoint_step)


def read_ledger(model_dir: str) -> List[Dict[str, Any]]:
  """The ledger's entries, one per checkpoint, oldest first.

  `{"checkpoint": "ckpt-20", "global_step": 20, "status": "evaluated" or
  "missing", "metrics": {...}, "time": ...}`. A record that is not whole is
  skipped with a warning: its checkpoint is evaluated again.
  """
  records = _files.read_records(
      os.path.join(model_dir, LEDGER), _ENTRY_KEYS,
      legacy_file=os.path.join(model_dir, LEGACY_LEDGER))
  entries = {e["checkpoint"]: e for e in records}  # The latest counts.
  return sorted(entries.values(), key=lambda e: e["global_step"])


class EvalLedger:
  """The checkpoints this model_dir's evaluators have dealt with."""

  def __init__(self, model_dir: str):
    self._dir = os.path.join(model_dir, LEDGER)
    self.entries: Dict[str, Dict[str, Any]] = {
        e["checkpoint"]: e for e in read_ledger(model_dir)}

  def __contains__(self, checkpoint_path: str) -> bool:
    return os.path.basename(checkpoint_path) in self.entries

  def record(self, checkpoint_path: str, status: str,
             metrics: Optional[Mapping[str, float]] = None) -> None:
    entry = {"checkpoint": os.path.basename(checkpoint_path),
             "global_step": checkpoint_step(checkpoint_path),
             "status": status, "metrics": dict(metrics or {}),
             "time": time.time()}
    _files.write_record(self._dir, entry["checkpoint"], entry)
    self.entries[entry["checkpoint"]] = entry

  def evaluated_steps(self) -> List[int]:
    return sorted(e["global_step"] for e in self.entries.values()
                  if e["status"] == "evaluated")


def no_checkpoint_error(model_dir: str, timeout: float) -> UsageError:
  """What an evaluator that waited `timeout` seconds for a trainer says."""
  return UsageError(
      f"No checkpoint appeared in {model_dir!r} within "
      f"continuous_eval_timeout={timeout:.0f}s. Is the training job "
      "running and writing to the same --model_dir?")


def evaluate_continuously(controller: orbit.Controller, *, model_dir: str,
                          eval_steps: int, train_steps: int, timeout: float,
                          should_stop: Callable[[], bool] = lambda: False,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], None] = time.sleep):
  """Evaluates each new checkpoint once; returns the last eval output.

  Raises `UsageError` when no checkpoint appears within `timeout` seconds.
  `should_stop` is polled between evaluations (a preemption signal).
  """
  ledger = EvalLedger(model_dir)
  last_new = clock()
  output = None
  while not should_stop():
    for path in listed_checkpoints(model_dir):
      if path in ledger or should_stop():
        continue
      try:
        with controller.strategy.scope():
          # An evaluator has no optimizer slots to fill: partial by design.
          controller.checkpoint_manager.checkpoint.restore(
              path).expect_partial()
      except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
        logging.warning("Checkpoint %s vanished before it was evaluated "
                        "(max_to_keep?); skipping it: %s", path,
                        str(e).splitlines()[0])
        ledger.record(path, "missing")
        continue
      output = controller.evaluate(steps=eval_steps)
      ledger.record(path, "evaluated", console.scalars(output or {}))
      last_new = clock()
    if _finished(model_dir, ledger, train_steps):
      break
    waited = clock() - last_new
    if waited > timeout:
      if not ledger.entries:
        raise no_checkpoint_error(model_dir, timeout)
      logging.warning("No new checkpoint for %.0f s; stopping.", waited)
      break
    sleep(POLL_SECONDS)
  return output


def _finished(model_dir: str, ledger: EvalLedger, train_steps: int) -> bool:
  evaluated = ledger.evaluated_steps()
  final = training_complete_step(model_dir)
  last = max((e["global_step"] for e in ledger.entries.values()), default=-1)
  if final is not None:
    return last >= final
  return bool(evaluated) and evaluated[-1] >= train_steps
