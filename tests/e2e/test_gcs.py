"""A model_dir in a `gs://` bucket, through TensorFlow's own GCS client.

The bucket is fake-gcs-server in a network namespace of the test's own,
where the Google API names are 127.0.0.1 (tests/gcs_box.py): the launcher
runs there as a user runs it, TensorFlow's GCS stat and listing caches at
their defaults, and the test reads what the server holds. `ram://`
(tests/e2e/test_object_store.py) stays the quick stand-in.

A bad bucket (none of that name, no or refused credentials, no
permission, no server or one that never answers) is refused as a user
must be told: one `error:` paragraph, exit 2, within a minute, nothing
written; and however a run ends, its log's local temp dir is gone.
"""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import DOUBLES_TRAIN
from conftest import REPO
from conftest import SMOKE
from conftest import TRAIN
import gcs_box as gcs_box_lib
from tfm_ext.model_dir import log_files

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
  # SIGINT's handler and mask are made the default's here: a disposition
  # the test process inherited is not what this test is about (one run in
  # CI timed out waiting for a SIGINT'd sleeper; cause not found).
  sleeper = ("import os, signal, time; "
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
             "signal.signal(signal.SIGINT, signal.default_int_handler); "
             "print(os.getpid(), flush=True); time.sleep(120)")
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
    gcs_box, forked_in, data_dir, tmp_path):
  cwd = tmp_path / "cwd"  # Where a model_dir taken for a local path lands.
  cwd.mkdir()
  prefix = f"run-{uuid.uuid4().hex[:8]}"
  model_dir = gcs_box.bucket_url(prefix)
  proc = forked_in.run(
      gcs_box, ["--experiment=digits_convnet", "--mode=train_and_eval",
                f"--model_dir={model_dir}", f"--params_override={SMOKE}"],
      env=_job_env(data_dir, tmp_path / "tmp"), cwd=str(cwd), timeout=600)
  # The run's objects, relative to its model_dir, as the server holds them.
  objects = {name[len(prefix) + 1:] for name in gcs_box.list(prefix + "/")}
  report = (f"exit {proc.returncode}\n--- objects\n{sorted(objects)}\n"
            f"--- stdout\n{proc.stdout[-3000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}")
  assert proc.returncode == 0, report

  def read(name):
    return gcs_box.read(f"{prefix}/{name}").decode()

  # What docs/model-dir.md says lands in model_dir, for this mode.
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

  # Nothing of the run on local disk: not under its model_dir's name, nor
  # the log's temp dir (`tfm_ext_logs_*`), once copied.
  assert not os.listdir(cwd)
  assert not os.path.exists(os.path.join(REPO, "gs:"))
  assert not os.listdir(tmp_path / "tmp"), report


def _job_env(data_dir, tmpdir):
  """A launcher's environment in the box, with `tmpdir` (made) its TMPDIR."""
  os.makedirs(tmpdir)
  return dict(TFM_EXT_DATA_DIR=data_dir, TF_CPP_MIN_LOG_LEVEL="2",
              PYTHONPATH=REPO, PYTHONUNBUFFERED="1", TMPDIR=str(tmpdir))


def _logs(box, prefix):
  return [n for n in box.list(f"{prefix}/logs/") if not n.endswith("/")]


@pytest.mark.slow
def test_a_bucket_run_that_fails_or_is_preempted_leaves_no_local_log(
    gcs_box, forked_in, data_dir, tmp_path):
  prefix = f"run-{uuid.uuid4().hex[:8]}"
  train = ["--experiment=digits_convnet",
           "--mode=train", f"--model_dir={gcs_box.bucket_url(prefix)}",
           "--params_override=trainer.steps_per_loop=100,"
           "trainer.summary_interval=100,trainer.checkpoint_interval=100,"
           "trainer.train_steps=1000000"]
  out, err = tmp_path / "trainer.out", tmp_path / "trainer.err"
  trainer = forked_in.start(gcs_box, train, stdout=out, stderr=err,
                            env=_job_env(data_dir, tmp_path / "t42"))

  def output():
    return out.read_text() + err.read_text()[-3000:]

  deadline = time.monotonic() + 300
  while "step " not in out.read_text():
    assert trainer.poll() is None, output()
    assert time.monotonic() < deadline, output()
    time.sleep(0.5)
  trainer.send_signal(signal.SIGTERM)
  assert trainer.wait(timeout=120) == 42, output()
  # Exit 2 once the log is open: the checkpoint does not fit a new model.
  refused = forked_in.run(
      gcs_box, train[:-1] + [train[-1] + ",task.model.dense_units=64",
                             "--allow_config_change"],
      env=_job_env(data_dir, tmp_path / "t2"), timeout=300)
  assert refused.returncode == 2, refused
  assert "does not fit" in refused.stderr, refused
  # The preempted run's log is copied to the bucket; the refused one, which
  # wrote nothing, takes its log back (tests/e2e/test_refused_jobs.py).
  assert len(_logs(gcs_box, prefix)) == 1
  nan = forked_in.run(
      gcs_box, ["--experiment=digits_nan", "--mode=train",
                f"--model_dir={gcs_box.bucket_url(prefix + '-nan')}",
                "--params_override=trainer.train_steps=60,"
                "trainer.steps_per_loop=10,trainer.checkpoint_interval=10,"
                "task.nan_at_step=25"],
      env=_job_env(data_dir, tmp_path / "t3"), timeout=300,
      script=DOUBLES_TRAIN)
  assert nan.returncode == 3, nan
  assert len(_logs(gcs_box, prefix + "-nan")) == 1
  for name in ("t42", "t2", "t3"):
    assert not os.listdir(tmp_path / name), name


