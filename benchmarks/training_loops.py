"""Training speed in interleaved pairs: ours, stock TFM, a plain loop, Keras.

    python benchmarks/training_loops.py --workload=digits_convnet \
        --variants=ours,stock_tfm --rounds=8 [--out=FILE]

Each variant trains in a process of its own, all of them alive at once and
all but one stopped (SIGSTOP): the one resumed trains for a window of a few
loops, is stopped again, and the next one runs. A round gives every variant
one window in each condition: `idle`, and `loaded`, where a busy loop in
another process holds one core (`CONDITIONS`); the order of the variants
rotates each round and the conditions alternate, so a slow spell of a
shared machine falls on every variant alike. Ours and another variant in
the same round and condition are a pair: their windows ran seconds apart.

A window runs from the first loop end after the resume (the loop the stop
cut short is not counted) to `loops` loop ends later, timed from this
process as each variant's progress line (`tfm_ext.base.console.TrainProgress`)
arrives. Per marginal step it gives:

    wall_ms      wall time: what a user waits, and what contention moves
    cpu_ms       the child's CPU time, all threads, user and system, as the
                 scheduler counts it (`/proc/<pid>/task/*/schedstat`, in
                 nanoseconds): the work it did, which another job on the
                 machine moves far less
    instructions, cycles
                 hardware counters (`perf stat -p`), where the kernel
                 exposes them (`hardware_counters()`; a VM often does not)

Variants, on the same model, data, global batch and loop length:

    ours         `launchers/train.py` as a user runs it
    stock_tfm    TFM's `train_lib.run_experiment` with `base_trainer.Trainer`
    handwritten  a `tf.function` running a loop's steps in a `tf.while_loop`
    keras_fit    `tf_keras` `Model.fit`, `steps_per_execution=steps_per_loop`
    keras_fit_tensorboard  the same writing summaries (Keras's `TensorBoard`)

and ours with one override each (`VARIANTS`): the defaults' alternatives.
`run_variant` runs one variant to its end instead (the GPU script's way).
"""

import argparse
import contextlib
import dataclasses
import functools
import importlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import _tfm_experiments
# pylint: enable=g-import-not-at-top,wrong-import-position

TRAIN = os.path.join(_common.REPO, "launchers", "train.py")
PROGRESS_LINE = re.compile(r"^step (\d+)/\d+ \|")
SYNTHETIC = ("task.train_data.use_synthetic_data=true,"
             "task.validation_data.use_synthetic_data=true")
