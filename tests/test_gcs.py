"""A model_dir in a `gs://` bucket, through TensorFlow's own GCS client.

The bucket is fake-gcs-server in a network namespace of the test's own,
where the Google API names are 127.0.0.1 (tests/gcs_box.py): the launcher
runs there as a user runs it, TensorFlow's GCS stat and listing caches at
their defaults, and the test reads what the server holds. `ram://`
(tests/test_object_store.py) stays the quick stand-in.
"""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from conftest import REPO
from conftest import SMOKE
from conftest import TRAIN
import gcs_box as gcs_box_lib
from gcs_box import gcs_box  # pylint: disable=unused-import  # The fixture.

# pylint: disable=redefined-outer-name


def test_the_box_gives_the_google_names_to_loopback_alone(gcs_box):
  for name in gcs_box_lib.GOOGLE_NAMES:
    found = gcs_box.run(["getent", "hosts", name])
    assert found.stdout.split()[:1] == ["127.0.0.1"], (name, found)
  interfaces = gcs_box.run([sys.executable, "-c", (
      "import socket; print([n for _, n in socket.if_nameindex()])")])
  assert interfaces.stdout.strip() == "['lo']", interfaces


def test_a_command_outside_the_box_is_refused_before_it_starts(tmp_path):
  ran = tmp_path / "ran"
  # Here, in the test's own namespace, the names are not 127.0.0.1.
  refused = subprocess.run(
      [sys.executable, gcs_box_lib.__file__, "--guard", "--", "touch",
       str(ran)], capture_output=True, text=True, check=False)
  assert refused.returncode == 1, refused
  assert "gcs_box: refusing to run: `getent hosts www.googleapis.com`" in (
      refused.stderr)
  assert not ran.exists()


def test_jobs_in_the_box_run_at_once_and_take_signals(gcs_box):
  sleeper = ("import os, time; print(os.getpid(), flush=True); "
             "time.sleep(120)")
  jobs = [gcs_box.start([sys.executable, "-c", sleeper],
                        stdout=subprocess.PIPE, text=True) for _ in range(2)]
  try:
    for job in jobs:  # Its pid is the job's, not nsenter's nor the guard's.
      assert int(job.stdout.readline()) == job.pid
    jobs[0].send_signal(signal.SIGTERM)
    assert jobs[0].wait(timeout=30) == -signal.SIGTERM
    assert jobs[1].poll() is None
    jobs[1].send_signal(signal.SIGINT)
    assert jobs[1].wait(timeout=30) != 0
  finally:
    for job in jobs:
      job.kill()
      job.wait()


@pytest.mark.slow
def test_train_and_eval_writes_every_record_to_the_bucket(
    gcs_box, data_dir, tmp_path):
  cwd = tmp_path / "cwd"  # Where a model_dir taken for a local path lands.
  cwd.mkdir()
  prefix = f"run-{uuid.uuid4().hex[:8]}"
  model_dir = gcs_box.bucket_url(prefix)
  proc = gcs_box.run(
      [sys.executable, TRAIN, "--experiment=digits_convnet",
       "--mode=train_and_eval", f"--model_dir={model_dir}",
       f"--params_override={SMOKE}"],
      env=dict(TFM_EXT_DATA_DIR=data_dir, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO, PYTHONUNBUFFERED="1"),
      cwd=str(cwd), timeout=600)
  # The run's objects, relative to its model_dir, as the server holds them.
  objects = {name[len(prefix) + 1:] for name in gcs_box.list(prefix + "/")}
  report = (f"exit {proc.returncode}\n--- objects\n{sorted(objects)}\n"
            f"--- stdout\n{proc.stdout[-3000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}")
  assert proc.returncode == 0, report

  def read(name):
    return gcs_box.read(f"{prefix}/{name}").decode()

  # What the README's table says lands in model_dir, for this mode.
  for name in ("checkpoint", "params.yaml", "tfm_ext_params.yaml",
               "operative_config.train_and_eval.gin", "run_summary.json",
               "metrics.csv", "curves.png", "training_complete.json",
               "best_ckpt/best_checkpoints.json", "best_ckpt/info.json"):
    assert name in objects, (name, report)
  # A checkpoint every checkpoint_interval (20) and at the end, no other.
  assert {n for n in objects if n.startswith("ckpt-")} == {
      "ckpt-20.index", "ckpt-20.data-00000-of-00001",
      "ckpt-40.index", "ckpt-40.data-00000-of-00001"}, report
  for folder in ("train/", "validation/", "training_starts/", "logs/"):
    assert [n for n in objects if n.startswith(folder) and n != folder], (
        folder, report)
  # No temporary upload, nor a checkpoint's `_temp` save, left behind.
  assert not [n for n in objects if ".tmp" in n or "_temp" in n], report

  summary = json.loads(read("run_summary.json"))
  assert (summary["mode"], summary["global_step"]) == ("train_and_eval", 40)
  assert summary["eval_metrics"]["accuracy"] > 0.5
  assert 'model_checkpoint_path: "ckpt-40"' in read("checkpoint")
  rows = list(csv.DictReader(io.StringIO(read("metrics.csv"))))
  assert [int(row["step"]) for row in rows] == [1, 10, 20, 30, 40]
  assert [row["validation_accuracy"] != "" for row in rows].count(True) == 2
  best = json.loads(read("best_ckpt/best_checkpoints.json"))
  assert {e["global_step"] for e in best["checkpoints"]} == {20, 40}
  for entry in best["checkpoints"]:
    assert f"best_ckpt/{entry['path']}.index" in objects, report
  logs = [n for n in objects if n.startswith("logs/") and n != "logs/"]
  assert f"Run summary: {model_dir}/run_summary.json" in read(logs[0])

  # Nothing of the run on local disk under its model_dir's name.
  assert not os.listdir(cwd)
  assert not os.path.exists(os.path.join(REPO, "gs:"))
