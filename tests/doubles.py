"""Test doubles: trainers and tasks that fail, count or announce on purpose.

Registered on import, like a downstream repository's registrations;
`tests/doubles_train.py` (and its two-CPU twin) is the launcher with them.
"""

import dataclasses
import json
import os
import urllib.request

import tensorflow as tf
import tf_keras

from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import task_factory

import registry_imports  # pylint: disable=unused-import
import tfm_ext
from experiments import digits_convnet


def digits_with(task_config) -> cfg.ExperimentConfig:
  """digits_convnet's experiment with another task config."""
  config = digits_convnet.get_config()
  config.task = task_config
  return config


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
  # How many times training step `nan_at_step` is NaN; 0: every time. A
  # run that restores an earlier checkpoint trains that step again.
  nan_times: int = 0


@task_factory.register_task_cls(NanTaskConfig)
class NanTask(digits_convnet.DigitsTask):
  """Its loss is NaN at step `nan_at_step`; the NaN gradients spoil the weights.

  With `nan_times` > 0 the NaN is transient: once that many NaN steps were
  trained (counted in this process, not in checkpoints), the step is finite.
  """

  def __init__(self, params, logging_dir=None, name=None):
    super().__init__(params, logging_dir=logging_dir, name=name)
    self._nans = tf.Variable(0, trainable=False, dtype=tf.int64)

  def train_step(self, inputs, model, optimizer, metrics=None):
    images, labels = inputs
    config = self.task_config
    with tf.GradientTape() as tape:
      outputs = model(images, training=True)
      loss = self.build_losses(labels, outputs)
      at_step = tf.logical_and(
          tf.equal(optimizer.iterations + 1, config.nan_at_step),
          tf.logical_or(config.nan_times <= 0,
                        self._nans < config.nan_times))
      # Not tf.where(at_step, loss * nan, loss): its gradient is NaN always.
      loss *= tf.where(at_step, float("nan"), 1.0)
    self._nans.assign_add(tf.cast(at_step, tf.int64))
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


@tfm_ext.register_trainer("buggy")
class BuggyTrainer(tfm_ext.CustomTrainer):
  """A bug in a user's trainer: a Python error after the first loop."""

  def train_loop_end(self):
    logs = super().train_loop_end()
    return logs["no such metric"]  # KeyError: the user's code is wrong.


@tfm_ext.register_trainer("disk_filling")
class DiskFillingTrainer(tfm_ext.CustomTrainer):
  """Fills the file system of `$FILL_DISK_PATH` once at `$FILL_DISK_AT_STEP`.

  What a full disk does to a run beside other jobs: the next write fails.
  """

  filled = False

  def train_loop_end(self):
    logs = super().train_loop_end()
    if (not DiskFillingTrainer.filled and self.global_step.numpy()
        >= int(os.environ.get("FILL_DISK_AT_STEP", "20"))):
      DiskFillingTrainer.filled = True
      with open(os.environ["FILL_DISK_PATH"], "wb") as f:
        try:
          while True:
            f.write(b"\0" * (1 << 16))
            f.flush()
        except OSError:
          pass  # Full.
    return logs


def _posting_factory(variable: str):
  """A user's notification action, as in issue 32: urllib, no guard of its own.

  It POSTs each output to the URL in `$<variable>` and raises what urllib
  raises (a server that is down: `URLError ... Connection refused`); without
  the variable it stays out of the run.
  """

  def factory(context: tfm_ext.ActionContext):
    url = os.environ.get(variable)
    if not url or not context.chief:
      return None
    step = context.trainer.global_step

    def post(output):
      body = json.dumps({"step": int(step.numpy()),
                         "keys": sorted(output or {})})
      urllib.request.urlopen(urllib.request.Request(
          url, data=body.encode(), method="POST"), timeout=5).close()

    return post

  return factory


# The same action registered both ways: optional (its failures are reported
# and training goes on) and required (its failure saves and exits 3).
tfm_ext.register_action("user_post", phase="train")(
    _posting_factory("USER_POST_URL"))
tfm_ext.register_action("required_post", phase="eval", required=True)(
    _posting_factory("REQUIRED_POST_URL"))


def _chief_stops(context: tfm_ext.ActionContext):
  """Asks the run to stop at step `$CHIEF_STOPS_AT`, on the chief only."""
  at = os.environ.get("CHIEF_STOPS_AT")
  if not at or not context.chief:
    return None
  step = context.trainer.global_step

  def maybe_stop(output):
    del output
    if int(step.numpy()) >= int(at):
      context.stop(f"the chief's action at step {int(step.numpy())}")

  return maybe_stop


tfm_ext.register_action("chief_stops", phase="train")(_chief_stops)


@tfm_ext.register_model("preset_convnet")
def _preset_convnet(config):
  """A builder that fills its config in, as ViT's `model_name` does: the
  preset's sizes are written into the config it was given."""
  config.override({"filters": [8], "dense_units": 16}, is_strict=True)
  return tfm_ext.build_model("digits_convnet", config)


@tfm_ext.register_model("lazy_sequential")
def _lazy_sequential(config):
  """A Sequential without an `InputLayer`: it declares no inputs."""
  return tf_keras.Sequential([
      tf_keras.layers.Flatten(),
      tf_keras.layers.Dense(config.dense_units, activation="relu"),
      tf_keras.layers.Dense(config.num_classes)], name="lazy")


class _Subclassed(tf_keras.Model):
  """A subclassed model: no inputs either, and a call of its own."""

  def __init__(self, config):
    super().__init__(name="subclassed")
    self.flat = tf_keras.layers.Flatten()
    self.hidden = tf_keras.layers.Dense(config.dense_units, activation="relu")
    self.out = tf_keras.layers.Dense(config.num_classes)

  def call(self, inputs, training=False):
    return self.out(self.hidden(self.flat(inputs)))


tfm_ext.register_model("subclassed")(_Subclassed)
