"""Runs a checked request as a job: log file, signals, recovery, exit codes.

Shared by every launcher: `run` returns the summary of a completed run, or
exits the process: 42 preempted (checkpoint saved, or nothing to save yet:
a signal before the first step, or to an evaluator), 3 failed on its data
(the last checkpoint intact), 4 its storage failed (a full disk, a lost
permission), 2 bad input found only once running (`tfm_ext.run.failures`). Each
writes the run summary (`run_summary.json`; `eval_summary.json` or
`export_summary.json` for a mode that does not train) and the operative gin config first, when the run
got that far, then sends the run's `end` notification (`tfm_ext.actions.notify`,
however the run ended, in bounded time), and copies the log into a bucket
`model_dir` last.
"""

import logging as std_logging
import os
import sys

from absl import logging
import tensorflow as tf

from official.core import train_utils

from tfm_ext.actions import console
from tfm_ext.actions import notify
from tfm_ext.errors import RunFailed
from tfm_ext.model_dir import run_summary
from tfm_ext.model_dir.run_summary import RunSummary
from tfm_ext.run import driver
from tfm_ext.run import failures
from tfm_ext.run import modes
from tfm_ext.run import preemption
from tfm_ext.run import strategies


def run(plan: driver.Plan,
        recovery: driver.Recovery = driver.Recovery()) -> RunSummary:
  """Runs a `driver.prepare`d plan; returns its summary or exits.

  Inside the run's error boundary (`tfm_ext.run.failures.boundary`), so what it
  raises is classified, and logged, before the log is copied into a
  bucket.
  """
  request = plan.request
  # Non-chief workers keep their logs out of model_dir (absl's default dir).
  save_log = console.log_to_files(
      request.model_dir if strategies.is_chief_process() else None)
  failures.set_run(log_file=logging.get_log_file_name() or "the console")
  notifier = notify.for_request(request, strategies.is_chief_process())
  summary = None
  try:
    with failures.boundary(), preemption.SignalWatcher() as watcher:
      try:
        summary = driver.run_with_recovery(plan, recovery, watcher,
                                           notifier=notifier)
      except preemption.StartUpInterrupted as e:  # Nothing written: no summary.
        exit_with(e, preemption.EXIT_CODE, "preempted")
      finish(request, summary)
    if summary.status == "preempted":
      exit_with(summary.message, preemption.EXIT_CODE, "preempted")
    if summary.status == "failed":
      exit_with(summary.message, summary.exit_code or RunFailed.EXIT_CODE)
    return summary
  finally:
    # Every way out passes here (the exits above are SystemExit, a second
    # signal a KeyboardInterrupt); only SIGKILL skips it.
    notify.run_ended(notifier, summary, sys.exc_info()[1])
    save_log()


def finish(request: driver.RunRequest, summary: RunSummary) -> str:
  """Writes the operative gin config and the run summary; returns its path.

  Only the chief writes them; another worker's summary goes to the log.
  Storage that fails here (a full disk) is a warning: the run's own
  outcome decides its exit code.
  """
  if not summary.chief:
    logging.info("Run summary of this worker: %s", summary.to_json())
    path = ""
  else:
    # An evaluator beside a trainer must not overwrite the trainer's record,
    # nor an export the evaluator's.
    mode = modes.get_mode(request.mode)
    path = os.path.join(request.model_dir, run_summary.summary_filename(
        mode.trains, mode.evaluates))
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
      path = ""
  logging.flush()
  # TensorFlow objects collected at interpreter exit may still log after
  # absl has closed its file; such records are dropped, not printed as
  # "--- Logging error ---" tracebacks.
  std_logging.raiseExceptions = False
  return path


def exit_with(error: object, code: int, kind: str = "error") -> None:
  """Prints `kind: error` as one paragraph on stderr and exits with `code`."""
  print(f"{kind}: {error}", file=sys.stderr, flush=True)
  sys.exit(code)
