"""digits_convnet: a small convnet on scikit-learn's bundled 8x8 digits.

The embedded default experiment: real data that needs no download. The 1,797
images are written once to TFRecords in TFM's image-classification Example
format (`image/encoded` PNG, `image/class/label`), cached under
`$TFM_EXT_DATA_DIR` (default `~/.cache/tfm_ext`), and read back through TFM's
`InputReader`. The held-out split is fixed: 360 images, stratified, seed 0.

    tfm-ext-train --experiment=digits_convnet \
        --mode=train_and_eval --model_dir=/tmp/digits

Smoke run (a few seconds): add
`--params_override=trainer.train_steps=20,trainer.validation_interval=10`.
An empty `input_path` means the bundled digits; point it at your own
TFRecords of the same format to train on other 8x8 grey images.
"""

import dataclasses
import os
import tempfile
from typing import List, Optional, Tuple

import tensorflow as tf
import tf_keras

from official.core import base_task
from official.core import config_definitions as cfg
from official.core import exp_factory
from official.core import input_reader
from official.core import task_factory
from official.core import tf_example_builder
from official.modeling import hyperparams
from official.modeling import optimization

import tfm_ext

IMAGE_SIZE = 8
NUM_CLASSES = 10
NUM_VALIDATION = 360
SPLIT_SEED = 0


# -- Data -------------------------------------------------------------------


