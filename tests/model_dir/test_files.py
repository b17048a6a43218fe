"""Records in model_dir (`tfm_ext.model_dir.files`): whole or skipped, never
half-read."""

import logging as std_logging
import uuid

import pytest
import tensorflow as tf

from tfm_ext.model_dir import files

REQUIRED = ("checkpoint", "global_step")


def test_a_record_without_every_required_key_is_skipped(caplog):
  directory = f"ram://{uuid.uuid4().hex}/records"
  files.write_record(directory, "a", {"checkpoint": "ckpt-10",
                                       "global_step": 10})
  # Parses as JSON, holds one of the two keys: not a whole record.
  files.write_record(directory, "b", {"checkpoint": "ckpt-20"})
  legacy = f"{directory}.jsonl"
  with tf.io.gfile.GFile(legacy, "w") as f:
    f.write('{"global_step": 5}\n{"checkpoint": "ckpt-5", "global_step": 5}\n')
  with caplog.at_level(std_logging.WARNING):
    records = files.read_records(directory, REQUIRED, legacy_file=legacy)
  assert records == [{"checkpoint": "ckpt-5", "global_step": 5},
                     {"checkpoint": "ckpt-10", "global_step": 10}]
  skipped = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("Skipping")]
  assert len(skipped) == 2, skipped
  assert f"{directory}/b.json" in skipped[1] and f"{legacy}:1" in skipped[0]


@pytest.mark.parametrize("path, inside", [
    ("ckpt-40", True), ("/runs/a/ckpt-40", True), ("/runs/a/./ckpt-40", True),
    ("/runs/b/ckpt-40", False), ("../b/ckpt-40", False),
    ("/runs/a/sub/ckpt-40", False), ("/runs/a/../b/ckpt-40", False),
    ("gs://bucket/runs/a/ckpt-40", False)])
def test_in_directory_is_an_entry_of_the_directory_itself(path, inside):
  assert files.in_directory("/runs/a", path) is inside
  assert files.in_directory("/runs/a/", path) is inside


def test_in_directory_of_a_relative_directory(tmp_path, monkeypatch):
  # A manager of a relative model_dir holds `run/ckpt-5`: each was taken for
  # another directory's, and no checkpoint was ever rotated.
  monkeypatch.chdir(tmp_path)
  assert files.in_directory("run", "run/ckpt-5")
  assert files.in_directory("run", "./run/ckpt-5")
  assert files.in_directory("run", "ckpt-5")
  assert files.in_directory("run", f"{tmp_path}/run/ckpt-5")
  assert files.in_directory(f"{tmp_path}/run", "run/ckpt-5")
  assert not files.in_directory("run", "other/ckpt-5")
  assert not files.in_directory("run", "run/sub/ckpt-5")


def test_in_directory_of_a_bucket():
  assert files.in_directory("gs://b/runs/a", "gs://b/runs/a/ckpt-1")
  assert files.in_directory("gs://b/runs/a", "ckpt-1")
  assert not files.in_directory("gs://b/runs/a", "gs://c/runs/a/ckpt-1")
  assert not files.in_directory("gs://b/runs/a", "/runs/a/ckpt-1")