# Cores a busy loop holds in each condition: training hosts are shared
# (other jobs, data loaders, an evaluator beside the trainer).
CONDITIONS = {"idle": 0, "loaded": max(1, (os.cpu_count() or 2) // 2)}
# A session's processes train "for ever" and are killed when it ends.
ENDLESS_STEPS = 10**8


@dataclasses.dataclass(frozen=True)
class Workload:
  """One model and its data, batch and loop length."""
  experiment: str
  global_batch_size: int
  train_steps: int
  steps_per_loop: int
  summary_interval: int
  # `run_variant` times examples/s from this step to `train_steps`.
  warmup_steps: int = 0
  overrides: str = ""
  # TFM's own experiments (`_tfm_experiments.py`): the config file both
  # sides read, the module ours registers it from (`--registry`) and our
  # `--trainer`; the stock child that runs TFM's own loop for it and the
  # module it imports first; environment variables of both sides'
  # processes; and the experiment of tests/e2e/test_tfm_experiments.py
  # whose data and overrides it takes (`_tfm_experiments.prepared`).
  config_file: str = ""
  registry: str = ""
  trainer: str = ""
  stock: str = "stock_tfm"
  stock_registry: str = "registry_imports"
  env: Tuple[str, ...] = ()
  tfm_data: str = ""

  def params_override(self, extra: str = "") -> str:
    """The `--params_override` every variant of this workload runs with."""
    return ",".join(part for part in (
        # 0: the config file's batch.
        self.global_batch_size and
        f"task.train_data.global_batch_size={self.global_batch_size}",
        f"trainer.train_steps={self.train_steps}",
        f"trainer.steps_per_loop={self.steps_per_loop}",
        f"trainer.summary_interval={self.summary_interval}",
        # No saves but TF's first and the last; no evaluation.
        f"trainer.checkpoint_interval={self.train_steps}",
        f"trainer.validation_interval={self.train_steps}",
        self.overrides, extra) if part)


@dataclasses.dataclass(frozen=True)
class Variant:
  """How a run trains: `runner` with `extra` overrides of the workload and
  `env`, environment variables of its process."""
  runner: str
  extra: str = ""
  env: Tuple[str, ...] = ()


WORKLOADS = {
    "digits_convnet": Workload("digits_convnet", 64, ENDLESS_STEPS, 50, 50),
    # Batch 2 of 224x224 images: a loop of 2 steps takes a second or two on
    # a 2-core CPU.
    "resnet50": Workload("resnet50_imagenet_ctl", 2, ENDLESS_STEPS, 2, 2,
                         overrides=SYNTHETIC),
}
# TFM's own experiments, shrunk by the tests' configs (their batches: 2,
# DLRM's 8), on the tests' data (`_tfm_experiments.prepared`).
WORKLOADS.update({name: Workload(name, 0, ENDLESS_STEPS,
                                 **_tfm_experiments.launch(name))
                  for name in _tfm_experiments.NAMES})
VARIANTS = {
    "ours": Variant("ours"),
    "stock_tfm": Variant("stock_tfm"),
    "handwritten": Variant("handwritten"),
    "keras_fit": Variant("keras_fit"),
    "keras_fit_tensorboard": Variant("keras_fit_tensorboard"),
    # The defaults' alternatives.
    "ours_tf_data_pool": Variant("ours",
                                 "runtime.dataset_num_private_threads=0"),
    "ours_no_strategy": Variant("ours", "runtime.mirror_one_device=false"),
    "ours_xla": Variant("ours", "runtime.xla_on_cpu=true"),
    "ours_bfloat16": Variant("ours", "runtime.mixed_precision_dtype=bfloat16"),
    # TFM's own `base_trainer.Trainer` run by our driver: the trainer's
    # share of a difference from stock TFM, apart from the driver's.
    "ours_tfm_base": Variant("ours", "trainer.name=tfm_base"),
    # TensorFlow's inter-op pool of one thread (TF reads the variable).
    "ours_interop1": Variant("ours", env=("TF_NUM_INTEROP_THREADS=1",)),
}


def _argv(workload: Workload, variant: Variant, model_dir: str) -> List[str]:
  override = workload.params_override(variant.extra)
  # `env` execs the interpreter: the process measured keeps its pid.
  env = [*workload.env, *variant.env]
  env = ["env", *env] if env else []
  config = ([f"--config_file={workload.config_file}"]
            if workload.config_file else [])
  if variant.runner == "ours":
    return [*env, _common.python(), TRAIN,
            *([f"--registry={workload.registry}"] if workload.registry
              else []),
            *([f"--trainer={workload.trainer}"] if workload.trainer else []),
            f"--experiment={workload.experiment}", "--mode=train",
            f"--model_dir={model_dir}", *config,
            f"--params_override={override}"]
  runner = workload.stock if variant.runner == "stock_tfm" else variant.runner
  return [*env, _common.python(), os.path.abspath(__file__),
          f"--child={runner}", f"--registry={workload.stock_registry}",
          f"--experiment={workload.experiment}", *config,
          f"--params_override={override}", f"--model_dir={model_dir}"]


def run_variant(workload: Workload, variant: Variant,
                timeout: float = 900.0) -> Dict[str, Any]:
  """Runs one variant of `workload` to its end in a fresh process.

  Returns examples/s from `warmup_steps` to `train_steps`, the time to the
  first progress line (from starting the process) and `loop_ends`.

  Raises:
    _common.ChildFailed: if the run fails or takes over `timeout` seconds.
  """
  model_dir = tempfile.mkdtemp(prefix="bench_")
  try:
    child = _common.run_child(_argv(workload, variant, model_dir), timeout)
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  marks = [(int(m.group(1)), seconds) for seconds, line, *_ in child["lines"]
           for m in [PROGRESS_LINE.match(line)] if m]
  at = dict(marks)
  if workload.warmup_steps not in at or marks[-1][0] != workload.train_steps:
    raise ValueError(f"Loops ended at steps {sorted(at)}: none at "
                     f"warmup_steps={workload.warmup_steps} or the last "
                     f"step, {workload.train_steps}.")
  window = workload.train_steps - workload.warmup_steps
  return {"examples_per_second": window * workload.global_batch_size
                                 / (marks[-1][1] - at[workload.warmup_steps]),
          "time_to_first_step_seconds": marks[0][1],
          "peak_rss_mib": child["peak_rss_mib"], "loop_ends": marks}


# -- Interleaved pairs ------------------------------------------------------


def hardware_counters() -> List[str]:
  """The `perf` events this machine counts of instructions and cycles.

  Empty where `perf` is missing or the kernel (a VM's, often) exposes no
  hardware counters.
  """
  if not shutil.which("perf"):
    return []
  done = subprocess.run(["perf", "stat", "-x,", "-e", "instructions,cycles",
                         "true"], capture_output=True, text=True, check=False)
  return [event for event in ("instructions", "cycles")
          if done.returncode == 0 and re.search(
              rf"^\d+,[^,]*,{event}", done.stderr, re.M)]


class Counters:
  """`perf stat` attached to a process for one window; `stop()` -> counts."""

  def __init__(self, pid: int, events: Sequence[str]):
    self._out = tempfile.NamedTemporaryFile("r", suffix=".perf")
    self._events = list(events)
    self._proc = subprocess.Popen(
        ["perf", "stat", "-x,", "-o", self._out.name, "-e",
         ",".join(self._events), "-p", str(pid)], stderr=subprocess.DEVNULL)

  def stop(self) -> Dict[str, float]:
    """Ends the count; `{event: count}` of the events perf counted."""
    self._proc.send_signal(signal.SIGINT)
    self._proc.wait()
    counts = {}
    for line in self._out.read().splitlines():
      fields = line.split(",")
      if len(fields) > 2 and fields[2] in self._events:
        with contextlib.suppress(ValueError):
          counts[fields[2]] = float(fields[0])
    self._out.close()
    return counts


class Live:
  """A variant training in a child process that can be stopped and resumed.

  A thread reads its output and queues `(seconds, step, thread_cpu)` for
  each progress line as it arrives: this process's clock, and the CPU time
  of each of the child's threads so far (`_common.thread_cpu`).
  """

  def __init__(self, name: str, argv: Sequence[str]):
    self.name = name
    self.model_dir = tempfile.mkdtemp(prefix="bench_")
    self.marks: "queue.Queue" = queue.Queue()
    self.tail: List[str] = []
    self.started = time.time()
    self.proc = _common.popen(
        [arg.replace("{model_dir}", self.model_dir) for arg in argv])
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      now = time.time()
      self.tail = (self.tail + [line.rstrip("\n")])[-40:]
      match = PROGRESS_LINE.match(line)
      if match:
        self.marks.put((now - self.started, int(match.group(1)),
                        _common.thread_cpu(self.proc.pid)))
    self.marks.put(None)  # The child is gone.

  def next_mark(self, timeout: float):
    """The next progress line's mark.

    Raises:
      _common.ChildFailed: if the child ended or said nothing in `timeout`.
    """
    try:
      mark = self.marks.get(timeout=timeout)
    except queue.Empty:
      mark = None
    if mark is None:
      raise _common.ChildFailed(f"{self.name}: no progress line in "
                                f"{timeout:.0f}s:\n" + "\n".join(self.tail))
    return mark

  def pause(self) -> None:
    self.proc.send_signal(signal.SIGSTOP)

  def resume(self) -> None:
    """Resumes, first dropping marks of lines printed before the stop."""
    with contextlib.suppress(queue.Empty):
      while True:
        self.marks.get_nowait()
    self.proc.send_signal(signal.SIGCONT)

  def close(self) -> Dict[str, Any]:
    """Kills the child; returns its peak resident memory (MiB)."""
    peak = _common.peak_rss_mib(self.proc.pid)
    self.proc.kill()
    self.proc.wait()
    shutil.rmtree(self.model_dir, ignore_errors=True)
    return {"peak_rss_mib": peak}


def pairs(workload: Workload, names: Sequence[str], rounds: int,
          loops: int = 2, conditions: Sequence[str] = tuple(CONDITIONS),
          budget: Optional[float] = None, timeout: float = 600.0
          ) -> Dict[str, Any]:
  """Measures `names` (`VARIANTS`) in up to `rounds` interleaved rounds.

  With `budget` (seconds, start-up included), no round starts that the
  last one's duration says would end past it, once `MIN_ROUNDS` ran: a
  slow day gives fewer pairs, not a longer run.

  Returns `windows`, one row per window (`WINDOW_FIELDS`), and per variant
  its time to first step (one process each, started one after another
  while the others were stopped) and peak memory.
  """
  started = time.time()
  counters = hardware_counters()
  live: Dict[str, Live] = {}
  out: Dict[str, Any] = {
      "workload": dataclasses.asdict(workload), "loops": loops,
      "counters": counters or "none: the kernel exposes no hardware "
      "counters to perf" if shutil.which("perf") else "none: no perf",
      "variants": {}, "windows": []}
  busy = _common.Spinners(max(CONDITIONS[c] for c in conditions))
  try:  # pylint: disable=too-many-nested-blocks
    for name in names:
      live[name] = Live(name, _argv(workload, VARIANTS[name], "{model_dir}"))
      first = live[name].next_mark(timeout)
      # The first loops trace, write the first summaries and (stock TFM)
      # save a first checkpoint: one-off costs, not the steady state.
      for _ in range(2):
        live[name].next_mark(timeout)
      live[name].pause()
      out["variants"][name] = {"first_step_seconds": first[0],
                               "extra": VARIANTS[name].extra}
      print(f"{name}: first step after {first[0]:.1f}s", flush=True)
    last_round = 0.0
    for r in range(rounds):
      round_start = time.time()
      if budget and r >= MIN_ROUNDS and (
          round_start + last_round - started > budget):
        break
      for condition in _common.rotated(list(conditions), r):
        busy.hold(CONDITIONS[condition])
        for name in _common.rotated(list(names), r):
          child = live[name]
          child.resume()
          start = child.next_mark(timeout)
          perf = Counters(child.proc.pid, counters) if counters else None
          for _ in range(loops):
            end = child.next_mark(timeout)
          counts = perf.stop() if perf else {}
          child.pause()
          steps = end[1] - start[1]
          row = [r, condition, name, steps, round(end[0] - start[0], 4),
                 round(_common.cpu_between(start[2], end[2]), 4),
                 round(os.getloadavg()[0], 2),
                 *(counts.get(event) for event in counters)]
          out["windows"].append(row)
          print(f"[{r + 1}/{rounds}] {condition} {name}: "
                f"{row[4] / steps * 1e3:.2f} ms/step wall, "
                f"{row[5] / steps * 1e3:.2f} ms CPU", flush=True)
      last_round = time.time() - round_start
  finally:
    busy.close()
    for name, child in live.items():
      out["variants"].setdefault(name, {}).update(child.close())
  out["window_fields"] = list(WINDOW_FIELDS) + counters
  return out


MIN_ROUNDS = 3
WINDOW_FIELDS = ("round", "condition", "variant", "steps", "wall_s", "cpu_s",
                 "load_1min")


# -- Children: one variant each, printing TrainProgress lines ---------------


def _child(runner: str, registry: str, experiment: str, config_file: str,
           params_override: str, model_dir: str) -> None:
  """Trains one variant in this process, printing a progress line per loop.

  `registry` is imported first: the module that registers the experiment
  (stock TFM's vision runs import `official.vision.registry_imports`, as
  `official/vision/train.py` does).
  """
  from tfm_ext.model_dir import run_summary  # pylint: disable=g-import-not-at-top
  start_time = run_summary.process_start_time()
  importlib.import_module(registry)
  from official.core import train_utils  # pylint: disable=g-import-not-at-top
  from official.modeling import performance  # pylint: disable=g-import-not-at-top
  from tfm_ext.base import console  # pylint: disable=g-import-not-at-top
  # TFM's own parsing, as `official/vision/train.py` does it.
  params = train_utils.parse_configuration(train_utils.ParseConfigOptions(
      experiment=experiment, config_file=[config_file] if config_file else [],
      params_override=params_override))
  # Ranking's train.py sets no policy.
  if params.runtime.mixed_precision_dtype and runner != "stock_ranking":
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)

  def clock(global_step):
    return console.TrainProgress(
        global_step=global_step, total_steps=params.trainer.train_steps,
        global_batch_size=params.task.train_data.global_batch_size,
        start_time=start_time)

  CHILDREN[runner](params, model_dir, clock)


def _clocked_controller(clock):
  """An `orbit.Controller` factory that adds the clock as a train action:
  the controller is where the trainer's global step first becomes visible."""
  import orbit  # pylint: disable=g-import-not-at-top

  def controller(**kwargs):
    kwargs["train_actions"] = [*(kwargs.get("train_actions") or ()),
                               clock(kwargs["global_step"])]
    return orbit.Controller(**kwargs)

  return controller


def _stock_tfm(params, model_dir, clock):
  """TFM's `train.py` path: `train_lib.run_experiment`, `base_trainer.Trainer`
  (`official/vision/train.py`'s, with its registry imported)."""
  from official.common import distribute_utils  # pylint: disable=g-import-not-at-top
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  from official.core import train_lib  # pylint: disable=g-import-not-at-top
  from official.core import train_utils  # pylint: disable=g-import-not-at-top

  controller = _clocked_controller(clock)
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


def _stock_ranking(params, model_dir, clock):
  """`official/recommendation/ranking/train.py`'s `main` as it runs: its
  `RankingTrainer` in `train_lib.run_experiment`, given the clocked
  controller; its flags are this process's own (`--experiment`, ...)."""
  del params, model_dir  # Its main parses and makes them again.
  from absl import flags  # pylint: disable=g-import-not-at-top
  from official.core import train_lib  # pylint: disable=g-import-not-at-top
  from official.recommendation.ranking import common  # pylint: disable=g-import-not-at-top
  from official.recommendation.ranking import train  # pylint: disable=g-import-not-at-top
  run_experiment = train_lib.run_experiment
  train_lib.run_experiment = lambda **kwargs: run_experiment(
      **kwargs, controller_cls=_clocked_controller(clock))
  common.define_flags()
  flags.FLAGS([sys.argv[0], *sys.argv[1:], "--mode=train"], known_only=True)
  train.main(None)


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
  from tfm_ext.run import assembly  # pylint: disable=g-import-not-at-top
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


CHILDREN = {"stock_tfm": _stock_tfm, "stock_ranking": _stock_ranking,
            "handwritten": _handwritten,
            "keras_fit": _keras_fit,
            "keras_fit_tensorboard": functools.partial(_keras_fit,
                                                       summaries=True)}


def main(argv=None) -> Dict[str, Any]:
  """Runs one session of pairs (or, with `--child`, one variant)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=sorted(WORKLOADS),
                      default="digits_convnet")
  parser.add_argument("--variants", default="ours,stock_tfm",
                      help=f"Comma-separated, of: {', '.join(VARIANTS)}.")
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--loops", type=int, default=2,
                      help="Loops a window times.")
  parser.add_argument("--out", help="Write the results as JSON here.")
  parser.add_argument("--child", choices=sorted(CHILDREN),
                      help=argparse.SUPPRESS)
  parser.add_argument("--registry", help=argparse.SUPPRESS)
  parser.add_argument("--experiment", help=argparse.SUPPRESS)
  parser.add_argument("--config_file", default="", help=argparse.SUPPRESS)
  parser.add_argument("--params_override", help=argparse.SUPPRESS)
  parser.add_argument("--model_dir", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    _child(args.child, args.registry, args.experiment, args.config_file,
           args.params_override, args.model_dir)
    return {}
  names = args.variants.split(",")
  unknown = sorted(set(names) - set(VARIANTS))
  if unknown:
    parser.error(f"--variants: unknown {unknown}; give any of "
                 f"{', '.join(VARIANTS)}")
  with _tfm_experiments.prepared(WORKLOADS[args.workload]) as workload:
    results = pairs(workload, names, args.rounds, args.loops)
  if args.out:
    _common.write_json(args.out, results)
  return results


if __name__ == "__main__":
  main()
