"""Actions: a downstream action registered without subclassing, the built-ins."""

import glob
import math
import os
import socket

import pytest
import tensorflow as tf

import tfm_ext
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import UsageError
from tfm_ext.run import preemption

from conftest import DOUBLES_TRAIN, SMOKE
from tfm_ext.actions import guard as guard_lib

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


def _refused_url() -> str:
  """A URL on 127.0.0.1 where no server listens: connections are refused."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return f"http://127.0.0.1:{s.getsockname()[1]}/hook"


def _log_text(model_dir) -> str:
  """The run's log file (absl's symlinks to it left out)."""
  return "".join(open(p).read() for p in glob.glob(
      os.path.join(model_dir, "logs", "tfm_ext.*")) if not os.path.islink(p))


def test_an_action_that_raises_is_reported_once_and_training_goes_on(
    launch_forked, tmp_path):
  # Issue 32: a user's action POSTing to a server that is down, and the
  # built-in notifications to the same dead server.
  url = _refused_url()
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      f"--params_override={SMOKE}", f"--notify_url={url}",
                      model_dir=tmp_path / "m", script=DOUBLES_TRAIN,
                      env={"USER_POST_URL": url})
  assert run.returncode == 0, run
  summary = run.summary()
  assert (summary["status"], summary["global_step"]) == ("completed", 40)
  # Loops end at 1, 10, 20, 30 and 40: five failures, counted.
  assert summary["action_failures"] == {"train/user_post": 5}
  assert run.stderr.count("warning: the train action 'user_post' failed at "
                          "step 1: URLError") == 1, run
  assert run.stderr.count("warning:") == 2, run  # And one for notifications.
  assert "Traceback" not in run.stderr
  log = _log_text(tmp_path / "m")
  assert log.count("The train action 'user_post' failed") == 5
  assert log.count("Connection refused") >= 5 and "Traceback" in log


def test_a_required_action_that_raises_saves_and_fails_with_exit_3(
    launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  run = launch_forked(
      "--experiment=digits_convnet", "--mode=train_and_eval",
      "--params_override=trainer.train_steps=40,trainer.steps_per_loop=10,"
      "trainer.checkpoint_interval=30,trainer.validation_interval=20",
      model_dir=model_dir, script=DOUBLES_TRAIN,
      env={"REQUIRED_POST_URL": _refused_url()})
  assert run.returncode == 3, run
  assert "The required eval action 'required_post' failed at step 20: " \
      "URLError" in run.stderr, run
  # No checkpoint was due before 30: the one at 20 is the failure's save.
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
  summary = run.summary()
  assert (summary["status"], summary["exit_code"]) == ("failed", 3)
  assert summary["global_step"] == 20
  assert summary["action_failures"] == {"eval/required_post": 1}
  assert "Traceback" in _log_text(model_dir)


def test_deliberate_outcomes_pass_through_the_guard():
  step = tf.Variable(7, dtype=tf.int64)
  guard = guard_lib.Guard(global_step=lambda: int(step.numpy()))

  def raising(error):
    def action(output):
      raise error
    return action

  for error in (RunFailed("diverged"), UsageError("bad"),
                preemption.Preempted(7, "SIGTERM")):
    with pytest.raises(type(error)):
      guard(raising(error), phase="train", name="x", required=True)({})
  optional = guard.all("eval", [raising(KeyError("k")), raising(OSError(5))])
  for action in optional * 2:
    action({})
  assert guard.failures == {"eval/action": 4}
  # Without a save (an evaluator), a required failure still ends the run.
  with pytest.raises(RunFailed, match=r"required train action 'up' failed "
                     r"at step 7: ValueError: no\. Fix"):
    guard(raising(ValueError("no")), phase="train", name="up",
          required=True)({})
