"""Runs a job: one module from a checked request to an exit code.

    prepare(request) -> Plan       resolve and check; writes nothing
    run(plan)                      the job: log file, signals, recovery,
                                   the run summary, the end notification,
                                   exit codes
      execute(plan)                one attempt (again after a transient
                                   error, `Recovery`):
        with assembled(plan)       the trainer lease held (tfm_ext.model_dir.
                                   lease) while the task, trainer, checkpoint
                                   manager, summaries, actions and Orbit
                                   controller are built and the mode runs
          drive(plan, parts)       records the start (params.yaml,
                                   training_starts/), runs the mode
                                   (tfm_ext.run.modes: Orbit runs it),
                                   records the end (training_complete.json,
                                   metrics.csv, curves.png)
          -> RunSummary            "completed", "preempted" or "failed"

`run` exits the process unless the run completed: 42 preempted (checkpoint
saved, or nothing to save yet: a signal before the first step, or to an
evaluator), 3 failed on its data (the last checkpoint intact), 4 its
storage failed (a full disk, a lost permission), 2 bad input found only
once running (`tfm_ext.base.failures`). Each writes the run summary
(`run_summary.json`; `eval_summary.json` or `export_summary.json` for a
mode that does not train) and the operative gin config first, when the run
got that far, then sends the run's `end` notification
(`tfm_ext.actions.notify`, however the run ended, in bounded time), and
copies the log into a bucket `model_dir` last. `execute` and `drive` are
for code that runs a plan in its own process (TFM's `run_experiment`,
tests): they return the summary and exit nothing.
"""

import contextlib
import dataclasses
import logging as std_logging
import os
import shutil
import sys
import time
from typing import Iterator, Optional

from absl import logging
import tensorflow as tf
import tf_keras

from official.core import config_definitions
from official.core import train_utils

from tfm_ext.model_dir import best_checkpoints
from tfm_ext.actions import curves
from tfm_ext.actions import notify
from tfm_ext.actions import plateau
from tfm_ext.config import checks
from tfm_ext.config import config_drift
from tfm_ext.base import settings
from tfm_ext.training import input_files
from tfm_ext.config import params as params_lib
from tfm_ext.model_dir import params_file
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files
from tfm_ext.model_dir import eval_claims
from tfm_ext.model_dir import export
from tfm_ext.model_dir import lease
from tfm_ext.model_dir import run_summary
from tfm_ext.model_dir import tfm_serving
from tfm_ext.model_dir import usable
from tfm_ext.model_dir.run_summary import RunSummary
from tfm_ext.run import assembly
from tfm_ext.base import failures
from tfm_ext.run import modes
from tfm_ext.run import preemption
from tfm_ext.run import strategies
from tfm_ext.run import waits
from tfm_ext.training import autograph_cache
from tfm_ext.training import trainers
from tfm_ext.base.errors import EXIT_PREEMPTED
from tfm_ext.model_dir import log_files
from tfm_ext.base.logs import scalars


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
  # --input_type, --batch_size, --input_image_size: how `export` serves TFM's
  # vision tasks (`tfm_ext.model_dir.tfm_serving`).
  serving: tfm_serving.ServingOptions = tfm_serving.ServingOptions()


@dataclasses.dataclass(frozen=True)
class Plan:
  """A checked `RunRequest` with what `prepare` resolved for it."""
  request: RunRequest
  mode: modes.Mode
  trainer_cls: type
  strategy: tf.distribute.Strategy


def request_for(sources: params_lib.ConfigSources, *, mode: str,
                model_dir: str, gin_files=(), gin_params=(),
                **fields) -> RunRequest:
  """The `RunRequest` of `mode` for what `sources` describe, in `model_dir`.

  The operative config: gin parsed, then files, overrides and flags
  (`params.build`); an evaluator's is its trainer's (`params.yaml`, waited
  for beside a trainer that may not have started yet), and it is present
  for the trainer's retention from here on. `fields` are the request's
  others. The launcher's flags and `tfm_ext.launch` both come here.
  """
  mode_of = modes.get_mode(mode)
  model_dir = os.path.expanduser(model_dir)
  # What fails from here on may be a file of it (`failures.classify`).
  failures.set_run(model_dir=model_dir)
  # Before anything reads or writes it (an evaluator reads params.yaml).
  with failures.phase("model_dir", model_dir):
    usable.check_usable(model_dir)
  params_lib.parse_gin(gin_files, gin_params)
  params = params_lib.build(sources)
  if mode_of.waits_for_trainer:
    # An evaluator beside a trainer is present from its start: the trainer
    # keeps each checkpoint for it while it waits and builds.
    with failures.phase("model_dir", model_dir):
      eval_claims.announce(model_dir)
  if not mode_of.trains:
    params = params_lib.follow_trainer(sources, params, model_dir,
                                       wait=mode_of.waits_for_trainer)
  return RunRequest(experiment=sources.experiment, mode=mode,
                    model_dir=model_dir, params=params, **fields)


