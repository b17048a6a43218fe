"""Damaged checkpoints and state files are survived; evaluators share model_dir.

In-process tests on real checkpoints of a few variables (a local dir and
TensorFlow's `ram://`, which stands in for a bucket), then launcher runs of
digits_convnet on copies of one trained model_dir, each damaged its own way.
"""

import json
import logging as std_logging
import os
import shutil
import threading
import time
import uuid

import pytest
import tensorflow as tf

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import claim
from tfm_ext.model_dir import eval_claims
from tfm_ext.model_dir import eval_ledger
from tfm_ext.base import settings

STEPS = (10, 20, 30)
VALUE = "v/.ATTRIBUTES/VARIABLE_VALUE"


def save_checkpoints(model_dir, steps=STEPS):
  """Saves `ckpt-<step>` for each step, as TFM's manager does; v == step."""
  v, w = tf.Variable(0.0), tf.Variable(tf.zeros([32, 32]))
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v, w=w),
                                       model_dir, max_to_keep=10)
  for step in steps:
    v.assign(float(step))
    w.assign(tf.fill([32, 32], float(step)))
    manager.save(checkpoint_number=step)


def read(path):
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read()


def write(path, data):
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)  # A write over a ram:// file leaves its tail.
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(data)


def data_file(model_dir, step):
  return tf.io.gfile.glob(f"{model_dir}/ckpt-{step}.data-*")[0]


def cut_short(path):
  write(path, read(path)[:100])


def zero(path):
  write(path, bytes(len(read(path))))


def zero_middle(path):
  """Zeroes weights, not the object graph: a restore starts, then fails."""
  data = read(path)
  start, end = len(data) // 10, len(data) * 9 // 10
  write(path, data[:start] + bytes(end - start) + data[end:])


@pytest.fixture(params=["local", "ram"])
def model_dir(request, tmp_path):
  directory = (str(tmp_path / "m") if request.param == "local"
               else f"ram://{uuid.uuid4().hex}/m")
  save_checkpoints(directory)
  return directory


def warnings_of(caplog):
  return [r.getMessage() for r in caplog.records
          if r.levelno >= std_logging.WARNING]


def test_an_intact_model_dir_is_left_as_it_is(model_dir, caplog):
  state = read(f"{model_dir}/checkpoint")
  with caplog.at_level(std_logging.WARNING):
    assert checkpoint_state.repair(model_dir) == f"{model_dir}/ckpt-30"
  assert read(f"{model_dir}/checkpoint") == state
  assert not warnings_of(caplog)


@pytest.mark.parametrize("state", [
    None,  # Deleted.
    b"\x8b\x1f\x00\xff garbage",  # Not text.
    b"model_checkpoint_path: ",  # Does not parse.
    b"",  # Names no checkpoint (tf.train.latest_checkpoint raises).
    b'model_checkpoint_path: "params.yaml"',
])
def test_a_missing_or_damaged_state_file_is_rebuilt_from_the_files(
    model_dir, state, caplog):
  path = f"{model_dir}/checkpoint"
  if state is None:
    tf.io.gfile.remove(path)
  else:
    write(path, state)
  # What the config checks ask before anything is built: never raises.
  assert checkpoint_state.latest(model_dir) == f"{model_dir}/ckpt-30"
  with caplog.at_level(std_logging.WARNING):
    assert checkpoint_state.repair(model_dir) == f"{model_dir}/ckpt-30"
  (warning,) = warnings_of(caplog)
  assert "rebuilt" in warning and "ckpt-30" in warning, warning
  assert "it lists 3 (ckpt-10, ckpt-20, ckpt-30)" in warning, warning
  # Each once, as the manager writes it, for TensorFlow's other readers too.
  assert [os.path.basename(p) for p in tf.train.get_checkpoint_state(
      model_dir).all_model_checkpoint_paths] == [
          "ckpt-10", "ckpt-20", "ckpt-30"]
  # TensorFlow's manager reads it back: the latest, and all three managed,
  # so max_to_keep rotates them as before.
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(), model_dir,
                                       max_to_keep=10)
  assert manager.latest_checkpoint == f"{model_dir}/ckpt-30"
  assert [os.path.basename(p) for p in manager.checkpoints] == [
      "ckpt-10", "ckpt-20", "ckpt-30"]


