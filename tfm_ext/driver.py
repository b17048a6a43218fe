"""Runs one mode of an experiment through TFM's `OrbitExperimentRunner`.

`prepare` resolves and checks a request without writing anything; `run`
builds the task and the registered trainer, hands them to TFM's runner
(which builds the checkpoint manager, TFM's actions and the Orbit
controller), runs the mode from `tfm_ext.modes`, and returns a `RunSummary`.
"""

import dataclasses
import time

import orbit
import tensorflow as tf

from official.common import distribute_utils
from official.core import config_definitions
from official.core import task_factory
from official.core import train_lib
from official.core import train_utils
from official.modeling import performance

from tfm_ext import console
from tfm_ext import modes
from tfm_ext import preflight
from tfm_ext import trainers
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


def build_strategy(params: config_definitions.ExperimentConfig):
  """Returns the `tf.distribute.Strategy` that `params.runtime` asks for.

  TFM's semantics, with one addition: `mirrored` with `num_gpus=0` mirrors
  over every logical CPU device (one unless the process split its CPU with
  `tf.config.set_logical_device_configuration`), where TFM uses CPU:0 only.
  """
  runtime = params.runtime
  cpus = tf.config.list_logical_devices("CPU")
  if (runtime.distribution_strategy == "mirrored" and runtime.num_gpus == 0
      and len(cpus) > 1):
    return tf.distribute.MirroredStrategy([d.name for d in cpus])
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=runtime.distribution_strategy,
      all_reduce_alg=runtime.all_reduce_alg,
      num_gpus=runtime.num_gpus,
      tpu_address=runtime.tpu)


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
  return orbit.Controller(**kwargs)


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
  strategy = build_strategy(params)
  preflight.check(params, trains=mode.trains, evaluates=mode.evaluates,
                  needs_checkpoint=mode.needs_checkpoint,
                  model_dir=request.model_dir,
                  strategy=strategy)
  return Plan(request=request, mode=mode, trainer_cls=trainer_cls,
              strategy=strategy)


def run(plan: Plan) -> RunSummary:
  """Builds the task and trainer, runs the mode; returns what happened."""
  request, mode, strategy = plan.request, plan.mode, plan.strategy
  params, model_dir = request.params, request.model_dir

  if mode.trains:
    # Only training writes params.yaml: an evaluator beside the trainer on
    # the same model_dir must not race it for the file.
    train_utils.serialize_config(params, model_dir)
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  console.quiet_orbit_controller()

  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=model_dir)
    exporter = None
    if mode.evaluates:
      exporter = train_lib.maybe_create_best_ckpt_exporter(params, model_dir)
    trainer = train_utils.create_trainer(
        params, task, train=mode.trains, evaluate=mode.evaluates,
        checkpoint_exporter=exporter, trainer_cls=plan.trainer_cls)

  progress = console.TrainProgress(
      global_step=trainer.global_step,
      total_steps=params.trainer.train_steps,
      global_batch_size=params.task.train_data.global_batch_size,
      start_time=request.start_time)
  eval_progress = console.EvalProgress(global_step=trainer.global_step)
  runner = train_lib.OrbitExperimentRunner(
      distribution_strategy=strategy, task=task, mode=request.mode,
      params=params, model_dir=model_dir, trainer=trainer,
      train_actions=[progress] if mode.trains else [],
      eval_actions=[eval_progress], controller_cls=_controller)

  with strategy.scope():
    mode.run(runner.controller, params)

  return RunSummary(
      experiment=request.experiment,
      mode=request.mode,
      trainer=params.trainer.name,
      global_step=int(trainer.global_step.numpy()),
      train_steps=params.trainer.train_steps,
      train_metrics=progress.last_logs,
      eval_metrics=eval_progress.last_logs,
      examples_per_second=progress.examples_per_second,
      time_to_first_step_seconds=progress.time_to_first_step,
      wall_seconds=time.time() - request.start_time)
