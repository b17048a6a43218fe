"""Checkpoint cost: size and save time, with and without the input iterator.

    python benchmarks/checkpoint_cost.py [--smoke] [--busy=N] [--out=FILE]

digits_convnet: trainers built as `tfm_ext.run.driver` builds them (the
launcher's config, its strategy, `train_utils.create_trainer` with the
registered trainer), with `trainer.checkpoint_input_iterator` true and false,
trained `interval` steps (buffers full, optimizer slots made), then saved
through a `tf.train.CheckpointManager` as TFM's runner makes it: bytes on
disk and the median of several synchronous saves (the first, which traces
the save functions, apart), the two trainers' saves interleaved. Beside
them, the time those `interval` steps train, and the blocking part of an
asynchronous save (`CheckpointOptions(experimental_enable_async_checkpoint=
True)`), which our driver does not use.

ResNet50: the model and optimizer checkpoint of the `resnet50_imagenet_ctl`
trainer (no iterator: the experiment refuses it for real data), and the
state of its training input pipeline on JPEG TFRecords at several shuffle
buffer sizes. That pipeline crops with stateful random ops, which tf.data
refuses to save (the error is recorded); its size is measured with
`experimental_external_state_policy = ExternalStatePolicy.IGNORE`, which
saves the buffers but not the random ops' state.
"""

import glob
import os
import sys
import tempfile
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf

from official.core import task_factory
from official.core import train_utils

import registry_imports  # pylint: disable=unused-import
from benchmarks import _common
from benchmarks import _imagenet_records
from experiments.imagenet import input_pipeline
from tfm_ext.config import params as params_lib
from tfm_ext.run import strategies
from tfm_ext.training import trainers
# pylint: enable=g-import-not-at-top,wrong-import-position

SIZES = {"saves": 7, "shuffle_buffers": [16, 128, 1024], "batch_size": 32,
         "iterator_saves": 3}
SMOKE_SIZES = {"saves": 2, "shuffle_buffers": [16, 128], "batch_size": 8,
               "iterator_saves": 1}
RESNET_OVERRIDE = ("task.train_data.use_synthetic_data=true,"
                   "task.validation_data.use_synthetic_data=true")


def build_trainer(experiment: str, params_override: str):
  """The params, strategy and trainer `tfm_ext.run.driver` would build."""
  params = params_lib.build(params_lib.ConfigSources(
      experiment=experiment, params_override=params_override))
  strategy = strategies.build_strategy(params)
  with strategy.scope():
    task = task_factory.get_task(params.task)
    trainer = train_utils.create_trainer(
        params, task, train=True, evaluate=False,
        trainer_cls=trainers.get_trainer(params.trainer.name))
  return params, strategy, trainer


def checkpoint_bytes(prefix: str) -> int:
  """Bytes on disk of the checkpoint at `prefix` (index and data files)."""
  return sum(os.path.getsize(f) for f in glob.glob(prefix + ".*"))


class Saver:
  """Saves one checkpoint over and over, as TFM's runner would, and times it."""

  def __init__(self, checkpoint: tf.train.Checkpoint, directory: str,
               options=None):
    self._manager = tf.train.CheckpointManager(checkpoint, directory,
                                               max_to_keep=1)
    self._options = options
    self._checkpoint = checkpoint
    self.seconds: List[float] = []
    self.first_seconds = None
    self.bytes = None

  def save(self) -> None:
    """Saves once; the first save's time is kept apart (it traces)."""
    start = time.perf_counter()
    prefix = self._manager.save(options=self._options)
    seconds = time.perf_counter() - start
    if self._options is not None:
      self._checkpoint.sync()  # Wait for the background write: not timed.
    if self.first_seconds is None:
      self.first_seconds = seconds
    else:
      self.seconds.append(seconds)
    self.bytes = checkpoint_bytes(prefix)

  def figures(self) -> Dict[str, Any]:
    return {"bytes": self.bytes, "save_seconds": _common.median(self.seconds),
            "first_save_seconds": self.first_seconds,
            "saves": len(self.seconds)}


def interleaved(savers: Dict[str, Saver], saves: int) -> Dict[str, Any]:
  """Saves each `saves + 1` times, round-robin; returns their figures."""
  for _ in range(saves + 1):
    for saver in savers.values():
      saver.save()
  return {name: saver.figures() for name, saver in savers.items()}


def digits(sizes: Dict[str, int], directory: str) -> Dict[str, Any]:
  """digits_convnet checkpoints with and without the input iterator."""
  built = {}
  for with_iterator in (True, False):
    built[with_iterator] = build_trainer(
        "digits_convnet",
        f"trainer.checkpoint_input_iterator={str(with_iterator).lower()}")
  params = built[True][0]
  interval = params.trainer.checkpoint_interval
  train_seconds = {}
  for with_iterator, (_, strategy, trainer) in built.items():
    with strategy.scope():
      trainer.train(tf.constant(interval))  # Traces; fills the buffers.
      start = time.perf_counter()
      trainer.train(tf.constant(interval))
      trainer.global_step.numpy()
      train_seconds[with_iterator] = time.perf_counter() - start
  async_options = tf.train.CheckpointOptions(
      experimental_enable_async_checkpoint=True)
  savers = {
      "with_iterator": Saver(built[True][2].checkpoint,
                             os.path.join(directory, "digits_with")),
      "without_iterator": Saver(built[False][2].checkpoint,
                                os.path.join(directory, "digits_without")),
      "with_iterator_async_call": Saver(
          built[True][2].checkpoint,
          os.path.join(directory, "digits_async"), async_options),
  }
  out = interleaved(savers, sizes["saves"])
  out["iterator_in_checkpoint"] = built[True][2].checkpoints_input_iterator
  out["iterator_bytes"] = (out["with_iterator"]["bytes"]
                           - out["without_iterator"]["bytes"])
  out["checkpoint_interval_steps"] = interval
  out["interval_train_seconds"] = _common.median(list(train_seconds.values()))
  out["save_over_interval"] = (out["with_iterator"]["save_seconds"]
                               / out["interval_train_seconds"])
  out["shuffle_buffer_size"] = params.task.train_data.shuffle_buffer_size
  return out


