"""Renders `RESULTS.md` from the results `run_all.py` gathers.

`render(results, gpu)` returns the Markdown. Every table is rendered from
records: the targets and the defaults from `claims` (one row per `Claim`,
its anchor the row's HTML id), the rest from the results as the benchmarks
wrote them (one row per variant, split, checkpoint, shuffle buffer, ...).
The prose says how the figures were taken; the figures are in the tables.
`python benchmarks/run_all.py --render=benchmarks/results.json` renders the
page again without measuring anything.
"""

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from benchmarks import _format
from benchmarks import claims as claims_lib

Results = Dict[str, Any]

# A run this far below its variant's median ran on a slowed-down machine.
SLOW_RUN = 0.9
# The machine was quiet if every run found this share of its cores free.
QUIET_CORES = 0.85


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
  """A Markdown table."""
  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join(" --- " for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |"
            for row in rows]
  return "\n".join(lines) + "\n"


def fields(pairs: Iterable[Tuple[str, Any]]) -> str:
  """A two-column table of named values."""
  return table(("", ""), pairs)


# The worse of two verdicts wins; a missed floor is in bold.
_VERDICTS = ("met", "parity", "missed")


def _status(claim: claims_lib.Claim,
            loaded: Optional[claims_lib.Claim]) -> str:
  if claim.verdict is None:
    return ""
  both = [claim.verdict] + ([loaded.verdict] if loaded and loaded.verdict
                            else [])
  verdict = max(both, key=_VERDICTS.index)
  text = "**missed**" if verdict == "missed" else verdict
  return text + (" (idle only)" if len(both) == 1 else "")


def _spread(claim: Optional[claims_lib.Claim]) -> str:
  if claim is None or not claim.spread:
    return ""
  text = (f"{_format.ratio(min(claim.spread))} to "
          f"{_format.ratio(max(claim.spread))}")
  if claim.floor is not None:
    reached = sum(ratio >= claim.floor for ratio in claim.spread)
    text += f" ({reached} of {len(claim.spread)} >= {claim.floor})"
  return text


def _ratio(claim: Optional[claims_lib.Claim]) -> str:
  if claim is None:
    return "not measured"
  return "" if claim.ratio is None else _format.ratio(claim.ratio)


def claims_table(claims: Iterable[claims_lib.Claim],
                 loaded: Iterable[claims_lib.Claim] = (),
                 anchor_prefix: Callable[[str], str] = lambda anchor: ""
                 ) -> str:
  """One row per claim, idle and loaded, its anchor first (what docstrings
  link to); met when both conditions reach the floor, parity when one is
  just below it (`claims.PARITY`)."""
  by_anchor = {c.anchor: c for c in loaded}
  return table(
      ("claim", "ratio idle", "ratio loaded", "floor", "",
       "each repeat, idle", "each repeat, loaded", "measured (idle)", "why"),
      ((f'<a id="{anchor_prefix(c.anchor)}{c.anchor}"></a>{c.name}',
        _ratio(c), _ratio(by_anchor.get(c.anchor)),
        "" if c.floor is None else c.floor,
        _status(c, by_anchor.get(c.anchor)), _spread(c),
        _spread(by_anchor.get(c.anchor)), c.measured, c.why)
       for c in claims))


def loaded_view(results: Results) -> Optional[Results]:
  """`results` with each benchmark's loaded figures in place of its idle
  ones; None if nothing was measured loaded."""
  loaded = results.get("loaded")
  return {**results, **loaded} if loaded else None


def _claims(results: Results, rows: Callable[[Results], List[Any]]
            ) -> Tuple[List[Any], List[Any]]:
  """`rows` of the idle figures and of the loaded ones (if any)."""
  loaded = loaded_view(results)
  return rows(results), (rows(loaded) if loaded else [])


def _runs(training_loops: Results) -> Iterable[Tuple[str, str, int, Results,
                                                      Results]]:
  """(workload, variant, repeat, run, variant's median) of each run."""
  for workload, result in training_loops.items():
    for name, variant in result["variants"].items():
      for i, run in enumerate(variant["runs"]):
        yield workload, name, i + 1, run, variant["median"]