def prepare(request: RunRequest) -> Plan:
  """Resolves and checks `request`; raises `UsageError`, writes nothing."""
  settings.load()
  params = request.params
  mode = modes.get_mode(request.mode)
  failures.set_run(model_dir=request.model_dir, params=params)
  with failures.phase("model_dir", request.model_dir):
    usable.check_usable(request.model_dir)
  trainer_cls = trainers.get_trainer(params.trainer.name)
  checks.check_values(params, trains=mode.trains, evaluates=mode.evaluates)
  notify.check_url(notify.url_of(request))
  waited_for = strategies.waits_for(params)
  with (waits.announced(waited_for) if waited_for
        else contextlib.nullcontext()):
    strategy = strategies.build_strategy(params)
  checks.check_with_strategy(params, trains=mode.trains,
                             evaluates=mode.evaluates,
                             needs_checkpoint=mode.needs_checkpoint,
                             model_dir=request.model_dir, strategy=strategy)
  checks.check_best_checkpoint_metric(params, trainer_cls,
                                      evaluates=mode.evaluates,
                                      trains=mode.trains)
  # Record framing of the local input files: a file cut short is exit 3
  # naming it, before anything is written.
  input_files.check_framing(params, trains=mode.trains,
                            evaluates=mode.evaluates)
  if mode.trains:
    config_drift.check_unchanged(params, request.model_dir,
                                 request.allow_config_change)
  export_flags = ([f"--checkpoint_path={request.checkpoint_path}"]
                  if request.checkpoint_path else []) + request.serving.given
  if export_flags and mode is not modes.MODES["export"]:
    raise UsageError(f"{' '.join(export_flags)}: for --mode=export, not "
                     f"--mode={request.mode}.")
  if request.checkpoint_path:
    export.checkpoint_to_export(
        request.model_dir, params.trainer.best_checkpoint_export_subdir,
        request.checkpoint_path)
  # Before any trace (a relaunch converts nothing), after every refusal (a
  # refused job writes nothing, the cache's folder included).
  autograph_cache.install()
  return Plan(request=request, mode=mode, trainer_cls=trainer_cls,
              strategy=strategy)


@dataclasses.dataclass(frozen=True)
class Recovery:
  """In-process recovery from transient errors."""
  max_restarts: int = 3
  backoff_seconds: float = 2.0




def run(plan: Plan, recovery: Recovery = Recovery()) -> RunSummary:
  """Runs a `prepare`d plan as a job; returns its summary or exits.

  Inside the run's error boundary (`tfm_ext.base.failures.boundary`), so
  what it raises is classified, and logged, before the log is copied into
  a bucket.
  """
  request = plan.request
  chief = strategies.is_chief_process()
  with failures.boundary(), failures.phase("model_dir", request.model_dir):
    # What a refused job takes back: it leaves the model_dir as it was.
    traces = files.Traces(request.model_dir) if chief else None
    # Non-chief workers keep their logs out of model_dir (absl's default
    # dir). A `logs` there that is no directory is the user's, named.
    save_log = log_files.log_to_files(request.model_dir if chief else None)
  failures.set_run(log_file=logging.get_log_file_name() or "the console")
  notifier = notify.for_request(request, chief)
  summary = None
  try:
    # Once the outcome is written, signals are ignored: Python's exit
    # would die of one (143) on its way to the run's exit code.
    with failures.boundary(), preemption.SignalWatcher(
        ignore_after=True) as watcher:
      try:
        summary = _with_recovery(plan, recovery, watcher, notifier)
      except preemption.StartUpInterrupted as e:  # Nothing written: no summary.
        exit_with(e, EXIT_PREEMPTED, "preempted")
      _finish(request, plan.mode, summary)
    if summary.status == "preempted":
      exit_with(summary.message, EXIT_PREEMPTED, "preempted")
    if summary.status == "failed":
      exit_with(summary.message, summary.exit_code or RunFailed.EXIT_CODE)
    return summary
  finally:
    # Every way out passes here (the exits above are SystemExit, a second
    # signal a KeyboardInterrupt); only SIGKILL skips it.
    ended = sys.exc_info()[1]
    notify.run_ended(notifier, summary, ended)
    # A classified failure exits from the error boundary, saying whether
    # it is a refusal (a lease lost, even where it explains another error,
    # is not); a job refused before that, by `exit_with`, is.
    refused = (isinstance(ended, SystemExit)
               and ended.code == UsageError.EXIT_CODE and summary is None
               and getattr(ended, "refusal", True))
    own = save_log(keep=not refused)
    if refused and traces:
      traces.take_back(own)


