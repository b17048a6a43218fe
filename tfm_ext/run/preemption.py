"""Graceful preemption: on SIGTERM, SIGINT or SIGHUP, save the step, exit 42.

What a signal does is decided here, by when it comes:

    before the run (the imports)   exit 42 at once: `tfm_ext.run.
                                   _startup`, the one piece that loads
                                   before TensorFlow
    while the parts are built      exit 42 once they are, before anything is
                                   written (`SignalWatcher.check_start`:
                                   `StartUpInterrupted`)
    while training                 the loop in flight ends, its summaries are
                                   written, a checkpoint is saved at the
                                   current step, exit 42
                                   (`SaveAndStopIfPreempted`; on several
                                   workers `CoordinatedSaveAndStop`)
    while an evaluator runs        it stops between evaluations, saves
                                   nothing, exit 42 (`SignalWatcher.stopping`,
                                   `check_stopped`)
    in any other mode              the mode runs to its end (an `eval`, an
                                   `export`)
    a second signal                the job ends at once without saving, exit
                                   42 (`SecondSignal`), whatever the code it
                                   interrupted raised of it

42 (`EXIT_CODE`) is the restart code TensorFlow's
`PreemptionCheckpointHandler` uses: a supervisor that restarts on it resumes
from the checkpoint saved.

`SaveAndStopIfPreempted` serves single-worker jobs. Multi-worker jobs use
`CoordinatedSaveAndStop`, TensorFlow's `PreemptionCheckpointHandler`: a
SIGTERM on any worker makes every worker save at the same step, then stop.
On a single worker the handler adds nothing over ours and first probes the
GCE metadata server over the network to learn its platform.
"""

import signal
from typing import Optional, Sequence

from absl import logging
import orbit
import tensorflow as tf

from tfm_ext.run import _startup

EXIT_CODE = _startup.EXIT_CODE
SIGNALS = _startup.SIGNALS


class Preempted(Exception):
  """Raised after the preemption checkpoint is saved, or by an evaluator.

  An evaluator (`saved=False`) has no checkpoint to save: it stops between
  evaluations.
  """

  def __init__(self, step: int, signal_name: str, saved: bool = True):
    done = (f"saved a checkpoint at step {step}" if saved else
            f"stopped evaluating at step {step}; nothing to save")
    super().__init__(f"{signal_name} received: {done}; exit {EXIT_CODE} to "
                     "be restarted.")
    self.step = step


class StartUpInterrupted(Exception):
  """A signal came before the run's first step: nothing to save yet.

  Raised once the parts are built, before anything is written to
  `model_dir`; the launcher exits with `EXIT_CODE` without writing a run
  summary. (Before the parts, `tfm_ext.run._startup` ends the process.)
  """

  def __init__(self, signal_name: str):
    super().__init__(_startup.message(signal_name))


class SecondSignal(KeyboardInterrupt):
  """A second signal: the job ends at once, without saving.

  The run's error boundary (`tfm_ext.run.failures`) prints one `aborted:` line
  naming the last checkpoint and exits 42; the log file keeps where it
  struck.
  """


class SignalWatcher:
  """Records a signal of `SIGNALS` instead of dying; a second one aborts.

  Use as a context manager; the previous handlers come back on exit.
  """

  def __init__(self, signals: Sequence[int] = SIGNALS):
    self._signals = tuple(signals)
    self._previous = {}
    self.received: Optional[int] = None
    self._second: Optional[int] = None

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.received).name if self.received else ""

  def __enter__(self) -> "SignalWatcher":
    for sig in self._signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, exc_type, error, traceback) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()
    if isinstance(error, Exception):
      self.check_aborted(error)

  def check_aborted(self, error: BaseException) -> None:
    """Raises `SecondSignal` from `error` if a second signal came.

    The second signal's exception is raised wherever the signal found the
    job, TensorFlow's tracing included, and the code it interrupted may
    raise something else of it (an `AttributeError` of a half-built
    object): whatever comes out, the job was aborted.
    """
    if self._second is not None and not isinstance(error, SecondSignal):
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

  def _handle(self, signum, frame) -> None:
    del frame
    if self.received is not None:
      # A second signal: the user (or the cluster) will not wait any longer.
      self._second = signum
      logging.warning("Second %s: exiting without a checkpoint.",
                      signal.Signals(signum).name)
      raise SecondSignal(signal.Signals(signum).name)
    self.received = signum
    logging.warning("%s received: finishing the loop in flight, then saving "
                    "a checkpoint and exiting with %d.",
                    signal.Signals(signum).name, EXIT_CODE)


class SaveAndStopIfPreempted:
  """Orbit action: after a signal, save at the current step and raise.

  Args:
    watcher: the `SignalWatcher` in force.
    checkpoint_manager: the run's `tf.train.CheckpointManager`.
    global_step: the trainer's global step.
    summary_manager: where this loop's output is written before stopping, as
      the controller would have written it after the action.
  """

  def __init__(self, *, watcher: SignalWatcher,
               checkpoint_manager: tf.train.CheckpointManager,
               global_step: tf.Variable,
               summary_manager: Optional[orbit.utils.SummaryManager] = None):
    self._watcher = watcher
    self._checkpoint_manager = checkpoint_manager
    self._global_step = global_step
    self._summary_manager = summary_manager

  def __call__(self, output) -> None:
    if self._watcher.received is None:
      return
    step = int(self._global_step.numpy())
    if self._summary_manager is not None and output:
      self._summary_manager.write_summaries(
          tf.nest.map_structure(orbit.utils.get_value, output))
      self._summary_manager.flush()
    manager = self._checkpoint_manager
    if not (manager.latest_checkpoint or "").endswith(f"-{step}"):
      manager.save(checkpoint_number=step, check_interval=False)
    manager.sync()
    raise Preempted(step, self._watcher.signal_name)


class CoordinatedSaveAndStop:
  """Orbit action for multi-worker jobs: TF's `PreemptionCheckpointHandler`.

  Built with the checkpoint manager, it installs the handler's SIGTERM
  watcher; after each loop every worker asks it whether any worker was
  signalled, and all save at the agreed step, then raise `Preempted`.
  """

  def __init__(self, *, strategy: tf.distribute.Strategy,
               checkpoint_manager: tf.train.CheckpointManager,
               global_step: tf.Variable):
    self._global_step = global_step

    def stop():
      raise Preempted(int(global_step.numpy()), "SIGTERM on a worker")

    self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint_manager,
        termination_config=tf.distribute.experimental.TerminationConfig(
            exit_fn=stop, grace_period=0))

  def __call__(self, output) -> None:
    del output
    self._handler.save_checkpoint_if_preempted(
        checkpoint_number=self._global_step, check_interval=False)
