"""The bundled digits TFRecords, whole or cut short, for tests of input files."""

import struct

import tensorflow as tf

from experiments import digits_convnet


def bundled(split):
  """The cached digits TFRecord file of `split` (1,437 train, 360 val)."""
  return digits_convnet.bundled_tfrecords(split)


def record_offsets(data: bytes):
  """Where each record of a TFRecord file's bytes starts, and the end."""
  offsets = [0]
  while offsets[-1] < len(data):
    length = struct.unpack("<Q", data[offsets[-1]:offsets[-1] + 8])[0]
    offsets.append(offsets[-1] + 16 + length)
  return offsets


def cut_copy(tmp_path, name, bytes_into_record_480):
  """The digits training file cut `bytes_into_record_480` into record 480."""
  with open(bundled("train"), "rb") as f:
    data = f.read()
  path = tmp_path / name
  path.write_bytes(data[:record_offsets(data)[479] + bytes_into_record_480])
  return str(path)


def records_read(path):
  return sum(1 for _ in tf.data.TFRecordDataset(path))


def digits_data(input_path, is_training=True):
  return digits_convnet.DigitsTaskConfig().train_data.replace(
      input_path=input_path, is_training=is_training)
