"""Every check of the config, before anything is written: the rule table.

TFM's overrides keep whatever YAML parsed (`trainer.train_steps=abc` is the
string 'abc', `=100.5` a float, `=null` None), and stock TFM checks a value
only where it is used: Orbit's `Controller`, TensorFlow's
`CheckpointManager`, the best-checkpoint exporter, `set_mixed_precision_policy`
raise on theirs once the run has started (some only after training), and a
few values are never refused and hang or quietly do nothing. Here each
raises `UsageError` up front, one message naming the field, its value and
what is accepted:

    trainer.steps_per_loop=0: give a positive whole number of steps.

The driver (`tfm_ext.run.driver.prepare`) calls them in this order:

1. `check_values`, before the strategy is built: `RULES`, one row a field
   (when the mode reads it, what it accepts), then the rules between
   fields (Orbit's `summary_interval` a multiple of `steps_per_loop`, a
   stepwise schedule's values and boundaries), types everywhere in
   `trainer` and `runtime` by their annotations (`_config_types`: a value
   of the wrong type is wrong in every mode), and `check_runtime` (the
   strategy's name, GPUs this host has).
2. `check_with_strategy`, once it exists: what needs its devices or
   replicas (XLA, the batch split), the file system (input patterns that
   match nothing, a checkpoint to evaluate, `task.init_checkpoint`).
3. `check_best_checkpoint_metric`: it builds the task's metrics, and a
   multi-worker strategy must come before the first TensorFlow variable.

What the values name is checked by the module that knows it, called in the
same sequence: the input files' records (`input_files`), the model_dir
(`tfm_ext.model_dir.usable`), a resumed config (`config_drift`).

A rule's field may be a pattern (`*` stands for any part of a dotted name)
that covers every field it matches, in the branch a oneof selects
(`learning_rate.type`): every learning rate of every schedule and warmup,
every dropout rate anywhere in `task`, every whole number anywhere
(TensorFlow counts steps in int64; Python's ints have no bound, and
`train_steps=10**20` failed only once the run had started).

TFM's meanings are kept: `validation_steps=-1` evaluates the whole
validation set, `validation_interval=0` evaluates only after training,
`checkpoint_interval=0` saves no checkpoint (a warning says so: the
reference ResNet launcher asks for it), `summary_interval=null` has Orbit
write no summaries inside loops, `max_to_keep=null` keeps every checkpoint,
an empty `best_checkpoint_eval_metric` exports no best checkpoint, a
negative `recovery_max_trials` turns the loss check off, and null stays
"unset" for any field without a rule here.
"""

import dataclasses
import difflib
import fnmatch
import functools
import math
import os
import re
from typing import Any, Callable, Dict, Iterable, Iterator, List, Tuple

from absl import logging
import tensorflow as tf

from official.core import base_task
from official.core import base_trainer
from official.core import config_definitions
from official.core import task_factory

from tfm_ext.config import _config_types
from tfm_ext.training import input_files
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import usable
from tfm_ext.base import devices as devices_lib
from tfm_ext.training import custom_trainer
from tfm_ext.base import registry
from tfm_ext.base import failures
from tfm_ext.base import logs as logs_lib

# The name base_trainer gives its validation loss metric, logged by every
# evaluation whose task reports a loss.
VALIDATION_LOSS = "validation_loss"

# What `official.modeling.performance.set_mixed_precision_policy` accepts;
# it compares with `==`, so TensorFlow's aliases ('half') pass too.
MIXED_PRECISION_DTYPES = (tf.float16, tf.bfloat16, tf.float32)

# `official.common.distribute_utils.get_distribution_strategy`'s names.
STRATEGIES = ("off", "one_device", "mirrored", "multi_worker_mirrored",
              "parameter_server", "tpu")
# The files of a checkpoint `prefix`: `prefix.index`, `prefix.data-0-of-1`.
_CHECKPOINT_FILE = re.compile(r"\.(index|data-\d+-of-\d+)$")
# Those that run on this host's GPUs (`num_gpus` of them, each worker's
# for multi_worker_mirrored; `off` on the default device, a GPU if any).
GPU_STRATEGIES = ("off", "one_device", "mirrored", "multi_worker_mirrored")

# Fields another check owns, with its own advice (`check_runtime`).
CHECKED_ELSEWHERE = ("runtime.dataset_num_private_threads",)

