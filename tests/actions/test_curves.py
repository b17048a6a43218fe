"""Results at a glance: `metrics.csv` and `curves.png` in every model_dir."""

import ast
import csv
import io
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from tfm_ext.actions import curves
from tfm_ext.model_dir import files

# 40 steps in loops of 10 (the first loop of a process is one step), an
# evaluation every 20.
SHORT = ("trainer.train_steps=40,trainer.steps_per_loop=10,"
         "trainer.summary_interval=10,trainer.checkpoint_interval=20,"
         "trainer.validation_interval=20")
TRAIN_STEPS = [1, 10, 20, 30, 40]


def read_csv(model_dir):
  """`{step: {column: value or None}}` and the header of `metrics.csv`."""
  reader = csv.reader(io.StringIO(
      files.read_text(os.path.join(model_dir, curves.METRICS_CSV))))
  header = next(reader)
  rows = {int(row[0]): {name: float(cell) if cell else None
                        for name, cell in zip(header[1:], row[1:])}
          for row in reader}
  return header, rows


def steps_with(rows, column):
  return [step for step, values in rows.items()
          if values.get(column) is not None]


def assert_a_real_figure(model_dir, panels=3):
  with tf.io.gfile.GFile(os.path.join(model_dir, curves.CURVES_PNG),
                         "rb") as f:
    image = tf.io.decode_png(f.read()).numpy()
  height, width, _ = image.shape
  assert (height, width) == (360, 420 * panels), image.shape
  colours = np.unique(image.reshape(-1, image.shape[-1]), axis=0)
  # Not blank: lines, text and axes in many colours, on a white ground.
  assert len(colours) > 50, len(colours)
  assert (image[..., :3] < 128).mean() > 0.005


def test_train_and_eval_leaves_a_row_per_logged_step_and_a_figure(
    run_in_process, tmp_path, monkeypatch):
  # Every loop and evaluation refreshes (the defaults wait minutes), and
  # what each refresh wrote is kept.
  monkeypatch.setattr(curves, "TRAIN_REFRESH_SECONDS", 0)
  monkeypatch.setattr(curves, "EVAL_REFRESH_SECONDS", 0)
  refreshes = []
  real_refresh = curves.refresh

  def refresh(model_dir, trainer_config, pending=None):
    wrote = real_refresh(model_dir, trainer_config, pending)
    (step, values), = (pending or {None: {}}).items()
    kind = ("end" if step is None else "eval"
            if "validation_loss" in values else "train")
    refreshes.append((kind, step, wrote and read_csv(model_dir)[1]))
    return wrote

  monkeypatch.setattr(curves, "refresh", refresh)
  summary, _ = run_in_process("digits_convnet", "train_and_eval", tmp_path,
                              SHORT)
  assert summary.status == "completed"
  # After each loop, each evaluation, and once at the end.
  assert [(kind, step) for kind, step, _ in refreshes] == [
      ("train", 1), ("train", 10), ("train", 20), ("eval", 20),
      ("train", 30), ("train", 40), ("eval", 40), ("end", None)]
  # Not before the first summary is written (after the first loop's
  # actions); then with what was logged so far and the action's own output
  # (Orbit writes it to the event files after the actions).
  assert refreshes[0][2] is False
  for kind, step, rows in refreshes[1:-1]:
    assert max(rows) == step
    assert steps_with(rows, "training_loss") == [
        s for s in TRAIN_STEPS if s <= step]
    assert steps_with(rows, "validation_loss") == [
        s for s in (20, 40) if s < step or s == step and kind == "eval"]

  header, rows = read_csv(str(tmp_path))
  assert header[0] == "step"
  for name in ("training_loss", "accuracy", "learning_rate",
               "steps_per_second", "validation_loss", "validation_accuracy"):
    assert name in header, header
  # Training columns first, then validation's.
  assert header.index("training_loss") < header.index("validation_loss")
  # A row per step a loop or an evaluation logged, and only those.
  assert sorted(rows) == TRAIN_STEPS
  assert steps_with(rows, "training_loss") == TRAIN_STEPS
  assert steps_with(rows, "learning_rate") == TRAIN_STEPS
  assert steps_with(rows, "validation_loss") == [20, 40]
  assert steps_with(rows, "validation_accuracy") == [20, 40]
  # The values TensorBoard shows (float32) and the run reports.
  last = rows[40]
  assert last["validation_accuracy"] == pytest.approx(
      summary.eval_metrics["accuracy"], rel=1e-6)
  assert last["training_loss"] == pytest.approx(
      summary.train_metrics["training_loss"], rel=1e-6)
  # 25 warm-up steps, then a cosine decay: up, then down.
  rates = [rows[s]["learning_rate"] for s in TRAIN_STEPS]
  assert rates[0] < rates[1] < rates[2] < rates[3] and rates[4] < rates[3]
  assert_a_real_figure(str(tmp_path))


