"""The fields tfm_ext adds to TFM's configs where they lack them, and defaults.

`trainer` gets `TrainerConfig`'s (`tfm_ext.training.trainers`), `runtime`
`RUNTIME_FIELDS`. An experiment whose config classes lack them (TFM's own)
gets them with these defaults when its params are built; a `params.yaml`
without them (stock TFM's) reads them as these (`params_file.read`).
"""

from typing import Any, Dict

from tfm_ext.training import trainers


# Fields tfm_ext adds to TFM's `RuntimeConfig`: `tfm_ext.training.determinism`'s,
# whether `mirrored` on one CPU device keeps TFM's one-replica mirror
# (`tfm_ext.run.strategies.build_strategy`; false: no strategy), and whether the
# train step compiles with XLA on a CPU (`tfm_ext.base.devices.xla_scope`), and
# where progress is POSTed (`tfm_ext.actions.notify`).
RUNTIME_FIELDS = {"deterministic": False, "seed": 0,
                  "mirror_one_device": True, "xla_on_cpu": False,
                  "notify_url": ""}


def defaults() -> Dict[str, Dict[str, Any]]:
  """`{section: {field: default}}` of every field tfm_ext adds to TFM's."""
  return {"trainer": trainers.added_fields(), "runtime": RUNTIME_FIELDS}
