"""The one rule for the numbers of logs, and the one type check of a number."""

import numbers

import numpy as np
import pytest
import tensorflow as tf

from tfm_ext.model_dir import best_checkpoints
from tfm_ext.base import logs
from tfm_ext.base import values


LOGS = {"accuracy": tf.constant(0.75), "steps": 3,
        "coco": {"AP": np.float32(0.25), "image": tf.zeros([2, 2]),
                 "done": True, "name": "0.5", "phase": 1 + 2j},
        "lvis": {"mask": tf.zeros([2, 2])}}


def test_console_and_manifest_keep_the_same_numbers():
  assert logs.scalars(LOGS) == {"accuracy": 0.75, "steps": 3.0,
                                   "coco/AP": 0.25}
  # The manifest keeps the nesting, as TFM's info.json holds it.
  assert logs.scalar_tree(LOGS) == {"accuracy": 0.75, "steps": 3.0,
                                    "coco": {"AP": 0.25}, "lvis": {}}


def test_exporter_records_and_names_only_numbers(tmp_path):
  exporter = best_checkpoints.TopKCheckpointExporter(
      str(tmp_path / "best"), metric_name="coco|done", metric_comp="higher")
  checkpoint = tf.train.Checkpoint(v=tf.Variable(0.0))
  # A bool is no metric: the error lists what can rank.
  with pytest.raises(ValueError, match=r"they have: \['accuracy', 'coco\|AP', "
                     r"'steps'\]"):
    exporter.maybe_export_checkpoint(checkpoint, LOGS, 10)


def test_leaves_join_keys_and_keep_values_as_they_are():
  tree = {"task": {"model": {"units": [1, 2]}, "name": None}, "empty": {}}
  assert dict(logs.leaves(tree, ".")) == {"task.model.units": [1, 2],
                                          "task.name": None}


@pytest.mark.parametrize("value, kinds, expected", [
    (True, int, False), (False, (int, float), False), (True, object, True),
    (True, bool, True), (3, int, True), (3.5, (int, float), True),
    (np.float32(1.0), numbers.Real, True), (np.bool_(True), numbers.Real, False),
    ("3", int, False)])
def test_true_is_no_number(value, kinds, expected):
  assert values.is_a(value, kinds) is expected
