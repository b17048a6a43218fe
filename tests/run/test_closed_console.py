"""A console that is closed or goes away does not end the run.

Fresh launcher processes: what a stream closed at the start does to one is
what these test. The run's result is in its records and exit code.
"""

import json
import os
import subprocess
import sys

from conftest import REPO, SMOKE, TRAIN

ARGS = ["--experiment=digits_convnet", "--mode=train",
        f"--params_override={SMOKE}"]


def _summary(model_dir):
  with open(os.path.join(model_dir, "run_summary.json")) as f:
    return json.load(f)


def _env():
  return {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_a_run_with_its_console_closed_trains_and_exits_0(tmp_path):
  # Both streams closed (one run for the two: a fresh process each).
  model_dir = str(tmp_path / "m")
  shell = ">&- 2>&-"
  done = subprocess.run(
      f"exec {sys.executable} {TRAIN} {' '.join(ARGS)} "
      f"--model_dir={model_dir} {shell}", shell=True, cwd=REPO, env=_env(),
      timeout=300, check=False)
  assert done.returncode == 0
  assert (_summary(model_dir)["status"], _summary(model_dir)["global_step"]) == (
      "completed", 40)
  # Nothing the run opened took the closed descriptors' numbers.
  logs = os.listdir(os.path.join(model_dir, "logs"))
  assert logs and all(os.path.getsize(os.path.join(model_dir, "logs", n))
                      for n in logs)


def test_a_reader_that_goes_away_leaves_the_run_to_finish(tmp_path):
  # `train.py ... | head -1`: the pipe breaks at the next line printed.
  model_dir = str(tmp_path / "m")
  proc = subprocess.Popen(
      [sys.executable, TRAIN, *ARGS, f"--model_dir={model_dir}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=_env())
  assert proc.stdout.readline().startswith(b"step ")
  proc.stdout.close()
  proc.stderr.close()
  assert proc.wait(timeout=300) == 0
  summary = _summary(model_dir)
  assert (summary["status"], summary["exit_code"], summary["global_step"]) == (
      "completed", 0, 40)
