"""Console progress: one line per event, as Keras and Lightning users expect.

`TrainProgress` and `EvalProgress` are Orbit actions (plain callables on the
controller's outputs). They read the global step once per loop, never per
step, so they add no device-to-host sync inside the training loop. Orbit's
controller prints each of its own lines to stdout and logs it too;
`quiet_orbit_controller` keeps them in the log only, so each event reaches
the console once.
"""

import sys
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, TextIO

from absl import logging
from orbit import controller as orbit_controller

from tfm_ext.base import settings
from tfm_ext.base.logs import scalars


def quiet_orbit_controller() -> None:
  """Sends Orbit's controller lines to the absl log only, not also stdout.

  Orbit prints and logs each line through its module's `_log` and has no
  public switch; the progress actions print their own lines, so each event
  would reach the console twice. This is the one place that replaces it.
  """
  orbit_controller._log = logging.info  # pylint: disable=protected-access


def examples_per_second(steps: int, seconds: float,
                        global_batch_size: int) -> Optional[float]:
  """Examples a second of `steps` global batches in `seconds` (None if 0).

  Every replica's step sees `global_batch_size / num_replicas_in_sync`
  rows, so a step is one global batch whatever the strategy.
  """
  if steps <= 0 or seconds <= 0:
    return None
  return steps * global_batch_size / seconds


def _format_logs(logs: Mapping[str, float]) -> str:
  return " | ".join(f"{k} {v:.4g}" for k, v in logs.items())


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class TrainProgress:
  """Prints `step N/T | <logs> | X ex/s | ETA h:mm:ss` after each train loop.

  Also measures what the run summary reports: time to the first step (from
  `start_time`) and examples per second in steady state, that is, over all
  loops after the first, which includes tracing.
  """

  def __init__(self, *, global_step, total_steps: int, global_batch_size: int,
               start_time: float, clock: Callable[[], float] = time.time,
               stream: Optional[TextIO] = None):
    self._global_step = global_step
    self._total_steps = total_steps
    self._batch = global_batch_size
    self._start_time = start_time
    self._clock = clock
    self._stream = stream or sys.stdout
    self._last: Optional[tuple] = None  # (step, time) at the previous loop end.
    self._steady: Optional[tuple] = None  # (step, time) at the first loop end.
    self._smoothed: Optional[tuple] = None  # (steps, seconds) a loop, averaged.
    self.time_to_first_step: Optional[float] = None
    self.examples_per_second: Optional[float] = None
    # Seconds left, as the last line said (None until a second loop ended).
    self.eta_seconds: Optional[float] = None
    self.last_logs: Dict[str, float] = {}

  def __call__(self, output: Mapping[str, Any]) -> None:
    now = self._clock()
    step = int(self._global_step.numpy())
    if self._last is not None and step == self._last[0] and not output:
      return  # A loop that ran no step (a signal came before it): no news.
    self.last_logs = scalars(output)
    parts = [f"step {step}/{self._total_steps}"]
    if self.last_logs:
      parts.append(_format_logs(self.last_logs))
    if self._steady is None:
      self._steady = (step, now)
      self.time_to_first_step = now - self._start_time
      parts.append(f"first step after {self.time_to_first_step:.1f}s")
    else:
      loop_rate = self._smoothed_rate(step - self._last[0],
                                      now - self._last[1])
      if loop_rate is not None:
        parts.append(f"{loop_rate:.0f} ex/s")
      steady_steps, steady_seconds = (step - self._steady[0],
                                      now - self._steady[1])
      steady_rate = examples_per_second(steady_steps, steady_seconds,
                                        self._batch)
      if steady_rate is not None:
        self.examples_per_second = steady_rate
        # From steps, not examples: a task may leave global_batch_size 0.
        remaining = max(self._total_steps - step, 0)
        self.eta_seconds = remaining * steady_seconds / steady_steps
        parts.append(f"ETA {_format_duration(self.eta_seconds)}")
    self._last = (step, now)
    print(" | ".join(parts), file=self._stream, flush=True)

  def _smoothed_rate(self, steps: int, seconds: float) -> Optional[float]:
    """Examples a second over recent loops, weighted toward the latest.

    Steps and seconds are averaged separately (exponentially, weight
    `SMOOTHING` on the latest loop), so a loop that also saved a checkpoint
    or evaluated moves the figure by a fraction, not by the whole gap
    between a small model's plain loop and that one.
    """
    if steps <= 0 or seconds <= 0:
      return None
    if self._smoothed is None:
      self._smoothed = (float(steps), seconds)
    else:
      self._smoothed = tuple(
          SMOOTHING * new + (1 - SMOOTHING) * old
          for new, old in zip((steps, seconds), self._smoothed))
    return examples_per_second(*self._smoothed, self._batch)


