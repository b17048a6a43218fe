"""TFM's NLP tasks served as TFM's NLP exporter serves them.

For a task of `official/nlp/serving/export_savedmodel.py`'s
`SERVING_MODULES` (sentence prediction, masked LM, question answering,
tagging, translation), `--mode=export` writes what that script writes: the
task's module of `official.nlp.serving.serving_modules`, its `Params` from
`--serving_params`, the signature `--function_keys` names as
`serving_default`, saved by `export_savedmodel_util.export` (its
`tpu_candidate` alias too):

    ServingOptions(function_keys=, serving_params=)   the script's flags
    nlp = nlp_export(params, options)   TFM's module, a new model; None: not NLP
    restore(checkpoint, model=nlp.module.model, ...)   (export.restore)
    nlp.write(partial_dir)              export_savedmodel_util.export

Where ours differs from the script: `--function_keys` defaults to `serve`
(the script has no default); a module's `parse_sequence_length`, when
`--serving_params` leaves it out, is the sequence length the task's
evaluation reads (`validation_data.seq_length`; the script leaves it None,
and `serve_examples` cannot be traced so); the model is built from the
run's config (the script rebuilds the task from `--config_file` and
`--task_name`); and `params.yaml` is written beside the SavedModel, as
the vision path's. Not taken: the script's `--module_key` (an item of a
multi-task checkpoint) and `--convert_tpu` (Cloud TPU's converter, not in
tf-models-official).
"""

import dataclasses
import sys
from typing import Any, Dict, Optional

import tensorflow as tf
import yaml

from official.core import config_definitions
from official.core import export_base
from official.core import task_factory

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import params_file
from tfm_ext.model_dir import tfm_serving

SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
DEFAULT_FUNCTION_KEY = "serve"


def _serving_modules() -> Dict[type, type]:
  """Stock's exporter's table: task class -> its export module class.

  Imported on the first NLP export only (it imports TensorFlow Text).
  """
  from official.nlp.serving import export_savedmodel  # pylint: disable=g-import-not-at-top
  return export_savedmodel.SERVING_MODULES


def _module_class(task_config) -> Optional[type]:
  # A config of TFM's NLP tasks is a class of official.nlp.tasks: where that
  # package was never imported, none is (and nothing of NLP is imported).
  if "official.nlp.tasks" not in sys.modules:
    return None
  try:
    task_cls = task_factory.get_task_cls(type(task_config))
  except LookupError:  # A config no task is registered for.
    return None
  # By the exact class, as stock's `lookup_export_module`.
  return _serving_modules().get(task_cls)


def serving_params(module_cls: type, given: Optional[str],
                   task_config) -> Any:
  """`module_cls.Params` of `--serving_params`, parsed as stock parses it.

  YAML, JSON or `key=value,...` (TFM's nested CSV). A `parse_sequence_length`
  left out is the task's evaluation's `seq_length` (module docstring).

  Raises:
    UsageError: it does not parse, or names a field the Params lack.
  """
  from official.modeling import hyperparams  # pylint: disable=g-import-not-at-top
  flag = f"--serving_params={given!r}"
  try:
    values = yaml.safe_load(
        hyperparams.nested_csv_str_to_json_str(given)) if given else {}
  except (yaml.YAMLError, ValueError) as e:
    raise UsageError(f"{flag}: not YAML, JSON or key=value,... ({e}).") from e
  if not isinstance(values, dict):
    raise UsageError(f"{flag}: give key=value pairs, e.g. "
                     "parse_sequence_length=128.")
  fields = [f.name for f in dataclasses.fields(module_cls.Params)]
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise UsageError(
        f"{flag}: TFM's {module_cls.__name__} takes no {', '.join(unknown)}; "
        f"its serving params are {', '.join(fields)}.")
  seq_length = getattr(task_config.validation_data, "seq_length", None)
  if "parse_sequence_length" in fields and values.get(
      "parse_sequence_length") is None and seq_length:
    values["parse_sequence_length"] = seq_length
  return module_cls.Params(**values)


@dataclasses.dataclass(frozen=True)
class NlpExport:
  """TFM's NLP export module of one task and the function it serves."""
  module: export_base.ExportModule
  function_key: str
  params: config_definitions.ExperimentConfig  # The run's, for params.yaml.

  def write(self, export_dir: str) -> None:
    """Saves the module (its weights read) to `export_dir` as stock does.

    `export_savedmodel_util.export` given the module and no checkpoint,
    not timestamped: the SavedModel in `export_dir` itself, then
    `params.yaml` beside it (`params_file.write`).
    """
    from official.nlp.serving import export_savedmodel_util  # pylint: disable=g-import-not-at-top
    with tfm_serving.float32():
      export_savedmodel_util.export(
          self.module, function_keys=[self.function_key],
          export_savedmodel_dir=export_dir, timestamped=False)
    params_file.write(self.params, export_dir)


def _built(module_cls: type, params: config_definitions.ExperimentConfig,
           given: Optional[str]) -> export_base.ExportModule:
  """`module_cls` of a new model of the task, its Params `given`.

  Raises:
    UsageError: the Params do not parse, or the module cannot be built
      from them (a vocabulary or SentencePiece file that is not there).
  """
  model = task_factory.get_task(params.task).build_model()
  values = serving_params(module_cls, given, params.task)
  try:
    return module_cls(params=values, model=model)
  except (ValueError, tf.errors.OpError) as e:
    raise UsageError(
        f"--serving_params={given!r}: TFM's {module_cls.__name__} cannot be "
        f"built from it: {type(e).__name__}: {e}") from e


def nlp_export(params: config_definitions.ExperimentConfig,
               options: tfm_serving.ServingOptions) -> Optional[NlpExport]:
  """TFM's NLP export module for `params.task`, with a new model; else None.

  None when the task has no module in stock's table; NLP flags given are
  then a `UsageError`. Vision flags given to an NLP task are one too.

  Raises:
    UsageError: the flags do not fit the task or its module.
  """
  module_cls = _module_class(params.task)
  if module_cls is None:
    tfm_serving.refuse_flags(options, tfm_serving.NLP_FLAGS, "NLP",
                             params.task)
    return None
  vision_flags = options.given_of(tfm_serving.VISION_FLAGS)
  if vision_flags:
    raise UsageError(
        f"{' '.join(vision_flags)}: these flags shape the export of TFM's "
        f"vision tasks; {type(params.task).__name__} is one of its NLP "
        "tasks, whose export takes --function_keys and --serving_params "
        "(TFM's official/nlp/serving/export_savedmodel.py's).")
  key = options.function_keys or DEFAULT_FUNCTION_KEY
  with tfm_serving.float32():
    module = _built(module_cls, params, options.serving_params)
    try:  # Traced now, so a key it lacks is refused before any read.
      module.get_inference_signatures({key: SIGNATURE})
    except ValueError as e:
      raise UsageError(f"--function_keys={key}: {e}") from e
  return NlpExport(module, key, params)
