"""Builds the operative `ExperimentConfig` from what the user passed.

Order of precedence, lowest first: the experiment's defaults, each
`--config_file` in turn, `--params_override`, then for the trainer's name a
gin binding (`tfm_ext.trainer.name = 'mine'`) and, highest, `--trainer`.

An evaluator (`eval`, `continuous_eval`) on a `model_dir` that a trainer
wrote follows the trainer: the trainer's `params.yaml` replaces the
experiment's defaults, trainer name included, and the flags may change only
what evaluation alone reads (`EVALUATION_FIELDS`); any other difference is
refused, naming it.

Every mistake a user can fix raises `UsageError` naming the culprit; a
value is never chosen silently among several the user gave: a key twice in
a YAML mapping or an override (`params_file.Loader`), or a single-valued
flag twice on the command line (`check_repeated_flags`), is refused.
"""

import dataclasses
import difflib
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import flags
import gin
import tensorflow as tf

from official.core import config_definitions
from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams
from official.modeling.hyperparams import params_dict

from tfm_ext.base import errors
from tfm_ext.config import config_drift
from tfm_ext.config import experiments
from tfm_ext.model_dir import params_file
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.base import registry
from tfm_ext.training import trainers
from tfm_ext.config import added_fields


@dataclasses.dataclass(frozen=True)
class ConfigSources:
  """Where the experiment's configuration comes from (the launcher's flags)."""
  experiment: str
  config_files: Sequence[str] = ()
  params_override: str = ""
  tpu: str = ""
  # TFM's --tf_data_service: train_data's and validation_data's
  # tf_data_service_address.
  tf_data_service: str = ""
  trainer: str = ""


@gin.configurable("trainer", module="tfm_ext")
def gin_trainer(name: Optional[str] = None) -> Optional[str]:
  """The trainer a gin binding selects: `tfm_ext.trainer.name = 'mine'`."""
  return name


def parse_gin(gin_files: Sequence[str], gin_params: Sequence[str]) -> None:
  """Parses gin files, then bindings, as `gin.parse_config_files_and_bindings`.

  A run before this one in the process (`tfm_ext.launch` from a notebook)
  left gin's config final: its bindings are cleared first, so that each
  run has its own.

  Raises:
    UsageError: a file is missing, a directory or unreadable, or a file or
      binding does not parse; the message names it.
  """
  if gin.config_is_locked():
    gin.clear_config()  # Unlocks it too.
  for path in gin_files or ():
    if os.path.isdir(path):
      raise UsageError(f"--gin_file {path!r} is a directory: give a gin "
                       "file (a .gin file of bindings).")
    if not os.path.exists(path):
      raise UsageError(f"--gin_file {path!r} does not exist.")
    _gin(lambda path=path: gin.parse_config_file(path),
         f"--gin_file {path!r}")
  for binding in gin_params or ():
    _gin(lambda binding=binding: gin.parse_config(binding),
         f"--gin_params {binding!r}")
  _gin(gin.finalize, "gin.finalize()")


def _gin(parse: Callable[[], Any], where: str) -> None:
  """Runs `parse`; an error of gin's is a `UsageError` naming `where`."""
  try:
    parse()
  except SyntaxError as e:  # gin's carry the line, but its message is bare.
    line = f" at line {e.lineno}" if e.lineno else ""
    line += f", column {e.offset + 1}" if e.lineno and e.offset else ""
    text = f": {e.text.strip()!r}" if e.text and e.text.strip() else ""
    raise UsageError(f"Bad gin configuration: {where} does not parse"
                     f"{line}{text}: {e.msg}") from e
  except OSError as e:
    raise UsageError(f"Bad gin configuration: {where} cannot be read: "
                     f"{e}") from e
  except (ValueError, KeyError, ImportError, TypeError) as e:
    said = " ".join(str(e).split())  # gin's adds lines: file, line, text.
    raise UsageError(f"Bad gin configuration: {where} is refused by gin "
                     f"({type(e).__name__}): {said}") from e


