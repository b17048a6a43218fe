"""The host input pipeline: each worker reads its shard of the global batch.

Multi-worker layouts come from a stand-in for the strategy (its replica
count and cluster); everything after it is real: the context
`host_pipeline` gives the task, TFM's InputReader over the digits records,
the iterator and its checkpoint probe. Runs with the iterator in the
checkpoint, end to end, are in test_batches.py and test_multi_worker.py.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import registry_imports  # pylint: disable=unused-import
from experiments import digits_convnet
from tfm_ext.base import failures
from tfm_ext.training import inputs
from tfm_ext.training import labels

GLOBAL = 64


class Worker:
  """`MultiWorkerMirroredStrategy`'s layout on worker `index` of `workers`.

  One replica per worker (this process's one CPU device).
  """

  def __init__(self, index, workers=2):
    self.num_replicas_in_sync = workers
    self.extended = tf.distribute.get_strategy().extended
    self.cluster_resolver = (
        tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(
                {"worker": [f"h{i}:1" for i in range(workers)]}),
            task_type="worker", task_id=index))


@pytest.fixture
def task(data_dir):
  del data_dir  # Used for its effect: the bundled digits records' cache.
  return digits_convnet.DigitsTask(digits_convnet.DigitsTaskConfig())


def test_host_pipeline_reads_this_workers_share_of_the_global_batch(task):
  data = task.task_config.train_data.replace(global_batch_size=GLOBAL,
                                             shuffle_buffer_size=1)
  first_images = []
  for index in (0, 1):
    dataset, iterator = inputs.host_pipeline(task, data, Worker(index),
                                             threads=0)
    assert dataset is not None  # The pipeline can be checkpointed.
    images, _ = next(iterator)
    assert images.shape[0] == GLOBAL // 2, index
    first_images.append(images.numpy())
  # The two workers read different shards.
  assert not np.array_equal(*first_images)


def test_host_pipeline_of_a_single_worker_reads_the_whole_global_batch(task):
  data = task.task_config.train_data.replace(global_batch_size=GLOBAL)
  _, iterator = inputs.host_pipeline(task, data, tf.distribute.get_strategy(),
                                     threads=0)
  assert next(iterator)[0].shape[0] == GLOBAL


def _pool(dataset):
  return dataset.options().threading.private_threadpool_size


def test_the_input_gets_half_the_cores_on_cpus_and_tf_datas_pool_elsewhere():
  from official.core import config_definitions  # pylint: disable=g-import-not-at-top
  runtime = config_definitions.RuntimeConfig()
  cpus = ["/job:localhost/replica:0/task:0/device:CPU:0"]
  half = max(1, len(os.sched_getaffinity(0)) // 2)
  assert inputs.input_threads(runtime, cpus) == half
  assert inputs.input_threads(runtime, cpus * 2) == half
  # A GPU or TPU among the replicas: tf.data's own pool, as stock TFM.
  for accelerator in ("/device:GPU:0", "/job:worker/replica:0/task:0/"
                      "device:TPU:1"):
    assert inputs.input_threads(runtime, [*cpus, accelerator]) == 0
  dataset = tf.data.Dataset.range(4)
  assert inputs.with_input_threads(dataset, 0) is dataset
  # Set, it wins everywhere; 0 is tf.data's own pool.
  for threads in (0, 3):
    runtime.dataset_num_private_threads = threads
    assert inputs.input_threads(runtime, cpus) == threads
    assert inputs.input_threads(runtime, ["/device:GPU:0"]) == threads
  assert _pool(inputs.with_input_threads(dataset, 3)) == 3


def test_a_pipeline_that_sizes_its_own_pool_keeps_it():
  options = tf.data.Options()
  options.threading.private_threadpool_size = 5
  own = tf.data.Dataset.range(4).with_options(options)
  assert _pool(inputs.with_input_threads(own, 3)) == 5


def test_the_threaded_dataset_fn_passes_input_context_only_where_taken():
  context = tf.distribute.InputContext(num_input_pipelines=2,
                                       input_pipeline_id=1)

  def plain(rows):
    return tf.data.Dataset.range(rows)

  def sharded(rows, input_context=None):
    return tf.data.Dataset.range(rows).shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id)

  for dataset_fn, rows in ((plain, [0, 1, 2, 3]), (sharded, [1, 3])):
    dataset = inputs.threaded_dataset_fn(dataset_fn, 2, 4)(
        input_context=context)
    assert list(dataset.as_numpy_iterator()) == rows
    assert _pool(dataset) == 2


# -- Labels checked in the input ---------------------------------------------


def _batches(labels, features=None):
  labels = tf.constant(labels)
  features = tf.zeros([labels.shape[0], 2]) if features is None else features
  return tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)


def test_labels_inside_the_classes_pass_as_they_are():
  dataset = _batches([0, 2, 1, 2, 0])
  checked = labels.checked(dataset, 3)
  assert checked is not dataset
  assert [l.numpy().tolist() for _, l in checked] == [[0, 2], [1, 2], [0]]


@pytest.mark.parametrize("bad, batch", [(3, 1), (-1, 2), (1000, 0)])
def test_a_label_outside_the_classes_fails_the_batch_naming_it(bad, batch):
  values = [0, 1, 2, 0, 1, 2]
  values[2 * batch + 1] = bad
  iterator = iter(labels.checked(_batches(values), 3))
  for _ in range(batch):
    next(iterator)
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    next(iterator)
  # Classified as the data's or num_classes' (exit 3, naming both).
  assert (f"[label value of] [{bad}] [which is outside the valid range of "
          "[0,] [3]" in raised.value.message)
  with failures.phase("step"):
    failure = failures.classify(raised.value)
  assert failure.code == 3 and f"a label is {bad}, outside [0, 3)" in (
      failure.message)


@pytest.mark.parametrize("dataset", [
    # One-hot or multi-hot (TFM's multilabel, video), mixup's floats, a dict
    # of labels (detection), features alone: no class index to check.
    _batches([[0, 1], [1, 0]]), _batches([0.5, 2.5]),
    _batches(tf.constant([1, 2], tf.uint8)),
    tf.data.Dataset.from_tensors(({"x": 1}, {"boxes": [1]})),
    tf.data.Dataset.from_tensors(tf.zeros([2]))])
def test_labels_without_a_class_index_are_left_alone(dataset):
  assert labels.checked(dataset, 3) is dataset


def test_without_classes_the_input_is_left_alone():
  dataset = _batches([7, 8])
  assert labels.checked(dataset, None) is dataset


def test_the_check_applies_where_the_task_has_num_classes(task):
  assert labels.num_classes(task) == 10
  assert labels.num_classes(object()) is None
