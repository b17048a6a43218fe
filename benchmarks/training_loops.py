"""Training throughput: our launcher against stock TFM, a plain loop, Keras.

    python benchmarks/training_loops.py [--smoke | --headline] [--repeats=3]
        [--variants=ours,stock_tfm] [--workloads=digits_convnet]
        [--conditions=idle,loaded] [--out=FILE]

On the same model, data, global batch and number of steps:

    ours         `launchers/train.py`, the experiment's tfm_ext trainer, as a
                 user runs it (`custom`; `resnet_ctl`, a `CustomTrainer`)
    stock_tfm    TFM's `train_lib.run_experiment` with `base_trainer.Trainer`
    handwritten  a `tf.function` running the steps of a loop in a
                 `tf.while_loop`: the floor of framework overhead
    keras_fit    `tf_keras` `Model.fit`, `steps_per_execution=steps_per_loop`
    keras_fit_tensorboard
                 the same with Keras's `TensorBoard` callback writing loss
                 and metrics every `summary_interval` steps, as ours and
                 stock TFM write them (bare `Model.fit` writes nothing)

and ablations of our defaults: on digits_convnet 200 steps per loop and
a private input pool of half the cores; on both, no strategy for `mirrored`
on one CPU (`runtime.mirror_one_device=false`, where ours builds TFM's
one-replica `MirroredStrategy`) and XLA on the CPU; on ResNet50, bfloat16.
A third workload, digits_convnet at one step per loop, runs the five
variants where what each does between loops (a host sync, progress,
summaries) weighs most; it is not one of issue 5's comparisons.

Each run is a fresh process; variants are interleaved and repeated, each
repeat in an order rotated by one (A B C D, B C D A, ...), after one
discarded warm-up run per workload; the figures are medians. Each variant
runs in each condition (`_common.CONDITIONS`): idle, then loaded, with half
the cores kept busy by other processes, back to back. `--headline` is the
quick mode's smaller set (`HEADLINE_WORKLOADS`, `HEADLINE_VARIANTS`). Every variant prints the progress
line of `tfm_ext.console.TrainProgress` at each loop end, and this process
timestamps those lines as they arrive: one clock, outside the runs, for all.
Time to first step runs from starting the process to its first progress
line; examples per second are over the same steps for every variant, from
`warmup_steps` to the last step: a step at which every variant ends a
loop, after its second. The first loop traces; the time up to the end of
the second still holds one-off costs: Orbit writes its first summaries,
and stock TFM's `CheckpointManager` saves a checkpoint at its first check,
after the first loop, whatever `checkpoint_interval` says
(`ckpt-<steps_per_loop>`; ours counts the interval from the start,
`checkpointing.count_interval_from`). Peak
memory is the process's peak resident set at its last progress line (TFM's
`run_experiment` counts the model's FLOPs after training, which raises its
whole-process peak, `process_peak_rss_mib`). Our first loop is one
step (tfm_ext's `FirstStepThenEvery`), and so is the hand-written loop's;
stock TFM and Keras say nothing before a whole first loop has run, so
`startup_seconds` gives each time to first step less the steady-state time
of the further steps of its first loop.

Besides stock TFM's first one, checkpoints are saved only after the last
step, by ours and stock TFM (their cost is measured by `checkpoint_cost.py`);
nothing evaluates.
"""

import argparse
import dataclasses
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAIN = os.path.join(_common.REPO, "launchers", "train.py")
FIGURES = ("examples_per_second", "time_to_first_step_seconds",
           "startup_seconds", "peak_rss_mib", "process_peak_rss_mib",
           "available_cores", "cores_used")
# A run starts once this many cores are free (or after a short wait): the
# machine is shared.
QUIET_CORES = 0.85 * (os.cpu_count() or 1)
CONDITIONS = _common.CONDITIONS
PROGRESS_LINE = re.compile(r"^step (\d+)/\d+ \|")


