"""A trainer suspended inside a save, whose lease another trainer took.

The new holder deletes what the suspended save had written aside (its
temporary folder): the old holder wakes to TensorFlow's `NotFoundError`
in the middle of its save, and must say that it lost the lease, in one
line, exit 2, with no traceback (issue 46), and write nothing.
"""

import glob
import os
import re
import signal
import time

from conftest import REPO
from test_data_loss import _lease, _wait_for  # Case b's helpers.

STOPS_IN_SAVE = os.path.join(REPO, "tests", "stops_in_save_train.py")
EXPERIMENT = "--experiment=digits_convnet"
FOREVER = ("--mode=train", "--params_override=trainer.train_steps=1000000,"
           "trainer.steps_per_loop=10,trainer.summary_interval=10,"
           "trainer.checkpoint_interval=10")
LEASE_ENV = {"TFM_EXT_LEASE_HEARTBEAT_SECONDS": "0.5",
             "TFM_EXT_LEASE_STALE_SECONDS": "2"}


def _state(pid):
  with open(f"/proc/{pid}/stat") as f:
    return f.read().rsplit(")", 1)[1].split()[0]


def test_a_trainer_suspended_inside_a_save_wakes_and_exits_2_in_one_line(
    start_forked, tmp_path):
  model_dir = tmp_path / "m"
  a = start_forked(EXPERIMENT, *FOREVER, model_dir=model_dir, env=LEASE_ENV,
                   script=STOPS_IN_SAVE)
  a.wait_for_line(lambda l: l.startswith("stopping inside a save"))
  try:
    _wait_for(lambda: _state(a.proc.pid) == "T", 30, "A stopped")
    aside = glob.glob(f"{model_dir}/ckpt-10_fenced*_temp")
    assert aside, os.listdir(model_dir)  # Inside the save: shards written.
    # B starts once A's stamp is past the beats a live holder would have
    # made (else it refuses at once); it watches A's lease for the stale
    # time (A is stopped: judged by its counter), takes it over, deletes
    # A's temporary folder and trains on.
    _wait_for(lambda: time.time() - _lease(model_dir).get("heartbeat", 1e12)
              > 1.75, 30, "A's missed beats")
    b = start_forked(EXPERIMENT, *FOREVER, model_dir=model_dir,
                     env=LEASE_ENV)
    b.wait_for_line(lambda l: l.startswith("step ") and
                    os.path.exists(model_dir / "ckpt-10.index"), timeout=180)
    assert _lease(model_dir)["pid"] == b.proc.pid
    assert not any(os.path.exists(p) for p in aside)
    b_lease = _lease(model_dir)["token"]

    a.proc.send_signal(signal.SIGCONT)  # It wakes inside its save.
    lost = a.finish(timeout=120)
  finally:
    a.proc.send_signal(signal.SIGCONT)
  assert lost.returncode == 2, lost
  errors = [l for l in lost.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, lost
  assert re.search("another trainer took over", errors[0], re.I), lost
  assert "Traceback" not in lost.stderr, lost
  assert not any(os.path.exists(p) for p in aside)  # Nor written again.

  # B holds the lease still and stops as a preempted job does.
  assert _lease(model_dir)["token"] == b_lease
  b.proc.send_signal(signal.SIGTERM)
  stopped = b.finish()
  assert stopped.returncode == 42, stopped
