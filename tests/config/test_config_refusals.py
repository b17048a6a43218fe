"""No config is chosen silently: a value given twice or a path to nothing.

Each case below ran to exit 0 doing something else than what was asked (the
last of two values won, training started from scratch, a pipe read as
empty) or ended in a traceback; now it is a `UsageError` naming the file,
flag or field, the value, and what to do, before anything is written.
"""

import os
import subprocess
import sys
import threading

from absl import flags
import pytest
import tensorflow as tf

from conftest import REPO, TRAIN
from conftest import assert_clean_usage_error

from tfm_ext.config import params as params_lib
from tfm_ext.model_dir import params_file
from tfm_ext.config import checks
from tfm_ext.base.errors import UsageError
from tfm_ext.examples import digits_convnet  # pylint: disable=unused-import
from tfm_ext.run import driver

EXP = "digits_convnet"


def build(**sources):
  return params_lib.build(params_lib.ConfigSources(experiment=EXP, **sources))


def prepare(model_dir, mode="train", **sources):
  return driver.prepare(driver.RunRequest(
      experiment=EXP, mode=mode, model_dir=str(model_dir),
      params=build(**sources)))


def write(path, text):
  path.write_text(text)
  return str(path)


# --- A key given twice: YAML would keep the last. ---------------------------

DUPLICATED = [
    ("trainer:\n  train_steps: 500\n  steps_per_loop: 10\n"
     "  train_steps: 30\n",
     "gives trainer.train_steps twice: 500 (line 2) and 30 (line 4)"),
    # A whole section twice: the first one's fields would be dropped.
    ("task:\n  model: {dropout_rate: 0.5}\ntrainer: {train_steps: 30}\n"
     "task:\n  train_data: {global_batch_size: 8}\n",
     "gives task twice (lines 1 and 4)"),
    ("task:\n  model:\n    dropout_rate: 0.1\n    dropout_rate: 0.2\n",
     "gives task.model.dropout_rate twice: 0.1 (line 3) and 0.2 (line 4)"),
]


@pytest.mark.parametrize("text, said", DUPLICATED,
                         ids=["key", "section", "nested"])
def test_a_config_file_giving_a_key_twice_is_refused_naming_key_and_lines(
    tmp_path, text, said):
  path = write(tmp_path / "c.yaml", text)
  with pytest.raises(UsageError) as raised:
    build(config_files=[path])
  assert str(raised.value).startswith(f"--config_file {path!r} {said}")
  assert "give it once" in str(raised.value)


@pytest.mark.parametrize("override, said", [
    # TFM turns `a.b=1,a.b=2` into a flow mapping with `b` twice.
    ("trainer.train_steps=500,trainer.train_steps=30",
     "gives trainer.train_steps twice: 500 and 30"),
    ("trainer.train_steps=30,trainer=null", "gives trainer twice"),
    ('{"trainer": {"train_steps": 500}, "trainer": {"steps_per_loop": 10}}',
     "gives trainer twice"),
    ("trainer:\n  train_steps: 500\n  train_steps: 30\n",
     "gives trainer.train_steps twice: 500 (line 2) and 30 (line 3)"),
])
def test_an_override_giving_a_key_twice_is_refused(override, said):
  with pytest.raises(UsageError) as raised:
    build(params_override=override)
  assert str(raised.value).startswith(f"--params_override {said}")


def test_an_override_file_giving_a_key_twice_is_refused(tmp_path):
  path = write(tmp_path / "o.yaml", "trainer: {train_steps: 1}\n"
               "trainer: {train_steps: 2}\n")
  with pytest.raises(UsageError, match=r"^--params_override file .*o\.yaml' "
                     r"gives trainer twice"):
    build(params_override=path)


def test_a_merge_may_still_be_overridden(tmp_path):
  # `<<` is not a key: the mapping's own keys win over the merged ones.
  path = write(tmp_path / "c.yaml",
               "shared: &loop {steps_per_loop: 10, summary_interval: 10}\n"
               "trainer:\n  <<: *loop\n  steps_per_loop: 5\n")
  assert params_file.read_mapping(path)["trainer"] == {
      "steps_per_loop": 5, "summary_interval": 10}


