"""Renders `RESULTS.md` from the results `run_all.py` gathers.

`render(results, gpu)` returns the Markdown: the machine and commit, the
targets of issue 5 met or missed, the training-loop table per workload, the
defaults and the figures that justify them, input pipelines, FLOP/s,
checkpoint cost, and the GPU script's results if there are any.
"""

from typing import Any, Dict, List, Optional, Sequence

Results = Dict[str, Any]

VARIANT_NAMES = {
    "ours": "ours (`launchers/train.py`)",
    "stock_tfm": ("stock TFM (`train_lib.run_experiment`, "
                  "`base_trainer.Trainer`)"),
    "handwritten": "hand-written `tf.function` loop",
    "keras_fit": "Keras `Model.fit`",
    "keras_fit_tensorboard": ("Keras `Model.fit` with its `TensorBoard` "
                              "callback (the same summaries as ours)"),
    "ours_steps_per_loop_200": "ours, `steps_per_loop=200`",
    "ours_xla": "ours, `runtime.enable_xla=true`",
    "ours_one_replica_mirror": ("ours, `runtime.mirror_one_device=true` "
                                "(TFM's one-replica `MirroredStrategy`)"),
    "ours_tf_data_pool": ("ours, `runtime.dataset_num_private_threads=0` "
                          "(tf.data's own pool for the input)"),
}
# ImageNet's mean training JPEG record, for the shuffle-buffer estimate.
IMAGENET_RECORD_BYTES = 110e3
IMAGENET_SHUFFLE_BUFFER = 10000


def table(header: Sequence[str], rows: List[Sequence[Any]]) -> str:
  """A Markdown table."""
  lines = ["| " + " | ".join(header) + " |",
           "|" + "|".join(" --- " for _ in header) + "|"]
  lines += ["| " + " | ".join(str(cell) for cell in row) + " |"
            for row in rows]
  return "\n".join(lines) + "\n"


def _met(ok: bool) -> str:
  return "met" if ok else "**missed**"


def _ms(seconds: float) -> str:
  if seconds < 1e-3:
    return f"{seconds * 1e3:.2f} ms"
  return f"{seconds * 1e3:.1f} ms"


def _mib(size: float) -> str:
  return f"{size / 2**20:.2f} MiB"


# A run this far below its variant's median ran on a slowed-down machine.
SLOW_RUN = 0.9


def slow_runs(training_loops: Results) -> List[str]:
  """`workload variant (repeat n)` of each slow run."""
  return [f"{workload} {name} (repeat {i + 1})"
          for workload, result in training_loops.items()
          for name, variant in result["variants"].items()
          for i, run in enumerate(variant["runs"])
          if run["examples_per_second"]
          < SLOW_RUN * variant["median"]["examples_per_second"]]


def machine_section(results: Results) -> str:
  """Where and on what code the figures were taken, and how quiet it was."""
  m = results["machine"]
  commit = m["commit"] + (" (plus uncommitted changes in the working tree)"
                          if m["uncommitted_changes"] else "")
  cores = [run["available_cores"]
           for workload in results["training_loops"].values()
           for variant in workload["variants"].values()
           for run in variant["runs"]]
  slow = slow_runs(results["training_loops"])
  quiet = min(cores) >= 0.85 * m["cores"] and not slow
  rows = [("CPU", m["cpu"]), ("cores", m["cores"]),
          ("memory", f"{m['memory_gib']} GiB"), ("Python", m["python"]),
          ("TensorFlow", m["tensorflow"]),
          ("tf-models-official", m["tf_models_official"]),
          ("commit", commit), ("date", m["date"]),
          ("run time", f"{results['seconds'] / 60:.1f} min"
           + (" (`--quick`: smoke-test sizes, one repeat)"
              if results["quick"] else ""))]
  noise = (
      f"Before each training run the benchmark waits (up to 10 s) for the "
      f"machine to be quiet and records how many of its {m['cores']} cores "
      f"a busy loop per core got (`cores free` below). In this run that "
      f"ranged from {min(cores):.1f} to {max(cores):.1f}. ")
  if slow:
    noise += (f"{len(slow)} of {len(cores)} training runs were more than "
              f"{1 - SLOW_RUN:.0%} below their variant's median ("
              + ", ".join(slow) + "): the machine slowed down during them, "
              "which `cores free`, measured before each run, does not "
              "catch. ")
  noise += ("The machine was quiet." if quiet else
            "**The machine was shared with other work during this run**: "
            "figures are low and noisy, ratios less so (variants are "
            "interleaved). Re-run `python benchmarks/run_all.py` on a quiet "
            "machine before quoting absolute figures.")
  return ("## Machine and code\n\n" + table(("", ""), rows) + "\n" + noise
          + "\n")