@dataclasses.dataclass(frozen=True)
class Workload:
  """One model and its data, batch, loop lengths and measured window."""
  experiment: str
  global_batch_size: int
  train_steps: int
  steps_per_loop: int
  summary_interval: int
  # Examples per second are timed from this step to `train_steps`: every
  # variant ends a loop here, after its second (see the module docstring).
  warmup_steps: int
  overrides: str = ""
  # False: not one of issue 5's comparisons, a view of per-loop host work.
  targets: bool = True
  # At most this many repeats (None: all of them).
  repeats: Optional[int] = None

  def params_override(self, extra: str = "") -> str:
    """The `--params_override` every variant of this workload runs with."""
    return ",".join(part for part in (
        f"task.train_data.global_batch_size={self.global_batch_size}",
        f"trainer.train_steps={self.train_steps}",
        f"trainer.steps_per_loop={self.steps_per_loop}",
        f"trainer.summary_interval={self.summary_interval}",
        # No saves but TF's first and the last; no evaluation.
        f"trainer.checkpoint_interval={self.train_steps}",
        f"trainer.validation_interval={self.train_steps}",
        self.overrides, extra) if part)


SYNTHETIC = ("task.train_data.use_synthetic_data=true,"
             "task.validation_data.use_synthetic_data=true")
# `warmup_steps`: stock TFM and Keras end their second loop at twice
# `steps_per_loop`; digits' 200 is also where ours with 200 steps per loop
# (one step first) ends its second.
# Windows of about 17 s (digits, 3000 steps) and 20 s (ResNet50, 16 steps):
# shorter ones let one-off stalls of a shared machine move a ratio by 3%.
WORKLOADS = {
    "digits_convnet": Workload("digits_convnet", 64, 3200, 50, 50, 200),
    # A 2-core CPU runs a ResNet50 step of batch 8 in one to two seconds.
    "resnet50": Workload("resnet50_imagenet_ctl", 8, 20, 2, 2, 4, SYNTHETIC),
    # One step per loop: what each variant does between loops shows.
    "digits_convnet_per_step": Workload("digits_convnet", 64, 1200, 1, 1, 200,
                                        targets=False, repeats=3),
}
# The quick mode (`run_all.py --quick`, at most 10 minutes on 2 cores): the
# headline ratios, idle and loaded, with the spread of the repeats; windows
# of a few seconds, so noisier than the full run's.
HEADLINE_WORKLOADS = {
    "digits_convnet": Workload("digits_convnet", 64, 500, 50, 50, 200),
    "resnet50": Workload("resnet50_imagenet_ctl", 2, 10, 2, 2, 4, SYNTHETIC),
}
HEADLINE_REPEATS = 2
SMOKE_WORKLOADS = {
    "digits_convnet": Workload("digits_convnet", 64, 400, 50, 50, 200),
    "resnet50": Workload("resnet50_imagenet_ctl", 2, 6, 2, 2, 4, SYNTHETIC),
    "digits_convnet_per_step": Workload("digits_convnet", 64, 240, 1, 1, 200,
                                        targets=False),
}


@dataclasses.dataclass(frozen=True)
class Variant:
  """How a run trains: `runner` with `extra` overrides of the workload."""
  runner: str
  extra: str = ""
  workloads: Tuple[str, ...] = tuple(WORKLOADS)
  # Ablations whose effect dwarfs the noise run fewer times.
  max_repeats: Optional[int] = None
  # The conditions (`CONDITIONS`) it runs in, of those measured.
  conditions: Tuple[str, ...] = tuple(_common.CONDITIONS)


VARIANTS = {
    "ours": Variant("ours"),
    "stock_tfm": Variant("stock_tfm"),
    "handwritten": Variant("handwritten"),
    "keras_fit": Variant("keras_fit"),
    "keras_fit_tensorboard": Variant("keras_fit_tensorboard"),
    # Ablations of our defaults (point 4 of issue 5).
    "ours_steps_per_loop_200": Variant(
        "ours", "trainer.steps_per_loop=200,trainer.summary_interval=200",
        ("digits_convnet",), max_repeats=2),
    "ours_xla": Variant("ours", "runtime.xla_on_cpu=true",
                        ("digits_convnet", "resnet50"), max_repeats=2),
    # `mirrored` on one CPU device without TFM's one-replica
    # MirroredStrategy, ours' default: no strategy.
    "ours_no_strategy": Variant("ours", "runtime.mirror_one_device=false",
                                ("digits_convnet", "resnet50")),
    # A pool of its own for the input, of half the cores, where ours
    # leaves it on tf.data's pool as stock TFM does.
    "ours_private_pool": Variant(
        "ours", "runtime.dataset_num_private_threads="
        f"{max(1, (os.cpu_count() or 2) // 2)}", ("digits_convnet",)),
    # bfloat16 on the CPU: fast with AVX512-BF16 or AMX, emulated without
    # (`machine()["bf16"]` says which this CPU has).
    "ours_bfloat16": Variant(
        "ours", "runtime.mixed_precision_dtype=bfloat16", ("resnet50",),
        max_repeats=2),
}
if not any(_common.cpu_bf16().values()):
  # Emulated, a bfloat16 run takes ten times float32's: once, idle, is
  # enough to show that it does not pay.
  VARIANTS["ours_bfloat16"] = dataclasses.replace(
      VARIANTS["ours_bfloat16"], max_repeats=1, conditions=("idle",))
