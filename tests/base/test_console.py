"""Console progress: the examples a second the run summary reports."""

import io

import numpy as np
import pytest
import tensorflow as tf

from tfm_ext.base import console
from tfm_ext.base.logs import scalars


def test_steady_examples_per_second_span_every_loop_after_the_first():
  step = tf.Variable(0, dtype=tf.int64)
  now = [100.0]
  stream = io.StringIO()
  progress = console.TrainProgress(
      global_step=step, total_steps=41, global_batch_size=8, start_time=95.0,
      clock=lambda: now[0], stream=stream)
  # The first loop (one step, tracing included), then loops of 10 steps at
  # different speeds: 1 s, then 4 s.
  for steps, seconds in ((1, 0.0), (10, 1.0), (10, 4.0)):
    step.assign_add(steps)
    now[0] += seconds
    progress({"training_loss": 0.5})
  assert progress.time_to_first_step == 5.0
  # 20 global batches of 8 rows in the 5 s after the first loop, not the
  # last loop's 80 rows in 4 s.
  assert progress.examples_per_second == 20 * 8 / 5.0
  last = stream.getvalue().splitlines()[-1]
  # The loop's rate, smoothed: 10 steps in 0.3 * 4 s + 0.7 * 1 s.
  assert last.startswith("step 21/41 | training_loss 0.5 | 42 ex/s")
  # 20 steps left at the steady 0.25 s a step.
  assert last.endswith("ETA 0:00:05")


def test_the_eta_comes_from_steps_when_the_batch_size_is_unknown():
  # TFM's mock task leaves global_batch_size at 0: no ex/s, but an ETA.
  step = tf.Variable(0, dtype=tf.int64)
  now = [0.0]
  stream = io.StringIO()
  progress = console.TrainProgress(
      global_step=step, total_steps=30, global_batch_size=0, start_time=0.0,
      clock=lambda: now[0], stream=stream)
  for steps in (10, 10):
    step.assign_add(steps)
    now[0] += 2.0
    progress({})
  assert stream.getvalue().splitlines()[-1] == "step 20/30 | 0 ex/s | ETA 0:00:02"


def test_a_loop_that_ran_no_step_prints_no_line():
  # A signal between two loops: the next one runs no step, returns no logs.
  step = tf.Variable(0, dtype=tf.int64)
  now = [0.0]
  stream = io.StringIO()
  progress = console.TrainProgress(
      global_step=step, total_steps=300, global_batch_size=8,
      start_time=0.0, clock=lambda: now[0], stream=stream)
  for steps, logs in ((1, {"loss": 1.0}), (99, {"loss": 0.5}), (0, {})):
    step.assign_add(steps)
    now[0] += 1.0
    progress(logs)
  lines = stream.getvalue().splitlines()
  assert len(lines) == 2, lines
  assert lines[-1].startswith("step 100/300 | loss 0.5 | "), lines


def test_the_progress_rate_does_not_swing_with_a_loop_that_also_saved():
  step = tf.Variable(0, dtype=tf.int64)
  now = [0.0]
  stream = io.StringIO()
  progress = console.TrainProgress(
      global_step=step, total_steps=10**6, global_batch_size=64,
      start_time=0.0, clock=lambda: now[0], stream=stream)
  # Plain loops of 10 ms, and every third one 1 s (a checkpoint, say).
  for loop in range(12):
    step.assign_add(10)
    now[0] += 1.0 if loop % 3 == 2 else 0.01
    progress({})
  rates = [float(line.split(" | ")[1].split()[0])
           for line in stream.getvalue().splitlines()[1:]]
  # From the first slow loop on, loop to loop: unsmoothed they swing 100x.
  steady = rates[2:]
  assert max(steady) / min(steady) < 3, rates


def test_a_long_evaluation_prints_its_batch_and_eta_every_few_seconds():
  now = [0.0]
  stream = io.StringIO()
  ticker = console.EvalTicker(total=50, every_seconds=10.0,
                              clock=lambda: now[0], stream=stream)
  ticker.begin(global_step=300)
  for _ in range(50):
    now[0] += 1.0
    ticker.tick()
  lines = stream.getvalue().splitlines()
  assert lines[0] == "eval @ step 300 | batch 10/50 | ETA 0:00:40"
  assert len(lines) == 5
  short = console.EvalTicker(total=-1, clock=lambda: now[0], stream=stream)
  short.begin(global_step=300)
  short.tick()  # Under 10 s: nothing printed.
  assert len(stream.getvalue().splitlines()) == 5


def test_each_evaluation_counts_its_own_batches():
  # One ticker serves every evaluation of a run (`CustomTrainer.eval_begin`).
  now = [0.0]
  stream = io.StringIO()
  ticker = console.EvalTicker(total=20, every_seconds=10.0,
                              clock=lambda: now[0], stream=stream)
  for step in (100, 200):
    ticker.begin(global_step=step)
    for _ in range(10):
      now[0] += 1.0
      ticker.tick()
  assert stream.getvalue().splitlines() == [
      "eval @ step 100 | batch 10/20 | ETA 0:00:10",
      "eval @ step 200 | batch 10/20 | ETA 0:00:10"]


@pytest.mark.parametrize("total", [-1, None])
def test_the_whole_validation_set_prints_its_batch_without_an_eta(total):
  # validation_steps=-1, TFM's "the whole set": how many is not known.
  now = [0.0]
  stream = io.StringIO()
  ticker = console.EvalTicker(total=total, every_seconds=10.0,
                              clock=lambda: now[0], stream=stream)
  ticker.begin(global_step=300)
  for _ in range(12):
    now[0] += 1.0
    ticker.tick()
  assert stream.getvalue().splitlines() == ["eval @ step 300 | batch 10"]


def test_nested_logs_keep_their_path_and_drop_what_is_not_a_scalar():
  logs = {"training_loss": tf.constant(0.5),
          "coco": {"AP": np.float32(0.25), "image": tf.zeros([2, 2])},
          "lvis": {"AP": 0.125}}
  assert scalars(logs) == {"training_loss": 0.5, "coco/AP": 0.25,
                                   "lvis/AP": 0.125}


def test_a_long_training_loop_says_where_it_is(launch_forked, tmp_path):
  # One loop of 800 steps (after the first step's), a line every 0.3 s
  # from the host while it runs; TFM's ImageNet loops last minutes.
  run = launch_forked(
      "--experiment=digits_convnet", "--mode=train",
      "--params_override=trainer.train_steps=800,trainer.steps_per_loop="
      "800,trainer.summary_interval=null,trainer.checkpoint_interval=800",
      model_dir=tmp_path / "m",
      env={"TFM_EXT_LOOP_PROGRESS_SECONDS": "0.3"})
  assert run.returncode == 0, run
  inside = [line for line in run.stdout.splitlines() if "| in loop |" in line]
  assert len(inside) >= 2, run.stdout
  steps = [int(line.split()[1].split("/")[0]) for line in inside]
  assert steps == sorted(steps) and 1 < steps[0] < steps[-1] <= 800, steps
  for line in inside:
    assert line.startswith("step ") and "/800 | in loop | " in line
    assert " ex/s | ETA " in line, line
  # The loop's own line still ends it.
  assert run.stdout.splitlines()[-2].startswith("step 800/800 | "), (
      run.stdout)
