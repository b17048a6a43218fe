"""Actions: what runs around the model after each training loop or evaluation.

Trainer hooks (`CustomTrainer`) are for model logic; actions, Orbit's plain
callables on a loop's or an evaluation's output (`Callable[[Output], None]`),
are for everything around it: progress lines, the non-finite loss check,
preemption save-and-stop, TFM's own actions (pruning, divergence recovery,
EMA checkpoints). A downstream repo adds its own without subclassing
anything, by registering a factory:

    @tfm_ext.register_action("notify", phase="eval")
    def notify(context: tfm_ext.ActionContext):
      if not context.chief:
        return None  # Stays out of this run.
      return lambda output: send(context.model_dir, output)

Every factory registered in the process (its module imported, as a
`--registry` or a fork's `registry_imports` does) is called once per run,
after the driver's own actions are built and before anything runs, and its
action runs after the driver's on each output of its phase (`train`: after
each training loop; `eval`: after each evaluation), in the order of their
names.
An action that raises stops the run with its exception, as the driver's own
do.
"""

import dataclasses
import math
from typing import Any, Callable, List, Mapping, Optional

import orbit
import tensorflow as tf

from official.core import actions as tfm_actions
from official.core import config_definitions
from official.modeling import optimization

from tfm_ext import optimizers
from tfm_ext import registry
from tfm_ext.errors import RunFailed

PHASES = ("train", "eval")

Output = Optional[Mapping[str, Any]]
Action = Callable[[Output], None]


@dataclasses.dataclass(frozen=True)
class ActionContext:
  """What an action factory may build its action from: the assembled run."""
  params: config_definitions.ExperimentConfig
  mode: str
  model_dir: str
  trainer: Any  # A `base_trainer.Trainer`.
  checkpoint_manager: Optional[tf.train.CheckpointManager]
  strategy: tf.distribute.Strategy
  # Whether this process writes into model_dir (the chief of its cluster).
  chief: bool


ACTIONS = {phase: registry.Registry(f"{phase} action") for phase in PHASES}


def register_action(name: str, *, phase: str):
  """Decorator: registers `factory(ActionContext) -> action or None`.

  Raises `ValueError` for a phase other than "train" or "eval", and
  `RegistryError` for a name already registered in that phase.
  """
  if phase not in PHASES:
    raise ValueError(f"register_action({name!r}, phase={phase!r}): phase "
                     f"must be one of {PHASES}.")
  return ACTIONS[phase].register(name)


def registered(phase: str, context: ActionContext) -> List[Action]:
  """The actions the registered factories of `phase` give for `context`."""
  built = (ACTIONS[phase].get(name)(context)
           for name in ACTIONS[phase].names())
  return [action for action in built if action is not None]


class EMACheckpointing(tfm_actions.EMACheckpointing):
  """TFM's action that saves the averaged weights, with any strategy.

  TFM's swaps the weights with `swap_weights`, which needs a strategy's
  cross-replica context; this one swaps with `optimizers.swap_ema_weights`,
  so EMA also works without a strategy.
  """

  def __call__(self, output: Output) -> None:
    del output
    optimizers.swap_ema_weights(self._optimizer)
    self._checkpoint_manager.save(checkpoint_number=self._optimizer.iterations)
    optimizers.swap_ema_weights(self._optimizer)


def tfm_eval_actions(params: config_definitions.ExperimentConfig, trainer,
                     model_dir: str) -> List[Action]:
  """TFM's eval actions (`official.core.actions.get_eval_actions`).

  That is the EMA checkpointing of an averaging optimizer, here the one
  that works without a strategy (`EMACheckpointing`).
  """
  if not isinstance(trainer.optimizer, optimization.ExponentialMovingAverage):
    return []
  return [EMACheckpointing(export_dir=model_dir, optimizer=trainer.optimizer,
                           checkpoint=trainer.checkpoint,
                           max_to_keep=params.trainer.max_to_keep)]


class NonFiniteLossCheck:
  """Stops the run with `RunFailed` if a loop's mean training loss is NaN/inf.

  It reads the loss the trainer reports for the loop (no op in the step:
  benchmarks/RESULTS.md#default-nan-check), so it runs before the loop's
  checkpoint is saved: the last checkpoint stays the last good one. The
  message names the loop's steps, and how to find the step.
  """

  def __init__(self, *, loss_name: str, global_step: tf.Variable,
               start_step: int, input_in_checkpoint: bool):
    self._loss_name = loss_name
    self._global_step = global_step
    self._loop_start = start_step  # The step the next loop starts after.
    self._input_in_checkpoint = input_in_checkpoint

  def __call__(self, output: Output) -> None:
    first, self._loop_start = self._loop_start, int(self._global_step.numpy())
    loss = (output or {}).get(self._loss_name)
    if loss is None or math.isfinite(float(orbit.utils.get_value(loss))):
      return
    raise RunFailed(self.message(first + 1, self._loop_start))

  def message(self, first: int, last: int) -> str:
    if first >= last:
      return f"The training loss is not finite (NaN or inf) at step {last}."
    same_batches = ("a resumed run reads the same batches" if
                    self._input_in_checkpoint else "this run's input "
                    "position is not in its checkpoints, so a resumed run may "
                    "read other batches")
    return (f"The training loss is not finite (NaN or inf) in steps "
            f"{first}-{last} (one loop). To find the step, resume from the "
            f"last checkpoint with --params_override=trainer.steps_per_loop=1"
            f" ({same_batches}).")
