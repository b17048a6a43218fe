"""Early stopping, the learning rate on a plateau and an action's stop, through
the launcher on digits: what they do, their resume, their refusals.

On digits_convnet with evaluations every 20 steps (deterministic), early
stopping on accuracy (min_delta 0.02, patience 2) stops at step 120; the
plateau on validation_loss (min_delta 0.05, patience 1) halves the learning
rate at step 100, right after the checkpoint of that step was saved.
"""

import json
import os

import numpy as np

from conftest import REPO
from conftest import assert_clean_usage_error
from conftest import numeric_tensors

EXP = "--experiment=digits_convnet"


def watched(checkpoint_interval=20, patience=2):
  """The overrides of the runs described above (other tests' too)."""
  return ",".join([
      "trainer.steps_per_loop=20", "trainer.summary_interval=20",
      "trainer.validation_interval=20",
      f"trainer.checkpoint_interval={checkpoint_interval}",
      "runtime.deterministic=true",
      "trainer.early_stopping.metric=accuracy",
      f"trainer.early_stopping.patience={patience}",
      "trainer.early_stopping.min_delta=0.02",
      "trainer.reduce_lr_on_plateau.metric=validation_loss",
      "trainer.reduce_lr_on_plateau.patience=1",
      "trainer.reduce_lr_on_plateau.factor=0.5",
      "trainer.reduce_lr_on_plateau.min_delta=0.05"])


WATCHED = watched()


def _train(launch_forked, model_dir, steps, extra=""):
  run = launch_forked(EXP, "--mode=train_and_eval",
                      f"--params_override={WATCHED},trainer.train_steps="
                      f"{steps}{extra}", model_dir=model_dir)
  assert run.returncode == 0, run
  return run


def _summary(model_dir):
  with open(os.path.join(model_dir, "run_summary.json")) as f:
    return json.load(f)


def test_early_stopping_saves_exits_0_and_a_relaunch_trains_nothing(
    launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  run = _train(launch_forked, model_dir, 400)
  lines = run.stdout.splitlines()
  stopped = [l for l in lines if l.startswith("stopped @ step ")]
  assert len(stopped) == 1 and "trainer.early_stopping" in stopped[0], lines
  step = int(stopped[0].split()[3])
  assert step < 400
  summary = _summary(model_dir)
  assert summary["status"] == "completed" and summary["exit_code"] == 0
  assert summary["global_step"] == summary["stopped_early_at"] == step
  assert "accuracy did not improve" in summary["stop_reason"]
  assert os.path.exists(model_dir / f"ckpt-{step}.index")
  with open(model_dir / "training_complete.json") as f:
    assert json.load(f)["global_step"] == step  # An evaluator ends there.
  with open(model_dir / "plateau.json") as f:
    record = json.load(f)
  # Its checkpoint (every 20 steps) was saved before the evaluation that
  # stopped it: the relaunch runs that one again, from the checkpoint's
  # state, and stops there again, training nothing.
  again = _train(launch_forked, model_dir, 400)
  assert not [l for l in again.stdout.splitlines() if l.startswith("step ")]
  assert stopped == [l for l in again.stdout.splitlines()
                     if l.startswith("stopped @ step ")], again.stdout
  for field in ("stopped_early_at", "lr_factor", "lr_reductions", "best"):
    assert _summary(model_dir)[field] == summary[field], field
  with open(model_dir / "plateau.json") as f:
    assert json.load(f) == record


def test_a_resumed_run_counts_on_as_an_uninterrupted_one(launch_forked,
                                                         tmp_path):
  # Interrupted at 60 and at 100: the checkpoint of step 100 is saved
  # before the evaluation that lowers the rate (plateau.json holds it).
  whole, parts = tmp_path / "whole", tmp_path / "parts"
  first = _train(launch_forked, whole, 400)
  for steps in (60, 100, 400):
    last = _train(launch_forked, parts, steps)
  said = [[l for l in run.stdout.splitlines()
           if l.startswith(("plateau @", "stopped @"))]
          for run in (first, last)]
  assert said[0][-1] == said[1][-1], said  # The same stop, same reason.
  assert any(l.startswith("plateau @ step") for l in said[0]), said
  a, b = _summary(whole), _summary(parts)
  for field in ("stopped_early_at", "stop_reason", "lr_factor",
                "lr_reductions", "eval_metrics"):
    assert a[field] == b[field], field
  assert a["lr_factor"] < 1 and a["lr_reductions"], a
  step = a["stopped_early_at"]
  ours, theirs = (numeric_tensors(str(d / f"ckpt-{step}"))
                  for d in (whole, parts))
  assert sorted(ours) == sorted(theirs)
  assert any("early_stopping" in name for name in ours), sorted(ours)
  for name in ours:
    assert np.array_equal(ours[name], theirs[name]), name


def test_an_action_can_ask_the_run_to_stop(launch, tmp_path):
  # A fresh interpreter: a forked one keeps its parent's sys.path.
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "stopper.py").write_text(
      "import tfm_ext\n"
      "@tfm_ext.register_action('stop_at_40', phase='train')\n"
      "def stop_at_40(context):\n"
      "  step = context.trainer.global_step\n"
      "  def act(output):\n"
      "    if int(step.numpy()) >= 40:\n"
      "      context.stop('enough at 40')\n"
      "  return act\n")

  def train(steps):
    return launch(
        EXP, "--mode=train", "--registry=stopper",
        f"--params_override=trainer.train_steps={steps},"
        "trainer.steps_per_loop=20,trainer.summary_interval=20,"
        "trainer.checkpoint_interval=100", model_dir=tmp_path / "m",
        env={"PYTHONPATH": f"{package}{os.pathsep}{REPO}"})

  run = train(100)
  assert run.returncode == 0, run
  assert "stopped @ step 40 | enough at 40" in run.stdout, run.stdout
  summary = _summary(tmp_path / "m")
  assert (summary["stopped_early_at"], summary["stop_reason"]) == (
      40, "enough at 40")
  assert os.path.exists(tmp_path / "m" / "ckpt-40.index")
  # Training is complete (the evaluators were told so): the same command
  # trains nothing; a larger train_steps trains on.
  again = train(100)
  assert again.returncode == 0, again
  assert not [l for l in again.stdout.splitlines() if l.startswith("step ")]
  assert ("already complete at step 40 (stopped early: enough at 40)"
          in again.stdout), again.stdout
  more = train(120)
  assert more.returncode == 0, more
  # A resumed run's first loop is a whole loop: the action stops it after it.
  assert "stopped @ step 60 | enough at 40" in more.stdout, more.stdout


