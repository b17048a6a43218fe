"""One trainer per model_dir: the trainer lease, on a local dir and `ram://`.

The unit tests pass time in (a fake clock that `sleep` advances) and say
which pids run; the others run the driver in-process on `ram://`, and real
launchers side by side.
"""

import os
import re
import signal
import subprocess
import threading
import time
import types
import uuid

import pytest
import tensorflow as tf

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files
from tfm_ext.model_dir import checkpointing
from tfm_ext.model_dir import lease
from tfm_ext.base import settings

T0 = 1_764_560_000.0  # 2025-12-01 03:33:20 UTC


class FakeTime:
  """A clock that only `sleep` moves."""

  def __init__(self, now: float = T0):
    self.now = now
    self.slept = 0.0

  def clock(self) -> float:
    return self.now

  def sleep(self, seconds: float) -> None:
    self.now += seconds
    self.slept += seconds


def _stale():
  return settings.get().lease_stale_seconds


@pytest.fixture(params=["local", "ram"])
def model_dir(request, tmp_path):
  if request.param == "local":
    return str(tmp_path / "m")
  return f"ram://lease_{uuid.uuid4().hex}/m"


def _running(pids):
  """A `status` where the pids `pids` run and no other pid is a process."""
  return lambda pid, start: "running" if pid in pids else "gone"


def _lease(model_dir, fake, *, host="vm-1", pid=100, alive=(), **kwargs):
  """A lease of trainer `pid` on `host`, where the pids `alive` run.

  Its wall clock and monotonic clock are the fake's, unless given.
  """
  kwargs.setdefault("monotonic", fake.clock)
  return lease.Lease(model_dir, clock=fake.clock, sleep=fake.sleep,
                     status=_running(alive), host=host, pid=pid,
                     space="boot-1/pid:[1]", start=1,
                     beat_in_background=False, **kwargs)


def _holder(model_dir):
  return files.read_json(os.path.join(model_dir, lease.FILENAME))


def _claims(model_dir):
  return sorted(tf.io.gfile.listdir(os.path.join(model_dir, lease.CLAIMS)))


def _claim(model_dir, token, *, host="vm-2", pid=200, at=T0):
  """Writes the claim of another trainer, which has not taken the lease."""
  tf.io.gfile.makedirs(os.path.join(model_dir, lease.CLAIMS))
  path = os.path.join(model_dir, lease.CLAIMS, token + ".json")
  files.write_json(path, {"host": host, "pid": pid,
                           "pid_space": "boot-1/pid:[1]", "token": token,
                           "started": at, "heartbeat": at})
  return path


def test_acquire_writes_the_lease_and_release_deletes_it(model_dir):
  fake = FakeTime()
  held = _lease(model_dir, fake).acquire()
  record = _holder(model_dir)
  assert (record["host"], record["pid"], record["started"]) == (
      "vm-1", 100, T0)
  assert fake.slept == 0  # No settle delay.
  assert _claims(model_dir) == [record["token"] + ".json"]
  fake.sleep(10)
  held.beat()
  assert _holder(model_dir)["heartbeat"] == T0 + 10
  held.after_loop()  # Not lost: no error.
  held.release()
  assert not tf.io.gfile.exists(os.path.join(model_dir, lease.FILENAME))
  assert _claims(model_dir) == []


@pytest.mark.parametrize("host", ["vm-1", "vm-2"])
def test_second_trainer_is_refused_naming_the_first(model_dir, host):
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()
  fake.sleep(19.5)  # A heartbeat 20s old: within three beats.
  second = _lease(model_dir, fake, host=host, pid=200, alive={100})
  with pytest.raises(UsageError) as error:
    second.acquire()
  message = str(error.value)
  assert (f"{model_dir} is in use by another trainer (host vm-1, pid 100, "
          "started 2025-12-01 03:33:20 UTC, last heartbeat 20s ago)"
          in message), message
  assert f"delete {model_dir}/{lease.FILENAME}" in message
  assert _holder(model_dir)["pid"] == 100  # Untouched.


def test_lease_of_a_dead_process_on_this_machine_is_taken_at_once(model_dir):
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()  # Then SIGKILLed.
  fake.sleep(1)
  relaunch = _lease(model_dir, fake, pid=200, alive=())
  relaunch.acquire()
  assert _holder(model_dir)["pid"] == 200
  assert fake.slept == 1  # No waiting.