def check_command_line(argv: Sequence[str],
                       flag_values: flags.FlagValues) -> None:
  """Refuses what absl would take silently or TensorFlow could not take.

  A flag given twice (`check_repeated_flags`), and a value that is not
  UTF-8 (bytes of another encoding reach Python as surrogate escapes):
  TensorFlow's file systems and protos take UTF-8 only, and fail with a
  traceback at the first use of such a path.

  Raises:
    UsageError: naming the flag and what is wrong with it.
  """
  for arg in argv:
    if arg == "--":
      break
    try:
      arg.encode("utf-8")
    except UnicodeEncodeError as e:
      name = arg.split("=", 1)[0] if arg.startswith("-") else "an argument"
      raw = arg[e.start:e.end].encode("utf-8", "surrogateescape")
      shown = arg.encode("utf-8", "surrogateescape").decode(
          "utf-8", "backslashreplace")
      raise UsageError(
          f"{name}: '{shown:.300}' holds bytes that are not UTF-8 ({raw!r}), "
          "and TensorFlow takes UTF-8 paths and values only. Rename the "
          "file or directory, or give another.") from None
  check_repeated_flags(argv, flag_values)


def check_repeated_flags(argv: Sequence[str],
                         flag_values: flags.FlagValues) -> None:
  """Refuses a flag that takes one value and is given more than once.

  absl keeps the last value of such a flag silently: a second
  `--params_override` drops the first. `argv` is the raw command line
  without the program (`sys.argv[1:]`), read as absl reads it: `--name=v`,
  `--name v`, `-name`, `--name`/`--noname` for a boolean, up to `--`.
  Multi flags (`DEFINE_multi_*`: `--config_file`, `--gin_file`,
  `--gin_params`, `--registry`) may repeat; names absl does not know are
  left to absl, and so are the flags a `--flagfile` holds (a flagfile of
  defaults that the command line overrides is absl's documented use).

  Raises:
    UsageError: naming the flag and both of its values.
  """
  given: Dict[str, str] = {}
  args = iter(argv)
  for arg in args:
    if arg == "--":
      break
    flag, value = _flag_given(arg, args, flag_values)
    if flag is None or isinstance(flag, flags.MultiFlag):
      continue
    spelled = f"--{flag.name}={value}"
    if flag.name in given:
      hint = (" Put all overrides in one, comma-separated (--params_override="
              "a.b=1,c.d=2), or in a --config_file, which may be repeated."
              if flag.name == "params_override" else "")
      raise UsageError(
          f"--{flag.name} is given twice, {given[flag.name]!r:.300} and "
          f"{spelled!r:.300}, and takes one value: absl would keep the last "
          f"and drop the first silently. Give it once.{hint}")
    given[flag.name] = spelled


def _flag_given(arg: str, rest, flag_values: flags.FlagValues
                ) -> Tuple[Optional[flags.Flag], Optional[str]]:
  """The flag `arg` sets and its value (the next of `rest`, if it takes it).

  `(None, None)` for a positional argument or a name absl does not know.
  """
  if not arg.startswith("-") or arg == "-":
    return None, None
  name, has_value, value = arg[2 if arg.startswith("--") else 1:].partition(
      "=")
  if name in flag_values:
    flag = flag_values[name]
  elif (name.startswith("no") and name[2:] in flag_values
        and flag_values[name[2:]].boolean and not has_value):
    return flag_values[name[2:]], "false"
  else:
    return None, None
  if has_value:
    return flag, value
  return flag, "true" if flag.boolean else next(rest, None)


# Dotted prefixes of the fields an evaluator may set otherwise than the
# trainer it follows: how much and how often to evaluate, on which data and
# hardware, and what to keep of it. Everything else (model, training data,
# optimizer, train_steps, the trainer's name) is the trainer's.
EVALUATION_FIELDS = (
    "task.validation_data.",
    "trainer.validation_steps",
    "trainer.validation_summary_subdir",
    "trainer.continuous_eval_timeout",
    "trainer.eval_",
    "trainer.best_checkpoint_",
    "runtime.",
)
# An export reads the model and its checkpoint: how long and how often the
# trainer trained (`config_drift.HARMLESS`) and its training data may
# differ too.
EXPORT_FIELDS = EVALUATION_FIELDS + config_drift.HARMLESS + (
    "task.train_data.", "trainer.reduce_lr_on_plateau")


