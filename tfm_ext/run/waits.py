"""A wait the start-up cannot bound: said while it lasts, ended by a signal.

Some of a start's calls wait inside TensorFlow's native code for as long as
something outside the process makes them: a cluster's strategy connects to
every task of `TF_CONFIG` and returns only once all answer. Python runs a
signal handler only between two bytecodes of the main thread, so while the
main thread waits there the start-up handlers (`startup.install_signals`)
never run: SIGTERM and Ctrl-C were lost, and nothing was printed.

    with waits.announced("the cluster of TF_CONFIG (chief 10.0.0.1:2222...)"):
      strategy = build_strategy(params)

A small process of its own (the interpreter's, without site) watches the
block, because a wait may also hold the interpreter's lock
(`multi_worker_mirrored` connects that way) and then no thread of this
process runs. It prints `waiting for <what> (10s)` after 10 s, then at 20,
40... seconds (at most every 5 minutes), and reads the signals from
Python's wakeup file descriptor, which Python's C handler writes at once,
whatever the main thread is doing. It passes each to a thread here, which
ends the process as the start-up handler would (its one `preempted:` line,
exit 42; nothing was written before) if the handler has not ended the
block within `grace` seconds. Where the lock is held that thread cannot
run either: the watcher then says so and ends the process with SIGKILL
(exit 137), which a supervisor restarts as it restarts 42.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import Iterator

from tfm_ext.base import startup
from tfm_ext.base.errors import EXIT_PREEMPTED

FIRST_SAY_SECONDS = 10.0
MOST_SAY_SECONDS = 300.0

# The watcher: argv is wake, relay, done, parent, first, grace, most, what.
_WATCHER = """
import os, select, signal, sys, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
  signal.signal(s, signal.SIG_IGN)  # Ctrl-C reaches the whole group.
wake, relay, done, parent = map(int, sys.argv[1:5])
first, grace, most = map(float, sys.argv[5:8])
what = sys.argv[8]
def say(line):
  try:
    os.write(2, (line + "\\n").encode())
  except OSError:
    pass
start = time.monotonic()
say_at = start + first
while True:
  ready = select.select([wake, done], [], [],
                        max(say_at - time.monotonic(), 0))[0]
  if done in ready:
    os._exit(0)
  if wake in ready:
    got = [b for b in os.read(wake, 64) if b]
    if got:
      os.write(relay, bytes(got[:1]))
      if not select.select([done], [], [], 3 * grace)[0]:
        name = signal.Signals(got[0]).name
        say(f"preempted: {name} received while waiting for {what}: nothing "
            "to save yet; TensorFlow holds the interpreter there, so the "
            "process ends by SIGKILL (exit 137): relaunch to restart.")
        os.kill(parent, signal.SIGKILL)
      os._exit(0)
    continue
  waited = time.monotonic() - start
  say(f"waiting for {what} ({waited:.0f}s)")
  say_at = start + min(2 * waited, waited + most)
"""


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
  wake_r, wake_w = os.pipe()
  relay_r, relay_w = os.pipe()
  done_r, done_w = os.pipe()
  os.set_blocking(wake_w, False)
  previous = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
  watcher = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-S", "-c", _WATCHER, str(wake_r), str(relay_w),
       str(done_r), str(os.getpid()), str(first), str(grace),
       str(MOST_SAY_SECONDS), what],
      pass_fds=(wake_r, relay_w, done_r), stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL)
  for fd in (wake_r, relay_w, done_r):
    os.close(fd)
  done = threading.Event()
  relayed = threading.Thread(target=_relayed, args=(what, relay_r, done, grace),
                             name="tfm_ext-wait", daemon=True)
  relayed.start()
  try:
    yield
  finally:
    done.set()
    signal.set_wakeup_fd(previous)
    os.close(done_w)  # The watcher ends; the relay's end then reads EOF.
    watcher.wait()
    relayed.join()
    os.close(relay_r)
    os.close(wake_w)


def _relayed(what: str, relay_r: int, done: threading.Event,
             grace: float) -> None:
  """Ends the process for a signal the watcher passes, unless `done` first."""
  while True:
    got = os.read(relay_r, 1)
    if not got:
      return
    if not done.wait(grace):
      _exit(got[0], what)


def _exit(signum: int, what: str) -> None:
  name = signal.Signals(signum).name
  try:
    os.write(sys.stderr.fileno(), (
        f"preempted: {startup.message(name, f'while waiting for {what}')}"
        "\n").encode())
  except (OSError, ValueError):  # A closed console: the exit code says it.
    pass
  os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access
