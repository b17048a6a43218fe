"""A wait the start-up cannot bound: said while it lasts, ended by a signal.

Some of a start's calls wait for as long as something outside the process
makes them: a cluster's strategy connects to every task of `TF_CONFIG`
and returns only once all answer; a TPU's, once the TPU answers.

    with waits.announced("the cluster of TF_CONFIG to answer (...)"):
      waits.until_answered(cluster)      # In Python: any signal ends it.
      with waits.connect_released():     # TensorFlow's connect, off the
        strategy = build_strategy(params)  # main thread: any signal too.

Within the block each of SIGTERM, SIGINT and SIGHUP prints its one line

    preempted: SIGTERM received while waiting for the cluster of TF_CONFIG to answer (...): nothing to save yet; exit 42 to be restarted.

and ends the process with 42 (nothing is written before the strategy is
built), wherever the main thread waits:

* in Python (`until_answered`'s polls, a sleep): the block's own handler
  runs between two bytecodes and exits at once;
* in native code (a TPU's connect, a call that holds the interpreter's
  lock as TensorFlow's bindings do): Python runs a handler only between
  two bytecodes of the main thread, and no thread of this process runs
  while the lock is held. A small process of its own (the interpreter's, without
  site) watches the block: it reads each signal from Python's wakeup file
  descriptor, which Python's C handler writes at once, whatever the main
  thread does; if the process has not ended `grace` seconds later, it
  prints the line and sends `EXIT_SIGNAL` (signal 42, a real-time one),
  whose handler here is the C library's `_exit`, installed natively: it
  runs without the interpreter and exits with its signal's number, 42.

The watcher also prints `waiting for <what> (10s)` after 10 s, then at 20,
40... seconds (at most every 5 minutes).

So that a cluster's wait is in Python, `until_answered` waits, before
TensorFlow connects, until every other task's address takes a TCP
connection, while this task's own address takes them too (a placeholder
socket, closed before TensorFlow listens there): every task of the
cluster then passes it, and TensorFlow's connect, which follows, meets
tasks that are up. What stays in native code is a peer lost between the
two. There TensorFlow's coordination service takes SIGTERM for itself (its
preemption notifier installs a C handler that only sets a flag, before it
connects), so `connect_released` runs the connect where a signal can end
it: on a thread of its own, without the interpreter's lock, while the
main thread waits in Python, puts the block's handlers back over
TensorFlow's every `TAKE_BACK_SECONDS`, and runs them as a signal comes.
A SIGTERM within those few milliseconds after TensorFlow installs its
handler is TensorFlow's, and lost.
"""

import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import types
from typing import Callable, Iterator, List, Optional, Sequence

from tfm_ext.base import signalled
from tfm_ext.base import startup
from tfm_ext.base.errors import EXIT_PREEMPTED
from tfm_ext.base.errors import UsageError

FIRST_SAY_SECONDS = 10.0
MOST_SAY_SECONDS = 300.0
# How often `until_answered` tries every other task.
POLL_SECONDS = 0.2
# The signal the watcher ends a process held in native code with: its
# handler, the C library's `_exit`, is given the signal's number, which is
# the exit code (Linux: SIGRTMIN + 8, used by nothing else).
EXIT_SIGNAL = EXIT_PREEMPTED
# How often the main thread puts its SIGTERM handler back over
# TensorFlow's while the cluster connect runs (`connect_released`): the
# most a SIGTERM can come after TensorFlow installs its handler and be
# TensorFlow's.
TAKE_BACK_SECONDS = 0.005
# In the watcher's line, where the signal's name goes.
_NAME = "<signal>"

