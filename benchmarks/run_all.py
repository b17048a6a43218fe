"""Runs the benchmarks; writes their results and renders `RESULTS.md`.

    python benchmarks/run_all.py --quick    # the headline, at most 10 minutes
    python benchmarks/run_all.py            # everything, for releases
    python benchmarks/run_all.py --repeats=2   # everything, fewer repeats
    python benchmarks/run_all.py --variants=ours,stock_tfm,...  # fewer loops
    python benchmarks/run_all.py --only=training_loops  # keep the rest
    python benchmarks/run_all.py --smoke    # tiny sizes: checks that it runs

Every figure is taken in two conditions: `idle`, and `loaded`, with half
the cores kept busy by other processes (`_common.CONDITIONS`): a training
host is usually shared, and a default must win or tie in both.

`--quick` runs `training_loops.py --headline`: ours against stock TFM, the
hand-written loop and Keras and the input pool's default on
digits_convnet, ours against stock TFM on ResNet50, idle and loaded, into
`quick_results.json`. The figures of a change come from it unless the
change needs the full run.

The full run writes `results.json`: `training_loops.py` (which starts one
process per measured run and interleaves the conditions), `flops.py` (on
the training loops' ResNet50 figures, idle), then `input_pipelines.py`,
`checkpoint_cost.py`, `loop_costs.py` and `startup.py`, each idle and then
loaded. `--repeats=N` runs the training loops N times instead of 5, for a
machine where the full run would take hours, and `--variants` only the
training loop variants named; `results.json` records both.
`--training_loops=FILE` takes the training loops' results from an earlier
`training_loops.py --out` (written after each repeat) instead of running
them, so that a run stopped part-way goes on; the machine, commit and date
FILE records are reported for each of its workloads (`results["kept"]`).
`--only=SCRIPTS` runs only those scripts and keeps the others' results
from the full run already in the output directory, each with the machine
and commit that measured it (`results["kept"]`): one script re-measured
on a quiet machine need not cost the whole run. With `--only=
training_loops`, workloads the new training loops lack (`--training_loops`
from a `training_loops.py --workloads=...` run) are kept too.
`results.json` is written again after each script, so a run stopped
part-way keeps what it measured. `--smoke` writes to a scratch directory
unless `--out_dir` is given.
`--render=DIR` only renders `DIR/RESULTS.md` again from the results there
(`results.json`, `quick_results.json`, `gpu_results.json`, each if present).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import report
# pylint: enable=g-import-not-at-top,wrong-import-position

# In order: flops reads the training loops' results.
BENCHMARKS = ("training_loops", "flops", "input_pipelines", "checkpoint_cost",
              "loop_costs", "startup")
# The files of each mode, and the extra JSON `--render` reads (GPU).
FILES = {"full": "results.json", "quick": "quick_results.json",
         "smoke": "results.json"}
GPU_FILE = "gpu_results.json"


def _run_one(name: str, argv, results, condition: str) -> None:
  """Runs one benchmark script once the machine is quiet."""
  results["available_cores_before"].setdefault(condition, {})[name] = (
      _common.wait_for_quiet(0.85 * (os.cpu_count() or 1)))
  print(f"== {name} ({condition})", flush=True)
  # The training loops of a full run take hours on a slow 2-core machine.
  _common.run_child([_common.python(), *argv], timeout=8 * 3600, echo=True)


def run(mode: str, scratch: str, repeats: Optional[int] = None,
        variants: Optional[str] = None, training_loops: Optional[str] = None,
        save: Callable[[Dict[str, Any]], None] = lambda results: None,
        keep: Optional[Dict[str, Any]] = None,
        only: Sequence[str] = BENCHMARKS) -> Dict[str, Any]:
  """Runs the mode's benchmarks; returns their results, idle and `loaded`.

  `repeats` and `variants` (comma-separated): the training loops' (None:
  the mode's). `training_loops`: a `training_loops.py --out` file to take
  instead of running it. `save` gets the results so far after each script.
  `only`: run just these of `BENCHMARKS` and take the others' results
  from `keep`, an earlier full run's (and the training loops' workloads
  not measured now); `results["kept"]` gives the machine (and commit) of
  each thing kept.
  """
  results = {"machine": _common.machine(), "mode": mode,
             "available_cores_before": {}, "loaded": {}}
  if repeats:
    results["repeats"] = repeats
  if variants:
    results["variants"] = variants
  if keep is not None:
    kept = [name for name in BENCHMARKS if name not in only and name in keep]
    # Each kept script's machine and commit, through earlier `--only` runs;
    # the training loops' by workload.
    results["kept"] = {name: _measured_by(keep, name)
                       for name in kept if name != "training_loops"}
    if "training_loops" in kept:
      results["kept"].update(
          (key, _measured_by(keep, key)) for key in (
              f"training_loops {workload}"
              for workload in keep["training_loops"]))
    for name in kept:
      results[name] = keep[name]
      if name in keep.get("loaded", {}):
        results["loaded"][name] = keep["loaded"][name]
      for condition, before in keep.get("available_cores_before",
                                        {}).items():
        if name in before:
          results["available_cores_before"].setdefault(condition, {})[
              name] = before[name]
  start = time.time()
  names = (BENCHMARKS[:1] if mode == "quick" else
           [name for name in BENCHMARKS if name in only])
  for i, name in enumerate(names):
    out = os.path.join(scratch, f"{name}.json")
    argv = [_common.script(f"{name}.py"), f"--out={out}"]
    if mode == "quick":
      argv.append("--headline")
    elif mode == "smoke":
      argv.append("--smoke")
    if name == "training_loops":
      argv += [f"--{flag}={value}" for flag, value in (
          ("repeats", repeats), ("variants", variants)) if value]
    if name == "flops":
      argv.append(f"--training_loops={os.path.join(scratch, 'training_loops.json')}")
    if name == "training_loops" and training_loops:
      shutil.copy(training_loops, out)
      results["training_loops_from"] = training_loops
    else:
      _run_one(name, argv, results, "idle and loaded, interleaved"
               if name == "training_loops" else "idle")
    with open(out) as f:
      results[name] = json.load(f)
    if name == "training_loops":  # Both conditions, interleaved.
      if training_loops and "machine" in results[name]:  # Measured there.
        results.setdefault("kept", {}).update(
            (f"training_loops {workload}", results[name]["machine"])
            for workload in results[name]["idle"])
      results["loaded"][name] = results[name]["loaded"]
      results[name] = results[name]["idle"]
      if keep is not None:  # flops reads the merged training loops.
        _keep_workloads(results, keep)
        _common.write_json(out, {"idle": results[name],
                                 "loaded": results["loaded"][name]})
    elif name != "flops":  # The machine's peak, and idle figures: idle only.
      busy = _common.CONDITIONS["loaded"]
      _run_one(name, argv + [f"--busy={busy}"], results, "loaded")
      with open(out) as f:
        results["loaded"][name] = json.load(f)
    results["seconds"] = time.time() - start
    results["not_run"] = list(names[i + 1:])  # Until the run ends.
    save(results)
  return results


def _measured_by(keep: Dict[str, Any], key: str) -> Dict[str, Any]:
  """The machine (and commit) that measured `key` of the results `keep`:
  a script, or `training_loops <workload>`."""
  kept = keep.get("kept", {})
  return kept.get(key, kept.get(key.split(" ")[0], keep["machine"]))


def _keep_workloads(results: Dict[str, Any], keep: Dict[str, Any]) -> None:
  """Adds the training loops' workloads of `keep` that `results` did not
  measure, noting each in `results["kept"]` as `training_loops <workload>`.
  """
  for workload, loops in keep["training_loops"].items():
    if workload in results["training_loops"]:
      continue
    key = f"training_loops {workload}"
    results["kept"][key] = _measured_by(keep, key)
    results["training_loops"][workload] = loops
    loaded = keep.get("loaded", {}).get("training_loops", {})
    if workload in loaded:
      results["loaded"]["training_loops"][workload] = loaded[workload]


def read(out_dir: str, name: str) -> Optional[Dict[str, Any]]:
  """`out_dir/name` as JSON, or None if it is not there."""
  path = os.path.join(out_dir, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def render(out_dir: str) -> None:
  """Renders `out_dir/RESULTS.md` from the results files there."""
  with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
    f.write(report.render(read(out_dir, FILES["full"]),
                          read(out_dir, FILES["quick"]),
                          read(out_dir, GPU_FILE)))
  print(f"wrote {out_dir}/RESULTS.md")


def _only(parser: argparse.ArgumentParser, only: Optional[str], mode: str,
          out_dir: str) -> Tuple[Sequence[str], Optional[Dict[str, Any]]]:
  """`--only`'s scripts, and the full run whose other results it keeps."""
  if not only:
    return BENCHMARKS, None
  names = only.split(",")
  if set(names) - set(BENCHMARKS):
    parser.error(f"--only: give any of {', '.join(BENCHMARKS)}")
  keep = read(out_dir, FILES["full"])
  if mode != "full" or keep is None or keep.get("mode", "full") != "full":
    parser.error(f"--only keeps the other scripts' results of a full run: "
                 f"none in {os.path.join(out_dir, FILES['full'])}")
  if "training_loops" in names:
    names.append("flops")  # It reads the training loops' figures.
  return names, keep