# The quick mode's: the headline comparisons and the input pool's default.
HEADLINE_VARIANTS = {
    **{name: VARIANTS[name] for name in (
        "ours", "stock_tfm", "ours_private_pool")},
    # The hand-written loop and Keras on digits: their ResNet50 runs would
    # double the mode's time.
    **{name: dataclasses.replace(VARIANTS[name], workloads=("digits_convnet",))
       for name in ("handwritten", "keras_fit")},
}
if any(_common.cpu_bf16().values()):
  # Whether bfloat16 pays on this CPU: once, idle. Where the CPU emulates
  # it, only the full run measures it.
  HEADLINE_VARIANTS["ours_bfloat16"] = dataclasses.replace(
      VARIANTS["ours_bfloat16"], max_repeats=1, conditions=("idle",))


# -- Parent: runs the children and times their progress lines --------------


def run_variant(workload: Workload, variant: Variant,
                timeout: float = 900.0, busy: int = 0) -> Dict[str, Any]:
  """Runs one variant of `workload` in a fresh process; returns its figures.

  With `busy`, that many cores spin in other processes while it runs (once
  the machine was quiet): a shared host.

  Raises:
    _common.ChildFailed: if the run fails or takes over `timeout` seconds.
  """
  model_dir = tempfile.mkdtemp(prefix="bench_")
  override = workload.params_override(variant.extra)
  if variant.runner == "ours":
    argv = [TRAIN, f"--experiment={workload.experiment}", "--mode=train",
            f"--model_dir={model_dir}", f"--params_override={override}"]
  else:
    argv = [__file__, f"--child={variant.runner}",
            f"--experiment={workload.experiment}",
            f"--params_override={override}", f"--model_dir={model_dir}"]
  cores = _common.wait_for_quiet(QUIET_CORES)
  try:
    with _common.busy_cores(busy):
      child = _common.run_child([_common.python(), *argv], timeout)
    summary_path = os.path.join(model_dir, "run_summary.json")
    summary = {}
    if os.path.exists(summary_path):
      with open(summary_path) as f:
        summary = json.load(f)
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  result = figures(workload, progress_marks(child["lines"]))
  result.update(process_peak_rss_mib=child["peak_rss_mib"],
                available_cores=cores)
  if summary:  # Ours: what run_summary.json says, for comparison.
    result["run_summary"] = {
        k: summary.get(k) for k in ("examples_per_second",
                                    "time_to_first_step_seconds",
                                    "input_threads")}
  return result


def progress_marks(lines) -> List[Tuple[int, float, float, Optional[float]]]:
  """`(step, seconds since start, peak RSS MiB, CPU seconds)` of each
  progress line."""
  marks = []
  for seconds, line, peak, cpu in lines:
    match = PROGRESS_LINE.match(line)
    if match:
      marks.append((int(match.group(1)), seconds, peak, cpu))
  return marks


def figures(workload: Workload,
            marks: List[Tuple[int, float, float, Optional[float]]]
            ) -> Dict[str, Any]:
  """Time to first step, steady examples/s, startup, peak memory and cores
  used while training, from the loop-end marks (`progress_marks`).

  `cores_used` is the process's CPU time over the wall time of the same
  window: a variant that uses more cores than the others for the same
  steps loses more when other work holds one (the `loaded` condition).

  Raises:
    ValueError: if no loop ended at `warmup_steps` or the run stopped short.
  """
  at = {step: (seconds, cpu) for step, seconds, _, cpu in marks}
  first_step, first_seconds, _, _ = marks[0]
  last_step, last_seconds, last_peak, last_cpu = marks[-1]
  if workload.warmup_steps not in at or last_step != workload.train_steps:
    raise ValueError(f"Loops ended at steps {sorted(at)}: none at "
                     f"warmup_steps={workload.warmup_steps} or the last "
                     f"step, {workload.train_steps}.")
  window = last_step - workload.warmup_steps
  warm_seconds, warm_cpu = at[workload.warmup_steps]
  seconds = last_seconds - warm_seconds
  step_seconds = seconds / window
  result = {
      "examples_per_second": window * workload.global_batch_size / seconds,
      "time_to_first_step_seconds": first_seconds,
      "first_loop_steps": first_step,
      "startup_seconds": first_seconds - (first_step - 1) * step_seconds,
      "peak_rss_mib": last_peak,
      # The first loops show one-off costs; the rest only the steady state.
      "loop_ends": [(step, seconds) for step, seconds, _, _ in
                    (marks if len(marks) <= 8 else marks[:6] + marks[-2:])],
  }
  if warm_cpu is not None and last_cpu is not None:
    result["cores_used"] = (last_cpu - warm_cpu) / seconds
  return result


