"""A model_dir is checked before anything is written to it.

The faults a launched run meets through this check (a full or read-only
disk, a bucket that does not answer) are in tests/base/test_failures.py
and tests/e2e/test_gcs.py.
"""

import os

import pytest
import tensorflow as tf

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import usable


@pytest.mark.parametrize("name", ["job[1]", "job*", "job?"])
def test_model_dir_with_glob_characters_is_refused(tmp_path, name):
  with pytest.raises(UsageError, match="glob"):
    usable.check_usable(str(tmp_path / name))


def test_model_dir_that_is_a_file_or_under_one_is_refused(tmp_path):
  a_file = tmp_path / "f"
  a_file.write_text("x")
  with pytest.raises(UsageError, match="is a file, not a directory"):
    usable.check_usable(str(a_file))
  with pytest.raises(UsageError, match="its parent .* is a file"):
    usable.check_usable(str(a_file / "run"))


def test_model_dir_on_a_file_system_tensorflow_cannot_reach_is_refused():
  with pytest.raises(UsageError, match="nofs://bucket/run.* cannot be used"):
    usable.check_usable("nofs://bucket/run", store_timeout=30)


def _params(**trainer):
  from official.core import config_definitions  # pylint: disable=g-import-not-at-top
  return config_definitions.ExperimentConfig(
      trainer=config_definitions.TrainerConfig(**trainer))


def test_every_record_of_the_wrong_kind_is_named_in_one_refusal(tmp_path):
  (tmp_path / "train").write_text("mine")
  (tmp_path / "metrics.csv").mkdir()
  (tmp_path / "export").mkdir()
  (tmp_path / "export" / "300").write_text("mine")

  with pytest.raises(UsageError) as refused:
    usable.check_usable(str(tmp_path))

  message = str(refused.value)
  for wrong in (f"{tmp_path}/train is a file, where the run writes a "
                "directory (TensorBoard's training summaries)",
                f"{tmp_path}/metrics.csv is a directory, where the run writes "
                "a file", f"{tmp_path}/export/300 is a file"):
    assert wrong in message
  assert sorted(os.listdir(tmp_path)) == ["export", "metrics.csv", "train"]


def test_records_a_config_names_are_checked_once_the_config_is_known(
    tmp_path):
  (tmp_path / "val").write_text("mine")
  (tmp_path / "best").mkdir()
  (tmp_path / "best" / "best_checkpoints.json").mkdir()
  params = _params(validation_summary_subdir="val",
                   best_checkpoint_export_subdir="best")
  usable.check_records(str(tmp_path))  # Which names: not known yet.

  with pytest.raises(UsageError) as refused:
    usable.check_records(str(tmp_path), params, "eval")

  assert f"{tmp_path}/val is a file" in str(refused.value)
  assert f"{tmp_path}/best/best_checkpoints.json is a directory" in str(
      refused.value)
  # Without a best-checkpoint folder, that row names nothing.
  (tmp_path / "val").unlink()
  usable.check_records(str(tmp_path), _params(validation_summary_subdir="val",
                                              best_checkpoint_export_subdir=""),
                       "eval")


def test_writes_in_flight_are_not_records(tmp_path):
  # A killed save's and a killed export's leftovers: their writers clear them.
  for folder in ("ckpt-20_temp", "best_ckpt/best_ckpt-20_temp",
                 "export/.20.partial.ab12"):
    (tmp_path / folder).mkdir(parents=True)
  (tmp_path / "ckpt-20.index.tmp1f2e").mkdir()
  usable.check_records(str(tmp_path), _params(
      best_checkpoint_export_subdir="best_ckpt"), "train")


def test_an_object_where_a_folder_belongs_in_a_store_is_refused():
  tf.io.gfile.makedirs("ram://records/m/validation")
  with tf.io.gfile.GFile("ram://records/m/training_starts", "w") as f:
    f.write("mine")
  with pytest.raises(UsageError, match="training_starts is a file, where"):
    usable.check_records("ram://records/m")
