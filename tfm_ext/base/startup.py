"""The start of every entry point: signals, a quiet TensorFlow, a fast import.

Every launcher script, `tfm-ext-train` and `tfm_ext.run.launcher` itself
start the same way, with the standard library only:

    from tfm_ext.base import startup
    startup.begin()
    ...import TensorFlow, TFM, the registrations...
    startup.end()

`begin` first installs the start-up signal handlers (`install_signals`):
Python's default would end a launcher that a signal reaches while it loads
TensorFlow with exit code 143 (SIGTERM) or 129 (SIGHUP: the terminal or
the ssh session closed), which a restart loop reads as a failure, or a
KeyboardInterrupt traceback (SIGINT). From then on each of `SIGNALS`
prints one line,

    preempted: SIGTERM received during start-up: nothing to save yet; exit 42 to be restarted.

and ends the process with 42, the code a supervisor restarts on. Start-up
reads and checks, and writes nothing to `model_dir`, so there is nothing
to save or to clean up: the process ends at once (`os._exit`), wherever
the signal found it, an import included. `tfm_ext.run.launcher`'s import
leaves them alone (`begin(signals=False)`: importing the library changes
no handler) and its `main` installs them, for a fork's script that did not
call `begin`; the run's `tfm_ext.run.preemption.SignalWatcher` takes over
from them.

A launcher (`begin()`, not a library's import) sets
`TF_USE_LEGACY_KERAS=1` unless the environment says otherwise: `tf.keras`
is then `tf_keras` (Keras 2), which TFM's models and optimizers are, and
importing TensorFlow no longer loads Keras 3 (with IPython), about a third
of TensorFlow's import (benchmarks/RESULTS.md#default-legacy-keras).

`begin` then sets TensorFlow's C++ log level to warnings (its start-up INFO
lines would bury the progress lines; a value the user set wins) and turns
Python's garbage collector off: the imports make hundreds of thousands of
objects that live as long as the process, and the collector would rescan
them in several full collections while they load. `end` freezes what they
made, so later collections skip it, and turns the collector back on
(benchmarks/RESULTS.md#default-collector-off-while-importing,
#default-gc-freeze). `tfm_ext.run.launcher` does both, so a fork that
imports it first gets them.

`end` also lists the physical devices once, the first time, which
TensorFlow does anyway after absl's flags are parsed (a hook of
`tf.distribute`'s test combinations). On a machine without a GPU, CUDA's
`failed call to cuInit: ... UNKNOWN ERROR (303)` line, which that listing
logs at error level, is dropped; whatever else it logs is kept. With NVIDIA
devices (`/dev/nvidia*`) the line says a driver is broken and stays.
"""

import fcntl
import gc
import os
import signal
import sys

from tfm_ext.base.errors import EXIT_PREEMPTED

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# Nested begin/end pairs (a launcher script around `tfm_ext.run.launcher`'s own):
# the outermost pair pauses and resumes the collector.
_depth = 0
_paused = False


def begin(signals: bool = True) -> None:
  """Installs the signal handlers, quiets TensorFlow, pauses the collector.

  `signals=False` is for a module's import (`tfm_ext.run.launcher`: a
  process that imports the library keeps its own handlers until it runs)
  and for a tool that runs no job a restart resumes
  (`launchers/export_resnet.py`).
  """
  global _depth, _paused
  if signals:
    install_signals()
    install_console()
    # A launcher's process: `tf.keras` is Keras 2, what TFM builds with.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  if _depth == 0 and gc.isenabled():
    gc.disable()
    _paused = True
  _depth += 1


def end() -> None:
  """Freezes what the imports made and resumes the collector (outermost)."""
  global _depth, _paused
  _depth = max(_depth - 1, 0)
  if _depth == 0 and _paused:
    gc.freeze()
    gc.enable()
    _paused = False
  if _depth == 0:
    _list_devices_once()


