"""The `resnet_ctl` trainer: what the reference `ResnetRunnable` adds to a loop.

TFM's legacy ResNet runner wraps its loop in an `EpochHelper` and a Keras
`TimeHistory` callback. `ResnetCtlTrainer` does the same through
`CustomTrainer`'s hooks, once per loop of `num_steps` steps:

    train(num_steps)        note the loop's length (Orbit's entry point)
      train_loop_begin()    start the throughput window; start the profiler
                            if the loop meets `profile_steps`
      ...num_steps steps...
      train_loop_end()      logs += epoch, and once `log_steps` steps have
                            passed, examples_per_second (with the
                            reference's "TimeHistory: ..." log line); stop
                            the profiler after its last step

The values land in the console line, TensorBoard and `run_summary.json`
like any other training log.
"""

import dataclasses
import os
import time
from typing import Optional, Tuple

from absl import logging
import tensorflow as tf

import tfm_ext
from tfm_ext import console


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


@tfm_ext.register_trainer("resnet_ctl")
class ResnetCtlTrainer(tfm_ext.CustomTrainer):
  """`CustomTrainer` plus the reference runner's epoch, throughput, profile.

  Reads `trainer.log_steps` and `trainer.profile_steps` when the config has
  them (`ResnetCtlTrainerConfig`), and the epoch length from
  `task.train_data.num_examples` when the data config has it.
  """

  def __init__(self, config, task, model, optimizer, **kwargs):
    super().__init__(config, task, model, optimizer, **kwargs)
    self._log_steps = getattr(config.trainer, "log_steps", 100)
    self._profile_window = parse_profile_steps(
        getattr(config.trainer, "profile_steps", ""))
    if self._profile_window and not task.logging_dir:
      logging.warning("profile_steps is set but the task has no logging_dir "
                      "to write to; not profiling.")
      self._profile_window = None
    self._profiling = False
    data = config.task.train_data
    self._global_batch = data.global_batch_size
    num_examples = getattr(data, "num_examples", 0)
    self._steps_per_epoch = (num_examples // self._global_batch
                             if self._global_batch else 0)
    self._window_start: Optional[Tuple[int, float]] = None  # (step, time)
    self._loop_steps = 1

  def train(self, num_steps):
    """Orbit's entry point for one loop; notes its length for the profiler."""
    self._loop_steps = int(num_steps)
    return super().train(num_steps)

  def train_loop_begin(self):
    """Starts the throughput window, and the profiler for a profiled loop."""
    super().train_loop_begin()
    step = int(self.global_step.numpy())
    if self._loop_meets_profile_window(step + 1, step + self._loop_steps):
      self._profiling = True
      logdir = os.path.join(self.task.logging_dir, "train")
      logging.info("Profiling from step %d into %s.", step + 1, logdir)
      tf.profiler.experimental.start(logdir)
    if self._window_start is None:
      self._window_start = (step, time.time())

  def train_loop_end(self):
    """Adds `epoch` and, every `log_steps` steps, `examples_per_second`."""
    logs = super().train_loop_end()
    step = int(self.global_step.numpy())
    if self._profiling and step >= min(self._profile_window[1],
                                       self.config.trainer.train_steps):
      tf.profiler.experimental.stop()
      self._profiling = False
      self._profile_window = None
      logging.info("Profiling stopped after step %d.", step)
    if self._steps_per_epoch:
      logs["epoch"] = step / self._steps_per_epoch
    start_step, start_time = self._window_start
    steps = step - start_step
    if steps >= self._log_steps:
      seconds = time.time() - start_time
      examples_per_second = console.examples_per_second(
          steps, seconds, self._global_batch)
      logging.info("TimeHistory: %.2f seconds, %.2f examples/second between "
                   "steps %d and %d", seconds, examples_per_second,
                   start_step, step)
      logs["examples_per_second"] = examples_per_second
      self._window_start = None
    return logs

  def _loop_meets_profile_window(self, first_step: int, last_step: int
                                 ) -> bool:
    if self._profiling or self._profile_window is None:
      return False
    first, last = self._profile_window
    return first_step <= last and last_step >= first
