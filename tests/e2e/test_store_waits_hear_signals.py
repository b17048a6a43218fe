"""A store wait of a starting run hears SIGTERM, SIGINT and SIGHUP.

Two waits of the start sleep on a store, not on the run: `files.read_bytes`
reading a record again while TensorFlow's GCS cache may be stale (up to
`GCS_STAT_CACHE_MAX_AGE` + 1 s), and `usable.within` waiting for a store to
answer. Once the run's signal watcher is in, a signal only records itself,
so each sleeps with `signalled.sleep` and looks (`files.listening`): the
run ends within 2 s, exit 42 with its start-up line. Before the watcher, the
start-up's handler ends the process from inside the wait: a launcher whose
model_dir or input is on a silent store (as in tests/e2e/test_gcs.py) exits
42 well within a second of SIGTERM (tried by hand, before this change too).
"""

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Iterator
import uuid

import pytest
import tensorflow as tf

from conftest import TRAIN
from gcs_box import gcs_box  # pylint: disable=unused-import
from tfm_ext.base import settings
from tfm_ext.model_dir import files
from tfm_ext.model_dir import usable
from tfm_ext.run import preemption

STARTING = ("preempted: SIGTERM received during start-up: nothing to save "
            "yet; exit 42 to be restarted.")
GARBAGE = "not a lease {"
# A stale read is retried this long plus 1 s: far past the 2 s allowed.
CACHE_SECONDS = "30"


def _reads(box, name: str) -> int:
  with open(os.path.join(box.state_dir, "requests.log")) as f:
    return sum(1 for line in f if name in line)


@pytest.mark.parametrize("record, mode, override", [
    # Read by the lease, before the parts are built.
    ("trainer_lease.json", "train", ""),
    # Read while they are built (the best checkpoints' exporter).
    ("best/best_checkpoints.json", "train_and_eval",
     ",trainer.best_checkpoint_export_subdir=best,"
     "trainer.best_checkpoint_eval_metric=accuracy"),
], ids=["lease", "manifest"])
def test_a_run_rereading_a_damaged_record_on_a_bucket_exits_42_at_sigterm(
    gcs_box, data_dir, tmp_path, record, mode, override):
  prefix = f"run-{uuid.uuid4().hex[:8]}"
  env = {"PYTHONPATH": os.path.dirname(os.path.dirname(TRAIN)),
         "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1",
         "TFM_EXT_DATA_DIR": data_dir, "GCS_STAT_CACHE_MAX_AGE": CACHE_SECONDS}
  # Put straight to the emulator (no TensorFlow to import for one object).
  wrote = gcs_box.run([sys.executable, "-S", "-c", (
      "import urllib.request; urllib.request.urlopen(urllib.request.Request("
      f"'http://127.0.0.1:4443/upload/storage/v1/b/{gcs_box.bucket}/o?"
      f"uploadType=media&name={prefix}/{record}', "
      f"data={GARBAGE.encode()!r}, method='POST'))")])
  assert wrote.returncode == 0, wrote.stderr[-2000:]
  err = tmp_path / "err"
  with open(err, "w") as stderr:
    job = gcs_box.start(
        [sys.executable, TRAIN, "--experiment=digits_convnet", f"--mode={mode}",
         f"--model_dir={gcs_box.bucket_url(prefix)}",
         f"--params_override=trainer.train_steps=20{override}"],
        env=env, cwd=str(tmp_path), stderr=stderr)
  try:
    name = os.path.basename(record)
    before = _reads(gcs_box, name)
    deadline = time.monotonic() + 120
    # Read, then read again: the run waits for the cache to age.
    while _reads(gcs_box, name) < before + 3:
      assert job.poll() is None and time.monotonic() < deadline, (
          err.read_text()[-3000:])
      time.sleep(0.05)
    sent = time.monotonic()
    job.send_signal(signal.SIGTERM)
    code = job.wait(timeout=60)
    seconds = time.monotonic() - sent
  finally:
    if job.poll() is None:
      job.kill()
  text = err.read_text()
  print(f"{record}: exit {code} {seconds:.2f}s after SIGTERM")
  assert code == 42, text[-3000:]
  assert seconds < 2.0, f"{seconds:.1f}s: {text[-3000:]}"
  assert STARTING in text.splitlines(), text[-3000:]
  assert "Traceback" not in text, text[-3000:]
  # What it read is left as it was; no claim left, no summary of a run
  # that never started (a bug's, had the signal been taken for one).
  assert gcs_box.read(f"{prefix}/{record}") == GARBAGE.encode()
  objects = gcs_box.list(f"{prefix}/")
  assert not [n for n in objects if "/trainer_lease_claims/" in n
              and n.endswith(".json")], objects
  assert not [n for n in objects if n.endswith("summary.json")], objects


@pytest.fixture
def watcher():
  """The run's signal watcher in this process, listened to as the driver's
  start does (`files.listening`)."""
  with preemption.SignalWatcher() as watching, files.listening(
      watching.check_start):
    yield watching


@contextlib.contextmanager
def _signal_in(seconds: float, signum: int) -> Iterator[float]:
  """`signum` to this process in `seconds`, while the block (and the
  watcher around it) lasts; yields when it is sent."""
  timer = threading.Timer(seconds, os.kill, args=(os.getpid(), signum))
  timer.start()
  try:
    yield time.monotonic() + seconds
  finally:
    timer.cancel()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT,
                                    signal.SIGHUP], ids=lambda s: s.name)
def test_a_record_read_again_on_a_store_ends_at_a_signal(watcher, signum,
                                                         monkeypatch):
  path = f"ram://waits-{uuid.uuid4().hex[:8]}/record.json"
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(GARBAGE)  # Never whole: read again for 31 s.
  monkeypatch.setattr(settings, "_current", settings.get().replace(
      gcs_stat_cache_seconds=float(CACHE_SECONDS)))
  with _signal_in(0.3, signum) as sent, pytest.raises(
      preemption.StartUpInterrupted, match=signal.Signals(signum).name):
    files.read_json(path)
  assert time.monotonic() - sent < 1.0


def test_a_store_that_does_not_answer_ends_its_wait_at_a_signal(watcher):
  answered = threading.Event()
  with _signal_in(0.3, signal.SIGTERM) as sent, pytest.raises(
      preemption.StartUpInterrupted, match="SIGTERM"):
    usable.within(lambda: answered.wait(30), "task.train_data.input_path",
                  "gs://silent", timeout=20)
  answered.set()
  assert time.monotonic() - sent < 1.0
