"""The input files' records, checked before a run reads them.

TFRecord files whose framing ends early, or whose header does not match
its checksum (`tfm_ext.training.input_files`), on real copies of the bundled
digits files. What a launched run makes of them:
tests/e2e/test_empty_and_truncated_data.py.
"""

import shutil
import types

import pytest
import tensorflow as tf

from digits_records import bundled
from digits_records import cut_copy
from digits_records import digits_data
from digits_records import record_offsets
from digits_records import records_read
from tfm_ext.training import input_files
from tfm_ext.base.errors import RunFailed


def test_tensorflow_reads_a_file_cut_in_a_header_silently_the_check_refuses(
    tmp_path):
  cut = cut_copy(tmp_path, "train.tfrecord", 5)  # 5 of 12 header bytes.
  assert records_read(cut) == 479  # Of 1,437, without a word: measured.
  with pytest.raises(RunFailed) as e:
    input_files.check_data("task.train_data", digits_data(cut))
  assert str(e.value).startswith(f"task.train_data.input_path='{cut}': {cut} "
                                 "is cut short"), e.value
  assert "5 byte(s) into the header of record 480" in str(e.value)
  assert "479 whole record(s)" in str(e.value)


@pytest.mark.parametrize("into, tensorflow", [
    (12, "truncated record"),  # The header whole, no data.
    (100, "truncated record"),  # Within the data.
    (-2, "truncated record"),  # Within record 479's data checksum.
])
def test_a_file_cut_after_a_header_is_refused_naming_it(tmp_path, into,
                                                        tensorflow):
  cut = cut_copy(tmp_path, "train.tfrecord", into)
  with pytest.raises(tf.errors.DataLossError, match=tensorflow) as raised:
    records_read(cut)
  assert cut not in raised.value.message  # TensorFlow does not name it.
  with pytest.raises(RunFailed, match=f"{cut} is cut short: record "):
    input_files.check_data("task.train_data", digits_data(cut))


def test_a_file_cut_between_records_is_whole_to_everyone(tmp_path):
  cut = cut_copy(tmp_path, "train.tfrecord", 0)
  assert records_read(cut) == 479
  input_files.check_data("task.train_data", digits_data(cut))
  assert input_files.record_count(digits_data(cut)) == 479


def test_a_header_that_does_not_match_its_checksum_is_corrupted(tmp_path):
  with open(bundled("train"), "rb") as f:
    data = bytearray(f.read())
  data[record_offsets(data)[300] + 3] ^= 0x40  # Record 301's length.
  path = tmp_path / "train.tfrecord"
  path.write_bytes(bytes(data))
  with pytest.raises(RunFailed, match="the header of record 301 .* does not "
                     "match its checksum"):
    input_files.check_data("task.train_data", digits_data(str(path)))


def test_every_bad_file_of_a_pattern_is_named_the_good_ones_are_not(
    tmp_path):
  shutil.copy(bundled("train"), tmp_path / "train-0.tfrecord")
  cut_copy(tmp_path, "train-1.tfrecord", 5)
  cut_copy(tmp_path, "train-2.tfrecord", 100)
  pattern = str(tmp_path / "train-*.tfrecord")
  with pytest.raises(RunFailed) as e:
    input_files.check_data("task.train_data", digits_data(pattern))
  message = str(e.value)
  assert message.startswith(f"task.train_data.input_path='{pattern}': ")
  assert "train-1.tfrecord is cut short" in message
  assert "train-2.tfrecord is cut short" in message
  assert "train-0.tfrecord" not in message


def test_a_directory_and_a_missing_file_are_refused_naming_them(tmp_path):
  with pytest.raises(RunFailed, match=f"{tmp_path} is a directory"):
    input_files.check_data("task.train_data", digits_data(str(tmp_path)))
  gone = str(tmp_path / "gone.tfrecord")  # Listed, then deleted.
  with pytest.raises(RunFailed, match=f"{gone} does not exist"):
    input_files.check_data("task.validation_data", digits_data(gone))


def test_files_that_are_not_tfrecords_are_left_to_the_task(tmp_path):
  csv = tmp_path / "train.csv"
  csv.write_text("label,pixels\n" + "3,0 1 2 3\n" * 1000)
  input_files.check_data("task.train_data", digits_data(str(csv)))
  assert input_files.record_count(digits_data(str(csv))) is None
  compressed = types.SimpleNamespace(input_path=cut_copy(tmp_path, "t.gz", 5),
                                     file_type="tfrecord_compressed")
  input_files.check_data("task.train_data", compressed)  # Not walked.


def test_only_empty_training_files_are_refused(tmp_path):
  empty = tmp_path / "empty.tfrecord"
  empty.write_bytes(b"")
  with pytest.raises(RunFailed, match="every file it names is empty"):
    input_files.check_data("task.train_data", digits_data(str(empty)),
                           need_records=True)
  # Beside a file with records it is a shard like another.
  both = f"{empty},{bundled('train')}"
  input_files.check_data("task.train_data", digits_data(both),
                         need_records=True)
  assert input_files.record_count(digits_data(both)) == 1437
