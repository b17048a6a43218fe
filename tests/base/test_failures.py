"""The run's error boundary, by class: each phase's faults go through it.

For each class a user can cause or meet (bad data, an unusable model_dir,
a full disk, a checkpoint that does not fit, a signal) several different
faults run through the real launcher and must end the same way: one
`error:` (or `aborted:`) paragraph naming the phase's file or field, no
traceback on the console, the documented exit code, the traceback in the
log file, and nothing lost. A bug keeps its traceback.
"""

import errno
import os
import signal
import subprocess
import time
import types

import pytest
import tensorflow as tf

from conftest import DOUBLES_TRAIN, SMOKE
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
from tfm_ext.base import failures

TRACEBACK = "Traceback (most recent call last)"


def _clean(result, code):
  """Exit `code`, one paragraph on stderr, no traceback there."""
  assert result.returncode == code, result.stderr[-3000:]
  assert TRACEBACK not in result.stderr, result.stderr[-3000:]
  lines = [l for l in result.stderr.splitlines()
           if l.startswith(("error:", "aborted:", "preempted:"))]
  assert len(lines) == 1, result.stderr[-3000:]
  return lines[0]


def _log_text(model_dir):
  logs = os.path.join(model_dir, "logs")
  return "".join(open(os.path.join(logs, n)).read()
                 for n in os.listdir(logs) if n.startswith("tfm_ext"))


def _records(path, examples):
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      writer.write(example)
  return path


def _digit(label=3, drop_label=False):
  features = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
      value=[tf.io.encode_png(tf.zeros([8, 8, 1], tf.uint8)).numpy()]))}
  if not drop_label:
    features["image/class/label"] = tf.train.Feature(
        int64_list=tf.train.Int64List(value=[label]))
  return tf.train.Example(features=tf.train.Features(
      feature=features)).SerializeToString()


# -- Classification, in-process --------------------------------------------


def _raised_in(phase, error):
  error = type(error)(*error.args) if isinstance(error, OSError) else (
      type(error)(None, None, error.message)
      if isinstance(error, tf.errors.OpError) else type(error)(*error.args))
  try:
    with failures.phase(phase, "/m/thing"):
      raise error
  except BaseException as e:  # pylint: disable=broad-except
    return failures.classify(e)


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    tf.errors.ResourceExhaustedError(None, None,
                                     "/m/ckpt-1_temp; No space left on device"),
    tf.errors.PermissionDeniedError(None, None, "/m/x; Permission denied"),
    OSError(errno.EROFS, "Read-only file system"),
])
def test_storage_faults_are_exit_4_once_running_and_2_at_the_start(error):
  for phase in ("save", "step", "evaluate", "export"):
    failure = _raised_in(phase, error)
    assert failure.code == failures.EXIT_STORAGE, phase
    assert "/m/thing" in failure.message and "relaunch" in failure.message
  for phase in ("config", "model_dir"):
    assert _raised_in(phase, error).code == failures.EXIT_USAGE


@pytest.mark.parametrize("error, path", [
    # As str() gives a real one (the launcher's test has its filename).
    (OSError(errno.EROFS, "Read-only file system: '/data/digits'"),
     "/data/digits"),
    (tf.errors.PermissionDeniedError(None, None,
                                     "/data/cache/x.tmp; Permission denied"),
     "/data/cache/x.tmp"),
    (tf.errors.FailedPreconditionError(
        None, None, "gs://b/data/x: Error executing an HTTP request"),
     "gs://b/data/x"),
])
def test_storage_faults_while_building_are_setup_exit_2_naming_the_path(
    error, path):
  # Nothing trained yet: a read-only data folder is the setup's, not
  # storage failing under a run (exit 4), and not the model_dir's.
  failure = _raised_in("build", error)
  assert failure.code == failures.EXIT_USAGE
  assert failure.message.startswith(f"{path} cannot be used: "), failure
  assert "/m/thing" not in failure.message