def slow_runs(training_loops: Results) -> List[str]:
  """`workload variant (repeat n)` of each slow run."""
  return [f"{workload} {name} (repeat {repeat})"
          for workload, name, repeat, run, median in _runs(training_loops)
          if run["examples_per_second"]
          < SLOW_RUN * median["examples_per_second"]]


MODES = {
    "full": "",
    "quick": " (`--quick`: the headline comparisons)",
    "smoke": " (`--smoke`: tiny sizes, one repeat)",
}


def _mode(results: Results) -> str:
  # Results written before the quick mode had `quick` for the smoke run.
  return results.get("mode") or ("smoke" if results.get("quick") else "full")


def _conditions(results: Results) -> List[Tuple[str, Results]]:
  """`(condition, training_loops)` of each condition measured."""
  out = [("idle", results["training_loops"])]
  loaded = (results.get("loaded") or {}).get("training_loops")
  return out + ([("loaded", loaded)] if loaded else [])


def machine_section(results: Results, title: str) -> str:
  """Where and on what code the figures were taken, and how quiet it was."""
  m = results["machine"]
  conditions = _conditions(results)
  cores = [run["available_cores"]
           for _, loops in conditions for *_, run, _ in _runs(loops)]
  slow = [run if condition == "idle" else f"{run}, {condition}"
          for condition, loops in conditions for run in slow_runs(loops)]
  quiet = min(cores) >= QUIET_CORES * m["cores"] and not slow
  bf16 = [flag for flag, present in m.get("bf16", {}).items() if present]
  busy = (results.get("loaded") or {}).get("training_loops")
  return (
      f"{title}\n\n"
      + fields((
          ("CPU", m["cpu"]), ("cores", m["cores"]),
          ("bfloat16 instructions", ", ".join(bf16) if bf16 else
           "none (neither avx512_bf16 nor amx_bf16)" if "bf16" in m
           else "not recorded"),
          ("memory", f"{m['memory_gib']} GiB"), ("Python", m["python"]),
          ("TensorFlow", m["tensorflow"]),
          ("tf-models-official", m["tf_models_official"]),
          ("commit", m["commit"] + (" (plus uncommitted changes in the "
                                    "working tree)"
                                    if m["uncommitted_changes"] else "")),
          ("date", m["date"]),
          ("run time", f"{results['seconds'] / 60:.1f} min"
           + MODES[_mode(results)]
           + "".join(f" (`--{flag}={results[flag]}`)"
                     for flag in ("repeats", "variants") if results.get(flag))
           + (" (the training loops taken from an earlier run, not "
              "timed here)" if results.get("training_loops_from") else "")
           + (f"; **stopped before** {', '.join(results['not_run'])}"
              if results.get("not_run") else "")),
          *((("taken from earlier runs", _kept(results["kept"])),)
            if results.get("kept") else ()),
          ("conditions", "idle, and loaded: "
           f"{next(iter(busy.values()))['busy_cores']} of {m['cores']} cores "
           "kept busy by other processes (a Python busy loop each) while "
           "each run trained" if busy else "idle only"),
          ("cores free before each training run",
           f"{min(cores):.1f} to {max(cores):.1f}"),
          (f"training runs over {1 - SLOW_RUN:.0%} below their variant's "
           "median", f"{len(slow)} of {len(cores)}"
           + (": " + ", ".join(slow) if slow else "")),
          ("the machine", "quiet" if quiet else
           "**shared with other work during this run**: figures are low "
           "and noisy, ratios less so (variants are interleaved); re-run "
           "on a quiet machine before quoting absolute figures")))
      + "\nBefore each training run the benchmark waits (up to 10 s) for "
      "the machine to be quiet and records how many of its cores a busy "
      "loop per core got (`cores free`); loaded runs start their busy "
      "loops after that. A run far below its variant's median ran while "
      "the machine slowed down, which `cores free`, measured before the "
      "run, does not catch.\n")


