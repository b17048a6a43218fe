"""Actions: a downstream action registered without subclassing, the built-ins."""

import math

import pytest
import tensorflow as tf

import tfm_ext
from tfm_ext import actions
from tfm_ext.errors import RunFailed

from conftest import SMOKE

# Registration is process-wide: the factories stay out of every other run.
RECORDING = {"enabled": False, "train": [], "eval": [], "contexts": []}


def _recording_factory(phase):
  def factory(context: tfm_ext.ActionContext):
    if not RECORDING["enabled"]:
      return None
    RECORDING["contexts"].append(context)
    step = context.trainer.global_step
    return lambda output: RECORDING[phase].append(
        (int(step.numpy()), sorted(output or {})))
  return factory


tfm_ext.register_action("test_recording_train", phase="train")(
    _recording_factory("train"))
tfm_ext.register_action("test_recording_eval", phase="eval")(
    _recording_factory("eval"))


@pytest.fixture
def recording():
  RECORDING["enabled"] = True
  yield RECORDING
  RECORDING.update(enabled=False, train=[], eval=[], contexts=[])


def test_a_registered_action_runs_after_every_loop_and_evaluation(
    run_in_process, tmp_path, recording):
  summary, _ = run_in_process("digits_convnet", "train_and_eval", tmp_path,
                              SMOKE)
  assert summary.global_step == 40
  # Loops end at 1 (the first loop is one step), 10, 20, 30 and 40.
  assert [step for step, _ in recording["train"]] == [1, 10, 20, 30, 40]
  assert all("training_loss" in keys for _, keys in recording["train"])
  # validation_interval=20: evaluations at 20 and 40.
  assert [step for step, _ in recording["eval"]] == [20, 40]
  assert all("accuracy" in keys for _, keys in recording["eval"])
  # Each factory was called once for the run, with the assembled parts.
  assert len(recording["contexts"]) == 2
  context = recording["contexts"][0]
  assert context.chief and context.mode == "train_and_eval"
  assert context.checkpoint_manager.directory == str(tmp_path)


def test_an_evaluator_runs_only_eval_actions(run_in_process, tmp_path,
                                             recording):
  run_in_process("digits_convnet", "train", tmp_path, SMOKE)
  recording.update(train=[], eval=[], contexts=[])
  run_in_process("digits_convnet", "eval", tmp_path, SMOKE)
  assert recording["train"] == []
  assert [step for step, _ in recording["eval"]] == [40]


def test_phase_and_name_are_checked_when_registering():
  with pytest.raises(ValueError, match="phase must be one of"):
    tfm_ext.register_action("x", phase="training")
  with pytest.raises(tfm_ext.RegistryError, match="already registered"):
    tfm_ext.register_action("test_recording_train", phase="train")(
        lambda context: None)