# TensorFlow's steps, sizes and seeds are int64.
INT64_MAX = 2**63 - 1

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Use:
  """What the mode does with the config: which rules apply."""
  params: config_definitions.ExperimentConfig
  trains: bool
  evaluates: bool

  @property
  def exports_best(self) -> bool:
    """Whether an exporter keeps best checkpoints (`best_checkpoint`'s rule)."""
    trainer_config = self.params.trainer
    return bool(self.evaluates
                and trainer_config.best_checkpoint_export_subdir
                and trainer_config.best_checkpoint_eval_metric)

  @property
  def checks_loss(self) -> bool:
    """Whether TFM's loss check (its `RecoveryCondition`) runs in training."""
    trials = self.params.trainer.recovery_max_trials
    return self.trains and _config_types.integer(trials) and trials >= 0


# `trainer.<section>.metric` turns on what `tfm_ext.actions.plateau` does.
PLATEAU_SECTIONS = ("early_stopping", "reduce_lr_on_plateau")


def _watches(section: str) -> Callable[["Use"], bool]:
  """Whether a training run watches its evaluations for `section`."""
  return lambda use: use.trains and bool(
      getattr(getattr(use.params.trainer, section, None), "metric", ""))


def _finite_at_least_0(value) -> bool:
  return (_config_types.number(value) and math.isfinite(value)
          and value >= 0)


@dataclasses.dataclass(frozen=True)
class Rule:
  """A field, when the mode reads it, and which values it accepts."""
  # Dotted, from the ExperimentConfig; with `*`, every field it matches.
  field: str
  applies: Callable[[Use], bool]
  accepts: Callable[[Any], bool]
  accepted: str  # Completes "give ...".


def _at_least(minimum: int, or_null: bool = False) -> Callable[[Any], bool]:
  return lambda v: (or_null and v is None) or (_config_types.integer(v) and v >= minimum)


def _sizes(value) -> bool:
  """A shape: null, or a list of sizes each positive or null (any)."""
  return value is None or (isinstance(value, (list, tuple)) and all(
      v is None or (_config_types.integer(v) and v >= 1) for v in value))


def _fits_int64(value) -> bool:
  """Whether every whole number in `value` (or in its list) is an int64."""
  if isinstance(value, (list, tuple)):
    return all(_fits_int64(v) for v in value)
  return (not _config_types.integer(value)
          or -INT64_MAX - 1 <= value <= INT64_MAX)


def _rate(value) -> bool:
  """A learning rate: finite, 0 or more, or null (TFM's unset)."""
  return value is None or (_config_types.number(value)
                           and math.isfinite(value) and value >= 0)


def _rates(value) -> bool:
  return value is None or (isinstance(value, (list, tuple))
                           and all(v is not None and _rate(v) for v in value))


def _ascending_steps(value) -> bool:
  return value is None or (
      isinstance(value, (list, tuple)) and all(_at_least(0)(v) for v in value)
      and all(a < b for a, b in zip(value, value[1:])))


def _dropout_rate(value) -> bool:
  """A fraction of units to drop; a switch (`flat_..._drop_rate`) passes."""
  return value is None or isinstance(value, bool) or (
      _config_types.number(value) and 0 <= value < 1)


def _mixed_precision(value) -> bool:
  if not value:  # None or "": TFM sets no policy.
    return value is None or value == ""
  try:
    return isinstance(value, str) and tf.as_dtype(value) in (
        MIXED_PRECISION_DTYPES)
  except TypeError:
    return False


def _subdir(value) -> bool:
  """A folder of its own inside model_dir: a relative path, no `.` or `..`
  (the exporter clears what it did not write there, and writes the state
  file of its best checkpoint)."""
  if not isinstance(value, str) or os.path.isabs(value) or "://" in value:
    return False
  parts = value.rstrip("/").split("/")
  return all(part not in ("", ".", "..") for part in parts)


def _always(use: Use) -> bool:
  del use
  return True


def _trains(use: Use) -> bool:
  return use.trains


def _evaluates(use: Use) -> bool:
  return use.evaluates


# Any optimizer config (a multi-task one may hold several), its schedule
# and warmup, whichever type each selects.
_SCHEDULE = "*optimizer_config.learning_rate."
_LEARNING_RATE_ACCEPTED = (
    "a number, 0 or more and finite (a negative learning rate climbs the "
    "loss), or null where the schedule leaves it unset")
# TFM's names of the fraction of units a layer drops (dropout_rate,
# attention_dropout, hidden_dropout_prob, stochastic_depth_drop_rate,
# dropatt, drop_connect_rate...), in any part of the task.
DROPOUT_FIELDS = ("task.*dropout*", "task.*drop_rate", "task.*drop_prob",
                  "task.*dropatt", "task.*dropcnn", "task.*drop_connect*",
                  "task.*drop_path*")