def _ratio_row(target: str, value: float, paired: List[float],
               floor: float) -> Sequence[str]:
  """A target row: the ratio of medians, its spread over repeats, met?"""
  return (target, f"{value:.3f} (each repeat {min(paired):.3f} to "
          f"{max(paired):.3f}; {sum(r >= floor for r in paired)} of "
          f"{len(paired)} >= {floor})", _met(value >= floor))


def targets_section(results: Results) -> str:
  """The targets of issue 5, point 3, each met or missed."""
  rows = []
  loops = results["training_loops"]
  for workload, figures in loops.items():
    if not figures["config"].get("targets", True):
      continue
    ratio = figures["ours_over"]
    for other, floor in (("handwritten", 0.97), ("stock_tfm", 1.0),
                         ("keras_fit", 1.0), ("keras_fit_tensorboard", 1.0)):
      if other not in ratio:
        continue
      value = ratio[other]["examples_per_second"]
      paired = ratio[other].get("examples_per_second_by_repeat") or [value]
      rows.append(_ratio_row(f"{workload}: ours / {other} examples/s "
                             f">= {floor}", value, paired, floor))
    pool = figures["variants"].get("ours_tf_data_pool")
    hand = figures["variants"].get("handwritten")
    if pool and hand:
      value = (pool["median"]["examples_per_second"]
               / hand["median"]["examples_per_second"])
      paired = [a["examples_per_second"] / b["examples_per_second"]
                for a, b in zip(pool["runs"], hand["runs"])]
      rows.append(_ratio_row(
          f"{workload}: ours with tf.data's own pool / handwritten "
          "examples/s >= 0.97 (the loop's overhead alone)", value, paired,
          0.97))
    ours = figures["variants"]["ours"]["median"]
    stock = figures["variants"]["stock_tfm"]["median"]
    rows.append((
        f"{workload}: our time to first step <= stock TFM's",
        f"{ours['time_to_first_step_seconds']:.2f} s vs "
        f"{stock['time_to_first_step_seconds']:.2f} s (startup "
        f"{ours['startup_seconds']:.2f} s vs {stock['startup_seconds']:.2f} s)",
        _met(ours["time_to_first_step_seconds"]
             <= stock["time_to_first_step_seconds"])))
  for split in ("train", "eval"):
    value = results["input_pipelines"][split]["ours_over_reference"]
    passes = results["input_pipelines"][split]["runs"]
    ahead = sum(o >= r for o, r in zip(passes["ours"], passes["reference"]))
    rows.append((f"ResNet {split} input pipeline: ours / reference >= 1.0",
                 f"{value:.3f} (ours ahead in {ahead} of "
                 f"{len(passes['ours'])} passes)", _met(value >= 1.0)))
  pool_note = (
      "Trained on CPUs, ours gives its input a private tf.data pool (see the "
      "defaults below), which the other variants do not have: `ours with "
      "tf.data's own pool` is ours without it, so its ratio to the "
      "hand-written loop is the loop's overhead alone.\n"
  ) if any("ours_tf_data_pool" in figures["variants"]
           for figures in loops.values()) else ""
  return ("## Targets (issue 5, point 3)\n\n"
          + table(("target", "measured (medians)", ""), rows)
          + "\nA ratio is of the medians; `each repeat` gives the ratios of "
          "the runs of one repeat, which ran one after the other.\n"
          "`startup` is the time to first step less the steady-state "
          "time of the further steps of a variant's first loop: stock TFM "
          "and Keras show their first step only when a whole first loop "
          "has run, ours after one step.\n" + pool_note)


