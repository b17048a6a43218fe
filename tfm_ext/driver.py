"""Runs one mode of an experiment through TFM's `OrbitExperimentRunner`.

`prepare` resolves and checks a request without writing anything; `run`
builds the task and the registered trainer, hands them to TFM's runner
(which builds the checkpoint manager, TFM's actions and the Orbit
controller), runs the mode from `tfm_ext.modes`, and returns a `RunSummary`.
"""

import dataclasses
import json
import os
import tempfile
import time
from typing import Optional

from absl import logging
import orbit
import tensorflow as tf
import tf_keras

from official.common import distribute_utils
from official.core import config_definitions
from official.core import task_factory
from official.core import train_lib
from official.core import train_utils
from official.modeling import performance

from tfm_ext import best_checkpoint
from tfm_ext import config_drift
from tfm_ext import console
from tfm_ext import continuous_eval
from tfm_ext import determinism
from tfm_ext import modes
from tfm_ext import preemption
from tfm_ext import preflight
from tfm_ext import run_summary
from tfm_ext import summaries
from tfm_ext import trainers
from tfm_ext.errors import RunFailed
from tfm_ext.run_summary import RunSummary


@dataclasses.dataclass(frozen=True)
class RunRequest:
  """What to run: the operative config, the mode and where to write."""
  experiment: str
  mode: str
  model_dir: str
  params: config_definitions.ExperimentConfig
  # time.time() when the process started, for time to first step and wall.
  start_time: float = dataclasses.field(default_factory=time.time)
  # Resume a model_dir whose params.yaml differs in more than cadence.
  allow_config_change: bool = False


def build_strategy(params: config_definitions.ExperimentConfig):
  """Returns the `tf.distribute.Strategy` that `params.runtime` asks for.

  TFM's semantics, with two changes to `mirrored` with `num_gpus=0`:

  * over several logical CPU devices (a process that split its CPU with
    `tf.config.set_logical_device_configuration`) it mirrors over all of
    them, where TFM uses CPU:0 only;
  * in a process with one CPU device and no GPU, it returns the default
    strategy, as `off` does, where TFM builds a one-replica
    `MirroredStrategy` that costs 1 to 3% of a digits_convnet step
    (benchmarks/RESULTS.md) and adds nothing: the same data and math, bit
    for bit, and checkpoints that either restores. Only random ops in
    replica context (Keras's generator-backed dropout) draw from another
    stream.
    `runtime.mirror_one_device=true` keeps TFM's mirror, to exercise
    replica-context code on a laptop.
  """
  runtime = params.runtime
  if runtime.distribution_strategy == "mirrored" and runtime.num_gpus == 0:
    # Listing devices starts the runtime, so only here: a multi-worker
    # strategy must be made before that.
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) > 1:
      return tf.distribute.MirroredStrategy([d.name for d in cpus])
    # With a GPU in the process the default strategy would place the steps
    # there; TFM's mirror keeps them on the CPU that `num_gpus=0` asks for.
    if not (getattr(runtime, "mirror_one_device", False)
            or tf.config.list_logical_devices("GPU")):
      logging.info("runtime.distribution_strategy=mirrored on one CPU device: "
                   "no strategy (runtime.mirror_one_device=true keeps TFM's "
                   "one-replica MirroredStrategy).")
      return tf.distribute.get_strategy()
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=runtime.distribution_strategy,
      all_reduce_alg=runtime.all_reduce_alg,
      num_gpus=runtime.num_gpus,
      num_packs=runtime.num_packs,
      tpu_address=runtime.tpu)


def describe_strategy(strategy: tf.distribute.Strategy) -> str:
  """`MirroredStrategy`, ..., or `none` for the default strategy."""
  name = type(strategy).__name__
  return "none" if name == "_DefaultDistributionStrategy" else name


class FirstStepThenEvery:
  """`steps_per_loop` for Orbit: one step first, then back on the grid.

  The first loop of a process runs a single step, so the console shows
  progress (and the summary records time to first step) as soon as the step
  function is traced; each later loop ends on a multiple of `steps_per_loop`,
  so checkpoint and summary cadence stay those of the config.
  """

  def __init__(self, steps_per_loop: int):
    self._steps_per_loop = steps_per_loop
    self._first = True

  def __call__(self, global_step: int) -> int:
    if self._first:
      self._first = False
      return 1
    return self._steps_per_loop - global_step % self._steps_per_loop


