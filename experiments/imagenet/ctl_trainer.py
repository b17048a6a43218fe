"""What the reference `ResnetRunnable` adds to a loop, as train actions.

TFM's legacy ResNet runner wraps its loop in an `EpochHelper`, a Keras
`TimeHistory` callback and a profiler. None of it is model logic, so here
each is an Orbit train action (`tfm_ext.register_action`), built for every
run whose trainer config has the reference's fields
(`ResnetCtlTrainerConfig`), whichever trainer runs. After each loop:

    epoch          logs["epoch"] = step / steps per epoch
                   (task.train_data.num_examples // global batch)
    time_history   once `log_steps` steps have passed since the last
                   report: logs["examples_per_second"] and the reference's
                   "TimeHistory: ..." log line
    profile        stops the profiler after the loop that ends
                   `profile_steps`, or starts it before the next loop if
                   that loop meets them (before the first loop: when the
                   run is assembled)

Registered actions run before the progress line and Orbit's summaries, so
the values land in the console line, TensorBoard and `run_summary.json` like
any training log. The `resnet_ctl` trainer is `CustomTrainer` itself.
"""

import dataclasses
import os
import time
from typing import Callable, Optional, Tuple

from absl import logging
import tensorflow as tf

import tfm_ext
from tfm_ext.base import console

Step = Callable[[], int]


@dataclasses.dataclass
class ResnetCtlTrainerConfig(tfm_ext.TrainerConfig):
  """`TrainerConfig` with the reference runner's logging options.

  Attributes:
    log_steps: Report examples per second once at least this many steps have
      run since the last report (checked at loop ends).
    profile_steps: `"first,last"` (1-based global steps) to profile into
      `<model_dir>/train/plugins/profile`, rounded out to whole loops; empty
      for none.
  """
  name: str = "resnet_ctl"
  log_steps: int = 100
  profile_steps: str = ""


def parse_profile_steps(text: str) -> Optional[Tuple[int, int]]:
  """Returns `(first, last)` from `"first,last"`, None if empty.

  Raises:
    ValueError: unless `text` is two positive integers, first <= last.
  """
  if not text:
    return None
  parts = str(text).split(",")
  try:
    first, last = (int(p) for p in parts)
  except ValueError:
    first = last = 0
  if len(parts) != 2 or not 0 < first <= last:
    raise ValueError(f"profile_steps must be 'first,last' with 0 < first <= "
                     f"last, e.g. '2,4'; got {text!r}.")
  return first, last


# Nothing in the reference's loop is ResNet's: its extras are the actions.
tfm_ext.register_trainer("resnet_ctl")(tfm_ext.CustomTrainer)


def _reads_reference_fields(context: tfm_ext.ActionContext) -> bool:
  return hasattr(context.params.trainer, "log_steps")


def _step(context: tfm_ext.ActionContext) -> Step:
  return lambda: int(context.trainer.global_step.numpy())


class Epoch:
  """Adds `epoch`: the global step over the steps of an epoch."""

  def __init__(self, step: Step, steps_per_epoch: int):
    self._step = step
    self._steps_per_epoch = steps_per_epoch

  def __call__(self, output) -> None:
    output["epoch"] = self._step() / self._steps_per_epoch


class TimeHistory:
  """Adds `examples_per_second` once `log_steps` steps have run since the last.

  The window starts when the action is built (tracing included, as the
  reference's first window) and again at each report.
  """

  def __init__(self, step: Step, global_batch_size: int, log_steps: int,
               clock: Callable[[], float] = time.time):
    self._step = step
    self._batch = global_batch_size
    self._log_steps = log_steps
    self._clock = clock
    self._start = (step(), clock())

  def __call__(self, output) -> None:
    step, now = self._step(), self._clock()
    start_step, start_time = self._start
    if step - start_step < self._log_steps:
      return
    seconds = now - start_time
    rate = console.examples_per_second(step - start_step, seconds,
                                       self._batch)
    logging.info("TimeHistory: %.2f seconds, %.2f examples/second between "
                 "steps %d and %d", seconds, rate or 0.0, start_step, step)
    output["examples_per_second"] = rate
    self._start = (step, now)


class Profile:
  """Profiles the loops that meet `window` (1-based global steps) into `logdir`.

  Loops end on multiples of `steps_per_loop` (`assembly.FirstStepThenEvery`),
  so the profile is rounded out to whole loops; a loop cut short by an
  evaluation may start it one loop early.
  """

  def __init__(self, step: Step, window: Tuple[int, int], logdir: str,
               steps_per_loop: int, train_steps: int,
               start=tf.profiler.experimental.start,
               stop=tf.profiler.experimental.stop):
    self._step = step
    self._first, self._last = window[0], min(window[1], train_steps)
    self._logdir = logdir
    self._steps_per_loop = steps_per_loop
    self._start, self._stop = start, stop
    self._profiling = False
    self._done = self._first > self._last
    # The first loop of a process is its next step alone.
    self._maybe_start(self._step() + 1, self._step() + 1)

  def __call__(self, output) -> None:
    del output
    step = self._step()
    if self._profiling and step >= self._last:
      self._stop()
      self._profiling, self._done = False, True
      logging.info("Profiling stopped after step %d.", step)
    next_end = step + self._steps_per_loop - step % self._steps_per_loop
    self._maybe_start(step + 1, next_end)

  def _maybe_start(self, first_step: int, last_step: int) -> None:
    if self._profiling or self._done:
      return
    if first_step <= self._last and last_step >= self._first:
      logging.info("Profiling from step %d into %s.", first_step,
                   self._logdir)
      self._start(self._logdir)
      self._profiling = True


@tfm_ext.register_action("resnet_ctl_epoch", phase="train")
def epoch(context: tfm_ext.ActionContext) -> Optional[Epoch]:
  data = context.params.task.train_data
  num_examples = getattr(data, "num_examples", 0)
  if not (_reads_reference_fields(context) and num_examples
          and data.global_batch_size):
    return None
  return Epoch(_step(context), num_examples // data.global_batch_size)


@tfm_ext.register_action("resnet_ctl_time_history", phase="train")
def time_history(context: tfm_ext.ActionContext) -> Optional[TimeHistory]:
  if not _reads_reference_fields(context):
    return None
  return TimeHistory(_step(context),
                     context.params.task.train_data.global_batch_size,
                     context.params.trainer.log_steps)


@tfm_ext.register_action("resnet_ctl_profile", phase="train")
def profile(context: tfm_ext.ActionContext) -> Optional[Profile]:
  trainer = context.params.trainer
  window = parse_profile_steps(getattr(trainer, "profile_steps", ""))
  if window is None:
    return None
  if not context.chief:  # Only the chief writes where a user looks.
    return None
  return Profile(_step(context), window,
                 os.path.join(context.model_dir, "train"),
                 trainer.steps_per_loop, trainer.train_steps)
