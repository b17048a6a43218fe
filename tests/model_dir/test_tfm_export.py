"""--mode=export of TFM's own experiments serves as TFM's exporter serves them.

Each test builds the registered experiment's model, shrunk (ResNet-10, or
the smallest 3D ResNet TFM has, few filters, small images, few classes),
saves it as a model_dir's `ckpt-7`, exports it with `--mode=export` and
with TFM's `export_inference_graph` as TFM's `export_saved_model.py`
calls it, and feeds both SavedModels the same uint8 images.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tf_keras.src.saving.legacy.saved_model import utils as keras_saved_model_utils

from official.core import exp_factory
from official.core import task_factory
from official.modeling import hyperparams
from official.vision import registry_imports  # pylint: disable=unused-import
from official.vision.serving import export_saved_model_lib

from tfm_ext.config import params as params_lib
from tfm_ext.errors import UsageError
from tfm_ext.examples import digits_convnet  # pylint: disable=unused-import
from tfm_ext.model_dir import tfm_serving
from tfm_ext.run import driver

from conftest import REPO
from conftest import assert_clean_usage_error

STEP = 7
TOLERANCE = 1e-5
VISION = "--registry=official.vision.registry_imports"
TINY_RESNET = ("task.model.backbone.resnet.model_id=10,task.model.num_classes=5,"
               "task.model.input_size=[32,32,3]")

# TFM's detectors on random weights score every box low: a threshold of 0
# keeps detections to compare.
_DETECTOR = ("task.model.backbone.resnet.model_id=10,task.model.num_classes=3,"
             "task.model.decoder.fpn.num_filters=16,"
             "task.model.detection_generator.pre_nms_score_threshold=0.0,"
             "task.model.detection_generator.max_num_detections=10,"
             "task.model.detection_generator.pre_nms_top_k=100,")


@pytest.fixture(autouse=True)
def float32_policy():
  """Keras's global policy float32, as in a new process (TFM's exporter's).

  A run of a bfloat16 experiment (RetinaNet, Mask R-CNN, video) sets it for
  the whole process; it is put back for the tests that follow.
  """
  tf_keras.mixed_precision.set_global_policy("float32")
  yield
  tf_keras.mixed_precision.set_global_policy("float32")


def _save_checkpoint(model_dir, params):
  """The task's model as a run saves it: `ckpt-7` and its state file."""
  model = task_factory.get_task(params.task).build_model()
  checkpoint = tf.train.Checkpoint(
      model=model, global_step=tf.Variable(STEP, dtype=tf.int64))
  manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=1)
  return manager.save(checkpoint_number=STEP)


def _stock_params(experiment, override):
  """The config as TFM's export_saved_model.py builds it."""
  params = exp_factory.get_exp_config(experiment)
  params = hyperparams.override_params_dict(params, override, is_strict=True)
  params.validate()
  params.lock()
  return params


def _serve(path, images):
  outputs = tf.saved_model.load(path).signatures["serving_default"](images)
  return {name: tensor.numpy() for name, tensor in outputs.items()}


def _export_both(tmp_path, experiment, override, size, input_type=None):
  """Ours and stock's `serving_default` outputs on the same uint8 images.

  Both are saved without Keras's traces of each layer's `call`: serving
  calls none of them, the signatures are the same, and the test runs in a
  third of the time (a full save is the launcher test's).
  """
  with keras_saved_model_utils.keras_option_scope(save_traces=False):
    return _export_both_traceless(tmp_path, experiment, override, size,
                                  input_type)


def _export_both_traceless(tmp_path, experiment, override, size, input_type):
  model_dir = str(tmp_path / "run")
  params = params_lib.build(params_lib.ConfigSources(
      experiment=experiment, params_override=override))
  checkpoint = _save_checkpoint(model_dir, params)
  options = tfm_serving.ServingOptions(input_type=input_type,
                                       input_image_size=tuple(size))
  summary = driver.execute(driver.prepare(driver.RunRequest(
      experiment=experiment, mode="export", model_dir=model_dir,
      params=params, serving=options)))
  assert (summary.status, summary.global_step) == ("completed", STEP)
  ours = os.path.join(model_dir, "export", str(STEP))
  stock = str(tmp_path / "stock")
  # TFM's export_saved_model.py in a new process: no policy set.
  tf_keras.mixed_precision.set_global_policy("float32")
  export_saved_model_lib.export_inference_graph(
      input_type="image_tensor", batch_size=None, input_image_size=list(size),
      params=_stock_params(experiment, override), checkpoint_path=checkpoint,
      export_dir=stock, export_checkpoint_subdir="checkpoint",
      export_saved_model_subdir="saved_model")
  images = tf.cast(tf.random.stateless_uniform(
      [2] + list(size) + [3], [4, 2], maxval=256, dtype=tf.int32), tf.uint8)
  return (_serve(ours, images), _serve(os.path.join(stock, "saved_model"),
                                       images), ours)


