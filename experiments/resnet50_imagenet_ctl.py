"""resnet50_imagenet_ctl: ResNet50 v1.5 on ImageNet, TFM's legacy CTL recipe.

The custom-training-loop runner of TFM's `official/legacy/image_classification
/resnet`, as an experiment: the reference's model, input pipeline (its
`imagenet_preprocessing`), loss, L2, SGD schedule and mixed precision,
trained by the `resnet_ctl` trainer (a `CustomTrainer`, see
`experiments/imagenet/ctl_trainer.py`).

    python launchers/train.py --experiment=resnet50_imagenet_ctl \
        --mode=train_and_eval --model_dir=/tmp/resnet50 \
        --params_override="task.train_data.input_path=/data/imagenet/train-*,\
task.validation_data.input_path=/data/imagenet/validation-*,runtime.num_gpus=8"

90 epochs at global batch 256 (`trainer.train_steps` and the intervals are in
steps of that batch: scale them with `global_batch_size`; the learning rate,
stated in epochs under `task.schedule`, follows on its own). Add
`runtime.mixed_precision_dtype=float16` (loss scale 128) or `bfloat16`, and
`task.single_l2_loss_op=true` for one L2 op instead of per-layer losses.

Smoke run (synthetic images, 3 steps of batch 2, under a minute on a CPU):
`--params_override=` the `SMOKE` string below. The reference's own command
line runs through `launchers/resnet_ctl_imagenet_main.py`.
"""

import dataclasses
from typing import Optional

import tensorflow as tf
import tf_keras

from official.core import base_task
from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import task_factory

import tfm_ext

from experiments.imagenet import ctl_trainer
from experiments.imagenet import input_pipeline
from experiments.imagenet import resnet50
from experiments.imagenet import schedule as schedule_lib

L2_WEIGHT_DECAY = 1e-4  # The reference model's, per layer, and its single op.
GLOBAL_BATCH_SIZE = 256
TRAIN_EPOCHS = 90
FP16_LOSS_SCALE = 128.0

SMOKE = ("task.train_data.use_synthetic_data=true,"
         "task.validation_data.use_synthetic_data=true,"
         "task.train_data.global_batch_size=2,"
         "task.validation_data.global_batch_size=2,"
         "task.validation_data.num_examples=4,"
         "trainer.train_steps=3,trainer.steps_per_loop=1,"
         "trainer.summary_interval=1,trainer.checkpoint_interval=3,"
         "trainer.validation_interval=3,trainer.log_steps=1")


@dataclasses.dataclass
class ResnetCtlTaskConfig(cfg.TaskConfig):
  """The task: data, model, schedule and which L2 path the loss takes.

  Attributes:
    single_l2_loss_op: Add L2 as one op, `1e-4 * 2 * sum(l2_loss(w))` over
      every weight outside batch norm, instead of the layers' L2 losses.
  """
  model: resnet50.ResNet50Config = dataclasses.field(
      default_factory=resnet50.ResNet50Config)
  train_data: input_pipeline.ImageNetDataConfig = dataclasses.field(
      default_factory=lambda: input_pipeline.ImageNetDataConfig(
          is_training=True, global_batch_size=GLOBAL_BATCH_SIZE,
          num_examples=input_pipeline.NUM_TRAIN_IMAGES, drop_remainder=True))
  validation_data: input_pipeline.ImageNetDataConfig = dataclasses.field(
      default_factory=lambda: input_pipeline.ImageNetDataConfig(
          is_training=False, global_batch_size=GLOBAL_BATCH_SIZE,
          num_examples=input_pipeline.NUM_VALIDATION_IMAGES,
          drop_remainder=False))
  schedule: schedule_lib.EpochSchedule = dataclasses.field(
      default_factory=schedule_lib.EpochSchedule)
  single_l2_loss_op: bool = False


