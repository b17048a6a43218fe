"""A TFM project's task is exported by its project's own export module.

`--mode=export` of a task a project of TFM's defines (`official.projects.
<name>`) builds the module that project's `serving/export_saved_model.py`
builds, with the same flags (`tfm_ext.model_dir.project_serving`). YOLO,
trained here on CPU as `coco_yolov7tiny` on 64x64 images, is the one
whose loss runs on a CPU (YOLOv3/v4's relies on a GPU ignoring -1 scatter
indices): its run is the `nightly` tier's, about 100 s of CPU for the
training, our export and stock's (each export traces and saves the whole
model). The suite runs the lookup for each installed project and the
`--registry` hint, in seconds.
"""

import importlib.util
import json
import os

import numpy as np
import pytest

from conftest import REPO
import tfm_experiment_data as data

YOLO = "coco_yolov7tiny"
STOCK_EXPORTER = "official.projects.yolo.serving.export_saved_model"
STEPS = 2
# coco_yolov7tiny shrunk: 4 classes, 64x64 images, no mosaic, 10 boxes.
_CONFIG = """
task:
  model:
    num_classes: 4
    input_size: [64, 64, 3]
    detection_generator: {{max_boxes: 10, pre_nms_points: 100}}
  train_data:
    input_path: {data}/train.tfrecord
    global_batch_size: 2
    shuffle_buffer_size: 1
    seed: 1
    decoder: {{simple_decoder: {{coco91_to_80: false}}}}
    parser:
      max_num_instances: 10
      mosaic: {{mosaic_frequency: 0.0, mixup_frequency: 0.0,
               mosaic9_frequency: 0.0}}
  validation_data:
    input_path: {data}/val.tfrecord
    global_batch_size: 2
    decoder: {{simple_decoder: {{coco91_to_80: false}}}}
    parser: {{max_num_instances: 10}}
trainer:
  train_steps: {steps}
  steps_per_loop: 1
  checkpoint_interval: {steps}
  summary_interval: 1
  validation_interval: 100
"""
# The flags both exporters take; the script's defaults are 1 and 224,224.
SERVING = ("--input_type=image_tensor", "--batch_size=1",
           "--input_image_size=64,64")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}


# Run in a process of its own: the projects' imports register experiments
# and tasks, which a test of unknown names in this one must not see.
_LOOKUP = """
import json
from official.projects.deepmac_maskrcnn.configs import deep_mask_head_rcnn
from official.projects.detr.configs import detr
from official.projects.volumetric_models.configs import semantic_segmentation_3d
from official.projects.yolo.configs import yolov7
from official.vision.configs import retinanet
from tfm_ext.model_dir import project_serving
class DownstreamYolo(yolov7.YoloV7Task):  # A repository's own, not TFM's.
  pass
found = {}
for task in (DownstreamYolo(), yolov7.YoloV7Task(), detr.DetrTask(),
             deep_mask_head_rcnn.DeepMaskHeadRCNNTask(),
             semantic_segmentation_3d.SemanticSegmentation3DTask(),
             retinanet.RetinaNetTask()):
  package = project_serving.serving_package(task)
  build = package and project_serving.builder(package)
  found[type(task).__name__] = build and f"{build.__module__}.{build.__name__}"
print(json.dumps(found))
"""


def test_a_projects_task_finds_the_module_its_projects_script_builds(
    run_forked, tmp_path):
  script = tmp_path / "lookup.py"
  script.write_text(_LOOKUP)
  looked_up = run_forked(str(script), env=ENV)
  assert looked_up.returncode == 0, looked_up.stderr[-3000:]
  serving = "official.projects.{}.serving.{}".format
  assert json.loads(looked_up.stdout.splitlines()[-1]) == {
      "DownstreamYolo": serving("yolo",
                                "export_module_factory.get_export_module"),
      "YoloV7Task": serving("yolo", "export_module_factory.get_export_module"),
      "DetrTask": serving("detr", "export_module.DETRModule"),
      "DeepMaskHeadRCNNTask": serving("deepmac_maskrcnn",
                                      "detection.DetectionModule"),
      "SemanticSegmentation3DTask": serving(
          "volumetric_models", "semantic_segmentation_3d.SegmentationModule"),
      # TFM's vision exporter's (tfm_serving), not a project's.
      "RetinaNetTask": None,
  }