@pytest.mark.parametrize("error", [
    tf.errors.InvalidArgumentError(None, None, "labels out of range"),
    tf.errors.DataLossError(None, None, "corrupted record at 12"),
    tf.errors.OutOfRangeError(None, None, "End of sequence"),
    tf.errors.NotFoundError(None, None, "/data/x.tfrecord; No such file"),
])
def test_tensorflow_runtime_errors_on_the_data_are_exit_3(error):
  for phase in ("build", "step", "evaluate"):
    failure = _raised_in(phase, error)
    assert failure.code == failures.EXIT_DATA
    assert str(error.message) in failure.message


def test_a_checkpoint_that_does_not_fit_is_exit_2_naming_it():
  failure = _raised_in("restore", tf.errors.InvalidArgumentError(
      None, None, "Received incompatible tensor with shape [128] when "
      "attempting to restore variable with shape [64]"))
  assert failure.code == failures.EXIT_USAGE
  assert "/m/thing does not fit" in failure.message


@pytest.mark.parametrize("error", [
    TypeError("unsupported operand"), KeyError("no such metric"),
    AttributeError("'NoneType' object has no attribute 'numpy'"),
    ValueError("Shapes (64, 10) and (64, 1) are incompatible"),
])
def test_python_errors_are_bugs_in_every_phase_after_config(error):
  for phase in ("build", "step", "evaluate", "save", "export"):
    assert _raised_in(phase, error) is None, phase
  # But for a ValueError of TensorFlow's checkpoint reader on a restore.
  assert (_raised_in("restore", error) is None) == (
      not isinstance(error, ValueError))


def test_the_reason_is_the_kernels_not_the_graph_trace():
  @tf.function
  def gather():
    return tf.gather([1, 2, 3], tf.constant(7))

  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    gather()
  assert str(raised.value).startswith("Graph execution error")
  assert failures.tf_reason(raised.value) == "indices = 7 is not in [0, 3)"


def test_a_tracing_error_gives_its_reason_and_the_users_line():
  """AutoGraph's errors read "in user code:", the frames, then the reason:
  the reason comes first, whole, and then the user's line."""

  @tf.function
  def traced(x):
    return tf.reshape(x, [5])  # Two elements: refused while tracing.

  with pytest.raises(ValueError) as raised:
    traced(tf.constant([1, 2]))
  assert str(raised.value).startswith("in user code:")
  reason = failures.tf_reason(raised.value)
  assert reason.startswith("Cannot reshape a tensor with 2 elements to shape "
                           "[5]"), reason
  line = next(n for n, text in enumerate(open(__file__), 1)
              if "return tf.reshape(x, [5])" in text)
  assert reason.endswith(f"(raised at {__file__}, line {line})"), reason
  assert "in user code" not in reason and "File " not in reason


def test_the_innermost_phase_is_the_one_named():
  try:
    with failures.phase("step"):
      with failures.phase("save", "/m/ckpt-40"):
        raise OSError(errno.ENOSPC, "No space left on device")
  except OSError as e:
    assert failures.phase_of(e) == ("save", "/m/ckpt-40")


# -- Classified by the failing object ---------------------------------------


def _graph_error(op, reason):
  return tf.errors.InvalidArgumentError(None, None, (
      f"Graph execution error:\n\nDetected at node {op} defined at (most "
      f"recent call last):\n  File \"train.py\", line 1\n\n{reason}\n"
      f"\t [[{{{{node {op}}}}}]] [Op:__inference_loop_fn_123]"))


@pytest.fixture(autouse=True)
def no_run_left():
  """Each test classifies as the first of its process: not with the step,
  model_dir or config of a run an earlier test ran in it."""
  failures.reset()
  yield


@pytest.fixture
def a_run():
  params = types.SimpleNamespace(
      task=types.SimpleNamespace(
          train_data=types.SimpleNamespace(input_path="/data/train*"),
          validation_data=types.SimpleNamespace(input_path="/data/val*")),
      as_dict=lambda: {"task": {"model": {"num_classes": 2}},
                       "trainer": {"train_steps": 2}})
  failures.set_run(model_dir="/m", params=params)
  yield
  failures.reset()


