"""The trainer's training input: one host pipeline per worker.

A `tf.distribute` iterator cannot be checkpointed; a plain tf.data one can.
So with `trainer.checkpoint_input_iterator` each worker reads its shard of
every global batch through one host iterator (`host_input_context`), which
the checkpoint holds, and `split_across_replicas` gives each of its replicas
its slice. Datasets also get the tf.data thread pool of `input_threads`.
"""

import hashlib
import inspect
import json
import os
import tempfile
from typing import Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tensorflow.python.distribute import multi_worker_util  # pylint: disable=g-direct-tensorflow-import

from tfm_ext.base import devices
from tfm_ext.training import labels


def host_input_supported(strategy: tf.distribute.Strategy) -> bool:
  """Whether training input can come from one host iterator per worker.

  A `tf.distribute` iterator cannot be checkpointed; a plain tf.data one
  can, so with `checkpoint_input_iterator` each worker reads its shard
  through a plain iterator and splits batches across its replicas. TPU and
  parameter-server strategies need their distributed iterators.
  """
  return not isinstance(strategy, (
      tf.distribute.TPUStrategy,
      tf.distribute.experimental.ParameterServerStrategy))

def takes_input_context(dataset_fn) -> bool:
  """Whether `dataset_fn` takes `input_context`: Orbit passes it only then."""
  return "input_context" in inspect.signature(dataset_fn).parameters


def threaded_dataset_fn(dataset_fn, threads: int, *args, **kwargs):
  """A dataset function for Orbit: `dataset_fn`'s, given `threads`.

  Orbit calls it with `input_context`, which reaches `dataset_fn` only if it
  takes one (`takes_input_context`), as Orbit's own wrapper does. Where
  `dataset_fn` is a task's `build_inputs`, its labels are checked
  (`labels.checking`: once, also where the launcher made it checking).
  """
  dataset_fn = labels.checking(dataset_fn)
  takes_context = takes_input_context(dataset_fn)

  def fn(input_context=None):  # Orbit passes it by this name.
    fn_kwargs = (dict(kwargs, input_context=input_context) if takes_context
                 else kwargs)
    return with_input_threads(dataset_fn(*args, **fn_kwargs), threads)

  return fn


def host_pipeline(task, data_config, strategy: tf.distribute.Strategy,
                  threads: int):
  """`(dataset, iterator)` of this worker's host pipeline, or `(None, None)`.

  None where the strategy needs its distributed iterators
  (`host_input_supported`) or the pipeline cannot be saved (it has
  stateful random ops: warned, and the run trains without the iterator in
  its checkpoints).
  """
  if not host_input_supported(strategy):
    return None, None
  build_inputs = labels.checking(task.build_inputs)
  context = ({"input_context": host_input_context(strategy)}
             if takes_input_context(build_inputs) else {})
  dataset = with_input_threads(build_inputs(data_config, **context), threads)
  iterator = iter(dataset)
  why_not = unsaveable_reason(iterator)
  if why_not:
    logging.warning(
        "The training input pipeline cannot be checkpointed (%s), so a "
        "resumed run will not see exactly the data of an uninterrupted "
        "one. Use stateless random ops (tf.random.stateless_*) in the "
        "pipeline, or set trainer.checkpoint_input_iterator=false to "
        "silence this.", why_not)
    return None, None
  return dataset, iterator


def host_input_context(strategy: tf.distribute.Strategy
                       ) -> tf.distribute.InputContext:
  """The `InputContext` of this worker's host pipeline: one batch per worker.

  The host pipeline (the iterator in the checkpoint) yields one batch for all
  of this worker's replicas, which `split_across_replicas` then slices. So
  its context counts input pipelines (workers) as its replicas:
  `get_per_replica_batch_size(global)` is `global / num_workers`, and TFM's
  `InputReader` shards the files by worker. With the strategy's own replica
  count each replica would train on `global / num_replicas / local_replicas`
  rows.
  """
  workers, worker_index = worker_layout(strategy)
  return tf.distribute.InputContext(num_input_pipelines=workers,
                                    input_pipeline_id=worker_index,
                                    num_replicas_in_sync=workers)