def measure(workloads: Dict[str, Workload], variants: Dict[str, Variant],
            repeats: int, conditions: Sequence[str] = ("idle",),
            warm_ups: Optional[int] = None,
            save: Callable[[Dict[str, Any]], None] = lambda results: None
            ) -> Dict[str, Any]:
  """Runs every (workload, variant) `repeats` times in each condition.

  Runs are interleaved: within a repeat, each workload's variants run in a
  rotated order, each variant idle then loaded, so that a slow spell of
  the machine falls on both conditions alike.

  Returns, per condition (`CONDITIONS`) and workload, its config, each
  variant's runs and medians, and `ours`' ratios to the other variants;
  `save` gets the same after each repeat, of the repeats so far.
  """
  plan = [(w, v) for w in workloads for v in variants
          if w in variants[v].workloads]
  runs: Dict[tuple, List[Dict[str, Any]]] = {
      (c, w, v): [] for c in conditions for w, v in plan}
  # One discarded run per workload first (the first `warm_ups` workloads):
  # the first process of a benchmark reads TensorFlow and the data from a
  # cold file cache (its first step came 1-1.5 s late), which would land on
  # whichever variant runs first.
  for w in list(dict.fromkeys(w for w, _ in plan))[:warm_ups]:
    result = run_variant(workloads[w], variants["ours"])
    print(f"[warm-up] {w} ours: {result['examples_per_second']:.1f} ex/s "
          "(not counted)", flush=True)
  for repeat in range(repeats):
    for w, v in _rotated(plan, repeat):
      if repeat >= min(variants[v].max_repeats or repeats,
                       workloads[w].repeats or repeats):
        continue
      for c in conditions:
        if c not in variants[v].conditions:
          continue
        result = run_variant(workloads[w], variants[v], busy=CONDITIONS[c])
        runs[(c, w, v)].append(result)
        print(f"[{repeat + 1}/{repeats}] {w} {v} {c}: "
              f"{result['examples_per_second']:.1f} ex/s, first step after "
              f"{result['time_to_first_step_seconds']:.1f}s, "
              f"{result['peak_rss_mib']:.0f} MiB, "
              f"{result['available_cores']:.1f} cores free", flush=True)
    save(_summary(workloads, plan, runs, conditions, repeat + 1))
  return _summary(workloads, plan, runs, conditions, repeats)


def _summary(workloads, plan, runs, conditions, repeats) -> Dict[str, Any]:
  """`measure`'s results, of the runs in `runs`."""
  out = {}
  for c in conditions:
    out[c] = {}
    for w, workload in workloads.items():
      per_variant = {v: {"runs": runs[(c, w, v)],
                         "median": _common.medians(runs[(c, w, v)], FIGURES)}
                     for ww, v in plan if ww == w and runs[(c, w, v)]}
      out[c][w] = {"config": dataclasses.asdict(workload),
                   "params_override": workload.params_override(),
                   "repeats": repeats, "busy_cores": CONDITIONS[c],
                   "variants": per_variant, "ours_over": ratios(per_variant)}
  return out


def _rotated(plan: List[Tuple[str, str]], repeat: int
             ) -> List[Tuple[str, str]]:
  """`plan` with each workload's variants rotated by `repeat` places.

  No variant always runs first, or always after the same other one.
  """
  order = []
  for workload in dict.fromkeys(w for w, _ in plan):
    order += _common.rotated([(w, v) for w, v in plan if w == workload],
                             repeat)
  return order


