"""What the benchmark figures back: issue 5's targets and our defaults.

A claim is one row of `RESULTS.md` as data: what is claimed, the measured
ratio, the floor it must reach (if it has one), the ratio of each repeat's
paired runs, one line of why, and an HTML anchor. Library docstrings link to
a default's row (`benchmarks/RESULTS.md#default-input-pool`) instead of
quoting its figures, so a re-run rewrites `RESULTS.md` and no library file.
Anchors are stable: rename one only together with the links to it
(`tests/test_benchmarks_smoke.py` checks that every link finds its row).

A ratio favours ours (or the default) above 1: speeds are divided ours over
the alternative's, times the alternative's over ours.

    rows = targets(results) + defaults(results)
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks import _format

Results = Dict[str, Any]
# A measured figure: its median, and its value in each repeat (or pass) in
# the order they ran, so that two figures' values pair up by repeat.
Figure = Tuple[float, Sequence[float]]

DIGITS = "digits_convnet"
PER_STEP = "digits_convnet_per_step"
RESNET = "resnet50"
# ImageNet's mean training JPEG record, for the shuffle-buffer estimate.
IMAGENET_RECORD_BYTES = 110e3
IMAGENET_SHUFFLE_BUFFER = 10000
# A ratio this close below its floor is parity, a tie (DEVELOPERS.md: two
# runs of one graph differ by 1-3% on a shared machine).
PARITY = 0.02


@dataclasses.dataclass(frozen=True)
class Claim:
  """One row: a measured ratio, what it must reach, and what it backs.

  Attributes:
    anchor: the row's HTML id in `RESULTS.md`; stable (docstrings link it).
    name: what is claimed: a target, or a default and how it is set.
    measured: the figures behind `ratio`, with their units.
    why: one line: why the default is what it is, or what a target guards.
    ratio: ours (or the default) over the alternative, above 1 in ours'
      favour; None where the row has no single ratio.
    floor: `ratio` must reach it; None: the row states, it sets no target.
    spread: `ratio` of each repeat's (or pass's) runs, which ran side by
      side; empty where the figures have no repeats.
  """
  anchor: str
  name: str
  measured: str
  why: str
  ratio: Optional[float] = None
  floor: Optional[float] = None
  spread: Tuple[float, ...] = ()

  @property
  def verdict(self) -> Optional[str]:
    """"met" where `ratio` reaches `floor`, "parity" within `PARITY` below
    it, else "missed"; None if the row has no target."""
    if self.ratio is None or self.floor is None:
      return None
    if self.ratio >= self.floor:
      return "met"
    return "parity" if self.ratio >= self.floor * (1 - PARITY) else "missed"


def figure(variant: Results, key: str = "examples_per_second") -> Figure:
  """`key` of a variant as a benchmark records it: a median and its runs."""
  return (variant["median"][key],
          [run[key] for run in variant.get("runs", ())])


def pipeline_figure(split: Results, name: str) -> Figure:
  """Images/s of one input pipeline of `input_pipelines.py`."""
  return split["images_per_second"][name], split["runs"][name]


def over(ours: Figure, other: Figure,
         times: bool = False) -> Tuple[float, Tuple[float, ...]]:
  """Ours over the other figure, of the medians and of each repeat's pair.

  Rates are divided ours over the other's, times (`times=True`) the other's
  over ours, so that above 1 favours ours either way.
  """
  (top, tops), (bottom, bottoms) = (other, ours) if times else (ours, other)
  return top / bottom, tuple(a / b for a, b in zip(tops, bottoms))


def _anchor(*parts: str) -> str:
  return "-".join(parts).replace("_", "-")


# -- Targets (issue 5, point 3) ---------------------------------------------

# Ours / each variant's examples/s must reach the floor.
EXAMPLES_PER_SECOND_FLOORS = {
    "handwritten": (0.97, "a hand-written loop is the floor of framework "
                          "overhead: ours within 3% of it"),
    "stock_tfm": (1.0, "no slower than the TFM trainer it replaces"),
    "keras_fit": (1.0, "no slower than Keras's own loop"),
    "keras_fit_tensorboard": (1.0, "no slower than Keras writing the same "
                                   "summaries"),
}


def targets(results: Results) -> List[Claim]:
  """Issue 5's targets: each training workload's, then the input pipelines'.
  """
  claims = []
  for workload, loops in results["training_loops"].items():
    if loops["config"].get("targets", True):
      claims += _loop_targets(workload, loops["variants"])
  for split in ("train", "eval") if "input_pipelines" in results else ():
    data = results["input_pipelines"][split]
    ips = data["images_per_second"]
    ratio, spread = over(pipeline_figure(data, "ours"),
                         pipeline_figure(data, "reference"))
    claims.append(Claim(
        anchor=_anchor("target", "resnet", split, "input-pipeline"),
        name=f"ResNet {split} input pipeline: ours / reference `input_fn`",
        measured=(f"{_format.rate(ips['ours'])} vs "
                  f"{_format.rate(ips['reference'])} img/s"),
        why="our pipeline replaces the reference's: at least as fast",
        ratio=ratio, floor=1.0, spread=spread))
  return claims


def _loop_targets(workload: str, variants: Results) -> List[Claim]:
  """Ours against each other variant of one workload."""
  ours = variants["ours"]
  claims = []
  for other, (floor, why) in EXAMPLES_PER_SECOND_FLOORS.items():
    if other in variants:
      ratio, spread = over(figure(ours), figure(variants[other]))
      claims.append(Claim(
          anchor=_anchor("target", workload, other),
          name=f"{workload}: ours / {other} examples/s",
          measured=(f"{_format.rate(figure(ours)[0])} vs "
                    f"{_format.rate(figure(variants[other])[0])} ex/s"),
          why=why, ratio=ratio, floor=floor, spread=spread))
  stock = variants["stock_tfm"]
  first_ours, first_stock = (figure(v, "time_to_first_step_seconds")
                             for v in (ours, stock))
  ratio, spread = over(first_ours, first_stock, times=True)
  claims.append(Claim(
      anchor=_anchor("target", workload, "first-step"),
      name=f"{workload}: our time to first step against stock TFM's",
      measured=(f"{first_ours[0]:.2f} s vs {first_stock[0]:.2f} s (startup "
                f"{ours['median']['startup_seconds']:.2f} s vs "
                f"{stock['median']['startup_seconds']:.2f} s)"),
      why="a launch starts training no later than stock TFM's",
      ratio=ratio, floor=1.0, spread=spread))
  return claims


# -- Defaults (issue 5, point 4) ---------------------------------------------


def host_seconds(results: Results, name: str) -> float:
  """A variant's host work a loop: its time per step at one step per loop
  less its time per step in the main digits_convnet workload."""
  loops = results["training_loops"]
  batch = loops[DIGITS]["config"]["global_batch_size"]
  return batch * (
      1 / figure(loops[PER_STEP]["variants"][name])[0]
      - 1 / figure(loops[DIGITS]["variants"][name])[0])


def _loop_length(results: Results) -> List[Claim]:
  """`steps_per_loop`: the host work a loop, paid once per loop."""
  loops = results["training_loops"]
  if PER_STEP not in loops or DIGITS not in loops:
    return []
  digits, per_step = loops[DIGITS], loops[PER_STEP]["variants"]
  variants = digits["variants"]
  batch = digits["config"]["global_batch_size"]
  loop = digits["config"]["steps_per_loop"]
  ours = figure(variants["ours"])[0]
  one = figure(per_step["ours"])[0]
  many = figure(variants["ours_steps_per_loop_200"])[0]
  host = host_seconds(results, "ours")
  others = "; ".join(
      f"{_format.variant(name)} {_format.ms(host_seconds(results, name))}"
      for name in ("keras_fit", "keras_fit_tensorboard", "handwritten",
                   "stock_tfm") if name in per_step and name in variants)
  return [
      Claim(anchor="default-steps-per-loop",
            name=f"`steps_per_loop` {loop}, steps in a `tf.while_loop`",
            measured=(
                f"{ours:.0f} ex/s vs {one:.0f} ex/s at 1 step per loop "
                f"({ours / one:.2f}x); each loop costs about "
                f"{_format.ms(host)} of host work ({others}), "
                f"{host / (host + loop * batch / ours):.1%} of a loop's time "
                f"at {loop} steps; at 200 steps per loop {many:.0f} ex/s "
                f"({many / ours:.3f}x of {loop})"),
            why="a loop's host work is paid once per loop, not once a step",
            ratio=ours / one, floor=1.0),
      Claim(anchor="default-host-reads-once-per-loop",
            name="progress, hooks, metrics read the device once per loop",
            measured=("the figure of `steps_per_loop`: with "
                      "`steps_per_loop=1` the progress line, Orbit's "
                      "summaries and `train_loop_end` sync every step"),
            why=("no per-step host reads (`TrainProgress`; the non-finite "
                 "check reads the loop's mean loss at its end)")),
  ]


# Host costs of `loop_costs.py`: (anchor, what is claimed, its figures'
# key, ours, the alternative, how the figures read, why). A template may
# use {ours} and {other} (the two times), {change} (the alternative against
# ours) and {empty} (a loop of no steps).
LOOP_COSTS = (
    ("default-summary-manager",
     "a loop's outputs written as one summary op per directory "
     "(`ScalarSummaryManager`)", "summaries", "ours", "orbit",
     "writing one loop's 5 values: {ours} vs {other} with Orbit's "
     "`SummaryManager`; a loop of no steps costs {empty} in all "
     "(`loop_costs.py`)",
     "the same events, less host time between loops"),
    ("default-host-readable-step",
     "a mirrored global step read through its local copy "
     "(`strategies.host_readable`)", "global_step_read", "ours", "orbit",
     "a step read {ours} vs {other} through the `MirroredVariable`",
     "the controller, the summaries and the progress line read the step "
     "about ten times a loop"),
    ("default-traced-train-logs",
     "`train_loop_end` reads metrics and learning rate as one graph",
     "read_train_logs", "traced", "eager", "{ours} vs {other} eagerly",
     "traced from the second loop end; eager before it and when the "
     "override cannot be traced"),
    ("default-nan-check",
     "a NaN or infinite loss is caught from the loop's mean loss, not in "
     "each step", "step", "ours", "per_step_check",
     "{ours} a step vs {other} with a check in the step that keeps the "
     "first bad step ({change})",
     "no op in the step; the error names the loop's steps, not the step"),
)


def _loop_host_costs(results: Results) -> List[Claim]:
  """What our host work between loops costs against Orbit's and eager's."""
  costs = results.get("loop_costs")
  if not costs:
    return []
  claims = []
  for anchor, name, key, ours, other, measured, why in LOOP_COSTS:
    mine, theirs = costs[key][ours], costs[key][other]
    claims.append(Claim(
        anchor=anchor, name=name,
        measured=measured.format(
            ours=_format.ms(mine), other=_format.ms(theirs),
            change=f"{theirs / mine - 1:+.1%}",
            empty=_format.ms(costs["empty_loop"]["ours"])),
        why=why, ratio=theirs / mine, floor=1.0))
  return claims


def _xla_off(results: Results) -> List[Claim]:
  """XLA on against off, on each workload that ran it."""
  claims = []
  for workload, anchor in ((DIGITS, "default-xla-off"),
                           (RESNET, "default-xla-off-resnet50")):
    variants = results["training_loops"].get(workload, {}).get("variants", {})
    if "ours_xla" not in variants:
      continue
    ours, xla = variants["ours"], variants["ours_xla"]
    ratio, spread = over(figure(ours), figure(xla))
    later = (figure(xla, "time_to_first_step_seconds")[0]
             - figure(ours, "time_to_first_step_seconds")[0])
    more = figure(xla, "peak_rss_mib")[0] - figure(ours, "peak_rss_mib")[0]
    claims.append(Claim(
        anchor=anchor,
        name=f"`runtime.xla_on_cpu` off on the CPU ({workload})",
        measured=(f"XLA on: {_format.rate(figure(xla)[0])} ex/s vs "
                  f"{_format.rate(figure(ours)[0])} ({1 / ratio:.2f}x), first "
                  f"step {later:+.1f} s, peak RSS {more:+.0f} MiB"),
        why=("XLA's CPU code for these models is slower than TF's kernels, "
             "and compiling delays the first step"),
        ratio=ratio, floor=1.0, spread=spread))
  return claims


def _input_pipelines(results: Results) -> List[Claim]:
  """The ResNet pipelines' parallelism, and autotuning off, per split."""
  if "input_pipelines" not in results:
    return []
  claims = []
  for default, alternative in (("parallel-map", "ours_one_thread"),
                               ("no-autotune", "ours_autotune_on")):
    for split, suffix in (("train", ""), ("eval", "-eval")):
      data = results["input_pipelines"][split]
      ours, other = (pipeline_figure(data, name)
                     for name in ("ours", alternative))
      ratio, spread = over(ours, other)
      if default == "parallel-map":
        name = f"tf.data: parallel map and prefetch ({split})"
        measured = (f"ResNet {split} pipeline {_format.rate(ours[0])} img/s "
                    f"vs {_format.rate(other[0])} with one thread "
                    f"({ratio:.2f}x)")
        why = "images decode and augment in parallel, ahead of the step"
      else:
        name = (f"tf.data autotuning off in the ResNet pipelines ({split}): "
                "one parallel call per core from the first image, a fixed "
                "prefetch (`PREFETCH_BATCHES`)")
        measured = (f"{_format.rate(ours[0])} img/s vs "
                    f"{_format.rate(other[0])} autotuned ({ratio:.3f}x)")
        why = ("autotuning's bookkeeping costs CPU time, a fresh evaluation "
               "iterator ends before it settles, and a fixed prefetch stays "
               "bounded")
      claims.append(Claim(anchor=f"default-{default}{suffix}", name=name,
                          measured=measured, why=why, ratio=ratio, floor=1.0,
                          spread=spread))
  return claims


