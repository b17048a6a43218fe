"""`UsageError`: bad input that the user can fix, reported without traceback."""


class UsageError(Exception):
  """A problem with the user's flags, config or files.

  The launcher prints the message as one paragraph and exits with
  `EXIT_CODE`, before anything is written to `model_dir`. Real bugs raise
  anything else and keep their tracebacks.
  """

  EXIT_CODE = 2