def build(sources: ConfigSources, follow: str = "",
          may_change: Tuple[str, ...] = EVALUATION_FIELDS
          ) -> config_definitions.ExperimentConfig:
  """Returns the validated, locked experiment config with `trainer.name` set.

  Args:
    sources: the experiment and what the user passed.
    follow: the path of a trainer's `params.yaml` for an evaluator to follow
      (see the module docstring); empty to build from the experiment alone.
    may_change: the dotted prefixes the flags may set otherwise than the
      followed trainer (`EVALUATION_FIELDS`; an export's `EXPORT_FIELDS`).
  """
  if not experiments.is_known(sources.experiment):
    raise UsageError(experiments.unknown_message(sources.experiment))
  params = exp_factory.get_exp_config(sources.experiment)
  _add_missing_fields(params)
  trained = None
  if follow:
    params = _followed(params, follow, sources.experiment)
    trained = params.as_dict()

  for path in sources.config_files:
    if not tf.io.gfile.exists(path):
      raise UsageError(f"--config_file {path!r} does not exist.")
    where = f"--config_file {path!r}"
    params = _override(params, _read_yaml_file(path, where), where)
  parser = train_utils.ExperimentParser(train_utils.ParseConfigOptions(
      experiment=sources.experiment, config_file=[], tpu=sources.tpu,
      tf_data_service=sources.tf_data_service))
  params = parser.parse_runtime(params)
  params = parser.parse_data_service(params)
  if sources.params_override:
    params = _override(params, _parse_override(sources.params_override),
                       "--params_override")

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
  if trained is not None:
    _check_follows(trained, params.as_dict(), follow, may_change)

  _check_one_ofs(params)
  try:
    params.validate()
  except (KeyError, ValueError, AssertionError) as e:
    raise UsageError(f"The experiment config is invalid: {e}") from e
  params.lock()
  return params


def _followed(params, follow: str, experiment: str):
  """`params` overridden by the trainer's `params.yaml` at `follow`."""
  where = f"The trainer's config {follow!r} (for --experiment={experiment})"
  try:
    saved = params_file.read(follow)
  except ValueError as e:  # files.Damaged, naming the file.
    raise UsageError(f"{e}: an evaluator cannot follow the trainer's "
                     f"config (for --experiment={experiment}). Restore the "
                     "file, or evaluate in another --model_dir.") from e
  return _override(params, saved, where)


def _check_one_ofs(config, path: str = "") -> None:
  """Every one-of section (optimizer, schedule...) names one of its types.

  TFM says only "type: 'adamm' is not a valid key!"; here the section, the
  types it has and the closest one are named.
  """
  if isinstance(config, hyperparams.OneOfConfig):
    chosen = config.type
    types = [k for k in vars(config) if k != "type" and k[0] != "_"]
    if chosen is not None and chosen not in types:
      raise UsageError(registry.unknown_name_message(
          f"{path}.type", chosen, sorted(types),
          known_as=f"The types of {path}"))
  if isinstance(config, hyperparams.Config):
    for key in vars(config):
      if not key.startswith("_"):
        _check_one_ofs(getattr(config, key), f"{path}.{key}".lstrip("."))


def trainer_params(model_dir: str) -> str:
  """The `params.yaml` a trainer wrote in `model_dir`, or "" if none."""
  path = os.path.join(model_dir, "params.yaml")
  return path if tf.io.gfile.exists(path) else ""


def follow_trainer(sources: ConfigSources,
                   params: config_definitions.ExperimentConfig,
                   model_dir: str, wait: bool,
                   may_change: Tuple[str, ...] = EVALUATION_FIELDS
                   ) -> config_definitions.ExperimentConfig:
  """The config an evaluator of `model_dir` runs: the trainer's, if any.

  `params` is what the flags alone describe (`build(sources)`); with `wait`
  (an evaluator started beside a trainer that may not have started yet) it
  first waits up to `trainer.continuous_eval_timeout` for the trainer's
  `params.yaml`.
  """
  follow = (await_trainer_params(model_dir,
                                 params.trainer.continuous_eval_timeout)
            if wait else trainer_params(model_dir))
  return (build(sources, follow=follow, may_change=may_change) if follow
          else params)


