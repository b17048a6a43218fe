"""Paths TensorFlow cannot take, and records of the wrong kind, in every mode.

A path of bytes that are not UTF-8 (Python reads them from the command line
as surrogate escapes; TensorFlow's file systems take UTF-8 only), a name
longer than the file system allows, a directory where a record of the
model_dir belongs: each is one line naming the flag or the file, exit 2,
nothing written, whatever the mode.
"""

import os

import pytest

from conftest import assert_clean_usage_error

EXP = "--experiment=digits_convnet"
NOT_UTF8 = os.fsdecode(b"\xff")  # What Python makes of the byte 0xff.


def test_a_model_dir_that_is_not_utf8_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      model_dir=f"{tmp_path}/run{NOT_UTF8}")
  assert_clean_usage_error(run, "--model_dir=", r"run\xff",
                           "not UTF-8", "TensorFlow")


def test_a_config_file_that_is_not_utf8_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      f"--config_file={tmp_path}/c{NOT_UTF8}.yaml",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--config_file: ", r"c\xff.yaml",
                           "not UTF-8")


def test_an_input_path_that_is_not_utf8_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train", "--params_override=task."
                      f"train_data.input_path={tmp_path}/d{NOT_UTF8}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--params_override: ", "not UTF-8")


def test_a_model_dir_name_too_long_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      model_dir=tmp_path / ("x" * 300))
  assert_clean_usage_error(run, "is 300 bytes long",
                           "this file system takes at most 255")


@pytest.mark.parametrize("mode", ["train", "eval", "continuous_eval",
                                  "export"])
def test_a_directory_named_checkpoint_is_named_in_every_mode(
    launch_forked, tmp_path, mode):
  model_dir = tmp_path / "m"
  (model_dir / "checkpoint").mkdir(parents=True)
  run = launch_forked(EXP, f"--mode={mode}",
                      "--params_override=trainer.continuous_eval_timeout=1",
                      model_dir=model_dir)
  assert run.returncode == 2, run.stderr
  errors = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
  assert errors[0].startswith(f"error: {model_dir}/checkpoint, a file of "
                              "--model_dir, is not what the run"), errors
  assert os.listdir(model_dir) == ["checkpoint"]


def test_an_input_that_is_a_named_pipe_is_refused_without_waiting(
    launch_forked, tmp_path):
  # Opening it would wait for a writer without end (and every epoch).
  pipe = tmp_path / "train.tfrecord"
  os.mkfifo(pipe)
  run = launch_forked(EXP, "--mode=train",
                      f"--params_override=task.train_data.input_path={pipe}",
                      model_dir=tmp_path / "m", timeout=120)
  assert run.returncode == 3, run.stderr
  assert f"{pipe} is a named pipe (FIFO), not a file" in run.stderr
  assert "Traceback" not in run.stderr
  assert not (tmp_path / "m").exists()
