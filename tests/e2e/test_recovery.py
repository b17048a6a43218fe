"""Divergence recovery: TFM's `recovery_*` and `loss_upper_bound`, NaN included.

Unit tests drive `DivergenceRecovery` with a real checkpoint manager; the
end-to-end ones train the `digits_nan` double, whose step 25 is NaN once
(`task.nan_times=1`, a transient fault) or every time it is trained.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from tfm_ext.base.errors import RunFailed

from conftest import numeric_tensors
from tfm_ext.actions import divergence


@pytest.fixture
def weights(tmp_path):
  """A step, a weight and a manager with a checkpoint at step 20."""
  step = tf.Variable(20, dtype=tf.int64)
  weight = tf.Variable(1.0)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(step=step, weight=weight), str(tmp_path),
      max_to_keep=2, step_counter=step)
  manager.save(checkpoint_number=20)
  return step, weight, manager


def _recovery(step, manager=None, **kwargs):
  return divergence.DivergenceRecovery(
      loss_name="training_loss", global_step=step,
      start_step=int(step.numpy()), input_in_checkpoint=True,
      checkpoint_manager=manager, **kwargs)


def _loop(recovery, step, to_step, loss):
  step.assign(to_step)
  recovery({"training_loss": tf.constant(loss)})


def test_without_trials_a_nan_loop_fails_naming_its_steps(weights):
  step, _, manager = weights
  recovery = _recovery(step, manager)
  _loop(recovery, step, 21, 0.5)  # The one-step first loop.
  _loop(recovery, step, 30, 0.5)
  with pytest.raises(RunFailed, match=r"in steps 31-40 \(one loop\).*"
                     "a resumed run reads the same batches"):
    _loop(recovery, step, 40, math.nan)
  single = _recovery(step, manager)
  with pytest.raises(RunFailed, match="not finite.* at step 41"):
    _loop(single, step, 41, math.inf)


def test_a_divergence_with_trials_left_restores_the_last_checkpoint(weights):
  step, weight, manager = weights
  recovery = _recovery(step, manager, max_trials=2)
  _loop(recovery, step, 21, 0.5)
  weight.assign(float("nan"))
  _loop(recovery, step, 30, math.nan)
  assert int(step.numpy()) == 20 and weight.numpy() == 1.0
  assert recovery.trials == 1
  _loop(recovery, step, 30, 0.4)  # The next loop starts from step 20.
  _loop(recovery, step, 40, math.nan)
  assert int(step.numpy()) == 20 and recovery.trials == 2
  with pytest.raises(RunFailed, match=r"in steps 21-30 \(one loop\)\. It "
                     "diverged 3 times; trainer.recovery_max_trials=2"):
    _loop(recovery, step, 30, math.nan)


def test_the_bound_counts_from_recovery_begin_steps_not_in_the_first_loop(
    weights):
  step, _, manager = weights
  recovery = _recovery(step, manager, max_trials=0, loss_upper_bound=10.0,
                       begin_steps=40)
  _loop(recovery, step, 21, 1e9)  # A single step's loss: not a loop's mean.
  _loop(recovery, step, 30, 1e9)  # Before recovery_begin_steps.
  _loop(recovery, step, 40, 10.0)  # At the bound is not above it.
  with pytest.raises(RunFailed, match=r"The training loss, 11, is above "
                     r"trainer.loss_upper_bound=10 in steps 41-50"):
    _loop(recovery, step, 50, 11.0)
  first = _recovery(step, manager)
  with pytest.raises(RunFailed, match="not finite"):  # NaN counts even then.
    _loop(first, step, 51, math.nan)


def test_nothing_to_restore_fails_instead_of_training_on_diverged_weights():
  step = tf.Variable(0, dtype=tf.int64)
  recovery = _recovery(step, None, max_trials=3)
  with pytest.raises(RunFailed, match="no checkpoint yet to recover from"):
    _loop(recovery, step, 1, math.nan)


def test_the_loop_that_reaches_recovery_begin_steps_is_held_to_the_bound(
    weights):
  # TFM's RecoveryCondition compares the global step at the loop's end.
  step, _, manager = weights
  recovery = _recovery(step, manager, max_trials=0, loss_upper_bound=10.0,
                       begin_steps=30)
  _loop(recovery, step, 21, 0.5)  # The one-step first loop.
  with pytest.raises(RunFailed, match=r"above trainer.loss_upper_bound=10 "
                     r"in steps 22-30"):
    _loop(recovery, step, 30, 11.0)


def test_tfms_own_recovery_action_is_replaced_not_doubled(run_in_process,
                                                          tmp_path):
  from tfm_ext.run import assembly, driver, preemption  # pylint: disable=g-import-not-at-top
  from tfm_ext.config import params as params_lib  # pylint: disable=g-import-not-at-top
  del run_in_process  # Registers digits_nan.
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_nan", params_override="trainer.recovery_max_trials=2"))
  plan = driver.prepare(driver.RunRequest(
      experiment="digits_nan", mode="train", model_dir=str(tmp_path),
      params=params))
  parts = assembly.assemble(plan, preemption.SignalWatcher(signals=()))
  kinds = [type(a).__name__ for a in parts.controller.train_actions]
  assert kinds.count("DivergenceRecovery") == 1
  assert "ConditionalAction" not in kinds, kinds


TRANSIENT = ("trainer.train_steps=40,trainer.steps_per_loop=10,"
             "trainer.checkpoint_interval=10,trainer.summary_interval=10,"
             "task.nan_at_step=25,")


def test_a_transient_nan_is_recovered_and_training_reaches_train_steps(
    run_in_process, tmp_path, capsys):
  summary, _ = run_in_process(
      "digits_nan", "train", tmp_path,
      TRANSIENT + "task.nan_times=1,trainer.recovery_max_trials=1")
  assert summary.status == "completed", summary.message
  assert summary.global_step == 40
  out = capsys.readouterr().out
  assert ("recovery 1/1: The training loss is not finite (NaN or inf) in "
          "steps 21-30 (one loop). Restored") in out, out
  latest = tf.train.latest_checkpoint(str(tmp_path))
  assert latest.endswith("ckpt-40")
  for name, value in numeric_tensors(latest).items():
    if value.dtype.kind == "f":
      assert np.isfinite(value).all(), name


def test_a_lasting_nan_uses_its_trials_then_fails_with_the_last_good_checkpoint(
    run_in_process, tmp_path):
  summary, _ = run_in_process(
      "digits_nan", "train", tmp_path,
      TRANSIENT + "trainer.recovery_max_trials=2")
  assert summary.status == "failed"
  assert ("in steps 21-30 (one loop). It diverged 3 times; "
          "trainer.recovery_max_trials=2.") in summary.message
  latest = tf.train.latest_checkpoint(str(tmp_path))
  assert latest.endswith("ckpt-20"), latest
  assert latest in summary.message
  for name, value in numeric_tensors(latest).items():
    if value.dtype.kind == "f":
      assert np.isfinite(value).all(), name


def test_negative_trials_turn_the_check_off_as_in_tfm(run_in_process,
                                                      tmp_path):
  summary, _ = run_in_process(
      "digits_nan", "train", tmp_path,
      TRANSIENT + "trainer.recovery_max_trials=-1")
  assert summary.status == "completed"
  assert math.isnan(summary.train_metrics["training_loss"])
