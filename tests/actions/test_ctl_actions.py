"""The reference runner's loop extras as actions: epoch, throughput, profile.

Driven as Orbit drives them, once per loop, with an injected clock and
profiler; `test_resnet_compat_launcher.py` runs them for real.
"""

import tensorflow as tf

from experiments.imagenet import ctl_trainer


def _loops(step, actions, ends, output=None):
  """Runs `actions` after loops ending at each of `ends`; returns outputs."""
  outputs = []
  for end in ends:
    step.assign(end)
    output = {}
    for action in actions:
      action(output)
    outputs.append(output)
  return outputs


def test_epoch_is_the_step_over_the_steps_of_an_epoch():
  step = tf.Variable(0, dtype=tf.int64)
  epoch = ctl_trainer.Epoch(lambda: int(step.numpy()), steps_per_epoch=8)
  assert [o["epoch"] for o in _loops(step, [epoch], (1, 4, 12))] == [
      0.125, 0.5, 1.5]


def test_time_history_reports_every_log_steps_from_the_last_report():
  step = tf.Variable(0, dtype=tf.int64)
  now = [10.0]
  history = ctl_trainer.TimeHistory(lambda: int(step.numpy()),
                                    global_batch_size=4, log_steps=10,
                                    clock=lambda: now[0])
  outputs = []
  for end, seconds in ((1, 3.0), (5, 1.0), (10, 1.0), (15, 2.0), (20, 3.0)):
    now[0] += seconds
    outputs += _loops(step, [history], [end])
  rates = [o.get("examples_per_second") for o in outputs]
  # Steps 0-10 in 5 s, then 10-20 in 5 s: 40 examples a window.
  assert rates == [None, None, 8.0, None, 8.0]


def test_profile_covers_the_loops_that_meet_its_window():
  step = tf.Variable(0, dtype=tf.int64)
  calls = []
  profile = ctl_trainer.Profile(
      lambda: int(step.numpy()), window=(12, 14), logdir="/logs",
      steps_per_loop=5, train_steps=30,
      start=lambda logdir: calls.append(("start", int(step.numpy()))),
      stop=lambda: calls.append(("stop", int(step.numpy()))))
  assert calls == []  # The first loop, step 1, is outside the window.
  # Loops end at 1, 5, 10, 15, 20: steps 11-15 hold the window.
  _loops(step, [profile], (1, 5, 10, 15, 20))
  assert calls == [("start", 10), ("stop", 15)]


def test_a_window_at_the_first_step_starts_before_the_first_loop():
  step = tf.Variable(0, dtype=tf.int64)
  calls = []
  profile = ctl_trainer.Profile(
      lambda: int(step.numpy()), window=(1, 2), logdir="/logs",
      steps_per_loop=5, train_steps=30,
      start=lambda logdir: calls.append("start"),
      stop=lambda: calls.append("stop"))
  assert calls == ["start"]
  _loops(step, [profile], (1, 5, 10))
  assert calls == ["start", "stop"]
