"""Every mode of the launcher, end to end on digits_convnet, in subprocesses.

The default run starts a fresh interpreter; the others are forked from one
that imported the launcher (`launch_forked`).
"""

import glob
import hashlib
import os
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from conftest import DOUBLES_TRAIN
from conftest import REPO
from conftest import SMOKE
from conftest import TRAIN


def _read(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.slow
def test_default_run_trains_to_97_percent_with_all_records(launch, tmp_path):
  model_dir = tmp_path / "digits"
  run = launch("--experiment=digits_convnet", "--mode=train_and_eval",
               model_dir=model_dir)
  assert run.returncode == 0, run
  summary = run.summary()
  assert summary["trainer"] == "custom"
  assert summary["global_step"] == 500
  assert summary["eval_metrics"]["accuracy"] >= 0.97, summary
  assert summary["examples_per_second"] > 0
  assert 0 < summary["time_to_first_step_seconds"] < summary["wall_seconds"]
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-500")
  assert glob.glob(str(model_dir / "train" / "events.out.tfevents.*"))
  assert glob.glob(str(model_dir / "validation" / "events.out.tfevents.*"))
  assert (model_dir / "best_ckpt" / "info.json").exists()
  best = tf.train.latest_checkpoint(str(model_dir / "best_ckpt"))
  assert best
  # The done line and the summary say where the best checkpoint is.
  assert summary["best"]["path"] == best, summary["best"]
  assert summary["best"]["metric"] == "accuracy"
  (done,) = [l for l in run.stdout.splitlines() if l.startswith("done |")]
  assert (f"| best accuracy {summary['best']['value']:.4g} @ step "
          f"{summary['best']['global_step']}: {best} |") in done, done
  assert "name: custom" in (model_dir / "params.yaml").read_text()
  assert (model_dir / "operative_config.train_and_eval.gin").exists()
  # One console line per event: 11 train loops (1, 50, ..., 500), 5 evals.
  lines = run.stdout.splitlines()
  assert len([l for l in lines if l.startswith("step ")]) == 11, run.stdout
  assert len([l for l in lines if l.startswith("eval @ step")]) == 5
  assert "step 500/500" in run.stdout and "ex/s" in run.stdout
  assert "ETA" in run.stdout
  assert "train | step:" not in run.stdout  # Orbit's own lines: log only.
  # A quiet console: what TensorFlow logs while the job is prepared is in
  # the log file alone, and CUDA's cuInit error only where a GPU is.
  console = run.stdout + run.stderr
  assert "Using MirroredStrategy" not in console, console
  assert "Using MirroredStrategy" in _read_log(model_dir)
  if not glob.glob("/dev/nvidia*"):
    assert "cuInit" not in console, console
  repeated = [l for l in set(console.splitlines())
              if console.splitlines().count(l) > 1]
  assert not repeated, console


def _read_log(model_dir):
  with open(model_dir / "logs" / "tfm_ext.INFO") as f:
    return f.read()


@pytest.mark.slow
def test_train_then_eval_then_continuous_eval(launch_forked, tmp_path):
  model_dir = tmp_path / "m"
  train = launch_forked("--experiment=digits_convnet", "--mode=train",
                        f"--params_override={SMOKE}", model_dir=model_dir)
  assert train.returncode == 0, train
  assert train.summary()["global_step"] == 40
  assert train.summary()["eval_metrics"] == {}
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-40")
  # Every checkpoint_interval=20 steps, none after the first loop (step 1).
  assert sorted(p.name for p in model_dir.glob("ckpt-*.index")) == [
      "ckpt-20.index", "ckpt-40.index"]
  params_hash = _read(model_dir / "params.yaml")

  evaluate = launch_forked("--experiment=digits_convnet", "--mode=eval",
                           f"--params_override={SMOKE}", model_dir=model_dir)
  assert evaluate.returncode == 0, evaluate
  # An evaluator keeps its own record; training's stays as it was.
  summary = evaluate.summary("eval_summary.json")
  assert summary["mode"] == "eval" and summary["global_step"] == 40
  assert train.summary()["mode"] == "train"
  assert 0.0 < summary["eval_metrics"]["accuracy"] <= 1.0
  assert _read(model_dir / "params.yaml") == params_hash  # eval never writes it
  assert (model_dir / "operative_config.eval.gin").exists()

  start = time.monotonic()
  continuous = launch_forked("--experiment=digits_convnet",
                             "--mode=continuous_eval",
                             f"--params_override={SMOKE}", model_dir=model_dir)
  assert continuous.returncode == 0, continuous
  # The final checkpoint exists, so it must not wait for the 60 s timeout.
  assert time.monotonic() - start < 45
  summary = continuous.summary("eval_summary.json")
  assert summary["mode"] == "continuous_eval"
  assert summary["eval_metrics"]["accuracy"] > 0
  assert _read(model_dir / "params.yaml") == params_hash


def test_train_and_post_eval_evaluates_once_after_training(launch_forked,
                                                           tmp_path):
  run = launch_forked("--experiment=digits_convnet",
                      "--mode=train_and_post_eval",
                      f"--params_override={SMOKE}", model_dir=tmp_path / "m")
  assert run.returncode == 0, run
  assert run.summary()["global_step"] == 40
  assert "accuracy" in run.summary()["eval_metrics"]
  assert run.stdout.count("eval @ step 40") == 1


def test_list_shows_every_registry(launch_forked, tmp_path):
  run = launch_forked("--list", model_dir=tmp_path / "unused")
  assert run.returncode == 0, run
  for expected in ("experiments:", "digits_convnet", "tasks:", "DigitsTask",
                   "trainers:", "custom", "tfm_base", "models:"):
    assert expected in run.stdout
  assert not os.path.exists(tmp_path / "unused")
  # The actions registered by a launcher's registrations, with their phase.
  run = launch_forked("--list", model_dir=tmp_path / "unused",
                      script=DOUBLES_TRAIN)
  assert run.returncode == 0, run
  actions = run.stdout[run.stdout.index("actions:"):].splitlines()
  assert any(l.split()[:2] == ["user_post", "(train)"] for l in actions)
  assert any(l.split()[:2] == ["required_post", "(eval)"] for l in actions)


def test_importing_the_launcher_changes_no_signal_handler():
  # A fork's script imports tfm_ext.run.launcher first; only its `main`
  # (or a script's `_startup.begin()`) installs the start-up handlers.
  code = ("import signal\n"
          "signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)\n"
          "before = [signal.getsignal(s) for s in signals]\n"
          "import tfm_ext.run.launcher\n"
          "import os\n"
          "print([signal.getsignal(s) for s in signals] == before,\n"
          "      os.environ.get('TF_USE_LEGACY_KERAS'))")
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, cwd=REPO,
                        env=dict(env, PYTHONPATH=REPO), check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # Nor the user's tf.keras: a launcher's `begin` decides it, not an import.
  assert proc.stdout.split()[-2:] == ["True", "None"]


def test_launcher_freezes_what_it_imported_and_turns_the_collector_on():
  # The launcher imports with Python's collector off (start-up is 0.7 s
  # shorter); training must then run with it on, TensorFlow's objects frozen.
  # Its TensorFlow's `tf.keras` is TFM's Keras 2, and Keras 3 was never
  # imported (a third of TensorFlow's import).
  code = ("import gc, runpy, sys\n"
          "assert gc.isenabled()\n"
          "runpy.run_path(sys.argv[1], run_name='imported')\n"
          "import tensorflow as tf\n"
          "print(gc.isenabled(), gc.get_freeze_count(),\n"
          "      'keras._tf_keras' in sys.modules, tf.keras.__name__)")
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  proc = subprocess.run([sys.executable, "-c", code, TRAIN],
                        capture_output=True, text=True, cwd=REPO,
                        env=dict(env, PYTHONPATH=REPO), check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  enabled, frozen, keras_3, keras = proc.stdout.split()[-4:]
  assert enabled == "True"
  assert int(frozen) > 300_000, frozen  # TensorFlow's, TFM's, ours.
  assert keras_3 == "False" and keras.startswith("tf_keras"), proc.stdout