def main(argv=None) -> None:
  """Runs the benchmarks (or renders); see the module docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  modes = parser.add_mutually_exclusive_group()
  modes.add_argument("--quick", action="store_true",
                     help="The headline ratios, idle and loaded (at most 10 "
                     "minutes).")
  modes.add_argument("--smoke", action="store_true",
                     help="Tiny sizes, one repeat: checks that it runs.")
  modes.add_argument("--render", metavar="DIR",
                     help="Only render DIR/RESULTS.md from the results "
                     "there.")
  parser.add_argument("--repeats", type=int, help="Runs of each training "
                      "loop variant (default: the mode's; the full run's 5 "
                      "take hours on a slow machine).")
  parser.add_argument("--variants", help="Comma-separated: only these "
                      "training loop variants (`ours` among them), e.g. "
                      "ours' defaults and stock TFM without the other "
                      "loops.")
  parser.add_argument("--training_loops", metavar="FILE", help="Take the "
                      "training loops' results from FILE (a `training_loops"
                      ".py --out`, written after each repeat) instead of "
                      "running them: a run stopped part-way goes on.")
  parser.add_argument("--only", metavar="SCRIPTS", help="Comma-separated, "
                      f"of {', '.join(BENCHMARKS)}: run only these and keep "
                      "the others' results from the full run already in "
                      "the output directory (flops runs again with the "
                      "training loops).")
  parser.add_argument("--out_dir", help="Where the results and RESULTS.md "
                      "go (default: benchmarks/, or a scratch directory "
                      "with --smoke).")
  args = parser.parse_args(argv)
  if args.render:
    render(args.render)
    return
  mode = "quick" if args.quick else "smoke" if args.smoke else "full"
  out_dir = args.out_dir or (
      os.path.join(tempfile.gettempdir(), "tfm_ext_benchmarks_smoke")
      if mode == "smoke" else os.path.join(_common.REPO, "benchmarks"))
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, FILES[mode])
  only, keep = _only(parser, args.only, mode, out_dir)
  # Kept if the run fails: `training_loops.json` there holds the repeats
  # done so far, for `--training_loops`.
  scratch = tempfile.mkdtemp(prefix="tfm_ext_benchmarks_")
  try:
    run(mode, scratch, args.repeats, args.variants, args.training_loops,
        save=lambda results: _common.write_json(path, results), keep=keep,
        only=only)
  except BaseException:
    print(f"stopped; the scripts' results so far are in {scratch}",
          flush=True)
    raise
  shutil.rmtree(scratch)
  render(out_dir)


if __name__ == "__main__":
  main()
