"""params.yaml both ways: stock TFM parses ours, and we resume what stock wrote."""

import os

import pytest
import official
import tensorflow as tf
import yaml

from official.core import exp_factory
from official.core import train_utils
from official.modeling import hyperparams

from tfm_ext.config import config_drift
from tfm_ext.config import params as params_lib
from tfm_ext.model_dir import params_file
from tfm_ext.base.errors import UsageError

from conftest import REPO
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
from tfm_ext.config import added_fields


def _ours(experiment, override=""):
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  import official.vision.registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  return params_lib.build(params_lib.ConfigSources(
      experiment=experiment, params_override=override))


def _plain(tree):
  """`tree` as YAML reads it back: tuples and lists alike."""
  return yaml.load(params_file.dump(tree), Loader=params_file.Loader)


@pytest.mark.parametrize("experiment", ["digits_convnet", "resnet_imagenet"])
def test_stock_tfm_parses_our_params_yaml_strictly(tmp_path, experiment):
  params = _ours(experiment, "runtime.deterministic=true,trainer.name=tfm_base")
  params_file.write(params, str(tmp_path))
  # What stock train.py does with --config_file: the experiment's own
  # config, overridden strictly.
  stock = exp_factory.get_exp_config(experiment)
  stock = hyperparams.override_params_dict(
      stock, str(tmp_path / "params.yaml"), is_strict=True)
  assert _plain(stock.task.as_dict()) == _plain(params.task.as_dict())
  # And our fields come back from the file beside it.
  back = params_file.read(str(tmp_path / "params.yaml"))
  assert back["runtime"]["deterministic"] is True
  assert back["trainer"]["name"] == "tfm_base"


def test_a_model_dir_stock_tfm_wrote_resumes_without_allow_config_change(
    tmp_path):
  params = _ours("resnet_imagenet")
  stock = exp_factory.get_exp_config("resnet_imagenet")
  train_utils.serialize_config(stock, str(tmp_path))  # TFM's own writer.
  tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(tmp_path / "ckpt"))
  config_drift.check_unchanged(params, str(tmp_path), allow_change=False)
  # Our fields set otherwise than their defaults are a change, as before.
  changed = _ours("resnet_imagenet", "runtime.deterministic=true")
  with pytest.raises(UsageError, match="runtime.deterministic: False -> True"):
    config_drift.check_unchanged(changed, str(tmp_path), allow_change=False)


def test_python_tags_other_than_tfms_tuples_are_refused(tmp_path):
  path = tmp_path / "params.yaml"
  path.write_text("task: !!python/name:os.system\n")
  with pytest.raises(ValueError, match="params.yaml holds more than data"):
    params_file.read(str(path))
  path.write_text("runtime:\n  crop: !!python/tuple [0.08, 1.0]\n")
  assert params_file.read(str(path))["runtime"]["crop"] == [0.08, 1.0]


RESNET10 = {
    "task": {"model": {"num_classes": 1001, "input_size": [32, 32, 3],
                       "backbone": {"resnet": {"model_id": 10}}},
             "train_data": {"global_batch_size": 4},
             "validation_data": {"global_batch_size": 2}},
    "trainer": {"steps_per_loop": 1, "summary_interval": 1,
                "checkpoint_interval": 1, "validation_steps": 1},
    "runtime": {"distribution_strategy": "off"},
}


def test_tfms_resnet_trains_stock_then_ours_then_stock_in_one_model_dir(
    tmp_path, imagenet_dir, run_forked):  # pylint: disable=redefined-outer-name
  # Each run is its own process, forked from one that imported TensorFlow
  # and TFM once (conftest's `run_forked`): stock's is TFM's own train.py
  # run as `python official/vision/train.py` runs it.
  config = dict(RESNET10)
  config["task"]["train_data"]["input_path"] = f"{imagenet_dir}/train-*"
  config["task"]["validation_data"]["input_path"] = (
      f"{imagenet_dir}/validation-*")
  config_file = tmp_path / "resnet10.yaml"
  config_file.write_text(yaml.safe_dump(config))
  model_dir = tmp_path / "m"

  def train(script, steps, config=config_file):
    proc = run_forked(
        script, "--experiment=resnet_imagenet", "--mode=train",
        f"--model_dir={model_dir}", f"--config_file={config}",
        f"--params_override=trainer.train_steps={steps}",
        env={"PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc

  stock = os.path.join(os.path.dirname(official.__file__), "vision",
                       "train.py")
  train(stock, 1)
  # The four-line fork resumes stock's model_dir, no --allow_config_change.
  ours = train(os.path.join(REPO, "tests/downstream/tfm_vision_train.py"), 2)
  assert "done | train | step 2" in ours.stdout, ours.stdout
  # Stock resumes ours, parsing our params.yaml strictly as its config.
  ours_params = tmp_path / "ours_params.yaml"
  ours_params.write_text((model_dir / "params.yaml").read_text())
  train(stock, 3, config=ours_params)
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-3")


def test_added_fields_an_earlier_version_wrote_inline_read_as_they_are(
    tmp_path):
  path = tmp_path / "params.yaml"  # No tfm_ext_params.yaml beside it.
  path.write_text("trainer:\n  name: tfm_base\n  train_steps: 7\n"
                  "runtime:\n  deterministic: true\n")
  tree = params_file.read(str(path), added_fields.defaults())
  assert tree["trainer"]["name"] == "tfm_base"
  assert tree["runtime"]["deterministic"] is True
  # A field neither wrote: its default.
  assert tree["runtime"]["seed"] == added_fields.RUNTIME_FIELDS["seed"]