# The watcher: argv is wake, done, parent, exit signal, first, grace,
# most, what, line.
_WATCHER = """
import os, select, signal, sys, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
  signal.signal(s, signal.SIG_IGN)  # Ctrl-C reaches the whole group.
wake, done, parent, exit_signal = map(int, sys.argv[1:5])
first, grace, most = map(float, sys.argv[5:8])
what, line = sys.argv[8:10]
stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
def say(text):
  try:
    os.write(2, (text + "\\n").encode())
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
    got = [b for b in os.read(wake, 64) if b in stops]
    if got and not select.select([done], [], [], grace)[0]:
      say(line.replace("%s", signal.Signals(got[0]).name))
      os.kill(parent, exit_signal)
      os._exit(0)
    continue
  waited = time.monotonic() - start
  say(f"waiting for {what} ({waited:.0f}s)")
  say_at = start + min(2 * waited, waited + most)
""" % _NAME


@contextlib.contextmanager
def announced(what: str, first: float = FIRST_SAY_SECONDS,
              grace: float = 1.0) -> Iterator[None]:
  """Says what the block waits for and ends it on a signal; see the module.

  Only from the main thread (Python's wakeup fd and handlers are its), and
  only in the start-up (before anything is written: the process may end at
  once). The signal handlers in force before the block are put back after
  it, also over one TensorFlow installed meanwhile.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  during = f"while waiting for {what}"
  previous = {sig: signal.signal(
      sig, lambda signum, _: startup.exit_preempted(signum, during))
              for sig in startup.SIGNALS}
  wake_r, wake_w = os.pipe()
  done_r, done_w = os.pipe()
  os.set_blocking(wake_w, False)
  previous_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
  disarm = _arm_native_exit()
  watcher = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-S", "-c", _WATCHER, str(wake_r), str(done_r),
       str(os.getpid()), str(EXIT_SIGNAL), str(first), str(grace),
       str(MOST_SAY_SECONDS), what,
       f"preempted: {startup.message(_NAME, during)}"],
      pass_fds=(wake_r, done_r), stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL)
  for fd in (wake_r, done_r):
    os.close(fd)
  try:
    yield
  finally:
    os.close(done_w)  # The watcher ends.
    watcher.wait()
    signal.set_wakeup_fd(previous_fd)
    os.close(wake_w)
    disarm()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _arm_native_exit() -> Callable[[], None]:
  """Makes `EXIT_SIGNAL` end the process with 42 without the interpreter;
  returns what puts its previous handler back."""
  if not (signal.SIGRTMIN <= EXIT_SIGNAL <= signal.SIGRTMAX):
    return lambda: None  # Not Linux: the signal then ends it as signals do.
  libc = ctypes.CDLL(None)
  libc.signal.restype = ctypes.c_void_p
  libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
  before = libc.signal(EXIT_SIGNAL, ctypes.cast(libc._exit, ctypes.c_void_p))  # pylint: disable=protected-access
  return lambda: libc.signal(EXIT_SIGNAL, before)


@contextlib.contextmanager
def connect_released() -> Iterator[None]:
  """Within it, TensorFlow's cluster connect runs where a signal ends it.

  `multi_worker_mirrored`'s strategy connects in `TFE_EnableCollectiveOps`,
  which TensorFlow's Python binding calls holding the interpreter's lock,
  and which installs the coordination service's SIGTERM handler (it only
  sets a flag) before it waits for every task. Within the block that call
  goes through TensorFlow's C API (`ctypes`: the lock released) on a
  thread of its own, and the main thread waits for it in Python, putting
  its SIGTERM handler back over TensorFlow's every `TAKE_BACK_SECONDS`: a
  signal runs the handler in force (`announced`'s: exit 42) at once. The
  call's error is raised as the binding raises it. Off the main thread, or
  where the C API is not found, the block changes nothing. Nothing of ours
  listens to TensorFlow's SIGTERM notifier (`tfm_ext.run.preemption`: not
  TensorFlow's `PreemptionCheckpointHandler`).
  """
  from tensorflow.python import pywrap_tfe  # pylint: disable=g-import-not-at-top
  api = _collective_api()
  if api is None or threading.current_thread() is not threading.main_thread():
    yield
    return
  bound = pywrap_tfe.TFE_EnableCollectiveOps
  pywrap_tfe.TFE_EnableCollectiveOps = (
      lambda context, server_def: _enable_released(api, context, server_def))
  try:
    yield
  finally:
    pywrap_tfe.TFE_EnableCollectiveOps = bound


def _collective_api() -> Optional[types.SimpleNamespace]:
  """The C API functions `_enable_released` calls, or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    lib = ctypes.CDLL(os.path.join(tf.sysconfig.get_lib(),
                                   "libtensorflow_cc.so.2"))
    api = types.SimpleNamespace(
        enable=lib.TFE_EnableCollectiveOps, new_status=lib.TF_NewStatus,
        code=lib.TF_GetCode, message=lib.TF_Message,
        delete_status=lib.TF_DeleteStatus,
        # A function of its own: `ctypes.pythonapi`'s is everyone's.
        pointer=ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object,
                                  ctypes.c_char_p)(
                                      ("PyCapsule_GetPointer",
                                       ctypes.pythonapi)))
  except (OSError, AttributeError):
    return None
  api.enable.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                         ctypes.c_void_p)
  api.enable.restype = None
  api.new_status.restype = ctypes.c_void_p
  api.code.argtypes = api.message.argtypes = api.delete_status.argtypes = (
      ctypes.c_void_p,)
  api.message.restype = ctypes.c_char_p
  return api


