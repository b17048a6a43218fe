"""What a training loop costs besides the model, piece by piece.

    python benchmarks/loop_costs.py [--smoke] [--busy=N] [--out=FILE]

Between two loops of `steps_per_loop` steps the device waits while the host
reads the loop's metrics, writes its summaries and reads the global step
(Orbit's controller, the progress line and the summaries read it about ten
times). On the digits_convnet trainer as `tfm_ext.run.driver` builds it (the
launcher's config and strategy: on one CPU, no strategy), after a few loops
of training, the median per-call time of:

    summaries          one loop's outputs (4 logs and steps_per_second)
                       written and flushed: Orbit's `SummaryManager` with
                       `tf.summary.scalar` and a `MirroredStrategy` global
                       step (TFM's runner on its one-replica mirror, or any
                       mirrored run), against our `ScalarSummaryManager` with
                       `strategies.host_readable`'s step (as our driver does)
    global_step_read   `numpy()` of that `MirroredVariable` step against
                       `strategies.host_readable`'s (no strategy's plain step
                       reads as fast)
    read_train_logs    `CustomTrainer.read_train_logs` (metric results and
                       resets, learning rate) run eagerly against as the
                       `tf.function` `train_loop_end` runs from its second
                       call
    empty_loop         `trainer.train(0)`: a loop of no steps (the loop
                       function's call and `train_loop_end`), the fixed cost
                       of a loop beside the pieces above
    step               seconds per step in loops of `loop_steps` steps:
                       `CustomTrainer` (the non-finite check reads the loop's
                       mean loss at its end) against a trainer that checks
                       each step's loss in the step and keeps the first bad
                       step in a variable (ours until this benchmark)
    loop_progress      seconds per step in such loops with the progress
                       line's thread (`console.LoopTicker`) reading the step
                       every 10 ms (3000 times its default rate) against
                       none

Calls are timed in rounds, the variants of a piece interleaved; figures are
medians over rounds of each round's mean.
"""

import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np
import orbit
import tensorflow as tf

from benchmarks import _common
from benchmarks import checkpoint_cost
from tfm_ext.base import console
from tfm_ext.base import devices
from tfm_ext.run import strategies
from tfm_ext.training import custom_trainer
from tfm_ext.training import summaries
from tfm_ext.training import trainers
# pylint: enable=g-import-not-at-top,wrong-import-position

SIZES = {"rounds": 9, "calls": 200, "step_rounds": 12, "loop_steps": 300}
SMOKE_SIZES = {"rounds": 2, "calls": 10, "step_rounds": 2, "loop_steps": 10}
LOOP_OUTPUTS = {"accuracy": np.float32(0.98), "training_loss": np.float32(0.05),
                "learning_rate": np.float32(0.002),
                "steps_per_second": 160.5}


@trainers.register_trainer("per_step_nonfinite_check")
class PerStepCheckTrainer(custom_trainer.CustomTrainer):
  """Checks each step's loss in the step, keeping the first bad step."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.first_nonfinite_step = tf.Variable(
        0, dtype=tf.int64, trainable=False,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def _run_replicas_eagerly_or_traced(self, inputs):
    def step_fn(inputs):
      logs = self._task_train_step(inputs, model=self.model,
                                   optimizer=self.optimizer,
                                   metrics=self.train_metrics)
      loss = logs[self.task.loss]
      self.train_loss.update_state(loss)
      self.global_step.assign_add(1)
      first_bad = tf.logical_and(
          tf.logical_not(tf.reduce_all(tf.math.is_finite(loss))),
          tf.equal(self.first_nonfinite_step, 0))
      self.first_nonfinite_step.assign(
          tf.where(first_bad, tf.cast(self.global_step, tf.int64),
                   self.first_nonfinite_step))

    self.strategy.run(step_fn, args=(inputs,), options=self._runtime_options)


def interleaved(variants: Dict[str, Callable[[], Any]],
                sizes: Dict[str, int]) -> Dict[str, float]:
  """Median over rounds of each variant's mean seconds per call."""
  means = {name: [] for name in variants}
  for fn in variants.values():
    fn()  # Traces or opens what the first call does.
  for _ in range(sizes["rounds"]):
    for name, fn in variants.items():
      start = time.perf_counter()
      for _ in range(sizes["calls"]):
        fn()
      means[name].append((time.perf_counter() - start) / sizes["calls"])
  return {name: _common.median(values) for name, values in means.items()}