# In order: a field's rule comes before any rule or check that reads it.
RULES = (
    # Every whole number anywhere: Python's have no bound.
    Rule("*", _always, _fits_int64,
         f"a whole number TensorFlow holds (int64: at most {INT64_MAX})"),
    # Every mode: training runs to it, continuous_eval stops at it.
    Rule("trainer.train_steps", _always, _at_least(0),
         "a whole number of steps, 0 or more"),
    Rule("trainer.steps_per_loop", _trains, _at_least(1),
         "a positive whole number of steps"),
    Rule("trainer.summary_interval", _trains, _at_least(1, or_null=True),
         "a positive whole number of steps, a multiple of "
         "trainer.steps_per_loop, or null for no summaries inside loops"),
    # 0 or null: no checkpoint at all (Orbit saves only with an interval).
    Rule("trainer.checkpoint_interval", _trains, _at_least(0, or_null=True),
         "a positive whole number of steps, or 0 for no checkpoints"),
    Rule("trainer.validation_interval",
         lambda use: use.trains and use.evaluates, _at_least(0, or_null=True),
         "a positive whole number of steps, or 0 to evaluate only after "
         "training"),
    Rule("trainer.validation_steps", _evaluates,
         lambda v: _config_types.integer(v) and (v > 0 or v == -1),
         "a positive whole number of steps, or -1 for the whole validation "
         "set"),
    # An evaluator's checkpoint manager takes it too.
    Rule("trainer.max_to_keep", _always, _at_least(1, or_null=True),
         "a positive number of checkpoints, or null to keep them all"),
    Rule("task.train_data.global_batch_size", _trains, _at_least(1),
         "a positive whole number of examples"),
    Rule("task.validation_data.global_batch_size", _evaluates, _at_least(1),
         "a positive whole number of examples"),
    Rule("trainer.best_checkpoint_metric_comp", lambda use: use.exports_best,
         lambda v: v in ("higher", "lower"),
         "'higher' or 'lower' (which values of "
         "trainer.best_checkpoint_eval_metric are better)"),
    Rule("trainer.best_checkpoint_top_k", lambda use: use.exports_best,
         _at_least(1), "a positive number of best checkpoints to keep"),
    Rule("trainer.best_checkpoint_export_subdir", lambda use: use.exports_best,
         _subdir, "a folder of its own inside --model_dir, as TFM's "
         "'best_ckpt': a relative path without '.' or '..' (the exporter "
         "clears what it did not write there), or '' for no best checkpoint"),
    Rule("trainer.recovery_max_trials", _trains, _config_types.integer,
         "a whole number: how often to go back to the last checkpoint after "
         "a NaN loss or one over trainer.loss_upper_bound (0: fail at once; "
         "negative: no loss check)"),
    Rule("trainer.loss_upper_bound", lambda use: use.checks_loss, _config_types.number,
         "a number (the loss above which trainer.recovery_max_trials "
         "applies)"),
    Rule("trainer.recovery_begin_steps", lambda use: use.checks_loss,
         _config_types.integer, "a whole number of steps"),
    # TFM's ranking experiments: false runs TFM's Keras compile/fit loop
    # (official/recommendation/ranking/train.py), which is not this one.
    Rule("trainer.use_orbit", _always, lambda v: v is True,
         "true: tfm_ext runs Orbit's custom loop, as TFM's ranking train.py "
         "does with true (false asks for TFM's Keras compile/fit loop: "
         "run official/recommendation/ranking/train.py for that)"),
    Rule("runtime.mixed_precision_dtype", _always, _mixed_precision,
         "float16, bfloat16 or float32 (TFM sets the policy mixed_float16, "
         "mixed_bfloat16 or float32 from it), or null for none"),
    # Every learning rate of every schedule and warmup: learning_rate,
    # initial_, end_, pre_offset_, warmup_learning_rate...
    Rule("*optimizer_config.*learning_rate", _trains, _rate,
         _LEARNING_RATE_ACCEPTED),
    Rule(_SCHEDULE + "*.values", _trains, _rates,
         "a list of learning rates, each a number, 0 or more and finite"),
    Rule(_SCHEDULE + "cosine.alpha", _trains, _rate,
         "a number, 0 or more and finite: the fraction of "
         "initial_learning_rate the decay ends at (a negative one ends below "
         "0)"),
    Rule(_SCHEDULE + "*.boundaries", _trains, _ascending_steps,
         "a list of steps, each a whole number, 0 or more, in strictly "
         "ascending order"),
    # A decay over 0 steps divides by 0: a NaN learning rate.
    Rule(_SCHEDULE + "*decay_steps", _trains, _at_least(1, or_null=True),
         "a positive whole number of steps"),
    Rule("*optimizer_config.warmup.*.warmup_steps", _trains,
         _at_least(0, or_null=True), "a whole number of steps, 0 or more"),
    # A size of 0 or less aborts inside TensorFlow's native code (oneDNN:
    # exit 134, no word, the lease left behind) where Keras does not refuse
    # it first: the model is built in every mode.
    # (TFM's data configs use -1 for "unset": only the model's and the
    # shapes the input makes are checked.)
    Rule("task.model.num_classes", _always, _at_least(1, or_null=True),
         "a positive whole number of classes"),
    *(Rule(field, _always, _sizes,
           "a list of positive sizes (null for any), as [224, 224, 3]")
      for field in ("task.model.input_size", "task.*_data.output_size",
                    "task.*_data.feature_shape")),
    # Keras builds a Dropout layer only with a rate in [0, 1], and drops
    # every unit at 1: the model is built in every mode.
    *(Rule(field, _always, _dropout_rate,
           "a number from 0 to below 1: the fraction of units dropped")
      for field in DROPOUT_FIELDS),
    # Early stopping and the plateau (`tfm_ext.actions.plateau`): a value
    # is checked where it is given, before a metric turns them on.
    *(rule for section in PLATEAU_SECTIONS for rule in (
        Rule(f"trainer.{section}.mode", _always,
             lambda v: v in ("auto", "min", "max"),
             "'min', 'max' or 'auto' (min for a loss or an error)"),
        Rule(f"trainer.{section}.patience", _always, _at_least(1),
             "a whole number of evaluations, 1 or more"),
        Rule(f"trainer.{section}.min_delta", _always,
             _finite_at_least_0, "a number, 0 or more"))),
    Rule("trainer.reduce_lr_on_plateau.factor",
         _always,
         lambda v: _config_types.number(v) and 0 < v < 1,
         "a number above 0 and below 1: what the learning rate is multiplied "
         "by on a plateau"),
    Rule("trainer.reduce_lr_on_plateau.min_lr",
         _always, _finite_at_least_0,
         "a learning rate, 0 or more"),
)


