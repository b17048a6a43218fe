"""The trainer and model registries."""

import os
import subprocess
import sys
import warnings

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


_CELL = '''
@reg.register("alpha")
def build():
  return {value}
'''


def _run_cell(namespace, value):
  exec(compile(_CELL.format(value=value), "<cell>", "exec"), namespace)  # pylint: disable=exec-used


def test_a_definition_run_again_replaces_itself_and_warns_if_edited():
  # A notebook's cell run twice: the same module (__main__) and name.
  reg = registry.Registry("widget")
  namespace = {"reg": reg, "__name__": "__main__"}
  _run_cell(namespace, 1)
  first = reg.get("alpha")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _run_cell(namespace, 1)  # Unchanged: no warning.
  assert reg.get("alpha") is not first and reg.get("alpha")() == 1
  with pytest.warns(UserWarning, match="registered again by __main__.build, "
                    "with other code"):
    _run_cell(namespace, 2)
  assert reg.get("alpha")() == 2
  with pytest.raises(registry.RegistryError, match="already registered"):
    reg.register("alpha")(lambda: 3)  # Another definition.


_NOTEBOOK = '''
import warnings
{first}
from official.core import config_definitions as cfg
from official.core import exp_factory
cell = """
@exp_factory.register_config_factory("nb/exp")
def nb_exp():
  return cfg.ExperimentConfig(task=cfg.TaskConfig(name={{name!r}}))
"""
namespace = {{"exp_factory": exp_factory, "cfg": cfg, "__name__": "__main__"}}
for name in ("a", "a", "b"):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec(compile(cell.format(name=name), "<cell>", "exec"), namespace)
  print(name, exp_factory.get_exp_config("nb/exp").task.name,
        sum("registered again" in str(w.message) for w in caught))
try:
  exp_factory.register_config_factory("nb/exp")(lambda: None)
except KeyError as e:
  print("refused", e)
'''


@pytest.mark.parametrize("first", ["import tfm_ext",
                                   "import official.core.registry\n"
                                   "import tfm_ext"])
def test_tfms_registries_take_a_notebook_cell_run_again(first):
  # TFM's own decorator, in a fresh interpreter: tfm_ext imported before
  # TFM's registry (it changes it once imported) or after.
  probe = subprocess.run(
      [sys.executable, "-c", _NOTEBOOK.format(first=first)],
      capture_output=True, text=True, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert probe.returncode == 0, probe.stderr
  assert probe.stdout.splitlines() == [
      "a a 0", "a a 0", "b b 1",
      "refused 'Function or class exp registered multiple times.'"]
