"""A refused job leaves the model_dir as it found it, wherever it is refused.

Some refusals can only be known once the run has started: an unknown model
name is found when the task builds its model, after the log file and the
lease's claim were made; a second trainer finds the lease held after its
log file was opened. Such a job takes back what it made (its log, the
directories it added) unless it wrote a record.
"""

import os
import re

from conftest import assert_clean_usage_error
from tfm_ext.model_dir import files
from tfm_ext.model_dir import lease

EXP = "--experiment=digits_convnet"


def _listing(directory):
  return sorted(os.path.relpath(os.path.join(root, name), directory)
                for root, dirs, files in os.walk(directory)
                for name in dirs + files)


def test_an_unknown_model_name_writes_no_model_dir(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      "--params_override=task.model.name=convnett",
                      model_dir=tmp_path / "m")
  # One line, without the frames gin adds to what a configurable raises.
  assert_clean_usage_error(run, "Unknown model 'convnett'", "'digits_convnet'")
  assert "In call to configurable" not in run.stderr, run.stderr


def test_a_refusal_in_a_used_model_dir_leaves_what_was_there(
    launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  first = launch_forked(EXP, "--mode=train",
                        "--params_override=trainer.train_steps=2",
                        model_dir=model_dir)
  assert first.returncode == 0, first.stderr
  before = _listing(model_dir)
  assert any(name.startswith("logs/") for name in before), before
  run = launch_forked(EXP, "--mode=train", "--allow_config_change",
                      "--params_override=task.model.name=convnett",
                      model_dir=model_dir)
  assert run.returncode == 2, run.stderr
  assert "Unknown model 'convnett'" in run.stderr, run.stderr
  # absl's link to the latest log points at the first run's again.
  assert _listing(model_dir) == before


def test_a_second_trainer_refused_by_the_lease_leaves_no_log(
    launch_forked, tmp_path):
  model_dir = str(tmp_path / "m")
  held = lease.acquire(model_dir)  # This live process holds it.
  try:
    before = _listing(model_dir)
    run = launch_forked(EXP, "--mode=train",
                        "--params_override=trainer.train_steps=2",
                        model_dir=model_dir)
    assert run.returncode == 2, run.stderr
    assert "in use by another trainer" in run.stderr, run.stderr
    assert _listing(model_dir) == before
  finally:
    held.release()


def test_a_job_that_wrote_a_record_takes_nothing_back(tmp_path):
  model_dir = tmp_path / "m"
  traces = files.Traces(str(model_dir))
  (model_dir / "logs").mkdir(parents=True)
  (model_dir / "logs" / "tfm_ext.log").write_text("the job's log")
  (model_dir / "claims").mkdir()
  (model_dir / "train").mkdir()
  (model_dir / "train" / "events").write_text("a record")
  assert not traces.take_back([str(model_dir / "logs" / "tfm_ext.log")])
  assert _listing(model_dir) == ["claims", "logs", "logs/tfm_ext.log",
                                 "train", "train/events"]
  (model_dir / "train" / "events").unlink()
  assert traces.take_back([str(model_dir / "logs" / "tfm_ext.log")])
  assert not model_dir.exists()


def test_an_export_of_a_checkpoint_that_does_not_fit_records_nothing(
    launch_forked, tmp_path):
  other, model_dir = tmp_path / "other", tmp_path / "m"
  for where, units in ((other, 16), (model_dir, 128)):
    run = launch_forked(EXP, "--mode=train", "--params_override=trainer."
                        f"train_steps=2,task.model.dense_units={units}",
                        model_dir=where)
    assert run.returncode == 0, run.stderr
  before = _listing(model_dir)
  run = launch_forked(EXP, "--mode=export", f"--checkpoint_path={other}/ckpt-2",
                      model_dir=model_dir)
  assert run.returncode == 2, run.stderr
  # One line: TensorFlow's warnings of the values the failed read left
  # unrestored are not printed.
  lines = run.stderr.splitlines()
  assert [l for l in lines if l.startswith("error: ")] == lines[-1:], lines
  assert not [l for l in lines if re.match(r"W\d{4} ", l)], lines
  assert "does not fit this run's model" in run.stderr, run.stderr
  assert _listing(model_dir) == before  # No export_summary.json, no log.