def _checkpoints(results: Results) -> List[Claim]:
  """Synchronous saves, none after the first loop, and the input iterator."""
  if "checkpoint_cost" not in results:
    return []
  cost = results["checkpoint_cost"]
  digits, model = cost["digits_convnet"], cost["resnet50_model"]
  sync = digits["with_iterator"]["save_seconds"]
  blocking = digits["with_iterator_async_call"]["save_seconds"]
  hidden = max(sync - blocking, 0.0)
  between = f"the {digits['checkpoint_interval_steps']} steps between saves"
  return [
      Claim(anchor="default-sync-checkpoints",
            name=("synchronous checkpoints (the driver does not turn on "
                  "TFM's asynchronous checkpointing)"),
            measured=(
                f"digits: a save takes {_format.ms(sync)}, "
                f"{digits['save_over_interval']:.1%} of {between}; the "
                f"blocking part of an async save {_format.ms(blocking)} "
                f"({blocking / sync:.0%} of a sync save's time), so async "
                f"would hide at most {_format.ms(hidden)} a save "
                f"({hidden / digits['interval_train_seconds']:.1%} of the "
                "time between saves). ResNet50 model and optimizer: "
                f"{model['save_seconds']:.2f} s a save"),
            why=("an async save blocks about as long as a sync one here: it "
                 "would hide next to nothing"),
            ratio=blocking / sync),
      Claim(anchor="default-no-first-loop-checkpoint",
            name=("no checkpoint after the first loop: a fresh run saves "
                  "first `checkpoint_interval` steps in (TF's "
                  "`CheckpointManager` saves at its first check, so stock "
                  "TFM writes `ckpt-<steps_per_loop>`)"),
            measured=(f"ResNet50 model and optimizer: that first save takes "
                      f"{model['first_save_seconds']:.2f} s (it traces the "
                      f"save functions) and {model['bytes'] / 2**20:.0f} MiB;"
                      " digits "
                      + _format.ms(digits["with_iterator"]
                                   ["first_save_seconds"])),
            why=("it holds one loop of progress, takes one of "
                 "`max_to_keep`'s places, and an evaluator beside training "
                 "would evaluate it in full")),
      Claim(anchor="default-checkpoint-input-iterator",
            name=("`trainer.checkpoint_input_iterator` on: checkpoints hold "
                  "the input iterator"),
            measured=(
                f"digits: the iterator adds {digits['iterator_bytes']:,} "
                f"bytes (the shuffle buffer of "
                f"{digits['shuffle_buffer_size']} records, more than the "
                "split holds, so the whole encoded training split, and the "
                f"prefetched batches); {between} train in "
                f"{digits['interval_train_seconds']:.2f} s, and a save with "
                f"the iterator costs {digits['save_over_interval']:.1%} of "
                "them"),
            why=("a resume continues the input where it stopped; `false` "
                 "leaves it out (`run_summary.json`: `input_in_checkpoint: "
                 "false`, resume not exact)")),
      _resnet_iterator(cost),
  ]


