"""A downstream repository: subclass, register, fork the launcher, select."""

import os

import pytest

from conftest import DOWNSTREAM_TRAIN, SMOKE


@pytest.mark.slow
def test_forked_launcher_runs_the_downstream_trainer_by_flag(launch_forked,
                                                             tmp_path):
  with open(DOWNSTREAM_TRAIN) as f:
    code = [l for l in f.read().splitlines()
            if l.strip() and not l.startswith('"""')]
  assert len(code) <= 4  # `from absl import app` plus the three lines.

  run = launch_forked("--experiment=digits_convnet", "--mode=train_and_eval",
                      "--trainer=recording", f"--params_override={SMOKE}",
                      model_dir=tmp_path / "m", script=DOWNSTREAM_TRAIN)
  assert run.returncode == 0, run
  summary = run.summary()
  assert summary["trainer"] == "recording"
  # Loops end at steps 1, 10, 20, 30, 40: the downstream hook ran each time.
  assert summary["train_metrics"]["downstream/loop_ends"] == 5.0
  params = open(os.path.join(run.model_dir, "params.yaml")).read()
  assert "name: recording" in params


def test_trainer_chosen_by_gin_binding_is_recorded(launch_forked, tmp_path):
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      "--gin_params=tfm_ext.trainer.name = 'recording'",
                      f"--params_override={SMOKE}", model_dir=tmp_path / "m",
                      script=DOWNSTREAM_TRAIN)
  assert run.returncode == 0, run
  assert run.summary()["trainer"] == "recording"
  gin_config = open(os.path.join(run.model_dir,
                                 "operative_config.train.gin")).read()
  assert "recording" in gin_config
