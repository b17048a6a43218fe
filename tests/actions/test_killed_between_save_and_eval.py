"""Killed between a checkpoint's save and its step's evaluation, resumed:
the same run as one never killed (`tfm_ext.training.run_state`).

A checkpoint of a step where the schedule evaluates is saved before that
evaluation. tests/killed_before_eval_train.py SIGKILLs the launcher right
there; the relaunch runs that evaluation first, from the checkpoint's
state. On digits_convnet (deterministic, evaluations every 20 steps) the
plateau halves the learning rate at the evaluation of step 100 and early
stopping stops at 120: the run is killed before each of those two.
"""

import csv
import json
import os
import re

import numpy as np
import pytest

from conftest import REPO, numeric_tensors
from test_plateau import watched

KILLS_ITSELF = os.path.join(REPO, "tests", "killed_before_eval_train.py")
EXP = ("--experiment=digits_convnet", "--mode=train_and_eval")
WATCHED = f"--params_override=trainer.train_steps=400,{watched()}"
STOP = 120


def _run(launch_forked, model_dir, kill_at=None):
  run = launch_forked(*EXP, WATCHED, model_dir=model_dir, script=KILLS_ITSELF,
                      env={"KILL_BEFORE_EVAL_AT": str(kill_at or "")})
  assert run.returncode == (-9 if kill_at else 0), run
  assert "Traceback" not in run.stderr, run
  return run


def _evaluated(runs):
  return [int(m) for run in runs
          for m in re.findall(r"^eval @ step (\d+) \|", run.stdout, re.M)]


def _said(runs, prefix):
  return [l for run in runs for l in run.stdout.splitlines()
          if l.startswith(prefix)]


def _rows(model_dir):
  """metrics.csv without the speed (a time), by step."""
  with open(os.path.join(model_dir, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row.pop("steps_per_second", None)
  return {row.pop("step"): row for row in rows}


def _json(*path):
  with open(os.path.join(*path)) as f:
    return json.load(f)


def _best(model_dir):
  return [(e["path"], e["global_step"], e["value"]) for e in
          _json(model_dir, "best_ckpt", "best_checkpoints.json")[
              "checkpoints"]]


def _validation_events(model_dir):
  """(step, tag) -> how many events the validation summaries hold."""
  from tfm_ext.actions import curves  # pylint: disable=g-import-not-at-top
  counts = {}
  top = os.path.join(model_dir, "validation")
  for name in os.listdir(top):
    for step, tag, _ in curves._scalar_events(os.path.join(top, name)):  # pylint: disable=protected-access
      counts[(step, tag)] = counts.get((step, tag), 0) + 1
  return counts


@pytest.fixture(scope="module")
def whole(tmp_path_factory, launch_forked):
  model_dir = tmp_path_factory.mktemp("whole")
  return model_dir, [_run(launch_forked, model_dir)]


def test_killed_before_two_evaluations_resumes_as_the_run_never_killed(
    whole, launch_forked, tmp_path):
  reference, whole_runs = whole
  model_dir = tmp_path / "killed"
  runs = [_run(launch_forked, model_dir, kill_at=100),
          _run(launch_forked, model_dir, kill_at=STOP),
          _run(launch_forked, model_dir)]
  assert _evaluated(whole_runs) == list(range(20, STOP + 1, 20))
  assert _evaluated(runs) == _evaluated(whole_runs)
  for prefix in ("plateau @", "stopped @"):
    assert _said(runs, prefix) == _said(whole_runs, prefix), prefix
  assert _json(reference, "run_summary.json")["stopped_early_at"] == STOP
  _assert_same_run(model_dir, reference)
  # Relaunched, it evaluates step 120 again (its checkpoint was saved
  # before that evaluation) and stops there again; every record stays.
  again = _run(launch_forked, model_dir)
  assert _evaluated([again]) == [STOP] and not re.search(
      r"^step ", again.stdout, re.M), again
  assert _said([again], "stopped @") == _said(whole_runs, "stopped @")
  _assert_same_run(model_dir, reference)


def _assert_same_run(model_dir, reference):
  """`model_dir` holds the records and final checkpoint of `reference`."""
  for name in ("stopped_early_at", "stop_reason", "lr_factor",
               "lr_reductions", "eval_metrics", "best"):
    ours = _json(model_dir, "run_summary.json")[name]
    theirs = _json(reference, "run_summary.json")[name]
    if name == "best":
      ours, theirs = ({k: v for k, v in b.items() if k != "path"}
                      for b in (ours, theirs))
    assert ours == theirs, name
  assert _json(model_dir, "plateau.json") == _json(reference, "plateau.json")
  assert _best(model_dir) == _best(reference)
  assert _rows(model_dir) == _rows(reference)
  events = _validation_events(model_dir)
  assert events.keys() == _validation_events(reference).keys()
  assert set(events.values()) == {1}, events  # Each written once.
  ours, theirs = (numeric_tensors(str(d / f"ckpt-{STOP}"))
                  for d in (model_dir, reference))
  assert sorted(ours) == sorted(theirs)
  for name in ours:
    assert np.array_equal(ours[name], theirs[name]), name
