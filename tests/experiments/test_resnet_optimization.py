"""The ResNet recipe's optimizer: schedule, L2 paths, loss scaling, bf16."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from official.core import exp_factory
from official.core import task_factory
from official.legacy.image_classification.resnet import common
from official.modeling import performance

import registry_imports  # pylint: disable=unused-import
from experiments.imagenet import input_pipeline

EPOCH = input_pipeline.NUM_TRAIN_IMAGES


def experiment(**task_override):
  config = exp_factory.get_exp_config("resnet50_imagenet_ctl")
  config.override({"task": task_override}, is_strict=True)
  return config


def optimizer_for(config):
  task = task_factory.get_task(config.task)
  return task, task.create_optimizer(config.trainer.optimizer_config,
                                     config.runtime)


def learning_rate(optimizer, step):
  return float(optimizer.learning_rate(tf.constant(step, tf.int64)))


def test_learning_rate_is_pinned_at_its_boundaries_for_batch_1024():
  _, optimizer = optimizer_for(
      experiment(train_data={"global_batch_size": 1024}))
  steps_per_epoch = EPOCH // 1024  # 1251
  assert steps_per_epoch == 1251
  expected = {  # step: rate; 0.1 * 1024 / 256 = 0.4.
      0: 0.0,
      2 * steps_per_epoch: 0.4 * 2 / 5,  # Warmup is linear over 5 epochs.
      5 * steps_per_epoch - 1: 0.4 * (5 * steps_per_epoch - 1) / 6255,
      5 * steps_per_epoch: 0.4,
      30 * steps_per_epoch: 0.4,  # Multipliers apply after the boundary.
      30 * steps_per_epoch + 1: 0.04,
      60 * steps_per_epoch: 0.04,
      60 * steps_per_epoch + 1: 0.004,
      80 * steps_per_epoch: 0.004,
      80 * steps_per_epoch + 1: 0.0004,
      90 * steps_per_epoch: 0.0004,
  }
  actual = {step: learning_rate(optimizer, step) for step in expected}
  assert actual == pytest.approx(expected, rel=1e-6, abs=1e-12)
  assert isinstance(optimizer, tf_keras.optimizers.legacy.SGD)
  assert optimizer.get_config()["momentum"] == pytest.approx(0.9)


@pytest.mark.parametrize("batch_size", [32, 256, 4096])
def test_learning_rate_matches_the_reference_schedule_for_any_batch(
    batch_size):
  _, optimizer = optimizer_for(
      experiment(train_data={"global_batch_size": batch_size}))
  reference = common.PiecewiseConstantDecayWithWarmup(
      batch_size=batch_size, epoch_size=EPOCH,
      warmup_epochs=common.LR_SCHEDULE[0][1],
      boundaries=[p[1] for p in common.LR_SCHEDULE[1:]],
      multipliers=[p[0] for p in common.LR_SCHEDULE])
  steps_per_epoch = EPOCH // batch_size
  steps = sorted({e * steps_per_epoch + d for e in (0, 1, 5, 30, 60, 80)
                  for d in (-1, 0, 1) if e * steps_per_epoch + d >= 0})
  ours = [learning_rate(optimizer, s) for s in steps]
  # In eager mode the reference's v1 `piecewise_constant` returns a
  # function, not a rate: call it traced, as its runner does.
  reference_fn = tf.function(reference)
  theirs = [float(reference_fn(tf.constant(s, tf.int64))) for s in steps]
  np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.slow
def test_both_l2_paths_give_the_same_loss_and_the_same_update():
  batch = (tf.random.stateless_uniform([2, 224, 224, 3], [1, 2], 0, 255)
           - input_pipeline.CHANNEL_MEANS, tf.constant([3, 999]))
  results = []
  weights = None
  for single_l2_loss_op in (False, True):
    task = task_factory.get_task(experiment(
        single_l2_loss_op=single_l2_loss_op,
        train_data={"global_batch_size": 2}).task)
    model = task.build_model()
    # Layer losses only without the single op: one L2 path at a time.
    assert bool(model.losses) != single_l2_loss_op
    if weights is None:
      weights = model.get_weights()
    model.set_weights(weights)
    optimizer = tf_keras.optimizers.legacy.SGD(learning_rate=0.5)
    l2 = float(task.regularization_loss(model))
    logs = task.train_step(batch, model, optimizer)
    results.append((l2, float(logs["loss"]), model.get_weights()))

  (l2_layers, loss_layers, after_layers), (l2_op, loss_op, after_op) = results
  assert l2_layers > 1.0  # He-normal weights: L2 is a sizeable term.
  assert l2_op == pytest.approx(l2_layers, rel=1e-5)
  assert loss_op == pytest.approx(loss_layers, rel=1e-5)
  for a, b in zip(after_layers, after_op):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert not np.allclose(after_op[0], weights[0])  # The step moved weights.


def test_float16_gets_a_fixed_loss_scale_of_128_and_bfloat16_none():
  def optimizer(**runtime):
    config = experiment()
    config.override({"runtime": runtime})
    return optimizer_for(config)[1]

  fp16 = optimizer(mixed_precision_dtype="float16")
  assert isinstance(fp16, tf_keras.mixed_precision.LossScaleOptimizer)
  assert not fp16.dynamic and float(fp16.loss_scale) == 128.0
  dynamic = optimizer(mixed_precision_dtype="float16", loss_scale="dynamic")
  assert dynamic.dynamic
  bf16 = optimizer(mixed_precision_dtype="bfloat16")
  assert not isinstance(bf16, tf_keras.mixed_precision.LossScaleOptimizer)


def test_loss_scaled_step_updates_weights_like_an_unscaled_one():
  """The fp16 path scales the loss by 128 and the gradients back down."""
  task = task_factory.get_task(experiment(
      train_data={"global_batch_size": 4}).task)
  tf_keras.utils.set_random_seed(0)
  inputs = (tf.random.stateless_normal([4, 5], [3, 4]),
            tf.constant([0, 1, 2, 1]))
  updates = []
  for scaled in (False, True):
    model = tf_keras.Sequential([
        tf_keras.layers.Dense(3, kernel_initializer="ones",
                              kernel_regularizer=tf_keras.regularizers.L2(1e-4)),
        tf_keras.layers.Activation("softmax")])
    model.build([None, 5])
    optimizer = tf_keras.optimizers.legacy.SGD(learning_rate=0.1)
    if scaled:
      optimizer = tf_keras.mixed_precision.LossScaleOptimizer(
          optimizer, dynamic=False, initial_scale=128)
    task.train_step(inputs, model, optimizer)
    updates.append(model.get_weights()[0] - 1.0)
  assert np.abs(updates[0]).max() > 1e-3
  np.testing.assert_allclose(updates[1], updates[0], rtol=1e-5)


@pytest.mark.slow
def test_bfloat16_resnet_step_computes_in_bfloat16_with_float32_outputs():
  config = experiment(train_data={"global_batch_size": 1})
  config.override({"runtime": {"mixed_precision_dtype": "bfloat16"}})
  performance.set_mixed_precision_policy(tf.bfloat16)
  try:
    task, optimizer = optimizer_for(config)
    model = task.build_model()
    # One image: the dtypes are the point, and bfloat16 convolutions are
    # slow on a CPU without native bfloat16.
    images = tf.random.stateless_uniform([1, 224, 224, 3], [5, 6], -120, 130)
    logs = tf.function(task.train_step)((images, tf.constant([1])), model,
                                        optimizer)
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  assert model.get_layer("conv1").compute_dtype == "bfloat16"
  assert model.get_layer("conv1").kernel.dtype == tf.float32
  assert model.output.dtype == tf.float32
  assert np.isfinite(float(logs["loss"]))
  assert int(optimizer.iterations) == 1
