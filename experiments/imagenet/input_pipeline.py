"""ImageNet input: the reference's TFRecord pipeline, or synthetic images.

Reads the TFRecords that TFM's legacy ResNet runner reads
(`train-XXXXX-of-01024`, `validation-XXXXX-of-00128`; `image/encoded` JPEG,
`image/class/label` in 1..1000, `image/object/bbox/*`) through a file pattern,
and yields `(image, label)` batches: images `[batch, 224, 224, 3]` in
`dtype`, channel means subtracted; labels int32 in 0..999.

The per-image work is the reference's own `imagenet_preprocessing`
(`parse_example_proto` and `preprocess_image`), imported rather than copied,
so the images are the reference's bit for bit. This module assembles the
dataset around it the way the reference's `input_fn` does:

    training:   files (sorted) -> shard by input context -> shuffle files ->
                interleave (cycle_length 10) -> [cache] -> shuffle records ->
                repeat -> parallel parse (random box crop, flip, resize) ->
                batch -> prefetch
    evaluation: files (sorted) -> shard -> interleave -> parallel parse
                (short side to 256, central 224 crop) -> batch -> prefetch

What differs: files come from a pattern (any number of shards, not exactly
1024 and 128), labels are int32 `[batch]` rather than float32 `[batch, 1]`,
shuffling takes `seed`, the private thread pool uses `tf.data`'s current
`threading` option, and tf.data's autotuning is off: one parallel call per
thread of the pool from the start and `PREFETCH_BATCHES` batches
prefetched (`ImageNetDataConfig.autotune`).
"""

import dataclasses
import math
from typing import List, Optional, Tuple

import tensorflow as tf

from official.core import config_definitions as cfg
from official.legacy.image_classification.resnet import imagenet_preprocessing
from tfm_ext.base import devices

NUM_TRAIN_IMAGES = imagenet_preprocessing.NUM_IMAGES["train"]
NUM_VALIDATION_IMAGES = imagenet_preprocessing.NUM_IMAGES["validation"]
CHANNEL_MEANS = imagenet_preprocessing.CHANNEL_MEANS
IMAGE_SIZE = imagenet_preprocessing.DEFAULT_IMAGE_SIZE
NUM_CHANNELS = imagenet_preprocessing.NUM_CHANNELS
# The reference's synthetic images: truncated normal, so within 2 stddev.
SYNTHETIC_MEAN = 127.0
SYNTHETIC_STDDEV = 60.0
# Batches prefetched when autotuning is off. Not AUTOTUNE: without
# autotuning's RAM budget, tf.data's older prefetch tuning doubles the buffer
# each time the model pauses long enough to let it fill (an evaluation, a
# checkpoint) and then drains it, without bound.
PREFETCH_BATCHES = 2


@dataclasses.dataclass
class ImageNetDataConfig(cfg.DataConfig):
  """Where ImageNet comes from and how it is batched.

  Attributes:
    input_path: TFRecord file pattern(s), comma-separated, e.g.
      `/data/imagenet/train-*-of-01024`. Ignored with `use_synthetic_data`.
    num_examples: Images in one epoch of this split. The learning-rate
      schedule counts epochs with the training split's value; synthetic
      evaluation yields this many images.
    num_classes: Synthetic labels are drawn from `[0, num_classes)`.
    use_synthetic_data: Feed one random image (mean 127, stddev 60) and label
      over and over, skipping reading and decoding: the input-pipeline
      ceiling of a throughput measurement.
    private_threadpool_size: Threads of a pool private to this dataset; 0
      shares tf.data's pool.
    cache: Cache the raw training records in memory after the first epoch.
    autotune: tf.data's autotuning of parallelism and buffers; off unless
      True. Off, every AUTOTUNE parallelism is one call per thread of the
      pool the pipeline runs on (`private_threadpool_size` threads, else one
      per core) from the first image: a fresh iterator for one finite
      evaluation pass ends before autotuning settles, and off, prefetching
      stays bounded (benchmarks/RESULTS.md#default-no-autotune and
      #default-no-autotune-eval).
      tf.data's own default when off is at most 16 calls at once, which
      would starve a host with more cores. Prefetching is fixed then
      (`PREFETCH_BATCHES`).
  """
  input_path: str = ""
  num_examples: int = NUM_TRAIN_IMAGES
  num_classes: int = 1000
  use_synthetic_data: bool = False
  private_threadpool_size: int = 0
  shuffle_buffer_size: int = 10000
  cycle_length: int = 10
  dtype: str = "float32"
  autotune: Optional[bool] = None  # None, as saved configs have it: off.