@pytest.mark.parametrize("op", ["IteratorGetNext", "cond/IteratorGetNext_1",
                                "MultiDeviceIteratorGetNextFromShard"])
def test_an_input_ops_error_is_the_datas(a_run, op):
  failure = _raised_in("step", _graph_error(op, "Feature: image/class/label "
                                                "(data type: int64) is required"))
  assert failure.code == failures.EXIT_DATA
  assert "failed on its data" in failure.message
  assert "task.train_data.input_path='/data/train*'" in failure.message


def test_op_determinism_refusing_a_kernel_is_the_modes_not_a_bug(a_run):
  # Not the unseeded random op the launcher test meets: a kernel with no
  # deterministic implementation, in a step. Deterministic mode is the
  # user's choice; without it, the same error is not blamed on the mode.
  error = tf.errors.UnimplementedError(None, None, (
      "A deterministic GPU implementation of SparseSoftmaxXentWithLogits is "
      "not currently available."))
  without = _raised_in("step", error)
  assert without is None or not without.message.startswith(
      "runtime.deterministic")
  failures.set_run(params=types.SimpleNamespace(
      runtime=types.SimpleNamespace(deterministic=True)))
  failure = _raised_in("step", error)
  assert failure.code == failures.EXIT_USAGE
  assert failure.message.startswith(
      "runtime.deterministic=true cannot run this task while training: A "
      "deterministic GPU implementation of SparseSoftmaxXentWithLogits"), (
          failure.message)
  assert "runtime.deterministic=false" in failure.message


def test_a_model_ops_error_is_not_blamed_on_the_data(a_run):
  # A Dense(1) head for two classes: the loss's squeeze fails; a bug of the
  # model, with its traceback.
  error = _graph_error("sparse_categorical_crossentropy/Squeeze",
                       "Can not squeeze dim[0], expected a dimension of 1, "
                       "got 64")
  assert failures.failing_op(error) == "sparse_categorical_crossentropy/Squeeze"
  for phase in ("step", "evaluate"):
    assert _raised_in(phase, error) is None


def _real_pipeline_error():
  """What a JPEG decoder in a dataset's map raises through a distributed
  iterator in a step (PNG records fed to TFM's classification input)."""
  png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8))
  dataset = tf.data.Dataset.from_tensors(png).repeat().map(
      lambda b: tf.cast(tf.image.extract_jpeg_shape(b), tf.float32)).batch(2)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  iterator = iter(strategy.experimental_distribute_dataset(dataset))

  @tf.function
  def step(iterator):
    return strategy.run(tf.reduce_sum, args=(next(iterator),))

  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    step(iterator)
  return raised.value


def test_an_op_inside_the_input_pipeline_is_the_datas(a_run):
  # The decoder is the innermost node, IteratorGetNext the op that ran it:
  # this was exit 1, a bug with its traceback.
  error = _real_pipeline_error()
  assert failures.failing_op(error) == "ExtractJpegShape"
  failure = _raised_in("step", error)
  assert failure.code == failures.EXIT_DATA, failure
  assert "Invalid JPEG data" in failure.message
  assert "task.train_data.input_path='/data/train*'" in failure.message


def test_labels_outside_the_classes_name_the_data_and_the_field(a_run):
  failure = _raised_in("step", _graph_error(
      "sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits",
      "Received a label value of 5 which is outside the valid range of "
      "[0, 2).  Label values: 5 1"))
  assert failure.code == failures.EXIT_DATA
  assert "a label is 5, outside [0, 2)" in failure.message
  assert "task.model.num_classes=2" in failure.message
  assert "/data/train*" in failure.message


def test_out_of_memory_is_its_own_class_nothing_lost(a_run):
  failure = _raised_in("step", tf.errors.ResourceExhaustedError(
      None, None, "OOM when allocating tensor with shape[4096,4096,64]"))
  assert failure.code == failures.EXIT_STORAGE
  assert failure.message.startswith("The run ran out of memory while training")
  assert "task.train_data.global_batch_size" in failure.message
  assert "data" not in failure.message.split("(")[0]


