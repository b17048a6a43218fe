"""TFM's vision tasks served as TFM's exporter serves them.

For a task config of TFM's vision tasks, `--mode=export` writes the
SavedModel that `official/vision/serving/export_saved_model.py` writes: the
same export module, built from the same flags, saved by TFM's
`export_inference_graph`. Its `serving_default` takes images (uint8, or
encoded bytes, or `tf.Example`s) and holds the task's preprocessing
(resize, normalization) and postprocessing (softmax, boxes, full-size
masks):

    ServingOptions(input_type=, batch_size=, input_image_size=)
                                    export_saved_model.py's flags, checked
    vision = vision_export(params, options)   TFM's module; None: not TFM's
    restore(checkpoint, model=vision.module.model, ...)   (export.restore)
    vision.write(partial_dir)         TFM's export_inference_graph

What it writes, into `export/<step>/`: the SavedModel and `params.yaml`
(the config it was built from; TFM writes it too). TFM's
`export_saved_model.py` puts the SavedModel in a `saved_model/` subfolder
and a copy of the model's weights in `checkpoint/`: here the SavedModel is
the step's folder itself, as every export of `export/` (TF Serving loads
`export/<version>/saved_model.pb`), and the weights are left in
`model_dir`'s checkpoint, which the SavedModel's `variables/` repeat.
"""

import contextlib
import dataclasses
import functools
import sys
from typing import List, Optional, Tuple

import gin
import tf_keras

from official.core import config_definitions
from official.core import export_base

from tfm_ext.model_dir import params_file
from tfm_ext.base.errors import UsageError
from tfm_ext.base import registry

# What TFM's export_saved_model.py's --input_type takes.
INPUT_TYPES = ("image_tensor", "image_bytes", "tf_example", "tflite")
_IMAGE_INPUT_TYPES = INPUT_TYPES
_VIDEO_INPUT_TYPES = ("image_tensor", "tf_example")
# export_saved_model.py's default --input_image_size.
TFM_DEFAULT_IMAGE_SIZE = (224, 224)


@dataclasses.dataclass(frozen=True)
class _Served:
  """How TFM serves one kind of task: its module and what it takes."""
  task_configs: Tuple[type, ...]
  module: type
  input_types: Tuple[str, ...]
  # Of --input_image_size: height,width; a video's frames,height,width.
  size_names: Tuple[str, ...] = ("height", "width")


@functools.lru_cache(maxsize=None)
def _served_table() -> Tuple[_Served, ...]:
  """`export_saved_model_lib.export_inference_graph`'s isinstance chain.

  As a table of its classes: it builds its module inline, and here the
  module's model must exist before the checkpoint is read into it.
  Imported on the first export: the launcher's start does not pay for
  TFM's vision serving (nor registers the vision experiments, which
  `tfm_ext.config.experiments` registers when a run names one).
  """
  # Gin is locked by then; the import adds TFM's configurables all the same.
  with gin.unlock_config():
    # pylint: disable=g-import-not-at-top
    from official.vision import configs
    from official.vision.serving import detection
    from official.vision.serving import image_classification
    from official.vision.serving import semantic_segmentation
    from official.vision.serving import video_classification
    # pylint: enable=g-import-not-at-top
  return (
      _Served((configs.image_classification.ImageClassificationTask,),
              image_classification.ClassificationModule, _IMAGE_INPUT_TYPES),
      _Served((configs.retinanet.RetinaNetTask, configs.maskrcnn.MaskRCNNTask),
              detection.DetectionModule, _IMAGE_INPUT_TYPES),
      _Served((configs.semantic_segmentation.SemanticSegmentationTask,),
              semantic_segmentation.SegmentationModule, _IMAGE_INPUT_TYPES),
      # Its module raises on image bytes and has no tflite signature.
      _Served((configs.video_classification.VideoClassificationTask,),
              video_classification.VideoClassificationModule,
              _VIDEO_INPUT_TYPES, ("frames", "height", "width")),
  )


