"""Bad input: one clear paragraph, exit 2, no traceback, model_dir untouched.

Each refusal is a launcher process of its own: those of `launchers/train.py`
forked from one that imported it once (`launch_forked`), the two-CPU one and
the buggy hook from a fresh interpreter.
"""

import os
import shutil
import textwrap

import pytest

from conftest import SMOKE, TWO_CPUS_TRAIN, assert_clean_usage_error

EXP = "--experiment=digits_convnet"


def test_unknown_experiment_suggests_closest(launch_forked, tmp_path):
  run = launch_forked("--experiment=digits_convnett", "--mode=train",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "Unknown experiment 'digits_convnett'",
                           "Did you mean 'digits_convnet'?")


def test_unknown_trainer_lists_trainers(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train", "--trainer=custum",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "Unknown trainer 'custum'",
                           "Did you mean 'custom'?", "'tfm_base'")


def test_nlps_continuous_train_and_eval_is_refused_saying_what_to_run(
    launch_forked, tmp_path):
  # TFM's flag enum accepts this one and train_lib then cannot run it: it
  # is the NLP driver's continuous fine-tuning.
  run = launch_forked(EXP, "--mode=continuous_train_and_eval",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "TFM NLP's continuous fine-tuning",
                           "official/nlp/train.py",
                           "--mode=train_and_eval with")


