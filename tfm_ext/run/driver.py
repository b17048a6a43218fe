"""Runs one mode of an experiment: a short recipe over assembled parts.

    prepare(request) -> Plan       resolve and check; writes nothing
    run(plan):
      parts = assemble(plan)       the trainer lease (tfm_ext.model_dir.lease), task,
                                   trainer, checkpoint manager, summaries,
                                   actions, Orbit controller
      record the start             params.yaml, training_starts/ (training)
      mode.run(controller)         tfm_ext.run.modes: Orbit runs it
      record the end               training_complete.json (training),
                                   metrics.csv and curves.png (the chief)
      -> RunSummary                status "completed", "preempted" or "failed"
      release the lease            however the run ended

`run_with_recovery` rebuilds everything and resumes after transient errors.
"""

import dataclasses
import shutil
import time
from typing import Optional

from absl import logging
import tensorflow as tf
import tf_keras

from official.core import config_definitions

from tfm_ext.actions import best_checkpoint
from tfm_ext.actions import console
from tfm_ext.actions import curves
from tfm_ext.actions import notify
from tfm_ext.config import config_checks
from tfm_ext.config import config_drift
from tfm_ext.config import input_files
from tfm_ext.config import model_dir_check
from tfm_ext.config import params_file
from tfm_ext.config import preflight
from tfm_ext.errors import UsageError
from tfm_ext.model_dir import export
from tfm_ext.model_dir import run_summary
from tfm_ext.model_dir.run_summary import RunSummary
from tfm_ext.run import assembly
from tfm_ext.run import continuous_eval
from tfm_ext.run import failures
from tfm_ext.run import modes
from tfm_ext.run import preemption
from tfm_ext.run import strategies
from tfm_ext.training import trainers


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
  # TFM's --enable_async_checkpointing: save in a background thread.
  enable_async_checkpointing: bool = False
  # --notify_url: where progress is POSTed (`tfm_ext.actions.notify`); beats
  # runtime.notify_url.
  notify_url: str = ""
  # --checkpoint_path: the checkpoint `export` takes (`tfm_ext.model_dir.export`).
  checkpoint_path: str = ""


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
  failures.set_run(model_dir=request.model_dir, params=params)
  with failures.phase("model_dir", request.model_dir):
    model_dir_check.check(request.model_dir)
  trainer_cls = trainers.get_trainer(params.trainer.name)
  config_checks.check(params, trains=mode.trains, evaluates=mode.evaluates)
  preflight.check_runtime(params.runtime)
  notify.check(notify.url_of(request))
  strategy = strategies.build_strategy(params)
  preflight.check(params, trains=mode.trains, evaluates=mode.evaluates,
                  needs_checkpoint=mode.needs_checkpoint,
                  model_dir=request.model_dir,
                  strategy=strategy)
  config_checks.check_best_checkpoint_metric(params, trainer_cls,
                                             evaluates=mode.evaluates)
  # Record framing of the local input files: a file cut short is exit 3
  # naming it, before anything is written.
  input_files.check(params, trains=mode.trains, evaluates=mode.evaluates)
  if mode.trains:
    config_drift.check(params, request.model_dir, request.allow_config_change)
  if request.checkpoint_path:
    if mode is not modes.MODES["export"]:
      raise UsageError(f"--checkpoint_path is for --mode=export, not "
                       f"--mode={request.mode}.")
    export.checkpoint_to_export(
        request.model_dir, params.trainer.best_checkpoint_export_subdir,
        request.checkpoint_path)
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
                      sleep=time.sleep,
                      notifier: Optional[notify.Notifier] = None
                      ) -> RunSummary:
  """Runs `plan`, rebuilding and resuming after transient errors.

  Restarts at most `recovery.max_restarts` times, waiting
  `backoff_seconds * 2**n` before the n-th, each logged with its cause.
  """
  restarts = 0
  while True:
    if restarts:
      plan = prepare(plan.request)
    try:
      summary = run(plan, watcher=watcher, notifier=notifier)
    except TRANSIENT_ERRORS as e:
      # TensorFlow cannot set up collectives twice in one process: a
      # multi-worker job exits and its cluster manager restarts it.
      if (restarts >= recovery.max_restarts
          or strategies.is_multi_worker(plan.strategy)):
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
        watcher: Optional[preemption.SignalWatcher] = None,
        notifier: Optional[notify.Notifier] = None) -> RunSummary:
  """Builds the parts and runs the mode; returns what happened.

  A run stopped by a signal (its checkpoint saved) returns status
  "preempted", one that failed on its data (a corrupt record, a loss that
  diverged; the last checkpoint intact) "failed"; `message` says why.
  """
  watcher = watcher or preemption.SignalWatcher(signals=())
  return run_parts(plan, assembly.assemble(
      plan, watcher, assembly.Supplied(notifier=notifier)), watcher)


def run_parts(plan: Plan, parts: assembly.Parts,
              watcher: preemption.SignalWatcher) -> RunSummary:
  """Runs the mode of `plan` on assembled `parts`; see `run`.

  However the run ends, it releases the trainer lease `assemble` took, and
  a worker other than the chief deletes the temp dir it wrote to.
  """
  # What a mode writes outside Orbit's calls (records, the ledger) is
  # that mode's phase: a full disk there is the run's storage failing.
  phase = ("step" if plan.mode.trains else
           "evaluate" if plan.mode.evaluates else "export")
  try:
    with failures.phase(phase, plan.request.model_dir):
      return _run_mode(plan, parts, watcher)
  finally:
    if parts.trainer_lease:
      parts.trainer_lease.release()
    if not parts.chief:
      # Its checkpoints and records (`assembly`: a temp dir of its own, a
      # whole checkpoint each save) are read by no one once it ends.
      shutil.rmtree(parts.write_dir, ignore_errors=True)


