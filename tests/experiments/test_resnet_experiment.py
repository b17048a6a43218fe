"""resnet50_imagenet_ctl natively: the model, a real run, and its export."""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
import yaml

from conftest import REPO
from conftest import built_once
import registry_imports  # pylint: disable=unused-import
from experiments.imagenet import input_pipeline
from experiments.imagenet import resnet50
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
from tfm_ext.config import params as params_lib
from tfm_ext.model_dir import run_summary
from tfm_ext.run import driver

EXPORT = os.path.join(REPO, "launchers", "export_resnet.py")


def _train(imagenet_dir, folder):
  """Trains into `folder`/model_dir; its summary is `folder`/summary.json."""
  model_dir = os.path.join(folder, "model_dir")
  data = {"input_path": os.path.join(imagenet_dir, "train-*-of-01024"),
          "global_batch_size": 2, "num_examples": 4}
  override = {
      "task": {"train_data": data, "validation_data": {
          "input_path": os.path.join(imagenet_dir, "validation-*"),
          "global_batch_size": 2}},
      "trainer": {"train_steps": 3, "steps_per_loop": 1, "log_steps": 1,
                  "summary_interval": 1, "checkpoint_interval": 3,
                  "validation_interval": 3},
  }
  params = params_lib.build(params_lib.ConfigSources(
      experiment="resnet50_imagenet_ctl",
      params_override=yaml.safe_dump(override)))
  summary = driver.execute(driver.prepare(driver.RunRequest(
      experiment="resnet50_imagenet_ctl", mode="train_and_eval",
      model_dir=model_dir, params=params)))
  summary.write(folder, "summary.json")


@pytest.fixture(scope="module")
def native_run(imagenet_dir, tmp_path_factory):
  """3 steps of batch 2 on the tiny ImageNet, whose 'epoch' is 2 steps.

  `(summary, model_dir)`, trained once a session.
  """
  folder = built_once(tmp_path_factory, "resnet_native",
                      functools.partial(_train, imagenet_dir))
  return (run_summary.RunSummary.read(folder, "summary.json"),
          os.path.join(folder, "model_dir"))


@pytest.mark.slow
def test_model_is_resnet50_v1_5_as_the_issue_specifies():
  before = tf_keras.backend.image_data_format()
  model = resnet50.build_resnet50(resnet50.ResNet50Config())
  convs = [l for l in model.layers if isinstance(l, tf_keras.layers.Conv2D)]
  norms = [l for l in model.layers
           if isinstance(l, tf_keras.layers.BatchNormalization)]

  assert model.count_params() == 25_610_152  # Keras' ResNet50 minus biases.
  assert len(convs) == len(norms) == 53
  for conv in convs:
    assert not conv.use_bias and conv.data_format == "channels_last"
    assert isinstance(conv.kernel_initializer, tf_keras.initializers.HeNormal)
    assert float(conv.kernel_regularizer.l2) == pytest.approx(1e-4)
    # Batch norm right after every convolution, before any ReLU.
    consumers = [n.outbound_layer for n in conv.outbound_nodes]
    assert [type(c) for c in consumers] == [
        tf_keras.layers.BatchNormalization]
  for norm in norms:
    assert norm.momentum == 0.9 and norm.epsilon == 1e-5
  # Stages of 3, 4, 6, 3 blocks ending in 256, 512, 1024, 2048 channels.
  for stage, blocks, channels in ((2, "abc", 256), (3, "abcd", 512),
                                  (4, "abcdef", 1024), (5, "abc", 2048)):
    names = {l.name for l in convs if l.name.startswith(f"res{stage}")}
    assert {n[4] for n in names} == set(blocks)
    assert model.get_layer(f"res{stage}{blocks[-1]}_branch2c").filters == (
        channels)
  # v1.5: a stage's first block strides in its 3x3 convolution.
  assert model.get_layer("res3a_branch2a").strides == (1, 1)
  assert model.get_layer("res3a_branch2b").strides == (2, 2)
  fc = model.get_layer("fc1000")
  assert fc.units == 1000
  assert np.std(fc.kernel.numpy()) == pytest.approx(0.01, rel=0.02)
  assert model.layers[-1].dtype == "float32"  # The softmax.
  assert isinstance(model.layers[-3], tf_keras.layers.GlobalAveragePooling2D)

  first = resnet50.build_resnet50(
      resnet50.ResNet50Config(data_format="channels_first"))
  assert any(isinstance(l, tf_keras.layers.Permute) for l in first.layers)
  assert first.get_layer("bn_conv1").axis == [1]
  assert tf_keras.backend.image_data_format() == before


def test_native_run_trains_past_an_epoch_on_real_jpegs_and_evaluates(
    native_run):
  summary, model_dir = native_run
  # No train_steps cap here: 3 steps is an epoch and a half.
  assert summary.global_step == 3
  assert summary.train_metrics["epoch"] == pytest.approx(1.5)
  assert summary.train_metrics["examples_per_second"] > 0
  # ln(1000) of cross-entropy plus about 5.3 of L2 at initialization.
  assert 10 < summary.train_metrics["training_loss"] < 14
  assert 0 <= summary.eval_metrics["accuracy"] <= 1
  assert np.isfinite(summary.eval_metrics["validation_loss"])
  assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-3")
  with open(os.path.join(model_dir, "params.yaml")) as f:
    assert yaml.safe_load(f)["trainer"]["name"] == "resnet_ctl"


@pytest.mark.slow
def test_export_writes_hub_models_that_agree_with_the_trained_model(
    native_run, run_forked, tmp_path):
  _, model_dir = native_run
  export_dir = tmp_path / "hub"
  proc = run_forked(EXPORT, f"--checkpoint={model_dir}",
                    f"--export_dir={export_dir}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "exported feature-vector" in proc.stdout

  trained = resnet50.build_resnet50(resnet50.ResNet50Config())
  tf.train.Checkpoint(model=trained).read(
      tf.train.latest_checkpoint(model_dir)).expect_partial()
  images = tf.random.stateless_uniform([3, 224, 224, 3], [8, 9])  # In [0, 1].
  rescaled = images * 255.0 - input_pipeline.CHANNEL_MEANS
  expected_probs = trained(rescaled, training=False)
  expected_features = resnet50.pooled_features(trained)(rescaled)

  classification = tf_keras.models.load_model(export_dir / "classification")
  feature_vector = tf.saved_model.load(str(export_dir / "feature-vector"))
  probs = classification(images)
  features = feature_vector(images, training=False)
  assert probs.shape == (3, 1000) and features.shape == (3, 2048)
  np.testing.assert_allclose(probs, expected_probs, atol=1e-5)
  np.testing.assert_allclose(features, expected_features, rtol=1e-4,
                             atol=1e-4)


def test_export_of_a_missing_checkpoint_is_a_usage_error(run_forked,
                                                          tmp_path):
  proc = run_forked(EXPORT, f"--checkpoint={tmp_path}/nowhere/ckpt-3",
                    f"--export_dir={tmp_path}/hub", timeout=120)
  assert proc.returncode == 2
  assert "Traceback" not in proc.stderr
  assert "error: --checkpoint=" in proc.stderr
  assert not (tmp_path / "hub").exists()