def _enable_released(api: types.SimpleNamespace, context,
                     server_def: bytes) -> None:
  """`TFE_EnableCollectiveOps(context, server_def)` as `connect_released`
  runs it."""
  from tensorflow.python.framework import errors_impl  # pylint: disable=g-import-not-at-top
  status = api.new_status()
  connect = threading.Thread(
      target=api.enable, name="tfm_ext-cluster-connect", daemon=True,
      args=(api.pointer(context, None), server_def, len(server_def), status))
  connect.start()
  handler = signal.getsignal(signal.SIGTERM)
  while connect.is_alive():
    if handler is not None:  # Python's C handler over TensorFlow's.
      signal.signal(signal.SIGTERM, handler)
    connect.join(TAKE_BACK_SECONDS)
  # Only once the call is over: a signal's exception above leaves it alone.
  code, message = api.code(status), api.message(status)
  api.delete_status(status)
  if code:
    raise errors_impl.exception_type_from_error_code(code)(
        None, None, message.decode(errors="replace"))


def until_answered(own: str, others: Sequence[str],
                   poll: float = POLL_SECONDS) -> None:
  """Returns once each of `others` (host:port) takes a TCP connection.

  Meanwhile `own` (this task's host:port) takes them too, from a socket on
  its port that is closed on return, before TensorFlow listens there, so
  that every task of a cluster passes this wait (see the module). Call it
  inside `announced`: its polls are Python, so a signal ends it at once.

  Raises:
    UsageError: `own`'s port is taken on this host (TensorFlow could not
      listen there either).
  """
  placeholder = _listen(own) if own else None
  try:
    waiting: List[str] = list(others)
    while waiting:
      if placeholder is not None:
        _accept_all(placeholder)
      waiting = [address for address in waiting if not _answers(address)]
      if waiting:
        signalled.sleep(poll)
  finally:
    if placeholder is not None:
      placeholder.close()


def _listen(address: str) -> socket.socket:
  port = int(address.rpartition(":")[2])
  try:
    if socket.has_dualstack_ipv6():
      server = socket.create_server(("", port), family=socket.AF_INET6,
                                    dualstack_ipv6=True)
    else:
      server = socket.create_server(("", port))
  except OSError as e:
    raise UsageError(
        f"This task's address {address} in TF_CONFIG cannot be listened on "
        f"({e.strerror or e}): another process on this host has port {port}. "
        "Stop it, or give this task another port.") from None
  server.setblocking(False)
  return server


def _accept_all(server: socket.socket) -> None:
  """Accepts and closes what connected: a peer's probe, or TensorFlow's
  first try, which it makes again."""
  while select.select([server], [], [], 0)[0]:
    try:
      server.accept()[0].close()
    except OSError:
      return


def _answers(address: str) -> bool:
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
      return True
  except OSError:
    return False
