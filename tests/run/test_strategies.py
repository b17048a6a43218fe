"""`runtime.distribution_strategy` names beyond the default `mirrored`.

Multi-worker and two-CPU mirrored runs are in test_multi_worker.py and
test_exact_resume.py; TPU without an address in test_bad_input.py.
"""

import json
import os

import pytest
import tensorflow as tf

from conftest import SMOKE
from tfm_ext.run import strategies


@pytest.mark.parametrize("strategy", ["off", "one_device"])
def test_single_device_strategies_train_evaluate_and_resume(
    run_in_process, tmp_path, strategy):
  # A bare `off` is YAML's false; TFM's parser would stop on it.
  override = SMOKE + f",runtime.distribution_strategy={strategy}"
  summary, params = run_in_process("digits_convnet", "train_and_eval",
                                   tmp_path, override)
  assert params.runtime.distribution_strategy == strategy
  assert summary.global_step == 40
  assert summary.eval_metrics["accuracy"] > 0.5
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-40")
  summary, _ = run_in_process(
      "digits_convnet", "train", tmp_path,
      override.replace("train_steps=40", "train_steps=60"))
  assert summary.resumed_from_step == 40 and summary.global_step == 60
  assert os.path.exists(os.path.join(tmp_path, "ckpt-60.index"))


@pytest.mark.parametrize("tf_config, chief", [
    (None, True),
    ({"cluster": {"worker": ["h0:1", "h1:1"]},
      "task": {"type": "worker", "index": 0}}, True),
    ({"cluster": {"worker": ["h0:1", "h1:1"]},
      "task": {"type": "worker", "index": 1}}, False),
    # With a chief task, every worker (worker 0 included) is not the chief.
    ({"cluster": {"chief": ["h0:1"], "worker": ["h1:1"]},
      "task": {"type": "chief", "index": 0}}, True),
    ({"cluster": {"chief": ["h0:1"], "worker": ["h1:1"]},
      "task": {"type": "worker", "index": 0}}, False),
])
def test_the_chief_process_is_the_chief_task_or_worker_0(
    monkeypatch, tf_config, chief):
  if tf_config is None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
  else:
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
  assert strategies.is_chief_process() is chief
