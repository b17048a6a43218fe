"""Trainer selection and config building (flag > gin > override > file > default)."""

import gin
import pytest
import tensorflow as tf

import registry_imports  # pylint: disable=unused-import
from tfm_ext.config import params as params_lib
from tfm_ext.base.errors import UsageError


def write(path, text):
  path.write_text(text)
  return str(path)


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


def test_unknown_override_key_names_the_closest_keys():
  with pytest.raises(UsageError) as e:
    build(params_override="trainer.trian_steps=3")
  assert "sets trainer.trian_steps, a key the experiment config" in str(e.value)
  assert "Closest: trainer.train_steps" in str(e.value)
  with pytest.raises(UsageError, match="Closest: task.model[.] The keys of "
                     "task: .*train_data, validation_data[.]"):
    build(params_override="task.modell.name=x")


@pytest.mark.parametrize("section,wrong,right,other", [
    ("optimizer", "adamm", "adam", "'sgd'"),
    ("learning_rate", "cosin", "cosine", "'stepwise'"),
    ("warmup", "liner", "linear", "'polynomial'")])
def test_an_unknown_one_of_type_lists_the_types(section, wrong, right, other):
  with pytest.raises(UsageError) as e:
    build(params_override=f"trainer.optimizer_config.{section}.type={wrong}")
  message = str(e.value)
  assert (f"Unknown trainer.optimizer_config.{section}.type {wrong!r}. "
          f"Did you mean {right!r}?") in message
  assert f"The types of trainer.optimizer_config.{section}: " in message
  assert other in message


def test_unknown_trainer_lists_registered_trainers():
  with pytest.raises(UsageError) as e:
    build(trainer="nope")
  assert "Unknown trainer 'nope'" in str(e.value)
  assert "'custom'" in str(e.value) and "'tfm_base'" in str(e.value)


class _FakeTime:
  """A clock that only the injected sleep moves."""

  def __init__(self, on_sleep=lambda: None):
    self.now = 0.0
    self.sleeps = []
    self._on_sleep = on_sleep

  def clock(self):
    return self.now

  def sleep(self, seconds):
    self.sleeps.append(seconds)
    self.now += seconds
    self._on_sleep()


def test_an_evaluator_does_not_wait_on_checkpoints_without_params_yaml(
    tmp_path):
  # Checkpoints written without a params.yaml: evaluated as the flags say.
  tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(tmp_path / "ckpt"))
  fake = _FakeTime()
  assert params_lib.await_trainer_params(
      str(tmp_path), timeout=60, clock=fake.clock, sleep=fake.sleep) == ""
  assert fake.sleeps == []


def test_an_evaluator_waits_for_params_yaml_then_follows_it(tmp_path, capsys):
  params_yaml = tmp_path / "params.yaml"
  fake = _FakeTime(on_sleep=lambda: fake.now >= 3 and params_yaml.touch())
  assert params_lib.await_trainer_params(
      str(tmp_path), timeout=60, clock=fake.clock,
      sleep=fake.sleep) == str(params_yaml)
  assert fake.sleeps == [1.0] * 3
  assert capsys.readouterr().out.count("waiting up to 60s") == 1


def test_an_evaluator_gives_up_waiting_after_the_timeout(tmp_path):
  fake = _FakeTime()
  # Its own timeout: it would find no checkpoint either, so it stops here
  # rather than wait a second timeout in continuous_eval.
  with pytest.raises(UsageError, match="continuous_eval_timeout=5s"):
    params_lib.await_trainer_params(
        str(tmp_path), timeout=5, clock=fake.clock, sleep=fake.sleep)
  assert fake.sleeps == [1.0] * 5


@pytest.mark.parametrize("make, said", [
    (lambda d: str(d), "is a directory: give a gin file"),
    (lambda d: str(d / "missing.gin"), "does not exist"),
    (lambda d: write(d / "bad.gin", "tfm_ext.trainer.name = 'custom'\n"
                     "tfm_ext.trainer.name = \n"),
     "does not parse at line 2"),
    (lambda d: write(d / "unknown.gin", "tfm_ext.trainer.nmae = 'custom'\n"),
     "is refused by gin (ValueError): Configurable 'tfm_ext.trainer' "
     "doesn't have a parameter named 'nmae'"),
])
def test_a_bad_gin_file_is_refused_naming_it(tmp_path, make, said):
  path = make(tmp_path)
  with pytest.raises(UsageError) as raised:
    params_lib.parse_gin([path], [])
  assert f"--gin_file {path!r} {said}" in str(raised.value)
  assert "\n" not in str(raised.value)


def test_a_bad_gin_binding_is_refused_naming_it():
  with pytest.raises(UsageError, match=r"^Bad gin configuration: "
                     r"--gin_params 'tfm_ext.trainer.name = ' does not parse "
                     "at line 1"):
    params_lib.parse_gin([], ["tfm_ext.trainer.name = "])


def test_gin_files_then_bindings_set_the_trainer(tmp_path):
  path = write(tmp_path / "t.gin", "tfm_ext.trainer.name = 'custom'\n")
  params_lib.parse_gin([path], ["tfm_ext.trainer.name = 'tfm_base'"])
  assert params_lib.gin_trainer() == "tfm_base"
