"""Builds every part of a run, in order, before any of them runs.

    task -> trainer -> the start's restore -> checkpoint manager
         -> summary managers -> actions -> Orbit controller

Each part is built from the ones before it, so nothing is bound late: the
actions get the checkpoint manager itself, and the controller gets them all.
`assemble` writes nothing into `model_dir` but a repaired checkpoint state
file (`tfm_ext.model_dir.checkpoint_state`); `tfm_ext.run.driver.drive`
does, once the parts exist, while the trainer lease that
`tfm_ext.run.driver.assembled` took before them is held.
"""

import dataclasses
import inspect
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence

from absl import logging
import orbit
import tensorflow as tf

from official.core import base_task
from official.core import base_trainer
from official.core import task_factory
from official.core import train_utils
from official.modeling import performance

from tfm_ext import actions
from tfm_ext.model_dir import best_checkpoints
from tfm_ext.base import console
from tfm_ext.actions import curves
from tfm_ext.actions import notify
from tfm_ext.actions import plateau
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import checkpointing
from tfm_ext.model_dir import lease
from tfm_ext.base import failures
from tfm_ext.run import preemption
from tfm_ext.run import strategies
from tfm_ext.training import determinism
from tfm_ext.training import eval_count
from tfm_ext.training import labels
from tfm_ext.training import run_state
from tfm_ext.training import summaries
from tfm_ext.actions import guard as guard_lib
from tfm_ext.actions import divergence
from tfm_ext.actions import from_tfm


@dataclasses.dataclass
class Parts:
  """A run's assembled parts; `controller` runs the mode."""
  task: base_task.Task
  trainer: base_trainer.Trainer
  checkpoint_manager: Optional[tf.train.CheckpointManager]
  controller: orbit.Controller
  progress: console.TrainProgress
  eval_progress: console.EvalProgress
  # Where this process writes: model_dir for the chief, else a temp dir.
  write_dir: str
  chief: bool
  deterministic: bool
  # The global step once the controller restored (0 for a fresh run).
  restored_step: int
  # A training mode whose checkpoint is at or past `train_steps`, or that
  # early stopping stopped: nothing is left to train (a relaunched finished
  # run).
  trained: bool = False
  # A `trained` run whose checkpoint was saved before the evaluation at its
  # step: that evaluation is left (`tfm_ext.training.run_state`).
  catch_up: bool = False
  # `<phase>/<action>` -> how often it raised (`tfm_ext.actions.guard.Guard`).
  action_failures: Dict[str, int] = dataclasses.field(default_factory=dict)
  # What a continuous_eval counted of the checkpoints (`modes.ModeContext`).
  evaluations: Dict[str, Any] = dataclasses.field(default_factory=dict)
  # Early stopping and the plateau's actions (`actions.plateau`), if on.
  watching: List[Any] = dataclasses.field(default_factory=list)


class FirstStepThenEvery:
  """`steps_per_loop` for Orbit: one step first, then back on the grid.

  The first loop of a fresh run (step 0) runs a single step, so the
  console shows progress (and the summary records time to first step) as
  soon as the step function is traced; each later loop ends on a multiple
  of `steps_per_loop`, so checkpoint and summary cadence stay those of the
  config. A resumed run's loops are on the grid from the first: its loops,
  and so the training rows of `metrics.csv` (a loop's metrics are its
  mean), are those of an uninterrupted run.
  """

  def __init__(self, steps_per_loop: int):
    self._steps_per_loop = steps_per_loop
    self._first = True

  def __call__(self, global_step: int) -> int:
    first, self._first = self._first, False
    if first and global_step == 0:
      return 1
    return self._steps_per_loop - global_step % self._steps_per_loop


@dataclasses.dataclass(frozen=True)
class Supplied:
  """Parts the caller built itself, as TFM's `run_experiment` takes them.

  `task` and `trainer`, when given, are used instead of being built (the
  trainer must have been built with the task, under the strategy's scope);
  the actions run after the driver's own; `controller_cls` replaces
  `orbit.Controller`; the summary managers replace ours, and without
  `save_summary` no summaries are written. `post_eval` builds the evaluator
  for an evaluation after a training-only mode. A `notifier`
  (`tfm_ext.actions.notify`) is told of each loop and evaluation.
  """
  task: Optional[base_task.Task] = None
  trainer: Optional[base_trainer.Trainer] = None
  train_actions: Sequence[actions.Action] = ()
  eval_actions: Sequence[actions.Action] = ()
  controller_cls: type = orbit.Controller
  summary_manager: Any = None
  eval_summary_manager: Any = None
  save_summary: bool = True
  post_eval: bool = False
  notifier: Optional[notify.Notifier] = None