@pytest.mark.parametrize("damage,why", [
    (lambda d: cut_short(data_file(d, 30)), "cut short"),
    (lambda d: zero(data_file(d, 30)), "cannot be read back"),
    (lambda d: zero(f"{d}/ckpt-30.index"), "index cannot be read"),
    (lambda d: tf.io.gfile.remove(data_file(d, 30)), "data files are missing"),
])
def test_an_unreadable_latest_falls_back_to_the_newest_readable(
    model_dir, damage, why, caplog):
  damage(model_dir)
  left = {p: read(p) for p in tf.io.gfile.glob(f"{model_dir}/ckpt-30.*")}
  with caplog.at_level(std_logging.WARNING):
    assert checkpoint_state.repair(model_dir) == f"{model_dir}/ckpt-20"
  (warning,) = warnings_of(caplog)
  assert "skipped ckpt-30 (" in warning and why in warning, warning
  assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-20"
  assert tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths[
      -1] == f"{model_dir}/ckpt-20"
  # Nothing the user had is deleted or changed.
  assert {p: read(p) for p in tf.io.gfile.glob(
      f"{model_dir}/ckpt-30.*")} == left
  # (tf.train.load_checkpoint takes a ram:// prefix for a directory.)
  assert tf.compat.v1.train.NewCheckpointReader(
      checkpoint_state.repair(model_dir)).get_tensor(VALUE) == 20.0


def roll_back(model_dir, latest, listed=None):
  """Writes the state file by hand, naming `latest` (`listed` before it)."""
  text = "".join(f'all_model_checkpoint_paths: "{name}"\n'
                 for name in (listed or []) + [latest])
  write(f"{model_dir}/checkpoint",
        f'model_checkpoint_path: "{latest}"\n{text}'.encode())


@pytest.mark.parametrize("latest, listed", [
    ("ckpt-10", None),  # Rolled back by hand to an older step.
    ("ckpt-20", ["ckpt-10", "ckpt-30"]),  # Only the latest edited.
    ("ckpt-15", ["ckpt-10"]),  # A step that does not exist.
])
def test_a_training_start_never_resumes_behind_a_newer_readable_checkpoint(
    model_dir, latest, listed, caplog):
  roll_back(model_dir, latest, listed)
  left = {p: read(p) for p in tf.io.gfile.glob(f"{model_dir}/ckpt-*")}
  with caplog.at_level(std_logging.WARNING):
    assert checkpoint_state.repair(model_dir, trains=True) == (
        f"{model_dir}/ckpt-30")
  (warning,) = warnings_of(caplog)
  assert (f"names {latest}, older than ckpt-30, which reads whole" in warning
          and "run restores ckpt-30" in warning), warning
  assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-30"
  assert {p: read(p) for p in tf.io.gfile.glob(
      f"{model_dir}/ckpt-*")} == left


def test_an_evaluator_follows_the_state_file_and_a_damaged_newer_one_is_skipped(
    model_dir, caplog):
  roll_back(model_dir, "ckpt-20", ["ckpt-10"])
  # An evaluator reads what the state file names, as TensorFlow's readers.
  assert checkpoint_state.repair(model_dir) == f"{model_dir}/ckpt-20"
  cut_short(data_file(model_dir, 30))
  with caplog.at_level(std_logging.WARNING):
    assert checkpoint_state.repair(model_dir, trains=True) == (
        f"{model_dir}/ckpt-20")
  (warning,) = warnings_of(caplog)
  assert "skipped ckpt-30 (its data is cut short" in warning, warning


def test_no_readable_checkpoint_is_refused_naming_each_and_changing_nothing(
    model_dir):
  for step in STEPS:
    cut_short(data_file(model_dir, step))
  state = read(f"{model_dir}/checkpoint")
  with pytest.raises(UsageError, match=r"none can be read: ckpt-30 \(its "
                     r"data is cut short.*; ckpt-20 .*; ckpt-10 .*Nothing "
                     r"was changed"):
    checkpoint_state.repair(model_dir)
  assert read(f"{model_dir}/checkpoint") == state


def test_a_damaged_state_file_without_checkpoints_is_refused(tmp_path):
  (tmp_path / "checkpoint").write_bytes(b"\x00\x01")
  with pytest.raises(UsageError, match="is damaged .* Remove it to train "
                     "from scratch"):
    checkpoint_state.repair(str(tmp_path))
  assert checkpoint_state.repair(str(tmp_path / "new")) is None  # Fresh.