def training_section(results: Results) -> str:
  """One table per workload: every variant's medians and runs."""
  parts = ["## Training loops (`training_loops.py`)\n\n"
           "Same model, data, global batch and steps for every variant; "
           "each run a fresh process, variants interleaved, medians of "
           "the repeats. Examples/s are over the same steps for all "
           "(from `warmup_steps`, where every variant ends a loop after its "
           "second, to the last), timed from outside the runs by the arrival "
           "of their per-loop progress lines; time to first step runs from "
           "process start. Peak RSS training: at the last progress line; "
           "process: over the whole process (stock TFM's `run_experiment` "
           "counts FLOPs after training). Checkpoints: stock TFM's "
           "`CheckpointManager` saves one after the first loop, before the "
           "timed steps; ours and stock TFM save one after the last step; "
           "nothing evaluates.\n"]
  for workload, figures in results["training_loops"].items():
    config = figures["config"]
    parts.append(
        f"\n### {workload}\n\n`{config['experiment']}`, global batch "
        f"{config['global_batch_size']}, {config['train_steps']} steps, "
        f"`steps_per_loop` {config['steps_per_loop']}, examples/s over "
        f"steps {config['warmup_steps']}..{config['train_steps']}, "
        f"{len(figures['variants']['ours']['runs'])} repeat(s). "
        f"Overrides: "
        f"`{figures['params_override']}`.\n\n")
    if not config.get("targets", True):
      parts.append(
          "Not one of issue 5's comparisons: at one step per loop, what "
          "each variant does between loops weighs most (ours and stock TFM "
          "also write that loop's summaries). Host work a loop is its time "
          "per step here less its time per step on digits_convnet.\n\n")
    rows = []
    for name, variant in figures["variants"].items():
      median = variant["median"]
      ratio = (figures["ours_over"].get(name, {}).get("examples_per_second")
               if name != "ours" else 1.0)
      rows.append((
          VARIANT_NAMES.get(name, name),
          f"{median['examples_per_second']:.1f}",
          f"{ratio:.3f}" if ratio else "",
          f"{median['time_to_first_step_seconds']:.2f}",
          variant["runs"][0]["first_loop_steps"],
          f"{median['startup_seconds']:.2f}",
          f"{median['peak_rss_mib']:.0f}",
          f"{median['process_peak_rss_mib']:.0f}",
          f"{median['available_cores']:.1f}",
          ", ".join(f"{run['examples_per_second']:.1f}"
                    for run in variant["runs"])))
    parts.append(table(
        ("variant", "examples/s", "ours / variant", "first step (s)",
         "first loop (steps)", "startup (s)", "peak RSS training (MiB)",
         "peak RSS process (MiB)", "cores free", "examples/s of each run"),
        rows))
  return "".join(parts)


def host_seconds(name: str, variants: Results, per_step: Results,
                 batch: int) -> float:
  """A variant's host work a loop: its time per step at one step per loop
  less its time per step in the main digits_convnet table."""
  return batch * (1 / per_step[name]["median"]["examples_per_second"]
                  - 1 / variants[name]["median"]["examples_per_second"])


def host_work(variants: Results, per_step: Results, batch: int) -> str:
  """Every other variant's `host_seconds`, named."""
  return "; ".join(
      f"{VARIANT_NAMES[name]} "
      f"{_ms(host_seconds(name, variants, per_step, batch))}"
      for name in ("keras_fit", "keras_fit_tensorboard", "handwritten",
                   "stock_tfm") if name in per_step and name in variants)