def measure(sizes: Dict[str, Any]) -> Dict[str, Any]:
  """Every piece of the docstring, on a digits_convnet trainer."""
  _, strategy, trainer = checkpoint_cost.build_trainer(
      "digits_convnet", "trainer.steps_per_loop=10")
  for _ in range(3):  # Traces the loop and, at the second end, the reads.
    trainer.train(tf.constant(10))
  # What `host_readable` is for: a mirrored step (one replica here).
  mirror = tf.distribute.MirroredStrategy(["/cpu:0"])
  with mirror.scope():
    step = orbit.utils.create_global_step()
  step.assign(trainer.global_step.numpy())
  local_step = strategies.host_readable(step, mirror)

  def writer(manager_cls, global_step):
    manager = manager_cls(tempfile.mkdtemp(prefix="bench_summaries_"),
                          tf.summary.scalar, global_step=global_step)

    def write():
      manager.write_summaries(LOOP_OUTPUTS)
      manager.flush()

    return write

  traced_reads = devices.traced_or_eager(trainer.read_train_logs)
  no_steps = tf.constant(0)
  out = {
      "sizes": sizes,
      "strategy": strategies.describe_strategy(strategy),
      "summaries": interleaved({
          "orbit": writer(orbit.utils.SummaryManager, step),
          "ours": writer(summaries.ScalarSummaryManager, local_step)}, sizes),
      "global_step_read": interleaved({
          "orbit": step.numpy, "ours": local_step.numpy}, sizes),
      "read_train_logs": interleaved({
          "eager": trainer.read_train_logs, "traced": traced_reads}, sizes),
      "empty_loop": interleaved({
          "ours": lambda: trainer.train(no_steps)}, sizes),
  }
  loop = tf.constant(sizes["loop_steps"])
  per_step_check = checkpoint_cost.build_trainer(
      "digits_convnet",
      "trainer.steps_per_loop=10,trainer.name=per_step_nonfinite_check")[2]
  per_step_check.train(tf.constant(1))
  steps = interleaved({"ours": lambda: trainer.train(loop),
                       "per_step_check": lambda: per_step_check.train(loop)},
                      {"rounds": sizes["step_rounds"], "calls": 1})
  out["step"] = {name: seconds / sizes["loop_steps"]
                 for name, seconds in steps.items()}
  # The progress line inside a loop: its thread reads the step every 10 ms
  # here, 3000 times the default's rate (one read in 30 s).
  ticking = console.LoopTicker(
      global_step=strategies.host_readable(trainer.global_step, strategy),
      total_steps=10**9, global_batch_size=64, every_seconds=0.01,
      stream=open(os.devnull, "w")).around(trainer.train)  # pylint: disable=consider-using-with
  steps = interleaved({"off": lambda: trainer.train(loop),
                       "every_10ms": lambda: ticking(loop)},
                      {"rounds": sizes["step_rounds"], "calls": 1})
  out["loop_progress"] = {name: seconds / sizes["loop_steps"]
                          for name, seconds in steps.items()}
  for piece in ("summaries", "global_step_read", "read_train_logs",
                "empty_loop", "step", "loop_progress"):
    print(piece, {k: f"{v * 1e3:.3f} ms" for k, v in out[piece].items()},
          flush=True)
  return out


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark; see the module docstring."""
  return _common.sized_main(__doc__, measure, SIZES, SMOKE_SIZES, argv)


if __name__ == "__main__":
  main()