def test_what_cannot_act_is_refused(launch_forked, tmp_path):
  cases = [
      ("--mode=train", "trainer.early_stopping.metric=accuracy",
       ["trainer.early_stopping.metric='accuracy' watches the evaluations",
        "--mode=train_and_eval"]),
      ("--mode=train_and_eval", "trainer.early_stopping.metric=acuracy",
       ["trainer.early_stopping.metric='acuracy'", "Did you mean 'accuracy'"]),
      ("--mode=train_and_eval",
       "trainer.reduce_lr_on_plateau.metric=accuracy,"
       "trainer.reduce_lr_on_plateau.factor=1.5",
       ["trainer.reduce_lr_on_plateau.factor=1.5", "below 1"]),
      ("--mode=train_and_eval",
       "trainer.early_stopping.metric=accuracy,"
       "trainer.early_stopping.mode=biggest",
       ["trainer.early_stopping.mode='biggest'"]),
      # Accepted (only 'accuracy' was checked), and it never acted.
      ("--mode=train_and_eval", "trainer.early_stopping.metric='accuracy|top1'",
       ["trainer.early_stopping.metric='accuracy|top1'",
        "'accuracy' logs one number"]),
      # Accepted: five "factor 1 -> 0.5" lines, and the rate never changed.
      ("--mode=train_and_eval",
       "trainer.reduce_lr_on_plateau.metric=accuracy,"
       "trainer.reduce_lr_on_plateau.min_lr=0.01",
       ["trainer.reduce_lr_on_plateau.min_lr=0.01",
        "at or above the learning rate"]),
  ]
  for n, (mode, override, fragments) in enumerate(cases):
    run = launch_forked(EXP, mode, f"--params_override={override}",
                        model_dir=tmp_path / str(n))
    assert_clean_usage_error(run, *fragments)


def test_a_reduction_says_what_the_rate_really_does(launch_forked, tmp_path):
  """Every evaluation after the first stalls (min_delta 1): the reduction
  at step 40 is held at min_lr, the one at 60 would change nothing and is
  not made (each was a "factor -> factor/2" line, and the rate never
  followed)."""
  run = launch_forked(
      EXP, "--mode=train_and_eval", "--params_override="
      "trainer.train_steps=60,trainer.steps_per_loop=20,"
      "trainer.summary_interval=20,trainer.validation_interval=20,"
      "trainer.checkpoint_interval=20,"
      "trainer.reduce_lr_on_plateau.metric=accuracy,"
      "trainer.reduce_lr_on_plateau.patience=1,"
      "trainer.reduce_lr_on_plateau.min_delta=1,"
      "trainer.reduce_lr_on_plateau.factor=0.5,"
      "trainer.reduce_lr_on_plateau.min_lr=0.002", model_dir=tmp_path / "m")
  assert run.returncode == 0, run
  said = [l for l in run.stdout.splitlines() if l.startswith("plateau @")]
  assert len(said) == 2, said
  assert said[0].startswith("plateau @ step 40 |") and (
      "-> 0.002, held at min_lr=0.002 (factor 1 -> 0.5)" in said[0]), said
  assert said[1].startswith("plateau @ step 60 |") and (
      "already at min_lr=0.002: not lowered, factor stays 0.5") in said[1], said
  summary = _summary(tmp_path / "m")
  assert summary["lr_factor"] == 0.5
  assert summary["lr_reductions"] == [{"step": 40, "factor": 0.5}]
