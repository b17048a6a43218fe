"""Where a run's replicas live, how many cores it may use, what XLA compiles."""

import os
from typing import Optional, Sequence

import tensorflow as tf


def local_devices(strategy: tf.distribute.Strategy) -> Sequence[str]:
  """The devices of this worker's replicas; with no strategy, the one in use."""
  try:
    return strategy.extended.worker_devices
  except RuntimeError:  # The default strategy (distribution_strategy=off).
    gpus = tf.config.list_logical_devices("GPU")
    return [(gpus or tf.config.list_logical_devices("CPU"))[0].name]

def usable_cores() -> int:
  """The cores this process may run on (its affinity, where the OS has one)."""
  if hasattr(os, "sched_getaffinity"):  # Not on macOS.
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1

def xla_scope(devices: Sequence[str]) -> Optional[str]:
  """Says what XLA can compile on `devices`, or None if nothing.

  A task step applies gradients, which synchronizes replicas. TensorFlow lets
  a compiled function synchronize only on GPUs (TFM's case): there each
  replica's task step is compiled ("task_step"). On a single device (CPU
  included) the whole `strategy.run` is compiled, so the synchronization
  happens inside the compiled function ("replicated_step").
  """
  if all("GPU" in d.upper() for d in devices):
    return "task_step"
  if len(devices) == 1:
    return "replicated_step"
  return None

def xla_unsupported_message(devices: Sequence[str]) -> str:
  return (f"runtime.enable_xla=true cannot compile a step replicated over "
          f"{len(devices)} non-GPU devices {list(devices)}: TensorFlow "
          "compiles replica synchronization only on GPUs. Use one device or "
          "set runtime.enable_xla=false.")
