"""TFM's own actions (`official.core.actions`), as a tfm_ext run uses them.

Pruning and on-demand preemption checkpoints where configured, EMA
checkpoints of an averaging optimizer with or without a strategy, and not
TFM's divergence recovery (`tfm_ext.actions.divergence` replaces it).
"""

from typing import List

import orbit

from official.core import actions as tfm_actions
from official.core import config_definitions
from official.modeling import optimization

from tfm_ext.training import optimizers

from tfm_ext.actions import Action
from tfm_ext.actions import Output


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


def eval_actions(params: config_definitions.ExperimentConfig, trainer,
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


def train_actions(params: config_definitions.ExperimentConfig, trainer,
                  model_dir: str, checkpoint_manager) -> List[Action]:
  """TFM's train actions (`official.core.actions.get_train_actions`).

  That is pruning and on-demand preemption checkpoints where configured,
  without TFM's divergence recovery: `divergence.DivergenceRecovery`
  replaces it.
  """
  return [action for action in tfm_actions.get_train_actions(
      params, trainer, model_dir, checkpoint_manager=checkpoint_manager)
          if not (isinstance(action, orbit.actions.ConditionalAction) and
                  isinstance(action.condition, tfm_actions.RecoveryCondition))]