# ServingOptions' fields of each of TFM's exporters.
VISION_FLAGS = ("input_type", "batch_size", "input_image_size")
NLP_FLAGS = ("function_keys", "serving_params")


@dataclasses.dataclass(frozen=True)
class ServingOptions:
  """The flags of TFM's exporters that shape the signature.

  Those of the vision tasks' `export_saved_model.py` (`VISION_FLAGS`) and of
  the NLP tasks' `export_savedmodel.py` (`NLP_FLAGS`,
  `tfm_ext.model_dir.nlp_serving`). Checked at once: a bad value is a
  `UsageError` naming the flag.

  Attributes:
    input_type: `--input_type`, one of `INPUT_TYPES`; None: TFM's
      `image_tensor`.
    batch_size: `--batch_size`; None: any number of examples, as TFM's.
    input_image_size: `--input_image_size` as numbers; empty: the size the
      task's evaluation feeds its model (`image_size`).
    function_keys: `--function_keys`, the NLP module's function served as
      `serving_default`; None: `serve`.
    serving_params: `--serving_params`, the NLP module's `Params` as YAML,
      JSON or key=value,...; None: its defaults.
  """
  input_type: Optional[str] = None
  batch_size: Optional[int] = None
  input_image_size: Tuple[int, ...] = ()
  function_keys: Optional[str] = None
  serving_params: Optional[str] = None

  def __post_init__(self):
    if self.input_type is not None and self.input_type not in INPUT_TYPES:
      raise UsageError(registry.unknown_name_message(
          "--input_type", self.input_type, list(INPUT_TYPES),
          known_as="TFM's export takes"))
    if self.batch_size is not None and self.batch_size < 1:
      raise UsageError(f"--batch_size={self.batch_size}: give a number of "
                       "examples of at least 1, or leave it out to take any.")
    if self.input_image_size and (
        len(self.input_image_size) not in (2, 3)
        or min(self.input_image_size) < 1):
      raise UsageError(
          f"--input_image_size={_joined(self.input_image_size)}: give "
          "height,width (a video's frames,height,width) as positive whole "
          "numbers, e.g. 224,224.")

  @classmethod
  def from_flags(cls, *, input_type: Optional[str], batch_size: Optional[int],
                 input_image_size: Optional[str],
                 function_keys: Optional[str] = None,
                 serving_params: Optional[str] = None) -> "ServingOptions":
    """The options the flags give; `--input_image_size` as "224,224"."""
    size = ()
    if input_image_size:
      try:
        size = tuple(int(n) for n in input_image_size.split(","))
      except ValueError:
        raise UsageError(
            f"--input_image_size={input_image_size!r}: give height,width "
            "(a video's frames,height,width) as positive whole numbers, e.g. "
            "224,224.") from None
    return cls(input_type=input_type, batch_size=batch_size,
               input_image_size=size, function_keys=function_keys,
               serving_params=serving_params)

  @property
  def given(self) -> List[str]:
    """The flags given, as `--name=value`."""
    return self.given_of(VISION_FLAGS + NLP_FLAGS)

  def given_of(self, names: Tuple[str, ...]) -> List[str]:
    """The flags of `names` given, as `--name=value`."""
    return [f"--{name}={_joined(value)}" for name in names
            for value in [getattr(self, name)] if value not in (None, ())]


def refuse_flags(options: ServingOptions, names: Tuple[str, ...], kind: str,
                 task_config) -> None:
  """Refuses the flags of `names` given for a task not of TFM's `kind` tasks.

  Raises:
    UsageError: naming them; such a model takes what `serving_inputs` on its
      task or trainer says.
  """
  given = options.given_of(names)
  if given:
    raise UsageError(
        f"{' '.join(given)}: these flags shape the export of TFM's {kind} "
        f"tasks; {type(task_config).__name__} is not one. Its model takes "
        "what `serving_inputs` on its task or trainer says "
        "(tfm_ext.model_dir.export).")


def _joined(value) -> str:
  return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _served(task_config) -> Optional[_Served]:
  # A config of TFM's vision tasks is an instance of a class of
  # official.vision.configs: where that was never imported, none is.
  if "official.vision.configs" not in sys.modules:
    return None
  for served in _served_table():
    if isinstance(task_config, served.task_configs):
      return served
  return None


