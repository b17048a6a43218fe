"""TFM's ranking recipe through the launcher (`tfm_ext.training.ranking`).

TFM's own, unmodified `RankingTrainer` trains TFM's `dlrm_criteo` as
`--trainer=ranking`, on the synthetic data its task makes; its input paths
name no file and are not checked; without TensorFlow Recommenders the run
says what to install.
"""

import importlib.util
import json
import math
import os
import sys

import pytest
import tensorflow as tf

from official.core import exp_factory

import tfm_ext
from experiments import resnet50_imagenet_ctl  # pylint: disable=unused-import
from tfm_ext.config import checks
from tfm_ext.training import input_files
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import UsageError
from tfm_ext.training import ranking
from tfm_ext.base import registry

from conftest import REPO
from conftest import assert_clean_usage_error
from conftest import numeric_tensors

TESTS = os.path.join(REPO, "tests")

needs_tfrs = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow_recommenders") is None,
    reason="tensorflow-recommenders is not installed (pip install -e "
    "\".[ranking]\" or \".[test]\")")


def tiny(tmp_path):
  """dlrm_criteo's smoke run, with TFM's own test's input paths.

  Those (`train/*`, `eval/*`, under `tmp_path`) match no file.
  """
  return (f"{ranking.SMOKE},task.train_data.input_path={tmp_path}/train/*,"
          f"task.validation_data.input_path={tmp_path}/eval/*")


@pytest.mark.slow
@needs_tfrs
def test_tfm_ranking_trainer_trains_dlrm_on_synthetic_data(launch, tmp_path,
                                                           monkeypatch):
  # tfm_ext sets it for TensorFlow Recommenders; the user does not.
  monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  run = launch("--experiment=dlrm_criteo", "--trainer=ranking",
               "--mode=train_and_eval", f"--params_override={tiny(tmp_path)}",
               "--registry=ranking_probe", model_dir=tmp_path / "m",
               env={"PYTHONPATH": os.pathsep.join([REPO, TESTS])})
  assert run.returncode == 0, run
  # TFM's own class, loaded with TensorFlow Recommenders only once the run
  # looked it up (tests/ranking_probe.py), with tf.keras set to Keras 2.
  with open(os.path.join(run.model_dir, "ranking_probe.json")) as f:
    assert json.load(f) == {"loaded_by_registration": False,
                            "trainer_is_tfms_ranking_trainer": True,
                            "tf_use_legacy_keras": "1"}
  summary = run.summary()
  assert (summary["trainer"], summary["status"], summary["global_step"]) == (
      "ranking", "completed", 20)
  # Only RankingTrainer.train_loop_end logs each optimizer's learning rate:
  # the embeddings' SGD (TFM's warm-up floor, 0.01) and the dense Adam's.
  train = summary["train_metrics"]
  assert train["SGD_0_learning_rate"] == pytest.approx(0.01)
  assert train["Adam_1_learning_rate"] == pytest.approx(0.001)
  # The evaluations are the Ranking model's own metrics.
  evaluation = summary["eval_metrics"]
  assert 0.0 <= evaluation["auc"] <= 1.0
  assert math.isfinite(evaluation["validation_loss"])
  with open(os.path.join(run.model_dir, "metrics.csv")) as f:
    header, *rows = [line.split(",") for line in f.read().splitlines()]
  column = header.index("validation_auc")
  assert [row[0] for row in rows if row[column]] == ["10", "20"]

  # The optimizer the trainer stepped and saved is the task's composite
  # one: both of its optimizers took all 20 steps, with their slots.
  latest = tf.train.latest_checkpoint(run.model_dir)
  assert latest.endswith("ckpt-20")
  tensors = numeric_tensors(latest)
  for i in (0, 1):
    assert tensors[f"optimizer/Optimizer{i}/iter/.ATTRIBUTES/"
                   "VARIABLE_VALUE"] == 20
  assert any("OPTIMIZER_SLOT/optimizer/Optimizer1/m" in name
             for name in tensors)


def ranking_params(tmp_path, synthetic):
  params = exp_factory.get_exp_config("dlrm_criteo")
  params.override({"task": {
      "use_synthetic_data": synthetic,
      "train_data": {"input_path": f"{tmp_path}/train/*"},
      "validation_data": {"input_path": f"{tmp_path}/eval/*"}}})
  return params


def check_inputs(params, model_dir):
  checks.check_with_strategy(params, trains=True, evaluates=True,
                             needs_checkpoint=False, model_dir=str(model_dir),
                             strategy=tf.distribute.get_strategy())


def test_input_paths_of_a_task_that_makes_its_data_are_not_checked(tmp_path):
  check_inputs(ranking_params(tmp_path, synthetic=True), tmp_path / "m")
  with pytest.raises(UsageError, match=r"task\.train_data\.input_path "
                     r"pattern '.*/train/\*' matches no file"):
    check_inputs(ranking_params(tmp_path, synthetic=False), tmp_path / "m")


def test_a_cut_file_is_refused_unless_the_data_is_synthetic(tmp_path):
  path = str(tmp_path / "train-0")
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(b"x" * 100)
  with open(path, "r+b") as f:
    f.truncate(50)  # Into the record's data: "cut short".
  # Ours puts the switch on each data config (TFM's ranking, on the task).
  params = exp_factory.get_exp_config("resnet50_imagenet_ctl")
  params.override({"task": {"train_data": {"input_path": path}}})
  with pytest.raises(RunFailed, match="train-0 is cut short"):
    input_files.check_framing(params, trains=True, evaluates=False)
  params.override({"task": {"train_data": {"use_synthetic_data": True}}})
  input_files.check_framing(params, trains=True, evaluates=False)
  assert not input_files.reads_files(params.task, params.task.train_data)
  assert input_files.reads_files(params.task, params.task.validation_data)


def test_without_tensorflow_recommenders_the_task_says_what_to_install(
    monkeypatch):
  # None in sys.modules: Python's own "not installed" for that import.
  monkeypatch.setitem(sys.modules, "tensorflow_recommenders", None)
  # The variable the module sets on its way is put back after the test.
  monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
  monkeypatch.delitem(sys.modules, "tfm_ext.training._ranking_task", raising=False)
  monkeypatch.delattr(tfm_ext, "_ranking_task", raising=False)
  params = exp_factory.get_exp_config("dlrm_criteo")
  with pytest.raises(UsageError, match=r"pip install -e \"\.\[ranking\]\""):
    ranking.ranking_task(params.task, trainer_config=params.trainer)


def test_a_lazy_entry_is_listed_unloaded_and_loaded_once():
  loads = []
  trainers = registry.Registry("trainer")
  trainers.register_lazily("later", lambda: loads.append(1) or "loaded",
                           doc="Loaded when a run asks for it.")
  assert "later" in trainers and trainers.names() == ["later"]
  assert trainers.entries()["later"].__doc__ == "Loaded when a run asks for it."
  assert not loads
  assert trainers.get("later") == trainers.get("later") == "loaded"
  assert loads == [1]
  assert trainers.entries()["later"] == "loaded"


def test_use_orbit_false_is_refused_not_ignored(launch_forked, tmp_path):
  # TFM's ranking configs default to false: TFM's Keras compile/fit loop.
  smoke = ranking.SMOKE.replace("trainer.use_orbit=true",
                                "trainer.use_orbit=false")
  run = launch_forked("--experiment=dlrm_criteo", "--trainer=ranking",
                      "--mode=train", f"--params_override={smoke}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "trainer.use_orbit=false: give true",
                           "official/recommendation/ranking/train.py")