def iterator_growth(iterator: Results) -> Tuple[float, float]:
  """Bytes of iterator state per buffered record, and with none buffered.

  A line through the smallest and the largest shuffle buffer measured, each
  holding at most the records there are.
  """
  buffers = iterator["by_shuffle_buffer"]

  def held(buffer: str) -> int:
    return min(int(buffer), iterator["records"])
  small, large = min(buffers, key=int), max(buffers, key=int)
  slope = ((buffers[large]["bytes"] - buffers[small]["bytes"])
           / (held(large) - held(small)))
  return slope, buffers[small]["bytes"] - slope * held(small)


def _resnet_iterator(cost: Results) -> Claim:
  """The ResNet pipeline's iterator state, extrapolated to ImageNet's."""
  it, model = cost["resnet50_iterator"], cost["resnet50_model"]
  slope, base = iterator_growth(it)
  imagenet = IMAGENET_SHUFFLE_BUFFER * IMAGENET_RECORD_BYTES * slope / (
      it["record_bytes"] / it["records"])
  return Claim(
      anchor="default-resnet-iterator-out",
      name=("`resnet50_imagenet_ctl` keeps the input iterator out of its "
            "checkpoints"),
      measured=(f"the iterator state grows by {slope / 1e3:.1f} KB per "
                "buffered record (the encoded record) over a base of "
                f"{_format.mib(base)} (decoded batches in the prefetch and "
                "parallel-map buffers): at ImageNet's default buffer of "
                f"{IMAGENET_SHUFFLE_BUFFER:,} records of about "
                f"{IMAGENET_RECORD_BYTES / 1e3:.0f} KB, about "
                f"{imagenet / 1e9:.1f} GB per checkpoint, against "
                f"{_format.mib(model['bytes'])} of model and optimizer"),
      why=("a shuffle buffer of JPEGs in every checkpoint, and tf.data "
           "cannot save the random crop's state"))


