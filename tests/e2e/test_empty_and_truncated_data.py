"""An evaluation of nothing, and input files cut short, never pass silently.

Evaluations that read no batch (`tfm_ext.training.eval_count`) and TFRecord files
whose framing ends early (`tfm_ext.training.input_files`, its checks of single
files in tests/training/test_input_files.py), on real digits runs and real
files.
"""

import dataclasses
import json
import os
import shutil

import pytest
import tensorflow as tf

from official.core import base_trainer
from official.core import task_factory
from official.core import train_utils

from experiments import digits_convnet
from digits_records import bundled
from digits_records import cut_copy
from digits_records import digits_data
from digits_records import record_offsets
from tfm_ext.model_dir import best_checkpoints
from tfm_ext.training import eval_count
from tfm_ext.model_dir import eval_ledger


EXPERIMENT = "--experiment=digits_convnet"
CADENCE = ("trainer.steps_per_loop=10,trainer.summary_interval=10,"
           "trainer.checkpoint_interval=10,trainer.max_to_keep=10")
# 360 validation images: no batch of 400 once the remainder is dropped.
NO_BATCH = ("task.validation_data.global_batch_size=400,"
            "task.validation_data.drop_remainder=true")


def best_entries(model_dir):
  path = os.path.join(model_dir, "best_ckpt", best_checkpoints.MANIFEST)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)["checkpoints"]