def defaults_section(results: Results) -> str:
  """Each default of issue 5, point 4, with the figure that justifies it."""
  digits = results["training_loops"]["digits_convnet"]
  variants = digits["variants"]
  batch = digits["config"]["global_batch_size"]
  loop = digits["config"]["steps_per_loop"]
  ours = variants["ours"]["median"]
  per_step = results["training_loops"]["digits_convnet_per_step"]["variants"]
  one = per_step["ours"]["median"]
  many = variants["ours_steps_per_loop_200"]["median"]
  xla = variants["ours_xla"]["median"]
  step = batch / ours["examples_per_second"]
  per_loop = host_seconds("ours", variants, per_step, batch)
  xla_ratio = xla["examples_per_second"] / ours["examples_per_second"]
  xla_start = (xla["time_to_first_step_seconds"]
               - ours["time_to_first_step_seconds"])
  pipelines = results["input_pipelines"]["train"]["images_per_second"]
  eval_pipelines = results["input_pipelines"]["eval"]["images_per_second"]
  train_tuning = pipelines["ours"] / pipelines["ours_autotune_on"]
  eval_tuning = eval_pipelines["ours"] / eval_pipelines["ours_autotune_on"]
  ckpt = results["checkpoint_cost"]["digits_convnet"]
  resnet_ckpt = results["checkpoint_cost"]["resnet50_model"]
  sync_save = ckpt["with_iterator"]["save_seconds"]
  async_share = ckpt["with_iterator_async_call"]["save_seconds"] / sync_save
  hidden = max(sync_save - ckpt["with_iterator_async_call"]["save_seconds"],
               0.0)
  rows = [
      (f"`steps_per_loop` {loop}, steps in a `tf.while_loop`",
       f"{ours['examples_per_second']:.0f} ex/s vs "
       f"{one['examples_per_second']:.0f} ex/s at 1 step per loop "
       f"({ours['examples_per_second'] / one['examples_per_second']:.2f}x); "
       f"each loop costs about {_ms(per_loop)} of host work "
       f"({host_work(variants, per_step, batch)}); at 200 steps "
       f"per loop {many['examples_per_second']:.0f} ex/s "
       f"({many['examples_per_second'] / ours['examples_per_second']:.3f}x "
       f"of {loop})",
       f"many steps per loop: at {loop} steps that cost is about "
       f"{per_loop / (per_loop + loop * step):.1%} of a loop's time"),
      ("progress, hooks, metrics read the device once per loop",
       "the same figure: with `steps_per_loop=1` the progress line, "
       "Orbit's summaries and `train_loop_end` sync every step",
       "no per-step host reads (`TrainProgress`; the non-finite check reads "
       "the loop's mean loss at its end)"),
      ("`runtime.enable_xla` off on the CPU",
       f"XLA on: {xla['examples_per_second']:.0f} ex/s "
       f"({xla_ratio:.2f}x), first step {xla_start:+.1f} s, peak RSS "
       f"{xla['peak_rss_mib'] - ours['peak_rss_mib']:+.0f} MiB",
       "off: XLA is slower here" if xla_ratio < 1 else
       "**not justified by this figure**: XLA is faster here"),
      ("tf.data: parallel map and prefetch at AUTOTUNE",
       f"ResNet train pipeline {pipelines['ours']:.0f} img/s vs "
       f"{pipelines['ours_one_thread']:.0f} with one thread "
       f"({pipelines['ours'] / pipelines['ours_one_thread']:.2f}x); eval "
       f"{eval_pipelines['ours']:.0f} vs "
       f"{eval_pipelines['ours_one_thread']:.0f} "
       f"({eval_pipelines['ours'] / eval_pipelines['ours_one_thread']:.2f}x)",
       "parallel decoding and prefetch"),
      ("tf.data autotuning off in the ResNet pipelines: one parallel call "
       "per core from the first image, a fixed prefetch",
       f"training {pipelines['ours']:.0f} img/s vs "
       f"{pipelines['ours_autotune_on']:.0f} autotuned ({train_tuning:.3f}x); "
       f"evaluation {eval_pipelines['ours']:.0f} vs "
       f"{eval_pipelines['ours_autotune_on']:.0f} ({eval_tuning:.3f}x)",
       "off: autotuning's bookkeeping costs CPU time, and a fresh evaluation "
       "iterator ends before it settles" if min(train_tuning, eval_tuning) >= 1
       else "**not justified by this figure**: autotuning is as fast"),
      ("synchronous checkpoints (the driver does not turn on TFM's "
       "asynchronous checkpointing)",
       f"digits: a save takes {_ms(ckpt['with_iterator']['save_seconds'])}, "
       f"{ckpt['save_over_interval']:.1%} of the "
       f"{ckpt['checkpoint_interval_steps']} steps between saves; the "
       f"blocking part of an async save "
       f"{_ms(ckpt['with_iterator_async_call']['save_seconds'])}. ResNet50 "
       f"model and optimizer: {resnet_ckpt['save_seconds']:.2f} s a save",
       f"sync: here an async save still blocks for "
       f"{async_share:.0%} of a sync save's time, so it would hide at most "
       f"{_ms(hidden)} a save ({hidden / ckpt['interval_train_seconds']:.1%}"
       " of the time between saves)"),
      ("no checkpoint after the first loop: a fresh run saves first "
       "`checkpoint_interval` steps in (`driver.count_interval_from_start`; "
       "TF's `CheckpointManager` saves at its first check, so stock TFM "
       "writes `ckpt-<steps_per_loop>`)",
       f"ResNet50 model and optimizer: that first save takes "
       f"{resnet_ckpt['first_save_seconds']:.2f} s (it traces the save "
       f"functions) and {resnet_ckpt['bytes'] / 2**20:.0f} MiB; digits "
       f"{_ms(ckpt['with_iterator']['first_save_seconds'])}",
       "skip it: it holds one loop of progress, takes one of "
       "`max_to_keep`'s places, and an evaluator beside training would "
       "evaluate it in full"),
  ]
  resnet = results["training_loops"].get("resnet50", {}).get("variants", {})
  if "ours_xla" in resnet:
    resnet_ours = resnet["ours"]["median"]
    resnet_xla = resnet["ours_xla"]["median"]
    ratio = (resnet_xla["examples_per_second"]
             / resnet_ours["examples_per_second"])
    start = (resnet_xla["time_to_first_step_seconds"]
             - resnet_ours["time_to_first_step_seconds"])
    rows.insert(3, (
        "`runtime.enable_xla` off on the CPU: ResNet50",
        f"XLA on: {resnet_xla['examples_per_second']:.1f} ex/s vs "
        f"{resnet_ours['examples_per_second']:.1f} ({ratio:.2f}x), first "
        f"step {start:+.1f} s",
        "off: XLA is slower here" if ratio < 1 else
        "**not justified by this figure**: XLA is faster here"))
  host = results.get("loop_costs")
  if host:
    writes, reads = host["summaries"], host["global_step_read"]
    logs, step = host["read_train_logs"], host["step"]
    rows[2:2] = [
        ("a loop's outputs written as one summary op per directory "
         "(`ScalarSummaryManager`), a mirrored global step read through "
         "its local copy (`driver.host_readable`)",
         f"writing one loop's 5 values: {_ms(writes['ours'])} vs "
         f"{_ms(writes['orbit'])} with Orbit's `SummaryManager`; a step read "
         f"{_ms(reads['ours'])} vs {_ms(reads['orbit'])} "
         f"(`loop_costs.py`); a loop of no steps costs "
         f"{_ms(host['empty_loop']['ours'])} in all",
         "the same events, less host time between loops (about ten step "
         "reads a loop)"),
        ("`train_loop_end` reads metrics and learning rate as one graph",
         f"{_ms(logs['traced'])} vs {_ms(logs['eager'])} eagerly",
         "traced from the second loop end; eager before it and when the "
         "override cannot be traced"),
        ("a NaN or infinite loss is caught from the loop's mean loss, not in "
         "each step",
         f"{_ms(step['ours'])} a step vs {_ms(step['per_step_check'])} with "
         f"a check in the step that keeps the first bad step "
         f"({step['per_step_check'] / step['ours'] - 1:+.1%})",
         "no op in the step" if step["per_step_check"] > step["ours"] else
         "**not justified by this figure**: the per-step check is as fast"
         " (the error names the loop's steps, not the step)"),
    ]
  if "ours_tf_data_pool" in variants:
    rows.append(input_threads_row(ours,
                                  variants["ours_tf_data_pool"]["median"],
                                  variants["ours"]["runs"][0].get(
                                      "run_summary", {}).get("input_threads")))
  if "ours_one_replica_mirror" in variants:
    rows.append(strategy_row(ours,
                             variants["ours_one_replica_mirror"]["median"]))
  start = results.get("startup")
  if start:
    rows.append(startup_row(start["variants"]))
  return ("## Defaults and the figures behind them (issue 5, point 4)\n\n"
          "digits_convnet through our launcher unless said otherwise.\n\n"
          + table(("default", "measured", "justifies"), rows))


