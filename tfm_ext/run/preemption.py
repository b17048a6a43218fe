"""Graceful preemption: on SIGTERM, SIGINT or SIGHUP, save the step, exit 42.

What a signal does is decided here, by when it comes:

    before the run (the imports)   exit 42 at once: `tfm_ext.run.
                                   _startup`, the one piece that loads
                                   before TensorFlow
    while the parts are built      exit 42 once they are, before anything is
                                   written (`SignalWatcher.check_start`:
                                   `StartUpInterrupted`)
    while training                 the loop stops after the step in flight
                                   (`stop_within_a_step`), its summaries are
                                   written, a checkpoint is saved at that
                                   step, exit 42 (`SaveAndStopIfPreempted`).
                                   On several workers a signal on any of
                                   them stops every one after the same step
                                   (each step ends with a one-number
                                   all-reduce of the workers' stop flags),
                                   and all save at it; if a worker that
                                   does not answer (stopped, frozen, cut
                                   off) holds a collective, it ends where
                                   it waits, unsaved, exit 42
                                   (`SignalWatcher.watch_peers`)
    while a training run evaluates the evaluation ends, then as above
    while an evaluator runs        it stops between evaluations, saves
                                   nothing, exit 42 (`SignalWatcher.stopping`,
                                   `check_stopped`)
    in any other mode              the mode runs to its end (an `eval`, an
                                   `export`)
    a second signal                the job ends at once without saving, exit
                                   42 (`SecondSignal`), whatever the code it
                                   interrupted raised of it (or swallowed: a
                                   finalizer's is raised again); if the main
                                   thread does not take it within a second
                                   (inside TensorFlow), the watcher's thread
                                   says it and ends the process, exit 42
    once the run's outcome is      ignored (`SignalWatcher(ignore_after=
    written                        True)`, the driver's): the process is
                                   already ending with its exit code (Python
                                   resets its handlers to the default as it
                                   exits: a signal would end it with 143)

Each signal is said on the console as it comes, whatever the main thread
is doing. Python runs a signal handler only between two bytecodes of the
main thread, so while the main thread is inside a traced training loop
(thousands of steps, minutes on an accelerator) the handler waits, and two
signals of one kind that come meanwhile run it once. The C handler writes
each signal at once to Python's wakeup file descriptor: `SignalWatcher`'s
thread reads it there, counts the signals, says them, and sets the stop
variable the training loop reads at every step (`stop_within_a_step`).

42 (`EXIT_PREEMPTED`) is the restart code TensorFlow's
`PreemptionCheckpointHandler` uses: a supervisor that restarts on it resumes
from the checkpoint saved.

On several workers every decision to stop is agreed (`any_worker`): the
loop's stop flag after each step, and, after each loop, whether any worker
had a signal or an action asked to stop. Each worker then saves at the same
step (a save is a collective) and exits: 42 after a signal on any of them,
0 after a stop asked. TensorFlow's `PreemptionCheckpointHandler` (which
TFM builds for multi-worker jobs) is not used: it watches SIGTERM only, acts
at the loop's end, and first probes the GCE metadata server over the
network to learn its platform.
"""

import _thread
import os
import signal
import sys
import threading
from typing import Callable, List, Optional, Sequence
import weakref

from absl import logging
import orbit
import tensorflow as tf

from official.core import base_trainer

from tfm_ext.base import signalled
from tfm_ext.base import startup
from tfm_ext.base.errors import EXIT_PREEMPTED
# Raised here; defined on the ground floor, which actions catch them from.
from tfm_ext.base.errors import Preempted  # pylint: disable=unused-import
from tfm_ext.base.errors import Stopped  # pylint: disable=unused-import
from tfm_ext.run import strategies

SIGNALS = startup.SIGNALS


class StartUpInterrupted(Exception):
  """A signal came before the run's first step: nothing to save yet.

  Raised once the parts are built, before anything is written to
  `model_dir`; the launcher exits with `EXIT_PREEMPTED` without writing a run
  summary. (Before the parts, `tfm_ext.base.startup` ends the process.)
  """

  def __init__(self, signal_name: str):
    super().__init__(startup.message(signal_name))


class SecondSignal(KeyboardInterrupt):
  """A second signal: the job ends at once, without saving.

  The run's error boundary (`tfm_ext.base.failures`) prints one `aborted:` line
  naming the last checkpoint and exits 42; the log file keeps where it
  struck.
  """