def test_racing_evaluators_win_each_claim_once():
  model_dir = f"ram://{uuid.uuid4().hex}"
  names = [f"{model_dir}/ckpt-{step}" for step in range(10, 60, 10)]
  won = {name: [] for name in names}
  start = threading.Barrier(2)

  def evaluator(owner):
    claims = eval_claims.Claims(model_dir, owner=owner)
    for name in names:
      start.wait()  # Both read the claim before either writes one.
      if claims.acquire(name):
        won[name].append(owner)

  threads = [threading.Thread(target=evaluator, args=(o,)) for o in "ab"]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert all(len(owners) == 1 for owners in won.values()), won


class Clock:
  now = 0.0

  def __call__(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def test_a_claim_no_longer_renewed_is_taken_over_a_renewed_one_is_not(
    caplog):
  model_dir = f"ram://{uuid.uuid4().hex}"
  path = f"{model_dir}/ckpt-10"
  clock = Clock()
  first = eval_claims.Claims(model_dir, owner="a", clock=clock,
                                 sleep=clock.sleep)
  second = eval_claims.Claims(model_dir, owner="b", clock=clock,
                                  sleep=clock.sleep)
  assert first.acquire(path)
  assert not second.acquire(path)
  clock.now += settings.get().claim_stale_seconds - 1
  first._write("ckpt-10", renewals=1)  # pylint: disable=protected-access
  assert not second.acquire(path)  # Renewed: seen anew.
  clock.now += settings.get().claim_stale_seconds + 1
  with caplog.at_level(std_logging.WARNING):
    assert second.acquire(path)
  assert ("Taking over the claim on ckpt-10 of evaluator a: not renewed for "
          "31 s" in caplog.text), caplog.text
  assert not first.acquire(path)


def test_a_claim_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path):
  dead = eval_claims.Claims(str(tmp_path), owner="gone")
  dead._write("ckpt-10", renewals=0)  # pylint: disable=protected-access
  claim = tmp_path / eval_claims.CLAIMS / "ckpt-10.json"
  claim.write_text(claim.read_text().replace(f'"pid": {os.getpid()}',
                                             '"pid": 999999999'))
  clock = Clock()
  claims = eval_claims.Claims(str(tmp_path), clock=clock,
                                  sleep=clock.sleep)
  assert claims.acquire(f"{tmp_path}/ckpt-10")