def _strategy_and_threads(results: Results) -> List[Claim]:
  """The private input pool and no one-replica mirror, against ablations."""
  variants = results["training_loops"].get(DIGITS, {}).get("variants", {})
  if "ours" not in variants:
    return []
  ours = variants["ours"]
  claims = []
  # The private pool against tf.data's, ours' default since it lost on a
  # loaded machine.
  if "ours_private_pool" in variants:
    private, shared = variants["ours_private_pool"], ours
    ratio, spread = over(figure(private), figure(shared))
    claims.append(Claim(
        anchor="default-input-pool",
        name=("the input on tf.data's own pool, as in stock TFM "
              "(`runtime.dataset_num_private_threads` unset); the ratio is "
              "a private pool of half the cores over it: a default only if "
              "it is met idle and loaded"),
        measured=(f"{figure(private)[0]:.0f} ex/s with the private pool vs "
                  f"{figure(shared)[0]:.0f} ({ratio:.3f}x)"),
        why=("a private pool keeps the input off the model's cores on an "
             "idle host, and starves it when other work holds a core"),
        ratio=ratio, floor=1.0, spread=spread))
  # TFM's one-replica mirror on one CPU against no strategy. In results
  # taken before the mirror became ours' default (commit-stamped in
  # `kept`), ours built no strategy and the ablation was the mirror.
  for workload, anchor in ((DIGITS, "default-one-replica-mirror"),
                           (RESNET, "default-one-replica-mirror-resnet50")):
    variants = results["training_loops"].get(workload, {}).get("variants",
                                                                 {})
    pair = (("ours_no_strategy", "ours") if "ours_no_strategy" in variants
            else ("ours", "ours_one_replica_mirror")
            if "ours_one_replica_mirror" in variants else None)
    if not pair:
      continue
    none, mirror = (variants[name] for name in pair)
    ratio, spread = over(figure(none), figure(mirror))
    places = 0 if workload == DIGITS else 2  # ResNet50: a few ex/s.
    claims.append(Claim(
        anchor=anchor,
        name=("`runtime.distribution_strategy=mirrored` (TFM's default) on "
              "one CPU device builds TFM's one-replica `MirroredStrategy`"
              + ("" if workload == DIGITS else f" ({workload})")
              + "; the ratio is no strategy "
              "(`runtime.mirror_one_device=false`) over it: a default only "
              "if it is met idle and loaded"
              + ("" if pair[0] == "ours_no_strategy" else
                 " (in this run no strategy was ours' default)")),
        measured=(f"{figure(none)[0]:.{places}f} ex/s with no strategy vs "
                  f"{figure(mirror)[0]:.{places}f} with the mirror "
                  f"({ratio:.3f}x)"),
        why=("no strategy skips the mirror's per-step work; the mirror's "
             "threads kept more of the CPU under load"),
        ratio=ratio, floor=1.0, spread=spread))
  return claims


