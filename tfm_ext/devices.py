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

def xla_scope(runtime, devices: Sequence[str]) -> Optional[str]:
  """Says what the train step compiles with XLA on `devices`, or None.

  `runtime.enable_xla` compiles where TFM compiles, with GPUs: each
  replica's task step ("task_step"). On CPUs, where XLA ran these models
  slower than TensorFlow's kernels (benchmarks/RESULTS.md#default-xla-off),
  TFM's configs that set it (`resnet_imagenet`) compile nothing, as in TFM;
  `runtime.xla_on_cpu` is the separate opt-in. There a task step applies
  gradients, which synchronizes replicas, and TensorFlow lets a compiled
  function synchronize only on GPUs, so the whole `strategy.run` compiles,
  on a single device only ("replicated_step").

  Raises:
    ValueError: `runtime.xla_on_cpu` with several non-GPU devices.
  """
  if all("GPU" in d.upper() for d in devices):
    return "task_step" if runtime.enable_xla else None
  if not getattr(runtime, "xla_on_cpu", False):
    return None
  if len(devices) == 1:
    return "replicated_step"
  raise ValueError(xla_unsupported_message(devices))


def xla_unsupported_message(devices: Sequence[str]) -> str:
  return (f"runtime.xla_on_cpu=true cannot compile a step replicated over "
          f"{len(devices)} non-GPU devices {list(devices)}: TensorFlow "
          "compiles replica synchronization only on GPUs. Use one device or "
          "set runtime.xla_on_cpu=false.")
