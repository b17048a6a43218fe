"""What XLA compiles where: TFM's `enable_xla` on GPUs, our opt-in on a CPU."""

import pytest
import tensorflow as tf

from official.core import config_definitions

from tfm_ext.model_dir import params_file
from tfm_ext.base import devices
from tfm_ext.config import added_fields

GPUS = ["/job:localhost/replica:0/task:0/device:GPU:0",
        "/job:localhost/replica:0/task:0/device:GPU:1"]
CPU = ["/job:localhost/replica:0/task:0/device:CPU:0"]
CPUS = CPU + ["/job:localhost/replica:0/task:0/device:CPU:1"]


def _runtime(**fields):
  runtime = config_definitions.RuntimeConfig()
  runtime.override(
      dict(added_fields.RUNTIME_FIELDS, **fields), is_strict=False)
  return runtime


@pytest.mark.parametrize("fields, on, scope", [
    ({"enable_xla": True}, GPUS, "task_step"),
    ({"enable_xla": False}, GPUS, None),
    ({"enable_xla": True}, CPU, None),  # TFM compiles only with GPUs.
    ({"xla_on_cpu": True}, CPU, "replicated_step"),
    ({"xla_on_cpu": True}, GPUS, None),  # On GPUs, enable_xla decides.
    ({}, CPUS, None),
])
def test_xla_compiles_where_tfm_does_and_on_a_cpu_by_opt_in(fields, on, scope):
  assert devices.xla_scope(_runtime(**fields), on) == scope


def test_xla_on_several_cpus_is_refused_naming_the_field():
  with pytest.raises(ValueError, match="runtime.xla_on_cpu=true cannot "
                     "compile a step replicated over 2 non-GPU devices"):
    devices.xla_scope(_runtime(xla_on_cpu=True), CPUS)


def _jit_compiled(fn) -> bool:
  # What `tf.function(..., jit_compile=True)` records.
  return getattr(fn, "_jit_compile", None) is True


@pytest.mark.parametrize("fields, on, compiled", [
    ({"enable_xla": True}, GPUS, "task_step"),
    ({"xla_on_cpu": True}, CPU, "replicated_step"),
    ({"enable_xla": True}, CPU, None),
])
def test_the_step_xla_scope_names_is_the_one_compiled(fields, on, compiled):
  def task_step():
    return tf.constant(1.0)

  def replicated_step():
    return tf.constant(2.0)

  task, replicated = devices.xla_compiled(
      _runtime(**fields), on, task_step=task_step,
      replicated_step=replicated_step)
  assert _jit_compiled(task) == (compiled == "task_step")
  assert _jit_compiled(replicated) == (compiled == "replicated_step")
  assert (task is task_step) == (compiled != "task_step")
  assert (replicated is replicated_step) == (compiled != "replicated_step")