def test_a_bucket_model_dir_gets_them_and_an_evaluator_adds_its_rows(
    run_in_process):
  model_dir = f"ram://{uuid.uuid4().hex}"
  run_in_process("digits_convnet", "train", model_dir, SHORT)
  header, rows = read_csv(model_dir)
  assert sorted(rows) == TRAIN_STEPS
  assert not [name for name in header if name.startswith("validation_")]
  assert_a_real_figure(model_dir)

  summary, _ = run_in_process("digits_convnet", "eval", model_dir, SHORT)
  header, rows = read_csv(model_dir)
  assert sorted(rows) == TRAIN_STEPS  # The evaluation is at step 40.
  assert steps_with(rows, "validation_accuracy") == [40]
  assert rows[40]["validation_accuracy"] == pytest.approx(
      summary.eval_metrics["accuracy"], rel=1e-6)
  assert steps_with(rows, "training_loss") == TRAIN_STEPS
  assert_a_real_figure(model_dir)


def write_scalars(directory, step, **values):
  with tf.summary.create_file_writer(directory).as_default():
    for name, value in values.items():
      tf.summary.scalar(name, value, step=step)


class Config:
  validation_summary_subdir = "eval"
  best_checkpoint_eval_metric = ""


def test_an_evaluations_output_is_in_before_orbit_writes_it(tmp_path):
  model_dir = str(tmp_path)
  write_scalars(f"{model_dir}/train", 10, training_loss=2.0, accuracy=0.5)
  write_scalars(f"{model_dir}/eval", 10, validation_loss=2.5, accuracy=0.4)
  step = tf.Variable(20, dtype=tf.int64)
  action = curves.RefreshResults(
      model_dir=model_dir, trainer_config=Config(), global_step=step,
      prefix=curves.VALIDATION_PREFIX)

  action({"accuracy": np.float64(0.75), "validation_loss": 1.0})
  header, rows = read_csv(model_dir)
  assert header == ["step", "accuracy", "training_loss", "validation_accuracy",
                    "validation_loss"]
  assert rows == {
      10: {"accuracy": 0.5, "training_loss": 2.0,
           "validation_accuracy": pytest.approx(0.4),
           "validation_loss": 2.5},
      20: {"accuracy": None, "training_loss": None,
           "validation_accuracy": 0.75, "validation_loss": 1.0}}
  assert_a_real_figure(model_dir, panels=2)  # No learning rate.


def test_a_training_refresh_waits_its_interval():
  model_dir = f"ram://{uuid.uuid4().hex}"
  write_scalars(f"{model_dir}/train", 1, training_loss=2.0)
  now = [100.0]
  action = curves.RefreshResults(
      model_dir=model_dir, trainer_config=Config(),
      global_step=tf.Variable(10, dtype=tf.int64), prefix="",
      every_seconds=120, clock=lambda: now[0])
  refreshes = []
  for t in (100, 219, 220, 300, 341):
    now[0] = t
    action({"training_loss": 1.0})
    refreshes.append(action.refreshes)
  assert refreshes == [0, 0, 1, 1, 2]
  assert sorted(read_csv(model_dir)[1]) == [1, 10]


def test_steps_logged_again_after_a_resume_replace_the_lost_ones(tmp_path):
  train = str(tmp_path / "train")
  for step in (10, 20, 30):
    write_scalars(train, step, training_loss=float(step))
  # Killed after logging 30; resumed from the checkpoint at 10.
  write_scalars(train, 20, training_loss=-20.0)
  # A writer killed mid-record leaves the file's last record cut short.
  path = sorted(tf.io.gfile.glob(f"{train}/events.out.tfevents.*"),
                key=lambda p: curves._creation_order(os.path.basename(p)))[-1]  # pylint: disable=protected-access
  with open(path, "ab") as f:
    f.write(b"\x20\x00\x00\x00\x00")

  rows = curves.read_scalars(str(tmp_path), curves.subdirs())
  assert rows == {10: {"training_loss": 10.0}, 20: {"training_loss": -20.0}}


def test_an_evaluation_of_an_older_checkpoint_keeps_the_later_ones(tmp_path):
  # An evaluator beside the trainer may evaluate an old checkpoint last;
  # unlike a training resume, that takes nothing back.
  with tf.summary.create_file_writer(f"{tmp_path}/validation").as_default():
    for step, loss in ((20, 1.0), (40, 0.8), (10, 1.5)):
      tf.summary.scalar("validation_loss", loss, step=step)
  rows = curves.read_scalars(str(tmp_path), curves.subdirs())
  assert rows == {10: {"validation_loss": 1.5}, 20: {"validation_loss": 1.0},
                  40: {"validation_loss": pytest.approx(0.8)}}