# Weight of the latest loop in the ex/s of the progress line.
SMOOTHING = 0.3


class LoopTicker:
  """Prints `step N/T | in loop | X ex/s | ETA h:mm:ss` inside a long loop.

  TFM's ImageNet configs run thousands of steps a loop: the loop's line
  (`TrainProgress`) comes once in many minutes. `around(train)` wraps the
  trainer's `train(num_steps)`: while a loop runs, a thread of the host
  reads the global step every `every_seconds` (0: never; by default
  `loop_progress_seconds`, `tfm_ext.base.settings`) and prints the
  rate and the time left since the loop began. The step's own work is not
  touched: a read of one variable every 30 s. Where a loop runs on a
  device that answers only at its end (a TPU), the thread waits with it
  and says nothing.
  """

  def __init__(self, *, global_step, total_steps: int, global_batch_size: int,
               every_seconds: Optional[float] = None,
               clock: Callable[[], float] = time.monotonic,
               stream: Optional[TextIO] = None):
    self._global_step = global_step
    self._total_steps = total_steps
    self._batch = global_batch_size
    self._every = (settings.get().loop_progress_seconds
                   if every_seconds is None else every_seconds)
    self._clock = clock
    self._stream = stream or sys.stdout
    self.lines = 0

  def around(self, train: Callable[[Any], Any]) -> Callable[[Any], Any]:
    if self._every <= 0:
      return train

    def train_saying_progress(num_steps):
      if int(num_steps) <= 1:  # The first step's loop: its own line says.
        return train(num_steps)
      done = threading.Event()
      thread = threading.Thread(
          target=self._tick, args=(done, int(self._global_step.numpy()),
                                   self._clock()),
          name="tfm_ext_loop_progress", daemon=True)
      thread.start()
      try:
        return train(num_steps)
      finally:
        done.set()

    return train_saying_progress

  def _tick(self, done: threading.Event, start_step: int,
            start: float) -> None:
    while not done.wait(self._every):
      try:
        step = int(self._global_step.numpy())
      except Exception:  # pylint: disable=broad-except
        return  # The run is ending; its own lines say how.
      seconds = self._clock() - start
      steps = step - start_step
      if done.is_set():
        return
      if steps <= 0:  # Still tracing, or waiting for its input: no rate.
        continue
      parts = [f"step {step}/{self._total_steps}", "in loop"]
      rate = examples_per_second(steps, seconds, self._batch)
      if rate is not None:
        parts.append(f"{rate:.0f} ex/s")
      remaining = max(self._total_steps - step, 0)
      parts.append(f"ETA {_format_duration(remaining * seconds / steps)}")
      print(" | ".join(parts), file=self._stream, flush=True)
      self.lines += 1


class EvalTicker:
  """Prints `eval @ step N | batch b/B | ETA h:mm:ss` during a long evaluation.

  `begin` at the start of an evaluation, `tick` after each batch (from the
  host: `CustomTrainer.eval_reduce`); a line every `every_seconds`, so an
  evaluation shorter than that prints none. `total` of -1 or None (the whole
  validation set) gives no ETA.
  """

  def __init__(self, *, total: Optional[int], every_seconds: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               stream: Optional[TextIO] = None):
    self._total = total if total and total > 0 else None
    self._every = every_seconds
    self._clock = clock
    self._stream = stream or sys.stdout
    self._step = self._batches = 0
    self._start = self._printed = 0.0

  def begin(self, global_step: int) -> None:
    self._step, self._batches = global_step, 0
    self._start = self._printed = self._clock()

  def tick(self) -> None:
    self._batches += 1
    now = self._clock()
    if now - self._printed < self._every:
      return
    self._printed = now
    parts = [f"eval @ step {self._step}", f"batch {self._batches}" + (
        f"/{self._total}" if self._total else "")]
    if self._total:
      left = (self._total - self._batches) * (now - self._start) / self._batches
      parts.append(f"ETA {_format_duration(left)}")
    print(" | ".join(parts), file=self._stream, flush=True)


class EvalProgress:
  """Prints `eval @ step N | <logs>` after each evaluation."""

  def __init__(self, *, global_step, stream: Optional[TextIO] = None):
    self._global_step = global_step
    self._stream = stream or sys.stdout
    self.last_logs: Dict[str, float] = {}

  def __call__(self, output: Mapping[str, Any]) -> None:
    self.last_logs = scalars(output)
    step = int(self._global_step.numpy())
    print(f"eval @ step {step} | {_format_logs(self.last_logs)}",
          file=self._stream, flush=True)
