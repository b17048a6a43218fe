"""Liveness before clocks (issue 46): the lease judged against real processes.

On its own machine a running holder keeps its lease whatever the clocks
say; elsewhere a holder is gone only once its beat counter has stopped
changing for the stale time of the judge's monotonic clock.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files
from tfm_ext.model_dir import claim
from tfm_ext.model_dir import lease

BEAT, STALE = 0.2, 1.5
AN_HOUR = 3600.0


def _judge(model_dir, **kwargs):
  """A second trainer of this machine, with short beats."""
  return lease.Lease(str(model_dir), heartbeat_seconds=BEAT,
                     stale_seconds=STALE, beat_in_background=False, **kwargs)


def _holder(model_dir):
  return files.read_json(os.path.join(model_dir, lease.FILENAME))


@pytest.fixture
def sleeper():
  child = subprocess.Popen(["sleep", "60"])
  yield child
  child.kill()
  child.wait()


def _write_lease(model_dir, fields):
  os.makedirs(model_dir, exist_ok=True)
  files.write_json(os.path.join(model_dir, lease.FILENAME), {
      "token": "0" * 16, "started": time.time() - AN_HOUR, "beats": 7,
      **fields})


def test_a_live_holder_here_keeps_its_lease_whatever_the_clocks_say(
    tmp_path, sleeper, caplog):
  me = claim.Process.this()
  holder = claim.Process(me.host, sleeper.pid, me.space,
                         claim.pid_start(sleeper.pid))
  # Its stamp an hour old (this host's clock stepped forward), then an
  # hour ahead; a judge whose own clock is stepped 90 s: refused at once.
  for stamp, clock in ((time.time() - AN_HOUR, time.time),
                       (time.time() + AN_HOUR, lambda: time.time() + 90)):
    _write_lease(tmp_path, {**holder.fields(), "heartbeat": stamp})
    began = time.monotonic()
    with pytest.raises(UsageError, match=f"pid {sleeper.pid},"):
      _judge(tmp_path, clock=clock).acquire()
    assert time.monotonic() - began < STALE
  # Stopped, it makes no progress: judged by its counter like another host's.
  sleeper.send_signal(signal.SIGSTOP)
  deadline = time.monotonic() + 10
  while claim.process_status(sleeper.pid) != claim.STOPPED:
    assert time.monotonic() < deadline
    time.sleep(0.01)
  _write_lease(tmp_path, {**holder.fields(),
                          "heartbeat": time.time() - AN_HOUR})
  began = time.monotonic()
  with caplog.at_level("WARNING"):
    _judge(tmp_path).acquire().release()
  assert time.monotonic() - began > STALE
  assert "watching its lease for 2s before taking it over" in caplog.text
  # A reused pid: the pid runs, but not the process that held the lease.
  sleeper.send_signal(signal.SIGCONT)
  _write_lease(tmp_path, {**holder.fields(), "pid_start": holder.start - 1,
                          "heartbeat": time.time()})
  began = time.monotonic()
  with caplog.at_level("WARNING"):
    _judge(tmp_path).acquire().release()
  assert time.monotonic() - began < STALE
  assert "its process is gone" in caplog.text


# Another host's trainer: it rewrites its lease every BEAT seconds, counting
# its beats, its stamp an hour behind (its clock lags this host's).
HOLDER_ELSEWHERE = """
import json, os, sys, time
path, beat = sys.argv[1], float(sys.argv[2])
for beats in range(10**6):
  with open(path + ".tmp", "w") as f:
    json.dump({"host": "vm-far", "pid": os.getpid(), "pid_space": "",
               "token": "f" * 16, "started": 0.0, "beats": beats,
               "heartbeat": time.time() - 3600}, f)
  os.replace(path + ".tmp", path)
  time.sleep(beat)
"""


def test_a_holder_elsewhere_is_gone_once_its_counter_stops_for_the_stale_time(
    tmp_path, caplog):
  path = os.path.join(tmp_path, lease.FILENAME)
  elsewhere = subprocess.Popen([sys.executable, "-c", HOLDER_ELSEWHERE, path,
                                str(BEAT)])
  try:
    deadline = time.monotonic() + 10
    while not os.path.exists(path):
      assert time.monotonic() < deadline
      time.sleep(0.01)
    # Its stamp reads an hour old; it beats while watched: refused.
    began = time.monotonic()
    with pytest.raises(UsageError, match="host vm-far"):
      _judge(tmp_path).acquire()
    assert time.monotonic() - began < STALE
    assert _holder(tmp_path)["host"] == "vm-far"
    # Its host lost (here: stopped; its pid says nothing on another host).
    elsewhere.send_signal(signal.SIGSTOP)
    time.sleep(STALE + 0.5)  # Stale already, had anyone been watching.
    began = time.monotonic()
    with caplog.at_level("WARNING"):
      held = _judge(tmp_path, clock=lambda: time.time() - 90).acquire()
    # A judge that just started watched for the stale time, on its own
    # monotonic clock (its wall clock, stepped back 90 s, said nothing).
    assert STALE < time.monotonic() - began < STALE + 2
    assert "hosts' clocks are not compared" in caplog.text
    assert "it has not changed for 2s as this trainer watched it" in (
        caplog.text)
    assert _holder(tmp_path)["pid"] == os.getpid()
    held.release()
  finally:
    elsewhere.kill()
    elsewhere.wait()
