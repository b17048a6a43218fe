"""Paths TensorFlow cannot take, and records of the wrong kind, in every mode.

A path of bytes that are not UTF-8 (Python reads them from the command line
as surrogate escapes; TensorFlow's file systems take UTF-8 only), a name
longer than the file system allows, a directory where a record of the
model_dir belongs, a file where a folder does: each is one line naming the
flag or the file, exit 2, nothing written, whatever the mode. An export
step that is not a SavedModel is refused, never reported as an export; a
damaged best checkpoint is skipped by an export as by a training start.
"""

import json
import os
import shutil

import pytest

from conftest import assert_clean_usage_error
from conftest import built_once

EXP = "--experiment=digits_convnet"
NOT_UTF8 = os.fsdecode(b"\xff")  # What Python makes of the byte 0xff.


def test_a_model_dir_that_is_not_utf8_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      model_dir=f"{tmp_path}/run{NOT_UTF8}")
  assert_clean_usage_error(run, "--model_dir=", r"run\xff",
                           "not UTF-8", "TensorFlow")


def test_a_config_file_that_is_not_utf8_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      f"--config_file={tmp_path}/c{NOT_UTF8}.yaml",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--config_file: ", r"c\xff.yaml",
                           "not UTF-8")


def test_an_input_path_that_is_not_utf8_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train", "--params_override=task."
                      f"train_data.input_path={tmp_path}/d{NOT_UTF8}",
                      model_dir=tmp_path / "m")
  assert_clean_usage_error(run, "--params_override: ", "not UTF-8")


def test_a_model_dir_name_too_long_is_refused(launch_forked, tmp_path):
  run = launch_forked(EXP, "--mode=train",
                      model_dir=tmp_path / ("x" * 300))
  assert_clean_usage_error(run, "is 300 bytes long",
                           "this file system takes at most 255")


@pytest.mark.parametrize("mode", ["train", "eval", "continuous_eval",
                                  "export"])
def test_a_directory_named_checkpoint_is_named_in_every_mode(
    launch_forked, tmp_path, mode):
  model_dir = tmp_path / "m"
  (model_dir / "checkpoint").mkdir(parents=True)
  run = launch_forked(EXP, f"--mode={mode}",
                      "--params_override=trainer.continuous_eval_timeout=1",
                      model_dir=model_dir)
  assert run.returncode == 2, run.stderr
  errors = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
  assert (f"{model_dir}/checkpoint is a directory, where the run writes a "
          "file (the checkpoint state file)") in errors[0], errors
  assert os.listdir(model_dir) == ["checkpoint"]


def test_an_input_that_is_a_named_pipe_is_refused_without_waiting(
    launch_forked, tmp_path):
  # Opening it would wait for a writer without end (and every epoch).
  pipe = tmp_path / "train.tfrecord"
  os.mkfifo(pipe)
  run = launch_forked(EXP, "--mode=train",
                      f"--params_override=task.train_data.input_path={pipe}",
                      model_dir=tmp_path / "m", timeout=120)
  assert run.returncode == 3, run.stderr
  assert f"{pipe} is a named pipe (FIFO), not a file" in run.stderr
  assert "Traceback" not in run.stderr
  assert not (tmp_path / "m").exists()


# -- Records of the wrong kind in a trained model_dir -------------------------

# Two evaluations, so two best checkpoints (digits_convnet keeps 3).
TRAINED = ("--params_override=trainer.train_steps=20,trainer.steps_per_loop=10,"
           "trainer.summary_interval=10,trainer.checkpoint_interval=10,"
           "trainer.validation_interval=10,trainer.validation_steps=2")


@pytest.fixture(scope="module")
def trained(launch_forked, tmp_path_factory):
  def train(folder):
    run = launch_forked(EXP, "--mode=train_and_eval", TRAINED,
                        model_dir=os.path.join(folder, "m"))
    assert run.returncode == 0, run
  return os.path.join(built_once(tmp_path_factory, "bad_paths_trained", train),
                      "m")


@pytest.fixture
def model_dir(trained, tmp_path):
  path = str(tmp_path / "m")
  # Keeps the mtimes, and absl's link to the latest log a link.
  shutil.copytree(trained, path, symlinks=True)
  return path


def snapshot(model_dir):
  """Every file, link and folder under `model_dir`: name -> (what, mtime).

  A file's bytes and mtime; where a link points (a job refused after its
  start points absl's link back at the log before its own); that a folder
  is there (its mtime changes with what comes and goes in it).
  """
  found = {}
  for root, folders, names in os.walk(model_dir):
    for name in folders + names:
      path = os.path.join(root, name)
      if os.path.islink(path):
        found[os.path.relpath(path, model_dir)] = (os.readlink(path), None)
      elif os.path.isdir(path):
        found[os.path.relpath(path, model_dir)] = ("folder", None)
      else:
        with open(path, "rb") as f:
          found[os.path.relpath(path, model_dir)] = (
              f.read(), os.stat(path).st_mtime_ns)
  return found


