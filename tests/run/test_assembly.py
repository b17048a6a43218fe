"""Assembly: which parts a run gets, and the order its actions run in.

In-process runs of digits_convnet (and the `digits_nan` test double, which
the `run_in_process` fixture registers).
"""

import dataclasses
import signal
import tempfile

import numpy as np
import tensorflow as tf

from official.core import task_factory

from tfm_ext.config import params as params_lib
from tfm_ext.run import assembly
from tfm_ext.run import driver
from tfm_ext.run import preemption
from tfm_ext.run import strategies

TINY = ("trainer.train_steps=4,trainer.steps_per_loop=2,"
        "trainer.summary_interval=2,trainer.checkpoint_interval=4,"
        "trainer.validation_interval=4,trainer.validation_steps=2")


def _plan(experiment, mode, model_dir, override=""):
  params = params_lib.build(params_lib.ConfigSources(
      experiment=experiment, params_override=override))
  return driver.prepare(driver.RunRequest(
      experiment=experiment, mode=mode, model_dir=str(model_dir),
      params=params))


def test_a_nonfinite_loop_fails_before_a_pending_preemption_saves_it(
    run_in_process, tmp_path):
  del run_in_process  # Used for its registrations (digits_nan).
  plan = _plan("digits_nan", "train", tmp_path,
               "task.nan_at_step=1,trainer.train_steps=20,"
               "trainer.steps_per_loop=10,trainer.checkpoint_interval=10")
  watcher = preemption.SignalWatcher(signals=())
  train = plan.mode.run

  def signal_then_train(ctx):
    watcher.received = signal.SIGTERM  # Comes while the first loop runs.
    return train(ctx)

  plan = dataclasses.replace(
      plan, mode=dataclasses.replace(plan.mode, run=signal_then_train))
  summary = driver.execute(plan, watcher=watcher)
  # The loop's NaN fails the run; no checkpoint holds the NaN weights.
  assert summary.status == "failed", summary.message
  assert "not finite (NaN or inf) at step 1." in summary.message
  assert tf.train.latest_checkpoint(str(tmp_path)) is None


def test_a_worker_that_restored_the_chiefs_checkpoint_skips_init_fn(
    run_in_process, tmp_path, monkeypatch):
  chief_dir = tmp_path / "chief"
  run_in_process("digits_convnet", "train", chief_dir, TINY)
  latest = tf.train.latest_checkpoint(str(chief_dir))
  # A pretrained checkpoint (task.init_checkpoint) of zeros: what init_fn
  # would load over the chief's weights.
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet"))
  task = task_factory.get_task(params.task)
  zeros = task.build_model()
  assert zeros.weights
  for weight in zeros.weights:
    weight.assign(tf.zeros_like(weight))
  pretrained = tf.train.Checkpoint(model=zeros).write(
      str(tmp_path / "pretrained" / "ckpt"))
  plan = _plan("digits_convnet", "eval", chief_dir,
               f"task.init_checkpoint={pretrained}")
  # This process as a worker other than the chief of a multi-worker run.
  monkeypatch.setattr(strategies, "is_multi_worker", lambda strategy: True)
  monkeypatch.setattr(type(plan.strategy.extended), "should_checkpoint",
                      property(lambda self: False))
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

  parts = assembly.assemble(plan, preemption.SignalWatcher(signals=()))
  assert not parts.chief
  assert parts.write_dir.startswith(str(tmp_path / "tfm_ext_worker"))
  # Its checkpoint manager found nothing in its own (temp) dir; the weights
  # are still the chief's checkpoint's.
  chief = task.build_model()
  tf.train.Checkpoint(model=chief).read(latest).expect_partial()
  assert parts.trainer.model.weights
  for ours, theirs in zip(parts.trainer.model.weights, chief.weights):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
