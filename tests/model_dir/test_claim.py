"""A record one process owns: written whole, renewed, read fresh, judged.

Real files on a local dir and `ram://`, real heartbeat threads, real pids.
"""

import logging as std_logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid

import pytest
import tensorflow as tf

from tfm_ext.model_dir import files
from tfm_ext.model_dir import claim


@pytest.fixture(params=["local", "ram"])
def directory(request, tmp_path):
  if request.param == "local":
    return str(tmp_path)
  path = f"ram://claim_{uuid.uuid4().hex}"
  tf.io.gfile.makedirs(path)
  return path


def wait_for(condition, seconds=10.0):
  deadline = time.monotonic() + seconds
  while not condition():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.01)


def test_a_record_is_written_whole_and_read_back(directory):
  path = os.path.join(directory, "r.json")
  me = claim.Process.this()
  record = claim.Record(path, lambda beats: {**me.fields(), "beats": beats})
  assert claim.read(path, {"pid": int}) is None  # None yet.
  record.write()
  assert claim.read(path, {"pid": int, "beats": int}) == {
      "owner": me.id, "host": me.host, "pid": os.getpid(),
      "pid_space": me.space,
      "pid_start": claim.pid_start(os.getpid()), "beats": 0}
  record.remove()
  record.remove()  # Already gone: fine.
  assert not tf.io.gfile.exists(path)


def test_a_padded_record_keeps_its_length_as_it_grows(directory):
  path = os.path.join(directory, "r.json")
  record = claim.Record(path, lambda beats: {"beats": 10 ** beats},
                        pad_to=64)
  for beats in range(4):
    record.write(beats)
    with tf.io.gfile.GFile(path, "rb") as f:
      assert len(f.read()) == 64
    assert claim.read(path, {"beats": int}) == {"beats": 10 ** beats}


def test_the_heartbeat_renews_until_stopped_then_writes_no_more(directory):
  path = os.path.join(directory, "r.json")
  record = claim.Record(path, lambda beats: {"beats": beats})
  record.write()
  record.start_heartbeat(0.02, name="test", failed="unused")
  wait_for(lambda: claim.read(path, {"beats": int})["beats"] >= 3)
  record.stop_heartbeat()
  beats = claim.read(path, {"beats": int})["beats"]
  time.sleep(0.2)  # Ten periods: a thread left running would write.
  assert claim.read(path, {"beats": int})["beats"] == beats


def test_the_heartbeat_stops_once_the_record_is_no_longer_ours(directory):
  path = os.path.join(directory, "r.json")
  record = claim.Record(path, lambda beats: {"beats": beats})
  record.write()
  asked = []  # Whether it had been taken over, at each beat.
  taken = threading.Event()

  def ours():
    asked.append(taken.is_set())
    return not taken.is_set()

  record.start_heartbeat(0.02, name="test", failed="unused", ours=ours)
  wait_for(lambda: claim.read(path, {"beats": int})["beats"] >= 2)
  taken.set()
  wait_for(lambda: asked[-1])
  beats, asks = claim.read(path, {"beats": int})["beats"], len(asked)
  time.sleep(0.2)  # Ten periods: no more beats, no more writes.
  assert (claim.read(path, {"beats": int})["beats"], len(asked)) == (
      beats, asks)
  assert not record.renew(ours=ours)  # Nor does a beat by hand write.
  record.stop_heartbeat()


def test_a_failed_beat_is_logged_and_the_next_one_writes_again(
    tmp_path, caplog):
  folder = tmp_path / "gone_for_a_while"
  folder.mkdir()
  path = str(folder / "r.json")
  record = claim.Record(path, lambda beats: {"beats": beats})
  record.write()
  with caplog.at_level(std_logging.WARNING):
    shutil.rmtree(folder)  # Every write fails while it is gone.
    record.start_heartbeat(0.02, name="test", failed="Could not renew r")
    wait_for(lambda: "Could not renew r: " in caplog.text)
    folder.mkdir()
    wait_for(lambda: os.path.exists(path))
  record.stop_heartbeat()
  assert claim.read(path, {"beats": int})["beats"] > 1


def test_read_says_what_is_damaged(tmp_path):
  path = str(tmp_path / "r.json")
  for text, problem in (('{"pid": ', "not JSON"), ('{"pid": "7"}',
                                                   "wrong type: pid='7'"),
                        ('{"pid": 0}', "pid=0")):
    files.write_text(path, text)
    with pytest.raises(files.Damaged, match=problem):
      claim.read(path, {"pid": int})
  # A pid only counts where it is required: a claim may hold any.
  assert claim.read(path, ()) == {"pid": 0}


def dead_pid():
  child = subprocess.Popen(["true"])
  child.wait()
  return child.pid


def of(pid):
  """The record fields of process `pid` of this machine."""
  me = claim.Process.this()
  return claim.Process(me.host, pid, me.space, claim.pid_start(pid)).fields()


def test_a_record_of_a_dead_process_here_is_gone_at_once():
  judge = claim.Judge(60)
  assert judge.gone_because(dict(judge.me.fields(), pid=dead_pid())) == (
      "its process is gone")
  child = subprocess.Popen(["sleep", "30"])
  try:
    assert judge.gone_because(of(child.pid)) == ""
  finally:
    child.kill()
    child.wait()
  assert judge.gone_because(of(child.pid)) == "its process is gone"


