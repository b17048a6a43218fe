"""Trainer selection and config building (flag > gin > override > file > default)."""

import gin
import pytest

import registry_imports  # pylint: disable=unused-import
from tfm_ext import params as params_lib
from tfm_ext.errors import UsageError


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def build(**kwargs):
  return params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet", **kwargs))


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "trainer.yaml"
  path.write_text("trainer:\n  name: tfm_base\n  train_steps: 7\n")
  return str(path)


def test_experiment_default_trainer_is_custom():
  assert build().trainer.name == "custom"


def test_config_file_beats_default(config_file):
  params = build(config_files=[config_file])
  assert params.trainer.name == "tfm_base"
  assert params.trainer.train_steps == 7


def test_params_override_beats_config_file(config_file):
  params = build(config_files=[config_file],
                 params_override="trainer.name=custom")
  assert params.trainer.name == "custom"
  assert params.trainer.train_steps == 7


def test_gin_binding_beats_params_override(config_file):
  params_lib.parse_gin([], ["tfm_ext.trainer.name = 'tfm_base'"])
  params = build(config_files=[config_file],
                 params_override="trainer.name=custom")
  assert params.trainer.name == "tfm_base"


def test_trainer_flag_beats_gin_binding():
  params_lib.parse_gin([], ["tfm_ext.trainer.name = 'tfm_base'"])
  assert build(trainer="custom").trainer.name == "custom"


def test_tfm_experiment_without_name_field_gets_default_trainer():
  from official.core import config_definitions as cfg
  from official.core import exp_factory
  exp_factory.register_config_factory("plain_tfm_experiment")(
      lambda: cfg.ExperimentConfig(task=cfg.TaskConfig()))
  params = params_lib.build(params_lib.ConfigSources(
      experiment="plain_tfm_experiment", params_override="trainer.name=tfm_base"))
  assert params.trainer.name == "tfm_base"


def test_unknown_override_key_is_named():
  with pytest.raises(UsageError, match="'trian_steps'"):
    build(params_override="trainer.trian_steps=3")


def test_unknown_trainer_lists_registered_trainers():
  with pytest.raises(UsageError) as e:
    build(trainer="nope")
  assert "Unknown trainer 'nope'" in str(e.value)
  assert "'custom'" in str(e.value) and "'tfm_base'" in str(e.value)
