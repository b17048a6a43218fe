"""The optimizers of a trainer, by stable name, and their learning rates."""

from typing import Any, Mapping, Optional

import tensorflow as tf


def swap_ema_weights(optimizer) -> None:
  """Swaps an EMA optimizer's averaged and training weights, any strategy.

  TFM's `ExponentialMovingAverage.swap_weights` refuses outside a
  cross-replica context, which TF's default strategy (no strategy:
  `distribution_strategy=off`, or `mirrored` on one CPU with
  `runtime.mirror_one_device=false`) never has, so EMA
  would fail at the first evaluation. Its `_swap_weights` does the same swap
  through `strategy.extended.update`, which the default strategy supports;
  this is the one place that calls it.
  """
  if tf.distribute.in_cross_replica_context():
    optimizer.swap_weights()
  else:
    optimizer._swap_weights()  # pylint: disable=protected-access


def named_optimizers(optimizer) -> Mapping[str, Any]:
  """Returns `{name: optimizer}`; a composite optimizer yields its parts.

  A composite optimizer (TFRS's `CompositeOptimizer`, the RankingTrainer case)
  exposes `optimizers` as a list or a dict. List entries are named
  `<index>_<ClassName>`, which stays the same from run to run.
  """
  parts = getattr(optimizer, "optimizers", None)
  if hasattr(parts, "items"):  # A dict, or tf.Module's tracking wrapper of one.
    return dict(parts.items())
  if isinstance(parts, (list, tuple)) and parts:
    return {f"{i}_{type(opt).__name__}": opt for i, opt in enumerate(parts)}
  return {"": optimizer}

def current_learning_rate(optimizer, global_step: tf.Variable) -> Optional[Any]:
  lr = optimizer.learning_rate
  if callable(lr):
    step = getattr(optimizer, "iterations", None)
    return lr(global_step if step is None else step)
  return lr
