"""Resuming with a changed config: refused with a diff, unless harmless.

The runs that only train run in-process; the refusals and the forced
resume are launcher processes (the refusals forked, `launch_forked`).
"""

import pytest

from conftest import SMOKE
from tfm_ext.config import config_drift

EXP = "--experiment=digits_convnet"


def test_resume_with_changed_batch_or_optimizer_is_refused_with_diff(
    run_in_process, launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  first, _ = run_in_process("digits_convnet", "train", model_dir, SMOKE)
  assert first.status == "completed", first
  params = (model_dir / "params.yaml").read_text()

  changed = launch_forked(EXP, "--mode=train", f"--params_override={SMOKE},"
                          "task.train_data.global_batch_size=32,"
                          "trainer.optimizer_config.optimizer.type=sgd",
                          model_dir=model_dir)
  assert changed.returncode == 2, changed
  assert "Traceback" not in changed.stderr
  assert "task.train_data.global_batch_size: 64 -> 32" in changed.stderr
  assert "trainer.optimizer_config.optimizer.type: 'adam' -> 'sgd'" in (
      changed.stderr)
  assert "--allow_config_change" in changed.stderr
  assert (model_dir / "params.yaml").read_text() == params  # Untouched.

  trainer = launch_forked(EXP, "--mode=train", f"--params_override={SMOKE}",
                          "--trainer=tfm_base", model_dir=model_dir)
  assert trainer.returncode == 2 and "trainer.name: 'custom' -> 'tfm_base'" in (
      trainer.stderr), trainer


@pytest.mark.slow
def test_harmless_changes_resume_and_override_flag_forces(
    run_in_process, launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  first, _ = run_in_process("digits_convnet", "train", model_dir, SMOKE)
  assert first.status == "completed", first
  longer, _ = run_in_process(
      "digits_convnet", "train", model_dir,
      "trainer.train_steps=60,trainer.steps_per_loop=20,"
      "trainer.summary_interval=20,trainer.checkpoint_interval=20,"
      "trainer.validation_interval=30")
  assert longer.status == "completed", longer
  assert longer.global_step == 60
  forced = launch_forked(EXP, "--mode=train", "--allow_config_change",
                         "--params_override=" + SMOKE.replace(
                             "train_steps=40", "train_steps=80")
                         + ",task.train_data.global_batch_size=32",
                         model_dir=model_dir)
  assert forced.returncode == 0, forced
  assert forced.summary()["global_step"] == 80
  assert "global_batch_size: 32" in (model_dir / "params.yaml").read_text()


def test_a_field_on_one_side_only_is_a_difference():
  old = {"task": {"model": {"dense_units": 128}}, "trainer": {}}
  new = {"task": {"model": {"dense_units": 128, "dropout_rate": 0.5}},
         "trainer": {"train_steps": 60}}
  # A new trainer.train_steps is harmless (HARMLESS); a new model field is not.
  assert config_drift.diff(old, new) == [
      "  task.model.dropout_rate: '<absent>' -> 0.5"]
  assert config_drift.diff(new, old) == [
      "  task.model.dropout_rate: 0.5 -> '<absent>'"]