def check_values(params: config_definitions.ExperimentConfig, *,
                 trains: bool, evaluates: bool) -> None:
  """Raises `UsageError` for the first config value the mode cannot run.

  `RULES`, the rules between fields, the types, then `check_runtime`.
  Needs no TensorFlow runtime: call it before the strategy is built. Logs a
  warning for a training run that will save no checkpoint.
  """
  use = Use(params=params, trains=trains, evaluates=evaluates)
  leaves = dict(_leaves(params.as_dict()))
  for rule in RULES:
    if not rule.applies(use):
      continue
    for field, value in _matching(params, rule.field, leaves):
      if not rule.accepts(value):
        raise UsageError(f"{field}={_config_types.show(value)}: give "
                         f"{rule.accepted}.")
  if trains:
    _check_stepwise(leaves)
    _warn_of_schedule_end(leaves, params.trainer.train_steps)
  if _watches("reduce_lr_on_plateau")(use):
    _check_min_lr(params.trainer.reduce_lr_on_plateau.min_lr, leaves)
  if evaluates and params.runtime.distribution_strategy == "parameter_server":
    # Orbit's evaluation runs on the coordinator's own devices, outside the
    # ParameterServerStrategy's workers; TFM's train_lib fails there too.
    raise UsageError(
        "runtime.distribution_strategy=parameter_server trains only: run "
        "--mode=train on the cluster, and evaluate beside it as TensorFlow "
        "does for parameter-server training (a sidecar evaluator): "
        "--mode=continuous_eval on the same --model_dir in a process of its "
        "own, with --params_override=runtime.distribution_strategy=one_device "
        "(or mirrored).")
  interval = params.trainer.summary_interval
  steps_per_loop = params.trainer.steps_per_loop
  if trains and interval is not None and interval % steps_per_loop:
    # Orbit's Controller refuses it, but not with the callable
    # steps_per_loop that `assembly` gives it.
    raise UsageError(
        f"trainer.summary_interval={interval} is not a multiple of "
        f"trainer.steps_per_loop={steps_per_loop}: give a multiple of "
        f"{steps_per_loop} (Orbit's Controller requires one), or null for no "
        "summaries inside loops.")
  for section in ("trainer", "runtime"):
    _config_types.check_types(getattr(params, section), section,
                              skip=CHECKED_ELSEWHERE)
  if trains and not params.trainer.checkpoint_interval:
    logging.warning(
        "trainer.checkpoint_interval=%s: this run saves no checkpoint, so "
        "what it trains is lost when it ends; give a positive number of "
        "steps to keep it.",
        _config_types.show(params.trainer.checkpoint_interval))
  _check_task_name(params.task)
  check_runtime(params.runtime)