def _controller(**kwargs) -> orbit.Controller:
  kwargs["steps_per_loop"] = FirstStepThenEvery(kwargs["steps_per_loop"])
  kwargs["global_step"] = host_readable(kwargs["global_step"],
                                        kwargs["strategy"])
  controller = orbit.Controller(**kwargs)  # Restores or initializes.
  if controller.checkpoint_manager is not None:
    count_interval_from_start(controller.checkpoint_manager,
                              int(controller.global_step.numpy()))
  return controller


def count_interval_from_start(manager: tf.train.CheckpointManager,
                              step: int) -> None:
  """The first save comes `checkpoint_interval` steps after `step`.

  A `CheckpointManager` that restored a checkpoint counts the interval from
  it; one that found none saves at its first check, after the first loop
  (stock TFM writes `ckpt-<steps_per_loop>`, and our first loop is one
  step). That checkpoint of an untrained model costs a
  full save (195 MiB for ResNet50; benchmarks/checkpoint_cost.py), holds one
  of `max_to_keep`'s places and is a full evaluation for a continuous
  evaluator beside training, all for one step of progress. TF takes no
  `last_checkpoint_step=0` (it reads `last_checkpoint_step or None`), so it
  is set here. Every worker of a multi-worker run, chief or not, so counts
  from the step it starts at (a non-chief's manager, in a temp dir, restores
  nothing of its own) and all save at the same steps.
  """
  # pylint: disable=protected-access
  if (manager._checkpoint_interval is not None
      and manager._last_checkpoint_step is None):
    manager._last_checkpoint_step = step


def host_readable(global_step: tf.Variable,
                  strategy: tf.distribute.Strategy) -> tf.Variable:
  """A variable that reads as `global_step` and is cheaper to read.

  The controller, the summaries and the progress line read the step about
  ten times a loop. A `MirroredVariable`'s `numpy()` goes through the
  distribution machinery: 0.13 ms against 0.03 ms for its first local
  component, which holds the same value (every replica's copy is updated
  with the first replica's, and a cross-replica read returns one of them).
  Other strategies' variables are returned as they are.
  """
  if (isinstance(global_step, tf.distribute.DistributedValues)
      and isinstance(strategy, (tf.distribute.MirroredStrategy,
                                tf.distribute.MultiWorkerMirroredStrategy))):
    return strategy.experimental_local_results(global_step)[0]
  return global_step


@dataclasses.dataclass(frozen=True)
class Plan:
  """A checked `RunRequest` with what `prepare` resolved for it."""
  request: RunRequest
  mode: modes.Mode
  trainer_cls: type
  strategy: tf.distribute.Strategy


def prepare(request: RunRequest) -> Plan:
  """Resolves and checks `request`; raises `UsageError`, writes nothing."""
  params = request.params
  mode = modes.get_mode(request.mode)
  trainer_cls = trainers.get_trainer(params.trainer.name)
  preflight.check_runtime(params.runtime)
  strategy = build_strategy(params)
  preflight.check(params, trains=mode.trains, evaluates=mode.evaluates,
                  needs_checkpoint=mode.needs_checkpoint,
                  model_dir=request.model_dir,
                  strategy=strategy)
  if mode.trains:
    config_drift.check(params, request.model_dir, request.allow_config_change)
  return Plan(request=request, mode=mode, trainer_cls=trainer_cls,
              strategy=strategy)


@dataclasses.dataclass(frozen=True)
class Recovery:
  """In-process recovery from transient errors."""
  max_restarts: int = 3
  backoff_seconds: float = 2.0


# Errors after which a rebuilt strategy, task and trainer can go on from the
# latest checkpoint: a lost peer or an aborted collective. Anything else is
# a bug or bad data and fails at once with its traceback.
TRANSIENT_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError)


def run_with_recovery(plan: Plan, recovery: Recovery = Recovery(),
                      watcher: Optional[preemption.SignalWatcher] = None,
                      sleep=time.sleep) -> RunSummary:
  """Runs `plan`, rebuilding and resuming after transient errors.

  Restarts at most `recovery.max_restarts` times, waiting
  `backoff_seconds * 2**n` before the n-th, each logged with its cause.
  """
  restarts = 0
  while True:
    if restarts:
      plan = prepare(plan.request)
    try:
      summary = run(plan, watcher=watcher)
    except TRANSIENT_ERRORS as e:
      # TensorFlow cannot set up collectives twice in one process: a
      # multi-worker job exits and its cluster manager restarts it.
      if restarts >= recovery.max_restarts or _is_multi_worker(plan.strategy):
        raise
      restarts += 1
      delay = recovery.backoff_seconds * 2 ** (restarts - 1)
      message = (f"restart {restarts}/{recovery.max_restarts} after "
                 f"{type(e).__name__}: {str(e).splitlines()[0]}; resuming "
                 f"from the latest checkpoint in {delay:.1f}s")
      logging.warning(message)
      print(message, flush=True)
      tf_keras.backend.clear_session()
      sleep(delay)
      continue
    summary.restarts = restarts
    return summary