class SignalWatcher:
  """Records a signal of `SIGNALS` instead of dying; a second one aborts.

  Use as a context manager, from the main thread; the previous handlers
  come back on exit (`ignore_after=True`: the signals are ignored from
  then on, for a process whose outcome is decided). See the module
  docstring for what each signal does and who says it.
  """

  # How long the main thread has to take a second signal before the
  # watcher's thread ends the process itself.
  ABORT_GRACE_SECONDS = 1.0
  # How long a multi-worker run has, after a signal, to reach its
  # workers' agreement to stop before the watcher asks whether a silent
  # peer holds it (`watch_peers`), and then again between two asks.
  HELD_SECONDS = 0.5

  def __init__(self, signals: Sequence[int] = SIGNALS,
               ignore_after: bool = False):
    self._signals = tuple(signals)
    self._ignore_after = ignore_after
    self._previous = {}
    self.received: Optional[int] = None
    self._second: Optional[int] = None
    self._raised = False  # The main thread raised `SecondSignal`.
    # Signals counted by the handler [False] and by the thread [True].
    self._counts = {False: 0, True: 0}
    self._seen = 0
    self._lock = threading.Lock()
    self._wakeup = None  # (read fd, write fd, previous wakeup fd)
    self._unraisable_hook = None  # The hook before `_unraisable`.
    self._thread: Optional[threading.Thread] = None
    self._loop_stops: List[tf.Variable] = []
    self._silent_peer: Optional[Callable[[], str]] = None
    self._agreed = threading.Event()  # `agreed_to_stop`.
    self._after_first = ("finishing what is in flight, then exiting; a "
                         "second signal ends the job at once without saving")

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.received).name if self.received else ""

  def __enter__(self) -> "SignalWatcher":
    for sig in self._signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    if self._signals:
      signalled.clear()
      read_fd, write_fd = os.pipe()
      os.set_blocking(write_fd, False)
      previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
      self._wakeup = (read_fd, write_fd, previous)
      self._thread = threading.Thread(target=self._read_signals,
                                      name="tfm_ext-signals", daemon=True)
      self._thread.start()
      self._unraisable_hook = sys.unraisablehook
      sys.unraisablehook = self._unraisable
    return self

  def __exit__(self, exc_type, error, traceback) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, signal.SIG_IGN if self._ignore_after else handler)
    self._previous.clear()
    if self._wakeup:
      read_fd, write_fd, previous = self._wakeup
      signal.set_wakeup_fd(previous)
      os.close(write_fd)  # The thread reads the end of the pipe and returns.
      self._thread.join()
      os.close(read_fd)
      self._wakeup = self._thread = None
      sys.unraisablehook = self._unraisable_hook
    if error is None or isinstance(error, Exception):
      self.check_aborted(error)

  def check_aborted(self, error: Optional[BaseException]) -> None:
    """Raises `SecondSignal` from `error` if a second signal came.

    The second signal's exception is raised wherever the signal found the
    job, TensorFlow's tracing included, and the code it interrupted may
    raise something else of it (an `AttributeError` of a half-built
    object), or swallow it (None: the block ended as if none came):
    whatever comes out, the job was aborted.
    """
    if self._second is not None and not isinstance(error, SecondSignal):
      self._raised = True
      raise SecondSignal(signal.Signals(self._second).name) from error

  @property
  def stopping(self) -> bool:
    """Whether a signal came: a mode that stops on one stops now."""
    return self.received is not None

  def check_start(self) -> None:
    """Raises `StartUpInterrupted` if a signal came while the parts were
    built: nothing is written yet, nothing to save."""
    if self.received is not None:
      raise StartUpInterrupted(self.signal_name)

  def check_stopped(self, stops_on_signal: bool, step: int) -> None:
    """After a mode: raises `Preempted`, nothing saved, if it stops on a
    signal (an evaluator, `tfm_ext.run.modes.Mode.stops_on_signal`) and one
    came. A mode that trains raised it already, once it saved."""
    if self.received is not None and stops_on_signal:
      raise Preempted(step, self.signal_name, saved=False)

  def watch_peers(self, silent_peer: Callable[[], str]) -> None:
    """On the first signal, ends a run that a silent peer holds.

    For a multi-worker run: its way to a safe point (the step in flight,
    then the workers' agreement to stop) goes through collectives, which
    wait for every worker, and TensorFlow finds a peer that stopped
    answering (SIGSTOP, a frozen host, a cut network) only once its
    heartbeats time out (10 s and more). From the first signal, every
    `HELD_SECONDS` until the workers agreed (`agreed_to_stop`), the
    watcher asks `silent_peer()` (`tfm_ext.run.strategies.silent_peer`:
    '' while every peer answers); once it names one, the process ends
    where it waits, exit 42, with one line naming that peer and the last
    checkpoint (`failures.held`). Lost: the steps since that checkpoint
    (none is saved at the step in flight), and the chief's
    `run_summary.json` of this run (its trainer lease is left, for the
    relaunch to take over, as after a kill). Kept: every checkpoint and record
    written before; no save is cut short (they come after the agreement).
    While every peer answers, the run goes on to its save, however long
    its step.
    """
    self._silent_peer = silent_peer

  def agreed_to_stop(self) -> None:
    """Says the workers agreed to stop after a signal: what follows (the
    summaries, the save) waits for no peer, and is not cut short."""
    self._agreed.set()

  def after_first(self, what: str) -> None:
    """Sets what the first signal's console line says comes next."""
    self._after_first = what

  def loop_stop(self) -> tf.Variable:
    """A variable set to True on the first signal, for a loop to read.

    Create it outside a strategy's scope: it is one host variable, read by
    the loop's condition (`stop_within_a_step`), not a replicated one.
    """
    with tf.init_scope(), tf.device("CPU:0"):
      stop = tf.Variable(self.received is not None, trainable=False,
                         name="stop_at_next_step")
    self._loop_stops.append(stop)
    return stop

  def _handle(self, signum, frame) -> None:
    """The main thread's handler: counts the signal; raises on the second.

    It may run once for several signals (the main thread was inside
    TensorFlow meanwhile), and before or after the watcher's thread read
    the signal: each counts what it saw, and the higher count is the
    number of signals that came (`_count`).
    """
    del frame
    self._count(signum, by_thread=False)
    if self._second is not None and not self._raised:
      self._raised = True
      raise SecondSignal(signal.Signals(self._second).name)

  def _unraisable(self, unraisable) -> None:
    """Raises a swallowed `SecondSignal` again, at the next bytecode.

    Python cannot raise out of a finalizer (`__del__`: TensorFlow's objects
    have them), a weakref callback or the garbage collector: it prints
    "Exception ignored in" and a traceback, and the job would go on. The
    handler raised it where the signal found the main thread; this has it
    raised again once the main thread is out of there (a signal asked for
    now would be taken in this hook, which cannot raise either).
    """
    if (isinstance(unraisable.exc_value, SecondSignal)
        and self._second is not None):
      self._raised = False
      threading.Timer(0.01, _thread.interrupt_main,
                      args=(self._second,)).start()
      return
    self._unraisable_hook(unraisable)

  def _read_signals(self) -> None:
    """The watcher's thread: reads each signal from the wakeup fd."""
    read_fd = self._wakeup[0]
    while True:
      try:
        got = os.read(read_fd, 64)
      except OSError:
        return
      if not got:
        return
      for signum in got:
        # Only the signals this watcher handles: another handler's (TF's
        # multi-worker SIGTERM watcher) writes here too.
        if (signum in self._signals
            and signal.getsignal(signum) == self._handle
            and self._count(signum, by_thread=True) == 2):
          _thread.interrupt_main(signum)  # Its handler raises, if it can.
          threading.Timer(self.ABORT_GRACE_SECONDS, self._abort,
                          args=(signum,)).start()

  def _count(self, signum: int, by_thread: bool) -> int:
    """Counts a signal; acts on the first two; returns 1, 2, or 0 for one
    the other counter counted already (or a third).

    Only the count holds the lock: the acts (a log record, a variable
    assigned) come after. The main thread's handler may run inside a log
    handler's lock, and waits for this one: the watcher's thread must not
    wait for that log lock while it holds this one.
    """
    with self._lock:
      self._counts[by_thread] += 1
      seen = self._counts[by_thread]
      if seen <= self._seen or seen > 2:
        self._seen = max(self._seen, seen)
        return 0
      self._seen = seen
      if seen == 1:
        self.received = signum
      else:
        self._second = signum
    name = signal.Signals(signum).name
    if seen == 1:
      signalled.set()  # Every polling wait (`signalled.sleep`) ends now.
      # Eagerly, also from a handler that interrupted a tf.function's
      # tracing on the main thread.
      with tf.init_scope():
        for stop in self._loop_stops:
          stop.assign(True)
      _say(f"{name} received: {self._after_first}.", log=by_thread)
      if self._silent_peer is not None:
        threading.Thread(target=self._end_if_held, daemon=True,
                         name="tfm_ext-held").start()
    else:
      _log_off_main(f"Second {name}: exiting without a checkpoint.",
                    now=by_thread)
    return seen

  def _abort(self, signum: int) -> None:
    """Ends the process if the main thread did not take a second signal."""
    if self._raised or self._wakeup is None:
      return
    from tfm_ext.base import failures  # pylint: disable=g-import-not-at-top
    _end_now(failures.aborted(signal.Signals(signum).name),
             f"TensorFlow held the main thread {self.ABORT_GRACE_SECONDS:.0f}s "
             "after a second signal")

  def _end_if_held(self) -> None:
    """The held-run thread: see `watch_peers`."""
    while not self._agreed.wait(self.HELD_SECONDS):
      if self._wakeup is None:  # The watcher's block is over.
        return
      peer = self._silent_peer()
      if peer and not self._agreed.is_set():
        from tfm_ext.base import failures  # pylint: disable=g-import-not-at-top
        _end_now(failures.held(self.signal_name, peer),
                 f"{peer} did not answer while a collective held the run "
                 "after a signal")