def file_patterns(input_path) -> List[str]:
  """Splits `input_path` (a string with commas, or a list) into patterns."""
  if isinstance(input_path, str):
    return [p for p in input_path.split(",") if p]
  return [p for item in input_path for p in file_patterns(item)]


def build_dataset(
    config: ImageNetDataConfig,
    input_context: Optional[tf.distribute.InputContext] = None
) -> tf.data.Dataset:
  """Returns batches of `(image, label)` for one replica (or all, alone)."""
  batch_size = config.global_batch_size
  if input_context:
    batch_size = input_context.get_per_replica_batch_size(batch_size)
  if config.use_synthetic_data:
    dataset = _synthetic(config, batch_size, input_context)
  else:
    dataset = _tfrecords(config, batch_size, input_context)
  return dataset.with_options(dataset_options(config))


def dataset_options(config: ImageNetDataConfig) -> tf.data.Options:
  """The private pool and, unless `config.autotune`, fixed parallelism."""
  options = tf.data.Options()
  if config.private_threadpool_size:
    options.threading.private_threadpool_size = config.private_threadpool_size
  if not config.autotune:
    options.autotune.enabled = False
    # A pool tfm_ext's trainer gives the input later caps this in turn.
    options.autotune.initial_parallelism = (
        config.private_threadpool_size or devices.usable_cores())
  return options


def prefetch(dataset: tf.data.Dataset,
             config: ImageNetDataConfig) -> tf.data.Dataset:
  """Prefetches AUTOTUNE batches with autotuning, else `PREFETCH_BATCHES`."""
  return dataset.prefetch(tf.data.AUTOTUNE if config.autotune
                          else PREFETCH_BATCHES)


def _tfrecords(config: ImageNetDataConfig, batch_size: int,
               input_context) -> tf.data.Dataset:
  files = sorted({f for pattern in file_patterns(config.input_path)
                  for f in tf.io.gfile.glob(pattern)})
  if not files:
    raise ValueError(f"input_path {config.input_path!r} matches no file.")
  dataset = tf.data.Dataset.from_tensor_slices(files)
  if input_context and input_context.num_input_pipelines > 1:
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
  if config.is_training:
    dataset = dataset.shuffle(len(files), seed=config.seed)
  dataset = dataset.interleave(
      tf.data.TFRecordDataset, cycle_length=config.cycle_length,
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic)
  if config.is_training:
    if config.cache:
      dataset = dataset.cache()
    # Shuffled before repeating, so that epochs stay apart.
    dataset = dataset.shuffle(config.shuffle_buffer_size, seed=config.seed)
    dataset = dataset.repeat()
  dtype = tf.dtypes.as_dtype(config.dtype)
  dataset = dataset.map(
      lambda record: parse_record(record, config.is_training, dtype),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic)
  dataset = dataset.batch(batch_size, drop_remainder=config.drop_remainder)
  return prefetch(dataset, config)


def parse_record(record: tf.Tensor, is_training: bool,
                 dtype: tf.DType = tf.float32) -> Tuple[tf.Tensor, tf.Tensor]:
  """Decodes one serialized Example into `(image, label)`, label in 0..999."""
  image_buffer, label, bbox = imagenet_preprocessing.parse_example_proto(record)
  image = imagenet_preprocessing.preprocess_image(
      image_buffer=image_buffer, bbox=bbox, output_height=IMAGE_SIZE,
      output_width=IMAGE_SIZE, num_channels=NUM_CHANNELS,
      is_training=is_training)
  return tf.cast(image, dtype), label - 1


def _synthetic(config: ImageNetDataConfig, batch_size: int,
               input_context) -> tf.data.Dataset:
  """One random image and label, repeated; finite for evaluation."""
  image = tf.random.truncated_normal(
      [IMAGE_SIZE, IMAGE_SIZE, NUM_CHANNELS], mean=SYNTHETIC_MEAN,
      stddev=SYNTHETIC_STDDEV, seed=config.seed)
  label = tf.random.uniform([], maxval=config.num_classes, dtype=tf.int32,
                            seed=config.seed)
  dataset = tf.data.Dataset.from_tensors(
      (tf.cast(image, config.dtype), label))
  if config.is_training:
    return prefetch(
        dataset.repeat().batch(batch_size, drop_remainder=True), config)
  # Evaluation runs until its data ends: one split's worth, across pipelines.
  pipelines = input_context.num_input_pipelines if input_context else 1
  dataset = dataset.repeat(math.ceil(config.num_examples / pipelines))
  return dataset.batch(batch_size, drop_remainder=config.drop_remainder)
