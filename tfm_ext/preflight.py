"""Checks that need the strategy or the file system, run before any write.

Each failure raises `UsageError`, so a bad run ends before anything is
written to `model_dir` and before any model is built.
"""

from typing import Iterable, List

import tensorflow as tf

from official.core import config_definitions

from tfm_ext import checkpoint_state
from tfm_ext import devices as devices_lib
from tfm_ext import registry
from tfm_ext.errors import UsageError

# `official.common.distribute_utils.get_distribution_strategy`'s names.
STRATEGIES = ("off", "one_device", "mirrored", "multi_worker_mirrored",
              "parameter_server", "tpu")


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
    _check_input_path(where, data)
  if needs_checkpoint and not checkpoint_state.latest(model_dir):
    raise UsageError(
        f"No checkpoint in --model_dir={model_dir!r} to evaluate or export. "
        "Train first "
        "(--mode=train or train_and_eval), or point --model_dir at a "
        "directory that holds checkpoints.")


def check_runtime(runtime) -> None:
  """Checks the runtime config before any strategy is built."""
  strategy = str(runtime.distribution_strategy)  # Lowercased by params.build.
  if strategy not in STRATEGIES:
    raise UsageError(registry.unknown_name_message(
        "runtime.distribution_strategy", strategy, list(STRATEGIES),
        known_as="TFM's strategies"))
  if strategy in ("off", "one_device") and runtime.num_gpus > 1:
    raise UsageError(
        f"runtime.distribution_strategy={strategy} runs on one device but "
        f"runtime.num_gpus={runtime.num_gpus}; use mirrored for several GPUs.")
  threads = runtime.dataset_num_private_threads
  if threads is not None and (isinstance(threads, bool)
                              or not isinstance(threads, int) or threads < 0):
    raise UsageError(
        f"runtime.dataset_num_private_threads={threads!r}: give a number of "
        "threads (0: tf.data's own pool), or leave it unset (half the cores "
        "when training on CPUs, else tf.data's pool).")
  if strategy == "tpu" and not runtime.tpu:
    raise UsageError(
        "runtime.distribution_strategy=tpu needs a TPU address: pass --tpu "
        "(a Cloud TPU name or grpc://host:8470) or set runtime.tpu.")


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
