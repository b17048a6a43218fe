"""The reference runner's command line through `resnet_ctl_imagenet_main.py`."""

import os
import re
import shlex
import textwrap

from absl import flags
import pytest
import yaml

from conftest import REPO
import registry_imports  # pylint: disable=unused-import
from experiments.imagenet import reference_flags
from experiments.imagenet import reference_runner
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
from tfm_ext.config import params as params_lib
from tfm_ext.base.errors import UsageError
from conftest import assert_clean_usage_error

MAIN = os.path.join(REPO, "launchers", "resnet_ctl_imagenet_main.py")
# The reference README's two command lines, paths aside.
README_GPU = ("--model_dir={model_dir} --num_gpus=2 --batch_size=128 "
              "--train_epochs=90 --train_steps=10 --use_synthetic_data=false")
README_TPU = ("--tpu=my-tpu --model_dir={model_dir} --data_dir={data_dir} "
              "--batch_size=1024 --steps_per_loop=500 --train_epochs=1 "
              "--use_synthetic_data=false --dtype=fp32 --enable_eager=true "
              "--enable_tensorboard=true --distribution_strategy=tpu "
              "--log_steps=50 --single_l2_loss_op=true --use_tf_function=true")


def readme_args(template, **paths):
  """The README command's flags, paths filled in; model_dir left to launch."""
  args = shlex.split(template.format(model_dir="M", **paths))
  return [a for a in args if not a.startswith("--model_dir")]


def parse(args, gpus_visible=0):
  """Parses reference flags in a private FlagValues and translates them."""
  flag_values = flags.FlagValues()
  reference_flags.define_flags(flag_values)
  flag_values(["main"] + args)
  return reference_runner.translate(flag_values, gpus_visible=gpus_visible)


def stats(stdout):
  line = [l for l in stdout.splitlines() if l.startswith("Run stats: ")][-1]
  return yaml.safe_load(line[len("Run stats: "):])


@pytest.mark.slow
def test_readme_smoke_command_trains_one_capped_epoch_and_reports_stats(
    launch_forked, imagenet_dir, tmp_path):
  # The README's GPU command, shrunk to this CPU: no GPU, batch 2, 2 steps.
  args = readme_args(README_GPU)
  args = [a for a in args if not a.startswith(("--num_gpus", "--batch_size",
                                               "--train_steps"))]
  run = launch_forked(*args, "--num_gpus=0", "--batch_size=2",
                      "--train_steps=2", f"--data_dir={imagenet_dir}",
                      model_dir=tmp_path / "m", script=MAIN)
  assert run.returncode == 0, run
  # --train_steps caps training at one epoch of 2 steps: not 90 epochs.
  assert run.summary()["global_step"] == 2
  assert re.search(r"--train_steps=2 trains one epoch of 2 steps, ignoring "
                   r"--train_epochs=90", run.stderr), run
  reported = stats(run.stdout)
  assert set(reported) == {"eval_loss", "eval_acc", "train_loss", "train_acc",
                           "avg_exp_per_second"}
  assert 0 <= reported["eval_acc"] <= 1 and reported["avg_exp_per_second"] > 0
  # As the reference: no --enable_checkpoint_and_export, no checkpoint; 1001
  # outputs; evaluation summaries under eval/.
  assert not [f for f in os.listdir(run.model_dir) if f.startswith("ckpt-")]
  assert os.listdir(os.path.join(run.model_dir, "eval"))
  with open(os.path.join(run.model_dir, "params.yaml")) as f:
    params = yaml.safe_load(f)
  assert params["task"]["model"]["num_classes"] == 1001
  assert params["task"]["train_data"]["global_batch_size"] == 2