def assemble(plan, watcher: preemption.SignalWatcher,
             supplied: Supplied = Supplied(),
             held: Optional[lease.Lease] = None) -> Parts:
  """Builds the parts of `plan` (a `tfm_ext.run.driver.Plan`) not `supplied`.

  `held`: the trainer lease a training run's chief holds while the parts
  are built and the mode runs (`tfm_ext.run.driver.assembled`); its saves
  and records are fenced by it.
  """
  with failures.phase("build", plan.request.model_dir):
    return _build(plan, watcher, supplied, held)


def _build(plan, watcher: preemption.SignalWatcher, supplied: Supplied,
           held: Optional[lease.Lease]) -> Parts:
  request, mode, strategy = plan.request, plan.mode, plan.strategy
  params, model_dir = request.params, request.model_dir
  deterministic = determinism.apply(params.runtime)
  chief = strategy.extended.should_checkpoint
  # Every worker takes part in saving (variables may sync on read), but only
  # the chief writes where a user looks; the others write to a temp dir.
  write_dir = model_dir if chief else tempfile.mkdtemp(prefix="tfm_ext_worker")
  if params.runtime.mixed_precision_dtype:
    performance.set_mixed_precision_policy(params.runtime.mixed_precision_dtype)
  task, trainer, stop, watching = _task_and_trainer(plan, watcher, supplied,
                                                    write_dir)
  latest, checkpoint = _restore_at_start(trainer, plan, chief)
  state = _restored_state(trainer, watching, model_dir)
  manager = _manager(plan, trainer, write_dir, chief, held,
                     restored=(latest, checkpoint))
  step = strategies.host_readable(trainer.global_step, strategy)
  failures.set_run(global_step=lambda: int(step.numpy()))
  summary_dirs = [os.path.join(write_dir, subdir) for subdir in (
      "train", params.trainer.validation_summary_subdir)]
  train_summaries, eval_summaries = _summary_managers(summary_dirs, step,
                                                      supplied)
  if (state is not None and chief and eval_summaries is not None
      and state.pending(int(step.numpy()))
      and curves.logged_at(summary_dirs[1], int(step.numpy()))):
    eval_summaries = _NotAgainAt(eval_summaries, step)
  progress = console.TrainProgress(
      global_step=step, total_steps=params.trainer.train_steps,
      global_batch_size=params.task.train_data.global_batch_size,
      start_time=request.start_time)
  eval_progress = console.EvalProgress(global_step=step)
  guard, train_actions, eval_actions = _actions(
      plan, trainer, manager, step, (progress, eval_progress),
      (train_summaries, eval_summaries), watcher, supplied, stop, watching,
      held)
  console.quiet_orbit_controller()
  # Its restore is the start's, done (`started_from`): or init_fn.
  with failures.phase("restore", latest or model_dir):
    controller = supplied.controller_cls(
        strategy=strategy, trainer=trainer if mode.trains else None,
        evaluator=trainer, global_step=step,
        steps_per_loop=FirstStepThenEvery(params.trainer.steps_per_loop),
        checkpoint_manager=manager,
        enable_async_checkpointing=request.enable_async_checkpointing,
        summary_dir=summary_dirs[0] if supplied.save_summary else None,
        eval_summary_dir=summary_dirs[1] if supplied.save_summary else None,
        summary_interval=params.trainer.summary_interval,
        summary_manager=train_summaries, eval_summary_manager=eval_summaries,
        train_actions=train_actions, eval_actions=eval_actions)
  restored_step = int(step.numpy())
  checkpointing.count_interval_from(manager, restored_step)
  trained, catch_up = _left_to_do(plan, restored_step, watching, state)
  return Parts(task=task, trainer=trainer, checkpoint_manager=manager,
               controller=controller, progress=progress,
               eval_progress=eval_progress, write_dir=write_dir, chief=chief,
               deterministic=deterministic, restored_step=restored_step,
               trained=trained, catch_up=catch_up,
               action_failures=guard.failures, watching=watching)


def _left_to_do(plan, restored_step: int, watching, state):
  """`(trained, catch_up)` of `Parts` for the checkpoint restored: all of
  it decided by the checkpoint's state, none by a record."""
  stopped = bool(watching and plateau.stopped_early(watching)
                 and not state.train_steps_raised)
  trained = bool(plan.mode.trains and restored_step and (
      restored_step >= plan.request.params.trainer.train_steps or stopped))
  return trained, bool(trained and not stopped and state
                       and state.pending(restored_step))


