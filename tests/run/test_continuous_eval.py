"""Exactly-once continuous evaluation beside a real training process."""

import glob
import json
import os
import re
import shutil
import signal
import time

import pytest
import tensorflow as tf

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import eval_claims
from tfm_ext.model_dir import run_summary
from tfm_ext.run import continuous_eval
from tfm_ext.model_dir import eval_ledger


TRAIN_ARGS = ("--experiment=digits_convnet",
              "--params_override=trainer.train_steps=120,"
              "trainer.steps_per_loop=20,trainer.summary_interval=20,"
              "trainer.checkpoint_interval=20,trainer.max_to_keep=10,"
              "trainer.validation_interval=1000,"
              "trainer.continuous_eval_timeout=120")


def ledger(model_dir):
  return eval_ledger.read_ledger(str(model_dir))


@pytest.mark.slow
def test_evaluator_beside_trainer_evaluates_each_checkpoint_once(
    start_forked, launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  evaluator = start_forked(TRAIN_ARGS[0], "--mode=continuous_eval",
                           TRAIN_ARGS[1], model_dir=model_dir)
  trainer = launch_forked(TRAIN_ARGS[0], "--mode=train", TRAIN_ARGS[1],
                          model_dir=model_dir)
  trainer_done = time.monotonic()
  assert trainer.returncode == 0, trainer
  evaluated = evaluator.finish(timeout=120)
  assert evaluated.returncode == 0, evaluated
  # It stopped soon after the final checkpoint, not after the 120 s timeout.
  assert time.monotonic() - trainer_done < 30

  saved = {int(p.rsplit("-", 1)[1]) for p in
           tf.train.get_checkpoint_state(str(model_dir)).all_model_checkpoint_paths}
  entries = ledger(model_dir)
  steps = [e["global_step"] for e in entries]
  assert len(steps) == len(set(steps)), steps  # Exactly once.
  assert set(steps) == saved, (steps, saved)
  assert all(e["status"] == "evaluated" for e in entries)
  assert steps[-1] == 120
  summary = evaluated.summary("eval_summary.json")  # The evaluator's own.
  assert summary["eval_metrics"]["accuracy"] > 0.5
  # The evaluator ran the best-checkpoint exporter on the trainer's model_dir.
  with open(model_dir / "best_ckpt" / "best_checkpoints.json") as f:
    assert json.load(f)["checkpoints"]

  # A restarted evaluator finds everything done and evaluates nothing again.
  again = launch_forked(TRAIN_ARGS[0], "--mode=continuous_eval", TRAIN_ARGS[1],
                        model_dir=model_dir)
  assert again.returncode == 0, again
  assert ledger(model_dir) == entries  # Not one record rewritten.
  assert "eval @" not in again.stdout


def test_checkpoint_deleted_before_it_was_read_is_skipped(
    run_in_process, launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  trained, _ = run_in_process(
      "digits_convnet", "train", model_dir,
      "trainer.train_steps=40,trainer.steps_per_loop=10,"
      "trainer.checkpoint_interval=10")
  assert trained.status == "completed", trained
  # What max_to_keep leaves an evaluator that listed ckpt-20 a moment ago:
  # the state file still names it, its files are gone.
  for name in os.listdir(model_dir):
    if name.startswith("ckpt-20."):
      os.remove(model_dir / name)
  run = launch_forked(TRAIN_ARGS[0], "--mode=continuous_eval",
                      "--params_override=trainer.train_steps=40",
                      model_dir=model_dir)
  assert run.returncode == 0, run
  assert "ckpt-20 vanished before it was evaluated" in run.stderr, run
  assert "Logging error" not in run.stderr
  status = {e["global_step"]: e["status"] for e in ledger(model_dir)}
  assert status[20] == "missing" and status[40] == "evaluated"


def test_no_trainer_and_no_checkpoint_waits_timeout_then_exits(
    launch_forked, tmp_path):
  begin = time.monotonic()
  run = launch_forked("--experiment=digits_convnet", "--mode=continuous_eval",
                      "--params_override=trainer.continuous_eval_timeout=3",
                      model_dir=tmp_path / "m")
  assert run.returncode == 2, run
  assert "No checkpoint appeared" in run.stderr
  assert "continuous_eval_timeout=3s" in run.stderr
  assert time.monotonic() - begin >= 3
  assert "Traceback" not in run.stderr


def test_a_training_run_clears_a_stale_training_complete_marker(
    start_forked, tmp_path):
  """An evaluator beside an extended or resumed run must not stop at once.

  A marker left by an earlier run (final step 20) would tell it that no
  checkpoint after step 20 will come.
  """
  model_dir = tmp_path / "m"
  model_dir.mkdir()
  run_summary.mark_training_complete(str(model_dir), 20)
  assert run_summary.training_complete_step(str(model_dir)) == 20
  trainer = start_forked("--experiment=digits_convnet", "--mode=train",
                         "--params_override=trainer.train_steps=100000,"
                         "trainer.steps_per_loop=10,"
                         "trainer.summary_interval=10,"
                         "trainer.checkpoint_interval=100000",
                         model_dir=model_dir)
  trainer.wait_for_line(lambda l: l.startswith("step "))
  assert trainer.proc.poll() is None  # Still training.
  assert run_summary.training_complete_step(str(model_dir)) is None
  assert not (model_dir / run_summary.COMPLETE_MARKER).exists()


class FakeTime:
  """A clock that only the injected `sleep` moves: no real waiting.

  Reading it after `real_budget` seconds of real time fails the test, so
  code that sleeps for real (and never moves this clock) fails fast
  instead of hanging.
  """

  def __init__(self, real_budget=5.0):
    self.now = 1000.0
    self.sleeps = []
    self._deadline = time.monotonic() + real_budget

  def clock(self):
    assert time.monotonic() < self._deadline, (
        f"real time passed: {len(self.sleeps)} injected sleeps so far")
    return self.now

  def sleep(self, seconds):
    self.sleeps.append(seconds)
    self.now += seconds


def test_no_checkpoint_within_timeout_raises_usage_error_without_waiting(
    tmp_path):
  fake = FakeTime()
  with pytest.raises(UsageError, match=r"No checkpoint appeared.*"
                     r"continuous_eval_timeout=30s"):
    # The controller is only touched to restore and evaluate a checkpoint;
    # with none in model_dir, None stands in for it.
    continuous_eval.evaluate_continuously(
        None, model_dir=str(tmp_path), eval_steps=1, train_steps=100,
        timeout=30, clock=fake.clock, sleep=fake.sleep)
  # It polled every POLL_SECONDS on its clock and gave up at the first poll
  # past the timeout; no real sleeping (FakeTime would have failed).
  waited = fake.now - 1000.0
  assert set(fake.sleeps) == {continuous_eval.POLL_SECONDS}
  assert waited > 30 >= waited - continuous_eval.POLL_SECONDS
  # Nothing left: no ledger record; its presence (eval_claims.announced)
  # removed as it stopped.
  assert os.listdir(tmp_path) in ([], [eval_claims.PRESENCE])
  assert not os.listdir(tmp_path / eval_claims.PRESENCE)


# -- An evaluator stopped while it holds a claim ---------------------------

# A claim unrenewed for 4 s is taken over (30 s by default).
CLAIM_ENV = {"TFM_EXT_CLAIM_RENEW_SECONDS": "0.5",
             "TFM_EXT_CLAIM_STALE_SECONDS": "4"}
# Validation fields only (an evaluator follows the trainer's params.yaml):
# eager, two images a batch, so one evaluation takes about 5 s.
SLOW_EVAL = ("--params_override=task.validation_data.global_batch_size=2,"
             "trainer.eval_tf_function=false,"
             "trainer.continuous_eval_timeout=120")


def claim_of(model_dir, checkpoint):
  try:
    with open(os.path.join(model_dir, eval_claims.CLAIMS,
                           checkpoint + ".json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def ledger_bytes(model_dir):
  return {os.path.basename(path): open(path, "rb").read()
          for path in glob.glob(os.path.join(model_dir, eval_ledger.LEDGER,
                                             "*"))}


def validation_points(model_dir):
  """step -> how many TensorBoard points `validation/` holds for it."""
  points = {}
  for path in glob.glob(os.path.join(model_dir, "validation", "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      if any(v.tag == "validation_loss" for v in event.summary.value):
        points[event.step] = points.get(event.step, 0) + 1
  return points


def tree_bytes(root):
  return {os.path.relpath(path, root): open(path, "rb").read()
          for path in glob.glob(os.path.join(root, "**"), recursive=True)
          if os.path.isfile(path)}


@pytest.mark.slow
def test_an_evaluator_continued_after_its_claim_was_taken_writes_nothing(
    start_forked, two_checkpoints, tmp_path):
  model_dir = tmp_path / "m"
  shutil.copytree(two_checkpoints, model_dir)
  stalled = start_forked(TRAIN_ARGS[0], "--mode=continuous_eval", SLOW_EVAL,
                         model_dir=model_dir, env=CLAIM_ENV)
  deadline = time.monotonic() + 180
  while claim_of(model_dir, "ckpt-10").get("pid") != stalled.proc.pid:
    assert stalled.proc.poll() is None, stalled.finish()
    assert time.monotonic() < deadline, "no claim on ckpt-10"
    time.sleep(0.1)
  # A claim is written once won: it is evaluating ckpt-10.
  time.sleep(0.2)
  stalled.proc.send_signal(signal.SIGSTOP)
  try:
    assert not ledger_bytes(model_dir), "ckpt-10 was done before the stop"
    other = start_forked(TRAIN_ARGS[0], "--mode=continuous_eval", SLOW_EVAL,
                         model_dir=model_dir, env=CLAIM_ENV)
    took_over = other.finish(timeout=240)
    assert took_over.returncode == 0, took_over
    assert "Taking over the claim on ckpt-10" in took_over.stderr, took_over
    recorded = ledger_bytes(model_dir)
    assert sorted(recorded) == ["ckpt-10.json", "ckpt-20.json"], recorded
    assert validation_points(model_dir) == {10: 1, 20: 1}
    best = tree_bytes(model_dir / "best_ckpt")
  finally:
    stalled.proc.send_signal(signal.SIGCONT)
  continued = stalled.finish(timeout=180)

  assert continued.returncode == 0, continued
  # It finished evaluating ckpt-10, found the claim was not its own before
  # its first write, and wrote nothing of that evaluation: no TensorBoard
  # point (two points for one step before), no best checkpoint, no ledger
  # record, no result line (its batches' progress lines came before).
  assert (f"The claim on {model_dir}/ckpt-10 was taken over while this "
          "evaluator held it") in continued.stderr, continued
  assert not re.search(r"^eval @ step \d+ \| (?!batch )", continued.stdout,
                       re.M), continued
  assert validation_points(model_dir) == {10: 1, 20: 1}
  assert tree_bytes(model_dir / "best_ckpt") == best
  # Each checkpoint recorded once, by the evaluator that took over: not one
  # byte of the ledger rewritten, no claim left behind.
  assert ledger_bytes(model_dir) == recorded
  entries = eval_ledger.read_ledger(str(model_dir))
  assert [(e["global_step"], e["status"]) for e in entries] == [
      (10, "evaluated"), (20, "evaluated")]
  assert all(f":{other.proc.pid}:" in e["evaluator"] for e in entries)
  assert not os.listdir(model_dir / eval_claims.CLAIMS)
  # Its end line and its summary say so; its summary holds no metrics of
  # the evaluation it did not record.
  (end,) = [l for l in continued.stdout.splitlines()
            if l.startswith("continuous_eval |")]
  assert end == ("continuous_eval | 0 checkpoint(s) evaluated here, 2 by "
                 "other evaluators | 1 claim(s) taken over while evaluated "
                 "here (ckpt-10: left to the evaluator that took it over)"), end
  summary = continued.summary("eval_summary.json")
  assert summary["eval_metrics"] == {}, summary
  assert summary["evaluations"]["claims_taken_over"] == ["ckpt-10"], summary
  assert summary["evaluations"]["said"] == end