@pytest.mark.parametrize("error", [
    tf.errors.FailedPreconditionError(None, None,
                                      "/m/run_summary.json; Is a directory"),
    IsADirectoryError(errno.EISDIR, "Is a directory", "/m/metrics.csv"),
    NotADirectoryError(errno.ENOTDIR, "Not a directory", "/m/logs/x.log"),
])
def test_a_file_of_the_model_dir_of_the_wrong_kind_is_named(a_run, error):
  for phase in ("config", "step", "evaluate", "save"):
    try:
      with failures.phase(phase):
        raise error
    except (OSError, tf.errors.OpError) as e:
      failure = failures.classify(e)
    assert failure.code == failures.EXIT_USAGE, phase
    assert "a file of --model_dir" in failure.message and "/m/" in (
        failure.message), phase
    assert "data" not in failure.message


def test_an_input_inside_the_model_dir_is_still_the_datas():
  failures.set_run(model_dir="/m", params=types.SimpleNamespace(
      task=types.SimpleNamespace(
          train_data=types.SimpleNamespace(input_path="/m/data/*.tfrecord"),
          validation_data=None)))
  try:
    failure = _raised_in("step", tf.errors.DataLossError(
        None, None, "/m/data/a.tfrecord: corrupted record at 12"))
  finally:
    failures.reset()
  assert failure.code == failures.EXIT_DATA


def test_a_checkpoint_that_vanished_is_not_one_that_does_not_fit(a_run):
  failure = _raised_in("restore", tf.errors.NotFoundError(
      None, None, "/m/ckpt-40.data-00000-of-00001; No such file or directory"))
  assert failure.code == failures.EXIT_STORAGE
  assert "vanished while it was read" in failure.message
  assert "does not fit" not in failure.message


def test_an_unreachable_config_file_is_not_blamed_on_the_model_dir(a_run):
  error = tf.errors.UnavailableError(None, None, "Couldn't resolve host")
  try:
    with failures.phase("config"):
      raise error
  except tf.errors.UnavailableError as e:
    failure = failures.classify(e)
  assert failure.code == failures.EXIT_USAGE
  assert "/m" not in failure.message
  assert failure.message.startswith("a config file or input cannot be used")


@pytest.fixture
def tmpfs(tmp_path):
  """A small tmpfs of its own (root only): a disk that fills, or is read-only."""
  mounted = []

  def mount(size="4m", read_only=False):
    path = tmp_path / f"tmpfs{len(mounted)}"
    path.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs",
                             str(path)], capture_output=True, text=True)
    if result.returncode:
      pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    mounted.append(path)
    return path

  yield mount
  for path in mounted:
    subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("model_dir", [
    "{base}/job[1]", "{file}", "{file}/run", "{ro}/run", "nofs://b/run"])
def test_an_unusable_model_dir_is_exit_2_and_nothing_is_written(
    launch_forked, tmp_path, tmpfs, model_dir):
  a_file = tmp_path / "a_file"
  a_file.write_text("mine")
  read_only = tmpfs(read_only=True) if "{ro}" in model_dir else tmp_path
  model_dir = model_dir.format(base=tmp_path, file=a_file, ro=read_only)
  before = sorted(p for p, _, _ in os.walk(tmp_path))
  result = launch_forked("--experiment=digits_convnet", "--mode=train",
                         f"--params_override={SMOKE}", model_dir=model_dir)
  line = _clean(result, 2)
  assert "model_dir" in line
  assert sorted(p for p, _, _ in os.walk(tmp_path)) == before
  assert a_file.read_text() == "mine"


def test_a_read_only_data_folder_at_the_start_is_exit_2_naming_it(
    launch_forked, tmp_path, tmpfs):
  # digits_convnet writes its records' cache into TFM_EXT_DATA_DIR at its
  # first build: read-only there, the setup is refused, nothing written.
  data = tmpfs(read_only=True)
  model_dir = tmp_path / "m"
  result = launch_forked("--experiment=digits_convnet", "--mode=train",
                         f"--params_override={SMOKE}", model_dir=model_dir,
                         env={"TFM_EXT_DATA_DIR": str(data)})
  line = _clean(result, 2)
  assert line.startswith(f"error: {data}/digits cannot be used: "), line
  assert "Read-only file system" in line, line
  assert not model_dir.exists()


