"""What checking labels in the input costs a training step.

    python benchmarks/label_check.py [--smoke] [--busy=N] [--out=FILE]

`tfm_ext.training.labels.checked` adds one op to each batch of a
classification input: the min and max of its labels against
`[0, num_classes)`. For digits_convnet (its config: batch 64) and TFM's
`resnet_imagenet` (its config: ResNet-50 on 224x224 images, at batch 2, fed
the tests' tiny ImageNet, `_imagenet_records`), the task's own training
step (`task.train_step`, in a `tf.function` loop of `steps` steps) reads
the task's pipeline as it is (`plain`) and checked (`checked`), the two
interleaved in rounds, their order rotated each round. Per round and
variant: the process's CPU time per step (every thread: the input's and
the model's) and its wall time. Reported: the spread over rounds of each,
and of the paired ratio `checked / plain - 1`, the check's share of a
step's CPU, which decides (at most 1%: the label check stays on in every
loop; docs/failures.md).

On a shared machine that ratio's spread (a few %) is wider than the check
itself, so the check's own cost is measured apart too (`stage`): the same
batches held in memory (`cache`), drained `batches` at a time with and
without the check, interleaved; the difference per batch over the plain
step's median CPU is `stage_share_of_step_percent`.
"""

import os
import sys
import tempfile
import time
from typing import Any, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf
import tf_keras

from official.core import task_factory

import registry_imports  # pylint: disable=unused-import
from benchmarks import _common
from benchmarks import _imagenet_records
from tfm_ext.config import params as params_lib
from tfm_ext.training import labels

SIZES = {"digits_convnet": {"steps": 40, "rounds": 12, "batches": 5000},
         "resnet_imagenet": {"steps": 2, "rounds": 6, "batches": 5000}}
SMOKE_SIZES = {"digits_convnet": {"steps": 2, "rounds": 2, "batches": 50},
               "resnet_imagenet": {"steps": 1, "rounds": 1, "batches": 50}}


def _task_and_input(name: str, folder: str):
  """The experiment's task, model and training input, as its config says."""
  override = ""
  if name == "resnet_imagenet":
    _imagenet_records.write(folder, copies=2)
    override = (f"task.train_data.input_path={folder}/train-*,"
                "task.train_data.global_batch_size=2,"
                "runtime.mixed_precision_dtype=float32")
  params = params_lib.build(params_lib.ConfigSources(
      experiment=name, params_override=override))
  task = task_factory.get_task(params.task)
  return task, task.build_model(), task.build_inputs(params.task.train_data)


def _paired(run, iterators, count: int, rounds: int):
  """Per round, `{variant: (CPU s, wall s) per unit}` of `run(it, count)`,
  the variants' order rotated each round (after one warm-up call each)."""
  for iterator in iterators.values():  # Traced and warmed up.
    run(iterator, tf.constant(count))
  per_round = []
  for r in range(rounds):
    times = {}
    for variant in _common.rotated(list(iterators), r):
      cpu, wall = time.process_time(), time.perf_counter()
      run(iterators[variant], tf.constant(count))
      times[variant] = ((time.process_time() - cpu) / count,
                        (time.perf_counter() - wall) / count)
    per_round.append(times)
  return per_round


@tf.function
def _drain(iterator, count):
  for _ in tf.range(count):
    next(iterator)


def measure_one(name: str, steps: int, rounds: int,
                batches: int) -> Dict[str, Any]:
  """Paired rounds of `steps` steps on the plain and the checked input, and
  of `batches` batches of the check alone."""
  with tempfile.TemporaryDirectory() as folder:
    task, model, plain = _task_and_input(name, folder)
    classes = labels.num_classes(task)
    checked = labels.checked(plain, classes)
    assert checked is not plain, f"{name}: its labels are not checked"
    optimizer = tf_keras.optimizers.SGD(0.001)

    @tf.function
    def run(iterator, count):
      for _ in tf.range(count):
        task.train_step(next(iterator), model, optimizer)

    steps_paired = _paired(run, {"plain": iter(plain),
                                 "checked": iter(checked)}, steps, rounds)
    held = plain.take(8).cache().repeat()
    stage_paired = _paired(_drain, {
        "plain": iter(held), "checked": iter(labels.checked(held, classes))},
                           batches, rounds)
  cpu = {v: [t[v][0] for t in steps_paired] for v in ("plain", "checked")}
  stage = [1e6 * (t["checked"][0] - t["plain"][0]) for t in stage_paired]
  step_us = 1e6 * _common.median(cpu["plain"])
  return {
      "steps": steps, "rounds": rounds, "batches": batches,
      "cpu_ms_per_step": {v: _common.spread([1e3 * c for c in cpu[v]])
                          for v in cpu},
      "wall_ms_per_step": {v: _common.spread(
          [1e3 * t[v][1] for t in steps_paired]) for v in cpu},
      "check_share_of_cpu_percent": _common.spread(
          [100 * (c / p - 1) for c, p in zip(cpu["checked"], cpu["plain"])]),
      "stage_cpu_us_per_batch": _common.spread(stage),
      "stage_share_of_step_percent": _common.spread(
          [100 * us / step_us for us in stage]),
  }


def measure(sizes: Dict[str, Dict[str, int]]) -> Dict[str, Any]:
  results = {"machine": _common.machine()}
  for name, size in sizes.items():
    results[name] = measure_one(name, **size)
    one = results[name]
    plain = one["cpu_ms_per_step"]["plain"]["median"]
    print(f"{name}: plain step {plain:.2f} ms CPU; label check, paired "
          f"steps: {_said(one['check_share_of_cpu_percent'], '%')}; the "
          f"check alone: {_said(one['stage_cpu_us_per_batch'], ' us')} a "
          f"batch, {_said(one['stage_share_of_step_percent'], '%')} of a "
          "step", flush=True)
  return results


def _said(spread: Dict[str, float], unit: str) -> str:
  return (f"{spread['median']:+.2f}{unit} (IQR {spread['q1']:+.2f}.."
          f"{spread['q3']:+.2f}; {spread['min']:+.2f}..{spread['max']:+.2f}; "
          f"{spread['n']} rounds)")


if __name__ == "__main__":
  _common.sized_main(__doc__, measure, SIZES, SMOKE_SIZES)
