"""Divergence recovery: TFM's, with a run that fails cleanly when it ends."""

import math
from typing import Optional

from absl import logging
import orbit
import tensorflow as tf

from tfm_ext.base.errors import RunFailed

from tfm_ext.actions import Output


class DivergenceRecovery:
  """TFM's divergence recovery, with a run that fails cleanly when it ends.

  After each training loop it reads the loop's mean training loss (no op in
  the step: benchmarks/RESULTS.md#default-nan-check). A loop diverged if
  that loss is NaN or infinite, or above `trainer.loss_upper_bound` once the
  global step reaches `trainer.recovery_begin_steps`: TFM's
  `RecoveryCondition`. Each divergence uses one of
  `trainer.recovery_max_trials`: the latest checkpoint is restored (weights,
  optimizer, step and, where saved, the input position) and training goes
  on. Once the trials are used up, or with no checkpoint to go back to, the
  run fails with `RunFailed` naming the loop's steps. It runs before the
  loop's checkpoint is saved, so the last checkpoint stays the last good one.

  Beyond TFM: the first loop of a process, a single step
  (`assembly.FirstStepThenEvery`), is held only to finiteness, since one
  step's loss is not a loop's mean; and a divergence with nothing to restore
  fails instead of training on from the diverged weights.
  `recovery_max_trials < 0` turns the check off, as in TFM.
  """

  def __init__(self, *, loss_name: str, global_step: tf.Variable,
               start_step: int, input_in_checkpoint: bool,
               checkpoint_manager: Optional[tf.train.CheckpointManager] = None,
               max_trials: int = 0, loss_upper_bound: float = math.inf,
               begin_steps: int = 0):
    self._loss_name = loss_name
    self._global_step = global_step
    self._loop_start = start_step  # The step the next loop starts after.
    self._input_in_checkpoint = input_in_checkpoint
    self._manager = checkpoint_manager
    self._max_trials = max_trials
    self._bound = loss_upper_bound
    self._begin_steps = begin_steps
    self._first_loop = True
    self.trials = 0  # Divergences so far in this process.

  @classmethod
  def from_config(cls, trainer_config, **kwargs) -> "DivergenceRecovery":
    """Built from `trainer.recovery_*` and `trainer.loss_upper_bound`."""
    return cls(max_trials=trainer_config.recovery_max_trials,
               loss_upper_bound=trainer_config.loss_upper_bound,
               begin_steps=trainer_config.recovery_begin_steps, **kwargs)

  def __call__(self, output: Output) -> None:
    first, last = self._loop_start + 1, int(self._global_step.numpy())
    self._loop_start = last
    first_loop, self._first_loop = self._first_loop, False
    loss = (output or {}).get(self._loss_name)
    if loss is None:
      return
    loss = float(orbit.utils.get_value(loss))
    if math.isfinite(loss):
      if first_loop or last < self._begin_steps or loss <= self._bound:
        return
      problem = (f"The training loss, {loss:.4g}, is above "
                 f"trainer.loss_upper_bound={self._bound:g}")
    else:
      problem = "The training loss is not finite (NaN or inf)"
    problem += (f" at step {last}." if first >= last else
                f" in steps {first}-{last} (one loop).")
    self.trials += 1
    latest = self._manager.latest_checkpoint if self._manager else None
    if self.trials > self._max_trials or latest is None:
      raise RunFailed(self._failure(problem, first, last, latest))
    self._manager.restore_or_initialize()
    self._loop_start = int(self._global_step.numpy())
    message = (f"recovery {self.trials}/{self._max_trials}: {problem} "
               f"Restored {latest} (step {self._loop_start}) and training on.")
    logging.warning(message)
    print(message, flush=True)

  def _failure(self, problem: str, first: int, last: int,
               latest: Optional[str]) -> str:
    if self._max_trials > 0:
      problem += (f" It diverged {self.trials} times; "
                  f"trainer.recovery_max_trials={self._max_trials}.")
      if latest is None:
        problem += " There is no checkpoint yet to recover from."
    if first >= last:
      return problem
    same_batches = ("a resumed run reads the same batches" if
                    self._input_in_checkpoint else "this run's input "
                    "position is not in its checkpoints, so a resumed run may "
                    "read other batches")
    return (f"{problem} To find the step, resume from the last checkpoint "
            f"with --params_override=trainer.steps_per_loop=1 "
            f"({same_batches}).")