def _end_now(failure, why: str) -> None:
  """Says `failure` and ends the process with its code, from the watcher's
  threads (the main one is held in TensorFlow, and may hold stderr)."""
  logging.info("%s: the signal watcher ends the process.", why)
  _say(failure.line())
  os._exit(failure.code)  # pylint: disable=protected-access


def _say(line: str, log: bool = True) -> None:
  """One line on stderr at once, from any thread, and in the log file.

  `log=False` from a signal handler on the main thread: the log line is
  written by a thread of its own (`_log_off_main`).
  """
  _log_off_main(line, now=log)
  try:
    os.write(sys.stderr.fileno(), (line + "\n").encode())
  except (OSError, ValueError):  # A closed console: the log keeps it.
    pass


def _log_off_main(line: str, now: bool) -> None:
  """Logs `line`, at once (`now`) or from a thread of its own.

  A signal handler runs on the main thread between two of its bytecodes,
  also inside the log file's own write (its buffered writer checks for
  signals when interrupted): a record logged from the handler there is a
  reentrant write, which `logging` prints as a '--- Logging error ---'
  traceback. A thread waits for the writer's lock instead.
  """
  if now:
    logging.info(line)
  else:
    threading.Thread(target=logging.info, args=(line,), daemon=True,
                     name="tfm_ext_signal_log").start()


