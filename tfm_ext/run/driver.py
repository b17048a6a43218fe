"""Runs a job: one module from a request to an exit code.

    main(make_request)            the launcher's: its flags make the request
      job(make_plan)              one error boundary and one exit (failures.
                                  boundary): what is raised is classified
                                  once, printed as one paragraph, exited with
        plan_for(request)         registrations imported; --list and
                                  --print_config shown; else
          prepare(request) -> Plan   the config built, every check made;
                                     nothing written yet
        _run(plan)                the log file, signals, in-process recovery
          execute(plan)           one attempt (again after a transient error)
            with assembled(plan)  the trainer lease held (tfm_ext.model_dir.
                                  lease) while the parts are built (tfm_ext.
                                  run.assembly) and the mode runs
              drive(plan, parts)  params.yaml and training_starts/ written,
                                  the mode run (tfm_ext.run.modes: Orbit runs
                                  it), training_complete.json, metrics.csv
              -> RunSummary       "completed", "preempted" or "failed"
          _finish                 run_summary.json, the operative gin config
      however it ends: the `end` notification, the log copied into a bucket,
      a refused job's traces taken back; then the exit code

A training mode, as Orbit's controller runs it, loop after loop:

    trainer.train(n)        train_loop_begin; train_step x n, ending after
                            the step in flight on a signal; train_loop_end
    train actions           the lease proven, divergence recovery, TFM's
                            (pruning, EMA), registered ones, the progress
                            line, metrics.csv, notify; then save-and-stop on
                            a signal or an action's stop
    summaries; a checkpoint every trainer.checkpoint_interval, the lease
    proven before each save
    every validation_interval: trainer.evaluate (eval_begin; eval_step x m;
      eval_reduce; eval_end, which exports the best checkpoints), the eval
      actions (as above, then early stopping and the plateau), summaries

Exits: 0 completed; 42 preempted (checkpoint saved, or nothing to save
yet: a signal before the first step, or to an evaluator); 3 failed on its
data (the last checkpoint intact); 4 its storage failed (a full disk, a
lost permission); 2 bad input, before anything is written or once running
(`tfm_ext.base.failures`); 1 a bug, with its traceback. `execute` and
`drive` are for code that runs a plan in its own process (TFM's
`run_experiment`, tests): they return the summary and exit nothing.
"""

import contextlib
import copy
import dataclasses
import logging as std_logging
import os
import shutil
import sys
import time
from typing import Callable, Iterator, Optional, Sequence

from absl import logging
import tensorflow as tf
import tf_keras

from official.core import config_definitions
from official.core import train_utils

from tfm_ext.model_dir import best_checkpoints
from tfm_ext import actions as actions_lib
from tfm_ext.actions import curves
from tfm_ext.actions import notify
from tfm_ext.actions import plateau
from tfm_ext.config import checks
from tfm_ext.config import config_drift
from tfm_ext.config import experiments
from tfm_ext.base import settings
from tfm_ext.base import signalled
from tfm_ext.base import startup
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
from tfm_ext.run import listing
from tfm_ext.base import failures
from tfm_ext.run import modes
from tfm_ext.run import preemption
from tfm_ext.run import strategies
from tfm_ext.training import autograph_cache
from tfm_ext.training import trainers
from tfm_ext.base.errors import EXIT_PREEMPTED
from tfm_ext.model_dir import log_files
from tfm_ext.base.logs import scalars


@dataclasses.dataclass(frozen=True)
class RunRequest:
  """What to run: the operative config, the mode and where to write.

  The config is `params`, or, where it is None, what `sources` and gin
  describe: `prepare` builds it (the launcher's flags, `tfm_ext.launch`).
  """
  experiment: str
  mode: str
  model_dir: str
  params: Optional[config_definitions.ExperimentConfig] = None
  # The experiment, config files, overrides and flags `params` is built
  # from, with the gin files and bindings parsed first.
  sources: Optional[params_lib.ConfigSources] = None
  gin_files: Sequence[str] = ()
  gin_params: Sequence[str] = ()
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
  # In-process restarts after transient errors (`_with_recovery`): at most
  # this many, the n-th after `restart_backoff_seconds * 2**(n-1)`.
  max_restarts: int = 3
  restart_backoff_seconds: float = 2.0
  # Modules to import for their registrations (--registry).
  registry: Sequence[str] = ()
  # "list" (--list) or "config" (--print_config): shows it, runs nothing.
  show: str = ""
  # The run's own actions (`tfm_ext.launch(actions=...)`).
  actions: Sequence[actions_lib.RunAction] = ()


@dataclasses.dataclass(frozen=True)
class Plan:
  """A checked `RunRequest` with what `prepare` resolved for it."""
  request: RunRequest
  mode: modes.Mode
  trainer_cls: type
  strategy: tf.distribute.Strategy