def _kept(kept: Results) -> str:
  """What this run did not time itself (scripts a `--only` run kept, the
  workloads of a `--training_loops` file), by the commit and date that
  measured them."""
  runs: Dict[Tuple[str, str], List[str]] = {}
  for name, machine in kept.items():
    runs.setdefault((machine["commit"], machine["date"]), []).append(name)
  return "; ".join(f"{', '.join(names)} (commit {commit}, {date})"
                   for (commit, date), names in runs.items())


RATIOS = (
    "`ratio` is of the medians, ours over the other (times: the other's "
    "over ours), so above 1 favours ours; idle and loaded (other processes "
    "kept half the cores busy) are measured in the same repeats, each run "
    "idle then loaded. A row is met when its ratio reaches its floor in "
    "both conditions, and at parity when neither is missed and one is "
    f"within {claims_lib.PARITY:.0%} below the floor: a tie, the noise of "
    "a shared machine (a default that ties stays). `each repeat` gives the ratios of the runs of one "
    "repeat (or pass), which ran one after the other, and how many reach "
    "the floor.")


def targets_section(results: Results, prefix=lambda anchor: "") -> str:
  """The targets of issue 5, point 3, each met or missed."""
  return (
      "## Targets (issue 5, point 3)\n\n" + RATIOS + " `startup` is the "
      "time to first step less the steady-state time of the further steps "
      "of a variant's first loop: stock TFM and Keras show their first step "
      "only when a whole first loop has run, ours after one step.\n\n"
      + claims_table(*_claims(results, claims_lib.targets), prefix))


def defaults_section(results: Results, prefix=lambda anchor: "") -> str:
  """Each default of issue 5, point 4, with the figure that backs it."""
  return (
      "## Defaults and the figures behind them (issue 5, point 4)\n\n"
      "digits_convnet through our launcher unless said otherwise. Each row "
      "has an anchor that the library's docstrings link to "
      "(`RESULTS.md#default-input-pool`); `ratio` is the default over the "
      "alternative, above 1 in the default's favour, and a **missed** floor "
      "means this run's figure does not back the default.\n\n"
      + claims_table(*_claims(results, claims_lib.defaults), prefix))


def _repeats(results: Results) -> int:
  return max(loops["repeats"] for loops in results["training_loops"].values())


def headline_section(quick: Results) -> str:
  """The quick mode's figures: the headline comparisons, idle and loaded."""
  return (
      machine_section(quick, "## Headline (`run_all.py --quick`)")
      + "\nThe quick mode: ours against stock TFM, the hand-written loop and "
      "Keras `Model.fit` on digits_convnet, ours against stock TFM on "
      "ResNet50 (synthetic images), idle and loaded, "
      f"{_repeats(quick)} repeats, windows of a few seconds: noisier than "
      "the full run's. " + RATIOS + "\n\n"
      + claims_table(*_claims(quick, claims_lib.targets))
      + "\nThe defaults these runs measure:\n\n"
      + claims_table(*_claims(quick, claims_lib.defaults))
      + training_tables(quick))


def _workload_row(workload: str, loops: Results) -> Sequence[Any]:
  config = loops["config"]
  return (workload, f"`{config['experiment']}`", config["global_batch_size"],
          config["train_steps"], config["steps_per_loop"],
          f"{config['warmup_steps']}..{config['train_steps']}",
          len(loops["variants"]["ours"]["runs"]),
          f"`{loops['params_override']}`")


def _variant_row(name: str, variant: Results, loops: Results
                 ) -> Sequence[Any]:
  median = variant["median"]
  ratio = (1.0 if name == "ours" else
           loops["ours_over"].get(name, {}).get("examples_per_second"))
  return (_format.variant(name), f"{median['examples_per_second']:.1f}",
          f"{ratio:.3f}" if ratio else "",
          f"{median['time_to_first_step_seconds']:.2f}",
          variant["runs"][0]["first_loop_steps"],
          f"{median['startup_seconds']:.2f}",
          f"{median['peak_rss_mib']:.0f}",
          f"{median['process_peak_rss_mib']:.0f}",
          f"{median['available_cores']:.1f}",
          # Results from before the column was measured have none.
          "" if median.get("cores_used") is None
          else f"{median['cores_used']:.2f}",
          ", ".join(f"{run['examples_per_second']:.1f}"
                    for run in variant["runs"]))


