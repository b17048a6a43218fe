"""TFM's train.py flags: every one accepted by the launcher, with TFM's meaning.

TFM's flag list is read from `official.common.flags.define_flags` at run
time, so a flag TFM adds is missing here until the launcher takes it.
"""

import functools
import logging
import os
import types

from absl import flags
from absl.testing import flagsaver
import gin
import pytest
import tensorflow as tf

from official.common import flags as tfm_flags
from official.core import train_utils

import registry_imports  # pylint: disable=unused-import
from tfm_ext.run import launcher

from conftest import SMOKE
from tfm_ext.run import driver

FLAGS = flags.FLAGS


def tfm_train_flags() -> flags.FlagValues:
  """TFM's `define_flags`, run into a fresh `FlagValues`.

  It takes no `flag_values`: it runs here with a module `flags` whose
  DEFINE functions write into the fresh one.
  """
  fresh = flags.FlagValues()

  class _Into:

    def __getattr__(self, name):
      attr = getattr(flags, name)
      if name.startswith("DEFINE"):
        return functools.partial(attr, flag_values=fresh)
      return attr

  define = tfm_flags.define_flags
  types.FunctionType(define.__code__,
                     dict(define.__globals__, flags=_Into()))()
  return fresh


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def parse(*args):
  """Parses `args` into the launcher's flags (restored by flagsaver)."""
  FLAGS.unparse_flags()
  FLAGS(["train.py", "--experiment=digits_convnet", "--mode=train",
         "--model_dir=/tmp/unused", *args])


def test_every_tfm_train_flag_is_a_launcher_flag_with_tfm_type_default_help():
  tfm = tfm_train_flags()
  assert len(tfm) >= 12, sorted(tfm)
  for name in tfm:
    assert name in FLAGS, f"--{name}"
    if name == "mode":
      continue
    ours, theirs = FLAGS[name], tfm[name]
    assert (ours.flag_type(), ours.default, ours.help) == (
        theirs.flag_type(), theirs.default, theirs.help), name
  # TFM's enum, a string here: every name TFM takes parses, and our modes
  # table refuses what it cannot run (tests/e2e/test_bad_input.py).
  for mode in tfm["mode"].parser.enum_values:
    assert FLAGS["mode"].parser.parse(mode) == mode
  # TFM's train.py defines this one next to its main().
  assert FLAGS["enable_async_checkpointing"].flag_type() == "bool"


@flagsaver.flagsaver
def test_config_flags_build_the_task_tfm_parse_configuration_builds(tmp_path):
  config = tmp_path / "c.yaml"
  config.write_text("task:\n  train_data:\n    global_batch_size: 32\n")
  parse(f"--config_file={config}", "--params_override=trainer.train_steps=7",
        "--tpu=grpc://10.0.0.2:8470",
        "--tf_data_service=grpc://dispatcher:5050",
        "--enable_async_checkpointing")
  request = launcher._request()  # pylint: disable=protected-access
  params = driver.build_params(request)  # As `driver.prepare` builds it.
  task = params.task
  # TFM's parse_data_service: both input readers get the address.
  assert task.train_data.tf_data_service_address == "grpc://dispatcher:5050"
  assert (task.validation_data.tf_data_service_address
          == "grpc://dispatcher:5050")
  assert task.train_data.global_batch_size == 32
  assert params.trainer.train_steps == 7
  assert params.runtime.tpu == "grpc://10.0.0.2:8470"
  assert request.enable_async_checkpointing
  # TFM's own parser, on the same flags, builds the same task.
  tfm = train_utils.parse_configuration(FLAGS, lock_return=False,
                                        print_return=False)
  assert task.as_dict() == tfm.task.as_dict()
  assert params.runtime.tpu == tfm.runtime.tpu


@flagsaver.flagsaver
def test_flags_tfm_never_reads_are_accepted_and_each_logged_once(caplog):
  parse("--tpu_platform=v5e", "--tfhub_handle=h", "--tflex_output_uri=u")
  with caplog.at_level(logging.WARNING):
    request = launcher._request()  # pylint: disable=protected-access
  noted = [r.getMessage() for r in caplog.records if "no effect" in
           r.getMessage()]
  assert sorted(noted) == sorted(
      f"--{name}={value} has no effect: TFM's train.py does not read it "
      "either." for name, value in (("tpu_platform", "v5e"),
                                    ("tfhub_handle", "h"),
                                    ("tflex_output_uri", "u")))
  assert not request.enable_async_checkpointing


def test_help_lists_the_launcher_flags_and_tfm(launch_forked, tmp_path):
  out = launch_forked("--help", model_dir=tmp_path / "unused")
  assert "Try --helpfull" in out.stdout, out.stderr
  assert out.returncode == 0  # absl's own --help exits 1.
  ours = [f.name for f in FLAGS.get_flags_for_module(launcher.__name__)]
  assert {"trainer", "list", "enable_async_checkpointing"} <= set(ours)
  for name in list(tfm_train_flags()) + ours:
    assert f"--{name}:" in out.stdout or f"--[no]{name}:" in out.stdout, name


def test_async_checkpointing_run_saves_checkpoints_a_resume_restores(
    launch_forked, run_in_process, tmp_path):
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      f"--params_override={SMOKE}",
                      "--enable_async_checkpointing", model_dir=tmp_path / "m")
  assert run.returncode == 0, run
  assert run.summary()["global_step"] == 40
  with open(os.path.join(run.model_dir, "logs", "tfm_ext.INFO")) as f:
    log = f.read()
  # Orbit's saves (checkpoint_interval 20) went to TF's background writer.
  assert log.count("Starting async checkpoint save") == 2, log[-3000:]
  assert tf.train.latest_checkpoint(run.model_dir).endswith("ckpt-40")
  summary, _ = run_in_process(
      "digits_convnet", "train", run.model_dir,
      override=SMOKE.replace("train_steps=40", "train_steps=50"))
  assert (summary.status, summary.resumed_from_step, summary.global_step) == (
      "completed", 40, 50)


def test_print_config_prints_the_operative_yaml_and_writes_nothing(
    launch_forked, tmp_path):
  import yaml  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "m"
  proc = launch_forked("--experiment=digits_convnet", "--print_config",
                       "--params_override=trainer.train_steps=7",
                       "--trainer=tfm_base", model_dir=model_dir)
  assert proc.returncode == 0, proc.stderr[-3000:]
  config = yaml.safe_load(proc.stdout)
  assert config["trainer"]["train_steps"] == 7
  assert config["trainer"]["name"] == "tfm_base"
  assert config["task"]["model"]["name"] == "digits_convnet"
  assert not model_dir.exists()