def build_params(request: RunRequest) -> config_definitions.ExperimentConfig:
  """The operative config `request.sources` and its gin describe: gin
  parsed, then files, overrides and flags (`params.build`)."""
  params_lib.parse_gin(request.gin_files, request.gin_params)
  return params_lib.build(request.sources)


def prepare(request: RunRequest) -> Plan:
  """Resolves and checks `request`; raises `UsageError`, writes nothing.

  Without `params`, the operative config is built here (`build_params`);
  an evaluator's is its trainer's (`params.yaml`, waited for beside a
  trainer that may not have started yet), and the evaluator is present
  for the trainer's retention from then on.
  """
  settings.load()
  mode = modes.get_mode(request.mode)
  request = dataclasses.replace(
      request, model_dir=os.path.expanduser(request.model_dir))
  # What fails from here on may be a file of it (`failures.classify`).
  failures.set_run(model_dir=request.model_dir, params=request.params)
  # Before anything reads or writes it (an evaluator reads params.yaml).
  with failures.phase("model_dir", request.model_dir):
    usable.check_usable(request.model_dir)
  if request.params is None:
    request = dataclasses.replace(request, params=_operative_params(
        request, mode))
  params = request.params
  failures.set_run(params=params)
  # The records the config names, of their kind (`usable.RECORDS`).
  usable.check_records(request.model_dir, params, request.mode)
  trainer_cls = trainers.get_trainer(params.trainer.name)
  if mode.trains:
    # A resume that changed its config is told that first: a value the
    # other config refuses (a metric another trainer logs) follows from it.
    config_drift.check_unchanged(params, request.model_dir,
                                 request.allow_config_change)
  checks.check_values(params, trains=mode.trains, evaluates=mode.evaluates)
  notify.check_url(notify.url_of(request))
  # TF_CONFIG checked, its cluster waited for, the strategy built.
  strategy = strategies.start(params)
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
  _check_export_flags(request, mode)
  # Before any trace (a relaunch converts nothing), after every refusal (a
  # refused job writes nothing, the cache's folder included).
  autograph_cache.install()
  return Plan(request=request, mode=mode, trainer_cls=trainer_cls,
              strategy=strategy)



def _check_export_flags(request: RunRequest, mode: modes.Mode) -> None:
  """Refuses export's flags for another mode, and a checkpoint to export
  that is not there."""
  export_flags = ([f"--checkpoint_path={request.checkpoint_path}"]
                  if request.checkpoint_path else []) + request.serving.given
  if export_flags and mode is not modes.MODES["export"]:
    raise UsageError(f"{' '.join(export_flags)}: for --mode=export, not "
                     f"--mode={request.mode}.")
  if request.checkpoint_path:
    export.checkpoint_to_export(
        request.model_dir,
        request.params.trainer.best_checkpoint_export_subdir,
        request.checkpoint_path)


def _operative_params(request: RunRequest, mode: modes.Mode):
  """`build_params`; an evaluator's followed from its trainer's."""
  params = build_params(request)
  if mode.waits_for_trainer:
    # An evaluator beside a trainer is present from its start: the trainer
    # keeps each checkpoint for it while it waits and builds.
    with failures.phase("model_dir", request.model_dir):
      eval_claims.announce(request.model_dir)
  if not mode.trains:
    params = params_lib.follow_trainer(
        request.sources, params, request.model_dir,
        wait=mode.waits_for_trainer,
        may_change=(params_lib.EVALUATION_FIELDS if mode.evaluates
                    else params_lib.EXPORT_FIELDS))
  return params


def main(make_request: Callable[[], RunRequest]) -> Optional[RunSummary]:
  """The launcher's job: the request made, checked and run; one `done` line.

  `make_request` turns the command line into a request inside the job's
  error boundary, so a bad flag is refused as any input is (exit 2).
  """
  # For a fork's script that did not call startup.begin: a signal exits
  # 42 from here until the run's handlers take over.
  startup.install_signals()
  startup.install_console()
  log_files.hold_log()
  failures.reset()
  return job(lambda: plan_for(make_request()), say_done=True)


def plan_for(request: RunRequest) -> Optional[Plan]:
  """The registrations imported, then the plan; None where the request only
  shows something (`--list`, `--print_config`) and writes nothing."""
  experiments.import_registries(request.registry)
  # Before gin is parsed: stock has imported them, and a binding may name
  # their configurables.
  if request.experiment or request.gin_files or request.gin_params:
    experiments.register_for(
        request.experiment or "",
        gin_given=bool(request.gin_files or request.gin_params))
  if request.show == "list":
    print(listing.registered(), end="")
    return None
  if request.show == "config":
    if not request.experiment:
      raise UsageError("--print_config needs --experiment.")
    print(params_file.dump(build_params(request).as_dict()), end="")
    return None
  missing = [f"--{name}" for name in ("experiment", "mode", "model_dir")
             if not getattr(request, name)]
  if missing:
    raise UsageError(f"Missing required flags: {', '.join(missing)}. "
                     "(--list shows what is registered.)")
  return prepare(request)


