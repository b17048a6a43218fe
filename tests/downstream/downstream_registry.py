"""A downstream project's registrations, as a repository built on tfm_ext has.

Registers a trainer that records its hook calls, one that keeps a counter
of its own in the checkpoint, and an experiment whose model trains with two
optimizers (the RankingTrainer case). The suite's
test doubles (failing, NaN, row-counting...) are in tests/doubles.py.
"""

import dataclasses

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


@tfm_ext.register_trainer("counting")
class CountingTrainer(tfm_ext.CustomTrainer):
  """Counts the examples it trained on, in a variable its checkpoints keep.

  Public API only: its own state joins the checkpoint (`add_to_checkpoint`)
  and its step wraps the whole replica step (`replica_step`).
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.examples = tf.Variable(0, dtype=tf.int64, trainable=False,
                                aggregation=tf.VariableAggregation.SUM)
    self.add_to_checkpoint(examples=self.examples)

  def replica_step(self, inputs):
    images, _ = inputs
    self.examples.assign_add(tf.shape(images, out_type=tf.int64)[0])
    return super().replica_step(inputs)

  def train_loop_end(self):
    logs = super().train_loop_end()
    logs["downstream/examples"] = self.examples.read_value()
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


@exp_factory.register_config_factory("digits_two_optimizers")
def two_optimizers_config() -> cfg.ExperimentConfig:
  config = digits_convnet.get_config()
  config.task = TwoOptimizerTaskConfig()
  return config
