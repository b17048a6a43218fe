"""A downstream project's registrations, as a repository built on tfm_ext has.

Registers a trainer that records its hook calls, and an experiment whose
model trains with two optimizers (the RankingTrainer case).
"""

import dataclasses
import os

import tensorflow as tf
import tf_keras

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import task_factory

import tfm_ext
from experiments import digits_convnet


@tfm_ext.register_trainer("recording")
class RecordingTrainer(tfm_ext.CustomTrainer):
  """Records every hook call in `calls`; reports the count of loop ends."""

  instances = []

  def __init__(self, *args, **kwargs):
    self.calls = []
    RecordingTrainer.instances.append(self)
    super().__init__(*args, **kwargs)

  def _record(name):  # pylint: disable=no-self-argument
    def hook(self, *args, **kwargs):
      self.calls.append(name)
      return getattr(tfm_ext.CustomTrainer, name)(self, *args, **kwargs)
    hook.__name__ = name
    return hook

  train_loop_begin = _record("train_loop_begin")
  next_train_inputs = _record("next_train_inputs")
  train_step = _record("train_step")
  eval_begin = _record("eval_begin")
  next_eval_inputs = _record("next_eval_inputs")
  eval_step = _record("eval_step")
  eval_reduce = _record("eval_reduce")
  eval_end = _record("eval_end")

  def train_loop_end(self):
    self.calls.append("train_loop_end")
    logs = super().train_loop_end()
    logs["downstream/loop_ends"] = float(self.calls.count("train_loop_end"))
    return logs


@dataclasses.dataclass
class TwoOptimizerTaskConfig(digits_convnet.DigitsTaskConfig):
  body_learning_rate: float = 0.05
  head_learning_rate: float = 0.002


class TwoOptimizers(tf.Module):
  """A composite optimizer: `optimizers` names one optimizer per variable set."""

  def __init__(self, optimizers):
    super().__init__()
    self.optimizers = optimizers


@task_factory.register_task_cls(TwoOptimizerTaskConfig)
class TwoOptimizerTask(digits_convnet.DigitsTask):
  """Trains the head (last Dense layer) and the body with different optimizers."""

  def create_optimizer(self, optimizer_config, runtime_config=None):
    del optimizer_config, runtime_config
    body_schedule = tf_keras.optimizers.schedules.PolynomialDecay(
        self.task_config.body_learning_rate, decay_steps=100,
        end_learning_rate=0.0)
    return TwoOptimizers({
        "body": tf_keras.optimizers.SGD(body_schedule),
        "head": tf_keras.optimizers.Adam(self.task_config.head_learning_rate),
    })

  def train_step(self, inputs, model, optimizer, metrics=None):
    images, labels = inputs
    with tf.GradientTape() as tape:
      outputs = model(images, training=True)
      loss = self.build_losses(labels, outputs)
    head = model.layers[-1].trainable_variables
    body = [v for v in model.trainable_variables
            if all(v is not h for h in head)]
    grads = tape.gradient(loss, body + head)
    optimizer.optimizers["body"].apply_gradients(zip(grads[:len(body)], body))
    optimizer.optimizers["head"].apply_gradients(zip(grads[len(body):], head))
    for metric in metrics or []:
      metric.update_state(labels, outputs)
    return {self.loss: loss}


def digits_with(task_config) -> cfg.ExperimentConfig:
  """digits_convnet's experiment with another task config."""
  config = digits_convnet.get_config()
  config.task = task_config
  return config


exp_factory.register_config_factory("digits_two_optimizers")(
    lambda: digits_with(TwoOptimizerTaskConfig()))


@tfm_ext.register_trainer("flaky")
class FlakyTrainer(tfm_ext.CustomTrainer):
  """Raises a transient `UnavailableError` once per process, at a step.

  The step is `$FLAKY_AT_STEP` (default 20). An in-process restart builds a
  new trainer, which does not raise again.
  """

  raised = False

  def train_loop_end(self):
    logs = super().train_loop_end()
    at_step = int(os.environ.get("FLAKY_AT_STEP", "20"))
    if not FlakyTrainer.raised and self.global_step.numpy() >= at_step:
      FlakyTrainer.raised = True
      raise tf.errors.UnavailableError(None, None,
                                       "injected: a peer became unavailable")
    return logs


@dataclasses.dataclass
class NanTaskConfig(digits_convnet.DigitsTaskConfig):
  nan_at_step: int = 25


@task_factory.register_task_cls(NanTaskConfig)
class NanTask(digits_convnet.DigitsTask):
  """Its loss is NaN at step `nan_at_step`; the NaN gradients spoil the weights."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    images, labels = inputs
    with tf.GradientTape() as tape:
      outputs = model(images, training=True)
      loss = self.build_losses(labels, outputs)
      at_step = tf.equal(optimizer.iterations + 1, self.task_config.nan_at_step)
      # Not tf.where(at_step, loss * nan, loss): its gradient is NaN always.
      loss *= tf.where(at_step, float("nan"), 1.0)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {self.loss: loss}


exp_factory.register_config_factory("digits_nan")(
    lambda: digits_with(NanTaskConfig()))


@tfm_ext.register_trainer("announcing")
class AnnouncingTrainer(tfm_ext.CustomTrainer):
  """Prints a line when an evaluation begins, so a test can kill it there."""

  def eval_begin(self):
    print(f"eval begins @ step {int(self.global_step.numpy())}", flush=True)
    return super().eval_begin()


class _CountsRows:
  """A Keras metric that takes the number of rows of each batch as its value."""

  def update_state(self, y_true, y_pred=None, sample_weight=None):
    del y_pred, sample_weight
    return super().update_state(tf.cast(tf.shape(y_true)[0], tf.float32))


class RowsPerReplica(_CountsRows, tf_keras.metrics.Mean):
  """The mean number of rows a replica's training step sees."""


class ExamplesSeen(_CountsRows, tf_keras.metrics.Sum):
  """The rows all replicas trained on since the last reset (a loop)."""


@dataclasses.dataclass
class RowCountingTaskConfig(digits_convnet.DigitsTaskConfig):
  pass


@task_factory.register_task_cls(RowCountingTaskConfig)
class RowCountingTask(digits_convnet.DigitsTask):
  """digits_convnet whose training metrics count the rows each replica sees.

  `rows_per_replica` (a mean over replicas and steps) and `examples_seen`
  (the loop's rows summed over replicas) are read in replica context, inside
  `task.train_step`: what the model really trained on.
  """

  def build_metrics(self, training: bool = True):
    metrics = super().build_metrics(training)
    if training:
      metrics += [RowsPerReplica(name="rows_per_replica"),
                  ExamplesSeen(name="examples_seen")]
    return metrics


exp_factory.register_config_factory("digits_rows")(
    lambda: digits_with(RowCountingTaskConfig()))


@tfm_ext.register_trainer("eval_marking")
class EvalMarkingTrainer(tfm_ext.CustomTrainer):
  """Adds `downstream/eval_marked` to every evaluation's logs."""

  def eval_end(self, aggregated_logs=None):
    logs = super().eval_end(aggregated_logs)
    logs["downstream/eval_marked"] = 1.0
    return logs