def run(plan: Plan) -> RunSummary:
  """Runs a `prepare`d plan as a job (`job`); returns its summary or exits."""
  return job(lambda: plan)


def job(make_plan: Callable[[], Optional[Plan]],
        say_done: bool = False) -> Optional[RunSummary]:
  """Runs the plan `make_plan` makes as a job; its summary, or it exits.

  The job's one error boundary (`tfm_ext.base.failures.boundary`) holds
  all of it, from the plan to the run's outcome: what is raised is
  classified there and exits with its code, after it is logged and before
  the log is copied into a bucket. None: nothing to run. `say_done`
  prints the `done |` line of a run that completed.
  """
  ending = _Ending()
  try:
    with failures.boundary():
      plan = make_plan()  # The settings parsed in there (`prepare`).
      summary = None if plan is None else _run(plan, ending)
  finally:
    # Every way out passes here (an exit is a SystemExit, a second signal
    # a KeyboardInterrupt); only SIGKILL skips it.
    ending.close(sys.exc_info()[1])
  if summary is not None and say_done:
    _say_done(plan, summary)
  return summary


def _say_done(plan: Plan, summary: RunSummary) -> None:
  path = run_summary.path(plan.request.model_dir, plan.mode)
  best = summary.best
  best = (f" | best {best['metric']} {best['value']:.4g} @ step "
          f"{best['global_step']}: {best['path']}" if best else "")
  written = f" | summary {path}" if summary.chief else ""
  print(f"done | {summary.mode} | step {summary.global_step} | "
        f"{summary.wall_seconds:.1f}s{best}{written}")


class _Ending:
  """What the job's end does, however it ends: the `end` notification,
  the log kept (copied into a bucket), a refused job's traces taken back."""

  def __init__(self):
    self.notifier: Optional[notify.Notifier] = None
    self.summary: Optional[RunSummary] = None
    self.traces: Optional[files.Traces] = None
    self.save_log: Callable[..., list] = lambda keep=True: []

  def close(self, ended: Optional[BaseException]) -> None:
    notify.run_ended(self.notifier, self.summary, ended)
    # A classified failure exits from the error boundary, saying whether
    # it is a refusal (a lease lost, even where it explains another error,
    # is not).
    refused = (isinstance(ended, SystemExit)
               and ended.code == UsageError.EXIT_CODE
               and self.summary is None and getattr(ended, "refusal", True))
    own = self.save_log(keep=not refused)
    if refused and self.traces:
      self.traces.take_back(own)


def _run(plan: Plan, ending: _Ending) -> RunSummary:
  """The run of `plan`: its log file, signals, recovery and summary."""
  request = plan.request
  chief = strategies.is_chief_process()
  with failures.phase("model_dir", request.model_dir):
    # What a refused job takes back: it leaves the model_dir as it was.
    ending.traces = files.Traces(request.model_dir) if chief else None
    # Non-chief workers keep their logs out of model_dir (absl's default
    # dir). A `logs` there that is no directory is the user's, named.
    ending.save_log = log_files.log_to_files(
        request.model_dir if chief else None)
  failures.set_run(log_file=logging.get_log_file_name() or "the console")
  ending.notifier = notify.for_request(request, chief)
  # Once the outcome is written, signals are ignored: Python's exit
  # would die of one (143) on its way to the run's exit code.
  with preemption.SignalWatcher(ignore_after=True) as watcher:
    try:
      summary = ending.summary = _with_recovery(plan, watcher,
                                                ending.notifier)
    except preemption.StartUpInterrupted as e:  # Nothing written: no summary.
      raise failures.Ended(failures.Failure(EXIT_PREEMPTED, str(e),
                                            "preempted")) from None
    _finish(request, plan.mode, summary)
  if summary.status == "preempted":
    raise failures.Ended(failures.Failure(EXIT_PREEMPTED, summary.message,
                                          "preempted"))
  if summary.status == "failed":
    raise failures.Ended(failures.Failure(
        summary.exit_code or RunFailed.EXIT_CODE, summary.message))
  return summary


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


