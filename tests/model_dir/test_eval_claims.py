"""Claims won without waiting, and a presence from the evaluator's start.

The evaluator's loop (`tfm_ext.run.continuous_eval`) claims what waits,
bidding for each checkpoint as the trainer lease is taken, and renews
each claim until it releases it; the launcher makes
an evaluator present before it builds anything, and its loop takes that
presence over (end to end: tests/e2e/test_evaluator_sees_every_checkpoint.py).
"""

import os
import subprocess
import sys
import time

from conftest import REPO
from tfm_ext.model_dir import eval_claims
from tfm_ext.base import settings


def claims_of(model_dir):
  return sorted(os.listdir(os.path.join(model_dir, eval_claims.CLAIMS)))


def test_a_batch_of_claims_waits_for_nothing_and_skips_live_claims(tmp_path):
  model_dir = str(tmp_path)
  paths = [f"{model_dir}/ckpt-{step}" for step in range(10, 60, 10)]
  waits = []
  other = eval_claims.Claims(model_dir, owner="b", sleep=waits.append)
  assert other.acquire(paths[1])
  first = eval_claims.Claims(model_dir, owner="a", sleep=waits.append)
  # At most three, in order, around the live claim on ckpt-20.
  assert first.acquire_each(paths, limit=3) == [paths[0], paths[2], paths[3]]
  assert first.acquire_each(paths[1:2]) == []  # Another's, live.
  assert not waits  # Uncontested bids wait for nothing (no settle time).
  # Each bid is gone once decided.
  assert os.listdir(os.path.join(model_dir, eval_claims.BIDS)) == []
  assert claims_of(model_dir) == ["ckpt-10.json", "ckpt-20.json",
                                  "ckpt-30.json", "ckpt-40.json"]


def test_a_released_claim_is_not_renewed_back(tmp_path, monkeypatch):
  monkeypatch.setattr(settings, "_current",
                      settings.get().replace(claim_renew_seconds=0.02))
  model_dir = str(tmp_path)
  claims = eval_claims.Claims(model_dir, owner="a", sleep=lambda _: None)
  paths = claims.acquire_each([f"{model_dir}/ckpt-10", f"{model_dir}/ckpt-20"])
  with claims.renewed(*paths):
    claims.release(paths[0])  # Evaluated and recorded; the other waits.
    time.sleep(0.3)  # Many renewal periods.
    assert claims_of(model_dir) == ["ckpt-20.json"]
    assert claims.holds(paths[1])
  claims.release(paths[1])
  assert claims_of(model_dir) == []


def test_a_presence_from_the_start_is_held_by_the_loop_until_it_ends(
    tmp_path):
  model_dir = str(tmp_path / "m")
  eval_claims.announce(model_dir)
  eval_claims.announce(model_dir)  # Adds nothing.
  (present,) = eval_claims.live_evaluators(model_dir)
  assert present["pid"] == os.getpid()
  with eval_claims.announced(model_dir):  # The loop takes it over.
    assert eval_claims.live_evaluators(model_dir) == [present]
  assert eval_claims.live_evaluators(model_dir) == []
  assert os.listdir(os.path.join(model_dir, eval_claims.PRESENCE)) == []


def test_a_process_that_ends_before_its_loop_leaves_no_presence(tmp_path):
  # A refused evaluator, or one whose trainer never came: the model_dir
  # its presence made is gone with it.
  model_dir = tmp_path / "m"
  run = subprocess.run(
      [sys.executable, "-c",
       "import sys\n"
       "from tfm_ext.model_dir import eval_claims\n"
       "eval_claims.announce(sys.argv[1])\n"
       "print(len(eval_claims.live_evaluators(sys.argv[1])))\n"
       "sys.exit(2)", str(model_dir)],
      env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"},
      capture_output=True, text=True, timeout=120, check=False)
  assert (run.returncode, run.stdout) == (2, "1\n"), run.stderr
  assert not model_dir.exists()
  assert os.listdir(tmp_path) == []