def _check_task_name(task: config_definitions.TaskConfig) -> None:
  """Refuses a `task.name` that is not the task the run trains.

  The experiment's task config type chooses the task (`task_factory`);
  TFM reads `task.name` only in its multi-task runs, so a name that reads
  as choosing another task (a YAML's `task: {name: ...}`) would train the
  experiment's own task without a word. Its own task's class name, in
  either spelling, is accepted as the label it is.
  """
  name = getattr(task, "name", None)
  if not name:
    return
  try:
    chosen = task_factory.get_task_cls(type(task)).__name__
  except (KeyError, ValueError, LookupError):
    chosen = ""
  if chosen and _spelled_alike(name, chosen):
    return
  registered = sorted({cls.__name__ for cls in
                       task_factory._REGISTERED_TASK_CLS.values()})  # pylint: disable=protected-access
  raise UsageError(
      f"task.name={name!r} chooses no task: the experiment's task config "
      f"({type(task).__name__}) chooses it, "
      f"{chosen or 'the task its config type registers'}; TFM reads "
      "task.name only in multi-task runs. Remove task.name (or give "
      f"{chosen or 'that task'}'s name), or choose the --experiment of the "
      f"task you mean (registered tasks: {', '.join(registered)}).")


def _spelled_alike(name: str, class_name: str) -> bool:
  """`DigitsTask`, `digits_task`, `digits`: the same task's name."""
  def squashed(text):
    return text.replace("_", "").lower()
  return squashed(name) in (squashed(class_name),
                            squashed(class_name).removesuffix("task"))


def check_runtime(runtime) -> None:
  """Checks the runtime config before any strategy is built."""
  strategy = str(runtime.distribution_strategy)  # Lowercased by params.build.
  if strategy not in STRATEGIES:
    raise UsageError(registry.unknown_name_message(
        "runtime.distribution_strategy", strategy, list(STRATEGIES),
        known_as="TFM's strategies"))
  num_gpus = runtime.num_gpus or 0  # Typed by `check_values` (null: 0).
  if num_gpus < 0:
    raise UsageError(f"runtime.num_gpus={num_gpus}: give a number of GPUs, "
                     "0 or more (0: CPUs only).")
  if strategy in ("off", "one_device") and num_gpus > 1:
    raise UsageError(
        f"runtime.distribution_strategy={strategy} runs on one device but "
        f"runtime.num_gpus={num_gpus}; use mirrored for several GPUs.")
  if strategy in GPU_STRATEGIES:
    _check_gpus_present(num_gpus)
  threads = runtime.dataset_num_private_threads
  if threads is not None and (not _config_types.integer(threads) or threads < 0):
    raise UsageError(
        f"runtime.dataset_num_private_threads={threads!r}: give a number of "
        "threads (0: tf.data's own pool), or leave it unset (half the cores "
        "when training on CPUs, else tf.data's pool).")
  if strategy == "tpu" and not runtime.tpu:
    raise UsageError(
        "runtime.distribution_strategy=tpu needs a TPU address: pass --tpu "
        "(a Cloud TPU name or grpc://host:8470) or set runtime.tpu.")


def check_with_strategy(params: config_definitions.ExperimentConfig, *,
                        trains: bool, evaluates: bool, needs_checkpoint: bool,
                        model_dir: str,
                        strategy: tf.distribute.Strategy) -> None:
  """Raises `UsageError` for the first problem the strategy or files show.

  What needs the strategy's devices or replicas, and what the config
  names on the file system: input patterns, the checkpoint a mode that
  does not train needs, `task.init_checkpoint`.
  """
  devices = devices_lib.local_devices(strategy)
  if trains:
    try:
      devices_lib.xla_scope(params.runtime, devices)
    except ValueError as e:
      raise UsageError(str(e)) from e
  if (trains and params.trainer.train_tf_while_loop
      and not params.trainer.train_tf_function):
    raise UsageError(
        "trainer.train_tf_while_loop=true needs trainer.train_tf_function="
        "true (a tf.while_loop runs only inside a tf.function); set "
        "train_tf_while_loop=false to train eagerly.")
  num_replicas = strategy.num_replicas_in_sync
  datasets = []
  if trains:
    datasets.append(("task.train_data", params.task.train_data))
  if evaluates:
    datasets.append(("task.validation_data", params.task.validation_data))
  for where, data in datasets:
    _check_batch(where, data, num_replicas)
    if input_files.reads_files(params.task, data):
      _check_input_path(where, data)
  if needs_checkpoint and not checkpoint_state.latest(model_dir):
    raise UsageError(
        f"No checkpoint in --model_dir={model_dir!r} to evaluate or export. "
        "Train first "
        "(--mode=train or train_and_eval), or point --model_dir at a "
        "directory that holds checkpoints.")
  if trains and not checkpoint_state.latest(model_dir):
    check_init_checkpoint(getattr(params.task, "init_checkpoint", None))


