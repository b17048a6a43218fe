"""An evaluator takes the trainer's config from its params.yaml.

The trainer runs a downstream trainer (`eval_marking`, whose `eval_end` adds
`downstream/eval_marked`) with an override of `train_steps`; the evaluators
are started without either.
"""

import json
import os

import pytest

from conftest import DOUBLES_TRAIN, SMOKE, built_once

TRAINED = SMOKE.replace("train_steps=40", "train_steps=30")
WARNING = "Value in checkpoint could not be found"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, launch_forked):
  """A model_dir trained by `eval_marking` for 30 steps (--mode=train).

  Trained once a session; each test evaluates a copy.
  """

  def train(model_dir):
    run = launch_forked("--experiment=digits_convnet", "--mode=train",
                        "--trainer=eval_marking",
                        f"--params_override={TRAINED}", model_dir=model_dir,
                        script=DOUBLES_TRAIN)
    assert run.returncode == 0, run

  return built_once(tmp_path_factory, "evaluator_follows_trained", train)


def read(model_dir, name):
  with open(os.path.join(model_dir, name)) as f:
    return json.load(f)


def copy_of(model_dir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  target = tmp_path / "copy"
  shutil.copytree(model_dir, target)
  return str(target)


def test_continuous_eval_runs_the_trainers_trainer_and_keeps_its_summary(
    launch_forked, trained, tmp_path):
  model_dir = copy_of(trained, tmp_path)
  before = read(model_dir, "run_summary.json")
  result = launch_forked("--experiment=digits_convnet",
                         "--mode=continuous_eval", model_dir=model_dir,
                         script=DOUBLES_TRAIN)
  assert result.returncode == 0, result
  evaluated = read(model_dir, "eval_summary.json")
  assert evaluated["mode"] == "continuous_eval"
  assert evaluated["trainer"] == "eval_marking"
  # The trainer's hook ran, and its train_steps override reached the
  # evaluator (which stopped at the trainer's last checkpoint, step 30).
  assert evaluated["eval_metrics"]["downstream/eval_marked"] == 1.0
  assert evaluated["train_steps"] == 30
  assert evaluated["global_step"] == 30
  assert read(model_dir, "run_summary.json") == before
  assert f"summary {model_dir}/eval_summary.json" in result.stdout
  assert WARNING not in result.stderr


def test_eval_may_change_evaluation_fields(launch_forked, trained, tmp_path):
  model_dir = copy_of(trained, tmp_path)
  result = launch_forked("--experiment=digits_convnet", "--mode=eval",
                         "--params_override=trainer.validation_steps=1",
                         model_dir=model_dir, script=DOUBLES_TRAIN)
  assert result.returncode == 0, result
  evaluated = read(model_dir, "eval_summary.json")
  assert evaluated["trainer"] == "eval_marking"
  assert evaluated["eval_metrics"]["downstream/eval_marked"] == 1.0
  assert read(model_dir, "run_summary.json")["mode"] == "train"
  assert WARNING not in result.stderr


@pytest.mark.parametrize("flag, difference", [
    ("--trainer=custom", "trainer.name: 'eval_marking' -> 'custom'"),
    ("--params_override=task.model.dense_units=64",
     "task.model.dense_units: 128 -> 64"),
    ("--params_override=trainer.train_steps=40",
     "trainer.train_steps: 30 -> 40"),
])
def test_an_evaluator_refuses_to_change_the_trainers_config(
    launch_forked, trained, tmp_path, flag, difference):
  model_dir = copy_of(trained, tmp_path)
  listing = sorted(os.listdir(model_dir))
  result = launch_forked("--experiment=digits_convnet", "--mode=eval", flag,
                         model_dir=model_dir, script=DOUBLES_TRAIN)
  assert result.returncode == 2, result
  errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
  assert errors[0].startswith("error: An evaluator follows the trainer's "
                              "config"), result
  assert difference in result.stderr
  assert sorted(os.listdir(model_dir)) == listing


@pytest.mark.slow
def test_an_evaluator_started_before_its_trainer_follows_it(
    start_forked, launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  evaluator = start_forked("--experiment=digits_convnet",
                           "--mode=continuous_eval", model_dir=model_dir,
                           script=DOUBLES_TRAIN)
  evaluator.wait_for_line(lambda l: l.startswith("waiting up to"))
  trainer = launch_forked("--experiment=digits_convnet", "--mode=train",
                          "--trainer=eval_marking",
                          f"--params_override={TRAINED}",
                          model_dir=model_dir, script=DOUBLES_TRAIN)
  assert trainer.returncode == 0, trainer
  evaluated = evaluator.finish(timeout=120)
  assert evaluated.returncode == 0, evaluated
  summary = evaluated.summary("eval_summary.json")
  assert summary["trainer"] == "eval_marking"
  assert summary["eval_metrics"]["downstream/eval_marked"] == 1.0
  assert summary["global_step"] == 30
  assert trainer.summary()["mode"] == "train"


def test_an_export_never_compares_the_training_schedule(
    launch_forked, trained, tmp_path):
  # The training command's flags, given to --mode=export after the trainer
  # trained 30 steps: the schedule and the training data have no bearing on
  # an export. The model does.
  model_dir = copy_of(trained, tmp_path)
  schedule = (f"--params_override={SMOKE},trainer.early_stopping.patience=9,"
              "task.train_data.global_batch_size=32")
  exported = launch_forked("--experiment=digits_convnet", "--mode=export",
                           schedule, model_dir=model_dir, script=DOUBLES_TRAIN)
  assert exported.returncode == 0, exported
  assert os.path.isdir(os.path.join(model_dir, "export"))
  other_model = launch_forked(
      "--experiment=digits_convnet", "--mode=export",
      "--params_override=task.model.dense_units=64", model_dir=model_dir,
      script=DOUBLES_TRAIN)
  assert other_model.returncode == 2, other_model
  assert ("error: An export follows the trainer's config" in
          other_model.stderr)
  assert "task.model.dense_units: 128 -> 64" in other_model.stderr
