"""Builds the operative `ExperimentConfig` from what the user passed.

Order of precedence, lowest first: the experiment's defaults, each
`--config_file` in turn, `--params_override`, then for the trainer's name a
gin binding (`tfm_ext.trainer.name = 'mine'`) and, highest, `--trainer`.
Every mistake a user can fix raises `UsageError` naming the culprit.
"""

import dataclasses
import os
from typing import List, Optional, Sequence

import gin
import tensorflow as tf
import yaml

from official.core import config_definitions
from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams

from tfm_ext import registry
from tfm_ext import trainers
from tfm_ext.errors import UsageError


@dataclasses.dataclass(frozen=True)
class ConfigSources:
  """Where the experiment's configuration comes from (the launcher's flags)."""
  experiment: str
  config_files: Sequence[str] = ()
  params_override: str = ""
  tpu: str = ""
  trainer: str = ""


@gin.configurable("trainer", module="tfm_ext")
def gin_trainer(name: Optional[str] = None) -> Optional[str]:
  """The trainer a gin binding selects: `tfm_ext.trainer.name = 'mine'`."""
  return name


def parse_gin(gin_files: Sequence[str], gin_params: Sequence[str]) -> None:
  """Parses gin files and bindings; a bad one raises `UsageError`."""
  for path in gin_files or ():
    if not os.path.exists(path):
      raise UsageError(f"--gin_file {path!r} does not exist.")
  try:
    gin.parse_config_files_and_bindings(gin_files, gin_params)
  except (ValueError, SyntaxError, KeyError, ImportError) as e:
    raise UsageError(f"Bad gin configuration ({type(e).__name__}): {e}") from e


def experiment_names() -> List[str]:
  return sorted(exp_factory._REGISTERED_CONFIGS)  # pylint: disable=protected-access


def build(sources: ConfigSources) -> config_definitions.ExperimentConfig:
  """Returns the validated, locked experiment config with `trainer.name` set."""
  if sources.experiment not in experiment_names():
    raise UsageError(registry.unknown_name_message(
        "experiment", sources.experiment, experiment_names()))
  params = exp_factory.get_exp_config(sources.experiment)
  _add_missing_fields(params)

  for path in sources.config_files:
    if not os.path.exists(path):
      raise UsageError(f"--config_file {path!r} does not exist.")
    params = _override(params, path, f"--config_file {path!r}")
  parser = train_utils.ExperimentParser(train_utils.ParseConfigOptions(
      experiment=sources.experiment, config_file=[], tpu=sources.tpu))
  params = parser.parse_runtime(params)
  if sources.params_override:
    params = _override(params, sources.params_override, "--params_override")

  # One spelling from here on: TFM lowercases the name, and YAML reads a
  # bare `off` as false (TFM would stop there with a hint).
  strategy = params.runtime.distribution_strategy
  params.override({"runtime": {"distribution_strategy": (
      "off" if strategy is False else str(strategy).lower())}})

  name = sources.trainer or gin_trainer() or params.trainer.name
  if name not in trainers.TRAINERS:
    raise UsageError(registry.unknown_name_message(
        "trainer", name, trainers.TRAINERS.names()))
  params.override({"trainer": {"name": name}})

  try:
    params.validate()
  except (KeyError, ValueError, AssertionError) as e:
    raise UsageError(f"The experiment config is invalid: {e}") from e
  params.lock()
  return params


# Fields tfm_ext adds to TFM's `RuntimeConfig`: `tfm_ext.determinism`'s, and
# whether `mirrored` on one CPU device keeps a one-replica mirror
# (`tfm_ext.driver.build_strategy`).
RUNTIME_FIELDS = {"deterministic": False, "seed": 0,
                  "mirror_one_device": False}


def _add_missing_fields(params) -> None:
  """Adds tfm_ext's config fields, with defaults, where the config lacks them.

  Experiments built on `tfm_ext.TrainerConfig` declare the trainer ones; TFM's
  own experiments get them here, so YAML files and overrides can set them.
  """
  for section, fields in (("trainer", trainers.added_fields()),
                          ("runtime", RUNTIME_FIELDS)):
    present = getattr(params, section).as_dict()
    missing = {k: v for k, v in fields.items() if k not in present}
    if missing:
      params.override({section: missing}, is_strict=False)


def _override(params, source: str, where: str):
  """Applies a YAML file or string strictly, translating errors for users."""
  try:
    return hyperparams.override_params_dict(params, source, is_strict=True)
  except yaml.YAMLError as e:
    raise UsageError(f"{where} is not valid YAML: {e}") from e
  except KeyError as e:
    raise UsageError(
        f"{where} sets a key that the experiment config does not have: "
        f"{e.args[0] if e.args else e}") from e
  except (ValueError, TypeError, AttributeError) as e:
    raise UsageError(f"{where} could not be applied: {e}") from e
  except tf.errors.OpError as e:
    # Not `key=value` pairs, so TFM took it for a file name.
    raise UsageError(f"{where} is neither `key=value,...`, YAML nor a file: "
                     f"{e.message.splitlines()[0]}") from e