def await_trainer_params(model_dir: str, timeout: float,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> str:
  """Waits for a trainer to start in `model_dir`; returns its params.yaml.

  Returns at once if `model_dir` has a `params.yaml` or a checkpoint (one
  written without a params.yaml is evaluated as the flags describe), else
  polls every second for a `params.yaml`, for at most `timeout` seconds.

  Raises:
    UsageError: nothing came within `timeout` (the evaluator's own timeout:
      it would find no checkpoint either).
  """
  deadline = clock() + timeout
  announced = False
  while True:
    follow = trainer_params(model_dir)
    if follow or checkpoint_state.latest(model_dir):
      return follow
    if clock() >= deadline:
      raise errors.no_checkpoint(model_dir, timeout)
    if not announced:
      announced = True
      print(f"waiting up to {timeout:.0f}s for a trainer's params.yaml in "
            f"{model_dir}", flush=True)
    sleep(1.0)


def _check_follows(trained, requested, follow: str,
                   may_change: Tuple[str, ...]) -> None:
  """Refuses flags that change more than `may_change` of `trained`."""
  changed = config_drift.diff(trained, requested, harmless=may_change)
  if not changed:
    return
  if may_change == EXPORT_FIELDS:
    who, what = "An export", ("evaluation fields and the training schedule "
                              "and data")
  else:
    who, what = "An evaluator", (
        "evaluation fields (validation data and steps, "
        "continuous_eval_timeout, the best-checkpoint keys, runtime)")
  raise UsageError(
      f"{who} follows the trainer's config, {follow!r}, and may change only "
      f"{what}; these flags change the trainer's:\n" + "\n".join(changed)
      + "\nDrop them (the trainer's values are used), or use another "
      "--model_dir.")


def with_tfm_ext_fields(params: config_definitions.ExperimentConfig
                        ) -> config_definitions.ExperimentConfig:
  """An unlocked copy of `params` with tfm_ext's fields where it lacks them."""
  params = params.replace()
  _add_missing_fields(params)
  return params


def _add_missing_fields(params) -> None:
  """Adds tfm_ext's config fields, with defaults, where the config lacks them.

  Experiments built on `tfm_ext.TrainerConfig` declare the trainer ones; TFM's
  own experiments get them here, so YAML files and overrides can set them.
  """
  for section, fields in added_fields.defaults().items():
    present = getattr(params, section).as_dict()
    missing = {k: v for k, v in fields.items() if k not in present}
    if missing:
      params.override({section: missing}, is_strict=False)


def _read_yaml_file(path: str, where: str) -> Dict[str, Any]:
  """The YAML mapping in the file `path`, read as data (`params_file`)."""
  try:
    return params_file.read_mapping(path)
  except params_file.NotConfig as e:
    raise UsageError(f"{where} {e}.") from e


def _parse_override(text: str) -> Dict[str, Any]:
  """What `--params_override` holds, as TFM reads it, but as data.

  TFM's `override_params_dict` takes `a.b=1,c=2`, a YAML (or JSON) mapping,
  or else the name of a YAML file, and loads YAML with a loader that builds
  Python objects (`!!python/name:...`); here `params_file.Loader` reads it.
  """
  where = "--params_override"
  try:
    text = params_dict.nested_csv_str_to_json_str(text)
  except ValueError:
    pass  # Not `key=value` pairs.
  try:
    tree = params_file.load(text)
  except params_file.NotConfig as e:
    raise UsageError(f"{where} {e}.") from e
  if isinstance(tree, dict):
    return tree
  if not tf.io.gfile.exists(text):
    raise UsageError(f"{where} is neither `key=value,...`, a YAML mapping "
                     f"nor a file: {text!r:.200}")
  return _read_yaml_file(text, f"{where} file {text!r}")


def _override(params, tree: Dict[str, Any], where: str):
  """Applies `tree` strictly, translating errors for users."""
  try:
    return hyperparams.override_params_dict(params, tree, is_strict=True)
  except KeyError as e:
    unknown = _unknown_key(params.as_dict(), tree)
    if unknown is None:  # TFM's own wording, should the walk not find it.
      raise UsageError(
          f"{where} sets a key that the experiment config does not have: "
          f"{_short(e.args[0] if e.args else e)}") from e
    path, known = unknown
    parent, _, key = path.rpartition(".")
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = (" Closest: " + ", ".join(
        ".".join(filter(None, (parent, k))) for k in close) + "."
            if close else "")
    raise UsageError(
        f"{where} sets {path}, a key the experiment config does not "
        f"have.{hint} The keys of {parent or 'the config'}: "
        f"{', '.join(sorted(known))}.") from e
  except (ValueError, TypeError, AttributeError) as e:
    raise UsageError(f"{where} could not be applied: {_short(e)}") from e


def _unknown_key(config: Dict[str, Any], tree: Dict[str, Any],
                 path: str = "") -> Optional[Tuple[str, List[str]]]:
  """The first key of `tree` that `config` lacks, and the keys beside it."""
  for key, value in tree.items():
    where = f"{path}.{key}".lstrip(".")
    if key not in config:
      return where, list(config)
    if isinstance(value, dict) and isinstance(config[key], dict):
      found = _unknown_key(config[key], value, where)
      if found:
        return found
  return None


def _short(error: object, limit: int = 1000) -> str:
  """`error` as text, cut at `limit` characters: it may quote a large value."""
  text = str(error)
  return text if len(text) <= limit else text[:limit] + "... (cut)"