def run(plan: Plan,
        watcher: Optional[preemption.SignalWatcher] = None) -> RunSummary:
  """Builds the task and trainer, runs the mode; returns what happened.

  Raises `preemption.Preempted` after a signal (its checkpoint saved) and
  `RunFailed` for corrupt input data; both carry the run summary as
  `.summary`.
  """
  request, mode, strategy = plan.request, plan.mode, plan.strategy
  params, model_dir = request.params, request.model_dir
  watcher = watcher or preemption.SignalWatcher(signals=())
  deterministic = determinism.apply(params.runtime)
  chief = strategy.extended.should_checkpoint
  # Every worker takes part in saving (variables may sync on read), but only
  # the chief writes where a user looks; the others write to a temp dir.
  write_dir = model_dir if chief else tempfile.mkdtemp(prefix="tfm_ext_worker")

  if mode.trains and chief:
    # Only training writes params.yaml: an evaluator beside the trainer on
    # the same model_dir must not race it for the file.
    train_utils.serialize_config(params, model_dir)
    continuous_eval.clear_training_complete(model_dir)
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  console.quiet_orbit_controller()

  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=write_dir)
    exporter = (best_checkpoint.maybe_create(params, write_dir)
                if mode.evaluates else None)
    trainer = train_utils.create_trainer(
        params, task, train=mode.trains, evaluate=mode.evaluates,
        checkpoint_exporter=exporter, trainer_cls=plan.trainer_cls)
  input_threads = getattr(trainer, "input_threads", 0)
  logging.info("tf.data: %s for this run's input "
               "(runtime.dataset_num_private_threads; 0: tf.data's own pool)",
               f"a private pool of {input_threads} thread(s)" if input_threads
               else "tf.data's own thread pool")

  step = host_readable(trainer.global_step, strategy)
  train_summaries, eval_summaries = _summary_managers(params, write_dir,
                                                      step)
  progress = console.TrainProgress(
      global_step=step,
      total_steps=params.trainer.train_steps,
      global_batch_size=params.task.train_data.global_batch_size,
      start_time=request.start_time)
  eval_progress = console.EvalProgress(global_step=trainer.global_step)
  runner = None

  def stop_action(summary_manager):
    return preemption.SaveAndStopIfPreempted(
        watcher=watcher, checkpoint_manager=lambda: runner.checkpoint_manager,
        global_step=trainer.global_step, summary_manager=summary_manager)

  coordinated = None
  train_actions = eval_actions = []
  if mode.trains and _is_multi_worker(strategy):
    coordinated = preemption.CoordinatedSaveAndStop(
        strategy=strategy, global_step=trainer.global_step,
        checkpoint_manager=lambda: runner.checkpoint_manager)
    train_actions = [progress, coordinated]
  elif mode.trains:
    train_actions = [progress, stop_action(train_summaries)]
    eval_actions = [stop_action(eval_summaries)]
  latest = tf.train.latest_checkpoint(model_dir)
  if latest and _is_multi_worker(strategy):
    # Restoring creates optimizer slots, each a collective broadcast, so all
    # workers restore here, in the same order. TFM points a non-chief's
    # checkpoint manager at an empty temp dir: without this it would start
    # from its initial weights, and its init_fn (pretrained weights) must
    # not overwrite what it restored.
    with strategy.scope():
      trainer.checkpoint.restore(latest).expect_partial()
    if not chief:
      trainer.initialize = lambda: None
  runner = ExperimentRunner(
      evaluates_only=not mode.trains,
      distribution_strategy=strategy, task=task, mode=request.mode,
      params=params, model_dir=model_dir, trainer=trainer,
      train_actions=train_actions,
      # An evaluator must never write checkpoints: only training modes save.
      eval_actions=[eval_progress] + eval_actions,
      controller_cls=_controller, summary_manager=train_summaries,
      eval_summary_manager=eval_summaries)
  if coordinated:
    coordinated.start()
  restored_step = int(trainer.global_step.numpy())
  resumes = (run_summary.record_training_start(write_dir, restored_step)
             if mode.trains else 0)

  def summary(status: str) -> RunSummary:
    return RunSummary(
        experiment=request.experiment,
        mode=request.mode,
        trainer=params.trainer.name,
        status=status,
        global_step=int(trainer.global_step.numpy()),
        train_steps=params.trainer.train_steps,
        resumed_from_step=restored_step,
        resumes=resumes,
        deterministic=deterministic,
        strategy=describe_strategy(plan.strategy),
        replicas=plan.strategy.num_replicas_in_sync,
        input_threads=input_threads,
        input_in_checkpoint=getattr(trainer, "checkpoints_input_iterator",
                                    False),
        train_metrics=progress.last_logs,
        eval_metrics=eval_progress.last_logs,
        examples_per_second=progress.examples_per_second,
        time_to_first_step_seconds=progress.time_to_first_step,
        wall_seconds=time.time() - request.start_time,
        chief=chief)

  ctx = modes.ModeContext(controller=runner.controller, params=params,
                          model_dir=model_dir,
                          should_stop=lambda: watcher.received is not None)
  try:
    with strategy.scope():
      mode.run(ctx)
    if watcher.received is not None and not mode.trains:
      # An evaluator has no checkpoint to save: it just stops early.
      raise preemption.Preempted(int(trainer.global_step.numpy()),
                                 watcher.signal_name)
  except preemption.Preempted as e:
    e.summary = summary("preempted")
    raise
  except (tf.errors.DataLossError, RunFailed) as e:
    cause = (f"Input data is corrupt ({str(e).splitlines()[0]})."
             if isinstance(e, tf.errors.DataLossError) else str(e))
    failure = RunFailed(
        f"{cause} The last checkpoint, "
        f"{tf.train.latest_checkpoint(model_dir)}, is intact.")
    failure.summary = summary("failed")
    raise failure from e
  if mode.trains:
    continuous_eval.mark_training_complete(write_dir,
                                           trainer.global_step.numpy())
  return summary("completed")