def input_threads_row(ours: Results, pool: Results,
                      threads: Optional[int]) -> Sequence[str]:
  """Training on CPUs: ours (a private tf.data pool) against tf.data's."""
  ratio = ours["examples_per_second"] / pool["examples_per_second"]
  return (
      "training on CPUs, the input gets a private tf.data pool of half the "
      "cores (`runtime.dataset_num_private_threads` unset; TFM ignores the "
      "field)",
      f"{ours['examples_per_second']:.0f} ex/s vs "
      f"{pool['examples_per_second']:.0f} with tf.data's own pool of one "
      f"thread per core ({ratio:.3f}x)"
      + (f"; {threads} thread(s) here" if threads else ""),
      "the model's ops use every core: tf.data's own pool makes the input "
      "contend with them" if ratio >= 1 else
      f"**not justified by this figure**: tf.data's own pool is "
      f"{1 / ratio - 1:.1%} faster here")


def strategy_row(ours: Results, mirror: Results) -> Sequence[str]:
  """`mirrored` on one CPU: ours (no strategy) against TFM's mirror."""
  ratio = ours["examples_per_second"] / mirror["examples_per_second"]
  return (
      "`runtime.distribution_strategy=mirrored` (TFM's default) on one CPU "
      "device builds no strategy",
      f"{ours['examples_per_second']:.0f} ex/s vs "
      f"{mirror['examples_per_second']:.0f} with TFM's one-replica "
      f"`MirroredStrategy` ({ratio:.3f}x)",
      "the mirror costs without adding a replica" if ratio >= 1 else
      f"**not justified by this figure**: the one-replica mirror is "
      f"{1 / ratio - 1:.1%} faster here")


