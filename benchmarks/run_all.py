"""Runs the benchmarks into one results file; renders `RESULTS.md` from them.

    python benchmarks/run_all.py --quick     # the headline, under 10 minutes
    python benchmarks/run_all.py             # everything, for releases
    python benchmarks/run_all.py --quick --busy=1   # with a core held busy
    python benchmarks/run_all.py --render    # RESULTS.md from results/ again

A run writes `results/<date>-<mode>[-<label>].json` (`--label` names its
condition, e.g. `one-core-busy`); `RESULTS.md` is rendered from every file
there: each row from the newest run that measured it, and the headline of
every run side by side, so that runs on different days or conditions can
be compared. `SESSIONS` lists what each mode measures: the training loops
in interleaved pairs (`training_loops.pairs`) and, in the full run, the
scripts of the defaults (`SCRIPTS`), each idle and with one core busy.
`first_step.py` writes a record of its own there (`results/<date>-first-
step.json`), rendered as the "Time to first step" table; no mode runs it.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import _tfm_experiments
from benchmarks import first_step
from benchmarks import precision
from benchmarks import training_loops
# pylint: enable=g-import-not-at-top,wrong-import-position

RESULTS_DIR = _common.script("results")
HEADLINE = ("ours", "stock_tfm", "handwritten", "keras_fit")
# Per mode: session name -> (workload, variants, rounds, loops per window,
# and a budget in seconds, start-up included: on a slow day a session
# measures fewer rounds, and the quick mode still ends within 10 minutes).
SESSIONS = {
    "quick": {
        "digits_convnet": ("digits_convnet", HEADLINE, 10, 2, 300),
        "resnet50": ("resnet50", ("ours", "stock_tfm"), 8, 1, 180),
    },
    "full": {
        "digits_convnet": ("digits_convnet", HEADLINE + (
            "keras_fit_tensorboard",), 16, 3, 1200),
        "digits_defaults": ("digits_convnet", (
            "ours", "ours_no_strategy", "ours_xla"), 12, 3, 900),
        "resnet50": ("resnet50", HEADLINE, 12, 2, 1200),
        "resnet50_defaults": ("resnet50", ("ours", "stock_tfm",
                                           "ours_no_strategy", "ours_xla"),
                              8, 2, 900),
        # The input's pool on CPUs (`--only=input_pool`): ours' default
        # against tf.data's own pool, and stock TFM (whose input is on
        # tf.data's pool); on TFM's image pipelines too (decoding and
        # augmenting JPEGs on the cores the model trains on).
        "digits_input_pool": ("digits_convnet", (
            "ours", "ours_tf_data_pool", "stock_tfm"), 10, 3, 420),
        "resnet50_input_pool": ("resnet50", (
            "ours", "ours_tf_data_pool", "stock_tfm"), 6, 2, 480),
        "seg_deeplabv3_pascal_input_pool": ("seg_deeplabv3_pascal", (
            "ours", "ours_tf_data_pool"), 10, 2, 480),
        # Emulated bfloat16 (no AVX512-BF16 or AMX) takes ten times as long.
        "resnet50_bfloat16": ("resnet50", ("ours", "ours_bfloat16"), 4, 1,
                              600),
        # TFM's own experiments, each against stock TFM's own loop for it
        # (`--only=tfm_experiments` runs the five): up to 7 minutes each,
        # Mask R-CNN's start-up alone a minute or two.
        **{name: (name, ("ours", "stock_tfm"), 8, 2, 420)
           for name in _tfm_experiments.NAMES},
    },
    "smoke": {"digits_convnet": ("digits_convnet", ("ours", "stock_tfm"), 1,
                                 1)},
}
# Names `--only` takes for several sessions.
GROUPS = {"tfm_experiments": _tfm_experiments.NAMES,
          "input_pool": ("digits_input_pool", "resnet50_input_pool",
                         "seg_deeplabv3_pascal_input_pool")}
# The full run's scripts, each run idle and with one core busy (`--busy`).
SCRIPTS = ("input_pipelines", "checkpoint_cost", "loop_costs", "startup")

# Rows of interleaved pairs: (anchor, workload, the other variant, floor,
# claim, why). The ratio is the other's time per step over ours (or the
# default's): above 1 favours ours.
PAIR_ROWS = (
    ("target-digits-convnet-stock-tfm", "digits_convnet", "stock_tfm", 1.0,
     "digits_convnet: ours against stock TFM",
     "no slower than the TFM trainer it replaces"),
    ("target-digits-convnet-handwritten", "digits_convnet", "handwritten",
     0.97, "digits_convnet: ours against a hand-written loop",
     "the floor of framework overhead: ours within 3% of it"),
    ("target-digits-convnet-keras-fit", "digits_convnet", "keras_fit", 1.0,
     "digits_convnet: ours against Keras `Model.fit`",
     "no slower than Keras's own loop"),
    ("target-digits-convnet-keras-fit-tensorboard", "digits_convnet",
     "keras_fit_tensorboard", 1.0,
     "digits_convnet: ours against `Model.fit` writing summaries",
     "no slower than Keras writing the same summaries"),
    ("target-resnet50-stock-tfm", "resnet50", "stock_tfm", 1.0,
     "ResNet50: ours against stock TFM",
     "no slower than the TFM trainer it replaces"),
    ("target-resnet50-handwritten", "resnet50", "handwritten", 0.97,
     "ResNet50: ours against a hand-written loop",
     "the floor of framework overhead: ours within 3% of it"),
    ("target-resnet50-keras-fit", "resnet50", "keras_fit", 1.0,
     "ResNet50: ours against Keras `Model.fit`",
     "no slower than Keras's own loop"),
    *((f"target-tfm-{anchor}-stock-tfm", name, "stock_tfm", 1.0,
       f"TFM's `{name}` (its test's config and data): ours against stock "
       f"TFM ({stock})", "no slower than the TFM trainer it replaces")
      for anchor, name, stock in (
          ("retinanet", "retinanet_resnetfpn_coco", "`official/vision/train.py`"),
          ("maskrcnn", "maskrcnn_resnetfpn_coco", "`official/vision/train.py`"),
          ("deeplabv3", "seg_deeplabv3_pascal", "`official/vision/train.py`"),
          ("video-classification", "video_classification_kinetics400",
           "`official/vision/train.py`"),
          ("dlrm", "dlrm_criteo",
           "`official/recommendation/ranking/train.py`'s `RankingTrainer`"))),
    *((anchor, workload, "ours_tf_data_pool", 1.0,
       f"{name}: trained on CPUs, the input gets a private tf.data pool of "
       "half the cores (`runtime.dataset_num_private_threads` unset), "
       "against tf.data's own pool, as in stock TFM (`=0`)",
       "the model's ops use every core: a private pool keeps the input off "
       "them; with a GPU or TPU the input keeps tf.data's pool, which it "
       "may need whole to feed the accelerator (#default-parallel-map)")
      for anchor, workload, name in (
          ("default-input-pool", "digits_convnet", "digits_convnet"),
          ("default-input-pool-resnet50", "resnet50", "ResNet50"),
          ("default-input-pool-deeplabv3", "seg_deeplabv3_pascal",
           "TFM's `seg_deeplabv3_pascal`"))),
    ("default-one-replica-mirror", "digits_convnet", "ours_no_strategy", 1.0,
     "`mirrored` on one CPU builds TFM's one-replica `MirroredStrategy`, "
     "against no strategy (`runtime.mirror_one_device=false`)",
     "no strategy would be the default only if it won or tied idle and "
     "loaded"),
    ("default-xla-off", "digits_convnet", "ours_xla", 1.0,
     "`runtime.xla_on_cpu` off on the CPU (digits_convnet)",
     "XLA's CPU code for these models is slower than TF's kernels"),
    ("default-xla-off-resnet50", "resnet50", "ours_xla", 1.0,
     "`runtime.xla_on_cpu` off on the CPU (ResNet50)",
     "XLA's CPU code for these models is slower than TF's kernels"),
    # No floor: which wins depends on the CPU, which `_details` names.
    ("default-float32-on-cpu", "resnet50", "ours_bfloat16", None,
     "float32 by default on a CPU, against "
     "`runtime.mixed_precision_dtype=bfloat16` (below 1: bfloat16 is faster "
     "on this CPU)",
     "bfloat16 pays only where the CPU multiplies it (AVX512-BF16 or AMX); "
     "without them TensorFlow emulates it through float32"),
)


def _ratio(script: str, num: Sequence[str], den: Sequence[str],
           text: str) -> Callable[[Dict[str, Any]], tuple]:
  """A script row's figure: `results[num...] / results[den...]`, and
  `text` formatted with both (`{n}`, `{d}`)."""

  def get(results, path):
    for key in path:
      results = results[key]
    return results

  def figure(results):
    try:
      n, d = get(results, num), get(results, den)
    except KeyError:  # A run from before the script measured this.
      return None, ""
    return n / d, text.format(n=n, d=d)

  figure.script = script
  return figure


def _iterator_growth(results):
  by_buffer = results["resnet50_iterator"]["by_shuffle_buffer"]
  (b0, f0), (b1, f1) = sorted(by_buffer.items(), key=lambda kv: int(
      kv[0]))[::len(by_buffer) - 1]
  per_record = (f1["bytes"] - f0["bytes"]) / (int(b1) - int(b0))
  model = results["resnet50_model"]["bytes"]
  return None, (f"the iterator grows by {per_record / 1e3:.1f} KB per "
                f"buffered record (state {f0['bytes'] / 2**20:.1f} MiB at a "
                f"buffer of {b0}); model and optimizer {model / 2**20:.0f} MiB")


def _first_save(results):
  model = results["resnet50_model"]
  return None, (f"ResNet50's first save takes {model['first_save_seconds']:.2f}"
                f" s (it traces) and {model['bytes'] / 2**20:.0f} MiB")


_first_save.script = _iterator_growth.script = "checkpoint_cost"
# Rows of the scripts' figures: (anchor, floor, claim, why, figure).
SCRIPT_ROWS = (
    ("target-resnet-train-input-pipeline", 1.0,
     "ResNet training input pipeline: ours against the reference `input_fn`",
     "our pipeline replaces the reference's: at least as fast",
     _ratio("input_pipelines", ("train", "images_per_second", "ours"),
            ("train", "images_per_second", "reference"),
            "{n:.0f} vs {d:.0f} images/s")),
    ("target-resnet-eval-input-pipeline", 1.0,
     "ResNet evaluation input pipeline: ours against the reference",
     "our pipeline replaces the reference's: at least as fast",
     _ratio("input_pipelines", ("eval", "images_per_second", "ours"),
            ("eval", "images_per_second", "reference"),
            "{n:.0f} vs {d:.0f} images/s")),
    ("default-no-autotune", 1.0,
     "tf.data autotuning off in the ResNet training pipeline",
     "autotuning's bookkeeping costs CPU time and a fixed prefetch stays "
     "bounded", _ratio("input_pipelines", ("train", "images_per_second",
                                          "ours"),
                       ("train", "images_per_second", "ours_autotune_on"),
                       "{n:.0f} vs {d:.0f} images/s autotuned")),
    ("default-summary-manager", 1.0,
     "a loop's outputs written as one summary op per directory "
     "(`ScalarSummaryManager`)", "the same events, less host time",
     _ratio("loop_costs", ("summaries", "orbit"), ("summaries", "ours"),
            "{d:.5f} s vs {n:.5f} s with Orbit's `SummaryManager`")),
    ("default-host-readable-step", 1.0,
     "a mirrored global step read through its local copy",
     "the loop reads the step about ten times a loop",
     _ratio("loop_costs", ("global_step_read", "orbit"),
            ("global_step_read", "ours"),
            "{d:.6f} s vs {n:.6f} s through the `MirroredVariable`")),
    ("default-traced-train-logs", 1.0,
     "`train_loop_end` reads metrics and learning rate as one graph",
     "one call instead of one read per value",
     _ratio("loop_costs", ("read_train_logs", "eager"),
            ("read_train_logs", "traced"), "{d:.5f} s vs {n:.5f} s eagerly")),
    ("default-nan-check", 1.0,
     "a non-finite loss caught from the loop's mean loss, not in each step",
     "no op in the step", _ratio(
         "loop_costs", ("step", "per_step_check"), ("step", "ours"),
         "{d:.5f} s a step vs {n:.5f} s with a check in the step")),
    ("default-collector-off-while-importing", 1.0,
     "`launchers/train.py` imports with Python's collector off, then "
     "freezes what they made",
     "the imports' objects live as long as the process",
     _ratio("startup", ("variants", "collector_on", "median",
                        "import_seconds"),
            ("variants", "launcher", "median", "import_seconds"),
            "imports {d:.2f} s vs {n:.2f} s with the collector on")),
    ("default-gc-freeze", 1.0,
     "... then freezes what the imports made (`gc.freeze`)",
     "later full collections do not rescan the imports' objects",
     _ratio("startup", ("variants", "no_freeze", "median", "collect_seconds"),
            ("variants", "launcher", "median", "collect_seconds"),
            "a full collection after the imports {d:.4f} s vs {n:.3f} s "
            "unfrozen")),
    ("default-legacy-keras", 1.0,
     "a launcher sets `TF_USE_LEGACY_KERAS=1` before importing TensorFlow "
     "(`tf.keras` is TFM's Keras 2)",
     "importing TensorFlow no longer loads Keras 3, which TFM does not use",
     _ratio("startup", ("variants", "keras_3", "median",
                        "import_cpu_seconds"),
            ("variants", "launcher", "median", "import_cpu_seconds"),
            "imports {d:.2f} s CPU vs {n:.2f} s with Keras 3")),
    ("default-parallel-map", 1.0,
     "tf.data: parallel map and prefetch in the ResNet training pipeline",
     "images decode and augment in parallel, ahead of the step",
     _ratio("input_pipelines", ("train", "images_per_second", "ours"),
            ("train", "images_per_second", "ours_one_thread"),
            "{n:.0f} vs {d:.0f} images/s with one thread")),
    ("default-checkpoint-input-iterator", None,
     "`trainer.checkpoint_input_iterator` on: checkpoints hold the input "
     "iterator", "a resume continues the input where it stopped",
     _ratio("checkpoint_cost", ("digits_convnet", "with_iterator", "bytes"),
            ("digits_convnet", "without_iterator", "bytes"),
            "digits_convnet: {n:,} bytes with the iterator, {d:,} without")),
    ("default-no-first-loop-checkpoint", None,
     "no checkpoint after the first loop (stock TFM saves "
     "`ckpt-<steps_per_loop>`)",
     "it holds one loop of progress and takes one of `max_to_keep`'s places",
     _first_save),
    ("default-resnet-iterator-out", None,
     "`resnet50_imagenet_ctl` keeps the input iterator out of its "
     "checkpoints", "a shuffle buffer of JPEGs in every checkpoint",
     _iterator_growth),
)
PARITY = 0.98  # Two runs of one graph differ by 1-3% on a shared machine.


# -- Running ------------------------------------------------------------------


def run(mode: str, label: str = "", busy: int = 0,
        out_dir: str = RESULTS_DIR, only: Sequence[str] = ()) -> str:
  """Runs `mode`'s sessions (and the full run's scripts); returns the file.

  With `busy`, that many cores spin in other processes for the whole run;
  with `only`, just those of its sessions and scripts run.
  """
  started = time.time()
  results: Dict[str, Any] = {"mode": mode, "label": label, "complete": False,
                             "only": list(only),
                             "busy_cores_throughout": busy,
                             "machine": _common.machine(), "sessions": {}}
  name = time.strftime("%Y-%m-%d-%H%M", time.gmtime()) + f"-{mode}" + (
      f"-{label}" if label else "")
  path = os.path.join(out_dir, name + ".json")
  os.makedirs(out_dir, exist_ok=True)
  with _common.Spinners(busy) as spinners:
    spinners.hold(busy)
    for session, (workload, variants, rounds, loops, *budget) in SESSIONS[
        mode].items():
      if only and session not in only:
        continue
      print(f"== {session}: {', '.join(variants)}", flush=True)
      with _tfm_experiments.prepared(
          training_loops.WORKLOADS[workload]) as prepared:
        results["sessions"][session] = training_loops.pairs(
            prepared, variants, rounds, loops,
            budget=budget[0] if budget else None)
      _save(path, results, started)
    for script in SCRIPTS if mode == "full" else ():
      if only and script not in only:
        continue
      for condition, cores in training_loops.CONDITIONS.items():
        print(f"== {script} ({condition})", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
          _common.run_child([_common.python(), _common.script(f"{script}.py"),
                             f"--busy={cores}", f"--out={f.name}"],
                            timeout=3600)
          results.setdefault("scripts", {}).setdefault(script, {})[
              condition] = json.load(f)
        _save(path, results, started)
  results["complete"] = True
  _save(path, results, started)
  return path


def _save(path: str, results: Dict[str, Any], started: float) -> None:
  # After each part: a run stopped part-way keeps what it measured.
  results["minutes"] = round((time.time() - started) / 60, 1)
  _common.write_json(path, results)


# -- Figures ------------------------------------------------------------------


def per_step(session: Dict[str, Any]) -> Dict[tuple, Dict[str, float]]:
  """`{(condition, variant): {figure: spread}}` of ms per step."""
  fields = session["window_fields"]
  values: Dict[tuple, Dict[str, List[float]]] = {}
  for window in session["windows"]:
    w = dict(zip(fields, window))
    by = values.setdefault((w["condition"], w["variant"]), {})
    by.setdefault("wall_ms", []).append(w["wall_s"] / w["steps"] * 1e3)
    by.setdefault("cpu_ms", []).append(w["cpu_s"] / w["steps"] * 1e3)
    for event in fields[len(training_loops.WINDOW_FIELDS):]:
      if w[event] is not None:
        by.setdefault(event, []).append(w[event] / w["steps"])
  return {key: {k: _common.spread(v) for k, v in by.items()}
          for key, by in values.items()}


def pair_ratios(session: Dict[str, Any], other: str, base: str = "ours"
                ) -> Dict[str, Dict[str, Dict[str, float]]]:
  """`{condition: {figure: spread}}` of `other`'s time per step over
  `base`'s, one ratio per round (the two windows ran seconds apart)."""
  fields = session["window_fields"]
  at = {}
  for window in session["windows"]:
    w = dict(zip(fields, window))
    at[(w["round"], w["condition"], w["variant"])] = w
  ratios: Dict[str, Dict[str, List[float]]] = {}
  for (r, condition, variant), w in at.items():
    mine = at.get((r, condition, base))
    if variant != other or not mine:
      continue
    for figure, key in (("wall", "wall_s"), ("cpu", "cpu_s")):
      ratios.setdefault(condition, {}).setdefault(figure, []).append(
          (w[key] / w["steps"]) / (mine[key] / mine["steps"]))
  return {c: {f: _common.spread(v) for f, v in by.items()}
          for c, by in ratios.items()}