def ratios(per_variant: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
  """Ours over each other variant: examples/s (of the medians, and of each
  repeat's pair of runs, which ran side by side), and speed-ups of time to
  first step and of startup (other's seconds / ours; >= 1: ours is faster).
  """
  ours = per_variant["ours"]["median"]
  ours_runs = per_variant["ours"]["runs"]
  return {name: {
      "examples_per_second": (ours["examples_per_second"]
                              / variant["median"]["examples_per_second"]),
      "examples_per_second_by_repeat": [
          mine["examples_per_second"] / other["examples_per_second"]
          for mine, other in zip(ours_runs, variant["runs"])],
      "time_to_first_step": (variant["median"]["time_to_first_step_seconds"]
                             / ours["time_to_first_step_seconds"]),
      "startup": variant["median"]["startup_seconds"] / ours[
          "startup_seconds"],
  } for name, variant in per_variant.items() if name != "ours"}


# -- Children: one variant each, printing TrainProgress lines ---------------


def _child(runner: str, experiment: str, params_override: str,
           model_dir: str) -> None:
  """Trains one variant in this process, printing a progress line per loop."""
  from tfm_ext import run_summary  # pylint: disable=g-import-not-at-top
  start_time = run_summary.process_start_time()
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  from official.core import train_utils  # pylint: disable=g-import-not-at-top
  from official.modeling import performance  # pylint: disable=g-import-not-at-top
  from tfm_ext import console  # pylint: disable=g-import-not-at-top
  # TFM's own parsing, as `official/vision/train.py` does it.
  params = train_utils.parse_configuration(train_utils.ParseConfigOptions(
      experiment=experiment, config_file=[], params_override=params_override))
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)

  def clock(global_step):
    return console.TrainProgress(
        global_step=global_step, total_steps=params.trainer.train_steps,
        global_batch_size=params.task.train_data.global_batch_size,
        start_time=start_time)

  CHILDREN[runner](params, model_dir, clock)


def _stock_tfm(params, model_dir, clock):
  """TFM's `train.py` path: `train_lib.run_experiment`, `base_trainer.Trainer`.

  The clock is added as a train action by the controller factory, which is
  where the trainer's global step first becomes visible.
  """
  import orbit  # pylint: disable=g-import-not-at-top
  from official.common import distribute_utils  # pylint: disable=g-import-not-at-top
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  from official.core import train_lib  # pylint: disable=g-import-not-at-top
  from official.core import train_utils  # pylint: disable=g-import-not-at-top
  clocks = []

  def controller(**kwargs):
    clocks.append(clock(kwargs["global_step"]))
    kwargs["train_actions"] = [*(kwargs.get("train_actions") or ()),
                               clocks[0]]
    return orbit.Controller(**kwargs)

  train_utils.serialize_config(params, model_dir)
  runtime = params.runtime
  strategy = distribute_utils.get_distribution_strategy(
      distribution_strategy=runtime.distribution_strategy,
      all_reduce_alg=runtime.all_reduce_alg, num_gpus=runtime.num_gpus,
      tpu_address=runtime.tpu)
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=model_dir)
  train_lib.run_experiment(distribution_strategy=strategy, task=task,
                           mode="train", params=params, model_dir=model_dir,
                           controller_cls=controller)


def _model_parts(params):
  """The task's model, optimizer, metrics and training data: no trainer."""
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  task = task_factory.get_task(params.task)
  model = task.build_model()
  optimizer = task.create_optimizer(params.trainer.optimizer_config,
                                    params.runtime)
  metrics = task.build_metrics(training=True)
  return task, model, optimizer, metrics, task.build_inputs(
      params.task.train_data)


def _handwritten(params, model_dir, clock):
  """The floor: `steps_per_loop` steps per `tf.function` call, in a
  `tf.while_loop`, the first call one step (as ours)."""
  del model_dir
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfm_ext import assembly  # pylint: disable=g-import-not-at-top
  task, model, optimizer, metrics, dataset = _model_parts(params)
  iterator = iter(dataset)

  @tf.function
  def train_loop(num_steps):
    for _ in tf.range(num_steps):
      features, labels = next(iterator)
      with tf.GradientTape() as tape:
        outputs = model(features, training=True)
        loss = task.build_losses(labels, outputs, aux_losses=model.losses)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      for metric in metrics:
        metric.update_state(labels, outputs)

  progress = clock(optimizer.iterations)
  loop_length = assembly.FirstStepThenEvery(params.trainer.steps_per_loop)
  step, total = 0, params.trainer.train_steps
  while step < total:
    num_steps = min(loop_length(step), total - step)
    train_loop(tf.constant(num_steps))
    step += num_steps
    progress({})


