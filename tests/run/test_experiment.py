"""tfm_ext.run_experiment: TFM's arguments, TFM's return value.

TFM's own train_lib_test runs against it too (test_tfm_core_suites.py);
this checks what that suite leaves out, in-process on digits_convnet.
"""

import csv
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
import tf_keras

from official.core import task_factory

import tfm_ext
from conftest import REPO
from tfm_ext.actions import curves
from tfm_ext.config import params as params_lib


def test_train_and_post_eval_returns_the_logs_of_its_evaluation(
    data_dir, tmp_path):
  del data_dir  # Sets TFM_EXT_DATA_DIR: the bundled digits records' cache.
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet",
      params_override="trainer.train_steps=20,trainer.steps_per_loop=10,"
      "trainer.summary_interval=10,trainer.checkpoint_interval=20,"
      "trainer.validation_interval=20"))
  strategy = tf.distribute.get_strategy()
  with strategy.scope():
    task = task_factory.get_task(params.task, logging_dir=str(tmp_path))

  model, logs = tfm_ext.run_experiment(
      distribution_strategy=strategy, task=task, mode="train_and_post_eval",
      params=params, model_dir=str(tmp_path))

  assert isinstance(model, tf_keras.Model)
  assert {"accuracy", "validation_loss"} <= set(logs), logs
  # The evaluation at the last step, as the run logged it.
  with open(os.path.join(tmp_path, curves.METRICS_CSV)) as f:
    rows = {int(row["step"]): row for row in csv.DictReader(f)}
  assert float(logs["accuracy"]) == pytest.approx(
      float(rows[20]["validation_accuracy"]), rel=1e-6)


NOTEBOOK = """
import json, sys
import tfm_ext

root, out = sys.argv[1], {}
try:
  tfm_ext.launch("digits_convnet", model_dir=f"{root}/refused",
                 params_override="trainer.train_steps=-1")
except tfm_ext.UsageError as e:
  out["refused"] = [str(e), e.exit_code]
try:
  tfm_ext.launch("digits_convnet", model_dir=f"{root}/refused",
                 actions=[print])
except tfm_ext.UsageError as e:
  out["refused_action"] = [str(e), e.exit_code]
ran = {"eval": [], "train": []}
def each_evaluation(output):
  ran["eval"].append(round(float(output["accuracy"]), 6))
def loops(context):
  return lambda output: ran["train"].append((context.mode, len(output)))
summary = tfm_ext.launch(
    "digits_convnet", model_dir=f"{root}/trained", mode="train_and_eval",
    params_override="trainer.train_steps=40,trainer.steps_per_loop=20,"
    "trainer.summary_interval=20,trainer.validation_interval=40",
    actions=[tfm_ext.RunAction("eval", each_evaluation),
             tfm_ext.RunAction("train", factory=loops)])
out["trained"] = summary.to_json()
out["seen"] = dict(ran)
# The trained model, back from its best checkpoint, on the validation set.
from official.core import exp_factory, task_factory
model = tfm_ext.load(f"{root}/trained")
config = exp_factory.get_exp_config("digits_convnet").task
right = seen = 0
for images, labels in task_factory.get_task(config).build_inputs(
    config.validation_data):
  right += int(sum(model(images, training=False).numpy().argmax(-1)
                   == labels.numpy()))
  seen += len(labels)
out["loaded"] = right / seen
try:
  tfm_ext.launch("digits_convnet", model_dir=f"{root}/diverged", mode="train",
                 params_override="trainer.train_steps=40,"
                 "trainer.steps_per_loop=20,trainer.summary_interval=20,"
                 "trainer.loss_upper_bound=0.0001")
except tfm_ext.RunFailed as e:
  out["failed"] = [str(e), e.exit_code]
out["seen_after"] = ran  # The next run's actions are its own.
print(json.dumps(out))
"""


def test_launch_runs_the_launchers_job_from_python(data_dir, tmp_path):
  # Three runs in one process, as cells of a notebook: refused, trained,
  # failed; each raises or returns what the launcher exits with.
  script = tmp_path / "notebook.py"
  script.write_text(NOTEBOOK)
  proc = subprocess.run(
      [sys.executable, str(script), str(tmp_path)], capture_output=True,
      text=True, timeout=600, cwd=REPO,
      env={**{k: v for k, v in os.environ.items()
              if k != "TF_CPP_MIN_LOG_LEVEL"},
           "PYTHONPATH": REPO, "TFM_EXT_DATA_DIR": data_dir})
  assert proc.returncode == 0, proc.stderr[-4000:]
  # TensorFlow's native INFO lines stay as quiet as from the command line.
  native = [line for line in proc.stderr.splitlines()
            if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: I ", line)
            or "cuInit" in line]
  assert not native, native
  out = json.loads(proc.stdout.splitlines()[-1])
  assert out["refused"] == [
      "trainer.train_steps=-1: give a whole number of steps, 0 or more.", 2]
  assert not (tmp_path / "refused").exists()
  message, code = out["refused_action"]
  assert code == 2 and "tfm_ext.RunAction" in message, message
  trained = json.loads(out["trained"])
  # The run's own actions ran on each loop and evaluation, and no other's.
  assert out["seen"]["eval"] == [pytest.approx(
      trained["eval_metrics"]["accuracy"], abs=1e-6)]
  modes = [mode for mode, _ in out["seen"]["train"]]
  assert len(modes) >= 2 and set(modes) == {"train_and_eval"}, modes
  assert out["seen_after"] == out["seen"]
  with open(tmp_path / "trained" / "run_summary.json") as f:
    assert json.load(f) == trained  # The launcher's records.
  assert (trained["status"], trained["global_step"]) == ("completed", 40)
  assert "accuracy" in trained["eval_metrics"]
  # tfm_ext.load: the model of its best (and only evaluated) checkpoint.
  assert trained["best"]["global_step"] == 40
  assert out["loaded"] == pytest.approx(trained["eval_metrics"]["accuracy"],
                                        abs=1e-6)
  for record in ("params.yaml", "checkpoint", "metrics.csv", "logs"):
    assert (tmp_path / "trained" / record).exists(), record
  message, code = out["failed"]
  assert code == 3 and "trainer.loss_upper_bound=0.0001" in message, message
  assert f"error: {message}" in proc.stderr  # Said as the launcher says it.
