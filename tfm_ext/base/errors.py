"""How a run ends when it does not complete: its exceptions and exit codes.

`UsageError` and `RunFailed` are what a user can fix, reported without a
traceback; `Preempted` and `Stopped` end a run once its checkpoint is
saved. `tfm_ext.base.failures` classifies every other failure by the run's
phase into one of the same exit codes.
"""

EXIT_USAGE = 2
EXIT_DATA = 3
# Nothing the run had was lost: a write failed (`tfm_ext.base.failures`).
EXIT_STORAGE = 4
# The restart code of TensorFlow's `PreemptionCheckpointHandler`: a
# supervisor that restarts on it resumes from the checkpoint saved.
EXIT_PREEMPTED = 42



class UsageError(Exception):
  """A problem with the user's flags, config or files.

  The launcher prints the message as one paragraph and exits with
  `EXIT_CODE`, before anything is written to `model_dir`. Real bugs raise
  anything else and keep their tracebacks.
  """

  EXIT_CODE = EXIT_USAGE
  # A refused job leaves the model_dir as it found it (its log too:
  # `tfm_ext.model_dir.files.Traces`); a job that ran first and then
  # stopped on a usage error (an evaluator that waited in vain, a trainer
  # that lost its lease) keeps its log.
  refusal = True


def no_checkpoint(model_dir: str, timeout: float) -> UsageError:
  """What an evaluator that waited `timeout` seconds for a trainer says."""
  error = UsageError(
      f"No checkpoint appeared in {model_dir!r} within "
      f"continuous_eval_timeout={timeout:.0f}s. Is the training job "
      "running and writing to the same --model_dir?")
  error.refusal = False
  return error


class RunFailed(RuntimeError):
  """The run cannot go on: corrupt input data, a non-finite loss.

  Not a bug in code: the launcher prints the message without a traceback
  (the log file has it) and exits with `EXIT_CODE`. The last checkpoint
  saved before the failure is left as it was.
  """

  EXIT_CODE = EXIT_DATA


class Preempted(Exception):
  """Raised after the preemption checkpoint is saved, or by an evaluator.

  An evaluator (`saved=False`) has no checkpoint to save: it stops between
  evaluations.
  """

  def __init__(self, step: int, signal_name: str, saved: bool = True):
    done = (f"saved a checkpoint at step {step}" if saved else
            f"stopped evaluating at step {step}; nothing to save")
    came = (f"{signal_name} received" if signal_name
            else "another worker received a signal")
    super().__init__(
        f"{came}: {done}; exit {EXIT_PREEMPTED} to be restarted.")
    self.step = step


class Stopped(Exception):
  """Raised after the checkpoint of a stop the run asked for is saved.

  An action asked (`tfm_ext.actions.plateau.Stop`: early stopping, or an
  action's `context.stop(reason)`): the run ends as complete at `step`,
  exit 0, its summary saying why.
  """

  def __init__(self, step: int, reason: str):
    super().__init__(f"stopped at step {step}: {reason}")
    self.step = step
    self.reason = reason
