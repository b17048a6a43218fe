"""Runs every benchmark; writes `results.json` and renders `RESULTS.md`.

    python benchmarks/run_all.py            # about 30 minutes on 2 CPU cores
    python benchmarks/run_all.py --quick    # a smoke run, about 3 minutes

Runs, each in a process of its own: `training_loops.py` (which starts one
process per measured run), `flops.py` (on the training loops' ResNet50
figures), `input_pipelines.py`, `checkpoint_cost.py`, `loop_costs.py` and
`startup.py`.
The full run writes `benchmarks/results.json` and `benchmarks/RESULTS.md`;
`--quick` writes them to a scratch directory unless `--out_dir` is given.
`--render=FILE` only renders `RESULTS.md` again from a results JSON. A
`gpu_results.json` beside the results (from `gpu_resnet50.py`) is rendered
too.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import report
# pylint: enable=g-import-not-at-top,wrong-import-position

# In order: flops reads the training loops' results.
BENCHMARKS = ("training_loops", "flops", "input_pipelines", "checkpoint_cost",
              "loop_costs", "startup")


def run(quick: bool, scratch: str) -> Dict[str, Any]:
  """Runs each benchmark script; returns all results with the machine's."""
  results = {"machine": _common.machine(), "quick": quick,
             "available_cores_before": {}}
  start = time.time()
  for name in BENCHMARKS:
    out = os.path.join(scratch, f"{name}.json")
    argv = [_common.python(), _common.script(f"{name}.py"), f"--out={out}"]
    if quick:
      argv.append("--quick")
    if name == "flops":
      loops = os.path.join(scratch, "training_loops.json")
      argv.append(f"--training_loops={loops}")
    results["available_cores_before"][name] = _common.wait_for_quiet(
        0.85 * (os.cpu_count() or 1))
    print(f"== {name}", flush=True)
    _common.run_child(argv, timeout=3600, echo=True)
    with open(out) as f:
      results[name] = json.load(f)
  results["seconds"] = time.time() - start
  return results


def write(results: Dict[str, Any], out_dir: str) -> None:
  """Writes `results.json` and `RESULTS.md` (with any `gpu_results.json`)."""
  os.makedirs(out_dir, exist_ok=True)
  _common.write_json(os.path.join(out_dir, "results.json"), results)
  gpu = None
  gpu_path = os.path.join(out_dir, "gpu_results.json")
  if os.path.exists(gpu_path):
    with open(gpu_path) as f:
      gpu = json.load(f)
  with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
    f.write(report.render(results, gpu))
  print(f"wrote {out_dir}/results.json and RESULTS.md")


def main(argv=None) -> None:
  """Runs the benchmarks (or renders); see the module docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="Small sizes, one repeat: a smoke run.")
  parser.add_argument("--out_dir", help="Where results.json and RESULTS.md "
                      "go (default: benchmarks/, or a scratch directory "
                      "with --quick).")
  parser.add_argument("--render", metavar="FILE",
                      help="Only render RESULTS.md from this results JSON.")
  args = parser.parse_args(argv)
  if args.render:
    with open(args.render) as f:
      results = json.load(f)
    write(results, args.out_dir or os.path.dirname(os.path.abspath(
        args.render)))
    return
  out_dir = args.out_dir or (
      os.path.join(tempfile.gettempdir(), "tfm_ext_benchmarks_quick")
      if args.quick else os.path.join(_common.REPO, "benchmarks"))
  with tempfile.TemporaryDirectory() as scratch:
    results = run(args.quick, scratch)
  write(results, out_dir)


if __name__ == "__main__":
  main()