def test_an_evaluator_refuses_to_follow_a_params_yaml_giving_a_key_twice(
    tmp_path):
  params_file.write(build(), str(tmp_path))
  params_yaml = tmp_path / "params.yaml"
  params_yaml.write_text(params_yaml.read_text()
                         + "trainer:\n  train_steps: 7\n")
  with pytest.raises(UsageError) as raised:
    params_lib.build(params_lib.ConfigSources(experiment=EXP),
                     follow=str(params_yaml))
  assert str(raised.value).startswith(f"{params_yaml} gives trainer twice")
  assert "an evaluator cannot follow" in str(raised.value)


def test_launcher_refuses_a_config_file_giving_a_key_twice(
    launch_forked, tmp_path):
  path = write(tmp_path / "c.yaml", DUPLICATED[0][0])
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      f"--config_file={path}", model_dir=tmp_path / "m")
  assert_clean_usage_error(run, f"--config_file {path!r} gives "
                           "trainer.train_steps twice: 500 (line 2) and 30 "
                           "(line 4)")


# --- A single-valued flag given twice: absl would keep the last. ------------


@pytest.fixture
def flag_values():
  """A flag of each kind the launcher has, as TFM and the launcher define."""
  values = flags.FlagValues()
  flags.DEFINE_string("params_override", None, "", flag_values=values)
  flags.DEFINE_string("mode", None, "", flag_values=values)
  flags.DEFINE_string("experiment", None, "", flag_values=values)
  flags.DEFINE_integer("max_restarts", 3, "", short_name="r",
                       flag_values=values)
  flags.DEFINE_bool("allow_config_change", False, "", flag_values=values)
  flags.DEFINE_multi_string("config_file", None, "", flag_values=values)
  flags.DEFINE_multi_string("gin_params", None, "", flag_values=values)
  return values


def test_absl_keeps_the_last_of_a_flag_given_twice(flag_values):
  # Why the check exists: the first override is silently dropped.
  flag_values(["prog", "--params_override=trainer.train_steps=30",
               "--params_override=trainer.train_steps=500"])
  assert flag_values.params_override == "trainer.train_steps=500"


@pytest.mark.parametrize("argv, said", [
    (["--params_override=trainer.train_steps=30", "--mode=train",
      "--params_override", "trainer.train_steps=500"],
     "--params_override is given twice, "
     "'--params_override=trainer.train_steps=30' and "
     "'--params_override=trainer.train_steps=500'"),
    (["-mode=train", "--mode", "eval"],
     "--mode is given twice, '--mode=train' and '--mode=eval'"),
    (["--allow_config_change", "--noallow_config_change"],
     "--allow_config_change is given twice, '--allow_config_change=true' "
     "and '--allow_config_change=false'"),
    (["-r", "2", "--max_restarts=5"],
     "--max_restarts is given twice, '--max_restarts=2' and "
     "'--max_restarts=5'"),
])
def test_a_single_valued_flag_given_twice_is_refused_with_both_values(
    flag_values, argv, said):
  with pytest.raises(UsageError) as raised:
    params_lib.check_repeated_flags(argv, flag_values)
  assert str(raised.value).startswith(said)
  assert "Give it once" in str(raised.value)


def test_a_repeated_override_is_told_how_to_give_both(flag_values):
  with pytest.raises(UsageError, match="comma-separated"):
    params_lib.check_repeated_flags(
        ["--params_override=a=1", "--params_override=b=2"], flag_values)


@pytest.mark.parametrize("argv", [
    # Multi flags repeat by design.
    ["--config_file=a.yaml", "--config_file", "b.yaml",
     "--gin_params=x=1", "--gin_params=y=2"],
    # A value that looks like a flag is the value of the flag before it.
    ["--experiment", "--mode=train", "--mode=eval"],
    # After `--`, arguments are the program's; unknown names are absl's.
    ["--mode=train", "--", "--mode=eval"],
    ["--unknown=1", "--unknown=2", "positional", "positional"],
])
def test_flags_absl_reads_once_or_that_may_repeat_pass(flag_values, argv):
  params_lib.check_repeated_flags(argv, flag_values)


def test_launcher_refuses_params_override_given_twice(launch_forked,
                                                      tmp_path):
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      "--params_override=trainer.train_steps=30",
                      "--params_override=trainer.steps_per_loop=10",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--params_override is given twice")


# --- Values that cannot train (the rules: tests/config/test_checks.py). ----