def _replace(model_dir, name, kind):
  """Puts `kind` ("file", "dir") at `name`, where a record is or belongs."""
  path = os.path.join(model_dir, name)
  if os.path.isdir(path):
    shutil.rmtree(path)
  elif os.path.exists(path):
    os.remove(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if kind == "dir":
    os.mkdir(path)
  else:
    with open(path, "w") as f:
      f.write("mine")


WRONG_KINDS = [  # What a careless hand leaves, and the mode that meets it.
    ("train", "file", "train_and_eval", "a directory"),
    ("validation", "file", "eval", "a directory"),
    ("best_ckpt", "file", "continuous_eval", "a directory"),
    ("export", "file", "export", "a directory"),
    ("export/20", "file", "export", "a directory"),
    ("metrics.csv", "dir", "train", "a file"),
    ("plateau.json", "dir", "train_and_eval", "a file"),
    ("best_ckpt/best_checkpoints.json", "dir", "train_and_eval", "a file"),
    ("run_summary.json", "dir", "train", "a file"),
    ("eval_ledger", "file", "continuous_eval", "a directory"),
    ("training_starts/0-1.json", "dir", "train", "a file"),
    ("eval_ledger/ckpt-10.json", "dir", "continuous_eval", "a file"),
]


@pytest.mark.parametrize("name, kind, mode, wanted", WRONG_KINDS,
                         ids=[f"{n}-{k}-{m}" for n, k, m, _ in WRONG_KINDS])
def test_a_record_of_the_wrong_kind_is_refused_before_anything_is_written(
    launch_forked, model_dir, name, kind, mode, wanted):
  _replace(model_dir, name, kind)
  before = snapshot(model_dir)
  trains = mode.startswith("train")
  run = launch_forked(EXP, f"--mode={mode}", (
      TRAINED.replace("train_steps=20", "train_steps=40") if trains
      else "--params_override=trainer.continuous_eval_timeout=1"),
                      model_dir=model_dir)

  assert run.returncode == 2, run
  errors = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in run.stderr, run
  found = "a file" if kind == "file" else "a directory"
  assert (f"{model_dir}/{name} is {found}, where the run writes {wanted}"
          in errors[0]), errors
  assert snapshot(model_dir) == before


def _manifest(model_dir):
  with open(os.path.join(model_dir, "best_ckpt", "best_checkpoints.json")) as f:
    return json.load(f)["checkpoints"]


def _cut_short(prefix):
  data = f"{prefix}.data-00000-of-00001"
  with open(data, "r+b") as f:
    f.truncate(os.path.getsize(data) // 2)


def test_export_skips_a_damaged_best_checkpoint_and_exports_the_next_best(
    launch_forked, model_dir):
  best, second = [os.path.join(model_dir, "best_ckpt", entry["path"])
                  for entry in _manifest(model_dir)[:2]]
  _cut_short(best)
  before = snapshot(model_dir)

  run = launch_forked(EXP, "--mode=export", model_dir=model_dir)

  assert run.returncode == 0, run
  assert "Traceback" not in run.stderr, run
  assert f"Skipped {best} (its data is cut short" in run.stderr, run
  step = second.rsplit("-", 1)[1]
  assert f"export @ step {step} | {model_dir}/export/{step} | from {second}" in (
      run.stdout), run
  assert os.path.exists(os.path.join(model_dir, "export", step,
                                     "saved_model.pb"))
  # Every file as it was (absl's link points at the export's log now).
  after = snapshot(model_dir)
  kept = [k for k in before if isinstance(before[k][0], bytes)]
  assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}


@pytest.mark.parametrize("fault, why", [
    ("empty", "it holds no saved_model.pb"),
    ("no_variables", "its variables cannot be read: its .index file is missing"),
    ("not_a_proto", "its saved_model.pb does not parse"),
])
def test_an_export_step_that_is_not_a_saved_model_is_refused_not_reported(
    launch_forked, model_dir, fault, why):
  step = _manifest(model_dir)[0]["path"].rsplit("-", 1)[1]
  export_dir = os.path.join(model_dir, "export", step)
  if fault == "no_variables":  # A real export, its variables then lost.
    first = launch_forked(EXP, "--mode=export", model_dir=model_dir)
    assert first.returncode == 0, first
    shutil.rmtree(os.path.join(export_dir, "variables"))
  else:
    os.makedirs(export_dir)
    if fault == "not_a_proto":
      with open(os.path.join(export_dir, "saved_model.pb"), "wb") as f:
        f.write(b"\xff" * 64)
  before = snapshot(model_dir)

  run = launch_forked(EXP, "--mode=export", model_dir=model_dir)

  assert run.returncode == 2, run
  errors = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in run.stderr, run
  assert errors[0].startswith(f"error: {export_dir} exists, but is not a "
                              f"SavedModel that loads: {why}"), errors
  assert "not overwritten" not in run.stdout and "export @" not in run.stdout
  assert snapshot(model_dir) == before