def test_a_reused_pid_is_not_the_owner():
  """The pid runs, but a process that started later than the owner did."""
  child = subprocess.Popen(["sleep", "30"])
  try:
    record = of(child.pid)
    assert claim.Judge(60).gone_because(record) == ""
    record["pid_start"] -= 1
    assert claim.Judge(60).gone_because(record) == "its process is gone"
    del record["pid_start"]  # An older record: the pid alone decides.
    assert claim.Judge(60).gone_because(record) == ""
  finally:
    child.kill()
    child.wait()


def test_a_running_process_here_holds_its_record_whatever_its_age():
  """Liveness before clocks; a stopped one is judged by its age."""
  judge = claim.Judge(30, stale_reason="not renewed for {age:.0f} s")
  child = subprocess.Popen(["sleep", "30"])
  try:
    assert claim.process_status(child.pid) == claim.RUNNING
    assert judge.gone_because(of(child.pid), age=1e9) == ""
    child.send_signal(signal.SIGSTOP)
    wait_for(lambda: claim.process_status(child.pid) == claim.STOPPED)
    assert judge.gone_because(of(child.pid), age=30) == ""
    assert judge.gone_because(of(child.pid), age=31.2) == (
        "not renewed for 31 s")
    child.send_signal(signal.SIGCONT)
    wait_for(lambda: claim.process_status(child.pid) == claim.RUNNING)
    assert judge.gone_because(of(child.pid), age=31.2) == ""
  finally:
    child.kill()
    child.wait()
  assert judge.gone_because(of(child.pid), age=0) == "its process is gone"


@pytest.mark.parametrize("elsewhere", [{"host": "another-host"},
                                       {"pid_space": "another/boot"},
                                       {"pid_space": None}, {"pid": 0},
                                       {"pid": "12"}])
def test_a_pid_says_nothing_off_this_machine_or_when_it_is_no_pid(
    elsewhere):
  """None: a record without it (an older version's has no pid_space)."""
  judge = claim.Judge(60)
  record = dict(judge.me.fields(), pid=dead_pid())
  record.update(elsewhere)
  record = {k: v for k, v in record.items() if v is not None}
  assert judge.gone_because(record) == ""
  assert judge.gone_because(record, age=61) == "it has not changed for 61s"


def test_a_record_of_this_very_process_is_gone_only_when_the_user_says_so():
  """Or by its age: another evaluator of this process may own it."""
  record = claim.Process.this().fields()
  assert claim.Judge(30).gone_because(record) == ""
  assert claim.Judge(30).gone_because(record, age=31) == (
      "it has not changed for 31s")
  assert claim.Judge(own_pid_reason="left by an earlier run").gone_because(
      record) == "left by an earlier run"


def test_unchanged_ages_a_record_from_when_this_reader_first_saw_it():
  now = [100.0]
  unchanged = claim.Unchanged(lambda: now[0])
  assert unchanged.age("ckpt-10", ("a", 0)) == 0
  now[0] += 20
  assert unchanged.age("ckpt-10", ("a", 0)) == 20
  assert unchanged.age("ckpt-20", ("a", 0)) == 0  # Each record its own.
  assert unchanged.age("ckpt-10", ("a", 1)) == 0  # Renewed: seen anew.
  now[0] += 5
  assert unchanged.age("ckpt-10", ("a", 1)) == 5


def test_a_machine_is_its_host_and_pid_space():
  me = claim.Process.this()
  assert me.machine == claim.Process(me.host, 1, me.space).machine
  assert len(me.machine) == 8
  assert me.machine != claim.Process(me.host, me.pid, "other").machine
  assert me.machine != claim.Process("other", me.pid, me.space).machine


def test_alive_by_a_process_here_that_runs_or_a_fresh_stamp_either_way():
  # Only ever a reason to refuse: a stamp out of `fresh_seconds` is not
  # gone for it (its age decides that), just not known to be alive.
  now = 1000.0
  judge = claim.Judge(60, fresh_seconds=15, clock=lambda: now)
  elsewhere = dict(judge.me.fields(), host="another-host", pid=7)
  for stamp, alive in ((now - 15, True), (now + 15, True),
                       (now - 15.5, False), (now + 15.5, False)):
    assert judge.alive(dict(elsewhere, heartbeat=stamp)) is alive, stamp
  assert not judge.alive(elsewhere)  # No stamp.
  assert not claim.Judge(60).alive(dict(elsewhere, heartbeat=time.time()))
  child = subprocess.Popen(["sleep", "30"])
  try:
    assert judge.alive(dict(of(child.pid), heartbeat=0.0))
  finally:
    child.kill()
    child.wait()
  assert not judge.alive(dict(of(child.pid), heartbeat=0.0))


def test_every_record_holds_one_owner_id_host_pid_and_a_tag_per_process():
  me = claim.Process.this()
  assert me.id == f"{me.host}:{os.getpid()}:{me.tag}" and len(me.tag) == 8
  assert claim.Process.this().id == me.id  # Stable within a process.
  assert me.fields()["owner"] == me.id
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # A forked child is another owner.
    os.write(write, claim.Process.this().id.encode())
    os._exit(0)  # pylint: disable=protected-access
  os.waitpid(pid, 0)
  child = os.read(read, 1000).decode()
  assert child.startswith(f"{me.host}:{pid}:") and child != me.id