def test_same_pid_elsewhere_is_not_this_machine(model_dir):
  """A host name shared by containers is not enough: the pid space differs."""
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()
  other_container = lease.Lease(
      model_dir, clock=fake.clock, sleep=fake.sleep, status=_running(()),
      host="vm-1", pid=200, space="boot-1/pid:[2]", beat_in_background=False)
  with pytest.raises(UsageError, match="pid 100"):
    other_container.acquire()


def test_stale_lease_elsewhere_is_watched_for_the_stale_time_then_taken(
    model_dir, caplog):
  """However old its stamp reads, a trainer that just started watches."""
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()
  fake.sleep(3600)  # An hour old by this host's clock.
  with caplog.at_level("WARNING"):
    _lease(model_dir, fake, host="vm-2", pid=200).acquire()
  assert _holder(model_dir)["host"] == "vm-2"
  # Watched a beat at a time until unchanged for over 60s.
  assert fake.slept - 3600 == pytest.approx(_stale() + 10)
  assert "watching its lease for 60s before taking it over" in caplog.text
  assert "it has not changed for 70s as this trainer watched it" in (
      caplog.text)


def test_missed_beats_elsewhere_wait_until_stale_then_take_over(model_dir):
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()  # Its host then lost.
  fake.sleep(35)  # Three beats missed.
  _lease(model_dir, fake, host="vm-2", pid=200).acquire()
  assert _holder(model_dir)["host"] == "vm-2"
  # Watched a beat at a time until unchanged for over 60s.
  assert fake.now - T0 == pytest.approx(35 + 70)


def test_a_stepped_clock_takes_no_lease_from_a_live_holder_here(model_dir):
  """The hostile tester's case: this host's clock stepped 90 s forward."""
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()
  fake.now += 90  # A step of the wall clock: no time passed.
  stepped = _lease(model_dir, fake, pid=200, alive={100},
                   monotonic=lambda: 0.0)
  with pytest.raises(UsageError, match="host vm-1, pid 100,"):
    stepped.acquire()
  assert fake.slept == 0  # Refused at once: its process runs.
  assert _holder(model_dir)["pid"] == 100


def test_missed_beats_then_a_beat_refuses(model_dir):
  fake = FakeTime()
  first = _lease(model_dir, fake, pid=100).acquire()
  fake.sleep(35)  # Suspended a while; it beats during the watch.

  def sleep_while_first_beats(seconds):
    fake.sleep(seconds)
    first.beat()

  second = lease.Lease(model_dir, clock=fake.clock, monotonic=fake.clock,
                       sleep=sleep_while_first_beats, status=_running({100}),
                       host="vm-2", pid=200, beat_in_background=False)
  with pytest.raises(UsageError, match="host vm-1, pid 100, .* last "
                     "heartbeat 0s ago"):
    second.acquire()