# What the first signal's line says while a run trains (`stop_within_a_step`).
TRAINING_STOPS = (
    "stopping after the step in flight (an evaluation in flight ends "
    f"first), saving a checkpoint at that step, then exit {EXIT_PREEMPTED}; a "
    "second signal ends the job at once without saving")


def any_worker(strategy: Optional[tf.distribute.Strategy], flags):
  """Whether any worker's `flags` (a bool or vector of bools) is set.

  On several workers an all-reduce of `flags` across every replica: each
  worker gets the same answer at the same point, so all stop together.
  Without `strategy` (one worker), `flags` itself. Call it in cross-replica
  context, from a traced loop or eagerly.
  """
  flags = tf.convert_to_tensor(flags)
  if strategy is None:
    return flags

  def count():
    return tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(flags, tf.int32))

  return strategy.experimental_local_results(strategy.run(count))[0] > 0


def stop_within_a_step(trainer, watcher: SignalWatcher,
                       strategy: Optional[tf.distribute.Strategy] = None
                       ) -> bool:
  """Makes `trainer`'s training loop end after the step in flight on a signal.

  The loop is Orbit's (`orbit.StandardTrainer.create_train_loop_fn`, which
  TFM's `base_trainer.Trainer` and `CustomTrainer` use) with one change:
  its condition also reads `watcher.loop_stop()`, a host variable the
  watcher's thread sets on the first signal while the main thread runs the
  traced loop. The step in flight ends, the loop returns, and the train
  actions run as after any loop: `SaveAndStopIfPreempted` saves at that
  step. Orbit then logs that the loop ran fewer steps than asked; that
  warning is dropped for a stopped loop. A loop that would start once the
  variable is set runs nothing and returns no logs.

  With a multi-worker `strategy`, the condition is `any_worker` of the
  workers' variables, agreed before the loop's first step and after each
  step: one all-reduce of one number a step, and every worker stops after
  the same step; and a signal's way to the save is bounded when a silent
  peer holds it (`SignalWatcher.watch_peers`).

  Returns False, leaving the trainer as it is (a signal then waits for the
  loop's end), for a loop Orbit does not build: a trainer that overrides
  `create_train_loop_fn`, or a parameter server's (asynchronous) one.
  """
  if strategy is not None:  # Several workers: a silent one may hold it.
    watcher.watch_peers(lambda: strategies.silent_peer(strategy))
  options = getattr(trainer, "_train_options", None)
  if (options is None or getattr(trainer, "_is_async", False)
      or type(trainer).create_train_loop_fn not in _ORBIT_LOOPS):
    logging.info("%s builds its own training loop: a signal stops it at the "
                 "loop's end.", type(trainer).__name__)
    return False
  local_stop = watcher.loop_stop()
  watcher.after_first(TRAINING_STOPS)
  agreed, stopped = _agreed_stop(local_stop, strategy)
  _STOPPED_LOOP_WARNING.stops.append(weakref.ref(agreed))
  logging.get_absl_logger().addFilter(_STOPPED_LOOP_WARNING)  # Once.
  train = trainer.train

  def create_train_loop_fn():
    return _train_loop_fn(trainer, options, stopped, bool(strategy))

  def train_unless_stopped(num_steps):
    return _train_unless_stopped(train, trainer, agreed, num_steps)

  trainer.create_train_loop_fn = create_train_loop_fn
  trainer.train = train_unless_stopped
  return True