def _with_recovery(plan: Plan,
                   watcher: preemption.SignalWatcher,
                   notifier: Optional[notify.Notifier],
                   sleep=signalled.sleep) -> RunSummary:
  """`execute`s `plan`, rebuilding and resuming after transient errors.

  Restarts at most `max_restarts` times, waiting
  `restart_backoff_seconds * 2**(n-1)` before the n-th, each logged with
  its cause.
  """
  restarts = 0
  while True:
    if restarts:
      with files.listening(watcher.check_start):  # Its store waits too.
        plan = prepare(plan.request)
    try:
      summary = execute(plan, watcher=watcher, notifier=notifier)
    except failures.TRANSIENT as e:
      watcher.check_aborted(e)  # Not a restart: a second signal came.
      # TensorFlow cannot set up collectives twice in one process: a
      # multi-worker job exits and its cluster manager restarts it.
      if strategies.is_multi_worker(plan.strategy):
        logging.info("A worker of the cluster was lost.", exc_info=True)
        raise failures.Ended(failures.peer_lost(e)) from None
      max_restarts = plan.request.max_restarts
      if restarts >= max_restarts:
        raise
      restarts += 1
      delay = plan.request.restart_backoff_seconds * 2 ** (restarts - 1)
      message = (f"restart {restarts}/{max_restarts} after "
                 f"{type(e).__name__}: {str(e).splitlines()[0]}; resuming "
                 f"from the latest checkpoint in {delay:.1f}s")
      logging.warning(message)
      print(message, flush=True)
      tf_keras.backend.clear_session()
      sleep(delay)  # Ends early at a signal, which ends the job here.
      watcher.check_start()
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
    with failures.phase("model_dir", plan.request.model_dir), \
        files.listening(watcher.check_start):  # A record's re-read too.
      held = lease.acquire(plan.request.model_dir,
                           interrupt=watcher.check_start)
  try:
    try:
      with files.listening(watcher.check_start):
        parts = assembly.assemble(_to_build(plan), watcher, supplied, held)
    except preemption.StartUpInterrupted:
      raise  # Nothing to classify: no summary (`_run`).
    except Exception as e:
      _failed(plan, None, 0, e)  # Classified; a bug's summary written.
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


def _to_build(plan: Plan) -> Plan:
  """`plan` with a copy of its config, for the builders to fill in.

  A builder may complete the config it is given while it builds (ViT's
  `model_name` sets `hidden_size` and the rest, YOLO's input sets its data
  seed), as stock TFM lets it. What the user gave stays the run's config:
  the `params.yaml` written, what a resume is compared with, what an
  in-process restart checks again; stock writes its config before it
  builds for the same reason.
  """
  return dataclasses.replace(plan, request=dataclasses.replace(
      plan.request, params=copy.deepcopy(plan.request.params)))


def _failed(plan: Plan, parts: Optional[assembly.Parts], resumes: int,
            error: BaseException) -> Optional[failures.Failure]:
  """The run's one classification of what failed it, under the lease.

  The `Failure` of a user's fault or of what the run met (the boundary,
  asking again, is given the same), or None for a bug, whose summary it
  writes (the chief's, while the lease makes the summary ours).
  """
  failure = failures.classify(error)
  if failure is not None:
    return failure
  message = (f"a bug: {type(error).__name__}: {failures.tf_reason(error)} "
             "(its traceback is on the console and in the log)")
  request = plan.request
  if parts is not None:
    _finish(request, plan.mode, summarize(plan, parts, resumes, "failed",
                                          message, exit_code=1))
  elif strategies.is_chief_process():  # Its parts were never built.
    _finish(request, plan.mode, RunSummary(
        experiment=request.experiment, mode=request.mode,
        trainer=request.params.trainer.name, status="failed", exit_code=1,
        message=message, train_steps=request.params.trainer.train_steps,
        strategy=strategies.describe_strategy(plan.strategy),
        replicas=plan.strategy.num_replicas_in_sync,
        wall_seconds=time.time() - request.start_time))
  return None


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
      elif parts.catch_up:
        # The checkpoint holds the state before the final evaluation: that
        # one is left (killed in or before it, or run again from it).
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
  `_with_recovery`) and a bug (its summary written first: `_failed`)
  raise.
  """
  mode = plan.mode
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
  failure = _failed(plan, parts, resumes, error)
  if failure is None:  # A bug: its traceback (its summary written).
    if isinstance(error, SystemExit):  # Else the process would exit so.
      raise RuntimeError(f"sys.exit({error.code!r}) inside the run") from error
    raise error
  if failure.code == UsageError.EXIT_CODE and not (
      mode.trains or mode.stops_on_signal):
    # Refused: an `eval` or `export` that wrote nothing records none.
    raise error
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
          and previous.train_steps == train_steps
          # Early stopping's stop is the checkpoint's (`assembly.Parts`).
          and not plateau.asked_by_early_stopping(previous.stop_reason))


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