def test_event_files_are_read_in_the_order_they_were_created(tmp_path):
  # Two writers in one second: TensorFlow's counter in the name orders
  # them, and writer 10 comes after writer 9.
  train = tmp_path / "train"
  with tf.summary.create_file_writer(str(train)).as_default():
    for step in (10, 20, 30):
      tf.summary.scalar("training_loss", float(step), step=step)
  before = set(os.listdir(train))
  write_scalars(str(train), 20, training_loss=-20.0)  # Resumed from 10.
  (resumed,) = set(os.listdir(train)) - before
  (original,) = before
  os.rename(train / original,
            train / "events.out.tfevents.1764560000.h.7.9.v2")
  os.rename(train / resumed,
            train / "events.out.tfevents.1764560000.h.7.10.v2")
  rows = curves.read_scalars(str(tmp_path), curves.subdirs())
  assert rows == {10: {"training_loss": 10.0}, 20: {"training_loss": -20.0}}


def test_training_columns_come_before_validation_ones_whatever_their_names():
  text = curves.metrics_csv({
      10: {"training_loss": 1.0, "weight_norm": 2.0, "validation_loss": 3.0,
           "validation_accuracy": 0.5}})
  assert text.splitlines() == [
      "step,training_loss,weight_norm,validation_accuracy,validation_loss",
      "10,1.0,2.0,0.5,3.0"]


def test_nothing_logged_writes_nothing(tmp_path):
  assert not curves.refresh(str(tmp_path), Config())
  assert not os.listdir(tmp_path)


def test_no_module_imports_matplotlib_on_start_up():
  # Only a function does, in the first refresh. (Keras 3, which TensorFlow
  # loads, imports it where it is installed: not ours to change.)
  modules = sorted(os.path.join(folder, name) for folder, _, names
                   in os.walk(os.path.join(REPO, "tfm_ext")) for name in names
                   if name.endswith(".py"))
  assert len(modules) > 50, modules
  for name in modules:
    if name.endswith(".py"):
      with open(name) as f:
        tree = ast.parse(f.read())
      top_level = [node for node in tree.body
                   if isinstance(node, (ast.Import, ast.ImportFrom))]
      imported = [alias.name for node in top_level for alias in node.names
                  ] + [node.module or "" for node in top_level
                       if isinstance(node, ast.ImportFrom)]
      assert not [m for m in imported if m.startswith(
          ("matplotlib", "tensorboard.backend"))], name


def test_scalars_of_other_scales_get_axes_of_their_own():
  # docs/own-experiment.md's template, with no best-checkpoint metric:
  # accuracy (0-1), a weight norm (5-11) and an error rate (about 0.05) on
  # one axis left two of them flat lines.
  rows = {step: {"training_loss": 2.0 / step, "validation_loss": 2.2 / step,
                 "accuracy": 0.1 * step, "validation_accuracy": 0.09 * step,
                 "weight_norm": 5.0 + 0.6 * step,
                 "validation_error_rate": 0.05 + 0.01 * (step % 2),
                 "learning_rate": 1e-5 * 10 ** min(step, 4),
                 "steps_per_second": 9.0, "best_accuracy": 0.9}
          for step in range(1, 11)}
  assert curves.panels(rows) == [
      ("loss", ["loss"], False), ("accuracy", ["accuracy"], False),
      ("weight_norm", ["weight_norm"], False),
      ("error_rate", ["error_rate"], False),
      # A warm-up over three orders of magnitude: a log scale.
      ("learning_rate", ["learning_rate"], True)]
  # Three to a row.
  image = tf.io.decode_png(curves.draw_curves(rows)).numpy()
  assert image.shape[:2] == (720, 1260), image.shape
  # Alike scalars share one, the main metric first; at most four to one.
  alike = {step: {"accuracy": 0.1 * step, "top_5_accuracy": 0.1 * step + 0.05,
                  **{f"mine_{i}": 0.1 * step + 0.01 * i for i in range(5)}}
           for step in range(1, 11)}
  assert curves.panels(alike, main_metrics=["top_5_accuracy"]) == [
      ("top_5_accuracy, accuracy, mine_0, mine_1",
       ["top_5_accuracy", "accuracy", "mine_0", "mine_1"], False),
      ("mine_2, mine_3, mine_4", ["mine_2", "mine_3", "mine_4"], False)]