def startup_row(variants: Results) -> Sequence[str]:
  """The launcher's collector settings while importing, against ablations."""
  ours = variants["launcher"]["median"]
  on = variants["collector_on"]["median"]
  unfrozen = variants["no_freeze"]["median"]
  saved = on["import_seconds"] - ours["import_seconds"]
  return (
      "`launchers/train.py` imports with Python's collector off, then "
      "freezes what the imports made (`gc.freeze`) and turns it back on",
      f"imports {ours['import_seconds']:.2f} s vs "
      f"{on['import_seconds']:.2f} s with the collector on "
      f"({on['full_collections']:.0f} full collections); a full collection "
      f"after them {_ms(ours['collect_seconds'])} vs "
      f"{_ms(unfrozen['collect_seconds'])} unfrozen "
      f"({unfrozen['frozen_objects']:.0f} vs {ours['frozen_objects']:.0f} "
      f"objects frozen); peak RSS "
      f"{ours['peak_rss_mib'] - on['peak_rss_mib']:+.0f} MiB (`startup.py`)",
      f"{saved:.2f} s off every launch's time to first step" if saved > 0
      else "**not justified by this figure**: importing is as fast with "
      "the collector on")


def pipelines_section(results: Results) -> str:
  """ResNet input pipelines against the reference `input_fn`."""
  ip = results["input_pipelines"]
  sizes = ip["sizes"]
  rows = []
  for split in ("train", "eval"):
    figures = ip[split]["images_per_second"]
    rows.append((split, f"{figures['ours']:.0f}", f"{figures['reference']:.0f}",
                 f"{ip[split]['ours_over_reference']:.3f}",
                 f"{figures['ours_autotune_on']:.0f}",
                 f"{figures['ours_one_thread']:.0f}"))
  return (
      "## Input pipelines (`input_pipelines.py`)\n\n"
      f"Images/s on the same JPEG TFRecords ({ip['records']['train']} "
      f"training, {ip['records']['eval']} evaluation records: the tests' "
      f"photographs and digits, {sizes['copies']} copies), batch "
      f"{sizes['batch_size']}, medians of {sizes['passes']} interleaved "
      f"passes. Training: {sizes['batches']} batches after {sizes['warmup']}"
      " on a fresh iterator; evaluation: "
      f"{sizes.get('eval_epochs', 1)} whole epoch(s), each on a fresh "
      "iterator, its creation included. Passes in an order rotated by one. "
      "Per image both run the reference's "
      "`imagenet_preprocessing` (ours imports it); ours has tf.data's "
      "autotuning off: one parallel call per core from the first image and "
      "a fixed prefetch (`input_pipeline.PREFETCH_BATCHES`).\n\n"
      + table(("split", "ours", "reference `input_fn`", "ours / reference",
               "ours, autotune on", "ours, one thread"),
              rows))