def test_a_log_that_cannot_be_copied_is_kept_and_its_place_named(
    tmp_path, caplog):
  temp_dir = tmp_path / "tfm_ext_logs_x"
  temp_dir.mkdir()
  log = temp_dir / "tfm_ext.host.user.log.INFO.20261201-120000.7"
  log.write_text("the run's log\n")
  copy_log = log_files._copy_log  # pylint: disable=protected-access
  # A store TensorFlow cannot write (as a bucket gone at the end of a run).
  copy_log(str(log), "nofs://bucket/run/logs", temp_dir=str(temp_dir))
  assert log.read_text() == "the run's log\n"
  assert f"It is kept at {log}" in caplog.text
  # Copied: the temp dir goes.
  copy_log(str(log), str(tmp_path / "logs"), temp_dir=str(temp_dir))
  assert not temp_dir.exists()
  assert (tmp_path / "logs" / log.name).read_text() == "the run's log\n"


# -- A bad bucket: one `error:` paragraph, exit 2, in bounded time ----------

# A user's budget for being told, from the launcher's start (TensorFlow's
# import included).
BAD_BUCKET_SECONDS = 60


def _requests(box):
  """The proxy's requests so far (a refusal counts)."""
  path = os.path.join(box.state_dir, "requests.log")
  with open(path) as f:
    return sum(1 for line in f if '"' in line)


def _launch_refused(box, tmp_path, model_dir, env=None, wrap=None):
  """Runs the launcher on `model_dir`, which must be refused as a user is.

  One `error:` paragraph naming it, exit 2, within `BAD_BUCKET_SECONDS`,
  nothing left in TMPDIR or the cwd. Returns the paragraph and the
  requests the proxy saw.
  """
  cwd, tmpdir, home = (tmp_path / name for name in ("cwd", "tmp", "home"))
  for path in (cwd, tmpdir, home):
    path.mkdir()
  argv = [sys.executable, TRAIN, "--experiment=digits_convnet",
          "--mode=train", f"--model_dir={model_dir}"]
  before = _requests(box)
  started = time.monotonic()
  proc = box.run(wrap(argv) if wrap else argv, cwd=str(cwd), timeout=300,
                 env={"TMPDIR": str(tmpdir), "HOME": str(home),
                      "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2",
                      "PYTHONUNBUFFERED": "1", **(env or {})})
  seconds = time.monotonic() - started
  errors = [line for line in proc.stderr.splitlines()
            if line.startswith("error:")]
  report = (f"exit {proc.returncode} after {seconds:.1f}s\n--- stdout\n"
            f"{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-4000:]}")
  assert proc.returncode == 2, report
  assert seconds < BAD_BUCKET_SECONDS, report
  assert len(errors) == 1 and "Traceback" not in proc.stderr, report
  assert f"--model_dir={model_dir!r}" in errors[0], report
  # Nothing written anywhere: no temp log, nothing under the cwd.
  assert not os.listdir(tmpdir) and not os.listdir(cwd), report
  requests = _requests(box) - before
  print(f"{model_dir}: exit 2 after {seconds:.1f}s, {requests} requests: "
        f"{errors[0]}")
  # What it waits for, said from 10 s on, on the line before.
  waits = [line for line in proc.stderr.splitlines()
           if line.startswith("waiting for ")]
  return errors[0] + "".join(f"\n(said: {line})" for line in waits), requests


def test_a_bucket_that_does_not_exist_is_refused_at_once(gcs_box, tmp_path):
  error, requests = _launch_refused(gcs_box, tmp_path, "gs://nobucket/x")
  assert "the bucket gs://nobucket does not exist" in error, error
  assert "bucket's name" in error
  # (TensorFlow's makedirs asks thousands of times and never returns.)
  assert requests == 1  # The bucket's stat, not retried.


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_a_job_without_valid_credentials_is_refused(gcs_box, tmp_path, token):
  model_dir = gcs_box.bucket_url(f"run-{uuid.uuid4().hex[:8]}")
  # No credentials anywhere TensorFlow looks: the token, the file named by
  # GOOGLE_APPLICATION_CREDENTIALS, gcloud's (HOME is empty), no metadata
  # server.
  error, requests = _launch_refused(
      gcs_box, tmp_path, model_dir,
      env={"GOOGLE_AUTH_TOKEN_FOR_TESTING": token,
           "GOOGLE_APPLICATION_CREDENTIALS": None, "CLOUDSDK_CONFIG": None,
           "NO_GCE_CHECK": "true"})
  assert "refused these credentials" in error
  assert "GOOGLE_APPLICATION_CREDENTIALS" in error
  assert requests == 1  # The bucket's stat, not retried.
  assert not gcs_box.list(model_dir[len(gcs_box.bucket_url()):])