def data_dir() -> str:
  """Where the bundled digits' TFRecords are cached."""
  root = os.environ.get("TFM_EXT_DATA_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "tfm_ext")
  return os.path.join(root, "digits")


def bundled_tfrecords(split: str) -> str:
  """Returns the TFRecord path of `split` ("train" or "validation").

  Writes both splits on first use, each to a temporary file renamed into
  place, so concurrent or interrupted runs never see a partial file.
  """
  path = os.path.join(data_dir(), f"{split}-00000-of-00001.tfrecord")
  if not os.path.exists(path):
    # Eagerly, wherever it is called from: a parameter server's coordinator
    # traces the input function as a graph.
    with tf.init_scope():
      _write_bundled_tfrecords(data_dir())
  return path


def _write_bundled_tfrecords(directory: str) -> None:
  from sklearn import datasets, model_selection  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  images = (digits.images * 16).clip(0, 255).astype("uint8")[..., None]
  train_x, val_x, train_y, val_y = model_selection.train_test_split(
      images, digits.target, test_size=NUM_VALIDATION,
      stratify=digits.target, random_state=SPLIT_SEED)
  os.makedirs(directory, exist_ok=True)
  for split, xs, ys in (("train", train_x, train_y),
                        ("validation", val_x, val_y)):
    final = os.path.join(directory, f"{split}-00000-of-00001.tfrecord")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{split}-")
    os.close(fd)
    with tf.io.TFRecordWriter(tmp) as writer:
      for image, label in zip(xs, ys):
        writer.write(_example(image, int(label)))
    os.replace(tmp, final)


def _example(image, label: int) -> bytes:
  """A tf.Example with the keys of TFM's image classification decoder."""
  return (tf_example_builder.TfExampleBuilder()
          .add_bytes_feature("image/encoded", tf.io.encode_png(image).numpy())
          .add_bytes_feature("image/format", b"png")
          .add_ints_feature("image/height", [image.shape[0]])
          .add_ints_feature("image/width", [image.shape[1]])
          .add_ints_feature("image/class/label", [label])
          .serialized_example)


def _decode(serialized: tf.Tensor):
  features = tf.io.parse_single_example(serialized, {
      "image/encoded": tf.io.FixedLenFeature([], tf.string),
      "image/class/label": tf.io.FixedLenFeature([], tf.int64),
  })
  image = tf.io.decode_png(features["image/encoded"], channels=1)
  image.set_shape([IMAGE_SIZE, IMAGE_SIZE, 1])
  return {"image": image, "label": features["image/class/label"]}


def _parse(decoded) -> Tuple[tf.Tensor, tf.Tensor]:
  return (tf.cast(decoded["image"], tf.float32) / 255.0,
          tf.cast(decoded["label"], tf.int32))


# -- Model ------------------------------------------------------------------


@dataclasses.dataclass
class ConvnetModel(hyperparams.Config):
  """A two-conv, one-dense classifier for small grey images."""
  name: str = "digits_convnet"
  filters: List[int] = dataclasses.field(default_factory=lambda: [32, 64])
  dense_units: int = 128
  dropout_rate: float = 0.25
  num_classes: int = NUM_CLASSES


@tfm_ext.register_model("digits_convnet")
def build_convnet(config: ConvnetModel) -> tf_keras.Model:
  layers = [tf_keras.layers.InputLayer(input_shape=(IMAGE_SIZE, IMAGE_SIZE, 1))]
  for filters in config.filters:
    layers.append(tf_keras.layers.Conv2D(filters, 3, padding="same",
                                         activation="relu"))
  layers += [
      tf_keras.layers.MaxPooling2D(),
      tf_keras.layers.Flatten(),
      tf_keras.layers.Dense(config.dense_units, activation="relu"),
      tf_keras.layers.Dropout(config.dropout_rate),
      tf_keras.layers.Dense(config.num_classes),
  ]
  return tf_keras.Sequential(layers, name=config.name)


# -- Task -------------------------------------------------------------------


@dataclasses.dataclass
class DigitsTaskConfig(cfg.TaskConfig):
  model: ConvnetModel = dataclasses.field(default_factory=ConvnetModel)
  train_data: cfg.DataConfig = dataclasses.field(
      default_factory=lambda: cfg.DataConfig(
          is_training=True, global_batch_size=64, shuffle_buffer_size=2000,
          seed=SPLIT_SEED))
  validation_data: cfg.DataConfig = dataclasses.field(
      default_factory=lambda: cfg.DataConfig(
          is_training=False, global_batch_size=120, drop_remainder=False))


@task_factory.register_task_cls(DigitsTaskConfig)
class DigitsTask(base_task.Task):
  """Classifies images with any registered model; loss from logits."""

  def build_model(self) -> tf_keras.Model:
    return tfm_ext.build_model(self.task_config.model.name,
                               self.task_config.model)

  def build_inputs(self, params: cfg.DataConfig,
                   input_context: Optional[tf.distribute.InputContext] = None):
    if not params.input_path:
      split = "train" if params.is_training else "validation"
      params = params.replace(input_path=bundled_tfrecords(split))
    reader = input_reader.InputReader(
        params, dataset_fn=tf.data.TFRecordDataset, decoder_fn=_decode,
        parser_fn=_parse)
    return reader.read(input_context=input_context)

  def build_losses(self, labels, model_outputs, aux_losses=None) -> tf.Tensor:
    loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True))
    if aux_losses:
      loss += tf.add_n(aux_losses)
    return loss

  def build_metrics(self, training: bool = True):
    return [tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


# -- Experiment -------------------------------------------------------------


@exp_factory.register_config_factory("digits_convnet")
def get_config() -> cfg.ExperimentConfig:
  """ExperimentConfig of digits_convnet, trained by `CustomTrainer`."""
  train_steps = 500
  return cfg.ExperimentConfig(
      task=DigitsTaskConfig(),
      trainer=tfm_ext.TrainerConfig(
          name="custom",
          train_steps=train_steps,
          steps_per_loop=50,
          summary_interval=50,
          checkpoint_interval=100,
          validation_interval=100,
          validation_steps=-1,
          max_to_keep=3,
          best_checkpoint_export_subdir="best_ckpt",
          best_checkpoint_eval_metric="accuracy",
          best_checkpoint_metric_comp="higher",
          best_checkpoint_top_k=3,
          continuous_eval_timeout=60,
          optimizer_config=optimization.OptimizationConfig({
              "optimizer": {"type": "adam"},
              "learning_rate": {
                  "type": "cosine",
                  "cosine": {"initial_learning_rate": 0.003,
                             "decay_steps": train_steps},
              },
              "warmup": {"type": "linear",
                         "linear": {"warmup_steps": 25}},
          })),
      restrictions=[
          "task.train_data.is_training != None",
          "task.validation_data.is_training != None",
      ])