def flops_section(results: Results) -> str:
  """The matmul peak and ResNet50's achieved FLOP/s."""
  f = results["flops"]
  rows = [(VARIANT_NAMES.get(name, name), f"{a['gflops']:.1f}",
           f"{a['fraction_of_peak']:.1%}")
          for name, a in f.get("achieved", {}).items()]
  sizes = ", ".join(f"{n}: {g:.1f}" for n, g in f["gflops_by_size"].items())
  return (
      "## FLOP/s (`flops.py`)\n\n"
      f"Measured fp32 matmul peak: **{f['peak_gflops']:.1f} GFLOP/s** "
      f"(median of several `tf.linalg.matmul` calls per size n; GFLOP/s by "
      f"n: {sizes}). ResNet50 forward: "
      f"{f['resnet50_forward_flops_per_example'] / 1e9:.2f} GFLOPs per "
      "224x224 image (TFM's `try_count_flops`, a multiply-add counted as 2: "
      "the usual \"4.1 GFLOPs\" are multiply-adds); a training step is taken "
      f"as 3x that, {f['resnet50_training_step_flops_per_example'] / 1e9:.1f}"
      " GFLOPs per example. Achieved = that x the training loops' median "
      "examples/s on ResNet50.\n\n"
      + table(("variant", "achieved GFLOP/s", "of peak"), rows))


