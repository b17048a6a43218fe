"""ResNet50 on one GPU: bfloat16 and float16, XLA on and off, images/s to JSON.

    python benchmarks/gpu_resnet50.py --out=benchmarks/gpu_results.json

Not yet run on a GPU: it was written on a CPU-only machine and checked there
with `--dry_run` only: the same code path at tiny sizes on the CPU, by
default for the two bfloat16 configurations: float16 convolutions on a CPU
take about a minute a step (all four configurations did run on the CPU,
at two steps, while this script was written).

Each configuration runs our launcher (`launchers/train.py`,
`resnet50_imagenet_ctl`, its `resnet_ctl` trainer) in a fresh process on one
GPU (`runtime.num_gpus=1`) with synthetic images in the compute dtype (the
reference runner's `--use_synthetic_data --dtype`), global batch 256, 120
steps in loops of 20, and is timed as `training_loops.py` times runs: images
per second from step 40 to 120, time to first step, peak host memory. The
whole script stays under `BUDGET_SECONDS` (6 minutes 40 seconds, so the
command ends within 7): a run gets at most `RUN_SECONDS` (3 minutes) or what
is left, and runs that would start later are recorded as skipped.

It needs TensorFlow with its CUDA libraries in the interpreter that runs it
(`pip install -e .` on the GPU machine) and says so, exiting 2, where they
are missing.
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import training_loops
# pylint: enable=g-import-not-at-top,wrong-import-position

BUDGET_SECONDS = 400
# A run that hangs must leave time for the others.
RUN_SECONDS = 180
GPU = training_loops.Workload(
    "resnet50_imagenet_ctl", global_batch_size=256, train_steps=120,
    steps_per_loop=20, summary_interval=20, warmup_steps=40,
    overrides=training_loops.SYNTHETIC + ",runtime.num_gpus=1")
# The same path on the CPU, small enough to finish in a few minutes.
DRY_RUN = training_loops.Workload(
    "resnet50_imagenet_ctl", global_batch_size=2, train_steps=3,
    steps_per_loop=1, summary_interval=1, warmup_steps=2,
    overrides=training_loops.SYNTHETIC + ",runtime.num_gpus=0")
DTYPES = ("bfloat16", "float16")
DRY_RUN_CONFIGS = ("bfloat16_xla_off", "bfloat16_xla_on")


def configurations() -> Dict[str, training_loops.Variant]:
  """`{name: variant}` for each dtype, XLA off and on."""
  return {
      f"{dtype}_xla_{'on' if xla else 'off'}": training_loops.Variant(
          "ours", f"runtime.mixed_precision_dtype={dtype},"
          f"task.train_data.dtype={dtype},"
          f"runtime.enable_xla={str(xla).lower()}")
      for dtype in DTYPES for xla in (False, True)}


def gpu_name() -> str:
  """What `nvidia-smi` calls the GPU, or empty if there is none."""
  if not shutil.which("nvidia-smi"):
    return ""
  listing = subprocess.run(["nvidia-smi", "--query-gpu=name",
                            "--format=csv,noheader"], capture_output=True,
                           text=True, check=False).stdout
  return listing.splitlines()[0].strip() if listing.strip() else ""


def measure(workload: training_loops.Workload,
            names: Sequence[str]) -> Dict[str, Any]:
  """Runs each configuration in `names` once, within `BUDGET_SECONDS`."""
  deadline = time.time() + BUDGET_SECONDS
  results = {}
  for name in names:
    variant = configurations()[name]
    left = deadline - time.time()
    if left < 30:
      results[name] = {"skipped": "out of time"}
      continue
    try:
      result = training_loops.run_variant(workload, variant,
                                          timeout=min(left, RUN_SECONDS))
    except _common.ChildFailed as e:
      results[name] = {"failed": str(e)[-2000:]}
      print(f"{name}: failed\n{e}", flush=True)
      continue
    del result["loop_ends"]
    results[name] = result
    print(f"{name}: {result['examples_per_second']:.0f} images/s, first "
          f"step after {result['time_to_first_step_seconds']:.1f}s", flush=True)
  return results


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark; see the module docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=_common.script("gpu_results.json"),
                      help="Where to write the JSON.")
  parser.add_argument("--dry_run", action="store_true",
                      help="Tiny sizes on the CPU: checks the script runs.")
  parser.add_argument(
      "--configs", default="",
      help=f"Comma-separated, or 'all' (the default; with --dry_run: "
      f"{','.join(DRY_RUN_CONFIGS)}). Known: {','.join(configurations())}.")
  args = parser.parse_args(argv)
  if args.configs in ("", "all"):
    names = (list(DRY_RUN_CONFIGS) if args.dry_run and not args.configs
             else list(configurations()))
  else:
    names = args.configs.split(",")
  unknown = sorted(set(names) - set(configurations()))
  if unknown:
    parser.error(f"unknown --configs {unknown}; known: "
                 f"{', '.join(configurations())}")
  if importlib.util.find_spec("tensorflow") is None:
    print(f"error: {_common.python()} has no TensorFlow: run `pip install "
          "-e .` in this repo first.", file=sys.stderr)
    sys.exit(2)
  device = gpu_name()
  if not device and not args.dry_run:
    print("error: no GPU (nvidia-smi lists none). Pass --dry_run to check "
          "the script on the CPU.", file=sys.stderr)
    sys.exit(2)
  workload = DRY_RUN if args.dry_run else GPU
  results = {"device": device or "CPU (dry run)",
             "machine": _common.machine(), "dry_run": args.dry_run,
             "params_override": workload.params_override(),
             "configurations": measure(workload, names)}
  _common.write_json(args.out, results)
  print(f"wrote {args.out}")
  return results


if __name__ == "__main__":
  main()