def _restored_state(trainer, watching, model_dir: str):
  """The run state the start restored (`run_state`), None for a mode that
  does not train and evaluate; `plateau.json` checked against it."""
  state = run_state.of(trainer)
  if state is None:
    return None
  state.restored()
  plateau.check_record(watching, model_dir, int(state.evaluated_step.numpy()))
  if state.train_steps_raised:
    plateau.train_on_from(watching, int(trainer.global_step.numpy()))
  return state


def _manager(plan, trainer, write_dir: str, chief: bool,
             held: Optional[lease.Lease], restored):
  """The run's checkpoint manager; `restored`: what the start restored
  (`_restore_at_start`'s checkpoint path and managed checkpoint)."""
  mode, request = plan.mode, plan.request
  latest, checkpoint = restored
  return checkpointing.build_manager(
      trainer, write_dir, request.params.trainer,
      evaluates_only=not mode.trains,
      checkpoint=checkpoint,  # The one the start restored.
      # An export restores what it exports itself, and no init_checkpoint.
      init_fn=trainer.initialize if mode.restores_latest else None,
      max_to_keep=request.params.trainer.max_to_keep if chief else 1,
      enable_async=request.enable_async_checkpointing,
      before_save=held.assert_held if held else None,
      # A training job that does not evaluate is what a continuous_eval
      # joins: it records what no evaluator saw.
      records_unwatched=chief and mode.trains and not mode.evaluates,
      # The controller's restore takes the start's: nothing is read again
      # (a non-chief's manager is in an empty temp dir besides).
      started_from=latest)


class _NotAgainAt:
  """An eval summary manager that writes nothing at the step it was built
  at, whose scalars the event files hold already (`curves.logged_at`): the
  evaluation a resumed run runs again there (`run_state`) is not drawn
  twice. Any later step is written as by the manager it wraps."""

  def __init__(self, manager, global_step):
    self._manager = manager
    self._global_step = global_step
    self._logged = int(global_step.numpy())

  def __getattr__(self, name):
    return getattr(self._manager, name)

  def write_summaries(self, summary_dict) -> None:
    if int(self._global_step.numpy()) != self._logged:
      self._manager.write_summaries(summary_dict)


def _summary_managers(summary_dirs: List[str], step, supplied: Supplied):
  """The train and eval summary managers: those supplied, else ours (none
  without `save_summary`)."""
  return tuple(
      given or (summaries.ScalarSummaryManager(d, tf.summary.scalar,
                                               global_step=step)
                if supplied.save_summary else None)
      for d, given in zip(summary_dirs, (supplied.summary_manager,
                                         supplied.eval_summary_manager)))


def _task_and_trainer(plan, watcher: preemption.SignalWatcher,
                      supplied: Supplied, write_dir: str):
  """The task and the trainer, wrapped for the run; `(task, trainer, stop,
  watching)`: the plateau's stop request and what it watches."""
  mode, strategy, params = plan.mode, plan.strategy, plan.request.params
  evaluates = mode.evaluates or supplied.post_eval
  with strategy.scope(), failures.phase("build"):
    task = supplied.task or build_task(params, logging_dir=write_dir)
    labels.check_inputs(task)  # For every trainer, TFM's own too.
    trainer = supplied.trainer or train_utils.create_trainer(
        params, task, train=mode.trains, evaluate=evaluates,
        checkpoint_exporter=(best_checkpoints.maybe_create(params, write_dir)
                             if evaluates else None),
        trainer_cls=plan.trainer_cls)
  if evaluates:  # An evaluation that read nothing fails, never ranks 0.
    eval_count.watch(trainer)
  # Before the first step is traced (the plateau's factor joins the
  # learning rate) and the checkpoint restored (their counts are in it).
  stop = plateau.Stop()
  watching = []
  if mode.trains and mode.evaluates:
    with strategy.scope():
      watching = plateau.build(params.trainer, trainer, stop)
      state = run_state.RunState(train_steps=params.trainer.train_steps,
                                 global_step=trainer.global_step)
    run_state.attach(trainer, state)
    plateau.join_checkpoint(trainer, {**plateau.state(watching),
                                      "run_state": state})
  # What Orbit runs of the trainer is the run's step or evaluate phase.
  for method, name in (("train", "step"), ("evaluate", "evaluate")):
    if hasattr(trainer, method):
      setattr(trainer, method, failures.phased(name, getattr(trainer, method)))
  if mode.trains:  # A line every 30 s inside a long loop.
    trainer.train = console.LoopTicker(
        global_step=strategies.host_readable(trainer.global_step, strategy),
        total_steps=params.trainer.train_steps,
        global_batch_size=params.task.train_data.global_batch_size,
    ).around(trainer.train)
  if mode.trains:  # A signal stops the loop after the step in flight.
    preemption.stop_within_a_step(trainer, watcher, _agreeing(strategy))
  logging.info("tf.data: %d private thread(s) for this run's input (0: "
               "tf.data's own pool)", getattr(trainer, "input_threads", 0))
  return task, trainer, stop, watching