@pytest.mark.slow
def test_tpu_style_command_on_cpu_checkpoints_every_5_loops_and_profiles(
    launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  model_dir.mkdir()
  (model_dir / "params.yaml").write_text("stale: true\n")  # A past run's.
  run = launch_forked(
      "--clean", "--num_gpus=0", "--batch_size=2", "--steps_per_loop=1",
      "--train_steps=6", "--use_synthetic_data=true", "--dtype=fp32",
      "--enable_eager=true", "--enable_tensorboard=true", "--log_steps=2",
      "--single_l2_loss_op=true", "--use_tf_function=true", "--skip_eval",
      "--enable_checkpoint_and_export=true", "--profile_steps=2,3",
      "--datasets_num_private_threads=2", "--training_dataset_cache",
      model_dir=model_dir, script=MAIN)
  assert run.returncode == 0, run
  summary = run.summary()
  assert summary["global_step"] == 6 and summary["mode"] == "train"
  assert summary["train_metrics"]["examples_per_second"] > 0  # --log_steps.
  # Every steps_per_loop * 5 = 5 steps from the start, and at the end.
  checkpoints = sorted(f[:-len(".index")] for f in os.listdir(model_dir)
                       if f.endswith(".index"))
  assert checkpoints == ["ckpt-5", "ckpt-6"]
  profiles = [f for _, _, files in os.walk(model_dir / "train" / "plugins")
              for f in files if f.endswith(".xplane.pb")]
  assert len(profiles) == 1
  assert "--enable_eager has no effect" in run.stderr
  assert set(stats(run.stdout)) == {"train_loss", "train_acc",
                                    "avg_exp_per_second"}
  with open(model_dir / "params.yaml") as f:
    params = yaml.safe_load(f)  # --clean replaced the stale one.
  assert params["task"]["single_l2_loss_op"] is True
  assert params["task"]["train_data"]["use_synthetic_data"] is True
  assert params["task"]["train_data"]["private_threadpool_size"] == 2


def test_readme_gpu_command_unchanged_asks_for_gpus_this_cpu_lacks(
    launch_forked, imagenet_dir, tmp_path):
  run = launch_forked(*readme_args(README_GPU),
                      f"--data_dir={imagenet_dir}", model_dir=tmp_path / "m",
                      script=MAIN)
  assert_clean_usage_error(run, "--num_gpus=2 asks for 2 GPUs",
                           "has 0", "--num_gpus=0")


def test_data_dir_without_imagenet_tfrecords_is_a_usage_error(
    launch_forked, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  run = launch_forked("--num_gpus=0", f"--data_dir={empty}",
                      model_dir=tmp_path / "m", script=MAIN)
  assert_clean_usage_error(run, "task.train_data.input_path",
                           f"{empty}/train-*-of-01024", "matches no file")


def test_batch_that_two_replicas_cannot_split_is_a_usage_error(
    launch_forked, imagenet_dir, tmp_path):
  script = tmp_path / "two_cpus.py"
  script.write_text(textwrap.dedent(f"""
      import runpy, sys
      import tensorflow as tf
      cpu = tf.config.list_physical_devices("CPU")[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
      sys.argv[0] = {MAIN!r}
      runpy.run_path({MAIN!r}, run_name="__main__")
  """))
  run = launch_forked("--num_gpus=0", "--batch_size=3",
                      f"--data_dir={imagenet_dir}", model_dir=tmp_path / "m",
                      script=str(script))
  assert_clean_usage_error(run, "global_batch_size=3", "2 replicas")


def test_tpu_readme_command_maps_onto_the_experiment():
  translation = parse(readme_args(README_TPU, data_dir="/data/imagenet"))
  assert translation.mode == "train_and_eval"
  assert any("--enable_eager has no effect" in n for n in translation.notes)
  params = params_lib.build(translation.sources)
  steps_per_epoch = 1281167 // 1024
  assert params.runtime.distribution_strategy == "tpu"
  assert params.runtime.tpu == "my-tpu"
  assert params.runtime.mixed_precision_dtype == "float32"
  assert params.task.train_data.input_path == (
      "/data/imagenet/train-*-of-01024")
  assert params.task.validation_data.input_path == (
      "/data/imagenet/validation-*-of-00128")
  assert params.task.train_data.global_batch_size == 1024
  assert params.task.single_l2_loss_op
  trainer = params.trainer
  assert (trainer.name, trainer.train_steps, trainer.steps_per_loop) == (
      "resnet_ctl", steps_per_epoch, 500)
  assert trainer.validation_interval == steps_per_epoch
  assert trainer.validation_steps == 49  # ceil(50000 / 1024)
  assert trainer.summary_interval == 500 and trainer.log_steps == 50
  assert trainer.checkpoint_interval == 0  # Not asked for: none, as there.
  assert trainer.train_tf_function and trainer.train_tf_while_loop


def test_train_steps_beyond_an_epoch_are_cut_to_one_epoch():
  its = reference_runner.iterations(batch_size=1024, train_epochs=90,
                                    train_steps=5000)
  assert (its.steps_per_epoch, its.train_epochs) == (1251, 1)
  assert "ImageNet epoch at batch 1024 is 1251 steps" in its.notes[0]
  its = reference_runner.iterations(batch_size=1024, train_epochs=90,
                                    train_steps=None)
  assert (its.steps_per_epoch, its.train_epochs, its.notes) == (1251, 90, [])


@pytest.mark.parametrize("args, fragment", [
    (["--num_gpus=-1", "--distribution_strategy=one_devce"],
     "Unknown --distribution_strategy='one_devce'"),
    (["--num_gpus=0", "--use_tf_function=false"],
     "--use_tf_while_loop needs --use_tf_function"),
    (["--num_gpus=0", "--loss_scale=big"], "--loss_scale must be"),
    (["--num_gpus=-2"], "--num_gpus must be -1"),
])
def test_bad_flag_values_are_usage_errors(args, fragment):
  with pytest.raises(UsageError, match=re.escape(fragment)):
    parse(args)


def test_num_gpus_minus_one_means_every_visible_gpu():
  translation = parse(["--num_gpus=-1"], gpus_visible=3)
  runtime = yaml.safe_load(translation.sources.params_override)["runtime"]
  assert runtime["num_gpus"] == 3


def test_clean_refuses_a_directory_no_run_wrote(tmp_path):
  (tmp_path / "notes.txt").write_text("mine")
  (tmp_path / "checkpoint").write_text("")
  with pytest.raises(UsageError, match="notes.txt"):
    reference_runner.check_cleanable(str(tmp_path))
  assert (tmp_path / "notes.txt").exists()
  (tmp_path / "notes.txt").unlink()
  reference_runner.check_cleanable(str(tmp_path))  # Only run outputs: fine.