def test_a_rebuilt_state_file_leaves_out_an_older_checkpoint_cut_short(
    model_dir, caplog):
  # Cut to half its bytes: still more bytes than its tensors have elements.
  path = data_file(model_dir, 20)
  data = read(path)
  write(path, data[:len(data) // 2])
  tf.io.gfile.remove(f"{model_dir}/checkpoint")
  with caplog.at_level(std_logging.WARNING):
    assert checkpoint_state.repair(model_dir) == f"{model_dir}/ckpt-30"
  (warning,) = warnings_of(caplog)
  assert "skipped ckpt-20 (its data is cut short" in warning, warning
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(), model_dir,
                                       max_to_keep=10)
  assert [os.path.basename(p) for p in manager.checkpoints] == [
      "ckpt-10", "ckpt-30"]


def taken_over(model_dir):
  """Evaluator "a" claims `ckpt-10`, stalls, and "b" takes the claim over.

  Returns `(a's Claims, the checkpoint's path)`.
  """
  clock = Clock()
  path = f"{model_dir}/ckpt-10"
  stalled, other = (eval_claims.Claims(str(model_dir), owner=owner,
                                       clock=clock, sleep=clock.sleep)
                    for owner in "ab")
  assert stalled.acquire(path)
  assert not other.acquire(path)
  clock.now += settings.get().claim_stale_seconds + 1
  assert other.acquire(path)
  return stalled, path


def claim_owner(model_dir, name="ckpt-10"):
  with open(os.path.join(model_dir, eval_claims.CLAIMS, name + ".json")) as f:
    return json.load(f)["owner"]


def test_release_leaves_the_claim_of_the_evaluator_that_took_it_over(
    tmp_path):
  stalled, path = taken_over(tmp_path)
  stalled.release(path)  # Back, and done: only its own claim is its own.
  assert claim_owner(tmp_path) == "b"


def test_a_stalled_evaluators_renewals_leave_the_claim_that_replaced_it(
    tmp_path, monkeypatch):
  monkeypatch.setattr(settings, "_current",
                      settings.get().replace(claim_renew_seconds=0.02))
  stalled, path = taken_over(tmp_path)
  with stalled.renewed(path):  # It wakes up and evaluates on.
    time.sleep(0.3)  # Many renewal periods.
  assert claim_owner(tmp_path) == "b"


def test_a_process_forked_after_the_import_is_another_evaluator():
  parent = eval_claims.process_owner()
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # The child: its id, then out at once.
    os.write(write, eval_claims.process_owner().encode())
    os._exit(0)  # pylint: disable=protected-access
  os.waitpid(pid, 0)
  child = os.read(read, 1000).decode()
  assert child != parent and f":{pid}:" in child
  assert eval_claims.process_owner() == parent  # Stable within a process.


def write_bid(model_dir, owner, token, name="ckpt-10"):
  """A bid of evaluator `owner` (this process) standing on `name`."""
  bids = os.path.join(model_dir, eval_claims.BIDS)
  os.makedirs(bids, exist_ok=True)
  path = os.path.join(bids, f"{name}.{token}.json")
  with open(path, "w") as f:
    json.dump({"checkpoint": name, "owner": owner, "token": token,
               **claim.Process.this().fields(), "renewals": 0}, f)
  return path


def test_a_smaller_bid_standing_at_once_wins_and_the_other_withdraws(
    tmp_path):
  # Another evaluator bid for ckpt-10 at the same time, with the smaller
  # token: this one withdraws, writing no claim; once that bid is gone
  # (decided), this one bids again and wins.
  path = f"{tmp_path}/ckpt-10"
  other = write_bid(str(tmp_path), "b", "0" * 16)
  first = eval_claims.Claims(str(tmp_path), owner="a",
                             sleep=lambda _: pytest.fail("waited"))
  assert not first.acquire(path)
  assert not os.path.exists(os.path.join(tmp_path, eval_claims.CLAIMS))
  assert os.listdir(os.path.join(tmp_path, eval_claims.BIDS)) == [
      os.path.basename(other)]  # Its own bid withdrawn.
  os.remove(other)
  assert first.acquire(path)
  assert claim_owner(tmp_path) == "a"


def test_a_larger_bid_that_won_first_keeps_the_claim(tmp_path):
  # Another evaluator listed the bids before this one's was written: it
  # won and writes its claim while its bid stands. This one, with the
  # smaller token, waits for that bid to go, then finds the claim taken.
  path = f"{tmp_path}/ckpt-10"
  other = eval_claims.Claims(str(tmp_path), owner="b")
  bid = write_bid(str(tmp_path), "b", "f" * 16)
  waits = []

  def wait(seconds):
    waits.append(seconds)
    other._tokens["ckpt-10"] = "f" * 16  # pylint: disable=protected-access
    other._write("ckpt-10", renewals=0)  # pylint: disable=protected-access
    os.remove(bid)  # Decided: its claim written first.

  first = eval_claims.Claims(str(tmp_path), owner="a", sleep=wait)
  assert not first.acquire(path)
  assert waits == [eval_claims.BID_POLL_SECONDS]
  assert claim_owner(tmp_path) == "b" and other.holds(path)


# -- Launcher runs ---------------------------------------------------------

EXPERIMENT = "--experiment=digits_convnet"


def override(train_steps):
  return ("--params_override="
          f"trainer.train_steps={train_steps},trainer.steps_per_loop=10,"
          "trainer.summary_interval=10,trainer.checkpoint_interval=10,"
          "trainer.max_to_keep=10,trainer.validation_interval=1000,"
          "trainer.continuous_eval_timeout=60")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, launch_forked):
  """A model_dir with ckpt-10, ckpt-20 and ckpt-30; each test copies it."""
  model_dir = tmp_path_factory.mktemp("trained") / "m"
  run = launch_forked(EXPERIMENT, "--mode=train", override(30),
                      model_dir=model_dir)
  assert run.returncode == 0, run
  return model_dir


@pytest.fixture
def model_copy(trained, tmp_path):
  model_dir = tmp_path / "m"
  shutil.copytree(trained, model_dir)
  return model_dir