def _keras_fit(params, model_dir, clock, summaries=False):
  """`tf_keras` `Model.fit` on the task's model, loss, metrics and data;
  with `summaries`, writing them as ours does (Keras's `TensorBoard`)."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  task, model, optimizer, metrics, dataset = _model_parts(params)
  # Keras adds the model's regularization losses itself.
  model.compile(optimizer=optimizer,
                loss=lambda labels, outputs: task.build_losses(labels,
                                                               outputs),
                metrics=metrics,
                steps_per_execution=params.trainer.steps_per_loop)
  progress = clock(optimizer.iterations)

  class Clock(tf_keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      progress({})

  callbacks = [Clock()]
  if summaries:
    callbacks.insert(0, tf_keras.callbacks.TensorBoard(
        model_dir, update_freq=params.trainer.summary_interval,
        write_graph=False, profile_batch=0))
  model.fit(dataset, epochs=1, steps_per_epoch=params.trainer.train_steps,
            verbose=0, callbacks=callbacks)


CHILDREN = {"stock_tfm": _stock_tfm, "handwritten": _handwritten,
            "keras_fit": _keras_fit,
            "keras_fit_tensorboard": functools.partial(_keras_fit,
                                                       summaries=True)}


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark (or, with `--child`, one variant); see the docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sizes = parser.add_mutually_exclusive_group()
  sizes.add_argument("--smoke", action="store_true",
                     help="Tiny sizes and one repeat: checks that it runs.")
  sizes.add_argument("--headline", action="store_true",
                     help="The quick mode: the headline comparisons, in "
                     "minutes.")
  parser.add_argument("--repeats", type=int, default=None,
                      help="Runs of each variant (default 5, headline "
                      f"{HEADLINE_REPEATS}, smoke 1; ablations at most 2).")
  parser.add_argument("--conditions", default=",".join(CONDITIONS),
                      help="Comma-separated, of: " + ", ".join(
                          f"{name} ({busy} cores busy)"
                          for name, busy in CONDITIONS.items()))
  parser.add_argument("--variants", help="Comma-separated: only these of "
                      "the mode's variants (`ours` among them).")
  parser.add_argument("--workloads", help="Comma-separated: only these of "
                      "the mode's workloads.")
  parser.add_argument("--out", help="Write the results as JSON here.")
  parser.add_argument("--child", choices=sorted(CHILDREN),
                      help=argparse.SUPPRESS)
  parser.add_argument("--experiment", help=argparse.SUPPRESS)
  parser.add_argument("--params_override", help=argparse.SUPPRESS)
  parser.add_argument("--model_dir", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    _child(args.child, args.experiment, args.params_override, args.model_dir)
    return {}
  conditions = args.conditions.split(",")
  unknown = set(conditions) - set(CONDITIONS)
  if unknown:
    parser.error(f"--conditions: unknown {sorted(unknown)}; give any of "
                 f"{list(CONDITIONS)}")
  if args.smoke:
    workloads, variants, repeats = SMOKE_WORKLOADS, VARIANTS, 1
  elif args.headline:
    workloads, variants, repeats = (HEADLINE_WORKLOADS, HEADLINE_VARIANTS,
                                    HEADLINE_REPEATS)
  else:
    workloads, variants, repeats = WORKLOADS, VARIANTS, 5
  if args.variants:
    names = args.variants.split(",")
    if "ours" not in names or set(names) - set(variants):
      parser.error(f"--variants: give `ours` and any of {sorted(variants)}")
    variants = {name: variants[name] for name in names}
  if args.workloads:
    names = args.workloads.split(",")
    if set(names) - set(workloads):
      parser.error(f"--workloads: give any of {sorted(workloads)}")
    workloads = {name: workloads[name] for name in names}
  # The quick mode warms the file cache once, for both workloads.
  # The file also says where and on what code it was measured, for
  # `run_all.py --training_loops=FILE` to report.
  machine = _common.machine()
  results = measure(
      workloads, variants, args.repeats or repeats, conditions,
      warm_ups=1 if args.headline else None,
      save=lambda so_far: args.out and _common.write_json(
          args.out, dict(so_far, machine=machine)))
  print(json.dumps({c: {w: r["ours_over"] for w, r in by_workload.items()}
                    for c, by_workload in results.items()}, indent=2))
  if args.out:
    _common.write_json(args.out, dict(results, machine=machine))
  return results


if __name__ == "__main__":
  main()