def _collector(results: Results) -> List[Claim]:
  """The launcher's collector settings while importing, against ablations."""
  start = results.get("startup")
  if not start:
    return []
  variants = start["variants"]
  ours, on, unfrozen = (variants[name]
                        for name in ("launcher", "collector_on", "no_freeze"))
  imports, import_spread = over(figure(ours, "import_seconds"),
                                figure(on, "import_seconds"), times=True)
  collect, collect_spread = over(figure(ours, "collect_seconds"),
                                 figure(unfrozen, "collect_seconds"),
                                 times=True)
  o, n, u = ours["median"], on["median"], unfrozen["median"]
  return [
      Claim(anchor="default-collector-off-while-importing",
            name="`launchers/train.py` imports with Python's collector off",
            measured=(f"imports {o['import_seconds']:.2f} s vs "
                      f"{n['import_seconds']:.2f} s with the collector on "
                      f"({n['full_collections']:.0f} full collections): "
                      f"{n['import_seconds'] - o['import_seconds']:.2f} s "
                      "of every launch's time to first step; peak RSS "
                      f"{o['peak_rss_mib'] - n['peak_rss_mib']:+.0f} MiB "
                      "(`startup.py`)"),
            why=("the imports' objects live as long as the process: "
                 "collecting while they load frees nothing"),
            ratio=imports, floor=1.0, spread=import_spread),
      Claim(anchor="default-gc-freeze",
            name=("... then freezes what the imports made (`gc.freeze`) and "
                  "turns the collector back on"),
            measured=(f"a full collection after the imports "
                      f"{_format.ms(o['collect_seconds'])} vs "
                      f"{_format.ms(u['collect_seconds'])} unfrozen "
                      f"({u['frozen_objects']:.0f} vs "
                      f"{o['frozen_objects']:.0f} objects frozen)"),
            why="later collections do not rescan the imports' objects",
            ratio=collect, floor=1.0, spread=collect_spread),
  ]