def _finish(request: RunRequest, mode: modes.Mode,
            summary: RunSummary) -> None:
  """Writes the operative gin config and the run summary (the chief's).

  Another worker's summary goes to the log. Storage that fails here (a
  full disk) is a warning: the run's own outcome decides its exit code.
  """
  if not summary.chief:
    logging.info("Run summary of this worker: %s", summary.to_json())
  else:
    path = run_summary.path(request.model_dir, mode)
    try:
      train_utils.save_gin_config(request.mode, request.model_dir)
      summary.write(request.model_dir, os.path.basename(path))
      logging.info("Run summary: %s", path)
    except (tf.errors.OpError, OSError) as e:
      if not failures.storage_fault(e):
        raise
      logging.warning("Could not write %s: %s", path, failures.tf_reason(e))
      print(f"warning: could not write {path}: {failures.tf_reason(e)}",
            file=sys.stderr, flush=True)
  logging.flush()
  # TensorFlow objects collected at interpreter exit may still log after
  # absl has closed its file; such records are dropped, not printed as
  # "--- Logging error ---" tracebacks.
  std_logging.raiseExceptions = False


def exit_with(error: object, code: int, kind: str = "error") -> None:
  """Prints `kind: error` as one paragraph on stderr and exits with `code`."""
  failures.report(failures.Failure(code, str(error), kind))
  sys.exit(code)


def _with_recovery(plan: Plan, recovery: Recovery,
                   watcher: preemption.SignalWatcher,
                   notifier: Optional[notify.Notifier],
                   sleep=time.sleep) -> RunSummary:
  """`execute`s `plan`, rebuilding and resuming after transient errors.

  Restarts at most `recovery.max_restarts` times, waiting
  `backoff_seconds * 2**n` before the n-th, each logged with its cause.
  """
  restarts = 0
  while True:
    if restarts:
      plan = prepare(plan.request)
    try:
      summary = execute(plan, watcher=watcher, notifier=notifier)
    except failures.TRANSIENT as e:
      watcher.check_aborted(e)  # Not a restart: a second signal came.
      # TensorFlow cannot set up collectives twice in one process: a
      # multi-worker job exits and its cluster manager restarts it.
      if strategies.is_multi_worker(plan.strategy):
        logging.info("A worker of the cluster was lost.", exc_info=True)
        lost = failures.peer_lost(e)
        exit_with(lost.message, lost.code)
      if restarts >= recovery.max_restarts:
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


def execute(plan: Plan,
            watcher: Optional[preemption.SignalWatcher] = None,
            notifier: Optional[notify.Notifier] = None) -> RunSummary:
  """Builds the parts and runs the mode once; returns what happened.

  A run stopped by a signal (its checkpoint saved) returns status
  "preempted", one that failed on its data (a corrupt record, a loss that
  diverged; the last checkpoint intact) "failed"; `message` says why.
  """
  watcher = watcher or preemption.SignalWatcher(signals=())
  with assembled(plan, watcher,
                 assembly.Supplied(notifier=notifier)) as parts:
    return drive(plan, parts, watcher)


@contextlib.contextmanager
def assembled(plan: Plan, watcher: preemption.SignalWatcher,
              supplied: assembly.Supplied = assembly.Supplied()
              ) -> Iterator[assembly.Parts]:
  """The parts of `plan` (those not `supplied`), for the block's length.

  A training run's chief holds the trainer lease of `model_dir` from
  before the parts are built (`UsageError` while another trainer holds it:
  building them already repairs the best-checkpoint directory) until the
  block ends, however it ends. A worker other than the chief deletes the
  temp dir it wrote to once the block ends: its checkpoints and records
  (`assembly`: a whole checkpoint each save) are read by no one.
  """
  held = None
  # The run sets runtime.mixed_precision_dtype's policy for the process:
  # the next run in it (a notebook's, a test's) starts from the one before.
  policy = tf_keras.mixed_precision.global_policy()
  if plan.mode.trains and plan.strategy.extended.should_checkpoint:
    with failures.phase("model_dir", plan.request.model_dir):
      held = lease.acquire(plan.request.model_dir,
                           interrupt=watcher.check_start)
  try:
    try:
      parts = assembly.assemble(plan, watcher, supplied, held)
    except Exception as e:
      if failures.classify(e) is None and strategies.is_chief_process():
        _record_bug(plan, e)  # While the lease is held: the summary is ours.
      raise
    try:
      yield parts
    finally:
      if not parts.chief:
        shutil.rmtree(parts.write_dir, ignore_errors=True)
  finally:
    tf_keras.mixed_precision.set_global_policy(policy)
    if held:
      held.release()


