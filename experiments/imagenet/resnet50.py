"""ResNet50 v1.5, the reference's Keras model, registered as `resnet50_v1_5`.

The graph is TFM's legacy `resnet_model.resnet50`, imported as is: batch
norm after each convolution and before its ReLU; stages of 3, 4, 6 and 3
bottleneck blocks ending in 256, 512, 1024 and 2048 channels, the stride on
the 3x3 convolution (v1.5); convolutions without bias, `he_normal`, L2 1e-4;
batch norm momentum 0.9, epsilon 1e-5; global average pooling, `fc1000`
(normal, stddev 0.01) and a float32 softmax. Layer names are the
reference's, so checkpoints move between the two.

Two things are added around it: the data format is chosen per model instead
of process-wide, and `fc1000`'s initializer is made a `tf_keras` one (the
reference passes a Keras 3 `tf.initializers` object, which `tf_keras`
cannot serialize).
"""

import contextlib
import dataclasses
from typing import Iterator

import tensorflow as tf
import tf_keras

from official.legacy.image_classification.resnet import resnet_model
from official.modeling import hyperparams

import tfm_ext

DATA_FORMATS = ("channels_first", "channels_last")
FC_STDDEV = 0.01


@dataclasses.dataclass
class ResNet50Config(hyperparams.Config):
  """ResNet50 v1.5 hyperparameters.

  Attributes:
    name: The registered model builder.
    num_classes: Outputs of `fc1000`. ImageNet labels are 0..999; the
      reference runner uses 1001 (one never-used class).
    data_format: `channels_first`, `channels_last`, or empty for
      `channels_first` when a GPU is visible and `channels_last` otherwise.
      Inputs are always channels-last; the model transposes them.
  """
  name: str = "resnet50_v1_5"
  num_classes: int = 1000
  data_format: str = ""
  batch_norm_momentum: float = 0.9
  batch_norm_epsilon: float = 1e-5


def resolve_data_format(data_format: str) -> str:
  """Returns `data_format`, or the default for the visible devices if empty."""
  if not data_format:
    gpus = tf.config.list_physical_devices("GPU")
    return "channels_first" if gpus else "channels_last"
  if data_format not in DATA_FORMATS:
    raise ValueError(f"data_format must be one of {DATA_FORMATS} or empty, "
                     f"got {data_format!r}.")
  return data_format


@contextlib.contextmanager
def image_data_format(data_format: str) -> Iterator[None]:
  """Sets Keras' image data format while layers are built, then restores it.

  Layers read the process-wide setting when they are constructed and keep
  it, so one model's choice does not leak into the next model built.
  """
  previous = tf_keras.backend.image_data_format()
  tf_keras.backend.set_image_data_format(data_format)
  try:
    yield
  finally:
    tf_keras.backend.set_image_data_format(previous)


@tfm_ext.register_model("resnet50_v1_5")
def build_resnet50(config: ResNet50Config,
                   use_l2_regularizer: bool = True) -> tf_keras.Model:
  """Builds ResNet50 v1.5; L2 1e-4 on weights as layer losses if asked."""
  with image_data_format(resolve_data_format(config.data_format)):
    model = resnet_model.resnet50(
        num_classes=config.num_classes,
        use_l2_regularizer=use_l2_regularizer,
        batch_norm_decay=config.batch_norm_momentum,
        batch_norm_epsilon=config.batch_norm_epsilon)
  # The weights are already drawn from the same distribution; this only makes
  # the layer's config serializable by tf_keras.
  model.get_layer("fc1000").kernel_initializer = (
      tf_keras.initializers.RandomNormal(stddev=FC_STDDEV))
  return model


def pooled_features(model: tf_keras.Model) -> tf_keras.Model:
  """Returns a model from `model`'s input to its 2048-d pooled features.

  Finds the global average pooling layer by type: the reference exporter
  looks it up by a name (`reduce_mean`) the current model no longer has.
  """
  pools = [layer for layer in model.layers
           if isinstance(layer, tf_keras.layers.GlobalAveragePooling2D)]
  if len(pools) != 1:
    raise ValueError(f"Expected one GlobalAveragePooling2D layer in "
                     f"{model.name!r}, found {len(pools)}.")
  return tf_keras.Model(model.inputs, pools[0].output,
                        name=f"{model.name}_feature_vector")
