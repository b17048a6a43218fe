"""Preemption, resume and in-process recovery, with real processes and signals."""

import glob
import logging as std_logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

from absl import logging
import numpy as np
import orbit
import pytest
import tensorflow as tf

from conftest import DOUBLES_TRAIN, REPO, numeric_tensors
from tfm_ext.base import failures
from tfm_ext.run import preemption

SPL = 10  # steps_per_loop
RUN = ("--experiment=digits_convnet", "--mode=train_and_eval",
       "--params_override=trainer.train_steps=400,trainer.steps_per_loop=10,"
       "trainer.summary_interval=10,trainer.checkpoint_interval=100,"
       "trainer.validation_interval=200")


def _step(line):
  return int(re.match(r"step (\d+)/", line).group(1))


def _summary_steps(model_dir):
  steps = set()
  for path in glob.glob(f"{model_dir}/train/events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(path):
      if any(v.tag == "training_loss" for v in event.summary.value):
        steps.add(event.step)
  return steps


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_at_current_step_exits_42_and_relaunch_resumes(
    start_forked, launch_forked, tmp_path, sig):
  model_dir = tmp_path / "m"
  job = start_forked(*RUN, model_dir=model_dir)
  last = job.wait_for_line(lambda l: l.startswith("step ") and _step(l) >= 50)
  job.proc.send_signal(sig)
  run = job.finish()
  assert run.returncode == 42, run
  assert "preempted:" in run.stderr and "Traceback" not in run.stderr
  saved = int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])
  # The loop in flight when the signal came ends at most one loop later.
  assert _step(last) <= saved <= _step(last) + SPL, (last, saved)
  summary = run.summary()
  assert summary["status"] == "preempted"
  assert summary["global_step"] == saved
  assert saved in _summary_steps(model_dir)  # That loop's summary flushed.

  relaunch = launch_forked(*RUN, model_dir=model_dir)
  assert relaunch.returncode == 0, relaunch
  summary = relaunch.summary()
  assert summary["status"] == "completed"
  assert summary["global_step"] == 400
  assert summary["resumed_from_step"] == saved
  assert summary["resumes"] == 1
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-400")


def test_transient_error_rebuilds_and_resumes_in_process(launch_forked,
                                                         tmp_path):
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      "--trainer=flaky", "--restart_backoff_seconds=0.1",
                      "--params_override=trainer.train_steps=60,"
                      "trainer.steps_per_loop=10,"
                      "trainer.checkpoint_interval=10",
                      model_dir=tmp_path / "m", script=DOUBLES_TRAIN,
                      env={"FLAKY_AT_STEP": "30"})
  assert run.returncode == 0, run
  assert ("restart 1/3 after UnavailableError: injected: a peer became "
          "unavailable" in run.stdout), run
  summary = run.summary()
  assert summary["restarts"] == 1
  assert summary["global_step"] == 60
  # The rebuilt trainer resumed from the checkpoint of the last full loop.
  assert summary["resumed_from_step"] == 20
  assert summary["resumes"] == 1


def test_transient_errors_beyond_max_restarts_fail(launch_forked, tmp_path):
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      "--trainer=flaky", "--max_restarts=0",
                      "--params_override=trainer.train_steps=40,"
                      "trainer.steps_per_loop=10",
                      model_dir=tmp_path / "m", script=DOUBLES_TRAIN)
  assert run.returncode != 0
  assert "UnavailableError" in run.stderr and "Traceback" in run.stderr


