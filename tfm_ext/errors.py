"""`UsageError`, `RunFailed`: what a user can fix, reported without traceback.

`tfm_ext.run.failures` classifies every other failure by the run's phase.
"""


class UsageError(Exception):
  """A problem with the user's flags, config or files.

  The launcher prints the message as one paragraph and exits with
  `EXIT_CODE`, before anything is written to `model_dir`. Real bugs raise
  anything else and keep their tracebacks.
  """

  EXIT_CODE = 2
  # A refused job leaves the model_dir as it found it (its log too:
  # `tfm_ext.model_dir._files.Traces`); a job that ran first and then
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

  EXIT_CODE = 3