def image_size(task_config, options: ServingOptions) -> List[int]:
  """`--input_image_size`, else the size the task's evaluation feeds its model.

  That is a video's `train_data.feature_shape` (frames, height, width: TFM's
  video module crops to it), else `model.input_size` where it is fixed
  (classification, detection), else `validation_data.output_size`
  (segmentation), else TFM's `export_saved_model.py` default, 224,224.
  """
  if options.input_image_size:
    return list(options.input_image_size)
  served = _served(task_config)  # None: a project's task (project_serving).
  if served and served.size_names[0] == "frames":
    return list(task_config.train_data.feature_shape[:-1])
  fixed = list(getattr(task_config.model, "input_size", None) or [None])[:2]
  if None not in fixed:
    return fixed
  return list(getattr(task_config.validation_data, "output_size", None)
              or TFM_DEFAULT_IMAGE_SIZE)


@dataclasses.dataclass(frozen=True)
class VisionExport:
  """TFM's export module of one task, and the signature it is saved with."""
  module: export_base.ExportModule
  input_type: str
  batch_size: Optional[int]
  input_image_size: List[int]

  def write(self, export_dir: str) -> None:
    """Saves the module (its weights read) to `export_dir` as TFM does.

    TFM's `export_inference_graph`, given the module and no checkpoint:
    the SavedModel in `export_dir` itself and `params.yaml` beside it,
    which is then written as the model_dir's is (`params_file.write`):
    stock TFM's fields, which its strict parse reads, and the fields
    tfm_ext adds in `tfm_ext_params.yaml`.
    """
    from official.vision.serving import export_saved_model_lib  # pylint: disable=g-import-not-at-top
    with float32():
      export_saved_model_lib.export_inference_graph(
          input_type=self.input_type, batch_size=self.batch_size,
          input_image_size=self.input_image_size, params=self.module.params,
          checkpoint_path=None, export_dir=export_dir,
          export_module=self.module)
    params_file.write(self.module.params, export_dir)


@contextlib.contextmanager
def float32():
  """Keras's global dtype policy float32 for the block, as in TFM's export.

  TFM's `export_saved_model.py` sets no mixed-precision policy, so its
  model computes in float32 whatever `runtime.mixed_precision_dtype`
  trained it (bfloat16 for RetinaNet, Mask R-CNN and video); the run set
  that policy for the whole process (`tfm_ext.run.assembly`).
  """
  previous = tf_keras.mixed_precision.global_policy()
  tf_keras.mixed_precision.set_global_policy("float32")
  try:
    yield
  finally:
    tf_keras.mixed_precision.set_global_policy(previous)


def vision_export(params: config_definitions.ExperimentConfig,
                  options: ServingOptions) -> Optional[VisionExport]:
  """TFM's export module for `params.task`, with a new model; else None.

  None when the task is not one of TFM's vision tasks; options given are
  then a `UsageError` (such a model takes what its `serving_inputs` says).

  Raises:
    UsageError: the task's module does not take `options`.
  """
  served = _served(params.task)
  if served is None:
    refuse_flags(options, VISION_FLAGS, "vision", params.task)
    return None
  input_type = options.input_type or INPUT_TYPES[0]
  if input_type not in served.input_types:
    raise UsageError(
        f"--input_type={input_type}: TFM's {served.module.__name__} does not "
        f"take it; it takes {', '.join(served.input_types)}.")
  size = image_size(params.task, options)
  if len(size) != len(served.size_names):
    raise UsageError(
        f"--input_image_size={_joined(tuple(size))}: "
        f"{type(params.task).__name__} takes {','.join(served.size_names)}.")
  # A copy: TFM's detection module sets the NMS version on the params it
  # is given (for a batch size of None), and ours are locked.
  with float32():
    module = served.module(params.replace(), batch_size=options.batch_size,
                           input_image_size=size, input_type=input_type)
  return VisionExport(module, input_type, options.batch_size, size)