@pytest.mark.parametrize("override, said", [
    # An OverflowError once params.yaml and training_starts/ were written.
    (f"trainer.train_steps={10**20}",
     f"trainer.train_steps={10**20}: give a whole number TensorFlow holds"),
    ("trainer.optimizer_config.learning_rate.cosine.initial_learning_rate="
     "-0.003", "initial_learning_rate=-0.003: give a number, 0 or more"),
    ("task.model.dropout_rate=1.5", "task.model.dropout_rate=1.5: give a "
     "number from 0 to below 1"),
], ids=["int64", "learning_rate", "dropout"])
def test_launcher_refuses_values_that_cannot_train(launch_forked, tmp_path,
                                                   override, said):
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      f"--params_override={override}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, said)


# --- task.init_checkpoint that holds no checkpoint. -------------------------


def save_checkpoint(directory) -> str:
  """Saves a checkpoint in `directory` as a run does; returns its prefix."""
  return tf.train.CheckpointManager(
      tf.train.Checkpoint(v=tf.Variable(1.0)), str(directory),
      max_to_keep=1).save()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A checkpoint prefix in a directory of its own (a pretrained model)."""
  return save_checkpoint(tmp_path_factory.mktemp("pretrained"))


def init_checkpoint(model_dir, source, mode="train"):
  return prepare(model_dir, mode,
                 params_override=f"task.init_checkpoint='{source}'")


def test_an_empty_directory_as_init_checkpoint_is_refused(tmp_path):
  # TFM's task.initialize trains from scratch, said in an INFO line.
  (tmp_path / "empty").mkdir()
  with pytest.raises(UsageError) as raised:
    init_checkpoint(tmp_path / "m", tmp_path / "empty")
  assert str(raised.value).startswith(
      f"task.init_checkpoint='{tmp_path / 'empty'}' is a directory without "
      "a checkpoint")
  assert "TFM would train from scratch" in str(raised.value)
  assert not (tmp_path / "m").exists()


def test_a_directory_of_checkpoints_without_a_state_file_names_one(
    tmp_path):
  prefix = save_checkpoint(tmp_path / "pretrained")
  os.remove(tmp_path / "pretrained" / "checkpoint")
  with pytest.raises(UsageError, match=f"give its prefix '{prefix}'"):
    init_checkpoint(tmp_path / "m", tmp_path / "pretrained")


@pytest.mark.parametrize("make, said", [
    (lambda d: str(d / "missing"), "names nothing"),
    (lambda d: write(d / "weights.h5", "not a checkpoint"),
     "is not a checkpoint TensorFlow can read"),
])
def test_an_init_checkpoint_that_is_no_checkpoint_is_refused(tmp_path, make,
                                                             said):
  source = make(tmp_path)
  with pytest.raises(UsageError) as raised:
    init_checkpoint(tmp_path / "m", source)
  assert str(raised.value).startswith(f"task.init_checkpoint={source!r}")
  assert said in str(raised.value)


def test_an_index_file_as_init_checkpoint_is_told_its_prefix(tmp_path, saved):
  # TensorFlow "restores" it as a name-based checkpoint of no variables.
  with pytest.raises(UsageError, match=f"give '{saved}'"):
    init_checkpoint(tmp_path / "m", saved + ".index")


def test_a_checkpoint_or_its_directory_as_init_checkpoint_passes(tmp_path,
                                                                 saved):
  init_checkpoint(tmp_path / "m", saved)
  init_checkpoint(tmp_path / "m", os.path.dirname(saved))


def test_a_run_with_its_own_checkpoint_ignores_init_checkpoint(tmp_path):
  # Resuming restores model_dir's checkpoint; TFM never reads the other.
  model_dir = tmp_path / "m"
  save_checkpoint(model_dir)
  init_checkpoint(model_dir, tmp_path / "missing")
  init_checkpoint(model_dir, tmp_path / "missing", mode="eval")


def test_launcher_refuses_an_empty_init_checkpoint_directory(launch_forked,
                                                             tmp_path):
  (tmp_path / "empty").mkdir()
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      "--params_override=task.init_checkpoint="
                      f"'{tmp_path / 'empty'}'", model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "task.init_checkpoint=", "is a directory "
                           "without a checkpoint")


# --- runtime.num_gpus above the GPUs present. -------------------------------

GPUS = len(tf.config.list_physical_devices("GPU"))


@pytest.mark.parametrize("strategy", ["mirrored", "one_device", "off"])
def test_more_gpus_than_tensorflow_sees_are_refused(tmp_path, strategy):
  # TFM builds its strategy on GPU:0.. without looking; without one, a
  # one_device or off run trained on the CPU, said nowhere.
  with pytest.raises(UsageError) as raised:
    prepare(tmp_path / "m", params_override=(
        f"runtime.distribution_strategy={strategy},"
        f"runtime.num_gpus={GPUS + 1}"))
  assert str(raised.value).startswith(
      f"runtime.num_gpus={GPUS + 1}, but TensorFlow sees "
      f"{f'only {GPUS}' if GPUS else 'no GPU'} on this host")
  assert f"give runtime.num_gpus={GPUS} or less" in str(raised.value)


def test_a_negative_num_gpus_is_refused():
  with pytest.raises(UsageError, match=r"runtime.num_gpus=-1: give a number "
                     "of GPUs, 0 or more"):
    checks.check_runtime(build(params_override="runtime.num_gpus=-1")
                            .runtime)


def test_the_gpus_present_pass():
  checks.check_runtime(build(params_override=(
      f"runtime.num_gpus={min(GPUS, 1)},"
      "runtime.distribution_strategy=mirrored")).runtime)


@pytest.mark.skipif(GPUS > 0, reason="this host has a GPU")
def test_launcher_refuses_a_gpu_on_a_host_without_one(launch_forked,
                                                      tmp_path):
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      "--params_override=runtime.num_gpus=1",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "runtime.num_gpus=1, but TensorFlow sees no "
                           "GPU on this host")


# --- A config file that is a stream: `--config_file=<(...)`. ---------------

STEPS = "trainer:\n  train_steps: 13\n"


def test_a_pipe_as_config_file_is_read_not_refused_as_empty(tmp_path):
  # What bash's `<(...)` passes: /dev/fd/N, a pipe whose size is 0.
  read_end, write_end = os.pipe()
  os.write(write_end, STEPS.encode())
  os.close(write_end)
  try:
    path = f"/dev/fd/{read_end}"
    assert build(config_files=[path]).trainer.train_steps == 13
    # Read once: an evaluator builds the config again to follow a trainer.
    assert build(config_files=[path]).trainer.train_steps == 13
  finally:
    os.close(read_end)


def fifo_with(path, text):
  """A FIFO at `path` that a thread fills with `text` once it is opened."""
  os.mkfifo(path)

  def fill():
    with open(path, "w") as f:
      f.write(text)

  threading.Thread(target=fill, daemon=True).start()
  return str(path)


def test_a_fifo_as_config_file_is_read(tmp_path):
  path = fifo_with(tmp_path / "config.fifo", STEPS)
  assert build(config_files=[path]).trainer.train_steps == 13


def test_a_fifo_giving_a_key_twice_is_refused_too(tmp_path):
  path = fifo_with(tmp_path / "config.fifo", STEPS + STEPS)
  with pytest.raises(UsageError, match="gives trainer twice"):
    build(config_files=[path])


def test_a_directory_as_config_file_is_refused(tmp_path):
  with pytest.raises(UsageError, match=f"--config_file '{tmp_path}' is a "
                     "directory, not a YAML file"):
    build(config_files=[str(tmp_path)])


def test_launcher_reads_a_fifo_as_config_file(launch_forked, tmp_path):
  path = fifo_with(tmp_path / "config.fifo", STEPS)
  run = launch_forked(f"--experiment={EXP}", "--print_config",
                      f"--config_file={path}", model_dir=tmp_path / "m")
  assert run.returncode == 0, run
  assert "  train_steps: 13\n" in run.stdout
  assert not (tmp_path / "m").exists()


def test_launcher_reads_a_process_substitution_as_config_file(tmp_path):
  # The user's command, through bash: `<(...)` is /dev/fd/63, a pipe.
  command = (f"{sys.executable} {TRAIN} --experiment={EXP} --print_config "
             f"--model_dir={tmp_path / 'm'} "
             "--config_file=<(printf 'trainer:\\n  train_steps: 13\\n')")
  proc = subprocess.run(
      ["bash", "-c", command], capture_output=True, text=True, timeout=300,
      cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO,
                         TF_CPP_MIN_LOG_LEVEL="2"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "  train_steps: 13\n" in proc.stdout
  assert not (tmp_path / "m").exists()


# --- --gin_file that is not a gin file (in-process: test_params.py). -------


def test_launcher_refuses_a_directory_as_gin_file(launch_forked, tmp_path):
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      f"--gin_file={tmp_path}", model_dir=tmp_path / "m")
  assert_clean_usage_error(run, f"--gin_file {str(tmp_path)!r} is a "
                           "directory")