def test_a_caller_without_permission_on_the_bucket_is_refused(
    gcs_box, tmp_path):
  model_dir = gcs_box.bucket_url(f"run-{uuid.uuid4().hex[:8]}")
  error, requests = _launch_refused(
      gcs_box, tmp_path, model_dir,
      env={"GOOGLE_AUTH_TOKEN_FOR_TESTING": gcs_box_lib.NO_PERMISSION_TOKEN})
  assert "have no permission on gs://tfm-ext-test" in error
  assert "role" in error
  assert requests == 1  # The bucket's stat, not retried.
  assert not gcs_box.list(model_dir[len(gcs_box.bucket_url()):])


@pytest.mark.parametrize("answer", ["refused", "silent"])
def test_a_store_that_cannot_be_reached_is_refused_in_bounded_time(
    gcs_box, tmp_path, answer):
  # No server behind the Google names: the connection is refused, or
  # accepted and never answered. At TensorFlow's defaults its client tries
  # for minutes (10 tries 1-32 s apart; 120 s to connect, each): the check
  # gives up first, and the job exits at once.
  connections = tmp_path / "connections"
  error, _ = _launch_refused(
      gcs_box, tmp_path, gcs_box.bucket_url("x"),
      wrap=lambda argv: gcs_box_lib.without_server(argv, answer,
                                                   str(connections)))
  assert "could not be reached within 20s" in error and "network" in error
  assert "(said: waiting for gs://tfm-ext-test to answer (10s; at most 20s))" \
      in error, error
  tries = len(connections.read_text().splitlines())
  print(f"{answer}: {tries} connections")
  # Backed off (at 0, 1, 3, 7, 15 s) or waiting on its one connection: a
  # handful, then none, since the process is gone.
  assert 1 <= tries <= 6, tries


def test_an_input_on_a_silent_store_is_refused_in_bounded_time(gcs_box,
                                                                tmp_path):
  # The model_dir is local; the training data is in a bucket whose server
  # accepts the connection and never answers: the pattern's lookup is
  # bounded and said as the model_dir's is.
  pattern = gcs_box.bucket_url("data/train-*")
  argv = [sys.executable, TRAIN, "--experiment=digits_convnet",
          "--mode=train", f"--model_dir={tmp_path / 'm'}",
          f"--params_override=task.train_data.input_path={pattern}"]
  started = time.monotonic()
  proc = gcs_box.run(gcs_box_lib.without_server(argv, "silent"),
                     cwd=str(tmp_path), timeout=300,
                     env={"PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2",
                          "PYTHONUNBUFFERED": "1"})
  seconds = time.monotonic() - started
  report = f"exit {proc.returncode} after {seconds:.0f}s: {proc.stderr[-3000:]}"
  assert proc.returncode == 2 and seconds < BAD_BUCKET_SECONDS, report
  errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in proc.stderr, report
  assert errors[0].startswith(
      f"error: task.train_data.input_path={pattern!r}: gs://tfm-ext-test "
      "could not be reached within 20s"), report
  assert "waiting for gs://tfm-ext-test to answer (10s; at most 20s)" in (
      proc.stderr), report
  assert not (tmp_path / "m").exists()


# -- A record another process rewrote, read through TF's stale caches -------


_STALE_READ = gcs_box_lib.ANOTHER_PROCESS + """
import json, sys
import tensorflow as tf
from tfm_ext.model_dir import files
path = sys.argv[1]
def rewrite(value):
  do(f"tf.io.gfile.GFile({path!r}, 'w').write({json.dumps(value)!r})")
rewrite({"token": "x" * 200})
assert files.read_json(path)["token"] == "x" * 200  # Cached: its length.
rewrite({"token": "short"})
try:
  tf.io.gfile.GFile(path, "rb").read()
  print("plain read: no error")
except tf.errors.InternalError as e:
  print("plain read:", str(e).splitlines()[0])
print("read_json:", json.dumps(files.read_json(path)))
rewrite({"token": "y" * 400})
print("read_object:", json.dumps(files.read_object(path, {"token": str})))
"""


def test_a_record_rewritten_by_another_process_is_read_whole(
    gcs_box, forked_in, tmp_path):
  """TF's stat cache at its default: a re-read, never a crash or a cut."""
  path = gcs_box.bucket_url(f"stale-{uuid.uuid4().hex[:8]}/lease.json")
  # The reader forked in the box from a process that imported TensorFlow
  # (conftest's `forked_in`); the writer is `do`'s process, started afresh.
  script = tmp_path / "stale_read.py"
  script.write_text(_STALE_READ)
  proc = forked_in.run(gcs_box, [path], script=str(script))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  # What TensorFlow's client does without the re-read, then ours.
  assert "plain read: File contents are inconsistent" in proc.stdout, proc
  assert 'read_json: {"token": "short"}' in proc.stdout
  assert 'read_object: {"token": "' + "y" * 400 + '"}' in proc.stdout
