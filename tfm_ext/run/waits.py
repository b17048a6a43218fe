"""A wait the start-up cannot bound: said while it lasts, ended by a signal.

Some of a start's calls wait inside TensorFlow's native code for as long as
something outside the process makes them: a cluster's strategy connects to
every task of `TF_CONFIG` and returns only once all answer. Python runs a
signal handler only between two bytecodes of the main thread, so while the
main thread waits there the start-up handlers (`_startup.install_signals`)
never run: SIGTERM and Ctrl-C were lost, and nothing was printed.

    with waits.announced("the cluster in TF_CONFIG (chief 10.0.0.1:2222...)"):
      strategy = build_strategy(params)

prints `waiting for <what> (10s)` after 10 s, then at 20, 40... seconds (at
most every 5 minutes), and watches the signals through Python's wakeup
file descriptor, which its C handler writes at once, whatever the main
thread is doing. A signal whose Python handler has not ended the block
within `grace` seconds ends the process as the start-up handler would:
its one `preempted:` line, exit 42, nothing written before.
"""

import contextlib
import os
import select
import signal
import sys
import threading
import time
from typing import Iterator

from absl import logging

from tfm_ext.run import _startup

FIRST_SAY_SECONDS = 10.0
MOST_SAY_SECONDS = 300.0


@contextlib.contextmanager
def announced(what: str, first: float = FIRST_SAY_SECONDS,
              grace: float = 1.0) -> Iterator[None]:
  """Says what the block waits for and ends it on a signal; see the module.

  Only from the main thread (Python's wakeup fd is its), and only in the
  start-up (before anything is written: the process may end at once).
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  done = threading.Event()
  watcher = threading.Thread(
      target=_watch, args=(what, read_fd, done, first, grace),
      name="tfm_ext-wait", daemon=True)
  watcher.start()
  try:
    yield
  finally:
    done.set()
    signal.set_wakeup_fd(previous)
    os.write(write_fd, b"\0")  # Wakes the watcher to see `done`.
    watcher.join()
    os.close(read_fd)
    os.close(write_fd)


def _watch(what: str, read_fd: int, done: threading.Event, first: float,
           grace: float) -> None:
  start = time.monotonic()
  say_at = start + first
  while not done.is_set():
    ready, _, _ = select.select([read_fd], [], [],
                                max(say_at - time.monotonic(), 0))
    if done.is_set():
      return
    if ready:
      signals = [b for b in os.read(read_fd, 64) if b]
      if signals and not done.wait(grace):
        _exit(signals[0], what)
      continue
    waited = time.monotonic() - start
    line = f"waiting for {what} ({waited:.0f}s)"
    logging.warning(line)
    try:
      print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # A closed console: the log has it.
      pass
    say_at = start + min(2 * waited, waited + MOST_SAY_SECONDS)


def _exit(signum: int, what: str) -> None:
  name = signal.Signals(signum).name
  try:
    os.write(sys.stderr.fileno(), (
        f"preempted: {_startup.message(name, f'while waiting for {what}')}"
        "\n").encode())
  except (OSError, ValueError):  # A closed console: the exit code says it.
    pass
  os._exit(_startup.EXIT_CODE)  # pylint: disable=protected-access