@pytest.mark.slow
def test_nan_loss_names_its_loop_then_its_step_and_keeps_last_checkpoint(
    launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  override = ("--params_override=trainer.train_steps=60,"
              "trainer.checkpoint_interval=10,task.nan_at_step=25,"
              "trainer.steps_per_loop=")
  run = launch_forked("--experiment=digits_nan", "--mode=train",
                      override + "10", model_dir=model_dir,
                      script=DOUBLES_TRAIN)
  assert run.returncode == 3, run
  assert "not finite (NaN or inf) in steps 21-30 (one loop)" in run.stderr, run
  assert "trainer.steps_per_loop=1" in run.stderr
  assert "Traceback" not in run.stderr
  latest = tf.train.latest_checkpoint(str(model_dir))
  assert latest.endswith("ckpt-20"), latest
  for name, value in numeric_tensors(latest).items():
    if value.dtype.kind == "f":
      assert np.isfinite(value).all(), name
  assert run.summary()["status"] == "failed"
  # As the message says: one step a loop from the last checkpoint.
  run = launch_forked("--experiment=digits_nan", "--mode=train", override + "1",
                      model_dir=model_dir, script=DOUBLES_TRAIN)
  assert run.returncode == 3, run
  assert "not finite (NaN or inf) at step 25." in run.stderr, run
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
  # Without the input position in the checkpoint, the message says so.
  run = launch_forked("--experiment=digits_nan", "--mode=train",
                      override.replace(
                          "--params_override=", "--params_override="
                          "trainer.checkpoint_input_iterator=false,") + "10",
                      model_dir=tmp_path / "no_iterator", script=DOUBLES_TRAIN)
  assert run.returncode == 3, run
  assert "in steps 21-30 (one loop)" in run.stderr, run
  assert "a resumed run may read other batches" in run.stderr, run


@pytest.mark.slow
def test_corrupt_record_fails_clearly_and_keeps_last_checkpoint(
    launch_forked, tmp_path, data_dir):
  from experiments import digits_convnet  # pylint: disable=g-import-not-at-top
  source = digits_convnet.bundled_tfrecords("train")
  data = bytearray(open(source, "rb").read())
  good = tmp_path / "good.tfrecord"
  good.write_bytes(bytes(data))
  model_dir = tmp_path / "m"
  args = ("--experiment=digits_convnet", "--mode=train",
          f"--params_override=task.train_data.input_path={good},"
          "trainer.train_steps={steps},trainer.steps_per_loop=10,"
          "trainer.checkpoint_interval=10")
  first = launch_forked(*args[:2], args[2].format(steps=20),
                        model_dir=model_dir)
  assert first.returncode == 0, first

  middle = len(data) // 2
  data[middle:middle + 64] = bytes(64)  # Breaks a record's payload CRC.
  good.write_bytes(bytes(data))
  # The resumed iterator first drains its restored shuffle buffer (the whole
  # split), so the corrupt file is read again within the next epoch: run
  # long enough (3,200 more examples) to get there.
  second = launch_forked(*args[:2], args[2].format(steps=70),
                         model_dir=model_dir)
  assert second.returncode == 3, second
  assert "The run failed on its data while training at step" in second.stderr
  assert "corrupted record at" in second.stderr, second
  assert f"task.train_data.input_path='{good}'" in second.stderr
  assert "Traceback" not in second.stderr
  latest = tf.train.latest_checkpoint(str(model_dir))
  assert f"The last checkpoint, {latest}, is intact." in second.stderr
  step = int(numeric_tensors(latest)["global_step/.ATTRIBUTES/VARIABLE_VALUE"])
  assert 20 <= step < 70
  assert second.summary()["status"] == "failed"


@pytest.mark.parametrize("made_of_it", [
    None, AttributeError("a half-built object"), tf.errors.UnavailableError(
        None, None, "cancelled")], ids=["itself", "a bug", "transient"])
def test_a_second_signal_aborts_whatever_the_interrupted_code_raised(
    made_of_it):
  # The second signal's exception is raised wherever it finds the job, in
  # TensorFlow's tracing too, and the code there may raise another of it.
  with pytest.raises(preemption.SecondSignal) as aborted:
    with preemption.SignalWatcher(signals=(signal.SIGUSR1,)) as watcher:
      os.kill(os.getpid(), signal.SIGUSR1)
      assert watcher.stopping
      try:
        os.kill(os.getpid(), signal.SIGUSR1)
      except preemption.SecondSignal:
        if made_of_it is not None:
          raise made_of_it from None
        raise
  assert str(aborted.value) == "SIGUSR1"
  assert aborted.value.__cause__ is made_of_it


class _SignalledWhileFinalized:
  """An object whose finalizer is where the second signal finds the main
  thread, as TensorFlow's `AtomicFunction.__del__` was."""

  def __del__(self):
    os.kill(os.getpid(), signal.SIGUSR1)  # Handled here: Python cannot raise.


def test_a_second_signal_in_a_finalizer_still_aborts_without_a_traceback(
    capfd):
  # Python prints "Exception ignored in" for an exception out of a
  # finalizer and goes on: the job ran to its end without aborting.
  hook = sys.unraisablehook
  start = time.monotonic()
  with pytest.raises(preemption.SecondSignal) as aborted:
    with preemption.SignalWatcher(signals=(signal.SIGUSR1,)):
      os.kill(os.getpid(), signal.SIGUSR1)
      finalized = _SignalledWhileFinalized()
      del finalized
      for _ in range(3000):  # Not all slept: the signal is raised again.
        time.sleep(0.01)
  assert time.monotonic() - start < 10
  assert str(aborted.value) == "SIGUSR1"
  assert "Exception ignored" not in capfd.readouterr().err
  assert sys.unraisablehook is hook


def test_a_second_signal_that_code_swallowed_still_aborts_at_the_end():
  # A library's `except` took it, or turned it into an error that an
  # `except Exception` of ours went on after: the job still ends aborted.
  with pytest.raises(preemption.SecondSignal):
    with preemption.SignalWatcher(signals=(signal.SIGUSR1,)):
      os.kill(os.getpid(), signal.SIGUSR1)
      try:
        os.kill(os.getpid(), signal.SIGUSR1)
      except KeyboardInterrupt:
        pass
  with pytest.raises(preemption.SecondSignal) as reraised:
    with preemption.SignalWatcher(signals=(signal.SIGUSR1,)):
      os.kill(os.getpid(), signal.SIGUSR1)
      try:
        try:
          os.kill(os.getpid(), signal.SIGUSR1)
        except KeyboardInterrupt as e:
          raise ImportError("initialization failed") from e
      except Exception as e:  # pylint: disable=broad-except
        failures.reraise_interrupt(e)
        raise AssertionError("went on after the second signal") from e
  assert reraised.value.__cause__ is None  # The signal's own, not the error.


def test_an_error_after_one_signal_is_left_as_it_is():
  with pytest.raises(AttributeError):
    with preemption.SignalWatcher(signals=(signal.SIGUSR1,)):
      os.kill(os.getpid(), signal.SIGUSR1)
      raise AttributeError("a bug keeps its traceback")


class _SignalledMidRecord(std_logging.Handler):
  """A log handler that a signal interrupts while it writes its first record,
  as the log file's buffered writer is when a signal comes mid-write."""

  def __init__(self):
    super().__init__()
    self.writing = False
    self.reentrant = []  # Records begun while another was being written.
    self.records = []
    self.signalled = False

  def emit(self, record):
    if self.writing:
      self.reentrant.append(record.getMessage())
    self.writing = True
    try:
      if not self.signalled:
        self.signalled = True
        os.kill(os.getpid(), signal.SIGUSR1)  # Handled here, mid-write.
      self.records.append((record.getMessage(), threading.current_thread()))
    finally:
      self.writing = False


def test_a_signal_during_a_log_write_logs_nothing_into_that_write():
  # A handler that logged on the main thread re-entered the log file's
  # writer there: '--- Logging error ---' and a traceback on stderr.
  handler = _SignalledMidRecord()
  logger = logging.get_absl_logger()
  logger.addHandler(handler)
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.INFO)
  try:
    with preemption.SignalWatcher(signals=(signal.SIGUSR1,)) as watcher:
      logging.warning("a record being written")
      deadline = time.monotonic() + 10
      while len(handler.records) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
  finally:
    logging.set_verbosity(verbosity)
    logger.removeHandler(handler)
  assert watcher.stopping
  assert handler.reentrant == [], handler.reentrant
  said = [thread for message, thread in handler.records
          if message.startswith("SIGUSR1 received")]
  assert len(said) == 1 and said[0] is not threading.main_thread(), (
      handler.records)