def check_init_checkpoint(source) -> None:
  """Refuses a `task.init_checkpoint` that holds no checkpoint to start from.

  Read as TFM's tasks read it (`base_task.Task.initialize`, the vision
  tasks): a directory stands for its latest checkpoint
  (`tf.train.latest_checkpoint`), anything else is a checkpoint prefix
  that `tf.train.Checkpoint.read` restores. Left to them, a directory
  without one trains from scratch, said only in an INFO line; a missing
  path or another file fails once the run has started; an `.index` file
  restores nothing. Call it only for a run that trains and has no
  checkpoint of its own: the task reads it only then (the checkpoint
  manager's `init_fn`), a resumed run ignores it.
  """
  if not source:
    return
  field = f"task.init_checkpoint={source!r}"
  todo = ("Give a checkpoint prefix (.../ckpt-1000, the name before .index), "
          "a directory a run saved checkpoints in, or task.init_checkpoint="
          "'' to train from scratch.")
  path = source
  if tf.io.gfile.isdir(source):
    path = tf.train.latest_checkpoint(source)
    if not path:
      indexes = sorted(tf.io.gfile.glob(os.path.join(source, "*.index")))
      seen = (f" (it holds {os.path.basename(indexes[-1])}: give its prefix "
              f"{indexes[-1][:-len('.index')]!r})" if indexes else "")
      raise UsageError(
          f"{field} is a directory without a checkpoint that "
          "tf.train.latest_checkpoint finds (a 'checkpoint' state file "
          f"naming one){seen}: TFM would train from scratch. {todo}")
  prefix = _CHECKPOINT_FILE.sub("", path)
  if prefix != path and tf.io.gfile.exists(prefix + ".index"):
    raise UsageError(f"{field} is a file of the checkpoint {prefix!r}, "
                     "which TensorFlow reads by its prefix (read by this "
                     f"file's name, it restores nothing): give {prefix!r}.")
  try:
    variables = tf.train.load_checkpoint(path).get_variable_to_shape_map()
  except tf.errors.NotFoundError as e:
    raise UsageError(f"{field} names nothing: no directory, file or "
                     f"checkpoint prefix (no {path}.index). {todo}") from e
  except (tf.errors.OpError, ValueError) as e:
    reason = (e.message if isinstance(e, tf.errors.OpError) else str(e))
    raise UsageError(f"{field}: {path!r} is not a checkpoint TensorFlow "
                     f"can read ({reason.splitlines()[0]}). {todo}") from e
  if not variables:
    raise UsageError(f"{field}: {path!r} holds no variables, so nothing "
                     f"would be restored from it. {todo}")


def check_best_checkpoint_metric(params: config_definitions.ExperimentConfig,
                                 trainer_cls: type, *, evaluates: bool,
                                 trains: bool = False) -> None:
  """Refuses a best-checkpoint metric that the evaluations will not log.

  The logs of TFM's and `CustomTrainer`'s `eval_end` are the task's
  `build_metrics(training=False)`, the model's own `model.metrics`,
  `validation_loss` and what the task's `reduce_aggregated_logs` returns.
  The check builds the task and its metrics (the model too, only if the
  name is not among those), and refuses nothing when the names cannot be
  known without running: a trainer with its own `eval_end`, a task with its
  own `reduce_aggregated_logs`, metrics or a model that cannot be built
  here. Needs the TensorFlow runtime: call it once the strategy is built.

  So too the metrics that early stopping and the plateau watch
  (`trainer.early_stopping.metric`...), in a training run: one that does
  not evaluate is refused, since they would never act.
  """
  watched = []
  if Use(params=params, trains=False, evaluates=evaluates).exports_best:
    metric = params.trainer.best_checkpoint_eval_metric
    watched.append((
        "trainer.best_checkpoint_eval_metric", metric,
        "trainer.best_checkpoint_eval_metric='' to keep no best checkpoint"))
  for section in PLATEAU_SECTIONS:
    metric = getattr(getattr(params.trainer, section, None), "metric", "")
    if not metric or not _watches(section)(Use(params, trains, evaluates)):
      continue
    field = f"trainer.{section}.metric"
    if not evaluates:
      raise UsageError(
          f"{field}={metric!r} watches the evaluations, and this mode runs "
          "none: use --mode=train_and_eval, or leave the metric empty.")
    watched.append((field, metric, f"{field}='' to turn it off"))
  for field, metric, off in watched:
    _check_logged(params, trainer_cls, field, metric, off)