def _run_mode(plan: Plan, parts: assembly.Parts,
              watcher: preemption.SignalWatcher) -> RunSummary:
  request, mode = plan.request, plan.mode
  if watcher.received is not None:  # While the parts were built.
    raise preemption.StartUpInterrupted(watcher.signal_name)
  resumes = 0
  if mode.trains and parts.chief:
    # Only training writes params.yaml: an evaluator beside the trainer on
    # the same model_dir must not race it for the file.
    params_file.write(request.params, request.model_dir)
    continuous_eval.clear_training_complete(request.model_dir)
  if mode.trains:
    resumes = run_summary.record_training_start(parts.write_dir,
                                                parts.restored_step)
  ctx = modes.ModeContext(controller=parts.controller, params=request.params,
                          model_dir=request.model_dir,
                          should_stop=lambda: watcher.received is not None,
                          checkpoint_path=request.checkpoint_path)
  previous = _previous_summary(plan, parts) if parts.trained else None
  try:
    with plan.strategy.scope():
      if not parts.trained:
        logs = mode.run(ctx)
        if not (mode.trains or mode.evaluates) and logs:  # An export's.
          parts.eval_progress.last_logs = console.scalars(logs)
      elif mode.evaluates and not _evaluated_last_step(previous, parts):
        # Stopped in (or before) the final evaluation: that one is left.
        parts.controller.evaluate(steps=request.params.trainer.validation_steps)
    if watcher.received is not None and mode.stops_on_signal:
      # An evaluator has no checkpoint to save: it just stops early.
      raise preemption.Preempted(int(parts.trainer.global_step.numpy()),
                                 watcher.signal_name, saved=False)
  except preemption.Preempted as e:
    return summarize(plan, parts, resumes, "preempted", str(e))
  except (UsageError,) + TRANSIENT_ERRORS:
    raise  # Refused (exit 2), or restarted by `run_with_recovery`.
  except Exception as e:  # pylint: disable=broad-except
    failure = failures.classify(e)
    if failure is None:
      raise  # A bug: its traceback.
    logging.info("The run failed.", exc_info=True)  # The log file only.
    return summarize(plan, parts, resumes, "failed", failure.message,
                     exit_code=failure.code)
  finally:
    # However the mode ended, the files then hold its last step.
    if parts.chief and (mode.trains or mode.evaluates):
      curves.refresh(request.model_dir, request.params.trainer)
  if mode.trains:
    continuous_eval.mark_training_complete(
        parts.write_dir, parts.trainer.global_step.numpy())
  summary = summarize(plan, parts, resumes, "completed")
  if parts.trained:
    _carry_over(summary, previous, request.params.trainer.train_steps)
  return summary


def _previous_summary(plan: Plan,
                      parts: assembly.Parts) -> Optional[RunSummary]:
  """The run summary a finished run left, or None where it left none."""
  if not parts.chief:
    return None
  try:
    return RunSummary.read(plan.request.model_dir)
  except (tf.errors.OpError, ValueError, KeyError, TypeError) as e:
    logging.warning("No earlier run summary to keep (%s).",
                    str(e).splitlines()[0] if str(e) else type(e).__name__)
    return None


def _evaluated_last_step(previous: Optional[RunSummary],
                         parts: assembly.Parts) -> bool:
  return (previous is not None and previous.status == "completed"
          and previous.global_step == parts.restored_step
          and bool(previous.eval_metrics))


def _carry_over(summary: RunSummary, previous: Optional[RunSummary],
                train_steps: int) -> None:
  """A start with nothing to train keeps the results of the run that did."""
  summary.message = (
      f"already complete at step {summary.global_step} (train_steps="
      f"{train_steps}): nothing to train; the metrics are those of the run "
      "that trained" + (", and of this start's evaluation"
                        if summary.eval_metrics else ""))
  print(summary.message, flush=True)
  if previous is None:
    return
  summary.train_metrics = summary.train_metrics or previous.train_metrics
  summary.eval_metrics = summary.eval_metrics or previous.eval_metrics
  for field in ("examples_per_second", "time_to_first_step_seconds"):
    if getattr(summary, field) is None:
      setattr(summary, field, getattr(previous, field))


def summarize(plan: Plan, parts: assembly.Parts, resumes: int, status: str,
              message: str = "", exit_code: int = 0) -> RunSummary:
  """The `RunSummary` of `plan` run on `parts`, ending with `status`."""
  request, trainer = plan.request, parts.trainer
  return RunSummary(
      experiment=request.experiment,
      mode=request.mode,
      trainer=request.params.trainer.name,
      status=status,
      message=message,
      exit_code=exit_code,
      global_step=int(trainer.global_step.numpy()),
      train_steps=request.params.trainer.train_steps,
      resumed_from_step=parts.restored_step,
      resumes=resumes,
      deterministic=parts.deterministic,
      strategy=strategies.describe_strategy(plan.strategy),
      replicas=plan.strategy.num_replicas_in_sync,
      input_threads=getattr(trainer, "input_threads", 0),
      input_in_checkpoint=getattr(trainer, "checkpoints_input_iterator",
                                  False),
      train_metrics=parts.progress.last_logs,
      eval_metrics=parts.eval_progress.last_logs,
      examples_per_second=parts.progress.examples_per_second,
      time_to_first_step_seconds=parts.progress.time_to_first_step,
      wall_seconds=time.time() - request.start_time,
      chief=parts.chief,
      action_failures=dict(parts.action_failures),
      best=(best_checkpoint.best_of(request.model_dir, request.params.trainer)
            if parts.chief else {}))
