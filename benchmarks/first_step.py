"""Time to first step from a cold interpreter: ours against stock TFM.

    python benchmarks/first_step.py [--rounds=5] [--label=NAME] [--out=FILE]
    python benchmarks/first_step.py --smoke     # one round, a scratch file
    python benchmarks/first_step.py --workloads=dlrm_criteo,...  # some

Every process is fresh (`python ...` as a user types it) and trains one
step, then exits. Per workload, ours and stock run one after the other as
a pair, and which of them runs first alternates round by round:

    resnet_imagenet  TFM's experiment, shrunk (`tests/e2e/tfm_configs/
                     resnet_imagenet.yaml`: ResNet-18, 64x64, global batch
                     2) on JPEG records in ImageNet's format
                     (`_imagenet_records.py`), `--mode=train`, the same
                     config file and overrides for both:
                     ours   `python launchers/train.py`
                     stock  `python -m official.vision.train`
    digits_convnet   our default experiment, as `training_loops.py` runs it:
                     ours   `python launchers/train.py`
                     stock  `train_lib.run_experiment` with TFM's
                            `base_trainer.Trainer` (`training_loops.py
                            --child=stock_tfm`): stock's loop, started as
                            ours is (`registry_imports.py`, to find the
                            experiment), without the vision registrations
                            `official/vision/train.py` would import
    TFM's own experiments (`_tfm_experiments.NAMES`: RetinaNet, Mask R-CNN,
                     DeepLabV3, the video classifier, DLRM), shrunk by
                     their configs in `tests/e2e/tfm_configs/` on the data
                     of tests/e2e/test_tfm_experiments.py, the same config
                     file and overrides for both:
                     ours   `python launchers/train.py` (`--registry=`
                            `official.vision.registry_imports`; DLRM's
                            `--trainer=ranking`)
                     stock  `python official/vision/train.py` (DLRM's
                            `official/recommendation/ranking/train.py`)

Ours runs twice a pair (`VARIANTS`): `ours`, a first launch, with an
empty AutoGraph cache of its own (`TFM_EXT_AUTOGRAPH_CACHE`,
`tfm_ext/training/autograph_cache.py`), and `ours_relaunch`, the launch
after it (a restart, an evaluator, the next run of a sweep): the cache one
unmeasured launch of the workload filled before the first round. Stock
has no such cache.

Per process, on this process's clock from the spawn: the wall time to the
first step's line (ours prints `step 1/1 | ...` on stdout, stock's Orbit
logs `train | step:      1 |` through absl on stderr, digits' stock child
both: the first counts; both streams are read as lines arrive) and to the
exit; the child's CPU time (user and system,
all threads) at that line (`/proc/<pid>/stat`, which counts threads that
already ended, at the clock's 10 ms tick) and at its exit (`os.wait4`'s
rusage); and the CPU time of its live threads at that line as the
scheduler counts them (`_common.thread_cpu`). Per pair, stock's figure over
ours: above 1 favours ours. The CPU time decides (`README.md`, "Which
figure decides"); the 1-minute load average is recorded at each spawn.

The record, `results/<date>-first-step[-<label>].json`, is rendered by
`run_all.py --render` into `RESULTS.md`'s "Time to first step".
"""

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import _tfm_experiments
from benchmarks import training_loops
# pylint: enable=g-import-not-at-top,wrong-import-position

# Ours' `TrainProgress` line, or stock Orbit's absl line, at step 1.
FIRST_STEP_LINE = re.compile(r"^step 1/\d+ \||train \| step: +1 \|")
RESNET_CONFIG = os.path.join(_common.REPO, "tests", "e2e", "tfm_configs",
                             "resnet_imagenet.yaml")
# One step, one loop; no evaluation in --mode=train; float32 on one device,
# as tests/e2e/test_tfm_experiments.py runs TFM's experiments both ways.
RESNET_OVERRIDES = (
    "task.train_data.input_path={records}/train-*,"
    "task.validation_data.input_path={records}/validation-*,"
    "runtime.distribution_strategy=one_device,runtime.num_gpus=0,"
    "runtime.mixed_precision_dtype=float32,"
    "trainer.train_steps=1,trainer.steps_per_loop=1,"
    "trainer.summary_interval=1,trainer.checkpoint_interval=1,"
    "trainer.validation_interval=1")