def _agreed_stop(local_stop: tf.Variable,
                 strategy: Optional[tf.distribute.Strategy]):
  """`(agreed, stopped)`: the variable that says every worker stops, and the
  function the loop's condition calls, which agrees it (`any_worker`)."""
  if strategy is None:  # One worker: its own signal decides.
    return local_stop, local_stop.read_value
  with tf.init_scope(), tf.device("CPU:0"):
    # What the workers agreed, the same on each.
    agreed = tf.Variable(False, trainable=False, name="stopped_loop")

  def stopped():
    stop = any_worker(strategy, local_stop.read_value())
    agreed.assign(stop)
    return stop
  return agreed, stopped


def _train_loop_fn(trainer, options, stopped, multi_worker: bool):
  """Orbit's `create_train_loop_fn`, its loop also ending on `stopped()`."""
  step_fn = trainer.train_step
  if options.use_tf_while_loop:
    loop_fn = _while_not_stopped(step_fn, stopped)
    if options.use_tpu_summary_optimization:
      return orbit.utils.LoopFnWithSummaries(loop_fn)
    return tf.function(loop_fn)
  if options.use_tf_function:
    step_fn = tf.function(step_fn)
  return _python_loop_until_stopped(
      step_fn, tf.function(stopped) if multi_worker else stopped)


def _train_unless_stopped(train, trainer, agreed: tf.Variable, num_steps):
  """`train(num_steps)`, unless the workers agreed to stop before it.

  Stopped between two loops: the next runs no step, and returns no logs
  (a loop's metrics over no step would be zeros in the summaries).
  """
  if agreed.numpy():
    return {}
  before = int(trainer.global_step.numpy())
  logs = train(num_steps)
  if agreed.numpy() and int(trainer.global_step.numpy()) == before:
    return {}
  return logs


# The loop builders whose loop `stop_within_a_step` rebuilds: Orbit's, and
# TFM's, which is Orbit's but for a parameter server.
_ORBIT_LOOPS = (orbit.StandardTrainer.create_train_loop_fn,
                base_trainer.Trainer.create_train_loop_fn)