@task_factory.register_task_cls(ResnetCtlTaskConfig)
class ResnetCtlTask(base_task.Task):
  """Classifies ImageNet with the reference runner's loss and optimizer.

  The loss a replica differentiates is the reference's: summed
  cross-entropy over the global batch plus L2 / replicas, so the gradients
  summed across replicas are those of the global mean loss plus L2. The
  `loss` it reports is that replica's mean cross-entropy plus L2, which reads
  the same for any number of replicas.
  """

  def build_model(self) -> tf_keras.Model:
    builder = tfm_ext.MODELS.get(self.task_config.model.name)
    return builder(self.task_config.model,
                   use_l2_regularizer=not self.task_config.single_l2_loss_op)

  def build_inputs(self, params: input_pipeline.ImageNetDataConfig,
                   input_context: Optional[tf.distribute.InputContext] = None):
    return input_pipeline.build_dataset(params, input_context)

  def create_optimizer(self, optimizer_config, runtime_config=None,
                       dp_config=None):
    """Momentum SGD from `task.schedule`, unless the trainer config sets one.

    `trainer.optimizer_config` with an optimizer type wins; without one (the
    default) the schedule in epochs is turned into steps for this batch size.
    Loss scaling for float16 comes from `runtime` (TFM's `create_optimizer`).
    """
    if optimizer_config.optimizer.type is None:
      data = self.task_config.train_data
      optimizer_config = schedule_lib.optimization_config(
          self.task_config.schedule, data.global_batch_size, data.num_examples)
    return super().create_optimizer(optimizer_config, runtime_config,
                                    dp_config)

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    """Returns the mean cross-entropy of softmax outputs, plus `aux_losses`."""
    loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
        labels, tf.cast(model_outputs, tf.float32)))
    if aux_losses:
      loss += tf.add_n(aux_losses)
    return loss

  def regularization_loss(self, model: tf_keras.Model) -> tf.Tensor:
    """Returns L2 of `model`'s weights, by the path the config chooses.

    Both give `1e-4 * sum(w ** 2)` over convolution and dense weights and
    biases: batch norm's scales and offsets are never decayed.
    """
    if not self.task_config.single_l2_loss_op:
      return tf.add_n([tf.cast(l, tf.float32) for l in model.losses])
    weights = [w for layer in model.layers
               if not isinstance(layer, tf_keras.layers.BatchNormalization)
               for w in layer.trainable_weights]
    return L2_WEIGHT_DECAY * 2 * tf.add_n([tf.nn.l2_loss(w) for w in weights])

  def train_step(self, inputs, model, optimizer, metrics=None):
    images, labels = inputs
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    global_batch = self.task_config.train_data.global_batch_size
    with tf.GradientTape() as tape:
      outputs = model(images, training=True)
      cross_entropy = tf_keras.losses.sparse_categorical_crossentropy(
          labels, tf.cast(outputs, tf.float32))
      l2 = self.regularization_loss(model)
      loss = tf.reduce_sum(cross_entropy) / global_batch + l2 / num_replicas
      if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
        loss = optimizer.get_scaled_loss(loss)
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
      grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, variables))
    self.process_metrics(metrics or [], labels, outputs)
    return {self.loss: tf.reduce_mean(cross_entropy) + l2}

  def validation_step(self, inputs, model, metrics=None):
    images, labels = inputs
    outputs = model(images, training=False)
    self.process_metrics(metrics or [], labels, outputs)
    return {self.loss: self.build_losses(labels, outputs)}

  def build_metrics(self, training: bool = True):
    return [tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            tf_keras.metrics.SparseTopKCategoricalAccuracy(
                k=5, name="top_5_accuracy")]


@dataclasses.dataclass
class ResnetCtlExperimentConfig(cfg.ExperimentConfig):
  """`ExperimentConfig` that rejects what would fail only mid-run."""

  def validate(self):
    """Raises `ValueError` for what the run would trip on later.

    That is: an empty input path, a malformed `profile_steps`, or
    checkpointing the input iterator of real data (its random crop,
    `sample_distorted_bounding_box`, is a stateful op that tf.data cannot
    save, and its 10,000-record shuffle buffer would add its JPEGs to every
    checkpoint: benchmarks/RESULTS.md#default-resnet-iterator-out).
    """
    super().validate()
    if (getattr(self.trainer, "checkpoint_input_iterator", False)
        and not self.task.train_data.use_synthetic_data):
      raise ValueError(
          "trainer.checkpoint_input_iterator=true cannot save ImageNet's "
          "training input (a stateful random crop and a 10,000-image shuffle "
          "buffer); set it to false.")
    for split in ("train_data", "validation_data"):
      data = getattr(self.task, split)
      if not data.use_synthetic_data and not data.input_path:
        raise ValueError(
            f"task.{split}.input_path is empty. Set it to the TFRecord file "
            f"pattern (e.g. /data/imagenet/"
            f"{'train' if data.is_training else 'validation'}-*), or set "
            f"task.{split}.use_synthetic_data=true.")
    ctl_trainer.parse_profile_steps(getattr(self.trainer, "profile_steps", ""))


@exp_factory.register_config_factory("resnet50_imagenet_ctl")
def get_config() -> cfg.ExperimentConfig:
  """ExperimentConfig of resnet50_imagenet_ctl: 90 epochs at batch 256."""
  steps_per_epoch = input_pipeline.NUM_TRAIN_IMAGES // GLOBAL_BATCH_SIZE
  return ResnetCtlExperimentConfig(
      task=ResnetCtlTaskConfig(),
      runtime=cfg.RuntimeConfig(loss_scale=FP16_LOSS_SCALE),
      trainer=ctl_trainer.ResnetCtlTrainerConfig(
          train_steps=TRAIN_EPOCHS * steps_per_epoch,
          steps_per_loop=steps_per_epoch,
          summary_interval=steps_per_epoch,
          checkpoint_interval=steps_per_epoch,
          validation_interval=steps_per_epoch,
          validation_steps=-1,
          max_to_keep=10,
          # See ResnetCtlExperimentConfig.validate.
          checkpoint_input_iterator=False,
          log_steps=100,
          best_checkpoint_export_subdir="best_ckpt",
          best_checkpoint_eval_metric="accuracy",
          best_checkpoint_metric_comp="higher"),
      restrictions=[
          "task.train_data.is_training != None",
          "task.validation_data.is_training != None",
      ])
