"""What XLA compiles where: TFM's `enable_xla` on GPUs, our opt-in on a CPU."""

import pytest

from official.core import config_definitions

from tfm_ext import devices
from tfm_ext import params_file

GPUS = ["/job:localhost/replica:0/task:0/device:GPU:0",
        "/job:localhost/replica:0/task:0/device:GPU:1"]
CPU = ["/job:localhost/replica:0/task:0/device:CPU:0"]
CPUS = CPU + ["/job:localhost/replica:0/task:0/device:CPU:1"]


def _runtime(**fields):
  runtime = config_definitions.RuntimeConfig()
  runtime.override(
      dict(params_file.RUNTIME_FIELDS, **fields), is_strict=False)
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
