"""Exports a ResNet50 checkpoint as TF-Hub style SavedModels.

Writes, like the reference's `tfhub_export.py`:

    <export_dir>/classification   images in [0, 1] -> class probabilities
    <export_dir>/feature-vector   images in [0, 1] -> 2048-d pooled features

Both take `[batch, 224, 224, 3]` RGB in [0, 1] and rescale it to the
training range, x * 255 - channel means, as the reference's `rescale_inputs`
does. The reference does it in a `Lambda` layer, which `tf_keras` cannot
load back; here a `Rescaling` layer does the same arithmetic, so the
SavedModels load with `tf.saved_model.load` (TF-Hub) and
`tf_keras.models.load_model` alike. They are channels-last whatever the
training used.

The model is rebuilt and the checkpoint's `model` restored into it; every
weight must be found there. Works on this repository's checkpoints and the
reference runner's (`tf.train.Checkpoint(model=..., optimizer=...)`). Each
SavedModel is written as `--mode=export` writes any experiment's
(`tfm_ext.model_dir.export`: `restore`, `ServingModule`, `save`), its
`serving_default` taking `inputs` and returning `outputs`.
"""

import os
from typing import Dict

import tf_keras

from experiments.imagenet import input_pipeline
from experiments.imagenet import resnet50
from tfm_ext.model_dir import export

SAVED_MODELS = ("classification", "feature-vector")


def restore(checkpoint_path: str,
            model_config: resnet50.ResNet50Config) -> tf_keras.Model:
  """Builds ResNet50 (channels-last) and restores every weight into it.

  Raises:
    AssertionError: if a model weight has no value in the checkpoint (a
      different architecture or `num_classes`).
  """
  model = resnet50.build_resnet50(
      model_config.replace(data_format="channels_last"))
  export.restore(checkpoint_path, model=model)
  return model


def hub_models(model: tf_keras.Model) -> Dict[str, tf_keras.Model]:
  """Returns `{name: model}` taking images in [0, 1], sharing `model`'s weights."""
  size = input_pipeline.IMAGE_SIZE
  images = tf_keras.Input((size, size, input_pipeline.NUM_CHANNELS),
                          name="images")
  rescaled = tf_keras.layers.Rescaling(
      255.0, offset=[-m for m in input_pipeline.CHANNEL_MEANS],
      name="rescale")(images)
  return {
      "classification": tf_keras.Model(images, model(rescaled)),
      "feature-vector": tf_keras.Model(
          images, resnet50.pooled_features(model)(rescaled)),
  }


def export_saved_models(checkpoint_path: str, export_dir: str,
                        model_config: resnet50.ResNet50Config
                        ) -> Dict[str, str]:
  """Restores `checkpoint_path`, writes both SavedModels; returns their paths."""
  paths = {}
  for name, model in hub_models(restore(checkpoint_path,
                                        model_config)).items():
    module = export.ServingModule(model_config, model,
                                  export.model_inputs(model))
    paths[name] = export.save(module, os.path.join(export_dir, name))
  return paths