def _bfloat16(results: Results) -> List[Claim]:
  """bfloat16 against float32 on ResNet50, with what this CPU has for it."""
  variants = results["training_loops"].get(RESNET, {}).get("variants", {})
  if "ours_bfloat16" not in variants:
    return []
  ours, bf16 = variants["ours"], variants["ours_bfloat16"]
  ratio, spread = over(figure(bf16), figure(ours))
  flags = results.get("machine", {}).get("bf16", {})
  has = [flag for flag, present in flags.items() if present]
  return [Claim(
      anchor="default-float32-on-cpu",
      name=("float32 by default; bfloat16 "
            "(`runtime.mixed_precision_dtype=bfloat16`) where the CPU "
            "multiplies it natively (ResNet50; the ratio is bfloat16 over "
            "float32)"),
      measured=(f"{_format.rate(figure(bf16)[0])} vs "
                f"{_format.rate(figure(ours)[0])} ex/s; this CPU: "
                + (", ".join(has) if has else
                   "neither avx512_bf16 nor amx_bf16")),
      why=("without AVX512-BF16 or AMX TensorFlow computes bfloat16 through "
           "float32 and conversions; with them it does the math in bfloat16 "
           "(the issue measured 1.75x on such a CPU)"),
      ratio=ratio, spread=spread)]


# Each returns its defaults' rows, or none where the results lack their
# figures; `RESULTS.md` lists them in this order.
DEFAULTS: Tuple[Callable[[Results], List[Claim]], ...] = (
    _loop_length, _loop_host_costs, _xla_off, _input_pipelines, _checkpoints,
    _strategy_and_threads, _bfloat16, _collector)


def defaults(results: Results) -> List[Claim]:
  """The rows behind our defaults, digits_convnet unless they say so."""
  return [claim for rows in DEFAULTS for claim in rows(results)]
