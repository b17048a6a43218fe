"""The trainer and model registries."""

import pytest

import tfm_ext
from tfm_ext.base import registry


def test_lookup_of_unknown_name_lists_names_and_suggests_closest():
  reg = registry.Registry("widget")
  reg.register("alpha")(object())
  reg.register("beta")(object())
  with pytest.raises(registry.RegistryError) as e:
    reg.get("alpah")
  message = str(e.value)
  assert "Unknown widget 'alpah'" in message
  assert "Did you mean 'alpha'?" in message
  assert "Registered widgets: 'alpha', 'beta'." in message


def test_registering_a_name_twice_raises():
  reg = registry.Registry("widget")
  reg.register("alpha")(int)
  with pytest.raises(registry.RegistryError, match="already registered"):
    reg.register("alpha")(float)
  assert reg.get("alpha") is int


def test_builtin_trainers_are_registered():
  assert tfm_ext.get_trainer("custom") is tfm_ext.CustomTrainer
  assert "tfm_base" in tfm_ext.TRAINERS.names()


def test_register_trainer_rejects_a_class_that_is_not_a_tfm_trainer():
  with pytest.raises(registry.RegistryError, match="base_trainer.Trainer"):
    tfm_ext.register_trainer("not_a_trainer")(dict)
  assert "not_a_trainer" not in tfm_ext.TRAINERS


def test_duplicate_trainer_registration_raises():
  with pytest.raises(registry.RegistryError, match="already registered"):
    tfm_ext.register_trainer("custom")(tfm_ext.CustomTrainer)


def test_unknown_trainer_lookup_lists_registered_trainers():
  with pytest.raises(registry.RegistryError) as e:
    tfm_ext.get_trainer("custon")
  assert "Did you mean 'custom'?" in str(e.value)
  assert "'tfm_base'" in str(e.value)


def test_model_registry_builds_registered_model_and_rejects_unknown():
  import registry_imports  # pylint: disable=unused-import
  from experiments import digits_convnet
  model = tfm_ext.build_model("digits_convnet", digits_convnet.ConvnetModel())
  assert model.output_shape == (None, 10)
  with pytest.raises(registry.RegistryError, match="Did you mean 'digits_convnet'"):
    tfm_ext.build_model("digits_convnett", None)
  with pytest.raises(registry.RegistryError, match="already registered"):
    tfm_ext.register_model("digits_convnet")(lambda config: None)
