"""A label outside the classes fails the run whichever trainer runs it.

TFM's image classification one-hot-encodes its labels: a label past
`num_classes` is an all-zero target, trained on to exit 0. The check
(`tfm_ext.training.labels`) is the task's input's, made so by the launcher
(`labels.check_inputs`): TFM's own trainer (`trainer.name=tfm_base`) meets
it as `CustomTrainer` does (tests/base/test_failures.py runs that one),
and with labels in range it trains as stock TFM does, bit for bit (in the
full tier, beside the matrix of tests/e2e/test_tfm_experiments.py whose
stock run it shares: it adds one ResNet run).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
import test_tfm_experiments as tfm
# The matrix's runs, built once a session (stock's is shared with it).
from test_tfm_experiments import ours, python, stock, tfm_data, trained  # pylint: disable=unused-import

TRACEBACK = "Traceback (most recent call last)"
SHRUNK = os.path.join(REPO, "tests", "e2e", "tfm_configs",
                      "resnet_imagenet.yaml")


def test_tfm_base_labels_past_num_classes_are_exit_3_naming_both(
    launch_forked, tmp_path, imagenet_dir):
  # The records' labels are ImageNet's, 1 to 1000; the model has 3 classes.
  model_dir = str(tmp_path / "m")
  result = launch_forked(
      "--experiment=resnet_imagenet", f"--config_file={SHRUNK}",
      "--mode=train", "--params_override="
      f"task.train_data.input_path={imagenet_dir}/train-*,"
      f"task.validation_data.input_path={imagenet_dir}/validation-*,"
      "runtime.distribution_strategy=one_device,runtime.num_gpus=0,"
      "runtime.mixed_precision_dtype=float32,task.model.num_classes=3,"
      "trainer.name=tfm_base,trainer.train_steps=2,trainer.steps_per_loop=1",
      model_dir=model_dir)
  assert result.returncode == 3, result.stderr[-3000:]
  assert TRACEBACK not in result.stderr, result.stderr[-3000:]
  lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, result.stderr[-3000:]
  line = lines[0]
  assert "outside [0, 3)" in line and "task.model.num_classes=3" in line, line
  assert f"task.train_data.input_path='{imagenet_dir}/train-*'" in line, line
  assert tf.train.latest_checkpoint(model_dir) is None
  assert result.summary()["exit_code"] == 3


@pytest.mark.slow
@pytest.mark.skipif(not tfm.FULL, reason="TFM_EXT_FULL_TFM_MATRIX=1 or "
                    "TFM_EXT_NIGHTLY=1 runs it: one more ResNet run")
def test_tfm_base_with_labels_in_range_trains_as_stock_tfm(trained, ours,
                                                           tmp_path):
  # The check changes no value: TFM's trainer through our launcher, its
  # input checked, ends where stock TFM ends, every weight and slot bit for
  # bit (the matrix of tests/e2e/test_tfm_experiments.py runs ours).
  runs = trained("resnet_imagenet")
  model_dir = str(tmp_path / "tfm_base")
  proc = ours(runs.experiment, "train_and_eval", model_dir,
              runs.override() + ",trainer.name=tfm_base")
  assert proc.returncode == 0, proc.stderr[-3000:]
  theirs, mine = (tfm.checkpoint_at(runs.stock, tfm.STEPS),
                  tfm.checkpoint_at(model_dir, tfm.STEPS))
  assert sorted(theirs) == sorted(mine)
  assert all(np.array_equal(theirs[k], mine[k]) for k in theirs), [
      k for k in theirs if not np.array_equal(theirs[k], mine[k])][:5]
  loss = ("training_loss", tfm.STEPS)
  assert tfm.scalars(model_dir, "train")[loss] == tfm.scalars(
      runs.stock, "train")[loss]