def test_malformed_yaml_config_file_is_named(launch_forked, tmp_path):
  bad = tmp_path / "bad.yaml"
  bad.write_text("trainer:\n  train_steps: [10\n")
  run = launch_forked(EXP, "--mode=train", f"--config_file={bad}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, f"--config_file '{bad}' is not valid YAML")


def test_override_of_missing_key_names_the_key(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      "--params_override=trainer.trian_steps=5",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--params_override", "trainer.trian_steps",
                           "Closest: trainer.train_steps")


def test_bad_gin_binding(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      "--gin_params=no_such_configurable.x = 1",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "Bad gin configuration", "no_such_configurable")


def test_input_pattern_matching_no_file(launch_forked, tmp_path):
  pattern = str(tmp_path / "nowhere" / "train-*.tfrecord")
  run = launch_forked(EXP, "--mode=train",
                      f"--params_override=task.train_data.input_path={pattern}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "task.train_data.input_path", pattern,
                           "matches no file")


def test_eval_without_checkpoint(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=eval", model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "No checkpoint in --model_dir")


def test_global_batch_not_divisible_by_replicas(launch_forked, tmp_path):
  # Two logical CPUs and `mirrored` give two replicas; 63 does not split.
  run = launch_forked(EXP, "--mode=train", "--params_override="
                      "runtime.distribution_strategy=mirrored,"
                      "task.train_data.global_batch_size=63",
                      model_dir=tmp_path / "m", script=TWO_CPUS_TRAIN)
  assert_clean_usage_error(run, "task.train_data.global_batch_size=63",
                           "2 replicas")


def test_real_bug_in_a_hook_keeps_its_traceback(launch_forked, tmp_path):
  script = tmp_path / "buggy.py"
  script.write_text(textwrap.dedent("""
      from absl import app
      import tfm_ext
      import tfm_ext.run.launcher
      import registry_imports

      @tfm_ext.register_trainer("buggy")
      class Buggy(tfm_ext.CustomTrainer):
        def train_loop_end(self):
          return {"ratio": 1 / 0}

      app.run(tfm_ext.run.launcher.main)
  """))
  run = launch_forked(EXP, "--mode=train", "--trainer=buggy",
                      f"--params_override={SMOKE}", model_dir=tmp_path / "m",
                      script=str(script))
  assert run.returncode == 1
  assert "Traceback" in run.stderr and "ZeroDivisionError" in run.stderr, run
  assert "train_loop_end" in run.stderr
  # The record says so too, with the exit code the process had.
  summary = run.summary()
  assert (summary["status"], summary["exit_code"]) == ("failed", 1)
  assert summary["message"].startswith("a bug: ZeroDivisionError: division by zero")
  assert summary["global_step"] == 1  # The first loop (one step) ran.


def test_a_bug_while_building_writes_the_summary_too(launch_forked, tmp_path):
  script = tmp_path / "buggy_build.py"
  script.write_text(textwrap.dedent("""
      from absl import app
      import tfm_ext
      import tfm_ext.run.launcher
      import registry_imports

      @tfm_ext.register_trainer("buggy_build")
      class BuggyBuild(tfm_ext.CustomTrainer):
        def __init__(self, *args, **kwargs):
          super().__init__(*args, **kwargs)
          raise TypeError("missing 1 required positional argument: 'x'")

      app.run(tfm_ext.run.launcher.main)
  """))
  run = launch_forked(EXP, "--mode=train", "--trainer=buggy_build",
                      f"--params_override={SMOKE}", model_dir=tmp_path / "m",
                      script=str(script))
  assert run.returncode == 1
  assert "Traceback" in run.stderr and "TypeError" in run.stderr, run
  summary = run.summary()
  assert (summary["status"], summary["exit_code"], summary["trainer"]) == (
      "failed", 1, "buggy_build")
  assert summary["message"].startswith("a bug: TypeError: missing 1 required")


def test_tpu_strategy_without_address(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      "--params_override=runtime.distribution_strategy=tpu",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "runtime.distribution_strategy=tpu needs a "
                           "TPU address", "--tpu")


def test_unknown_strategy_suggests_closest(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      "--params_override="
                      "runtime.distribution_strategy=mirorred",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "Unknown runtime.distribution_strategy "
                           "'mirorred'", "Did you mean 'mirrored'?", "'off'")


def test_one_device_strategy_with_several_gpus(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      "--params_override="
                      "runtime.distribution_strategy=one_device,"
                      "runtime.num_gpus=2", model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "runtime.num_gpus=2", "use mirrored")


@pytest.mark.parametrize("threads, shown", [("-1", "-1"), ("true", "True")])
def test_input_threads_that_are_not_a_count(launch_forked, tmp_path, threads,
                                            shown):
  field = "runtime.dataset_num_private_threads"
  run = launch_forked(EXP, "--mode=train",
                      f"--params_override={field}={threads}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, f"{field}={shown}",
                           "0: tf.data's own pool")


def test_export_flags_outside_an_export_are_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train", "--input_type=image_bytes",
                      "--checkpoint_path=300", model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--checkpoint_path=300 --input_type="
                           "image_bytes: for --mode=export, not --mode=train.")


@pytest.mark.parametrize("name, value", [
    ("GCS_STAT_CACHE_MAX_AGE", "abc"), ("GCS_STAT_CACHE_MAX_AGE", "-1"),
    ("TFM_EXT_LEASE_STALE_SECONDS", "0"),
    ("TFM_EXT_CLAIM_RENEW_SECONDS", "nan"),
    ("TFM_EXT_EVALUATOR_STALE_SECONDS", "1e999")])
def test_a_malformed_environment_value_is_refused(launch_forked, tmp_path,
                                                  name, value):
  run = launch_forked(EXP, "--mode=train", model_dir=tmp_path / "m",
                      env={name: value})
  assert_clean_usage_error(run, f"{name}={value!r} (in the environment)",
                           "give a number of seconds")


@pytest.mark.parametrize("mode, name", [("train", "logs"),
                                        ("export", "export")])
def test_a_file_where_a_folder_of_ours_belongs_is_named(
    launch_forked, two_checkpoints, tmp_path, mode, name):
  model_dir = tmp_path / "m"
  shutil.copytree(two_checkpoints, model_dir)
  shutil.rmtree(model_dir / name, ignore_errors=True)
  (model_dir / name).write_text("the user's")
  run = launch_forked(EXP, f"--mode={mode}", model_dir=model_dir)
  assert run.returncode == 2, run
  assert "Traceback" not in run.stderr, run
  error = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  # Refused before anything is written (tfm_ext.model_dir.usable.RECORDS).
  assert len(error) == 1 and (f"{model_dir / name} is a file, where the run "
                              "writes a directory") in error[0], run
  assert (model_dir / name).read_text() == "the user's"