def _assert_same(ours, stock):
  assert sorted(ours) == sorted(stock)
  for name in stock:
    np.testing.assert_allclose(ours[name], stock[name], atol=TOLERANCE,
                               err_msg=name)
  return max(float(np.max(np.abs(ours[n].astype(np.float64) -
                                 stock[n].astype(np.float64)), initial=0))
             for n in stock)


def test_classification_takes_uint8_images_and_answers_as_tfm(tmp_path):
  ours, stock, path = _export_both(
      tmp_path, "resnet_imagenet", TINY_RESNET, [32, 32])

  print("max abs difference", _assert_same(ours, stock))
  assert ours["probs"].shape == (2, 5)
  np.testing.assert_allclose(ours["probs"].sum(axis=-1), 1, rtol=1e-5)
  assert sorted(os.listdir(path)) == [
      "assets", "fingerprint.pb", "params.yaml", "saved_model.pb",
      "variables"]


def test_retinanet_returns_tfms_detections(tmp_path):
  ours, stock, _ = _export_both(
      tmp_path, "retinanet_resnetfpn_coco",
      _DETECTOR + "task.model.input_size=[64,64,3],task.model.max_level=5,"
      "task.model.head.num_convs=1,task.model.head.num_filters=16",
      [64, 64])

  print("max abs difference", _assert_same(ours, stock))
  assert ours["num_detections"].min() > 0
  assert ours["detection_boxes"].shape == (2, 10, 4)


def test_mask_rcnn_returns_tfms_detections_and_masks(tmp_path):
  ours, stock, _ = _export_both(
      tmp_path, "maskrcnn_resnetfpn_coco",
      _DETECTOR + "task.model.input_size=[64,64,3],"
      "task.model.min_level=3,task.model.max_level=5,"
      "task.model.rpn_head.num_filters=16,"
      "task.model.detection_head.num_convs=1,"
      "task.model.detection_head.num_filters=16,"
      "task.model.detection_head.fc_dims=16,"
      "task.model.roi_generator.test_num_proposals=20,"
      "task.model.roi_generator.num_proposals=20,"
      "task.model.roi_generator.pre_nms_top_k=100,"
      "task.model.roi_generator.test_pre_nms_top_k=100,"
      "task.model.roi_sampler.num_sampled_rois=16,"
      "task.model.mask_sampler.num_sampled_masks=8,"
      "task.model.mask_head.num_convs=1,task.model.mask_head.num_filters=16",
      [64, 64])

  print("max abs difference", _assert_same(ours, stock))
  assert ours["num_detections"].min() > 0
  assert ours["detection_masks"].shape[:2] == (2, 10)


def test_segmentation_returns_full_size_masks(tmp_path):
  ours, stock, _ = _export_both(
      tmp_path, "seg_deeplabv3_pascal",
      "task.model.backbone.type=resnet,task.model.backbone.resnet.model_id=10,"
      "task.model.num_classes=3,task.model.decoder.aspp.num_filters=16,"
      "task.model.head.num_filters=16,task.model.head.low_level_num_filters=8,"
      "task.init_checkpoint=''", [32, 32])

  print("max abs difference", _assert_same(ours, stock))
  # TFM's module resizes the logits back to the image: not 1/16 of it.
  assert ours["logits"].shape == (2, 32, 32, 3)


def test_video_classification_takes_uint8_frames(tmp_path):
  ours, stock, _ = _export_both(
      tmp_path, "video_classification_kinetics400",
      "task.train_data.num_classes=3,task.validation_data.num_classes=3,"
      "task.train_data.feature_shape=[4,32,32,3],"
      "task.validation_data.feature_shape=[4,32,32,3],"
      "task.train_data.min_image_size=32", [4, 32, 32])

  print("max abs difference", _assert_same(ours, stock))
  assert ours["probs"].shape == (2, 3)


def test_the_launcher_exports_a_tfm_experiment_that_takes_uint8_images(
    tmp_path, launch_forked):
  model_dir = tmp_path / "run"
  params = params_lib.build(params_lib.ConfigSources(
      experiment="resnet_imagenet", params_override=TINY_RESNET))
  _save_checkpoint(str(model_dir), params)

  run = launch_forked("--experiment=resnet_imagenet", "--mode=export", VISION,
                      f"--params_override={TINY_RESNET}", "--batch_size=2",
                      model_dir=model_dir)

  assert run.returncode == 0, run
  path = model_dir / "export" / str(STEP)
  assert f"export @ step {STEP} | {path} | from {model_dir}/ckpt-{STEP}" in (
      run.stdout)
  assert run.summary("export_summary.json")["global_step"] == STEP
  # The SavedModel itself, and the config it was built from; no copy left.
  assert sorted(os.listdir(model_dir / "export")) == [str(STEP)]
  assert {"saved_model.pb", "params.yaml"} <= set(os.listdir(path))
  serve = tf.saved_model.load(str(path)).signatures["serving_default"]
  (spec,) = serve.structured_input_signature[1].values()
  # TFM's image_tensor: uint8 of any size, the batch --batch_size says.
  assert (spec.shape.as_list(), spec.dtype) == ([2, None, None, 3], tf.uint8)
  images = tf.zeros([2, 48, 40, 3], tf.uint8)
  assert serve(images)["probs"].shape == (2, 5)