def test_two_starters_at_once_one_wins_the_other_is_refused(model_dir):
  """Both look at model_dir and write their claims before either lists."""
  looked, claimed = threading.Barrier(2), threading.Barrier(2)
  calls = threading.local()

  def clock():
    # A starter reads the clock after its look (`started`), then for its
    # claim's heartbeat, just before writing it.
    calls.n = getattr(calls, "n", 0) + 1
    if calls.n == 1:
      looked.wait(timeout=10)
    return time.time()

  outcomes = {}

  def start(pid):
    held = lease.Lease(model_dir, clock=clock, status=_running({1, 2}),
                       host="vm-1", pid=pid, poll_seconds=0.01,
                       beat_in_background=False)
    original = held._other_claims  # pylint: disable=protected-access

    def list_after_both_claimed():
      if not getattr(calls, "listed", False):
        calls.listed = True
        claimed.wait(timeout=10)
      return original()
    held._other_claims = list_after_both_claimed  # pylint: disable=protected-access
    try:
      held.acquire()
      outcomes[pid] = "won"
    except UsageError as e:
      outcomes[pid] = str(e)

  threads = [threading.Thread(target=start, args=(pid,)) for pid in (1, 2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  winner = _holder(model_dir)["pid"]
  loser = 3 - winner
  assert outcomes[winner] == "won", outcomes
  assert f"pid {winner}," in outcomes[loser], outcomes
  # The loser withdrew its claim: the winner's is the one left.
  assert _claims(model_dir) == [_holder(model_dir)["token"] + ".json"]


@pytest.mark.parametrize("round_", range(10))
def test_racing_starters_never_both_take_the_lease(model_dir, round_):
  """Four threads at once, no hook: one wins, three are refused naming it."""
  del round_
  barrier = threading.Barrier(4)
  outcomes = {}

  def start(pid):
    held = lease.Lease(model_dir, status=_running({1, 2, 3, 4}),
                       host="vm-1", pid=pid, poll_seconds=0.01,
                       beat_in_background=False)
    barrier.wait(timeout=10)
    try:
      held.acquire()
      outcomes[pid] = "won"
    except UsageError as e:
      outcomes[pid] = str(e)

  threads = [threading.Thread(target=start, args=(pid,))
             for pid in range(1, 5)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=30)
  winners = [pid for pid, outcome in outcomes.items() if outcome == "won"]
  assert len(outcomes) == 4 and len(winners) == 1, outcomes
  assert _holder(model_dir)["pid"] == winners[0]
  for pid, outcome in outcomes.items():
    if pid != winners[0]:
      assert f"host vm-1, pid {winners[0]}," in outcome, outcomes


def test_a_live_claim_with_a_smaller_token_wins_the_other_withdraws(
    model_dir):
  fake = FakeTime()
  _claim(model_dir, "0" * 16, host="vm-2", pid=200)
  second = _lease(model_dir, fake, pid=100)
  with pytest.raises(UsageError, match=r"in use by another trainer \(host "
                     r"vm-2, pid 200, started 2025-12-01 03:33:20 UTC"):
    second.acquire()
  assert _claims(model_dir) == ["0" * 16 + ".json"]  # Its own withdrawn.
  assert not tf.io.gfile.exists(os.path.join(model_dir, lease.FILENAME))


def test_the_smallest_live_claim_waits_until_the_others_withdraw(model_dir):
  fake = FakeTime()
  other = _claim(model_dir, "f" * 16, host="vm-2", pid=200)

  def sleep(seconds):
    fake.sleep(seconds)
    if fake.slept >= 1:  # The other saw this claim and withdraws.
      tf.io.gfile.remove(other)

  held = lease.Lease(model_dir, clock=fake.clock, monotonic=fake.clock,
                     sleep=sleep, status=_running({100, 200}), host="vm-1",
                     pid=100, beat_in_background=False)
  held.acquire()
  assert _holder(model_dir)["pid"] == 100
  assert fake.slept == pytest.approx(1.0)  # Polled until it withdrew.


def test_the_smallest_live_claim_refuses_once_another_took_the_lease(
    model_dir):
  """The other had listed before this claim was written: it won."""
  fake = FakeTime()
  _claim(model_dir, "f" * 16, host="vm-2", pid=200)

  def sleep(seconds):
    fake.sleep(seconds)
    files.write_json(os.path.join(model_dir, lease.FILENAME), {
        "host": "vm-2", "pid": 200, "pid_space": "", "token": "f" * 16,
        "started": T0, "heartbeat": fake.now})

  held = lease.Lease(model_dir, clock=fake.clock, monotonic=fake.clock,
                     sleep=sleep, status=_running({100, 200}), host="vm-1",
                     pid=100, beat_in_background=False)
  with pytest.raises(UsageError, match="host vm-2, pid 200,"):
    held.acquire()
  assert _claims(model_dir) == ["f" * 16 + ".json"]


@pytest.mark.parametrize("why", ["dead pid here", "stale elsewhere"])
def test_a_claim_whose_trainer_is_gone_is_deleted_and_the_lease_taken(
    model_dir, why):
  fake = FakeTime(T0 + _stale() + 1)
  if why == "dead pid here":  # SIGKILLed while it took the lease.
    _claim(model_dir, "0" * 16, host="vm-1", pid=200, at=fake.now)
  else:  # Its host was lost while it took the lease.
    _claim(model_dir, "0" * 16, host="vm-2", pid=200, at=T0)
  held = _lease(model_dir, fake, pid=100, alive={100}).acquire()
  if why == "dead pid here":
    assert fake.slept == 0
  else:  # Watched until unchanged for the stale time.
    assert _stale() < fake.slept <= _stale() + 1
  assert _claims(model_dir) == [_holder(model_dir)["token"] + ".json"]
  held.release()
  assert _claims(model_dir) == []


def test_holder_whose_lease_was_taken_over_stops_and_keeps_the_new_one(
    model_dir):
  fake = FakeTime()
  first = _lease(model_dir, fake, pid=100).acquire()
  fake.sleep(_stale() + 1)  # Suspended past the stale time.
  _lease(model_dir, fake, host="vm-2", pid=200).acquire()
  first.beat()  # Resumed: its heartbeat finds the other trainer's lease.
  with pytest.raises(UsageError, match="Another trainer took over .* host "
                     "vm-2, pid 200.* stops without saving"):
    first.after_loop({"training_loss": 1.0})
  first.release()
  assert _holder(model_dir)["pid"] == 200  # Never its to delete.


def test_a_file_that_is_not_a_lease_is_taken_over(model_dir):
  tf.io.gfile.makedirs(model_dir)
  files.write_text(os.path.join(model_dir, lease.FILENAME), '{"pid": ')
  _lease(model_dir, FakeTime()).acquire()
  assert _holder(model_dir)["pid"] == 100


def test_heartbeat_thread_beats_and_stops_before_the_lease_is_deleted(
    model_dir):
  held = lease.Lease(model_dir, heartbeat_seconds=0.05)
  held.acquire()
  started = _holder(model_dir)["heartbeat"]
  deadline = time.monotonic() + 10
  while _holder(model_dir)["heartbeat"] == started:
    assert time.monotonic() < deadline
    time.sleep(0.02)
  held.release()
  time.sleep(0.2)  # A thread left running would write it again.
  assert not tf.io.gfile.exists(held.path)


def test_a_lease_this_process_left_is_taken_at_once(model_dir):
  """An earlier run in this process (an in-process restart) left it."""
  fake = FakeTime()
  _lease(model_dir, fake, pid=100).acquire()  # Never released.
  fake.sleep(1)
  _lease(model_dir, fake, pid=100, alive={100}).acquire()
  assert fake.slept == 1  # No waiting.


def test_a_lease_deleted_under_its_holder_is_lost_and_not_written_again(
    model_dir):
  """It cannot tell a user's delete from a takeover whose trainer finished."""
  fake = FakeTime()
  held = _lease(model_dir, fake).acquire()
  tf.io.gfile.remove(os.path.join(model_dir, lease.FILENAME))
  fake.sleep(10)
  held.beat()
  with pytest.raises(lease.LeaseLost, match="was deleted under this trainer"):
    held.after_loop()
  assert not tf.io.gfile.exists(os.path.join(model_dir, lease.FILENAME))


def test_a_holder_that_lost_the_lease_writes_no_record_under_model_dir(
    model_dir):
  """The fence: any record under model_dir first proves the lease."""
  fake = FakeTime()
  first = _lease(model_dir, fake, pid=100).acquire()
  record = os.path.join(model_dir, "run_summary.json")
  files.write_json(record, {"by": "first"})  # Held: written.
  fake.sleep(_stale() + 1)  # Suspended past the stale time.
  # Another trainer, in another process, takes the lease over.
  files.write_json(first.path, {
      "host": "vm-2", "pid": 200, "pid_space": "", "token": "other",
      "started": fake.clock(), "heartbeat": fake.clock()})
  # No heartbeat ran since it woke: the write itself finds the lease lost.
  with pytest.raises(lease.LeaseLost, match="Another trainer took over"):
    files.write_json(record, {"by": "first, after losing the lease"})
  with pytest.raises(lease.LeaseLost):
    files.write_record(os.path.join(model_dir, "training_starts"), "x", {})
  assert files.read_json(record) == {"by": "first"}
  assert not tf.io.gfile.exists(os.path.join(model_dir, "training_starts",
                                             "x.json"))
  first.release()
  files.write_json(record, {"by": "anyone, once released"})  # Unfenced.


def test_a_save_whose_lease_is_lost_while_it_writes_puts_nothing_in_place(
    tmp_path):
  """The fence before a checkpoint's files take their names."""
  step = tf.Variable(0, dtype=tf.int64)
  trainer = types.SimpleNamespace(
      checkpoint=tf.train.Checkpoint(step=step, w=tf.Variable([1.0])),
      global_step=step)
  checks = []

  def before_save():  # The lease: lost once step 2's save has begun.
    checks.append(int(step.numpy()))
    if checks.count(2) > 1:
      raise lease.LeaseLost("another trainer took over")

  manager = checkpointing.build_manager(
      trainer, str(tmp_path), types.SimpleNamespace(checkpoint_interval=1),
      evaluates_only=False, init_fn=None, max_to_keep=1,
      before_save=before_save)
  step.assign(1)
  manager.save()
  state = (tmp_path / "checkpoint").read_text()
  step.assign(2)
  with pytest.raises(lease.LeaseLost):
    manager.save()
  # ckpt-1 kept (no sweep), the state file untouched, no ckpt-2 in place.
  assert (tmp_path / "checkpoint").read_text() == state
  assert sorted(p.name for p in tmp_path.glob("ckpt-*")
                if "_fenced" not in p.name) == [
                    "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
  # What it wrote aside it deleted; what a killed save leaves aside, the
  # next holder's manager deletes.
  assert not list(tmp_path.glob("*_fenced*"))
  (tmp_path / "ckpt-3_fenced0000.index").write_bytes(b"cut short")
  checkpointing.build_manager(
      trainer, str(tmp_path), types.SimpleNamespace(checkpoint_interval=1),
      evaluates_only=False, init_fn=None, max_to_keep=1,
      before_save=lambda: None)
  assert not list(tmp_path.glob("*_fenced*"))


def test_a_lease_naming_pid_0_is_no_lease(model_dir):
  # os.kill(0, sig) signals this process's group: pid 0 would look alive.
  tf.io.gfile.makedirs(model_dir)
  files.write_json(os.path.join(model_dir, lease.FILENAME), {
      "host": "vm-1", "pid": 0, "pid_space": "boot-1/pid:[1]",
      "token": "0", "started": T0, "heartbeat": T0})
  fake = FakeTime()
  lease.Lease(model_dir, clock=fake.clock, sleep=fake.sleep, host="vm-1",
              pid=100, space="boot-1/pid:[1]",
              beat_in_background=False).acquire()  # The real pid_alive.
  assert _holder(model_dir)["pid"] == 100


def test_pid_alive_sees_running_reaped_and_zombie_processes():
  assert lease.pid_alive(os.getpid())
  child = subprocess.Popen(["sleep", "30"])
  try:
    assert lease.pid_alive(child.pid)
    child.kill()
    deadline = time.monotonic() + 10
    while lease.pid_alive(child.pid):  # Killed, not yet reaped: a zombie.
      assert time.monotonic() < deadline
      time.sleep(0.02)
  finally:
    child.kill()
    child.wait()
  assert not lease.pid_alive(child.pid)


def _files_under(model_dir):
  return sorted(os.path.join(d, f) for d, _, files in tf.io.gfile.walk(
      model_dir) for f in files)


def test_training_chief_holds_the_lease_on_a_bucket_evaluators_take_none(
    run_in_process):
  from tfm_ext.run import driver, preemption  # pylint: disable=g-import-not-at-top
  from tfm_ext.config import params as params_lib  # pylint: disable=g-import-not-at-top
  del run_in_process  # Registers the experiments.
  model_dir = f"ram://lease_{uuid.uuid4().hex}/m"
  path = os.path.join(model_dir, lease.FILENAME)

  def plan(mode):
    params = params_lib.build(params_lib.ConfigSources(
        experiment="digits_convnet", params_override=(
            "trainer.train_steps=4,trainer.steps_per_loop=2,"
            "trainer.summary_interval=2,trainer.checkpoint_interval=2,"
            "trainer.validation_interval=4,trainer.validation_steps=2")))
    return driver.prepare(driver.RunRequest(
        experiment="digits_convnet", mode=mode, model_dir=model_dir,
        params=params))

  watcher = preemption.SignalWatcher(signals=())
  trains = plan("train_and_eval")
  with driver.assembled(trains, watcher) as parts:
    assert files.read_json(path)["pid"] == os.getpid()  # Before any record.
    assert driver.drive(trains, parts, watcher).status == "completed"
  assert not tf.io.gfile.exists(path)

  # Another trainer, alive on another host, holds it now.
  files.write_json(path, {"host": "tpu-vm-7", "pid": 4242, "token": "t",
                           "started": time.time(), "heartbeat": time.time()})
  before = _files_under(model_dir)
  with pytest.raises(UsageError, match="in use by another trainer .*host "
                     "tpu-vm-7, pid 4242"):
    driver.execute(plan("train"))
  assert _files_under(model_dir) == before  # Refused before any write.
  assert driver.execute(plan("eval")).status == "completed"
  assert files.read_json(path)["token"] == "t"


RUN = ("--experiment=digits_convnet", "--mode=train",
       "--params_override=trainer.steps_per_loop=10,"
       "trainer.summary_interval=10,trainer.checkpoint_interval=10,"
       "trainer.train_steps=")


def test_two_trainers_started_at_once_one_trains_the_other_exits_2(
    start_forked, tmp_path):
  model_dir = tmp_path / "m"
  jobs = [start_forked(*RUN[:2], RUN[2] + "1000000", model_dir=model_dir)
          for _ in range(2)]
  deadline = time.monotonic() + 120
  while all(job.proc.poll() is None for job in jobs):
    assert time.monotonic() < deadline, "both still running: both train"
    time.sleep(0.2)
  loser, winner = jobs if jobs[0].proc.poll() is not None else jobs[::-1]
  refused = loser.finish()
  assert refused.returncode == 2, refused
  error = [l for l in refused.stderr.splitlines() if l.startswith("error:")]
  assert error and re.search(
      rf"in use by another trainer \(host \S+, pid {winner.proc.pid}, "
      r"started .* UTC, last heartbeat \d+s ago\)", error[0]), refused
  # The other trains on, alone: one training start, its lease, its steps.
  winner.wait_for_line(lambda l: l.startswith("step "))
  assert len(os.listdir(model_dir / "training_starts")) == 1
  assert _holder(str(model_dir))["pid"] == winner.proc.pid
  winner.proc.send_signal(signal.SIGTERM)
  stopped = winner.finish()
  assert stopped.returncode == 42, stopped
  assert not (model_dir / lease.FILENAME).exists()  # Released on the way out.


def test_sigkilled_trainer_relaunches_at_once_and_resumes(
    start_forked, launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  first = start_forked(*RUN[:2], RUN[2] + "1000000", model_dir=model_dir)
  first.wait_for_line(lambda l: l.startswith("step ") and
                      tf.train.latest_checkpoint(str(model_dir)))
  first.proc.send_signal(signal.SIGKILL)
  first.proc.wait()
  assert _holder(str(model_dir))["pid"] == first.proc.pid  # Left behind.
  killed_at = int(tf.train.latest_checkpoint(str(model_dir)).split("-")[-1])

  relaunch = launch_forked(*RUN[:2], RUN[2] + str(killed_at + 10),
                           model_dir=model_dir, timeout=120)
  assert relaunch.returncode == 0, relaunch
  assert "its process is gone" in relaunch.stderr, relaunch
  summary = relaunch.summary()
  assert (summary["resumed_from_step"], summary["global_step"]) == (
      killed_at, killed_at + 10)
  assert not (model_dir / lease.FILENAME).exists()


def test_a_wait_for_the_lease_says_so_and_ends_when_interrupted(
    model_dir, capsys):
  # A signal while waiting (the run's check_start raises) ends the wait at
  # the next look, its claim withdrawn; it waited 199 s before.
  fake = FakeTime()
  _claim(model_dir, "f" * 16, host="vm-2", pid=200)  # Never withdraws.

  class Signalled(Exception):
    pass

  def interrupt():
    if fake.slept >= 25:
      raise Signalled()

  waiting = lease.Lease(model_dir, clock=fake.clock, monotonic=fake.clock,
                        sleep=fake.sleep, status=_running({100, 200}),
                        host="vm-1", pid=100, beat_in_background=False,
                        interrupt=interrupt)
  with pytest.raises(Signalled):
    waiting.acquire()
  assert fake.slept == pytest.approx(25, abs=lease.POLL_SECONDS)
  assert _claims(model_dir) == ["f" * 16 + ".json"]  # Its own withdrawn.
  said = [l for l in capsys.readouterr().err.splitlines()
          if l.startswith("waiting for the trainer lease")]
  assert [re.search(r"\((\d+)s\)", l).group(1) for l in said] == ["10", "20"]