# -- Bad data: exit 3 naming the input, the last checkpoint intact ----------


@pytest.mark.parametrize("bad", ["label_out_of_range", "no_label",
                                 "corrupt_bytes", "empty_file"])
def test_bad_training_data_is_exit_3_naming_the_input(launch_forked, tmp_path,
                                                      bad):
  path = str(tmp_path / "train.tfrecord")
  if bad == "label_out_of_range":
    _records(path, [_digit(99)] * 200)
  elif bad == "no_label":
    _records(path, [_digit(drop_label=True)] * 200)
  elif bad == "corrupt_bytes":
    _records(path, [_digit()] * 200)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    open(path, "wb").write(bytes(data))
  else:
    open(path, "wb").close()
  model_dir = str(tmp_path / "m")
  result = launch_forked(
      "--experiment=digits_convnet", "--mode=train",
      f"--params_override={SMOKE},task.train_data.input_path={path}",
      model_dir=model_dir)
  line = _clean(result, 3)
  assert path in line
  assert "Graph execution error" not in line
  if bad in ("corrupt_bytes", "empty_file"):
    # Found by the input files' check (tfm_ext/training/input_files.py): before
    # anything is written.
    assert not os.path.exists(model_dir)
  else:  # Found by TensorFlow in the first step: the log has the traceback.
    assert "No checkpoint had been saved yet" in line
    assert TRACEBACK in _log_text(model_dir)


def test_deterministic_mode_refusing_the_tasks_random_ops_is_exit_2(
    launch_forked, tmp_path, imagenet_dir):
  # The ImageNet pipeline crops at random without a seed: TensorFlow's op
  # determinism refuses it while the input is built. The user's choice of
  # mode, not a bug, nor the config's model fields.
  result = launch_forked(
      "--experiment=resnet50_imagenet_ctl", "--mode=train",
      "--params_override="
      f"task.train_data.input_path={imagenet_dir}/train-*,"
      f"task.validation_data.input_path={imagenet_dir}/validation-*,"
      "task.train_data.global_batch_size=2,trainer.train_steps=2,"
      "runtime.deterministic=true", model_dir=tmp_path / "m")
  line = _clean(result, 2)
  assert line.startswith("error: runtime.deterministic=true cannot run this "
                         "task while building"), line
  assert "sample_distorted_bounding_box requires a non-zero seed" in line, line
  assert "imagenet_preprocessing.py, line " in line, line  # Where, in TFM.
  assert "In call to configurable" not in line, line
  assert "runtime.deterministic=false" in line, line
  assert "task.model" not in line, line


def test_labels_past_num_classes_name_both_the_data_and_the_field(
    launch_forked, tmp_path):
  # digits holds labels 0-9; the model has 5 classes: which one is wrong
  # is the user's to say, and the paragraph names both.
  result = launch_forked(
      "--experiment=digits_convnet", "--mode=train",
      f"--params_override={SMOKE},task.model.num_classes=5",
      model_dir=tmp_path / "m")
  line = _clean(result, 3)
  assert "outside [0, 5)" in line and "task.model.num_classes=5" in line
  assert "Fix the one that is wrong" in line
  assert result.summary()["exit_code"] == 3


