"""Start-up: the launcher's imports with Python's collector off, and on.

    python benchmarks/startup.py [--smoke] [--busy=N] [--out=FILE]

`launchers/train.py` turns Python's garbage collector off while it imports
TensorFlow, TFM, tfm_ext and the experiments, then freezes what they made
(`gc.freeze`: later collections skip it) and turns the collector back on.
Each run here is a fresh process that runs the launcher's module code (its
imports; not `main`) and reports:

    import_seconds     how long that took
    full_collections   full (generation 2) collections while it ran
    collect_seconds    one full collection right after: what each later one
                       costs while training
    frozen_objects     objects `gc.freeze` moved out of the collector's way
    peak_rss_mib       the process's peak resident memory

    import_cpu_seconds its CPU time (user and system)

for the launcher as it is (`launcher`) and three ablations: `collector_on`
(`gc.disable` a no-op: the collector runs while importing), `no_freeze`
(`gc.freeze` a no-op) and `keras_3` (`TF_USE_LEGACY_KERAS=0`: `tf.keras`
is Keras 3, which importing TensorFlow then loads, as in a process that
is not a launcher's). The variants alternate, in an order rotated each
repeat; figures are medians. Time to first step, which this shortens, is in
`training_loops.py`'s tables.
"""

import json
import os
import sys
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
# pylint: enable=g-import-not-at-top,wrong-import-position

LAUNCHER = os.path.join(_common.REPO, "launchers", "train.py")
SIZES = {"repeats": 7}
SMOKE_SIZES = {"repeats": 1}
FIGURES = ("import_seconds", "import_cpu_seconds", "full_collections",
           "collect_seconds", "frozen_objects", "peak_rss_mib")
# What each variant makes a no-op before the launcher's code runs, and the
# environment it sets.
VARIANTS = {"launcher": (None, {}), "collector_on": ("disable", {}),
            "no_freeze": ("freeze", {}),
            "keras_3": (None, {"TF_USE_LEGACY_KERAS": "0"})}

CHILD = """
import gc, json, os, resource, runpy, sys, time
if sys.argv[1] != "None":
  setattr(gc, sys.argv[1], lambda: None)
os.environ.update(json.loads(sys.argv[3]))
full = []
gc.callbacks.append(lambda phase, info: phase == "stop"
                    and info["generation"] == 2 and full.append(1))
start, cpu = time.perf_counter(), time.process_time()
runpy.run_path(sys.argv[2], run_name="startup_benchmark")
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
collections = len(full)
start = time.perf_counter()
gc.collect()
print(json.dumps({
    "import_seconds": seconds, "import_cpu_seconds": cpu,
    "full_collections": collections,
    "collect_seconds": time.perf_counter() - start,
    "frozen_objects": gc.get_freeze_count(),
    "collector_enabled": gc.isenabled(),
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def run_variant(variant: str) -> Dict[str, Any]:
  """Runs the launcher's module code in a fresh process; returns its figures."""
  no_op, env = VARIANTS[variant]
  child = _common.run_child([_common.python(), "-c", CHILD, str(no_op),
                             LAUNCHER, json.dumps(env)])
  return json.loads(child["lines"][-1][1])


def measure(sizes: Dict[str, Any]) -> Dict[str, Any]:
  """Each variant `sizes["repeats"]` times, interleaved; medians."""
  names = list(VARIANTS)
  runs = {name: [] for name in names}
  for repeat in range(sizes["repeats"]):
    shift = repeat % len(names)
    for name in names[shift:] + names[:shift]:
      result = run_variant(name)
      if not result["collector_enabled"]:
        raise RuntimeError(f"{name}: the launcher left the collector off.")
      runs[name].append(result)
      print(f"[{repeat + 1}/{sizes['repeats']}] {name}: "
            f"{result['import_seconds']:.2f} s "
            f"({result['import_cpu_seconds']:.2f} s CPU), "
            f"{result['full_collections']} full collections, a full "
            f"collection after {result['collect_seconds'] * 1e3:.0f} ms",
            flush=True)
  return {"sizes": sizes,
          "variants": {name: {"runs": runs[name],
                              "median": _common.medians(runs[name], FIGURES)}
                       for name in names}}


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark; see the module docstring."""
  return _common.sized_main(__doc__, measure, SIZES, SMOKE_SIZES, argv)


if __name__ == "__main__":
  main()
