"""The host input pipeline: each worker reads its shard of the global batch.

Multi-worker layouts come from a stand-in for the strategy (its replica
count and cluster); everything after it is real: the context
`host_pipeline` gives the task, TFM's InputReader over the digits records,
the iterator and its checkpoint probe. Runs with the iterator in the
checkpoint, end to end, are in test_batches.py and test_multi_worker.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import registry_imports  # pylint: disable=unused-import
from experiments import digits_convnet
from tfm_ext import inputs

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