def _record_bug(plan: Plan, error: Exception) -> None:
  """Writes the summary of a run a bug ended before its parts were built."""
  request = plan.request
  _finish(request, plan.mode, RunSummary(
      experiment=request.experiment, mode=request.mode,
      trainer=request.params.trainer.name, status="failed", exit_code=1,
      message=_bug_message(error),
      train_steps=request.params.trainer.train_steps,
      strategy=strategies.describe_strategy(plan.strategy),
      replicas=plan.strategy.num_replicas_in_sync,
      wall_seconds=time.time() - request.start_time))


def _bug_message(error: BaseException) -> str:
  return (f"a bug: {type(error).__name__}: {failures.tf_reason(error)} (its "
          "traceback is on the console and in the log)")


def drive(plan: Plan, parts: assembly.Parts,
          watcher: preemption.SignalWatcher) -> RunSummary:
  """Runs the mode of `plan` on assembled `parts`; see `execute`."""
  # What a mode writes outside Orbit's calls (records, the ledger) is
  # that mode's phase: a full disk there is the run's storage failing.
  phase = ("step" if plan.mode.trains else
           "evaluate" if plan.mode.evaluates else "export")
  with failures.phase(phase, plan.request.model_dir):
    return _drive(plan, parts, watcher)


def _drive(plan: Plan, parts: assembly.Parts,
           watcher: preemption.SignalWatcher) -> RunSummary:
  request, mode = plan.request, plan.mode
  watcher.check_start()
  resumes = _record_start(plan, parts)
  ctx = modes.ModeContext(controller=parts.controller, params=request.params,
                          model_dir=request.model_dir,
                          should_stop=lambda: watcher.stopping,
                          checkpoint_path=request.checkpoint_path,
                          serving=request.serving,
                          evaluations=parts.evaluations)
  previous = (_previous_summary(plan, parts, quiet=not parts.trained)
              if parts.trained or (mode.trains and parts.restored_step)
              else None)
  trained = parts.trained or _stopped_at(
      previous, parts.restored_step, request.params.trainer.train_steps)
  try:
    with plan.strategy.scope():
      if not trained:
        logs = mode.run(ctx)
        if not (mode.trains or mode.evaluates) and logs:  # An export's.
          parts.eval_progress.last_logs = scalars(logs)
      elif mode.evaluates and not _evaluated_last_step(previous, parts):
        # Stopped in (or before) the final evaluation: that one is left.
        parts.controller.evaluate(steps=request.params.trainer.validation_steps)
    watcher.check_stopped(mode.stops_on_signal,
                          int(parts.trainer.global_step.numpy()))
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    return _ended(plan, parts, resumes, watcher, e)
  finally:
    # However the mode ended, the files then hold its last step.
    if parts.chief and (mode.trains or mode.evaluates):
      curves.refresh(request.model_dir, request.params.trainer)
  if mode.trains:
    run_summary.mark_training_complete(
        parts.write_dir, parts.trainer.global_step.numpy())
  summary = summarize(plan, parts, resumes, "completed")
  if trained:
    _carry_over(summary, previous, request.params.trainer.train_steps)
  return summary


def _record_start(plan: Plan, parts: assembly.Parts) -> int:
  """Records a training start (params.yaml, training_starts/); returns how
  many starts resumed this run before."""
  request = plan.request
  if not plan.mode.trains:
    return 0
  if parts.chief:
    # Only training writes params.yaml: an evaluator beside the trainer on
    # the same model_dir must not race it for the file.
    params_file.write(request.params, request.model_dir)
    run_summary.clear_training_complete(request.model_dir)
  return run_summary.record_training_start(parts.write_dir,
                                           parts.restored_step)