def training_tables(results: Results) -> str:
  """The workloads, then per workload and condition every variant's
  figures."""
  conditions = _conditions(results)
  parts = [table(("workload", "experiment", "global batch", "steps",
                  "`steps_per_loop`", "examples/s over steps", "repeats",
                  "overrides"),
                 (_workload_row(w, l)
                  for w, l in results["training_loops"].items()))]
  for workload, figures in results["training_loops"].items():
    parts.append(f"\n### {workload}\n\n")
    if not figures["config"].get("targets", True):
      parts.append(
          "Not one of issue 5's comparisons: at one step per loop, what "
          "each variant does between loops weighs most (ours and stock TFM "
          "also write that loop's summaries). Host work a loop is its time "
          "per step here less its time per step at many steps per loop "
          "([`steps_per_loop`'s row](#default-steps-per-loop)).\n\n")
    for condition, loops in conditions:
      if workload not in loops:
        continue
      if len(conditions) > 1:
        parts.append(f"{condition}:\n\n")
      parts.append(table(
          ("variant", "examples/s", "ours / variant", "first step (s)",
           "first loop (steps)", "startup (s)", "peak RSS training (MiB)",
           "peak RSS process (MiB)", "cores free", "cores used",
           "examples/s of each run"),
          (_variant_row(name, variant, loops[workload])
           for name, variant in loops[workload]["variants"].items())))
      parts.append("\n")
  return "".join(parts)


def training_section(results: Results) -> str:
  """How the training loops were timed, then their tables."""
  return (
      "## Training loops (`training_loops.py`)\n\n"
      "Same model, data, global batch and steps for every variant; each run "
      "a fresh process, variants interleaved, medians of the repeats. "
      "Examples/s are over the same steps for all (from `warmup_steps`, "
      "where every variant ends a loop after its second, to the last), "
      "timed from outside the runs by the arrival of their per-loop "
      "progress lines; time to first step runs from process start. Peak "
      "RSS training: at the last progress line; process: over the whole "
      "process (stock TFM's `run_experiment` counts FLOPs after training). "
      "Cores used: the process's CPU time (all threads, user and system) "
      "over the wall time of the same steps; a variant that uses more "
      "cores for the same steps loses more when other work holds one. "
      "Checkpoints: stock TFM's `CheckpointManager` saves one after the "
      "first loop, before the timed steps; ours and stock TFM save one "
      "after the last step; nothing evaluates.\n\n"
      + training_tables(results))


def _pipeline_row(split: str, figures: Results) -> Sequence[Any]:
  ips = figures["images_per_second"]
  return (split, _format.rate(ips["ours"]), _format.rate(ips["reference"]),
          f"{figures['ours_over_reference']:.3f}",
          _format.rate(ips["ours_autotune_on"]),
          _format.rate(ips["ours_one_thread"]))