DIGITS = dataclasses.replace(training_loops.WORKLOADS["digits_convnet"],
                             train_steps=1, steps_per_loop=1,
                             summary_interval=1)
VARIANTS = ("ours", "ours_relaunch", "stock")
CACHE = "TFM_EXT_AUTOGRAPH_CACHE"
FIELDS = ("round", "workload", "variant", "order", "first_step_wall_s",
          "first_step_cpu_s", "first_step_live_threads_cpu_s", "exit_wall_s",
          "exit_cpu_s", "peak_rss_mib", "load_1min")
FIGURES = ("first_step_cpu_s", "first_step_wall_s", "exit_cpu_s",
           "exit_wall_s")
SIZES = {"rounds": 5}
SMOKE_SIZES = {"rounds": 1}


WORKLOADS = ("resnet_imagenet", "digits_convnet", *_tfm_experiments.NAMES)


def _tfm_experiment(name: str, overrides: Dict[str, str]
                    ) -> Dict[str, List[str]]:
  """Ours and stock TFM's train.py on one of TFM's experiments, one step."""
  workload = dataclasses.replace(_tfm_experiments.fed(
      training_loops.WORKLOADS[name], overrides), train_steps=1,
                                 steps_per_loop=1, summary_interval=1)
  ours = training_loops._argv(  # pylint: disable=protected-access
      workload, training_loops.VARIANTS["ours"], "{model_dir}")
  env = ["env", *workload.env] if workload.env else []
  return {"ours": ours,
          "stock": [*env, _common.python(), _tfm_experiments.stock_script(name),
                    *ours[ours.index(f"--experiment={name}"):]]}


def commands(records: str, tfm_overrides: Dict[str, str]
             ) -> Dict[str, Dict[str, List[str]]]:
  """`{workload: {variant: argv}}`; `{model_dir}` and `{scratch}` are
  filled in per process, `{primed}` per workload (`measure`).

  `tfm_overrides`: of TFM's experiments measured, each one's data overrides
  (`_tfm_experiments.write`).
  """
  by_workload = _commands(records, tfm_overrides)
  for argvs in by_workload.values():
    ours = argvs["ours"]
    argvs["ours"] = ["env", f"{CACHE}={{scratch}}/autograph", *ours]
    argvs["ours_relaunch"] = ["env", f"{CACHE}={{primed}}", *ours]
  return by_workload


def _commands(records: str, tfm_overrides: Dict[str, str]
              ) -> Dict[str, Dict[str, List[str]]]:
  resnet = ["--experiment=resnet_imagenet", "--mode=train",
            "--model_dir={model_dir}", f"--config_file={RESNET_CONFIG}",
            "--params_override=" + RESNET_OVERRIDES.format(records=records)]
  python = _common.python()
  return {**{
      "resnet_imagenet": {
          "ours": [python, training_loops.TRAIN, *resnet],
          "stock": [python, "-m", "official.vision.train", *resnet]},
      "digits_convnet": {
          variant: training_loops._argv(  # pylint: disable=protected-access
              DIGITS, training_loops.VARIANTS[name], "{model_dir}")
          for variant, name in (("ours", "ours"), ("stock", "stock_tfm"))},
  }, **{name: _tfm_experiment(name, tfm_overrides)
        for name in tfm_overrides}}


