"""The optimizers of a trainer, by stable name, and their learning rates."""

from typing import Any, Callable, Mapping, Optional

import tensorflow as tf
from tf_keras.optimizers import legacy
from tf_keras.src.optimizers.legacy.optimizer_v2 import _var_key  # pylint: disable=g-importing-member


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


def create_weights(optimizer, variables) -> Callable[[], None]:
  """Creates the optimizer's slots for `variables` before the loop is traced.

  A `tf.function` whose first trace creates variables is traced again
  before it runs (TF's rule: only a first trace may create variables, so
  what runs is a second trace that creates none). Keras's legacy optimizers
  (`tf_keras.optimizers.legacy`, which TFM's factory builds, also under
  TFM's EMA and Keras's loss scaling) create their slots, `iterations` and
  hyperparameters in the first `apply_gradients`, inside that first trace:
  the first loop traced the whole step twice (what that cost before the
  first step: benchmarks/RESULTS.md#first-step-resnet-imagenet).
  Created here, with the same values, the loop is traced once.

  The step may give some of `variables` no gradient; Keras creates no slots
  for those. The returned function, called after the first loop, drops
  the slots of every variable the traced step did not update, so the
  optimizer holds what it would have held (a checkpoint saved before it
  has their zeros too). Other optimizers are left alone (it returns a
  no-op): the new Keras ones refuse to update a variable they were not
  built with.
  """
  inner = optimizer
  while isinstance(getattr(inner, "_optimizer", None), legacy.Optimizer):
    inner = inner._optimizer  # pylint: disable=protected-access
  if not isinstance(inner, legacy.Optimizer):
    return lambda: None
  with tf.name_scope(inner._name):  # pylint: disable=protected-access
    inner._create_all_weights(variables)  # As `apply_gradients` names them.  # pylint: disable=protected-access
  updated = set()
  apply_gradients = inner.apply_gradients

  def recording(grads_and_vars, *args, **kwargs):
    grads_and_vars = list(grads_and_vars)
    updated.update(_var_key(var) for grad, var in grads_and_vars
                   if grad is not None)
    return apply_gradients(grads_and_vars, *args, **kwargs)

  def drop_slots_not_updated():
    del inner.apply_gradients
    if not updated:  # The step was not traced: nothing to judge by.
      return
    for var in variables:
      if _var_key(var) not in updated:
        slots = inner._slots.pop(_var_key(var), {})  # pylint: disable=protected-access
        dropped = {id(slot) for slot in slots.values()}
        inner._weights = [weight for weight in inner._weights  # pylint: disable=protected-access
                          if id(weight) not in dropped]

  inner.apply_gradients = recording
  return drop_slots_not_updated


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