def resnet50_model(sizes: Dict[str, int], directory: str) -> Dict[str, Any]:
  """The ResNet50 trainer's checkpoint: step, model, optimizer with slots."""
  _, strategy, trainer = build_trainer("resnet50_imagenet_ctl",
                                       RESNET_OVERRIDE)
  variables = trainer.model.trainable_variables
  # A zero update creates the momentum slots without tracing a whole step.
  with strategy.scope():
    strategy.run(lambda: trainer.optimizer.apply_gradients(
        zip([tf.zeros_like(v) for v in variables], variables)))
  saver = Saver(trainer.checkpoint, os.path.join(directory, "resnet"))
  return interleaved({"model_and_optimizer": saver},
                     sizes["saves"])["model_and_optimizer"]


def resnet50_iterator(sizes: Dict[str, int], directory: str
                      ) -> Dict[str, Any]:
  """The ResNet50 training pipeline's iterator state by shuffle buffer."""
  buffers = sizes["shuffle_buffers"]
  copies = -(-max(buffers) // _imagenet_records.NUM_TRAIN_IMAGES)
  files = _imagenet_records.write(os.path.join(directory, "records"), copies)
  ignore = tf.data.Options()
  ignore.experimental_external_state_policy = (
      tf.data.experimental.ExternalStatePolicy.IGNORE)

  def iterator(buffer: int, options=None):
    dataset = input_pipeline.build_dataset(input_pipeline.ImageNetDataConfig(
        input_path=",".join(files["train"]), is_training=True,
        global_batch_size=sizes["batch_size"], drop_remainder=True,
        shuffle_buffer_size=buffer))
    it = iter(dataset.with_options(options) if options else dataset)
    next(it)  # The shuffle buffer fills before the first batch comes out.
    return it

  out = {"records": copies * _imagenet_records.NUM_TRAIN_IMAGES,
         "record_bytes": sum(os.path.getsize(f) for f in files["train"]),
         "batch_size": sizes["batch_size"],
         "decoded_batch_bytes": (sizes["batch_size"] * input_pipeline.IMAGE_SIZE
                                 ** 2 * input_pipeline.NUM_CHANNELS * 4)}
  try:
    tf.train.Checkpoint(iterator=iterator(min(buffers))).write(
        os.path.join(directory, "refused"))
    out["default_policy_error"] = None
  except tf.errors.OpError as e:
    out["default_policy_error"] = e.message.splitlines()[0]
  by_buffer = {}
  for buffer in buffers:
    checkpoint = tf.train.Checkpoint(iterator=iterator(buffer, ignore))
    seconds = []
    for i in range(sizes["iterator_saves"]):
      prefix = os.path.join(directory, f"iterator_{buffer}_{i}")
      start = time.perf_counter()
      checkpoint.write(prefix)
      seconds.append(time.perf_counter() - start)
    by_buffer[str(buffer)] = {"bytes": checkpoint_bytes(prefix),
                              "save_seconds": _common.median(seconds)}
    for f in glob.glob(os.path.join(directory, f"iterator_{buffer}_*")):
      os.remove(f)
  out["by_shuffle_buffer"] = by_buffer
  return out


def measure(sizes: Dict[str, Any]) -> Dict[str, Any]:
  """All three measurements, in a scratch directory."""
  with tempfile.TemporaryDirectory() as directory:
    out = {"sizes": sizes,
           "digits_convnet": digits(sizes, directory),
           "resnet50_model": resnet50_model(sizes, directory),
           "resnet50_iterator": resnet50_iterator(sizes, directory)}
  d = out["digits_convnet"]
  print(f"digits_convnet: {d['with_iterator']['bytes']} B with the iterator, "
        f"{d['without_iterator']['bytes']} B without; saves "
        f"{d['with_iterator']['save_seconds'] * 1e3:.1f} / "
        f"{d['without_iterator']['save_seconds'] * 1e3:.1f} ms", flush=True)
  r = out["resnet50_model"]
  print(f"resnet50 model+optimizer: {r['bytes'] / 2**20:.0f} MiB, "
        f"{r['save_seconds']:.2f} s", flush=True)
  for buffer, figures in out["resnet50_iterator"]["by_shuffle_buffer"].items():
    print(f"resnet50 iterator, shuffle buffer {buffer}: "
          f"{figures['bytes'] / 2**20:.1f} MiB, "
          f"{figures['save_seconds']:.2f} s", flush=True)
  return out


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark; see the module docstring."""
  return _common.sized_main(__doc__, measure, SIZES, SMOKE_SIZES, argv)


if __name__ == "__main__":
  main()