def message(signal_name: str, during: str = "during start-up") -> str:
  """What a launcher says when `signal_name` stops it before its run."""
  return (f"{signal_name} received {during}: nothing to save yet; "
          f"exit {EXIT_PREEMPTED} to be restarted.")


def install_signals() -> None:
  """From here until a `SignalWatcher` takes over, a signal exits 42."""
  for sig in SIGNALS:
    signal.signal(sig, _exit)


def _exit(signum, frame) -> None:
  del frame
  exit_preempted(signum)


def exit_preempted(signum: int, during: str = "during start-up") -> None:
  """Says `signum`'s `preempted:` line (`message`) and exits 42 at once.

  For a process that has written nothing yet: the start-up's handlers,
  and a start-up wait's (`tfm_ext.run.waits`). Unbuffered, from any
  thread: the signal may have come while Python wrote to stderr.
  """
  try:
    os.write(2, (f"preempted: {message(signal.Signals(signum).name, during)}"
                 "\n").encode())
  except OSError:  # A console gone: the exit code says it.
    pass
  os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access


def install_console() -> None:
  """Lets the console go away without ending the run: see `_Console`.

  A standard stream closed at the start (`>&-`) gets the null device on
  its descriptor, so no file the run opens later takes that number (and
  TensorFlow's log lines with it), and so does one that holds a file read
  only (a script that the shell ran through the lowest free descriptor: a
  pyenv shim); each stream is a `_Console`. Idempotent.
  """
  for name, fd in (("stdout", 1), ("stderr", 2)):
    stream = getattr(sys, name)
    if isinstance(stream, _Console):
      continue
    if not _writable(fd):
      _to_null(fd)
      stream = None
    if stream is None:  # Python's, for a descriptor closed at its start.
      stream = open(fd, "w", buffering=1, closefd=False,  # pylint: disable=consider-using-with
                    encoding="utf-8", errors="backslashreplace")
    setattr(sys, name, _Console(stream, fd))


def _writable(fd: int) -> bool:
  """Whether `fd` is open for writing (closed, or a file something else
  opened read-only as the lowest free number, is not)."""
  try:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
  except OSError:
    return False
  return flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)


def _to_null(fd: int) -> None:
  null = os.open(os.devnull, os.O_WRONLY)
  if null != fd:  # A closed `fd` is the lowest free one: opened as it.
    os.dup2(null, fd)
    os.close(null)


class _Console:
  """A standard stream whose reader may go: a closed pipe, a lost terminal.

  The run's outcome lives in its records and exit code, not in what it
  printed: the first write or flush that fails (`BrokenPipeError`, `EIO`)
  puts the null device on the stream's descriptor, so that write, every
  later one, and Python's own flush at exit succeed.
  """

  def __init__(self, stream, fd: int):
    self._stream = stream
    self._fd = fd

  def write(self, text):
    try:
      return self._stream.write(text)
    except (OSError, ValueError):
      self._gone()
      return len(text)

  def flush(self):
    try:
      self._stream.flush()
    except (OSError, ValueError):
      self._gone()

  def _gone(self) -> None:
    _to_null(self._fd)
    try:
      self._stream.flush()  # What the stream held goes to the null device.
    except (OSError, ValueError):
      pass

  def __getattr__(self, name):
    return getattr(self._stream, name)


_listed = False
# What CUDA logs when it finds no device to initialize.
_NO_GPU_NOISE = b"failed call to cuInit"


def _list_devices_once() -> None:
  """Lists the physical devices; see the module docstring."""
  global _listed
  if _listed or "tensorflow" not in sys.modules:
    return
  _listed = True
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top
  if glob.glob("/dev/nvidia*"):
    tf.config.list_physical_devices()
    return
  sys.stderr.flush()
  saved = os.dup(2)
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      tf.config.list_physical_devices()
    finally:
      # Also on a signal's exit: what was logged is shown, less the noise.
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().splitlines(keepends=True)
              if _NO_GPU_NOISE not in line]
      os.write(2, b"".join(kept))
