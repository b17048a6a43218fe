"""EMA (`trainer.optimizer_config.ema`) under every strategy, none included."""

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import numeric_tensors
import downstream_registry

EMA = ("trainer.train_steps=20,trainer.steps_per_loop=10,"
       "trainer.checkpoint_interval=10,trainer.validation_interval=10,"
       "trainer.validation_steps=1,"
       "trainer.optimizer_config.ema.average_decay=0.9")


@pytest.mark.parametrize("strategy", ["off", "mirrored", "one_device"])
def test_ema_evaluates_and_saves_the_average_with_any_strategy(
    run_in_process, tmp_path, strategy):
  # `off` builds no strategy (TF's default); `mirrored` on one CPU, TFM's
  # one-replica MirroredStrategy.
  summary, _ = run_in_process(
      "digits_convnet", "train_and_eval", tmp_path,
      EMA + f",runtime.distribution_strategy={strategy}", trainer="recording")
  assert summary.status == "completed" and summary.global_step == 20
  assert 0.0 < summary.eval_metrics["accuracy"] <= 1.0
  averaged = tf.train.latest_checkpoint(str(tmp_path / "ema_checkpoints"))
  trained = tf.train.latest_checkpoint(str(tmp_path))
  assert averaged.endswith("-20") and trained.endswith("ckpt-20")
  # The EMA checkpoint holds the averages in the model's place, and after
  # the last evaluation the model holds the trained weights again (TFM's
  # swap adds and subtracts, so to float32 rounding).
  kernel = "model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"
  assert not np.allclose(numeric_tensors(averaged)[kernel],
                         numeric_tensors(trained)[kernel])
  model = downstream_registry.RecordingTrainer.instances[-1].model
  np.testing.assert_allclose(model.layers[0].kernel.numpy(),
                             numeric_tensors(trained)[kernel], atol=1e-6)
  assert os.path.exists(str(tmp_path / "best_ckpt" / "info.json"))
