"""A signal before a run starts: exit 42 at once, nothing to save.

Python's default would end a launcher that a signal reaches while it loads
TensorFlow with exit code 143 (SIGTERM) or 129 (SIGHUP: the terminal or
the ssh session closed), which a restart loop reads as a failure, or a
KeyboardInterrupt traceback (SIGINT). Each of `SIGNALS` ends a job the same
way. A launcher script calls
`install` on its first lines, before the heavy imports (this module needs
the standard library only), and `tfm_ext.run.launcher.main` calls it again for
a fork's script; from then on a signal prints one line,

    preempted: SIGTERM received during start-up: nothing to save yet; exit 42 to be restarted.

and ends the process with 42, the code a supervisor restarts on. Start-up
reads and checks, and writes nothing to `model_dir`, so there is nothing
to save or to clean up: the process ends at once (`os._exit`), wherever
the signal found it, an import included. The run's
`tfm_ext.run.preemption.SignalWatcher` takes over from it.
"""

import os
import signal
import sys

# `tfm_ext.run.preemption.EXIT_CODE`, the restart code TensorFlow's
# `PreemptionCheckpointHandler` uses.
EXIT_CODE = 42
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def message(signal_name: str) -> str:
  """What a launcher says when `signal_name` stops it before its run."""
  return (f"{signal_name} received during start-up: nothing to save yet; "
          f"exit {EXIT_CODE} to be restarted.")


def install() -> None:
  """From here until a `SignalWatcher` takes over, a signal exits 42."""
  for sig in SIGNALS:
    signal.signal(sig, _exit)


def _exit(signum, frame) -> None:
  del frame
  # Unbuffered: the signal may have come while Python wrote to stderr.
  os.write(sys.stderr.fileno(), (
      f"preempted: {message(signal.Signals(signum).name)}\n").encode())
  os._exit(EXIT_CODE)  # pylint: disable=protected-access