def _while_not_stopped(step_fn, stopped):
  """Orbit's `create_tf_while_loop_fn`, also ending once `stopped()`."""

  def loop_fn(iterator, num_steps):
    if not isinstance(num_steps, tf.Tensor):
      raise ValueError("`num_steps` should be a `tf.Tensor`: a Python value "
                       "retraces the loop.")
    done = tf.constant(0, num_steps.dtype)
    # One read of a host variable a step (several workers: an all-reduce
    # of it): next to nothing beside a step, and the loop is Orbit's
    # otherwise.
    go = tf.logical_not(stopped())
    while tf.logical_and(done < num_steps, go):
      with tf.name_scope(""):  # Ops not named "while/...", as Orbit's.
        step_fn(iterator)
      done += 1
      go = tf.logical_not(stopped())

  return loop_fn


def _python_loop_until_stopped(step_fn, stopped):
  """Orbit's `create_loop_fn` (no state), stopping between steps."""

  def loop_fn(iterator, num_steps):
    done, num_steps = 0, int(num_steps)
    try:
      with tf.experimental.async_scope():
        while done < num_steps and not bool(stopped()):
          step_fn(iterator)
          done += 1
    except (StopIteration, tf.errors.OutOfRangeError):
      logging.info("The dataset iterator is exhausted after %d steps.", done)
      tf.experimental.async_clear_error()

  return loop_fn


class _StoppedLoopWarning:
  """Drops Orbit's warning of a loop short of its steps once stopped."""

  def __init__(self):
    # `stop_within_a_step`'s `agreed` variables, weakly.
    self.stops: List[weakref.ref] = []

  def filter(self, record) -> bool:
    if "did not update `global_step`" not in str(record.msg):
      return True
    self.stops = [ref for ref in self.stops if ref() is not None]
    return not any(bool(ref().numpy()) for ref in self.stops
                   if ref() is not None)


_STOPPED_LOOP_WARNING = _StoppedLoopWarning()


class SaveAndStopIfPreempted:
  """Orbit action: after a signal, save at the current step and raise.

  Also after a stop the run asked for (`stop.reason`: early stopping, an
  action's `context.stop`): it saves the same way and raises `Stopped`.

  Args:
    watcher: the `SignalWatcher` in force.
    checkpoint_manager: the run's `tf.train.CheckpointManager`.
    global_step: the trainer's global step.
    summary_manager: where this loop's output is written before stopping, as
      the controller would have written it after the action.
    stop: the run's stop requests (`tfm_ext.actions.plateau.Stop`).
    strategy: a multi-worker strategy: whether to stop, and whether to save,
      are agreed (`any_worker`) after every loop, so that every worker
      saves (a collective) and stops at the same step; a signal on any
      worker is a preemption of all.
  """

  def __init__(self, *, watcher: SignalWatcher,
               checkpoint_manager: tf.train.CheckpointManager,
               global_step: tf.Variable,
               summary_manager: Optional[orbit.utils.SummaryManager] = None,
               stop=None, strategy: Optional[tf.distribute.Strategy] = None):
    self._watcher = watcher
    self._checkpoint_manager = checkpoint_manager
    self._global_step = global_step
    self._summary_manager = summary_manager
    self._stop = stop
    self._agree = (tf.function(lambda flags: any_worker(strategy, flags))
                   if strategy is not None else None)

  def __call__(self, output) -> None:
    asked = self._stop.reason if self._stop is not None else None
    step = int(self._global_step.numpy())
    manager = self._checkpoint_manager
    signalled = self._watcher.received is not None
    unsaved = not (manager.latest_checkpoint or "").endswith(f"-{step}")
    if self._agree is not None:  # The same answers on every worker.
      signalled, stops, unsaved = (bool(flag) for flag in self._agree(
          tf.constant([signalled, asked is not None, unsaved])))
      if stops and asked is None:
        asked = "another worker asked the run to stop"
    if not signalled and asked is None:
      return
    if signalled:
      self._watcher.agreed_to_stop()  # Past the last collective.
    if self._summary_manager is not None and output:
      self._summary_manager.write_summaries(
          tf.nest.map_structure(orbit.utils.get_value, output))
      self._summary_manager.flush()
    if unsaved:
      manager.save(checkpoint_number=step, check_interval=False)
    manager.sync()
    if not signalled:
      raise Stopped(step, asked)
    raise Preempted(step, self._watcher.signal_name)
