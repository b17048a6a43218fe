"""EMA (`trainer.optimizer_config.ema`) under every strategy, none included;
slots made before the first trace, as Keras would have made them."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from official.modeling.optimization import ema_optimizer

from conftest import numeric_tensors
import downstream_registry
import tfm_ext
from tfm_ext.training import optimizers

EMA = ("trainer.train_steps=20,trainer.steps_per_loop=10,"
       "trainer.checkpoint_interval=10,trainer.validation_interval=10,"
       "trainer.validation_steps=1,"
       "trainer.optimizer_config.ema.average_decay=0.9")


@pytest.mark.parametrize("strategy", ["off", "mirrored", "one_device"])
def test_ema_evaluates_and_saves_the_average_with_any_strategy(
    run_in_process, tmp_path, strategy):
  # `off` builds no strategy (TF's default); `mirrored` on one CPU, TFM's
  # one-replica MirroredStrategy.
  summary, _ = run_in_process(
      "digits_convnet", "train_and_eval", tmp_path,
      EMA + f",runtime.distribution_strategy={strategy}", trainer="recording")
  assert summary.status == "completed" and summary.global_step == 20
  assert 0.0 < summary.eval_metrics["accuracy"] <= 1.0
  averaged = tf.train.latest_checkpoint(str(tmp_path / "ema_checkpoints"))
  trained = tf.train.latest_checkpoint(str(tmp_path))
  assert averaged.endswith("-20") and trained.endswith("ckpt-20")
  # The EMA checkpoint holds the averages in the model's place, and after
  # the last evaluation the model holds the trained weights again (TFM's
  # swap adds and subtracts, so to float32 rounding).
  kernel = "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"
  assert not np.allclose(numeric_tensors(averaged)[kernel],
                         numeric_tensors(trained)[kernel])
  model = downstream_registry.RecordingTrainer.instances[-1].model
  np.testing.assert_allclose(model.layers[0].kernel.numpy(),
                             numeric_tensors(trained)[kernel], atol=1e-6)
  assert os.path.exists(str(tmp_path / "best_ckpt" / "info.json"))


class _WithIdleVariable(tf_keras.Model):
  """A dense layer, and a trainable variable no loss reaches."""

  def __init__(self):
    super().__init__()
    self.dense = tf_keras.layers.Dense(3, kernel_initializer="ones")
    self.dense.build((None, 4))
    self.idle = tf.Variable(tf.ones([5]), name="idle")

  def call(self, x):
    return self.dense(x)


def _two_steps(wrapper, made_before):
  """Trains two steps; returns the loop's traces and the optimizer's values."""
  model = _WithIdleVariable()
  optimizer = tf_keras.optimizers.legacy.Adam(0.1)
  if wrapper == "loss_scale":
    optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
  elif wrapper == "ema":
    optimizer = ema_optimizer.ExponentialMovingAverage(optimizer)
    optimizer.shadow_copy(model)
  after_first = lambda: None
  if made_before:
    after_first = optimizers.create_weights(optimizer,
                                            model.trainable_variables)

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(x) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

  step(tf.ones([2, 4]))
  after_first()
  step(tf.ones([2, 4]))
  # The loss-scaled Adam creates its slots in a cond of the first trace,
  # whose name scope (`cond_1/`) ends up in their names.
  return step.experimental_get_tracing_count(), {
      re.sub(r"^cond_\d+/", "", v.name): v.numpy()
      for v in optimizer.variables()}


@pytest.mark.parametrize("wrapper", ["none", "loss_scale", "ema"])
def test_slots_made_before_the_first_trace_are_kerass_own_traced_once(
    wrapper):
  # Keras makes its slots in the first trace, which tf.function then
  # traces again; made before, one trace, and after the first step the
  # optimizer holds the same variables (no Adam slots for the idle one) with
  # the same values, bit for bit.
  keras_traces, keras_own = _two_steps(wrapper, made_before=False)
  traces, made = _two_steps(wrapper, made_before=True)
  assert (keras_traces, traces) == (2, 1)
  assert sorted(made) == sorted(keras_own)
  assert not [name for name in made if name.startswith("Adam/idle")]
  for name, value in keras_own.items():
    np.testing.assert_array_equal(made[name], value, err_msg=name)


def test_a_run_traces_its_first_training_loop_once(run_in_process, tmp_path):
  run_in_process("digits_convnet", "train", tmp_path,
                 "trainer.train_steps=4,trainer.steps_per_loop=2",
                 trainer="recording")
  trainer = downstream_registry.RecordingTrainer.instances[-1]
  loop = trainer._train_loop_fn  # pylint: disable=protected-access
  assert loop.experimental_get_tracing_count() == 1
  # The recording of which variables have gradients ended with the first
  # loop.
  assert "apply_gradients" not in vars(trainer.optimizer)


class _BuiltAtFirstCall(tf_keras.Model):
  """A subclassed model: no variables until its first call."""

  def __init__(self):
    super().__init__()
    self.flatten = tf_keras.layers.Flatten()
    self.dense = tf_keras.layers.Dense(10)

  def call(self, x, training=False):
    return self.dense(self.flatten(x))


tfm_ext.register_model("test_subclassed_at_first_call")(
    lambda config: _BuiltAtFirstCall())
tfm_ext.register_model("test_sequential_at_first_call")(
    lambda config: tf_keras.Sequential([tf_keras.layers.Flatten(),
                                        tf_keras.layers.Dense(10)]))


@pytest.mark.parametrize("model", ["test_subclassed_at_first_call",
                                   "test_sequential_at_first_call"])
def test_a_model_built_at_its_first_call_gets_its_slots_in_the_trace(
    run_in_process, tmp_path, model):
  # No variables before the first call: nothing to make slots for, or
  # Keras refuses to list them (a Sequential without an input shape). The
  # first trace makes them, as Keras does, and the run trains.
  summary, _ = run_in_process(
      "digits_convnet", "train", tmp_path,
      f"task.model.name={model},trainer.train_steps=4,"
      "trainer.steps_per_loop=2", trainer="recording")
  assert summary.status == "completed" and summary.global_step == 4
  trainer = downstream_registry.RecordingTrainer.instances[-1]
  slots = [v.name for v in trainer.optimizer.variables()]
  assert any("/m:" in name for name in slots), slots
