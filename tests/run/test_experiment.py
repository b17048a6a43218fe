"""tfm_ext.run_experiment: TFM's arguments, TFM's return value.

TFM's own train_lib_test runs against it too (test_tfm_core_suites.py);
this checks what that suite leaves out, in-process on digits_convnet.
"""

import csv
import os

import pytest
import tensorflow as tf
import tf_keras

from official.core import task_factory

import tfm_ext
from tfm_ext.actions import curves
from tfm_ext.config import params as params_lib


def test_train_and_post_eval_returns_the_logs_of_its_evaluation(
    data_dir, tmp_path):
  del data_dir  # Sets TFM_EXT_DATA_DIR: the bundled digits records' cache.
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet",
      params_override="trainer.train_steps=20,trainer.steps_per_loop=10,"
      "trainer.summary_interval=10,trainer.checkpoint_interval=20,"
      "trainer.validation_interval=20"))
  strategy = tf.distribute.get_strategy()
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=str(tmp_path))

  model, logs = tfm_ext.run_experiment(
      distribution_strategy=strategy, task=task, mode="train_and_post_eval",
      params=params, model_dir=str(tmp_path))

  assert isinstance(model, tf_keras.Model)
  assert {"accuracy", "validation_loss"} <= set(logs), logs
  # The evaluation at the last step, as the run logged it.
  with open(os.path.join(tmp_path, curves.METRICS_CSV)) as f:
    rows = {int(row["step"]): row for row in csv.DictReader(f)}
  assert float(logs["accuracy"]) == pytest.approx(
      float(rows[20]["validation_accuracy"]), rel=1e-6)