def _check_logged(params, trainer_cls: type, field: str, metric: str,
                  off: str) -> None:
  """Refuses `metric` if the evaluations will not log it; see above.

  The whole name: a nested log is named by its keys joined with `|`
  (TFM's separator, as its best-checkpoint exporter reads it), and each
  key must be there, not only the first. A metric whose result is one
  number has no keys below it (`accuracy|top1` is never logged).
  """
  if _overrides(trainer_cls, "eval_end", (base_trainer.Trainer,
                                          custom_trainer.CustomTrainer)):
    return
  task = _built(lambda: task_factory.get_task(params.task))
  if task is None or _overrides(type(task), "reduce_aggregated_logs",
                                (base_task.Task,)):
    return
  logged = _built(lambda: _logged(task.build_metrics(training=False)))
  if logged is None:
    return
  logged[VALIDATION_LOSS] = None
  if metric not in logged:
    model_logged = _built(lambda: _logged(task.build_model().metrics))
    if model_logged is None:
      return
    logged.update(model_logged)
  if metric in logged:
    return
  known = list(logged)
  close = difflib.get_close_matches(metric, known, n=1)
  guess = f" Did you mean {close[0]!r}?" if close else ""
  root = metric.split("|")[0]
  nested = (f" ({root!r} logs one number: it has no {metric[len(root):]!r}"
            " below it)" if root in logged else "")
  raise UsageError(
      f"{field}={metric!r}: the evaluations of {type(task).__name__} do not "
      f"log it{nested}; they log {', '.join(repr(n) for n in known)}.{guess} "
      f"Give one of them whole (a nested log's keys joined with '|'), or "
      f"{off}.")


def _logged(metrics) -> Dict[str, None]:
  """The names the logs of `metrics` hold, a metric whose result is a
  mapping by the paths of its leaves (`name|key`), as TFM nests them."""
  names = {}
  for metric in metrics:
    try:
      result = metric.result()
    except Exception as e:  # pylint: disable=broad-except
      failures.reraise_interrupt(e)
      result = None  # Known by its name only.
    if isinstance(result, dict):
      names.update((f"{metric.name}|{path}", None)
                   for path, _ in logs_lib.leaves(result, "|"))
    else:
      names[metric.name] = None
  return names


def _check_stepwise(leaves: Dict[str, Any]) -> None:
  """Refuses a stepwise schedule whose values do not match its boundaries."""
  for field, boundaries in leaves.items():
    if not fnmatch.fnmatchcase(field, _SCHEDULE + "stepwise.boundaries"):
      continue
    values = leaves.get(field[:-len("boundaries")] + "values")
    if isinstance(boundaries, list) and isinstance(values, list) and (
        len(values) != len(boundaries) + 1):
      raise UsageError(
          f"{field[:-len('.boundaries')]} has {len(boundaries)} boundaries "
          f"and {len(values)} values: give one value more than boundaries "
          "(the learning rate before the first boundary, then after each).")


def _warn_of_schedule_end(leaves: Dict[str, Any], train_steps: int) -> None:
  """Warns of a decay that ends before training does, naming its field.

  A cosine or polynomial schedule holds its end value (0 by default) from
  `decay_steps` on: raising `train_steps` past it alone trains the rest at
  that rate, which is rarely what was meant.
  """
  for kind, end in (("cosine", "alpha"),
                    ("polynomial", "end_learning_rate")):
    field = f"trainer.optimizer_config.learning_rate.{kind}.decay_steps"
    chosen = leaves.get("trainer.optimizer_config.learning_rate.type")
    decay_steps = leaves.get(field)
    if chosen != kind or not isinstance(decay_steps, int) or not (
        0 < decay_steps < train_steps):
      continue
    if kind == "polynomial" and leaves.get(field[:-len("decay_steps")]
                                           + "cycle"):
      continue
    logging.warning(
        "%s=%d ends before trainer.train_steps=%d: from step %d on, the "
        "learning rate stays at the schedule's end (%s.%s=%s). Set %s to "
        "trainer.train_steps if the decay should span the run.", field,
        decay_steps, train_steps, decay_steps, field[:-len(".decay_steps")],
        end, leaves.get(field[:-len("decay_steps")] + end), field)


def _check_min_lr(min_lr, leaves: Dict[str, Any]) -> None:
  """Refuses a plateau's `min_lr` at or above every rate the schedule gives.

  The factor never takes the rate below `min_lr`, so with one at or above
  the schedule's highest rate (its initial rate, a constant rate, a
  stepwise schedule's largest value) no reduction would ever change it.
  """
  rates = []
  for field, value in leaves.items():
    if not fnmatch.fnmatchcase(field, _SCHEDULE + "*"):
      continue
    name = field.rsplit(".", 1)[-1]
    if name.endswith("learning_rate") and _config_types.number(value):
      rates.append((value, field))
    elif name == "values" and isinstance(value, list) and value:
      rates.append((max(value), field))
  if not rates:
    return  # Not a TFM schedule here: the plateau says what it does.
  peak, where = max(rates)
  if min_lr >= peak:
    raise UsageError(
        f"trainer.reduce_lr_on_plateau.min_lr={_config_types.show(min_lr)} "
        f"is at or above the learning rate ({where}={peak:g}): the plateau "
        "could never lower it. Give a min_lr below it (0: no floor), or "
        "trainer.reduce_lr_on_plateau.metric='' to turn the plateau off.")