def error_paragraph(run):
  lines = [l for l in run.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, run
  return lines[0]


@pytest.fixture
def model_copy(two_checkpoints, tmp_path):
  """A copy of a model_dir with ckpt-10 and ckpt-20, never evaluated."""
  model_dir = tmp_path / "m"
  shutil.copytree(two_checkpoints, model_dir)
  return model_dir


# -- A. Evaluations of nothing ---------------------------------------------


def test_eval_of_a_batch_larger_than_the_set_exits_3_and_ranks_nothing(
    launch_forked, model_copy):
  validation = bundled("validation")
  run = launch_forked(EXPERIMENT, "--mode=eval",
                      f"--params_override={NO_BATCH},"
                      f"task.validation_data.input_path={validation}",
                      model_dir=model_copy)
  assert run.returncode == 3, run
  error = error_paragraph(run)
  for said in (f"task.validation_data.input_path='{validation}'",
               "global_batch_size=400", "drop_remainder=true",
               "its files hold 360 records",
               "set task.validation_data.drop_remainder=false or a "
               "global_batch_size of at most 360"):
    assert said in error, error
  assert "eval @" not in run.stdout, run  # No metrics of nothing printed.
  assert best_entries(model_copy) == []
  assert not os.path.exists(model_copy / "best_ckpt" / "best_ckpt-20.index")


@pytest.mark.parametrize("mode", ["train_and_eval", "train_and_post_eval"])
def test_training_then_evaluating_an_empty_file_exits_3_before_ranking(
    launch_forked, tmp_path, mode):
  empty = tmp_path / "validation.tfrecord"
  empty.write_bytes(b"")
  model_dir = tmp_path / "m"
  run = launch_forked(EXPERIMENT, f"--mode={mode}",
                      "--params_override=trainer.train_steps=20," + CADENCE
                      + ",trainer.validation_interval=10,"
                      f"task.validation_data.input_path={empty}",
                      model_dir=model_dir)
  assert run.returncode == 3, run
  error = error_paragraph(run)
  step = 10 if mode == "train_and_eval" else 20
  assert f"The evaluation at step {step} read no batch" in error, error
  assert f"input_path='{empty}'" in error and "hold 0 records" in error
  assert "Point task.validation_data.input_path at a validation set" in error
  assert best_entries(model_dir) == []
  # The training before it is kept: resumable.
  assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{step}")


def test_continuous_eval_records_each_empty_evaluation_and_ranks_none(
    launch_forked, model_copy):
  run = launch_forked(EXPERIMENT, "--mode=continuous_eval",
                      f"--params_override={NO_BATCH}", model_dir=model_copy)
  assert run.returncode == 0, run
  entries = eval_ledger.read_ledger(str(model_copy))
  assert [(e["global_step"], e["status"], e["metrics"]) for e in entries] == [
      (10, "empty", {}), (20, "empty", {})]
  for step in (10, 20):
    assert run.stderr.count(f"The evaluation at step {step} read no batch") == 1
    assert f"Recorded ckpt-{step} as empty" in run.stderr, run
  assert "eval @" not in run.stdout
  assert best_entries(model_copy) == []
  # It stopped at the training's final step, not after its timeout.
  assert "No new checkpoint" not in run.stderr


def tfm_trainer(validation_path, export_dir, task_config=None, ema=False):
  """TFM's own `Trainer` on digits, evaluating `validation_path`."""
  params = digits_convnet.get_config()
  if task_config is not None:
    params.task = task_config
  if ema:
    params.override({"trainer": {"optimizer_config": {
        "ema": {"average_decay": 0.99}}}})
  params.task.validation_data.input_path = validation_path
  task = task_factory.get_task(params.task)
  exporter = best_checkpoints.maybe_create(params, str(export_dir))
  trainer = train_utils.create_trainer(
      params, task, train=False, evaluate=True, checkpoint_exporter=exporter,
      trainer_cls=base_trainer.Trainer)
  eval_count.watch(trainer)
  eval_count.watch(trainer)  # Idempotent: counted once.
  return trainer


def test_tfm_trainer_raises_before_its_exporter_ranks_an_empty_evaluation(
    tmp_path):
  empty = tmp_path / "empty.tfrecord"
  empty.write_bytes(b"")
  trainer = tfm_trainer(str(empty), tmp_path)
  with pytest.raises(eval_count.EmptyEvaluation,
                     match=r"at step 0 read no batch .*hold 0 records"):
    trainer.evaluate(tf.constant(-1))
  assert eval_count.batches(trainer) == 0
  assert best_entries(tmp_path) == []


def test_an_empty_evaluation_leaves_the_training_weights_not_the_average(
    tmp_path):
  empty = tmp_path / "empty.tfrecord"
  empty.write_bytes(b"")
  # TFM's EMA swap needs a strategy's cross-replica context.
  with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
    trainer = tfm_trainer(str(empty), tmp_path, ema=True)
    # Training weights apart from their moving average (a copy at creation).
    for weight in trainer.model.trainable_weights:
      weight.assign(weight + 1.0)
    before = [w.numpy() for w in trainer.model.trainable_weights]
    with pytest.raises(eval_count.EmptyEvaluation):
      trainer.evaluate(tf.constant(-1))  # eval_begin swapped the average in.
    after = [w.numpy() for w in trainer.model.trainable_weights]
  assert all((a == b).all() for a, b in zip(before, after))


@dataclasses.dataclass
class LosslessTaskConfig(digits_convnet.DigitsTaskConfig):
  pass


@task_factory.register_task_cls(LosslessTaskConfig)
class LosslessTask(digits_convnet.DigitsTask):
  """Its validation step reports accuracy only, no loss (as tasks may)."""

  def validation_step(self, inputs, model, metrics=None):
    logs = super().validation_step(inputs, model, metrics)
    return {k: v for k, v in logs.items() if k != self.loss}


def test_batches_are_counted_when_the_task_reports_no_loss(tmp_path):
  trainer = tfm_trainer(bundled("validation"), tmp_path,
                        task_config=LosslessTaskConfig())
  logs = trainer.evaluate(tf.constant(-1))
  # 360 images in batches of 120; TFM's own count has nothing to go by.
  assert eval_count.batches(trainer) == 3
  assert trainer.validation_loss.count.numpy() == 0
  assert "validation_loss" not in logs and 0 <= logs["accuracy"] <= 1
  assert [e["global_step"] for e in best_entries(tmp_path)] == [0]


def test_tfm_base_trainer_in_the_launcher_exits_3_on_an_empty_evaluation(
    launch_forked, tmp_path):
  model_dir = tmp_path / "m"  # TFM's own trainer trains, then evaluates.
  run = launch_forked(EXPERIMENT, "--mode=train_and_eval", "--trainer=tfm_base",
                      "--params_override=trainer.train_steps=10,"
                      "trainer.steps_per_loop=10,trainer.summary_interval=10,"
                      f"trainer.checkpoint_interval=10,{NO_BATCH}",
                      model_dir=model_dir)
  assert run.returncode == 3, run
  assert "task.validation_data.input_path" in run.stderr, run
  assert best_entries(model_dir) == []


# -- B. Input files cut short or unreadable --------------------------------


def test_training_on_a_cut_short_file_exits_3_before_its_first_step(
    launch_forked, tmp_path):
  shutil.copy(bundled("train"), tmp_path / "train-0.tfrecord")
  cut = cut_copy(tmp_path, "train-1.tfrecord", 5)
  model_dir = tmp_path / "m"
  run = launch_forked(EXPERIMENT, "--mode=train",
                      "--params_override=trainer.train_steps=20,"
                      f"task.train_data.input_path={tmp_path}/train-*",
                      model_dir=model_dir)
  assert run.returncode == 3, run
  error = error_paragraph(run)
  assert f"{cut} is cut short" in error and "record 480" in error, error
  assert "step " not in run.stdout
  assert tf.train.latest_checkpoint(str(model_dir)) is None


def test_a_cut_short_validation_file_stops_train_and_eval_at_start(
    launch_forked, tmp_path):
  with open(bundled("validation"), "rb") as f:
    data = f.read()
  cut = tmp_path / "validation.tfrecord"
  cut.write_bytes(data[:record_offsets(data)[100] + 7])
  run = launch_forked(EXPERIMENT, "--mode=train_and_eval",
                      "--params_override=trainer.train_steps=20,"
                      f"task.validation_data.input_path={cut}",
                      model_dir=tmp_path / "m")
  assert run.returncode == 3, run
  assert f"task.validation_data.input_path='{cut}': {cut} is cut short" in (
      error_paragraph(run))
  assert "step " not in run.stdout


def test_a_directory_as_input_path_exits_3_naming_it(launch_forked,
                                                     tmp_path):
  folder = tmp_path / "train"
  folder.mkdir()
  shutil.copy(bundled("train"), folder / "train-0.tfrecord")
  run = launch_forked(EXPERIMENT, "--mode=train",
                      "--params_override=trainer.train_steps=20,"
                      f"task.train_data.input_path={folder}",
                      model_dir=tmp_path / "m")
  assert run.returncode == 3, run
  assert f"{folder} is a directory" in error_paragraph(run), run


def test_a_file_that_vanishes_while_read_fails_naming_it(tmp_path):
  path = tmp_path / "train.tfrecord"
  shutil.copy(bundled("train"), path)
  task = task_factory.get_task(digits_convnet.DigitsTaskConfig())
  batches = iter(task.build_inputs(digits_data(str(path))))
  next(batches)  # The first epoch is read into the shuffle buffer.
  path.unlink()
  with pytest.raises(tf.errors.NotFoundError) as raised:
    for _ in range(100):  # 23 batches an epoch; the next one reopens it.
      next(batches)
  assert str(path) in raised.value.message
