"""ImageNet input: reference parity, training augmentation, sharding, synthetic."""

import os
import threading
import time

import numpy as np
import tensorflow as tf

from official.legacy.image_classification.resnet import imagenet_preprocessing

from experiments.imagenet import input_pipeline
from tfm_ext.base import devices
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
import imagenet_fixtures


def data_config(directory, split, **kwargs):
  is_training = split == "train"
  defaults = dict(
      input_path=os.path.join(
          directory, "train-*-of-01024" if is_training
          else "validation-*-of-00128"),
      is_training=is_training, global_batch_size=4,
      drop_remainder=is_training)
  return input_pipeline.ImageNetDataConfig(**{**defaults, **kwargs})


def test_eval_pipeline_matches_reference_input_fn_image_for_image(
    imagenet_dir):
  ours = input_pipeline.build_dataset(data_config(imagenet_dir, "validation"))
  files = sorted(tf.io.gfile.glob(
      os.path.join(imagenet_dir, "validation-*-of-00128")))
  reference = imagenet_preprocessing.input_fn(
      is_training=False, data_dir=None, batch_size=4, filenames=files)
  ours, reference = list(ours), list(reference)

  assert [len(labels) for _, labels in ours] == [4, 2]  # 6 images.
  assert len(ours) == len(reference)
  for (image, label), (ref_image, ref_label) in zip(ours, reference):
    assert image.shape == ref_image.shape
    np.testing.assert_array_equal(image.numpy(), ref_image.numpy())
    # The reference's labels are float32 [batch, 1]; ours int32 [batch].
    np.testing.assert_array_equal(label.numpy(), ref_label.numpy()[:, 0])
  labels = np.concatenate([label.numpy() for _, label in ours])
  assert sorted(labels) == imagenet_fixtures.VALIDATION_LABELS


def test_training_pipeline_crops_real_jpegs_differently_each_epoch(
    imagenet_dir):
  config = data_config(imagenet_dir, "train", seed=7, shuffle_buffer_size=8)
  batches = list(input_pipeline.build_dataset(config).take(4))  # 2 epochs.
  images = np.concatenate([b[0].numpy() for b in batches])
  labels = np.concatenate([b[1].numpy() for b in batches])

  assert images.shape == (16, 224, 224, 3) and images.dtype == np.float32
  assert sorted(labels[:8]) == sorted(labels[8:]) == imagenet_fixtures.TRAIN_LABELS
  # Means subtracted: pixels in [0, 255] minus the channel means.
  means = np.array(input_pipeline.CHANNEL_MEANS)
  assert (images >= -means - 1e-3).all()
  assert (images <= 255 - means + 1e-3).all()
  # The same photograph cropped twice (random box, random flip) differs.
  first = {l: i for i, l in zip(images[:8], labels[:8])}
  second = {l: i for i, l in zip(images[8:], labels[8:])}
  assert all(not np.array_equal(first[l], second[l]) for l in first)


def test_input_context_shards_files_between_pipelines(imagenet_dir):
  config = data_config(imagenet_dir, "validation", global_batch_size=6)
  labels = []
  for pipeline in range(2):
    context = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=pipeline,
        num_replicas_in_sync=2)
    dataset = input_pipeline.build_dataset(config, context)
    labels.append(sorted(int(l) for _, batch in dataset for l in batch))
  # Each pipeline reads one of the two files, in per-replica batches of 3.
  validation = imagenet_fixtures.images()[8:]
  assert labels == [sorted(im.label - 1 for im in validation[:3]),
                    sorted(im.label - 1 for im in validation[3:])]


def test_synthetic_data_reads_no_file_and_repeats_one_truncated_normal_image():
  config = input_pipeline.ImageNetDataConfig(
      use_synthetic_data=True, is_training=True, global_batch_size=2,
      private_threadpool_size=3)
  dataset = input_pipeline.build_dataset(config)
  (first, first_labels), (second, _) = list(dataset.take(2))

  assert first.shape == (2, 224, 224, 3) and first_labels.dtype == tf.int32
  pixels = first.numpy()
  assert 0 <= pixels.min() and pixels.max() <= 255
  assert abs(pixels.mean() - 127) < 1
  np.testing.assert_array_equal(first, second)
  assert dataset.options().threading.private_threadpool_size == 3

  evaluation = input_pipeline.build_dataset(config.replace(
      is_training=False, num_examples=5, drop_remainder=False))
  assert [len(labels) for _, labels in evaluation] == [2, 2, 1]


def test_autotuning_is_off_unless_asked(imagenet_dir):
  def autotune(split, **kwargs):
    return input_pipeline.build_dataset(
        data_config(imagenet_dir, split, **kwargs)).options().autotune

  assert autotune("train").enabled is False
  assert autotune("validation").enabled is False
  assert autotune("train", autotune=True).enabled is not False
  assert autotune("train").initial_parallelism == devices.usable_cores()
  assert autotune("train", private_threadpool_size=3).initial_parallelism == 3


def test_without_autotuning_the_prefetch_buffer_stays_bounded_over_pauses():
  # Pauses long enough to fill the buffer, each followed by draining it:
  # evaluations in a job whose input is slower than its model.
  def batches_ahead_after_pauses(prefetch):
    made = [0]

    def make(x):
      made[0] += 1
      time.sleep(0.002)  # Slower than the consumer, which drains the buffer.
      return x

    config = input_pipeline.ImageNetDataConfig()
    dataset = prefetch(tf.data.Dataset.range(10**6).map(
        lambda x: tf.py_function(make, [x], tf.int64)), config)
    iterator = iter(dataset.with_options(
        input_pipeline.dataset_options(config)))
    taken, ahead = 0, []
    for _ in range(6):
      for _ in range(40):
        next(iterator)
        taken += 1
      time.sleep(0.3)
      ahead.append(made[0] - taken)
    return ahead

  ours = batches_ahead_after_pauses(input_pipeline.prefetch)
  assert max(ours) <= input_pipeline.PREFETCH_BATCHES + 1, ours
  # tf.data's AUTOTUNE prefetch without autotuning doubles at every pause.
  autotune = batches_ahead_after_pauses(
      lambda dataset, _: dataset.prefetch(tf.data.AUTOTUNE))
  assert max(autotune) >= 16, autotune


def test_without_autotuning_every_thread_of_the_pool_maps_at_once():
  # Off, tf.data alone would run at most 16 calls at once, whatever the pool.
  lock = threading.Lock()
  running, most = [0], [0]

  def call(x):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
    time.sleep(0.1)  # Releases the GIL: the calls overlap.
    with lock:
      running[0] -= 1
    return x

  options = input_pipeline.dataset_options(
      input_pipeline.ImageNetDataConfig(private_threadpool_size=24))
  dataset = tf.data.Dataset.range(96).map(
      lambda x: tf.py_function(call, [x], tf.int64),
      num_parallel_calls=tf.data.AUTOTUNE).with_options(options)
  assert sorted(int(x) for x in dataset) == list(range(96))
  assert 16 < most[0] <= 24
