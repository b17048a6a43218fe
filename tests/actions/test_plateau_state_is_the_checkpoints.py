"""Early stopping's and the plateau's state come from the checkpoint; the
record `plateau.json` only reports it, and a stopped run trains on when
asked to (`tfm_ext.actions.plateau`, `tfm_ext.training.run_state`).

Two stopped runs on digits_convnet (deterministic, evaluations every 20
steps; early stopping on accuracy stops at step 120): one that saves every
20 steps, so `ckpt-120` holds the state before the evaluation that
stopped it, and one that saves every 70 (at 80 and 160), so the stop saved `ckpt-120`
after it.
"""

import json
import os
import re
import shutil

import pytest

from test_plateau import watched

EXP = ("--experiment=digits_convnet", "--mode=train_and_eval")
STOP = 120


def _train(launch_forked, model_dir, *, every=20, patience=2, steps=400):
  return launch_forked(*EXP, f"--params_override={watched(every, patience)},"
                       f"trainer.train_steps={steps}", model_dir=model_dir)


def _ok(run):
  assert run.returncode == 0, run
  assert "Traceback" not in run.stderr, run
  return run


def _trained(run):
  """The steps this start trained to (its progress lines)."""
  return [int(s) for s in re.findall(r"^step (\d+)/", run.stdout, re.M)]


def _record(model_dir, edit=None):
  path = os.path.join(model_dir, "plateau.json")
  with open(path) as f:
    record = json.load(f)
  if edit:
    edit(record)
    with open(path, "w") as f:
      json.dump(record, f)
  return record


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, launch_forked):
  """`every` -> a model_dir that early stopping stopped at STOP."""
  dirs = {}
  for every in (20, 70):
    model_dir = tmp_path_factory.mktemp(f"every_{every}") / "m"
    run = _ok(_train(launch_forked, model_dir, every=every))
    assert f"stopped @ step {STOP} | early stopping" in run.stdout, run
    assert os.path.exists(model_dir / f"ckpt-{STOP}.index")
    dirs[every] = model_dir
  return dirs


def _copy(stopped, every, tmp_path):
  model_dir = tmp_path / "m"
  shutil.copytree(stopped[every], model_dir)
  return model_dir


def test_a_larger_patience_trains_on(stopped, launch_forked, tmp_path):
  # It trained nothing: the summary's record of the stop (same train_steps)
  # decided.
  for every in (20, 70):
    model_dir = _copy(stopped, every, tmp_path / str(every))
    run = _ok(_train(launch_forked, model_dir, every=every, patience=3))
    assert _trained(run)[:1] == [140], run
    assert "already complete" not in run.stdout, run


def test_a_larger_train_steps_trains_on(stopped, launch_forked, tmp_path):
  # The manual promises it; it trained nothing.
  for every in (20, 70):
    model_dir = _copy(stopped, every, tmp_path / str(every))
    run = _ok(_train(launch_forked, model_dir, every=every, steps=500))
    assert _trained(run)[:1] == [140], run
    with open(model_dir / "run_summary.json") as f:
      assert json.load(f)["global_step"] > STOP


def test_the_same_command_trains_nothing(stopped, launch_forked, tmp_path):
  model_dir = _copy(stopped, 70, tmp_path)  # Saved after its evaluation.
  record = _record(model_dir)
  run = _ok(_train(launch_forked, model_dir, every=70))
  assert not _trained(run) and "eval @" not in run.stdout, run
  assert f"already complete at step {STOP} (stopped early: " in run.stdout
  assert _record(model_dir) == record


def test_an_edited_wait_in_the_record_is_ignored(stopped, launch_forked,
                                                 tmp_path):
  # It ended the run at once: the record's count overrode the checkpoint's.
  for every in (20, 70):
    model_dir = _copy(stopped, every, tmp_path / str(every))
    _record(model_dir, lambda r: r["early_stopping"].update(wait=99))
    run = _ok(_train(launch_forked, model_dir, every=every, patience=3,
                     steps=140))
    assert _trained(run) == [140], run
    if every == 70:  # A record of the checkpoint's own evaluation: said.
      assert _warned(run) == ["its early_stopping state at step 120 is not "
                              "the checkpoint's"], run


def _warned(run):
  return re.findall(r"plateau\.json: (.*); ignored: early stopping and the "
                    r"plateau go on from the checkpoint's state", run.stderr)


@pytest.mark.parametrize("fault, said", [
    # A traceback: float('abc').
    (lambda r: r["early_stopping"].update(best="abc"), "cannot be read"),
    (lambda r: r["reduce_lr_on_plateau"].update(lr_factor=0.03),
     "its reduce_lr_on_plateau state at step 120 is not the checkpoint's"),
    (lambda r: r.update(early_stopping=[]), "cannot be read"),
    ("", "cannot be read"),  # Cut to zero bytes.
], ids=["best_not_a_number", "factor_edited", "state_not_an_object",
        "zero_bytes"])
def test_a_record_that_cannot_be_read_or_disagrees_is_warned_of(
    stopped, launch_forked, tmp_path, fault, said):
  model_dir = _copy(stopped, 70, tmp_path)
  if fault == "":
    open(model_dir / "plateau.json", "w").close()
  else:
    _record(model_dir, fault)
  run = _ok(_train(launch_forked, model_dir, every=70))
  assert not _trained(run), run
  assert len(_warned(run)) == 1 and said in _warned(run)[0], run.stderr