def _process_cpu(pid: int) -> Optional[float]:
  """User and system seconds of `pid` so far, ended threads included."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      # Fields 14 and 15, counted after the command's closing parenthesis.
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_process(argv: Sequence[str], timeout: float = 900.0
                 ) -> Dict[str, Any]:
  """Runs `argv` to its end; its times to the first step's line and to exit.

  Raises:
    _common.ChildFailed: on a non-zero exit, no first step's line, or after
      `timeout` seconds, with the tail of its output.
  """
  model_dir = tempfile.mkdtemp(prefix="bench_first_step_")
  scratch = tempfile.mkdtemp(prefix="bench_first_step_scratch_")
  load = os.getloadavg()[0]
  start = time.time()
  proc = subprocess.Popen(
      [arg.replace("{model_dir}", model_dir).replace("{scratch}", scratch)
       for arg in argv],
      cwd=_common.REPO, env={**os.environ, **_common.CHILD_ENV}, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  first: Dict[str, Any] = {}
  tails: List[List[str]] = [[], []]

  def read(stream, tail):
    for line in stream:
      if not first and FIRST_STEP_LINE.search(line):
        # Read before anything else: the child runs on meanwhile.
        first.update(wall=time.time() - start, cpu=_process_cpu(proc.pid),
                     live=_common.thread_cpu(proc.pid))
      tail[:] = (tail + [line.rstrip("\n")])[-30:]

  readers = [threading.Thread(target=read, args=(s, t), daemon=True)
             for s, t in ((proc.stdout, tails[0]), (proc.stderr, tails[1]))]
  for reader in readers:
    reader.start()
  watchdog = threading.Timer(timeout, proc.kill)
  watchdog.start()
  try:
    # `wait4` rather than `Popen.wait`: it returns the child's own rusage.
    _, status, usage = os.wait4(proc.pid, 0)
    exit_wall = time.time() - start
    watchdog.cancel()
    for reader in readers:
      reader.join()
  finally:
    watchdog.cancel()
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode != 0 or not first:
    raise _common.ChildFailed(
        f"{' '.join(argv)} exited with {proc.returncode} after "
        f"{exit_wall:.0f}s, {'a' if first else 'no'} first step's line:\n"
        + "\n".join(tails[0] + tails[1]))
  return {"first_step_wall_s": round(first["wall"], 3),
          "first_step_cpu_s": first["cpu"],
          "first_step_live_threads_cpu_s": first["live"] and round(
              sum(first["live"].values()) / 1e9, 3),
          "exit_wall_s": round(exit_wall, 3),
          "exit_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
          "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
          "load_1min": round(load, 2)}


def measure(sizes: Dict[str, Any],
            argvs: Optional[Dict[str, Dict[str, List[str]]]] = None,
            after_round: Callable[[Dict[str, Any]], None] = lambda _: None,
            workloads: Sequence[str] = WORKLOADS) -> Dict[str, Any]:
  """`sizes["rounds"]` rounds of pairs per workload; each process in turn.

  Returns `processes`, one row per process (`FIELDS`), and each workload's
  commands (of `workloads`, unless `argvs` gives them); `after_round` is
  given them so far after each round.
  """
  records = None
  if argvs is None:
    # pylint: disable=g-import-not-at-top
    from benchmarks import _imagenet_records  # Imports TensorFlow.
    records = tempfile.mkdtemp(prefix="bench_records_")
    _imagenet_records.write(records, copies=1)
    tfm = [name for name in workloads if name in _tfm_experiments.NAMES]
    argvs = {name: argv for name, argv in commands(
        records, _tfm_experiments.write(records, tfm) if tfm else {}).items()
             if name in workloads}
  rows = []
  out = {"sizes": sizes, "fields": list(FIELDS), "processes": rows,
         "commands": argvs}
  primed = tempfile.mkdtemp(prefix="bench_first_step_cache_")
  try:
    argvs = {workload: {variant: [arg.replace(
        "{primed}", os.path.join(primed, workload)) for arg in argv]
                        for variant, argv in by_variant.items()}
             for workload, by_variant in argvs.items()}
    for by_variant in argvs.values():  # The launch before a relaunch's.
      if "ours_relaunch" in by_variant:
        time_process(by_variant["ours_relaunch"])
    for r in range(sizes["rounds"]):
      for workload, by_variant in argvs.items():
        for order, variant in enumerate(
            v for v in _common.rotated(VARIANTS, r) if v in by_variant):
          got = time_process(by_variant[variant])
          rows.append([r, workload, variant, order,
                       *(got[f] for f in FIELDS[4:])])
          print(f"[{r + 1}/{sizes['rounds']}] {workload} {variant}: first "
                f"step {got['first_step_cpu_s']:.1f} s CPU, "
                f"{got['first_step_wall_s']:.1f} s wall; exit "
                f"{got['exit_cpu_s']:.1f} s CPU, {got['exit_wall_s']:.1f} s "
                f"wall (load {got['load_1min']:.1f})", flush=True)
      after_round(out)
  finally:
    shutil.rmtree(primed, ignore_errors=True)
    if records:
      shutil.rmtree(records, ignore_errors=True)
  return out


# -- Figures (also `run_all.py --render`'s) -----------------------------------


def _rows(record: Dict[str, Any]) -> List[Dict[str, Any]]:
  return [dict(zip(record["fields"], row)) for row in record["processes"]]


def per_variant(record: Dict[str, Any]) -> Dict[tuple, Dict[str, Any]]:
  """`{(workload, variant): {figure: spread}}` over its processes."""
  values: Dict[tuple, Dict[str, List[float]]] = {}
  for row in _rows(record):
    by = values.setdefault((row["workload"], row["variant"]), {})
    for figure in FIGURES + ("load_1min", "peak_rss_mib"):
      if row[figure] is not None:
        by.setdefault(figure, []).append(row[figure])
  return {key: {f: _common.spread(v) for f, v in by.items()}
          for key, by in values.items()}


def pair_ratios(record: Dict[str, Any], ours_variant: str = "ours"
                ) -> Dict[str, Dict[str, Any]]:
  """`{workload: {figure: spread}}` of stock's figure over `ours_variant`'s,
  per round."""
  at = {(row["round"], row["workload"], row["variant"]): row
        for row in _rows(record)}
  ratios: Dict[str, Dict[str, List[float]]] = {}
  for (r, workload, variant), stock in at.items():
    ours = at.get((r, workload, ours_variant))
    if variant != "stock" or not ours:
      continue
    for figure in FIGURES:
      if stock[figure] and ours[figure]:
        ratios.setdefault(workload, {}).setdefault(figure, []).append(
            stock[figure] / ours[figure])
  return {w: {f: _common.spread(v) for f, v in by.items()}
          for w, by in ratios.items()}


def _report(record: Dict[str, Any]) -> None:
  stats = per_variant(record)
  ratios = {v: pair_ratios(record, v) for v in VARIANTS if v != "stock"}
  for workload in ratios["ours"]:
    print(f"== {workload}: median (IQR; min-max; n)")
    variants = [v for v in VARIANTS if (workload, v) in stats]
    for figure in FIGURES:
      print(f"{figure:>18}: " + "  ".join(
          "{v} {median:.2f} ({q1:.2f}-{q3:.2f}; {min:.2f}-{max:.2f}; {n})"
          .format(v=v, **stats[(workload, v)][figure]) for v in variants) +
            "".join("  stock/{v} {median:.3f} ({q1:.3f}-{q3:.3f}; "
                    "{min:.3f}-{max:.3f})".format(
                        v=v, **by[workload][figure])
                    for v, by in ratios.items() if workload in by))


def main(argv=None) -> str:
  """Runs the rounds, writes the record; returns its path."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=SIZES["rounds"])
  parser.add_argument("--smoke", action="store_true",
                      help="One round, into a scratch file.")
  parser.add_argument("--workloads", default=",".join(WORKLOADS),
                      help=f"Comma-separated, of: {', '.join(WORKLOADS)}.")
  parser.add_argument("--label", default="",
                      help="The run's condition, in its file name.")
  parser.add_argument("--out", help="The record's path (default: "
                      "results/<date>-first-step[-<label>].json).")
  args = parser.parse_args(argv)
  workloads = args.workloads.split(",")
  unknown = sorted(set(workloads) - set(WORKLOADS))
  if unknown:
    parser.error(f"--workloads: unknown {unknown}; give any of "
                 f"{', '.join(WORKLOADS)}")
  started = time.time()
  name = time.strftime("%Y-%m-%d-%H%M", time.gmtime()) + "-first-step" + (
      f"-{args.label}" if args.label else "")
  path = args.out or (os.path.join(tempfile.mkdtemp(prefix="bench_smoke_"),
                                   name + ".json") if args.smoke else
                      os.path.join(_common.script("results"), name + ".json"))
  record: Dict[str, Any] = {"mode": "first-step", "label": args.label,
                            "busy_cores_throughout": 0,
                            "machine": _common.machine(), "complete": False}

  def save(measured):
    # After each round: a run stopped part-way keeps its rounds.
    record.update(first_step=measured,
                  minutes=round((time.time() - started) / 60, 1))
    _common.write_json(path, record)

  measured = measure(SMOKE_SIZES if args.smoke else {"rounds": args.rounds},
                     after_round=save, workloads=workloads)
  record["complete"] = True
  save(measured)
  _report(record["first_step"])
  print("wrote", path)
  return path


if __name__ == "__main__":
  main()