def pipelines_section(results: Results) -> str:
  """ResNet input pipelines against the reference `input_fn`."""
  ip = results["input_pipelines"]
  sizes = ip["sizes"]
  return (
      "## Input pipelines (`input_pipelines.py`)\n\n"
      "Images/s on the same JPEG TFRecords (the tests' photographs and "
      "digits, copied), medians of interleaved passes, each pass in an "
      "order rotated by one. Training: batches timed on a fresh iterator "
      "after a warm-up; evaluation: whole epochs, each on a fresh iterator, "
      "its creation included. Per image both run the reference's "
      "`imagenet_preprocessing` (ours imports it); ours has tf.data's "
      "autotuning off: one parallel call per core from the first image and "
      "a fixed prefetch (`input_pipeline.PREFETCH_BATCHES`). The "
      "[targets](#target-resnet-train-input-pipeline) and the "
      "[defaults](#default-parallel-map) rows compare them.\n\n"
      + fields((
          ("records", f"{ip['records']['train']} training, "
                      f"{ip['records']['eval']} evaluation"),
          ("copies of the tests' images", sizes["copies"]),
          ("batch", sizes["batch_size"]), ("passes", sizes["passes"]),
          ("training: batches timed (after a warm-up of)",
           f"{sizes['batches']} ({sizes['warmup']})"),
          ("evaluation: epochs timed", sizes.get("eval_epochs", 1))))
      + "\n" + table(
          ("split", "ours", "reference `input_fn`", "ours / reference",
           "ours, autotune on", "ours, one thread"),
          (_pipeline_row(split, ip[split]) for split in ("train", "eval"))))


def flops_section(results: Results) -> str:
  """The matmul peak and ResNet50's achieved FLOP/s."""
  f = results["flops"]
  return (
      "## FLOP/s (`flops.py`)\n\n"
      "The peak is the best median GFLOP/s of several `tf.linalg.matmul` "
      "calls on n x n float32 matrices. ResNet50's forward FLOPs are TFM's "
      "`try_count_flops`, a multiply-add counted as 2 (the usual \"4.1 "
      "GFLOPs\" are multiply-adds); a training step is taken as 3x that. "
      "Achieved = that x the training loops' median examples/s on "
      "ResNet50.\n\n"
      + fields((
          ("fp32 matmul peak", f"**{f['peak_gflops']:.1f} GFLOP/s**"),
          ("GFLOP/s by n", ", ".join(
              f"{n}: {g:.1f}" for n, g in f["gflops_by_size"].items())),
          ("ResNet50 forward, 224x224 image",
           f"{f['resnet50_forward_flops_per_example'] / 1e9:.2f} GFLOPs"),
          ("ResNet50 training step, per example",
           f"{f['resnet50_training_step_flops_per_example'] / 1e9:.1f} "
           "GFLOPs")))
      + "\n" + table(("variant", "achieved GFLOP/s", "of peak"),
                     ((_format.variant(name), f"{a['gflops']:.1f}",
                       f"{a['fraction_of_peak']:.1%}")
                      for name, a in f.get("achieved", {}).items())))


def checkpoint_section(results: Results) -> str:
  """Checkpoint size and save time, with and without the input iterator."""
  c = results["checkpoint_cost"]
  d, r, it = c["digits_convnet"], c["resnet50_model"], c["resnet50_iterator"]
  buffers = it["by_shuffle_buffer"]
  return (
      "## Checkpoint cost (`checkpoint_cost.py`, issue 6, point 5)\n\n"
      "### digits_convnet\n\nTrainers built as the driver builds them, "
      "trained, then saved through a `tf.train.CheckpointManager`; medians "
      "of several saves after a first one (which traces the save "
      "functions), the variants interleaved. The async row is the blocking "
      "part of a save with `experimental_enable_async_checkpoint`. What "
      "they back: [synchronous saves](#default-sync-checkpoints), [the "
      "iterator in checkpoints](#default-checkpoint-input-iterator).\n\n"
      + fields((("steps trained before the saves",
                 d["checkpoint_interval_steps"]),
                ("saves in each median", d["with_iterator"]["saves"]),
                ("shuffle buffer", f"{d['shuffle_buffer_size']} records")))
      + "\n" + table(
          ("checkpoint", "bytes", "save (median)", "first save"),
          ((name.replace("_", " "), f"{d[name]['bytes']:,}",
            _format.ms(d[name]["save_seconds"]),
            _format.ms(d[name]["first_save_seconds"]))
           for name in ("with_iterator", "without_iterator",
                        "with_iterator_async_call")))
      + "\n### ResNet50\n\nModel and optimizer (momentum slots) of the "
      "`resnet50_imagenet_ctl` trainer, and its training input pipeline's "
      "iterator. tf.data refuses to save that iterator as it is (below); "
      "the sizes are measured with `tf.data.Options()."
      "experimental_external_state_policy = ExternalStatePolicy.IGNORE`, "
      "which saves the buffers but not the random crop's state (so even "
      "then a resume would not be exact). What they back: [no first-loop "
      "checkpoint](#default-no-first-loop-checkpoint), [no iterator in "
      "ResNet's checkpoints](#default-resnet-iterator-out).\n\n"
      + fields((
          ("model and optimizer", _format.mib(r["bytes"])),
          ("save (median)", f"{r['save_seconds']:.2f} s"),
          ("first save", f"{r['first_save_seconds']:.2f} s"),
          ("tf.data on the iterator as it is",
           f"`{it['default_policy_error'] or '(it was not refused)'}`"),
          ("JPEG records", it["records"]),
          ("mean record", f"{it['record_bytes'] / it['records'] / 1e3:.1f}"
                          " KB"),
          ("batch", it["batch_size"]),
          ("a decoded batch", _format.mib(it["decoded_batch_bytes"]))))
      + "\n" + table(
          ("shuffle buffer", "records buffered", "iterator state",
           "save (s)"),
          ((buffer, min(int(buffer), it["records"]),
            _format.mib(buffers[buffer]["bytes"]),
            f"{buffers[buffer]['save_seconds']:.3f}")
           for buffer in sorted(buffers, key=int))))