def _actions(plan, trainer, manager, step, progresses, summary_managers,
             watcher: preemption.SignalWatcher, supplied: Supplied,
             stop: plateau.Stop, watching, held):
  """The run's guard, and its train and eval actions, each guarded."""
  request, mode, strategy = plan.request, plan.mode, plan.strategy
  context = actions.ActionContext(
      params=request.params, mode=request.mode, model_dir=request.model_dir,
      trainer=trainer, checkpoint_manager=manager, strategy=strategy,
      chief=strategy.extended.should_checkpoint,
      **({"stop": stop.request} if mode.trains else {}))
  progress, eval_progress = progresses
  # A required action that fails saves first where this process may save:
  # a training run on one worker (elsewhere a save is a collective).
  guard = guard_lib.Guard(
      global_step=lambda: int(step.numpy()),
      save=(lambda: guard_lib.save_now(manager, trainer.global_step))
      if mode.trains and not strategies.is_multi_worker(strategy) else None)
  notified = {phase: [] for phase in actions.PHASES}
  if supplied.notifier:
    notes = notify.Progress(supplied.notifier, progress=progress,
                            global_step=lambda: int(step.numpy()))
    notified = {phase: [guard(getattr(notes, phase), phase=phase,
                              name="notify")] for phase in actions.PHASES}
  train_actions = (_train_actions(context, progress, summary_managers[0],
                                  watcher, guard,
                                  supplied=supplied.train_actions,
                                  notified=notified["train"], requested=stop,
                                  per_run=request.actions)
                   if mode.trains else [])
  eval_actions = _eval_actions(context, eval_progress, summary_managers[1],
                               watcher, guard, trains=mode.trains,
                               supplied=supplied.eval_actions,
                               notified=notified["eval"], requested=stop,
                               watching=watching, per_run=request.actions)
  if held:  # A run that lost the lease stops before it writes more.
    train_actions, eval_actions = ([held.after_loop] + train_actions,
                                   [held.after_loop] + eval_actions)
  return guard, train_actions, eval_actions


def _marks(trainer) -> List[actions.Action]:
  """The run state's eval action (`run_state.RunState.mark`), if any."""
  state = run_state.of(trainer)
  return [state.mark] if state is not None else []


def build_task(params, logging_dir: Optional[str] = None) -> base_task.Task:
  """The experiment's task, as TFM's `task_factory.get_task` builds it.

  A task whose builder also takes `trainer_config` (TFM's ranking task
  builds its optimizers from it: `tfm_ext.training.ranking`) is given
  `params.trainer`.
  """
  builder = (params.task.BUILDER
             or task_factory.get_task_cls(type(params.task)))
  extra = ({"trainer_config": params.trainer} if "trainer_config"
           in inspect.signature(builder).parameters else {})
  return task_factory.get_task(params.task, logging_dir=logging_dir, **extra)


def _step_of(checkpoint: str) -> int:
  try:
    return checkpoint_state.step_of(checkpoint)
  except ValueError:  # Not named `<prefix>-<step>`: read it to know.
    return -1


