"""Checks that need the strategy or the file system, run before any write.

Each failure raises `UsageError`, so a bad run ends before anything is
written to `model_dir` and before any model is built.
"""

import os
import re
from typing import Iterable, List

import tensorflow as tf

from official.core import config_definitions

from tfm_ext.config import _types
from tfm_ext.config import input_files
from tfm_ext.errors import UsageError
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.run import devices as devices_lib
from tfm_ext.training import registry

# `official.common.distribute_utils.get_distribution_strategy`'s names.
STRATEGIES = ("off", "one_device", "mirrored", "multi_worker_mirrored",
              "parameter_server", "tpu")
# The files of a checkpoint `prefix`: `prefix.index`, `prefix.data-0-of-1`.
_CHECKPOINT_FILE = re.compile(r"\.(index|data-\d+-of-\d+)$")
# Those that run on this host's GPUs (`num_gpus` of them, each worker's
# for multi_worker_mirrored; `off` on the default device, a GPU if any).
GPU_STRATEGIES = ("off", "one_device", "mirrored", "multi_worker_mirrored")


def check(params: config_definitions.ExperimentConfig, *, trains: bool,
          evaluates: bool, needs_checkpoint: bool, model_dir: str,
          strategy: tf.distribute.Strategy) -> None:
  """Raises `UsageError` for the first problem a run would hit later."""
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


def check_runtime(runtime) -> None:
  """Checks the runtime config before any strategy is built."""
  strategy = str(runtime.distribution_strategy)  # Lowercased by params.build.
  if strategy not in STRATEGIES:
    raise UsageError(registry.unknown_name_message(
        "runtime.distribution_strategy", strategy, list(STRATEGIES),
        known_as="TFM's strategies"))
  num_gpus = runtime.num_gpus or 0  # Types are config_checks' (null: 0).
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
  if threads is not None and (not _types.is_a(threads, int) or threads < 0):
    raise UsageError(
        f"runtime.dataset_num_private_threads={threads!r}: give a number of "
        "threads (0: tf.data's own pool), or leave it unset (half the cores "
        "when training on CPUs, else tf.data's pool).")
  if strategy == "tpu" and not runtime.tpu:
    raise UsageError(
        "runtime.distribution_strategy=tpu needs a TPU address: pass --tpu "
        "(a Cloud TPU name or grpc://host:8470) or set runtime.tpu.")


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
    if not tf.io.gfile.glob(pattern):
      raise UsageError(
          f"{where}.input_path pattern {pattern!r} matches no file.")