def gpu_section(gpu: Optional[Results]) -> str:
  """The GPU script's results, or how to get them."""
  head = ("## GPU (`gpu_resnet50.py`)\n\n"
          "`python benchmarks/gpu_resnet50.py` runs ResNet50 through our "
          "launcher on one GPU: bfloat16 and float16, XLA off and on, "
          "synthetic data, batch 256, 120 steps (images/s over steps "
          "40..120), within 7.5 minutes; it writes "
          "`benchmarks/gpu_results.json`, which this page then shows.\n\n")
  if not gpu or gpu.get("dry_run"):
    return head + ("Not run on a GPU yet: the machine these figures come "
                   "from has none; the script was checked on the CPU with "
                   "`--dry_run`.\n")
  rows = []
  for name, result in gpu["configurations"].items():
    if "examples_per_second" not in result:
      rows.append((name, "", "", next(iter(result.values()))[:80]))
      continue
    rows.append((name, f"{result['examples_per_second']:.0f}",
                 f"{result['time_to_first_step_seconds']:.1f}", ""))
  return (head + fields((("device", gpu["device"]),
                         ("commit", gpu["machine"]["commit"])))
          + "\n" + table(("configuration", "images/s", "first step (s)",
                          "note"), rows))


def render(full: Optional[Results], quick: Optional[Results] = None,
           gpu: Optional[Results] = None) -> str:
  """The whole of `RESULTS.md`: the quick mode's headline, the full run,
  the GPU script's figures; each where there are results for it.

  A claim in both the headline and the full run keeps its anchor in the
  headline, the newer figures; the full run's row becomes `full-<anchor>`.
  """
  sections = [
      "# Benchmark results\n\nWritten by `python benchmarks/run_all.py` "
      "(see `benchmarks/README.md`); do not edit by hand. The library "
      "links to the rows of its defaults by their anchors "
      "(`#default-...`).\n"]
  taken = set()
  if quick:
    sections.append(headline_section(quick))
    taken = {claim.anchor for claim in claims_lib.targets(quick)
             + claims_lib.defaults(quick)}
  if full:

    def prefix(anchor):
      return "full-" if anchor in taken else ""
    sections += [
        machine_section(full, "## The full run: machine and code"),
        targets_section(full, prefix), defaults_section(full, prefix),
        training_section(full)]
    # A run stopped part-way has the scripts it finished.
    sections += [section(full) for section, script in (
        (pipelines_section, "input_pipelines"), (flops_section, "flops"),
        (checkpoint_section, "checkpoint_cost")) if script in full]
  sections.append(gpu_section(gpu))
  return "\n".join(sections)