def test_bad_export_flags_are_refused_before_anything_is_read(
    tmp_path, launch_forked):
  for flag, fragments in (
      ("--input_type=jpeg", ("Unknown --input_type 'jpeg'", "image_bytes")),
      ("--input_image_size=224x224", ("--input_image_size='224x224'",
                                      "height,width")),
      ("--input_image_size=0,224", ("--input_image_size=0,224",)),
      ("--batch_size=0", ("--batch_size=0",))):
    run = launch_forked("--experiment=resnet_imagenet", "--mode=export",
                        VISION, flag, model_dir=tmp_path / "never")
    assert_clean_usage_error(run, *fragments)


def test_export_flags_a_task_cannot_take_are_refused():
  for experiment, options, message in (
      ("video_classification_kinetics400", {"input_type": "image_bytes"},
       "VideoClassificationModule does not take it; it takes image_tensor, "
       "tf_example"),
      ("video_classification_kinetics400", {"input_image_size": (224, 224)},
       "takes frames,height,width"),
      ("digits_convnet", {"input_type": "image_bytes"},
       "--input_type=image_bytes: these flags shape the export of TFM's "
       "vision tasks")):
    params = params_lib.build(params_lib.ConfigSources(experiment=experiment))
    with pytest.raises(UsageError, match=message):
      tfm_serving.vision_export(params, tfm_serving.ServingOptions(**options))


def test_sizes_default_to_what_evaluation_feeds_the_model():
  def size(experiment):
    params = params_lib.build(params_lib.ConfigSources(experiment=experiment))
    return tfm_serving.image_size(params.task, tfm_serving.ServingOptions())

  assert size("resnet_imagenet") == [224, 224]  # model.input_size
  assert size("retinanet_resnetfpn_coco") == [640, 640]
  assert size("seg_deeplabv3_pascal") == [512, 512]  # validation output_size
  # train_data.feature_shape: frames, height, width.
  assert size("video_classification_kinetics400") == [64, 224, 224]


def _export_ranking(model_dir):
  """Exports dlrm_criteo's smoke model; prints what its export serves.

  Run as a script, in a process whose `tf.keras` is Keras 2 (TensorFlow
  Recommenders needs it).
  """
  from tfm_ext.training import ranking  # pylint: disable=g-import-not-at-top
  params = params_lib.build(params_lib.ConfigSources(
      experiment="dlrm_criteo", trainer="ranking",
      params_override=ranking.SMOKE))
  task = ranking.ranking_task(params.task, trainer_config=params.trainer)
  model = task.build_model()
  config = params.task.model
  dense = tf.random.stateless_uniform([5, config.num_dense_features], [1, 2])
  sparse = tf.stack([
      tf.random.stateless_uniform([5], [3, i], maxval=size, dtype=tf.int32)
      for i, size in enumerate(config.vocab_sizes)], axis=1)
  predictions = model({
      "dense_features": dense,
      "sparse_features": {str(i): sparse[:, i]
                          for i in range(len(config.vocab_sizes))}},
                      training=False).numpy()
  checkpoint = tf.train.Checkpoint(
      model=model, global_step=tf.Variable(STEP, dtype=tf.int64))
  tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=1).save(
      checkpoint_number=STEP)
  summary = driver.execute(driver.prepare(driver.RunRequest(
      experiment="dlrm_criteo", mode="export", model_dir=model_dir,
      params=params)))
  serve = tf.saved_model.load(os.path.join(
      model_dir, "export", str(STEP))).signatures["serving_default"]
  served = serve(dense_features=dense, sparse_features=sparse)
  print(json.dumps({
      "status": summary.status,
      "inputs": {name: [spec.shape.as_list(), spec.dtype.name]
                 for name, spec in serve.structured_input_signature[1].items()},
      "served": {name: t.numpy().tolist() for name, t in served.items()},
      "predictions": predictions.tolist()}))


def test_dlrm_exports_and_serves_its_predictions(tmp_path):
  if importlib.util.find_spec("tensorflow_recommenders") is None:
    pytest.skip("tensorflow-recommenders is not installed")
  run = subprocess.run(
      [sys.executable, __file__, str(tmp_path / "run")], capture_output=True,
      text=True, timeout=300, cwd=REPO,
      env={**os.environ, "PYTHONPATH": os.pathsep.join(
          [REPO, os.path.join(REPO, "tests")]),
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert run.returncode == 0, run.stderr[-5000:]
  result = json.loads(run.stdout.splitlines()[-1])

  assert result["status"] == "completed"
  # Criteo's 13 dense features, one id for each of the smoke run's 3 tables.
  assert result["inputs"] == {"dense_features": [[None, 13], "float32"],
                              "sparse_features": [[None, 3], "int32"]}
  np.testing.assert_allclose(result["served"]["outputs"],
                             result["predictions"], atol=TOLERANCE)
  print("max abs difference", np.max(np.abs(
      np.array(result["served"]["outputs"]) - result["predictions"])))


if __name__ == "__main__":
  _export_ranking(sys.argv[1])