def _endless_loop(stop=None):
  """A traced loop of a billion steps: minutes the main thread spends in
  TensorFlow; with `stop`, the loop `stop_within_a_step` builds."""
  steps = tf.Variable(0, dtype=tf.int64)

  def step(iterator):
    del iterator
    steps.assign_add(1)

  loop = (preemption._while_not_stopped(step, stop.read_value)  # pylint: disable=protected-access
          if stop is not None
          else orbit.utils.create_tf_while_loop_fn(step))
  return tf.function(loop), steps


def test_a_signal_stops_a_traced_loop_at_the_next_step():
  # Python's handler cannot run while the loop runs: the watcher's thread
  # reads the signal from the wakeup fd and sets the loop's stop variable.
  with preemption.SignalWatcher(signals=(signal.SIGUSR1,)) as watcher:
    loop, steps = _endless_loop(watcher.loop_stop())
    loop(None, tf.constant(10))  # Traced; 10 steps.
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    start = time.monotonic()
    loop(None, tf.constant(10**9))
    took = time.monotonic() - start
    assert watcher.stopping and watcher.signal_name == "SIGUSR1"
  assert took < 5, took
  assert 10 < int(steps.numpy()) < 10**9


_HELD = """
import os, signal, sys, time
import tensorflow as tf
from orbit import utils
from tfm_ext.run import preemption
steps = tf.Variable(0, dtype=tf.int64)
loop = tf.function(utils.create_tf_while_loop_fn(
    lambda it: steps.assign_add(1)))
with preemption.SignalWatcher():
  loop(None, tf.constant(1))
  print("looping", flush=True)
  loop(None, tf.constant(10**10))  # Reads no stop variable: hours.
print("the loop ended", flush=True)
"""