def test_tfm_classification_labels_past_num_classes_are_exit_3_not_zeros(
    launch_forked, tmp_path, imagenet_dir):
  # TFM's classification one-hot-encodes its labels: one past num_classes
  # was an all-zero target, trained on to exit 0. The input checks them.
  shrunk = os.path.join(os.path.dirname(os.path.dirname(__file__)), "e2e",
                        "tfm_configs", "resnet_imagenet.yaml")
  model_dir = str(tmp_path / "m")
  result = launch_forked(
      "--experiment=resnet_imagenet", f"--config_file={shrunk}",
      "--mode=train_and_eval", "--params_override="
      f"task.train_data.input_path={imagenet_dir}/train-*,"
      f"task.validation_data.input_path={imagenet_dir}/validation-*,"
      "runtime.distribution_strategy=one_device,runtime.num_gpus=0,"
      "runtime.mixed_precision_dtype=float32,task.model.num_classes=3,"
      "trainer.train_steps=2,trainer.steps_per_loop=1", model_dir=model_dir)
  line = _clean(result, 3)
  assert "outside [0, 3)" in line and "task.model.num_classes=3" in line, line
  assert f"task.train_data.input_path='{imagenet_dir}/train-*'" in line, line
  assert "No checkpoint had been saved yet" in line, line
  assert tf.train.latest_checkpoint(model_dir) is None


def test_bad_validation_data_after_a_checkpoint_names_it_intact(
    launch_forked, tmp_path):
  path = _records(str(tmp_path / "validation.tfrecord"), [_digit(42)] * 64)
  model_dir = str(tmp_path / "m")
  result = launch_forked(
      "--experiment=digits_convnet", "--mode=train_and_eval",
      f"--params_override={SMOKE},task.validation_data.input_path={path}",
      model_dir=model_dir)
  line = _clean(result, 3)
  assert "task.validation_data.input_path" in line and path in line
  assert f"The last checkpoint, {model_dir}/ckpt-20, is intact" in line
  assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-20")
  summary = result.summary()
  assert (summary["status"], summary["exit_code"]) == ("failed", 3)


# -- A full disk: exit 4, nothing lost, the next start resumes --------------


def test_a_full_disk_at_a_save_is_exit_4_and_the_relaunch_resumes(
    launch_forked, tmpfs):
  disk = tmpfs(size="16m")
  model_dir, filler = str(disk / "m"), disk / "filler"
  args = ("--experiment=digits_convnet", "--mode=train", "--trainer=disk_filling",
          f"--params_override={SMOKE}")
  env = {"FILL_DISK_AT_STEP": "30", "FILL_DISK_PATH": str(filler)}
  result = launch_forked(*args, model_dir=model_dir, script=DOUBLES_TRAIN,
                         env=env)
  line = _clean(result, failures.EXIT_STORAGE)
  assert "No space left on device" in line
  assert "ckpt-20, is intact" in line
  assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-20")
  filler.unlink()
  again = launch_forked(*args, model_dir=model_dir, script=DOUBLES_TRAIN,
                        env={**env, "FILL_DISK_AT_STEP": "1000"})
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.summary()["resumed_from_step"] == 20
  assert not [n for n in os.listdir(model_dir) if "_temp" in n]


# -- A checkpoint that does not fit: exit 2 ---------------------------------


def test_a_checkpoint_of_another_model_is_exit_2_naming_it(launch_forked,
                                                            tmp_path):
  model_dir = str(tmp_path / "m")
  first = launch_forked("--experiment=digits_convnet", "--mode=train",
                        f"--params_override={SMOKE}", model_dir=model_dir)
  assert first.returncode == 0, first.stderr[-3000:]
  before = sorted(os.listdir(model_dir))
  result = launch_forked(
      "--experiment=digits_convnet", "--mode=train", "--allow_config_change",
      "--params_override=" + SMOKE.replace("train_steps=40", "train_steps=60")
      + ",task.model.dense_units=32", model_dir=model_dir)
  line = _clean(result, 2)
  assert "ckpt-40 does not fit" in line
  # The restore it cut short does not warn of each value at exit.
  assert "could not be found" not in result.stderr
  assert "Logging error" not in result.stderr
  assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-40")
  assert set(before) <= set(os.listdir(model_dir))


# -- Signals and bugs -------------------------------------------------------


