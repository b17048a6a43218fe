"""JPEG TFRecords in ImageNet's format, for the input and checkpoint benchmarks.

The tests' tiny ImageNet (`tests/imagenet_fixtures.py`: scikit-learn's two
photographs and blown-up digits, 8 training and 6 validation images of
different sizes, with bounding boxes) with each image written `copies`
times, in shards named like ImageNet's. Nothing is downloaded. A training
record is about 36 KB on average (ImageNet's: about 110 KB).
"""

import os
from typing import Dict, List

import tensorflow as tf

from tests import imagenet_fixtures

NUM_TRAIN_IMAGES = 8  # The first 8 of `imagenet_fixtures.images()`,
NUM_VALIDATION_IMAGES = 6  # then 6 for validation.
SHARDS = {"train": (4, 1024), "validation": (2, 128)}  # (written, nominal)


def write(directory: str, copies: int) -> Dict[str, List[str]]:
  """Writes both splits, each image `copies` times; returns the files by split.

  Copies are spread round-robin over the shards, so every shard holds every
  image.
  """
  os.makedirs(directory, exist_ok=True)
  images = imagenet_fixtures.images()
  splits = {"train": images[:NUM_TRAIN_IMAGES],
            "validation": images[NUM_TRAIN_IMAGES:]}
  files = {}
  for split, split_images in splits.items():
    written, nominal = SHARDS[split]
    records = [imagenet_fixtures.example(image, f"{split}_{i}.JPEG")
               for i, image in enumerate(split_images)] * copies
    files[split] = [os.path.join(directory,
                                 f"{split}-{shard:05d}-of-{nominal:05d}")
                    for shard in range(written)]
    for shard, path in enumerate(files[split]):
      with tf.io.TFRecordWriter(path) as writer:
        for record in records[shard::written]:
          writer.write(record)
  return files