def checkpoint_section(results: Results) -> str:
  """Checkpoint size and save time, with and without the input iterator."""
  c = results["checkpoint_cost"]
  d = c["digits_convnet"]
  rows = [(name.replace("_", " "), f"{d[name]['bytes']:,}",
           _ms(d[name]["save_seconds"]), _ms(d[name]["first_save_seconds"]))
          for name in ("with_iterator", "without_iterator",
                       "with_iterator_async_call")]
  r = c["resnet50_model"]
  it = c["resnet50_iterator"]
  buffers = it["by_shuffle_buffer"]
  record_bytes = it["record_bytes"] / it["records"]
  iterator_rows = [(buffer, min(int(buffer), it["records"]),
                    _mib(buffers[buffer]["bytes"]),
                    f"{buffers[buffer]['save_seconds']:.3f}")
                   for buffer in sorted(buffers, key=int)]
  small, large = min(buffers, key=int), max(buffers, key=int)
  held = min(int(large), it["records"]) - min(int(small), it["records"])
  slope = (buffers[large]["bytes"] - buffers[small]["bytes"]) / held
  base = buffers[small]["bytes"] - slope * min(int(small), it["records"])
  imagenet = IMAGENET_SHUFFLE_BUFFER * IMAGENET_RECORD_BYTES * slope / (
      record_bytes)
  refused = it["default_policy_error"] or "(it was not refused)"
  return (
      "## Checkpoint cost (`checkpoint_cost.py`, issue 6, point 5)\n\n"
      f"### digits_convnet\n\nTrainers built as `tfm_ext.driver` builds "
      f"them, trained {d['checkpoint_interval_steps']} steps, saved through a "
      "`tf.train.CheckpointManager`; medians of "
      f"{d['with_iterator']['saves']} saves after a first one (which traces "
      "the save functions), the variants interleaved. The async row is the "
      "blocking part of a save with `experimental_enable_async_checkpoint`."
      "\n\n" + table(("checkpoint", "bytes", "save (median)", "first save"),
                     rows)
      + f"\nThe iterator adds {d['iterator_bytes']:,} bytes: the shuffle "
      f"buffer ({d['shuffle_buffer_size']} records, more than the split "
      "holds, so the whole encoded training split) and the prefetched "
      f"batches. {d['checkpoint_interval_steps']} steps train in "
      f"{d['interval_train_seconds']:.2f} s, so a save with the iterator "
      f"costs {d['save_over_interval']:.1%} of the time between saves. "
      "`trainer.checkpoint_input_iterator=false` leaves the iterator out; "
      "`run_summary.json` then says `input_in_checkpoint: false` (resume "
      "is not exact).\n\n"
      f"### ResNet50\n\nModel and optimizer (momentum slots) of the "
      f"`resnet50_imagenet_ctl` trainer: {_mib(r['bytes'])}, "
      f"{r['save_seconds']:.2f} s a save (first {r['first_save_seconds']:.2f}"
      " s). Its training input pipeline cannot be saved as is: tf.data "
      f"refuses, `{refused}`. The sizes below are measured with "
      "`tf.data.Options().experimental_external_state_policy = "
      "ExternalStatePolicy.IGNORE`, which saves the buffers but not the "
      "random crop's state (so even then a resume would not be exact). "
      f"Records: {it['records']} JPEG records, {record_bytes / 1e3:.1f} KB "
      f"each on average; batch {it['batch_size']} (a decoded batch is "
      f"{_mib(it['decoded_batch_bytes'])}).\n\n"
      + table(("shuffle buffer", "records buffered", "iterator state",
               "save (s)"), iterator_rows)
      + f"\nThe state grows by {slope / 1e3:.1f} KB per buffered record (the "
      f"encoded record) over a base of {_mib(base)} (decoded batches in "
      "the prefetch and parallel-map buffers). At ImageNet's default "
      f"buffer of {IMAGENET_SHUFFLE_BUFFER:,} records of about "
      f"{IMAGENET_RECORD_BYTES / 1e3:.0f} KB that is about "
      f"{imagenet / 1e9:.1f} GB per checkpoint, which is why "
      "`resnet50_imagenet_ctl` keeps the iterator out of its checkpoints.\n")


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
  return (head + f"Device: {gpu['device']}, commit "
          f"{gpu['machine']['commit']}.\n\n"
          + table(("configuration", "images/s", "first step (s)", "note"),
                  rows))


def render(results: Results, gpu: Optional[Results] = None) -> str:
  """The whole of `RESULTS.md`."""
  sections = [
      "# Benchmark results\n\nWritten by `python benchmarks/run_all.py` "
      "(see `benchmarks/README.md`); do not edit by hand.\n",
      machine_section(results), targets_section(results),
      training_section(results), defaults_section(results),
      pipelines_section(results), flops_section(results),
      checkpoint_section(results), gpu_section(gpu)]
  return "\n".join(sections)