def worker_layout(strategy: tf.distribute.Strategy) -> Tuple[int, int]:
  """`(number of workers, this worker's index among them)`.

  The index is TensorFlow's id in the cluster (a `chief` task is 0 and the
  workers follow), as `MultiWorkerMirroredStrategy` numbers input pipelines.
  """
  local = len(devices.local_devices(strategy))
  workers = max(strategy.num_replicas_in_sync // local, 1)
  resolver = getattr(strategy, "cluster_resolver", None)
  if workers == 1 or resolver is None or not resolver.cluster_spec().jobs:
    return workers, 0
  return workers, multi_worker_util.id_in_cluster(
      resolver.cluster_spec(), resolver.task_type, resolver.task_id)

def split_across_replicas(inputs, strategy: tf.distribute.Strategy):
  """Gives each of this worker's replicas its slice of the worker's batch.

  `inputs` is one host batch of `global / num_workers` rows
  (`host_input_context`); replica i of this worker gets rows
  `[i * n, (i + 1) * n)` with `n = rows // local_replicas`. With one local
  replica the batch is returned as it is.
  """
  replicas = len(devices.local_devices(strategy))
  if replicas == 1:
    return inputs

  def replica_slice(ctx):
    index = ctx.replica_id_in_sync_group % replicas

    def take(t):
      size = tf.shape(t)[0] // replicas
      return t[index * size:(index + 1) * size]

    return tf.nest.map_structure(take, inputs)

  return strategy.experimental_distribute_values_from_function(replica_slice)

def unsaveable_reason(iterator) -> Optional[str]:
  """Why `iterator`'s state cannot be checkpointed, or None if it can.

  A pipeline with stateful ops (`tf.image.random_*`,
  `sample_distorted_bounding_box`) cannot be saved; finding out now, while
  the iterator holds nothing, costs one small write instead of a failure at
  the first checkpoint.
  """
  with tempfile.TemporaryDirectory() as probe:
    try:
      tf.train.Checkpoint(iterator=iterator).write(
          os.path.join(probe, "probe"))
    except tf.errors.OpError as e:
      return e.message.splitlines()[0]
  return None

def input_threads(runtime, devices_in_use: Sequence[str]) -> int:
  """Threads of the tf.data pool private to this run's datasets; 0: tf.data's.

  `runtime.dataset_num_private_threads` when set, 0 for tf.data's own pool
  (TFM declares the field but its trainer ignores it). Unset: half the
  cores this process may use when every replica of `devices_in_use` is a
  CPU, where the model's ops and the input share the cores and a private
  pool keeps the input off the model's
  (benchmarks/RESULTS.md#default-input-pool and the rows after it); with a
  GPU or TPU, tf.data's own pool, as in stock TFM, since there the input
  may need every core to keep the accelerator fed (#default-parallel-map).
  """
  threads = runtime.dataset_num_private_threads
  if threads is not None:
    return threads
  if all(tf.DeviceSpec.from_string(device).device_type == "CPU"
         for device in devices_in_use):
    return max(1, devices.usable_cores() // 2)
  return 0


def with_input_threads(dataset: tf.data.Dataset,
                       threads: int) -> tf.data.Dataset:
  """`dataset` with a private pool of `threads` threads (0: as it is).

  A pipeline that sizes its own pool keeps it. The pool changes neither the
  order of the data (tf.data stays deterministic) nor the iterator's
  checkpoint: checkpoints restore across thread counts.
  """
  if not threads or dataset.options().threading.private_threadpool_size:
    return dataset
  options = tf.data.Options()
  options.threading.private_threadpool_size = threads
  return dataset.with_options(options)


# What tfm_ext adds to a task's training pipeline, in the key of the
# iterator's position (`fingerprint`): 2, the label check (`labels.checked`;
# before or after the private pool's options, the iterator's state is the
# same). A checkpoint of another version resumes the input from its start:
# its iterator's state would not restore into this pipeline.
PIPELINE_VERSION = 2


def fingerprint(value) -> str:
  """A short, stable digest of a JSON-able value (a data config) and of
  `PIPELINE_VERSION` (version 1 digested the value alone)."""
  keyed = value if PIPELINE_VERSION == 1 else {
      "data": value, "tfm_ext_pipeline": PIPELINE_VERSION}
  return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str)
                        .encode()).hexdigest()[:12]