def _restore_at_start(trainer, plan, chief: bool):
  """Restores the checkpoint the run resumes or evaluates, checking it.

  The newest readable one of the state file (`checkpoint_state.repair`:
  a missing or damaged state file is rebuilt, an unreadable latest
  skipped, or the run refused), restored on every worker as it is read
  (`checkpointing.StartRestore`). An export only repairs the state file:
  it restores what it exports (`tfm_ext.model_dir.export`). Returns the
  checkpoint restored (None for none) and what the run's manager manages.
  """
  mode, model_dir = plan.mode, plan.request.model_dir
  checkpoint = checkpointing.managed_checkpoint(
      trainer, evaluates_only=not mode.trains)
  start = (checkpointing.StartRestore(checkpoint, plan.strategy,
                                      trains=mode.trains)
           if checkpoint is not None and mode.restores_latest else None)
  with failures.phase("restore", model_dir):
    latest = checkpoint_state.repair(model_dir, write=chief, restore=start,
                                     read_tensors=mode.restores_latest,
                                     trains=mode.trains)
  if not mode.restores_latest:
    return None, checkpoint
  train_steps = plan.request.params.trainer.train_steps
  if (start and start.status is not None and mode.trains and latest
      and _step_of(latest) >= train_steps):
    # A finished run relaunched trains nothing: what TF deferred (the
    # optimizer's step, objects built at the first loop) stays unread, on
    # purpose, without a warning of each value at exit.
    start.status.expect_partial()
  return latest, checkpoint


def _train_actions(context: actions.ActionContext, progress, summary_manager,
                   watcher, guard: guard_lib.Guard, supplied=(),
                   notified=(), requested=None,
                   per_run=()) -> List[actions.Action]:
  """Recovery, TFM's, registered, progress, results, notify, save-and-stop.

  Registered actions come before the progress line, so what they add to a
  loop's output is printed and, as Orbit writes summaries after the
  actions, summarized. The save-and-stop action comes after every action
  that may fail the loop or roll it back, so a preempted run never saves a
  loop that diverged. All but recovery and save-and-stop are guarded
  (`tfm_ext.actions.guard.Guard`): one that raises is reported and the
  run goes on.
  """
  trainer, strategy = context.trainer, context.strategy
  config = context.params.trainer
  recovery = [] if config.recovery_max_trials < 0 else [
      divergence.DivergenceRecovery.from_config(
          config, loss_name=trainer.train_loss.name,
          global_step=trainer.global_step,
          start_step=int(trainer.global_step.numpy()),
          input_in_checkpoint=getattr(trainer, "checkpoints_input_iterator",
                                      False),
          checkpoint_manager=context.checkpoint_manager)]
  params = context.params
  if strategies.is_multi_worker(strategy):
    # TFM builds TF's preemption handler on a multi-worker strategy
    # (`preemption_on_demand_checkpoint`): it would take SIGTERM from the
    # watcher and act at the loop's end only.
    params = params.replace(trainer={"preemption_on_demand_checkpoint": False})
  tfm = from_tfm.train_actions(params, trainer, context.model_dir,
                                  context.checkpoint_manager)
  stop = preemption.SaveAndStopIfPreempted(
      watcher=watcher, checkpoint_manager=context.checkpoint_manager,
      global_step=trainer.global_step, summary_manager=summary_manager,
      stop=requested, strategy=_agreeing(strategy))
  return (recovery + guard.all("train", (
      tfm + actions.registered("train", context, guard, per_run)
      + list(supplied)
      + [progress] + curves.refresh_actions(context, "train")
      + list(notified))) + [stop])


def _agreeing(strategy):
  """`strategy` if its workers must agree to stop, else None.

  A parameter server's coordinator is the one process that decides.
  """
  if isinstance(strategy,
                tf.distribute.experimental.ParameterServerStrategy):
    return None
  return strategy if strategies.is_multi_worker(strategy) else None


def _eval_actions(context: actions.ActionContext, progress, summary_manager,
                  watcher, guard: guard_lib.Guard, trains: bool, supplied=(),
                  notified=(), requested=None, watching=(),
                  per_run=()) -> List[actions.Action]:
  """TFM's, registered, progress, the plateau's, results, notify, save-and-stop.

  As for training, registered actions come before the progress line, and
  all but save-and-stop are guarded. Early stopping and the plateau
  (`watching`) come after the progress line, so that their lines follow
  the evaluation's. An evaluator never writes checkpoints: only training
  modes save.
  """
  tfm = from_tfm.eval_actions(context.params, context.trainer,
                                 context.model_dir)
  saves = [preemption.SaveAndStopIfPreempted(
      watcher=watcher, checkpoint_manager=context.checkpoint_manager,
      global_step=context.trainer.global_step,
      summary_manager=summary_manager, stop=requested,
      strategy=_agreeing(context.strategy))] if trains else []
  return guard.all("eval", (
      tfm + actions.registered("eval", context, guard, per_run)
      + list(supplied)
      + [progress] + list(watching) + _marks(context.trainer)
      + ([plateau.Recorder(watching, context.model_dir,
                           context.trainer.global_step)]
         if watching and context.chief else [])
      + curves.refresh_actions(context, "eval")
      + list(notified))) + saves
