"""Whether the run got a stop signal, and the one sleep that hears it.

Once the run's `tfm_ext.run.preemption.SignalWatcher` has taken over from
the start-up's handlers, a signal no longer ends the process at once: its
handler records it, and every part of the run stops where it is safe. A
wait that sleeps between polls (the trainer lease watching a stale holder
or a competing claim, a store that does not answer) would hear of it only
when its sleep ends, and then only if it looks: a trainer waiting for a
stale lease exited 239 s after its SIGTERM. So every polling wait sleeps
with `sleep`, which returns as soon as the watcher `set`s the flag (from
its own thread, as the signal comes), and then looks (`came`).

Before the watcher (the start-up), a signal ends the process from its
handler (`tfm_ext.base.startup`), which Python runs inside any sleep of
the main thread; `sleep` is then a plain wait.
"""

import threading
import time

_came = threading.Event()
# How often `wait` looks at both events (a thread waits for one at a time).
_LOOK_SECONDS = 0.05


def set() -> None:  # pylint: disable=redefined-builtin
  """Records that a stop signal came: every `sleep` returns now."""
  _came.set()


def clear() -> None:
  """Forgets it: a new run (a watcher entered) starts without one."""
  _came.clear()


def came() -> bool:
  """Whether a stop signal came since the last `clear`."""
  return _came.is_set()


def sleep(seconds: float) -> None:
  """Sleeps `seconds`, or less: until a stop signal comes (`set`).

  Returns either way; the caller looks (`came`, or its run's check) and
  ends its wait.
  """
  _came.wait(max(seconds, 0.0))


def wait(done: threading.Event, seconds: float) -> bool:
  """Waits up to `seconds` for `done` or a stop signal; whether `done`."""
  deadline = time.monotonic() + max(seconds, 0.0)
  while not done.is_set() and not _came.is_set():
    left = deadline - time.monotonic()
    if left <= 0:
      break
    done.wait(min(_LOOK_SECONDS, left))
  return done.is_set()
