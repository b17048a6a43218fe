"""SIGKILL at random moments, checkpoint writes included: always restorable."""

import json
import os
import random
import signal
import time

import pytest
import tensorflow as tf

from conftest import numeric_tensors
from tfm_ext.model_dir import best_checkpoints

TRIALS = 4
STEPS = 800  # More than the trials reach: each is killed in training.
VALIDATION_INTERVAL = 50


def _args(steps):
  # Checkpoints every 10-step loop and an evaluation (so a best-checkpoint
  # export) every 50 steps: most of the run is spent near a write.
  return ("--experiment=digits_convnet", "--mode=train_and_eval",
          f"--params_override=trainer.train_steps={steps},"
          "trainer.steps_per_loop=10,trainer.summary_interval=10,"
          "trainer.checkpoint_interval=10,"
          f"trainer.validation_interval={VALIDATION_INTERVAL},"
          "trainer.max_to_keep=2")


ARGS = _args(STEPS)


def assert_restorable(model_dir):
  """Every checkpoint a relaunch could pick up reads back completely."""
  latest = tf.train.latest_checkpoint(model_dir)
  if latest:
    numeric_tensors(latest)  # Reads every tensor back.
  best_dir = os.path.join(model_dir, "best_ckpt")
  manifest = os.path.join(best_dir, best_checkpoints.MANIFEST)
  if os.path.exists(manifest):
    with open(manifest) as f:
      for entry in json.load(f)["checkpoints"]:
        tf.train.load_checkpoint(os.path.join(best_dir, entry["path"]))
  return latest


@pytest.mark.slow
def test_sigkill_anywhere_always_leaves_a_restorable_model_dir(
    start_forked, launch_forked, tmp_path):
  rng = random.Random(int(time.time()))
  model_dir = str(tmp_path / "m")
  kills = []
  deadline = time.monotonic() + 100
  for _ in range(TRIALS):
    if time.monotonic() > deadline:
      break
    # Forked from the imported launcher: a start-up kill falls in what the
    # run does (restore, dataset, tracing), not in TensorFlow's import.
    job = start_forked(*ARGS, model_dir=model_dir)
    # The first kill is always in training (a run of start-up kills alone
    # would leave no checkpoint).
    if kills and rng.random() < 0.2:
      phase, delay = "start-up", rng.uniform(0.5, 4.0)
    else:  # During training, evaluation and checkpoint writes.
      job.wait_for_line(lambda l: l.startswith("step "))
      phase, delay = "training", rng.uniform(0.0, 2.5)
    time.sleep(delay)
    if job.proc.poll() is not None:
      break  # Training finished first: nothing left to interrupt.
    job.proc.send_signal(signal.SIGKILL)
    job.proc.wait()
    latest = assert_restorable(model_dir)
    kills.append((phase, round(delay, 2), latest and os.path.basename(latest)))
  assert len(kills) >= TRIALS or time.monotonic() > deadline, kills
  print("kills (phase, seconds into it, latest checkpoint):", kills)

  # The relaunch resumes from the last kill's checkpoint and finishes at
  # the next evaluation (its best-checkpoint export) after it: the steps
  # up to STEPS would prove nothing more.
  latest = tf.train.latest_checkpoint(model_dir)
  resumed_at = int(latest.rsplit("-", 1)[1]) if latest else 0
  end = (resumed_at // VALIDATION_INTERVAL + 1) * VALIDATION_INTERVAL
  final = launch_forked(*_args(end), model_dir=model_dir)
  assert final.returncode == 0, (kills, final)
  summary = final.summary()
  assert summary["global_step"] == end
  # Every start after a kill that left a checkpoint resumed from it.
  assert summary["resumes"] >= any(latest for _, _, latest in kills), kills
  assert_restorable(model_dir)