@pytest.mark.parametrize("experiment, registries", [
    # Not yolov7's config module, which registers the experiment alone.
    (YOLO, ["official.projects.yolo.common.registry_imports"]),
    # No module registers both: DETR's train.py imports the two.
    ("detr_coco", ["official.projects.detr.configs.detr",
                   "official.projects.detr.tasks.detection"]),
])
def test_the_registry_hint_names_modules_that_register_the_task(
    launch_forked, tmp_path, experiment, registries):
  unknown = launch_forked(f"--experiment={experiment}", "--mode=train",
                          model_dir=str(tmp_path / "run"), env=ENV)
  assert unknown.returncode == 2, unknown.stderr
  assert "Traceback" not in unknown.stderr
  hint = "pass " + " ".join(f"--registry={m}" for m in registries) + "."
  assert hint in unknown.stderr, unknown.stderr
  # Given, they import and register the experiment (its task was checked
  # by importing them when the hint was made; the nightly test trains YOLO).
  shown = launch_forked(*[f"--registry={m}" for m in registries],
                        f"--experiment={experiment}", "--print_config",
                        model_dir=str(tmp_path / "run"), env=ENV)
  assert shown.returncode == 0, shown.stderr[-3000:]


def _served(path: str, images: np.ndarray):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  serve = tf.saved_model.load(path).signatures["serving_default"]
  return {k: v.numpy() for k, v in serve(tf.constant(images)).items()}


@pytest.mark.nightly
def test_yolo_exports_as_its_projects_exporter_from_our_checkpoint(
    launch_forked, run_forked, tmp_path):
  config = tmp_path / "yolo.yaml"
  config.write_text(_CONFIG.format(
      data=data.write_detection(str(tmp_path / "data"), size=64),
      steps=STEPS))
  model_dir = str(tmp_path / "run")
  flags = ("--registry=official.projects.yolo.common.registry_imports",
           f"--experiment={YOLO}", f"--config_file={config}")
  trained = launch_forked(*flags, "--mode=train", model_dir=model_dir,
                          env=ENV, timeout=900)
  assert trained.returncode == 0, trained.stderr[-3000:]
  ours = launch_forked(*flags, "--mode=export", *SERVING,
                       model_dir=model_dir, env=ENV, timeout=900)
  assert ours.returncode == 0, ours.stderr[-3000:]
  stock_dir = str(tmp_path / "stock")
  stock = run_forked(  # python -m ..., forked.
      importlib.util.find_spec(STOCK_EXPORTER).origin, f"--experiment={YOLO}",
      f"--config_file={config}", *SERVING, f"--export_dir={stock_dir}",
      f"--checkpoint_path={os.path.join(model_dir, f'ckpt-{STEPS}')}",
      env=ENV, timeout=900)
  assert stock.returncode == 0, stock.stderr[-3000:]
  images = data.uint8_images(64, 1)
  served = _served(os.path.join(model_dir, "export", str(STEPS)), images)
  expected = _served(os.path.join(stock_dir, "saved_model"), images)
  assert sorted(served) == ["detection_boxes", "detection_classes",
                            "detection_scores", "num_detections"]
  assert int(served["num_detections"][0]) > 0  # Something to compare.
  difference = max(float(np.max(np.abs(
      served[k].astype(np.float64) - expected[k].astype(np.float64))))
                   for k in served)
  print(f"max abs difference of the served outputs: {difference}")
  assert difference == 0.0
