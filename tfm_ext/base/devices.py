"""Where a run's replicas live, how many cores it may use, what compiles.

What XLA compiles (`xla_scope`, `xla_compiled`) and what runs as a graph
(`traced_or_eager`).
"""

import os
from typing import Callable, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfm_ext.base import failures


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


def xla_compiled(runtime, devices: Sequence[str], *, task_step: Callable,
                 replicated_step: Callable) -> Tuple[Callable, Callable]:
  """`(task_step, replicated_step)`, the one XLA compiles here jit-compiled.

  Which one, if any, is `xla_scope`'s answer for `runtime` on `devices`.
  """
  where = xla_scope(runtime, devices)
  if runtime.enable_xla and where is None:
    logging.info("runtime.enable_xla compiles nothing on %s, as in TFM (XLA "
                 "with GPUs only); runtime.xla_on_cpu=true compiles the step "
                 "on a CPU.", list(devices))
  if where == "task_step":
    task_step = tf.function(task_step, jit_compile=True)
  elif where == "replicated_step":
    replicated_step = tf.function(replicated_step, jit_compile=True)
  return task_step, replicated_step


def traced_or_eager(fn: Callable) -> Callable:
  """`fn` as a `tf.function`, or as it is if it cannot be traced.

  Python logic on tensor values, say: eager still runs it, and a real bug
  raises there with its own traceback. Tracing runs nothing.
  """
  traced = tf.function(fn, autograph=False)
  try:
    traced.get_concrete_function()
  except Exception as e:  # pylint: disable=broad-except
    failures.reraise_interrupt(e)
    logging.warning("%s cannot be traced (%s: %s); it runs eagerly.",
                    getattr(fn, "__name__", fn), type(e).__name__, e)
    return fn
  return traced
