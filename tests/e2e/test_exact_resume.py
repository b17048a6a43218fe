"""Exact resume: killed anywhere and resumed, bitwise an uninterrupted run."""

import random
import re
import signal
import time

import numpy as np
import pytest

from conftest import DOUBLES_TRAIN, TWO_CPUS_TRAIN, numeric_tensors
from conftest import built_once

STEPS = 150


def args(*overrides):
  return ("--experiment=digits_convnet", "--mode=train_and_eval",
          "--trainer=announcing",
          f"--params_override=trainer.train_steps={STEPS},"
          "trainer.steps_per_loop=10,trainer.summary_interval=10,"
          "trainer.checkpoint_interval=10,trainer.validation_interval=50,"
          "runtime.deterministic=true" + "".join("," + o for o in overrides))


def differing(dir_a, dir_b):
  a = numeric_tensors(f"{dir_a}/ckpt-{STEPS}")
  b = numeric_tensors(f"{dir_b}/ckpt-{STEPS}")
  assert a.keys() == b.keys()
  return sorted(k for k in a if not np.array_equal(a[k], b[k]))


def strategy(result):
  """The strategy a run's summary records, and its replicas."""
  return result.summary()["strategy"], result.summary()["replicas"]


def interrupt(start, model_dir, script, run_args, line_pattern, sig):
  """Starts the run, sends `sig` once a stdout line matches; returns it."""
  job = start(*run_args, model_dir=model_dir, script=script)
  job.wait_for_line(lambda l: re.match(line_pattern, l) is not None)
  job.proc.send_signal(sig)
  result = job.finish()
  expected = (42,) if sig == signal.SIGTERM else (-signal.SIGKILL,)
  assert result.returncode in expected, result
  return result


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, launch_forked):
  """The reference: the same run, never interrupted (single device).

  Run once a session; the tests only read its checkpoint.
  """

  def run(model_dir):
    result = launch_forked(*args(), model_dir=model_dir, script=DOUBLES_TRAIN)
    assert result.returncode == 0, result
    assert result.summary()["deterministic"] is True
    assert result.summary()["input_in_checkpoint"] is True
    # TFM's default `mirrored`, on one CPU device: its one-replica mirror.
    assert strategy(result) == ("MirroredStrategy", 1)

  return built_once(tmp_path_factory, "exact_resume_uninterrupted", run)


@pytest.mark.slow
def test_killed_at_random_steps_and_resumed_is_bitwise_identical(
    uninterrupted, start_forked, launch_forked, tmp_path):
  rng = random.Random(time.time())
  mid_epoch = rng.choice([20, 30, 40])  # An epoch is 22.45 steps.
  late = rng.choice([110, 120, 130])
  model_dir = tmp_path / "interrupted"
  run_args = args()
  interrupt(start_forked, model_dir, DOUBLES_TRAIN, run_args,
            rf"step {mid_epoch}/", signal.SIGKILL)
  interrupt(start_forked, model_dir, DOUBLES_TRAIN, run_args,
            r"eval begins @ step (50|100)", signal.SIGKILL)
  interrupt(start_forked, model_dir, DOUBLES_TRAIN, run_args,
            rf"step {late}/", signal.SIGTERM)
  final = launch_forked(*run_args, model_dir=model_dir, script=DOUBLES_TRAIN)
  assert final.returncode == 0, final
  assert final.summary()["resumes"] >= 2
  assert differing(uninterrupted, model_dir) == [], (mid_epoch, late)


@pytest.mark.slow
def test_without_iterator_state_a_resume_is_not_exact(
    uninterrupted, start_forked, launch_forked, tmp_path):
  """The check above can fail: leaving the iterator out breaks exactness."""
  model_dir = tmp_path / "no_iterator"
  run_args = args("trainer.checkpoint_input_iterator=false")
  interrupt(start_forked, model_dir, DOUBLES_TRAIN, run_args, r"step 30/",
            signal.SIGKILL)
  final = launch_forked(*run_args, model_dir=model_dir, script=DOUBLES_TRAIN)
  assert final.returncode == 0, final
  assert final.summary()["input_in_checkpoint"] is False
  assert differing(uninterrupted, model_dir)


@pytest.mark.slow
def test_one_replica_mirror_and_no_strategy_are_the_same_run(
    start_forked, launch_forked, tmp_path):
  """`runtime.mirror_one_device=false` builds no strategy for `mirrored` on
  one CPU: the same data and math, bit for bit, as TFM's one-replica mirror
  (the default), and the mirror resumes its checkpoints. Without dropout:
  under a strategy, Keras's generator-backed dropout draws from a
  per-replica stream, so its masks differ. The resumed run's tf.data pool
  has another size too: the data stay the same."""
  no_dropout = "task.model.dropout_rate=0.0"
  reference = launch_forked(*args(no_dropout), model_dir=tmp_path / "mirror",
                            script=DOUBLES_TRAIN)
  assert reference.returncode == 0, reference
  assert strategy(reference) == ("MirroredStrategy", 1)
  model_dir = tmp_path / "none_then_mirror"
  stopped = interrupt(start_forked, model_dir, DOUBLES_TRAIN,
                      args(no_dropout, "runtime.mirror_one_device=false"),
                      r"step 70/", signal.SIGTERM)
  assert strategy(stopped) == ("none", 1)
  # tf.data's own pool, where the default on CPUs is a private one.
  threads = 0
  final = launch_forked(*args(no_dropout,
                              f"runtime.dataset_num_private_threads={threads}"),
                        model_dir=model_dir, script=DOUBLES_TRAIN)
  assert final.returncode == 0, final
  assert strategy(final) == ("MirroredStrategy", 1)
  assert reference.summary()["input_threads"] != threads
  assert final.summary()["input_threads"] == threads
  assert final.summary()["resumed_from_step"] >= 70
  assert differing(tmp_path / "mirror", model_dir) == []


@pytest.mark.slow
def test_mirrored_over_two_cpus_resumes_bitwise_identical(
    launch_forked, start_forked, tmp_path):
  run_args = args("runtime.distribution_strategy=mirrored")
  reference = launch_forked(*run_args, model_dir=tmp_path / "reference",
                     script=TWO_CPUS_TRAIN)
  assert reference.returncode == 0, reference
  assert strategy(reference) == ("MirroredStrategy", 2)
  model_dir = tmp_path / "interrupted"
  interrupt(start_forked, model_dir, TWO_CPUS_TRAIN, run_args, r"step 30/",
            signal.SIGKILL)
  interrupt(start_forked, model_dir, TWO_CPUS_TRAIN, run_args,
            r"eval begins @ step 100", signal.SIGTERM)
  final = launch_forked(*run_args, model_dir=model_dir,
                        script=TWO_CPUS_TRAIN)
  assert final.returncode == 0, final
  assert differing(tmp_path / "reference", model_dir) == []