class ExperimentRunner(train_lib.OrbitExperimentRunner):
  """TFM's runner, whose checkpoint an evaluator restores as partial."""

  def __init__(self, *args, evaluates_only: bool, **kwargs):
    self._evaluates_only = evaluates_only
    super().__init__(*args, **kwargs)

  def _maybe_build_checkpoint_manager(self):
    """TFM's manager; an evaluator's expects a partial restore.

    An evaluator builds no optimizer slots and no training input iterator,
    so the checkpoint's values for them are left unread on purpose; without
    `expect_partial` TensorFlow logs about 20 warnings at exit, one per
    value. TFM documents this method as the place to change the manager.
    """
    manager = super()._maybe_build_checkpoint_manager()
    if manager is None or not self._evaluates_only:
      return manager
    return tf.train.CheckpointManager(
        PartialRestoreCheckpoint(root=manager.checkpoint),
        directory=manager.directory,
        max_to_keep=self.params.trainer.max_to_keep,
        init_fn=self.trainer.initialize)


class PartialRestoreCheckpoint(tf.train.Checkpoint):
  """A checkpoint whose restores expect to leave saved values unread."""

  def restore(self, save_path, options=None):
    return super().restore(save_path, options).expect_partial()


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
  resolver = getattr(strategy, "cluster_resolver", None)
  return bool(resolver and resolver.cluster_spec().jobs
              and strategy.extended._in_multi_worker_mode())  # pylint: disable=protected-access


def is_chief_process() -> bool:
  """Whether this process is the chief, from `TF_CONFIG` (before a strategy).

  The chief is the `chief` task, or worker 0 of a cluster without one.
  """
  config = json.loads(os.environ.get("TF_CONFIG") or "{}")
  task = config.get("task", {})
  if not config.get("cluster") or not task:
    return True
  if "chief" in config["cluster"]:
    return task.get("type") == "chief"
  return task.get("type") == "worker" and int(task.get("index", 0)) == 0


def _summary_managers(params, model_dir: str, global_step):
  """Train and eval summary writers where TFM writes them."""
  def manager(subdir):
    return summaries.ScalarSummaryManager(os.path.join(model_dir, subdir),
                                          tf.summary.scalar,
                                          global_step=global_step)
  return (manager("train"),
          manager(params.trainer.validation_summary_subdir))