def test_a_second_signal_ends_a_process_tensorflow_holds_within_seconds(
    start_forked, tmp_path):
  # Forked as `start_forked` forks a launcher (the start-up is not the
  # point); the script takes no flags and ignores the --model_dir given.
  held = tmp_path / "held.py"
  held.write_text(_HELD)
  proc = start_forked(model_dir=tmp_path / "unused", script=str(held)).proc
  assert proc.stdout.readline() == "looping\n"
  time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.3)  # Two of one kind at once would be one signal.
  sent = time.monotonic()
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=30)
  assert proc.returncode == 42, (out, err)
  assert time.monotonic() - sent < 5
  assert "the loop ended" not in out
  said = [line for line in err.splitlines() if "SIGTERM" in line]
  assert said == [
      "SIGTERM received: finishing what is in flight, then exiting; a second "
      "signal ends the job at once without saving.",
      "aborted: a second SIGTERM: stopped at once without saving. Relaunch "
      "the same command to resume."], err


_LOGGING_WHEN_SIGNALLED = """
import logging as std_logging, os, signal, threading
from absl import logging
from tfm_ext.run import preemption

class Held(std_logging.Handler):
  # Holds its lock, as the log file's handler does while it writes, when
  # the signal comes; the main thread runs no bytecode meanwhile, so the
  # watcher's thread reads the signal first.
  done = False
  def emit(self, record):
    if self.done:
      return
    self.done = True
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    os.kill(os.getpid(), signal.SIGUSR1)  # Taken by another thread.
    threading.Event().wait(1.0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})

logging.set_verbosity(logging.INFO)
logging.get_absl_logger().addHandler(Held())
with preemption.SignalWatcher(signals=(signal.SIGUSR1,)) as watcher:
  logging.info("a record being written")
  print("stopping" if watcher.stopping else "not stopping", flush=True)
"""


def test_a_signal_while_the_main_thread_holds_a_log_lock_deadlocks_nothing(
    tmp_path):
  # The watcher's thread said the signal while it held the count's lock,
  # and waited for the log's; the main thread's handler, inside the log's
  # lock, waited for the count's: a trainer SIGTERMed mid-log hung for
  # good.
  script = tmp_path / "signalled_mid_log.py"
  script.write_text(_LOGGING_WHEN_SIGNALLED)
  done = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=REPO))
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout == "stopping\n"
  assert "SIGUSR1 received" in done.stderr


def test_a_signal_in_the_restart_backoff_ends_the_job_at_once(start_forked,
                                                              tmp_path):
  # The backoff before an in-process restart is a wait like any other.
  run = start_forked("--experiment=digits_convnet", "--mode=train",
                     "--trainer=flaky", "--restart_backoff_seconds=120",
                     "--params_override=trainer.train_steps=60,"
                     "trainer.steps_per_loop=10,"
                     "trainer.checkpoint_interval=10",
                     model_dir=tmp_path / "m", script=DOUBLES_TRAIN,
                     env={"FLAKY_AT_STEP": "30"})
  run.wait_for_line(lambda line: line.startswith("restart 1/3 after"))
  sent = time.monotonic()
  run.proc.send_signal(signal.SIGTERM)
  ended = run.finish(timeout=60)
  waited = time.monotonic() - sent
  assert ended.returncode == 42, ended
  assert waited < 5, waited
  assert "preempted: SIGTERM" in ended.stderr + ended.stdout, ended
  assert "Traceback" not in ended.stderr, ended
