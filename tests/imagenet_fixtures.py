"""A tiny ImageNet in the reference's TFRecord format, from real photographs.

scikit-learn ships two JPEG photographs (`china.jpg`, `flower.jpg`, 427x640)
and the 8x8 digits. From them `write_imagenet` builds 14 JPEGs of different
sizes and aspect ratios (some smaller than 256 on a side, one grey), most
with bounding boxes, and writes them as `train-0000{0,1}-of-01024` (4 each)
and `validation-0000{0,1}-of-00128` (3 each), with the fields of the
reference's `build_imagenet_data.py`. Labels are 1..1000.
"""

import os
from typing import List, NamedTuple, Tuple

import numpy as np
import pytest
import tensorflow as tf

Box = Tuple[float, float, float, float]  # ymin, xmin, ymax, xmax in [0, 1].


class Image(NamedTuple):
  pixels: np.ndarray  # uint8 [height, width, channels]
  label: int  # 1..1000, as in the reference's files.
  boxes: List[Box]


def _photos() -> List[np.ndarray]:
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  return list(datasets.load_sample_images().images)


def _digit(index: int, height: int, width: int) -> np.ndarray:
  """An 8x8 digit blown up to `height` x `width`, grey (one channel)."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digit = (datasets.load_digits().images[index] * 16).clip(0, 255)
  big = np.kron(digit, np.ones((height // 8 + 1, width // 8 + 1)))
  return big[:height, :width, None].astype(np.uint8)


def images() -> List[Image]:
  """The 14 images: 8 for training, then 6 for validation."""
  china, flower = _photos()
  return [
      Image(china, 1, [(0.1, 0.2, 0.8, 0.9)]),
      Image(flower[:, 100:500], 1000, [(0.2, 0.1, 0.9, 0.6),
                                       (0.0, 0.5, 0.4, 1.0)]),
      Image(_digit(3, 96, 128), 4, []),
      Image(china[50:350, 200:600], 17, [(0.3, 0.3, 0.6, 0.7)]),
      Image(flower[::2, ::2], 500, [(0.05, 0.05, 0.95, 0.95)]),
      Image(_digit(5, 300, 200), 6, []),
      Image(china[:, :300], 2, [(0.0, 0.0, 1.0, 0.5)]),
      Image(flower[100:400, 100:400], 999, [(0.4, 0.4, 0.6, 0.6)]),
      # Validation.
      Image(china, 1, [(0.1, 0.2, 0.8, 0.9)]),
      Image(flower[:200, 150:450], 1000, [(0.1, 0.1, 0.9, 0.9)]),
      Image(_digit(7, 240, 320), 8, []),
      Image(china[::3, ::3], 17, [(0.2, 0.2, 0.5, 0.5)]),
      Image(flower[:, 300:], 500, []),
      Image(_digit(0, 256, 257), 1, []),
  ]


def example(image: Image, filename: str) -> bytes:
  """A tf.Example with the reference's (`build_imagenet_data.py`) fields."""
  height, width, channels = image.pixels.shape
  encoded = tf.io.encode_jpeg(image.pixels, quality=90).numpy()

  def floats(index):
    return tf.train.Feature(float_list=tf.train.FloatList(
        value=[box[index] for box in image.boxes]))

  def ints(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

  def text(value: str):
    return tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[value.encode()]))

  features = {
      "image/height": ints(height),
      "image/width": ints(width),
      "image/colorspace": text("RGB" if channels == 3 else "Grayscale"),
      "image/channels": ints(channels),
      "image/class/label": ints(image.label),
      "image/class/synset": text(f"n{image.label:08d}"),
      "image/class/text": text(f"class {image.label}"),
      "image/object/bbox/ymin": floats(0),
      "image/object/bbox/xmin": floats(1),
      "image/object/bbox/ymax": floats(2),
      "image/object/bbox/xmax": floats(3),
      "image/object/bbox/label": tf.train.Feature(int64_list=tf.train.Int64List(
          value=[image.label] * len(image.boxes))),
      "image/format": text("JPEG"),
      "image/filename": text(filename),
      "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[encoded])),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=features)).SerializeToString()


def write_imagenet(directory: str) -> str:
  """Writes the tiny ImageNet into `directory`; returns it."""
  os.makedirs(directory, exist_ok=True)
  all_images = images()
  shards = [("train-00000-of-01024", all_images[0:4]),
            ("train-00001-of-01024", all_images[4:8]),
            ("validation-00000-of-00128", all_images[8:11]),
            ("validation-00001-of-00128", all_images[11:14])]
  for name, shard in shards:
    with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
      for i, image in enumerate(shard):
        writer.write(example(image, f"{name}_{i}.JPEG"))
  return directory


TRAIN_LABELS = sorted(image.label - 1 for image in images()[:8])
VALIDATION_LABELS = sorted(image.label - 1 for image in images()[8:])


@pytest.fixture(scope="session")
def imagenet_dir(tmp_path_factory) -> str:
  """A session's tiny ImageNet directory (import this fixture to use it)."""
  return write_imagenet(str(tmp_path_factory.mktemp("imagenet")))