def files_of(model_dir, steps):
  return {name: (model_dir / name).read_bytes()
          for name in os.listdir(model_dir)
          if name.split(".")[0] in {f"ckpt-{s}" for s in steps}}


def test_missing_state_file_resumes_training_and_keeps_the_checkpoints(
    launch_forked, model_copy):
  before = files_of(model_copy, STEPS)
  (model_copy / "checkpoint").unlink()
  run = launch_forked(EXPERIMENT, "--mode=train", override(40),
                      model_dir=model_copy)
  assert run.returncode == 0, run
  assert run.summary()["resumed_from_step"] == 30  # Not from scratch.
  assert "rebuilt" in run.stderr and "restores ckpt-30" in run.stderr, run
  assert files_of(model_copy, STEPS) == before  # Not overwritten or deleted.
  assert [os.path.basename(p) for p in tf.train.get_checkpoint_state(
      str(model_copy)).all_model_checkpoint_paths] == [
          "ckpt-10", "ckpt-20", "ckpt-30", "ckpt-40"]


def test_a_rolled_back_state_file_never_leads_to_overwriting_newer_ones(
    launch_forked, model_copy):
  # It resumed from ckpt-10 and wrote over ckpt-20 and ckpt-30, silently.
  roll_back(model_copy, "ckpt-10")
  before = files_of(model_copy, STEPS)
  run = launch_forked(EXPERIMENT, "--mode=train", override(40),
                      model_dir=model_copy)
  assert run.returncode == 0, run
  assert ("names ckpt-10, older than ckpt-30, which reads whole"
          in run.stderr), run
  assert run.summary()["resumed_from_step"] == 30
  assert files_of(model_copy, STEPS) == before


def test_truncated_latest_resumes_training_from_the_one_before(
    launch_forked, model_copy):
  cut_short(data_file(model_copy, 30))
  run = launch_forked(EXPERIMENT, "--mode=train", override(40),
                      model_dir=model_copy)
  assert run.returncode == 0, run
  assert "skipped ckpt-30 (its data is cut short" in run.stderr, run
  assert "Traceback" not in run.stderr
  summary = run.summary()
  assert (summary["resumed_from_step"], summary["global_step"]) == (20, 40)
  # Training saved over the damaged checkpoint when it reached step 30.
  assert checkpoint_state.unreadable(f"{model_copy}/ckpt-30",
                                     read_tensors=True) is None


def test_continuous_eval_records_unreadable_checkpoints_and_goes_on(
    launch_forked, model_copy):
  zero_middle(data_file(model_copy, 20))  # The restore starts, then fails.
  cut_short(data_file(model_copy, 30))  # The latest, the final step's.
  run = launch_forked(EXPERIMENT, "--mode=continuous_eval", override(30),
                      model_dir=model_copy)
  assert run.returncode == 0, run
  status = {e["global_step"]: e["status"]
            for e in eval_ledger.read_ledger(str(model_copy))}
  assert status == {10: "evaluated", 20: "unreadable", 30: "unreadable"}
  assert run.stdout.count("eval @") == 1, run
  # It stopped once the final step was recorded, not after the timeout.
  assert "No new checkpoint" not in run.stderr
  assert "Traceback" not in run.stderr and "Logging error" not in run.stderr
  # Nor a warning for each value the failed restore left unrestored.
  assert "restored object" not in run.stderr, run
  # The start names both once, then one line each as it records them.
  assert run.stderr.count("ckpt-20 (") == 1, run
  assert run.stderr.count("ckpt-20 cannot be read") == 1, run


def test_two_evaluators_on_one_model_dir_evaluate_each_checkpoint_once(
    start_forked, model_copy):
  evaluators = [start_forked(EXPERIMENT, "--mode=continuous_eval",
                             override(30), model_dir=model_copy)
                for _ in range(2)]
  runs = [e.finish(timeout=240) for e in evaluators]
  assert all(r.returncode == 0 for r in runs), runs
  assert sum(r.stdout.count("eval @") for r in runs) == len(STEPS), runs
  entries = eval_ledger.read_ledger(str(model_copy))
  assert [(e["global_step"], e["status"]) for e in entries] == [
      (s, "evaluated") for s in STEPS]
  assert not os.listdir(model_copy / eval_claims.CLAIMS)  # All released.