def _get(params, field: str):
  return functools.reduce(lambda obj, name: getattr(obj, name, _MISSING),
                          field.split("."), params)


def _matching(params, field: str,
              leaves: Dict[str, Any]) -> List[Tuple[str, Any]]:
  """`(field, value)` of what a rule's `field` names, in the config's order.

  A pattern matches the fields of `leaves` (the config as `as_dict` gives
  it: only the selected branch of a oneof); a plain field is looked up,
  and left out if the config lacks it.
  """
  if "*" in field:
    return [(name, value) for name, value in leaves.items()
            if fnmatch.fnmatchcase(name, field)]
  value = _get(params, field)
  return [] if value is _MISSING else [(field, value)]


def _leaves(tree: Dict[str, Any], prefix: str = ""
            ) -> Iterator[Tuple[str, Any]]:
  """`(dotted field, value)` of every value of `tree` that is not a mapping.

  A list of mappings (sub-configs) is walked too, as `field[i]`.
  """
  for name, value in tree.items():
    field = f"{prefix}.{name}" if prefix else str(name)
    if isinstance(value, dict):
      yield from _leaves(value, field)
    elif isinstance(value, (list, tuple)) and any(
        isinstance(v, dict) for v in value):
      for i, item in enumerate(value):
        if isinstance(item, dict):
          yield from _leaves(item, f"{field}[{i}]")
        else:
          yield f"{field}[{i}]", item
    else:
      yield field, value


def _overrides(cls: type, method: str, bases) -> bool:
  """Whether `cls` has its own `method`, not the one of any of `bases`."""
  return all(getattr(cls, method, None) is not getattr(base, method)
             for base in bases)


def _built(build: Callable[[], Any]) -> Any:
  """What `build` returns, or None if it fails here.

  A task, its metrics or its model may need what exists only in the run
  (files, devices, an initialized checkpoint); the run then reports its
  own error. Here a failure only means the names are not known.
  """
  try:
    return build()
  except Exception as e:  # pylint: disable=broad-except
    failures.reraise_interrupt(e)
    logging.info("Could not list the evaluation's metric names here.",
                 exc_info=True)
    return None


def _check_gpus_present(num_gpus: int) -> None:
  """Refuses `runtime.num_gpus` above the GPUs TensorFlow sees here.

  TFM builds its strategy on `GPU:0`..`GPU:<num_gpus - 1>` without
  looking: on a host with fewer, a run fails once started or runs on
  the CPU (soft placement), said nowhere.
  """
  present = len(tf.config.list_physical_devices("GPU"))
  if num_gpus > present:
    seen = f"only {present}" if present else "no GPU"
    raise UsageError(
        f"runtime.num_gpus={num_gpus}, but TensorFlow sees {seen} on this "
        "host (tf.config.list_physical_devices('GPU'); a TensorFlow "
        "without CUDA, missing drivers or CUDA_VISIBLE_DEVICES hide them): "
        f"give runtime.num_gpus={present} or less (0: CPUs only).")


def _check_batch(where: str, data, num_replicas: int) -> None:
  batch = getattr(data, "global_batch_size", None)
  if batch and batch % num_replicas:
    raise UsageError(
        f"{where}.global_batch_size={batch} cannot be split evenly across "
        f"{num_replicas} replicas; use a multiple of {num_replicas}.")


def _patterns(input_path) -> List[str]:
  if isinstance(input_path, str):
    return [p for p in input_path.split(",") if p]
  if isinstance(input_path, Iterable):
    return [p for item in input_path for p in _patterns(item)]
  return []  # A Config of named paths (combined datasets): the task checks.


def _check_input_path(where: str, data) -> None:
  if getattr(data, "tfds_name", ""):
    return
  for pattern in _patterns(getattr(data, "input_path", "")):
    if files.local_path(pattern) is None:  # A store that may not answer.
      matched = usable.within(lambda p=pattern: tf.io.gfile.glob(p),
                              f"{where}.input_path={pattern!r}",
                              usable.store_of(pattern))
    else:
      matched = tf.io.gfile.glob(pattern)
    if not matched:
      raise UsageError(
          f"{where}.input_path pattern {pattern!r} matches no file.")
