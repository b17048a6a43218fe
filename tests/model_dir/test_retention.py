"""What a save's sweep keeps for a live evaluator, and what it records.

A trainer's `max_to_keep` waits for a live evaluator, bounded at
`2 x max_to_keep`; a `train` job records what it rotates away unwatched
(`tfm_ext.model_dir.retention`). End to end, with real trainers and
evaluators: tests/e2e/test_evaluator_sees_every_checkpoint.py.
"""

import json
import os
import socket
import time

import pytest
import tensorflow as tf

from conftest import checkpoint_steps
from conftest import tiny_manager
from tfm_ext.model_dir import claim
from tfm_ext.model_dir import eval_claims
from tfm_ext.run import continuous_eval
from tfm_ext.model_dir import eval_ledger
from tfm_ext.base import settings


def test_a_live_evaluator_keeps_what_it_has_not_recorded_up_to_a_bound(
    tmp_path, caplog):
  model_dir = str(tmp_path)
  _, save = tiny_manager(model_dir, max_to_keep=2)
  for step in (1, 2, 3):
    save(step)
  assert checkpoint_steps(model_dir) == [2, 3]  # No evaluator: TensorFlow's rule.
  with eval_claims.announced(model_dir):
    save(4)
    assert checkpoint_steps(model_dir) == [2, 3, 4]  # ckpt-2 waits for it.
    eval_ledger.EvalLedger(model_dir).record(f"{model_dir}/ckpt-2",
                                                 "evaluated")
    save(5)
    assert checkpoint_steps(model_dir) == [3, 4, 5]  # Recorded: rotated away.
    save(6)
    assert checkpoint_steps(model_dir) == [3, 4, 5, 6]  # 2 x max_to_keep.
    save(7)
    assert checkpoint_steps(model_dir) == [4, 5, 6, 7]  # The oldest waiting goes,
    missing = eval_ledger.read_ledger(model_dir)[-1]  # recorded so.
    assert (missing["checkpoint"], missing["status"]) == ("ckpt-3", "missing")
    assert "2 x max_to_keep" in missing["why"]
    assert "Deleted ckpt-3, by the trainer before any evaluator recorded it" in (
        caplog.text)
    assert not continuous_eval.listed_checkpoints(model_dir)[0].endswith(
        "ckpt-3")
  # The evaluator stopped (its presence removed). A resumed trainer lists
  # what was kept, and its next save keeps nothing extra.
  assert not tf.io.gfile.listdir(os.path.join(model_dir,
                                              eval_claims.PRESENCE))
  _, save = tiny_manager(model_dir, max_to_keep=2)
  save(8)
  assert checkpoint_steps(model_dir) == [7, 8]


@pytest.mark.parametrize("records", [True, False])
def test_a_train_job_records_what_it_rotates_away_unwatched(tmp_path, records):
  model_dir = str(tmp_path)
  _, save = tiny_manager(model_dir, max_to_keep=2, records_unwatched=records)
  for step in (1, 2, 3):
    save(step)
  with eval_claims.announced(model_dir):
    save(4)  # Kept for the evaluator: not recorded.
    eval_ledger.EvalLedger(model_dir).record(f"{model_dir}/ckpt-2",
                                                 "evaluated")
  save(5)  # Gone again: ckpt-2 (evaluated) and ckpt-3 rotate away.
  entries = eval_ledger.read_ledger(model_dir)
  missing = [(e["global_step"], e["evaluator"], e["why"]) for e in entries
             if e["status"] == "missing"]
  assert checkpoint_steps(model_dir) == [4, 5]
  why = eval_ledger.UNWATCHED
  assert missing == ([(1, "trainer", why), (3, "trainer", why)] if records
                     else [])
  assert [e["status"] for e in entries if e["global_step"] == 2] == [
      "evaluated"]


def _present(model_dir, **fields):
  """Writes an evaluator's presence record as another process would."""
  record = {"owner": "evaluator-x", "host": "another-host", "pid_space": "",
            "pid": 1 << 30, "since": 1.0, "beats": 0, "heartbeat": 1.0,
            **fields}
  tf.io.gfile.makedirs(os.path.join(model_dir, eval_claims.PRESENCE))
  with open(os.path.join(model_dir, eval_claims.PRESENCE, "x.json"), "w") as f:
    json.dump(record, f)


def test_an_evaluator_killed_on_this_machine_keeps_nothing_extra(tmp_path):
  model_dir = str(tmp_path)
  from tfm_ext.model_dir import lease  # pylint: disable=g-import-not-at-top
  assert not lease.pid_alive(1 << 30)
  # Its heartbeat is from now: the process, gone, decides.
  _present(model_dir, host=socket.gethostname(), pid_space=lease.pid_space(),
           heartbeat=time.time())
  _, save = tiny_manager(model_dir, max_to_keep=2)
  for step in (1, 2, 3, 4):
    save(step)
  assert checkpoint_steps(model_dir) == [3, 4]
  # The same record with a live pid: it waits.
  _present(model_dir, host=socket.gethostname(), pid_space=lease.pid_space(),
           pid=os.getpid())
  save(5)
  assert checkpoint_steps(model_dir) == [3, 4, 5]


@pytest.mark.parametrize("heartbeat", [0.0, 1e12], ids=["epoch", "future"])
def test_another_hosts_evaluator_lives_while_its_beats_change_whatever_the_clocks(
    tmp_path, heartbeat):
  # Its wall clock (the heartbeat's time) is never compared with ours: a
  # reader judges by its beat counter, seen unchanged on its own monotonic
  # clock for evaluator_stale_seconds.
  model_dir, now = str(tmp_path), [100.0]
  seen = claim.Unchanged(lambda: now[0])
  stale = settings.get().evaluator_stale_seconds
  _present(model_dir, heartbeat=heartbeat)
  assert len(eval_claims.live_evaluators(model_dir, seen)) == 1  # First seen.
  now[0] += stale - 1
  assert len(eval_claims.live_evaluators(model_dir, seen)) == 1
  now[0] += 2 * stale  # It beat meanwhile: live, the age starts again.
  _present(model_dir, heartbeat=heartbeat, beats=1)
  assert len(eval_claims.live_evaluators(model_dir, seen)) == 1
  now[0] += stale + 1  # Unchanged for longer than stale: gone.
  assert eval_claims.live_evaluators(model_dir, seen) == []
  # A restarted evaluator of the same name (a new `since`) counts anew.
  _present(model_dir, heartbeat=heartbeat, beats=1, since=2.0)
  assert len(eval_claims.live_evaluators(model_dir, seen)) == 1