def _ended(plan: Plan, parts: assembly.Parts, resumes: int,
           watcher: preemption.SignalWatcher,
           error: BaseException) -> RunSummary:
  """The summary of a mode that raised `error`; raises what is not one.

  A signal's save (`Preempted`), an action's stop (`Stopped`), a lost
  peer of a multi-worker job, a failure `failures.classify` names: each a
  summary. A usage error, a transient error of one worker (restarted by
  `_with_recovery`) and a bug (its summary written first) raise.
  """
  request, mode = plan.request, plan.mode
  if isinstance(error, preemption.Preempted):
    return summarize(plan, parts, resumes, "preempted", str(error),
                     exit_code=EXIT_PREEMPTED)
  if isinstance(error, preemption.Stopped):  # Asked by an action; saved.
    print(f"stopped @ step {error.step} | {error.reason}", flush=True)
    run_summary.mark_training_complete(parts.write_dir, error.step)
    summary = summarize(plan, parts, resumes, "completed", str(error))
    summary.stopped_early_at, summary.stop_reason = error.step, error.reason
    return summary
  if isinstance(error, failures.TRANSIENT):
    if not strategies.is_multi_worker(plan.strategy):
      raise error  # Restarted by `_with_recovery`.
    # A peer lost: TensorFlow cannot set up collectives twice in a process;
    # the cluster manager restarts every worker.
    watcher.check_aborted(error)
    logging.info("A worker of the cluster was lost.", exc_info=True)
    lost = failures.peer_lost(error)
    return summarize(plan, parts, resumes, "failed", lost.message,
                     exit_code=lost.code)
  if isinstance(error, UsageError):
    raise error  # Refused: exit 2.
  # A hook's sys.exit() is a bug like any error of the model's code (an
  # action's is the action's failure: `tfm_ext.actions.guard.Guard`).
  watcher.check_aborted(error)
  failure = failures.classify(error)
  if failure is None:  # A bug: its traceback, and a summary saying so.
    _finish(request, mode, summarize(
        plan, parts, resumes, "failed", exit_code=1,
        message=_bug_message(error)))
    if isinstance(error, SystemExit):  # Else the process would exit so.
      raise RuntimeError(f"sys.exit({error.code!r}) inside the run") from error
    raise error
  if failure.code == UsageError.EXIT_CODE and not (
      mode.trains or mode.stops_on_signal):
    raise error  # Refused: an `eval` or `export` that wrote nothing records none.
  logging.info("The run failed.", exc_info=True)  # The log file only.
  return summarize(plan, parts, resumes, "failed", failure.message,
                   exit_code=failure.code)


def _previous_summary(plan: Plan, parts: assembly.Parts,
                      quiet: bool = False) -> Optional[RunSummary]:
  """The run summary a finished run left, or None where it left none
  (said unless `quiet`: a resumed run need not have one)."""
  if not parts.chief:
    return None
  try:
    return RunSummary.read(plan.request.model_dir)
  except (tf.errors.OpError, ValueError, KeyError, TypeError) as e:
    (logging.info if quiet else logging.warning)(
        "No earlier run summary to keep (%s).",
        str(e).splitlines()[0] if str(e) else type(e).__name__)
    return None


def _stopped_at(previous: Optional[RunSummary], restored_step: int,
                train_steps: int) -> bool:
  """Whether an action stopped the run at the checkpoint restored, for
  these `train_steps`: a relaunch trains nothing, as after early stopping
  (the evaluators were told training is complete); a larger
  `trainer.train_steps` trains on."""
  return (previous is not None and previous.status == "completed"
          and previous.stopped_early_at is not None
          and previous.stopped_early_at == restored_step
          and previous.train_steps == train_steps)


def _evaluated_last_step(previous: Optional[RunSummary],
                         parts: assembly.Parts) -> bool:
  return (previous is not None and previous.status == "completed"
          and previous.global_step == parts.restored_step
          and bool(previous.eval_metrics))


def _carry_over(summary: RunSummary, previous: Optional[RunSummary],
                train_steps: int) -> None:
  """A start with nothing to train keeps the results of the run that did."""
  stopped = previous.stopped_early_at if previous else None
  if stopped is not None and stopped == summary.global_step:
    summary.stopped_early_at = stopped
    summary.stop_reason = previous.stop_reason
  why = (f"stopped early: {summary.stop_reason}" if summary.stop_reason
         else f"train_steps={train_steps}")
  summary.message = (
      f"already complete at step {summary.global_step} ({why}): nothing to "
      "train; the metrics are those of the run that trained" + (
          ", and of this start's evaluation" if summary.eval_metrics else ""))
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
      evaluations=dict(parts.evaluations),
      **plateau.summary_fields(parts.watching),
      best=(best_checkpoints.best_of(request.model_dir, request.params.trainer)
            if parts.chief else {}))