def test_sighup_saves_and_exits_42(start_forked, tmp_path):
  run = start_forked("--experiment=digits_convnet", "--mode=train",
                     "--params_override=trainer.train_steps=100000,"
                     "trainer.steps_per_loop=10",
                     model_dir=str(tmp_path / "m"))
  run.wait_for_line(lambda line: line.startswith("step 20/"))
  run.proc.send_signal(signal.SIGHUP)
  result = run.finish()
  line = _clean(result, 42)
  assert "SIGHUP received: saved a checkpoint at step" in line
  step = int(line.split("at step ")[1].split(";")[0])
  assert tf.train.latest_checkpoint(str(tmp_path / "m")).endswith(f"-{step}")


def test_a_second_signal_aborts_without_a_traceback(start_forked, tmp_path):
  run = start_forked("--experiment=digits_convnet", "--mode=train_and_eval",
                     "--trainer=announcing",
                     "--params_override=trainer.train_steps=100000,"
                     "trainer.steps_per_loop=10,trainer.validation_interval=20,"
                     "trainer.checkpoint_interval=20,"
                     "task.validation_data.global_batch_size=1",
                     model_dir=str(tmp_path / "m"), script=DOUBLES_TRAIN)
  run.wait_for_line(lambda line: line.startswith("eval begins @ step 20"))
  run.proc.send_signal(signal.SIGINT)
  time.sleep(1)  # Two signals at once are delivered as one.
  run.proc.send_signal(signal.SIGINT)
  result = run.finish()
  line = _clean(result, 42)
  assert line.startswith("aborted: a second SIGINT")


def test_a_bug_in_a_users_trainer_keeps_its_traceback(launch_forked,
                                                      tmp_path):
  model_dir = str(tmp_path / "m")
  result = launch_forked("--experiment=digits_convnet", "--mode=train",
                         "--trainer=buggy", f"--params_override={SMOKE}",
                         model_dir=model_dir, script=DOUBLES_TRAIN)
  assert result.returncode == 1
  assert TRACEBACK in result.stderr and "no such metric" in result.stderr
  assert "A bug (not a problem with the input)" in _log_text(model_dir)


def test_a_full_disk_before_the_start_is_exit_2_and_nothing_is_written(
    launch_forked, tmpfs):
  disk = tmpfs(size="2m")
  with open(disk / "filler", "wb") as f:
    try:
      while True:
        f.write(b"\0" * (1 << 16))
        f.flush()
    except OSError:
      pass
  result = launch_forked("--experiment=digits_convnet", "--mode=train",
                         f"--params_override={SMOKE}",
                         model_dir=str(disk / "m"))
  assert "bytes free" in _clean(result, 2)
  assert sorted(os.listdir(disk)) == ["filler"]


def test_a_value_keras_refuses_while_building_is_exit_2(launch_forked,
                                                         tmp_path):
  result = launch_forked("--experiment=digits_convnet", "--mode=train",
                         f"--params_override={SMOKE},task.model.filters=[32,-1]",
                         model_dir=str(tmp_path / "m"))
  line = _clean(result, 2)
  assert "could not be built from the config" in line


def _exit_of(error, explain=None):
  """The SystemExit the error boundary raises for `error`."""
  failures.reset()
  remove = failures.explain_with(explain) if explain else (lambda: None)
  try:
    with pytest.raises(SystemExit) as exited, failures.boundary():
      raise error
  finally:
    remove()
    failures.reset()
  return exited.value


def test_a_lost_lease_that_explains_another_error_is_not_a_refusal():
  # The driver keeps (and copies into a bucket) the log of a job that ran;
  # a refused job takes its traces back. A lease lost inside a save
  # explains TensorFlow's NotFoundError: that job ran.
  from tfm_ext.model_dir import lease  # pylint: disable=g-import-not-at-top
  lost = lease.LeaseLost("another trainer took over the lease")
  vanished = tf.errors.NotFoundError(None, None, "ckpt-10_temp: not found")
  explained = _exit_of(vanished, explain=lambda e: lost)
  assert (explained.code, explained.refusal) == (2, False)
  assert (_exit_of(lost).code, _exit_of(lost).refusal) == (2, False)
  refused = _exit_of(failures.UsageError("bad value"))
  assert (refused.code, refused.refusal) == (2, True)
