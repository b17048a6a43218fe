"""Whether the run got a stop signal, and the one sleep that hears it.

Once the run's `tfm_ext.run.preemption.SignalWatcher` has taken over from
the start-up's handlers, a signal no longer ends the process at once: its
handler records it, and every part of the run stops where it is safe. A
wait that sleeps between polls (the trainer lease watching a stale holder
or a competing claim) would hear of it only when its sleep ends, and then
only if it looks. So a polling wait of the run sleeps with `sleep`, which
returns as soon as the watcher `set`s the flag (from its own thread, as
the signal comes), and then looks (the run's `check_start`, which raises
once a signal came). The lease's waits, the evaluator's idle poll, the
driver's restart backoff and a starting run's store waits
(`tfm_ext.model_dir.files.listening`) do.

Before the watcher (the start-up), a signal ends the process from its
handler (`tfm_ext.base.startup`), which Python runs inside any sleep of
the main thread; `sleep` is then a plain wait.
"""

import threading

_came = threading.Event()


def set() -> None:  # pylint: disable=redefined-builtin
  """Records that a stop signal came: every `sleep` returns now."""
  _came.set()


def clear() -> None:
  """Forgets it: a new run (a watcher entered) starts without one."""
  _came.clear()


def came() -> bool:
  """Whether a stop signal came (`set`) since the run began."""
  return _came.is_set()


def sleep(seconds: float) -> None:
  """Sleeps `seconds`, or less: until a stop signal comes (`set`).

  Returns either way; the caller then looks (its run's check: the lease's
  `interrupt`) and ends its wait.
  """
  _came.wait(max(seconds, 0.0))

