"""TFM's vision experiments are there without a flag, as in stock's train.py."""

import json
import os
import subprocess
import sys

from tfm_ext.config import experiments

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _python(*args, cwd):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, timeout=300, cwd=cwd, env=env)


def test_the_installed_launcher_knows_tfm_vision_experiments(tmp_path):
  # `python -m tfm_ext` is `tfm-ext-train`: no --registry, not this repo's.
  listed = _python("-m", "tfm_ext", "--list", cwd=tmp_path)
  assert listed.returncode == 0, listed.stderr
  names = {line.split()[0] for line in listed.stdout.split("tasks:")[0]
           .splitlines()[1:]}
  assert {"resnet_imagenet", "mobilenet_imagenet", "retinanet_resnetfpn_coco",
          "maskrcnn_resnetfpn_coco", "seg_deeplabv3_pascal",
          "video_classification_kinetics400", "digits_convnet"} <= names
  assert "ImageClassificationTask" in listed.stdout.split("tasks:")[1]
  shown = _python("-m", "tfm_ext", "--experiment=seg_deeplabv3_pascal",
                  "--print_config", "--params_override=task.model.num_classes=5",
                  cwd=tmp_path)
  assert shown.returncode == 0, shown.stderr
  assert "num_classes: 5" in shown.stdout


def test_importing_the_launcher_leaves_them_unregistered_until_asked():
  # A run of another experiment does not pay their import at start-up.
  probe = _python("-c", "import sys, tfm_ext.run.launcher\n"
                  "from official.core import exp_factory\n"
                  "from tfm_ext.config import experiments\n"
                  "before = 'resnet_imagenet' in experiments.names()\n"
                  "known = experiments.is_known('resnet_imagenet')\n"
                  "print(__import__('json').dumps([before, known]))",
                  cwd=REPO)
  assert probe.returncode == 0, probe.stderr
  assert json.loads(probe.stdout.splitlines()[-1]) == [False, True]


def test_a_typo_names_the_closest_experiments():
  message = experiments.unknown_message("resnet_imagnet")
  assert "Did you mean 'resnet_imagenet'?" in message
  assert "--registry=MODULE" in message
  assert "--registry=official.common.registry_imports" in message


def test_an_experiment_of_another_tfm_family_names_its_registry():
  message = experiments.unknown_message("bert/sentence_prediction")
  assert ("TFM's official.nlp.configs.finetuning_experiments registers it: "
          "pass --registry=official.common.registry_imports.") in message
  assert experiments.registry_for(
      experiments.tfm_module_registering("maxvit_imagenet")) == (
          "official.projects.maxvit.registry_imports")


def test_tfm_ranking_experiments_come_with_tfm_ext_ranking():
  assert experiments.registry_for(experiments.tfm_module_registering(
      "dcn_criteo")) == "tfm_ext.training.ranking"


def test_tfm_nlp_experiments_are_known_and_listed_by_their_nested_names(
    tmp_path):
  # TFM registers `bert/sentence_prediction` as ["bert"]["sentence_prediction"].
  listed = _python("-m", "tfm_ext", "--list",
                   "--registry=official.common.registry_imports", cwd=tmp_path)
  assert listed.returncode == 0, listed.stderr
  names = {line.split()[0] for line in listed.stdout.split("tasks:")[0]
           .splitlines()[1:]}
  assert {"bert/sentence_prediction", "bert/tagging", "electra/pretraining",
          "wmt_transformer/large"} <= names
  assert not {"bert", "electra", "wmt_transformer"} & names
  group = _python("-m", "tfm_ext", "--experiment=bert", "--print_config",
                  "--registry=official.common.registry_imports", cwd=tmp_path)
  assert group.returncode == 2, group.stderr
  assert "Traceback" not in group.stderr
  assert ("'bert' is a group of TFM's registry, not an experiment; its "
          "experiments: --experiment=bert/pretraining") in group.stderr
  shown = _python("-m", "tfm_ext", "--experiment=bert/tagging",
                  "--print_config", "--params_override=task.model.head_dropout=0.3",
                  "--registry=official.common.registry_imports", cwd=tmp_path)
  assert shown.returncode == 0, shown.stderr
  assert "head_dropout: 0.3" in shown.stdout


def test_the_registry_an_unknown_name_suggests_was_imported_and_registers_it():
  # YOLO's experiments are registered by a module under configs/, their
  # task by the project's common/registry_imports: the hint names the one
  # that registers both, found by importing it, not by the path's shape.
  message = experiments.unknown_message("coco_yolov7tiny")
  assert message.endswith("TFM's official.projects.yolo.configs.yolov7 "
                          "registers it: pass --registry=official.projects."
                          "yolo.common.registry_imports.")
  assert experiments.is_known("coco_yolov7tiny")
  experiments.import_registries(["official.common.registry_imports"])
  assert experiments.unknown_message("bert/sentence_predction").startswith(
      "Unknown experiment 'bert/sentence_predction'. Did you mean "
      "'bert/sentence_prediction'?")

