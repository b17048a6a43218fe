"""The checkpoint manager: the start's restore, asynchronous saves."""

import types

import tensorflow as tf

from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import checkpointing


class _Trainer:
  """What `build_manager` reads of a trainer."""

  def __init__(self):
    self.global_step = tf.Variable(0, dtype=tf.int64)
    self.weight = tf.Variable(0.0)
    self.checkpoint = tf.train.Checkpoint(global_step=self.global_step,
                                          weight=self.weight)


def _save(directory, *steps):
  """Saves a checkpoint at each of `steps` with weight == step, as a trainer."""
  trainer = _Trainer()
  manager = tf.train.CheckpointManager(trainer.checkpoint, directory,
                                       max_to_keep=5)
  for step in steps:
    trainer.global_step.assign(step)
    trainer.weight.assign(float(step))
    manager.save(checkpoint_number=step)


def _manager(directory, trainer, **kwargs):
  return checkpointing.build_manager(
      trainer, directory, types.SimpleNamespace(checkpoint_interval=1),
      evaluates_only=False, init_fn=None, max_to_keep=5, **kwargs)


def test_the_start_restores_what_it_checked_not_a_newer_save(tmp_path):
  directory = str(tmp_path)
  _save(directory, 1)
  checked = checkpoint_state.repair(directory)
  assert checked.endswith("-1")
  _save(directory, 2)  # Another job saves while this one builds its parts.
  trainer = _Trainer()
  manager = _manager(directory, trainer, verified=checked)
  assert manager.latest_checkpoint.endswith("-2")  # What TF's would restore.
  assert manager.restore_or_initialize() == checked
  assert (int(trainer.global_step.numpy()), trainer.weight.numpy()) == (1, 1.0)
  # A later restore (a divergence rollback) restores the latest, as TF's.
  assert manager.restore_or_initialize().endswith("-2")
  assert trainer.weight.numpy() == 2.0


def test_a_start_that_found_no_checkpoint_initializes(tmp_path):
  directory = str(tmp_path)
  _save(directory, 3)  # Saved after the start's check found nothing.
  initialized = []
  trainer = _Trainer()
  manager = checkpointing.build_manager(
      trainer, directory, types.SimpleNamespace(checkpoint_interval=1),
      evaluates_only=True, init_fn=lambda: initialized.append(True),
      max_to_keep=5, verified=None)
  assert manager.restore_or_initialize() is None
  assert initialized == [True] and int(trainer.global_step.numpy()) == 0


def test_a_checked_checkpoint_rotated_away_since_restores_the_latest(tmp_path):
  directory = str(tmp_path)
  _save(directory, 1)
  checked = checkpoint_state.repair(directory)
  _save(directory, 2)
  for suffix in (".index", ".data-00000-of-00001"):
    tf.io.gfile.remove(checked + suffix)
  trainer = _Trainer()
  assert _manager(directory, trainer,
                  verified=checked).restore_or_initialize().endswith("-2")
  assert trainer.weight.numpy() == 2.0


def test_an_unchecked_start_restores_the_latest_as_tf_does(tmp_path):
  directory = str(tmp_path)
  _save(directory, 1, 2)
  trainer = _Trainer()
  assert _manager(directory, trainer).restore_or_initialize().endswith("-2")
  assert trainer.weight.numpy() == 2.0


def test_async_manager_saves_without_options_in_the_background_in_order(
    tmp_path):
  trainer = _Trainer()
  manager = checkpointing.build_manager(
      trainer, str(tmp_path), types.SimpleNamespace(checkpoint_interval=1),
      evaluates_only=False, init_fn=None, max_to_keep=5, enable_async=True)
  controller_options = tf.train.CheckpointOptions(enable_async=True)
  # The preemption save and TFM's actions pass no options; Orbit's
  # controller passes its own.
  for step, options in ((1, None), (2, controller_options), (3, None)):
    trainer.global_step.assign(step)
    trainer.weight.assign(float(step))
    manager.save(checkpoint_number=step, options=options)
    # TF's background writer exists from the first save, made without options.
    # pylint: disable-next=protected-access
    assert trainer.checkpoint._async_checkpointer_impl is not None
  manager.sync()
  assert manager.latest_checkpoint.endswith("-3")
  restored = _Trainer()
  restored.checkpoint.restore(manager.latest_checkpoint).assert_consumed()
  assert restored.weight.numpy() == 3.0
