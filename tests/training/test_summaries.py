"""`ScalarSummaryManager` writes what Orbit's `SummaryManager` writes."""

import glob
import os

import numpy as np
import orbit
import pytest
import tensorflow as tf

from tfm_ext.run import strategies
from tfm_ext.training import summaries

LOGS = {
    "training_loss": np.float32(0.25),
    "accuracy": np.float64(0.875),
    "steps_per_second": 12.5,
    "count": np.int64(7),
    "nan_loss": float("nan"),
    "learning_rate/head": np.array(0.002, dtype=np.float32),
    "per_dataset": {"loss": np.float32(1.5), "deeper": {"top_5": 0.5}},
}


def events(directory):
  """`(dir, step, tag, dtype, shape, value, plugin)` of every summary."""
  found = []
  for path in sorted(glob.glob(os.path.join(directory, "**", "events.*"),
                               recursive=True)):
    relative = os.path.relpath(os.path.dirname(path), directory)
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        array = tf.make_ndarray(value.tensor)
        found.append((relative, event.step, value.tag, array.dtype.name,
                      array.shape, repr(array.tolist()),
                      value.metadata.plugin_data.plugin_name,
                      value.metadata.SerializeToString()))
  return sorted(found)


def write(manager_cls, directory, step, logs, summary_fn=tf.summary.scalar):
  manager = manager_cls(directory, summary_fn, global_step=step)
  manager.write_summaries(logs)
  manager.flush()


def test_writes_the_events_orbit_writes(tmp_path):
  step = tf.Variable(40, dtype=tf.int64)
  write(orbit.utils.SummaryManager, str(tmp_path / "orbit"), step, LOGS)
  write(summaries.ScalarSummaryManager, str(tmp_path / "ours"), step, LOGS)
  ours = events(str(tmp_path / "ours"))
  assert ours == events(str(tmp_path / "orbit"))
  assert len(ours) == 8  # Every leaf, in three directories.
  assert {e[0] for e in ours} == {".", "per_dataset", "per_dataset/deeper"}
  assert ours[0][:7] == (".", 40, "accuracy", "float32", (), "0.875",
                        "scalars")


def test_a_name_scope_prefixes_tags_as_orbit(tmp_path):
  step = tf.Variable(3, dtype=tf.int64)
  with tf.name_scope("outer"):
    write(orbit.utils.SummaryManager, str(tmp_path / "orbit"), step,
          {"loss": 1.0})
    write(summaries.ScalarSummaryManager, str(tmp_path / "ours"), step,
          {"loss": 1.0})
  assert events(str(tmp_path / "ours")) == events(str(tmp_path / "orbit"))
  assert events(str(tmp_path / "ours"))[0][2] == "outer/loss"


def test_record_if_false_writes_nothing(tmp_path):
  step = tf.Variable(1, dtype=tf.int64)
  with tf.summary.record_if(False):
    write(summaries.ScalarSummaryManager, str(tmp_path), step, LOGS)
  assert events(str(tmp_path)) == []


def test_other_values_go_to_summary_fn(tmp_path):
  step = tf.Variable(5, dtype=tf.int64)
  logs = {"loss": 0.5, "weights": np.arange(4.0), "flag": True}
  write(summaries.ScalarSummaryManager, str(tmp_path), step, logs,
        summary_fn=tf.summary.histogram)
  written = {e[2]: e for e in events(str(tmp_path))}
  assert written["loss"][-2] == "scalars"
  assert written["weights"][-2] == "histograms"
  assert written["flag"][-2] == "histograms"


def test_a_tensor_that_is_no_scalar_is_a_histogram_not_an_error(tmp_path):
  # tf.summary.scalar, Orbit's and stock TFM's summary_fn, raises on it.
  step = tf.Variable(5, dtype=tf.int64)
  with pytest.raises(ValueError):
    write(orbit.utils.SummaryManager, str(tmp_path / "orbit"), step,
          {"per_class": np.arange(4.0)})
  write(summaries.ScalarSummaryManager, str(tmp_path / "ours"), step,
        {"per_class": np.arange(4.0), "count": tf.constant(3.0)})
  written = {e[2]: e for e in events(str(tmp_path / "ours"))}
  assert written["per_class"][-2] == "histograms"
  assert written["count"][-2] == "scalars"


def test_images_are_written_as_stock_tfm_writes_them(tmp_path):
  # Semantic segmentation's evaluation with task.allow_image_summary, as
  # stock's train.py writes it (official.vision.utils.summary_manager).
  from official.vision.utils import summary_manager as tfm_summaries  # pylint: disable=g-import-not-at-top
  step = tf.Variable(6, dtype=tf.int64)
  images = tf.random.stateless_uniform([25, 8, 8, 3], seed=[1, 2])
  logs = {"mean_iou": np.float32(0.5),
          "image/validation_outputs": images}
  tfm_summaries.ImageScalarSummaryManager(
      str(tmp_path / "stock"), scalar_summary_fn=tf.summary.scalar,
      image_summary_fn=tf.summary.image, global_step=step).write_summaries(logs)
  write(summaries.ScalarSummaryManager, str(tmp_path / "ours"), step, logs)
  ours = events(str(tmp_path / "ours"))
  stock = events(str(tmp_path / "stock"))
  assert ours == stock
  image = [e for e in ours if e[2].startswith("image/")]
  assert len(image) == 1 and image[0][-2] == "images"
  assert image[0][4] == (22,)  # Width, height, then 20 encoded images.


def test_host_readable_step_follows_the_mirrored_step():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with strategy.scope():
    global_step = orbit.utils.create_global_step()
  step = strategies.host_readable(global_step, strategy)
  assert not isinstance(step, tf.distribute.DistributedValues)

  @tf.function
  def train_steps():
    for _ in tf.range(3):
      strategy.run(lambda: global_step.assign_add(1))

  train_steps()
  assert step.numpy() == global_step.numpy() == 3
  plain = tf.Variable(0, dtype=tf.int64)
  assert strategies.host_readable(plain, tf.distribute.get_strategy()) is plain