def verdict(cells: Sequence[Dict[str, float]], floor: float) -> str:
  """Of the CPU ratios' spreads, idle and loaded: `met` if every median
  reaches `floor`; `parity` if every one is within `PARITY` of it;
  `within the spread` if the floor is below every upper quartile (the
  pairs cannot tell); else `**missed**`: most pairs fall short; "" for
  no cell (not measured)."""
  if not cells:
    return ""
  if all(c["median"] >= floor for c in cells):
    return "met"
  if all(c["median"] >= PARITY * floor for c in cells):
    return "parity"
  if all(c.get("q3", c["median"]) >= floor for c in cells):
    return "within the spread"
  return "**missed**"


# -- Rendering ----------------------------------------------------------------


def load(directory: str) -> List[Dict[str, Any]]:
  """Every run file in `directory`, oldest first, each with its `file`."""
  runs = []
  for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
    with open(path) as f:
      runs.append(dict(json.load(f), file=os.path.basename(path)))
  return runs


def _session_with(run: Dict[str, Any], workload: str, variant: str):
  for session in run.get("sessions", {}).values():
    if (session["workload"]["experiment"]
        == training_loops.WORKLOADS[workload].experiment
        and "ours" in session["variants"] and variant in session["variants"]):
      return session
  return None


def _fmt(s: Optional[Dict[str, float]], digits: int = 3,
         bold: str = "**") -> str:
  if not s:
    return "not measured"
  return (f"{bold}{s['median']:.{digits}f}{bold} ({s['q1']:.{digits}f}-"
          f"{s['q3']:.{digits}f}; {s['min']:.{digits}f}-{s['max']:.{digits}f}"
          f"; {s['n']})")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> List[str]:
  return ["| " + " | ".join(header) + " |",
          "| " + " | ".join("---" for _ in header) + " |",
          *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


def _source(run: Dict[str, Any]) -> str:
  m = run["machine"]
  return f"`{run['file']}` ({m['commit']}{'+' if m['uncommitted_changes'] else ''})"


def render(directory: str) -> str:
  """`RESULTS.md` of the run files in `directory`."""
  runs = load(directory)
  lines = ["# Benchmark results", "",
           "Rendered by `python benchmarks/run_all.py --render` from "
           "`benchmarks/results/*.json`; do not edit by hand. How the "
           "figures are taken and which decides: `benchmarks/README.md`. "
           "Library docstrings link to rows by their anchors.", "",
           "## Interleaved pairs", "",
           "The other variant's time per marginal step over ours (over the "
           "default's, for a default), one ratio per round: above 1 favours "
           "ours. Each cell: **median** (interquartile range; min-max; "
           "pairs). `CPU` is the process's CPU time per step, `wall` its "
           "wall time; `loaded`: a busy loop held one of the cores. The "
           "verdict is of the CPU ratios, idle and loaded (`verdict`: parity "
           "within 2% below the floor; `within the spread` where the floor "
           "lies inside the interquartile range). Each row comes from the "
           "newest run that measured it.", ""]
  rows = []
  for anchor, workload, other, floor, claim, why in PAIR_ROWS:
    run = next((r for r in reversed(runs) if _session_with(r, workload,
                                                           other)), None)
    if not run:
      rows.append([f'<a id="{anchor}"></a>{claim}', *["not measured"] * 4,
                   floor or "", "", why, ""])
      continue
    ratios = pair_ratios(_session_with(run, workload, other), other)
    cells = [ratios.get(c, {}).get(f) for f in ("cpu", "wall")
             for c in training_loops.CONDITIONS]
    rows.append([f'<a id="{anchor}"></a>{claim}', *map(_fmt, cells),
                 floor or "", floor and verdict([c for c in cells[:2] if c],
                                                floor) or "", why,
                 _source(run)])
  lines += _table(["claim", "CPU idle", "CPU loaded", "wall idle",
                   "wall loaded", "floor", "", "why", "run"], rows)
  lines += ["", "## The defaults' scripts", "",
            "From the full run's scripts (`input_pipelines.py`, "
            "`checkpoint_cost.py`, `loop_costs.py`, `startup.py`), each run "
            "idle and then loaded; a ratio above 1 favours the default.", ""]
  rows = []
  for anchor, floor, claim, why, figure in SCRIPT_ROWS:
    run = next((r for r in reversed(runs)
                if figure.script in r.get("scripts", {})), None)
    if not run:
      rows.append([f'<a id="{anchor}"></a>{claim}', "not measured", "", "",
                   "", "", why, ""])
      continue
    measured = run["scripts"][figure.script]
    # A run stopped part-way may have measured one condition only.
    by = {c: figure(measured[c]) if c in measured else (None, "")
          for c in training_loops.CONDITIONS}
    ratios = [{"median": v[0]} for v in by.values() if v[0] is not None]
    rows.append([f'<a id="{anchor}"></a>{claim}',
                 # A row without a floor is a figure, not a comparison.
                 *(f"{v[0]:.3f}" if floor and v[0] is not None else
                   "not measured" if floor else "" for v in by.values()),
                 floor or "", verdict(ratios, floor) if floor else "",
                 by["idle"][1], why, _source(run)])
  lines += _table(["claim", "idle", "loaded", "floor", "", "measured (idle)",
                   "why", "run"], rows)
  lines += ["", "## Runs", "",
            "Every run file, with its headline (ours against stock TFM: "
            "CPU and wall ratios, idle and loaded, as above) and the "
            "machine's load average over the windows: the same commit in "
            "other conditions should give the same CPU ratio.", ""]
  rows = []
  for run in runs:
    m = run["machine"]
    for name, session in run.get("sessions", {}).items():
      if "stock_tfm" not in session["variants"]:
        continue
      ratios = pair_ratios(session, "stock_tfm")
      load_avg = statistics.median(w[session["window_fields"].index(
          "load_1min")] for w in session["windows"])
      rows.append([_source(run), f"{run['mode']} {run['label']}".strip() + (
          "" if run.get("complete", True) else " (stopped part-way)"),
                   run["busy_cores_throughout"], name, *(
                       _fmt(ratios.get(c, {}).get(f)) for f in ("cpu", "wall")
                       for c in training_loops.CONDITIONS), f"{load_avg:.1f}",
                   run.get("minutes", ""), f"{m['cpu']}, {m['cores']} cores, "
                   f"{m['date']}"])
  lines += _table(["run", "mode", "cores busy throughout", "session",
                   "CPU idle", "CPU loaded", "wall idle", "wall loaded",
                   "load avg", "minutes", "machine"], rows)
  lines += _tfm_memory(runs)
  lines += _first_step(runs)
  lines += _precision(runs)
  with_sessions = [run for run in runs if run.get("sessions")]
  if with_sessions:
    lines += _details(with_sessions[-1])
  lines += _gpu()
  lines += _label_check(os.path.join(directory, "label_check"))
  return "\n".join(lines) + "\n"


# Anchors of the time to first step, by workload (`first_step.py`).
FIRST_STEP_ROWS = (
    ("first-step-resnet-imagenet", "resnet_imagenet",
     "TFM's `resnet_imagenet` (ResNet-18, 64x64 JPEG records, batch 2): "
     "ours (`launchers/train.py`) against stock (`official.vision.train`)"),
    ("first-step-digits-convnet", "digits_convnet",
     "`digits_convnet`, the default experiment: ours against stock TFM's "
     "`train_lib.run_experiment`"),
    *((f"first-step-tfm-{name.split('_')[0]}", name,
       f"TFM's `{name}` (its test's config and data): ours against stock "
       f"(`{_tfm_experiments.stock_script(name, relative=True)}`)")
      for name in _tfm_experiments.NAMES),
)


def _first_step(runs: Sequence[Dict[str, Any]]) -> List[str]:
  """The time to first step: each workload's rows from the newest
  `first_step.py` record that measured it."""
  lines = ["", "## Time to first step", "",
           "`first_step.py`: fresh processes, each training one step from a "
           "cold interpreter and exiting, ours and stock in interleaved "
           "pairs (which runs first alternates each round). Seconds from the "
           "spawn, CPU time (user and system, all threads) and wall time, to "
           "the first step's line and to the exit; each cell: **median** "
           "(interquartile range; min-max; processes). The ratio is stock's "
           "over ours per pair: above 1 favours ours. The CPU time to the "
           "first step decides (`verdict`, floor 1: no slower than stock). "
           "`ours` is a first launch (an empty AutoGraph cache), "
           "`ours_relaunch` the launch after it (the cache it filled); "
           "records before the cache have `ours` only. "
           "Each workload's rows come from the newest record that measured "
           "it.", ""]
  records = [r for r in runs if "first_step" in r]
  if not records:
    return lines + ["Not measured yet."]
  rows, used = [], []
  for anchor, workload, claim in FIRST_STEP_ROWS:
    run = next((r for r in reversed(records)
                if workload in first_step.pair_ratios(r["first_step"])), None)
    if not run:
      rows.append([f'<a id="{anchor}"></a>{claim}', "stock/ours",
                   *["not measured"] * len(first_step.FIGURES), "", ""])
      continue
    if run not in used:
      used.append(run)
    stats = first_step.per_variant(run["first_step"])
    variants = [v for v in first_step.VARIANTS if (workload, v) in stats]
    for i, variant in enumerate(variants):
      rows.append([f'<a id="{anchor}"></a>{claim}' if i == 0 else "",
                   variant, *(_fmt(stats[(workload, variant)].get(f), 1)
                              for f in first_step.FIGURES),
                   f"{stats[(workload, variant)]['peak_rss_mib']['median']:.0f}"
                   if "peak_rss_mib" in stats[(workload, variant)] else "",
                   ""])
    for ours in (v for v in variants if v != "stock"):
      ratios = first_step.pair_ratios(run["first_step"], ours)[workload]
      rows.append(["", f"stock/{ours}", *(_fmt(ratios.get(f))
                                          for f in first_step.FIGURES), "",
                   f"{verdict([ratios['first_step_cpu_s']], 1.0)} "
                   f"(`{run['file']}`)"])
  lines += _table(["workload", "", "CPU to first step (s)",
                   "wall to first step (s)", "CPU to exit (s)",
                   "wall to exit (s)", "peak RSS (MiB)",
                   "CPU to first step, floor 1"], rows) + [""]
  for run in used:
    record = run["first_step"]
    loads = [row[record["fields"].index("load_1min")]
             for row in record["processes"]]
    rounds = len({row[0] for row in record["processes"]})
    stopped = "" if run.get("complete", True) else " (stopped part-way)"
    m = run["machine"]
    lines.append(f"From {_source(run)}: {rounds} rounds{stopped}, "
                 f"{run['busy_cores_throughout']} cores kept busy, load "
                 "average (1 min, at each spawn) "
                 f"{_fmt(_common.spread(loads), 1, '')}; {m['cpu']}, "
                 f"{m['cores']} cores, {m['date']}.")
  return lines


def _label_check(directory: str) -> List[str]:
  """The label check's cost, from the newest `label_check.py` record."""
  lines = ["", '## <a id="label-check"></a>The label check in the input '
           "(`label_check.py`)", ""]
  paths = sorted(glob.glob(os.path.join(directory, "*.json")))
  if not paths:
    return lines + ["Not measured yet."]
  with open(paths[-1]) as f:
    run = json.load(f)
  m = run["machine"]
  lines += [
      f"From `results/label_check/{os.path.basename(paths[-1])}` "
      f"({m['commit']}{'+' if m.get('uncommitted_changes') else ''}; "
      f"{m['cpu']}, {m['cores']} cores, {run.get('busy_cores', 0)} held "
      "busy): `tfm_ext.training.labels.checked` on each batch of the task's "
      "own training input, against the same input unchecked, in rounds "
      "interleaved (order rotated). Each cell: **median** (interquartile "
      "range; min-max; rounds). CPU is the process's, every thread. What "
      "decides is the check alone (the same batches held in memory, drained "
      "with and without it) as a share of the plain step's CPU: the paired "
      "steps cannot tell 1% on a shared machine.", ""]
  names = {"digits_convnet": "`digits_convnet` (its config)",
           "resnet_imagenet": "`resnet_imagenet` (ResNet-50, 224x224, "
                              "batch 2)"}
  rows = [[names.get(name, f"`{name}`"),
           _fmt(w["cpu_ms_per_step"]["plain"], 2),
           _fmt(w["cpu_ms_per_step"]["checked"], 2),
           _fmt(w["check_share_of_cpu_percent"], 2),
           _fmt(w["stage_cpu_us_per_batch"], 1),
           _fmt(w["stage_share_of_step_percent"], 2)]
          for name, w in run.items() if isinstance(w, dict)
          and "cpu_ms_per_step" in w]
  return lines + _table(
      ["workload", "plain step, CPU ms", "checked step, CPU ms",
       "paired steps: checked/plain - 1, %",
       "the check alone: CPU us a batch",
       "the check alone: % of the plain step's CPU"], rows)


def _precision(runs: Sequence[Dict[str, Any]]) -> List[str]:
  """bfloat16 against float32, from the newest `precision.py` record."""
  lines = ["", "## bfloat16 against float32", "",
           "`precision.py`: fresh `launchers/train.py` processes in "
           "deterministic mode, float32 and "
           "`runtime.mixed_precision_dtype=bfloat16` from the same seed (the "
           "same initial weights and batches). Each cell: **median** "
           "(interquartile range; min-max; seeds). The CPU ratio is "
           "float32's CPU time over bfloat16's for the whole run, start-up "
           "included: above 1, bfloat16 is cheaper.", ""]
  run = next((r for r in reversed(runs) if "precision" in r), None)
  if not run:
    return lines + ["Not measured yet."]
  figures = precision.summary(run["precision"])
  m = run["machine"]
  lines += [f"From {_source(run)}: {m['cpu']}, {m['cores']} cores; bfloat16 "
            "instructions: "
            f"{', '.join(k for k, v in m['bf16'].items() if v) or 'none'}.",
            ""]
  digits, resnet = figures.get("digits"), figures.get("resnet50")
  rows = []
  if digits:
    rows.append(['<a id="bfloat16-accuracy-digits"></a>`digits_convnet`, '
                 "500 steps: validation accuracy", _fmt(digits["float32"], 4),
                 _fmt(digits["bfloat16"], 4),
                 _fmt(digits["difference"], 4), _fmt(digits["cpu_ratio"])])
  if resnet:
    rows.append(['<a id="bfloat16-loss-resnet50"></a>`resnet50_imagenet_ctl`'
                 f", batch 2, {resnet['steps']} steps: training loss, first "
                 "loop -> last",
                 f"{resnet['first']['float32']:.4f} -> "
                 f"{resnet['last']['float32']:.4f}",
                 f"{resnet['first']['bfloat16']:.4f} -> "
                 f"{resnet['last']['bfloat16']:.4f}",
                 f"largest gap over the curve: {resnet['largest_gap']:.4f}",
                 f"{resnet['cpu_ratio']:.3f}"])
  return lines + _table(["measure", "float32", "bfloat16",
                         "bfloat16 - float32", "CPU ratio"], rows)


def _tfm_memory(runs: Sequence[Dict[str, Any]]) -> List[str]:
  """Peak memory and first step of TFM's experiments in their sessions."""
  lines = ["", "## TFM's own experiments: memory", "",
           "The sessions of the rows `target-tfm-*` above (`--only="
           "tfm_experiments`): each side's peak resident memory over its "
           "whole session (`VmHWM`), and the seconds from its spawn to its "
           "first progress line (one process each, started while the other "
           "was stopped: `first_step.py` times that properly). Below 1, "
           "stock/ours favours stock.", ""]
  rows = []
  for name in _tfm_experiments.NAMES:
    run = next((r for r in reversed(runs)
                if _session_with(r, name, "stock_tfm")), None)
    if not run:
      rows.append([f"`{name}`", *["not measured"] * 3, "", "", ""])
      continue
    v = _session_with(run, name, "stock_tfm")["variants"]
    peaks = [v[side].get("peak_rss_mib") for side in ("ours", "stock_tfm")]
    rows.append([f"`{name}`", *(f"{p:.0f}" if p else "" for p in peaks),
                 f"{peaks[1] / peaks[0]:.3f}" if all(peaks) else "",
                 *(f"{v[side]['first_step_seconds']:.1f}"
                   for side in ("ours", "stock_tfm")), _source(run)])
  return lines + _table(["experiment", "peak RSS ours (MiB)",
                         "peak RSS stock (MiB)", "stock/ours",
                         "first step ours (s)", "first step stock (s)",
                         "run"], rows)


def _details(run: Dict[str, Any]) -> List[str]:
  """Each session of `run`: every variant's ms per step and memory."""
  m = run["machine"]
  lines = ["", f"## The newest run: {_source(run)}", "",
           f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
           f"{m['python']}, TensorFlow {m['tensorflow']}, tf-models-official "
           f"{m['tf_models_official']}; bfloat16 instructions: "
           f"{', '.join(k for k, v in m['bf16'].items() if v) or 'none'}; "
           f"{run.get('minutes')} minutes.", ""]
  for name, session in run.get("sessions", {}).items():
    w = session["workload"]
    lines += [f"### {name}", "",
              f"`{w['experiment']}`, global batch {w['global_batch_size']}, "
              f"{w['steps_per_loop']} steps per loop, windows of "
              f"{session['loops']} loops; hardware counters: "
              f"{session['counters']}. Milliseconds per step: median "
              "(interquartile range; min-max; windows).", ""]
    stats = per_step(session)
    rows = []
    for variant, v in session["variants"].items():
      rows.append([variant, v["extra"] and f"`{v['extra']}`",
                   *(_fmt(stats.get((c, variant), {}).get(f), 1, "")
                     for f in ("cpu_ms", "wall_ms")
                     for c in training_loops.CONDITIONS),
                   f"{v['first_step_seconds']:.1f}",
                   f"{v['peak_rss_mib']:.0f}" if v.get("peak_rss_mib") else ""])
    lines += _table(["variant", "overrides", "CPU idle", "CPU loaded",
                     "wall idle", "wall loaded", "first step (s)",
                     "peak RSS (MiB)"], rows) + [""]
  return lines


def _gpu() -> List[str]:
  path = _common.script("gpu_results.json")
  lines = ["", "## GPU (`gpu_resnet50.py`)", ""]
  if not os.path.exists(path):
    return lines + ["Not run on a GPU yet."]
  with open(path) as f:
    gpu = json.load(f)
  return lines + [f"{gpu['device']}, commit {gpu['machine']['commit']}:", ""
                  ] + _table(["configuration", "images/s"], [
                      [name, f"{c['examples_per_second']:.0f}"
                       if "examples_per_second" in c else
                       next(iter(c))] for name, c in
                      gpu["configurations"].items()])


def main(argv=None) -> Optional[str]:
  """Runs a mode, then renders `RESULTS.md`; see the module docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--quick", action="store_true",
                    help="The headline pairs: under 10 minutes on 2 cores.")
  mode.add_argument("--smoke", action="store_true",
                    help="Tiny: one pair, into a scratch directory.")
  mode.add_argument("--render", action="store_true",
                    help="Only render RESULTS.md from the results files.")
  parser.add_argument("--label", default="",
                      help="The run's condition, in its file name.")
  parser.add_argument("--busy", type=int, default=0,
                      help="Cores kept busy by other processes all along.")
  parser.add_argument("--only", default="",
                      help="Comma-separated: only these sessions and scripts "
                      "of the mode (full: "
                      f"{', '.join([*SESSIONS['full'], *SCRIPTS, *GROUPS])}"
                      ").")
  parser.add_argument("--results", default=RESULTS_DIR,
                      help="The results directory (smoke: a scratch one).")
  args = parser.parse_args(argv)
  directory = args.results
  if not args.render:
    if args.smoke and args.results == RESULTS_DIR:
      directory = tempfile.mkdtemp(prefix="bench_smoke_")
    mode_name = "quick" if args.quick else "smoke" if args.smoke else "full"
    only = [session for name in args.only.split(",") if name
            for session in GROUPS.get(name, (name,))]
    unknown = sorted(set(only) - set(SESSIONS[mode_name]) - set(
        SCRIPTS if mode_name == "full" else ()))
    if unknown:
      parser.error(f"--only: unknown {unknown} in the {mode_name} mode")
    print("wrote", run(mode_name, args.label, args.busy, directory, only))
  out = os.path.join(os.path.dirname(directory.rstrip("/")), "RESULTS.md")
  if directory != RESULTS_DIR:
    out = os.path.join(directory, "RESULTS.md")
  with open(out, "w") as f:
    f.write(render(directory))
  print("rendered", out)
  return out


if __name__ == "__main__":
  main()
