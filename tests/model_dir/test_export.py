"""--mode=export: any experiment to a SavedModel, from its best checkpoint.

One digits_convnet model_dir is trained once (evaluations at steps 100 and
200, then training on to 300 without evaluation, so the best checkpoint is
never the latest); each test exports a copy of it.
"""

import json
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from official.core import task_factory

import tfm_ext
from tfm_ext.model_dir import best_checkpoints
from tfm_ext.config import params as params_lib
from tfm_ext.model_dir import claim
from tfm_ext.model_dir import files
from tfm_ext.model_dir import export
from tfm_ext.run import driver

from experiments import digits_convnet

from conftest import built_once

CADENCE = ("trainer.steps_per_loop=50,trainer.summary_interval=50,"
           "trainer.checkpoint_interval=100,trainer.validation_interval=100")


@tfm_ext.register_trainer("png_serving")
class PngServingTrainer(tfm_ext.CustomTrainer):
  """Serves digits from PNG bytes, as the TFRecords' `image/encoded` holds them."""

  def serving_inputs(self, model):
    del model  # Takes what digits_convnet's task feeds it.

    def decode(png):
      image = tf.io.decode_png(png, channels=1)
      image.set_shape([digits_convnet.IMAGE_SIZE, digits_convnet.IMAGE_SIZE, 1])
      return tf.cast(image, tf.float32) / 255.0

    return export.ServingInputs(
        specs={"image_bytes": tf.TensorSpec([None], tf.string)},
        prepare=lambda inputs: tf.map_fn(
            decode, inputs["image_bytes"],
            fn_output_signature=tf.TensorSpec(
                [digits_convnet.IMAGE_SIZE, digits_convnet.IMAGE_SIZE, 1],
                tf.float32)))


def _run(mode, model_dir, train_steps, trainer=""):
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet", trainer=trainer,
      params_override=f"trainer.train_steps={train_steps},{CADENCE}"))
  return driver.execute(driver.prepare(driver.RunRequest(
      experiment="digits_convnet", mode=mode, model_dir=str(model_dir),
      params=params))), params


def _train(folder):
  _run("train_and_eval", os.path.join(folder, "run"), 200)
  _run("train", os.path.join(folder, "run"), 300)


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
  """`(model_dir, params, best)`: best is the manifest's best entry.

  Trained once a session; each test exports a copy.
  """
  del data_dir  # Sets TFM_EXT_DATA_DIR.
  model_dir = pathlib.Path(built_once(tmp_path_factory, "export_trained",
                                      _train)) / "run"
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet",
      params_override=f"trainer.train_steps=300,{CADENCE}"))
  manifest = files.read_json(str(model_dir / "best_ckpt" /
                                  best_checkpoints.MANIFEST))
  return model_dir, params, manifest["checkpoints"][0]


@pytest.fixture
def model_dir(trained, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(trained[0], copy)
  return copy


def _validation(params):
  """The validation split as evaluation reads it: (images, labels) batches."""
  task = task_factory.get_task(params.task)
  return task.build_inputs(params.task.validation_data)


def _accuracy(predict, batches):
  right = total = 0
  for inputs, labels in batches:
    predicted = np.argmax(predict(inputs), axis=-1)
    right += int(np.sum(predicted == labels.numpy()))
    total += len(predicted)
  assert total == digits_convnet.NUM_VALIDATION
  return right / total


def test_launcher_exports_the_best_checkpoint_that_classifies_as_it_evaluated(
    trained, model_dir, launch_forked):
  _, params, best = trained
  step = best["global_step"]
  assert step in (100, 200) and best["metrics"]["accuracy"] > 0.9
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-300")
  # An evaluator's record, which the export must leave as it is.
  evaluated = '{"mode": "continuous_eval", "eval_metrics": {"accuracy": 0.9}}'
  (model_dir / "eval_summary.json").write_text(evaluated)

  run = launch_forked("--experiment=digits_convnet", "--mode=export",
                      model_dir=model_dir)

  assert run.returncode == 0, run
  path = model_dir / "export" / str(step)
  assert f"export @ step {step} | {path}" in run.stdout
  assert (f"done | export | step {step} |" in run.stdout
          and f"| summary {model_dir}/export_summary.json" in run.stdout)
  exported = run.summary("export_summary.json")
  assert exported["mode"] == "export"
  # The metrics the best list recorded for the exported checkpoint.
  assert exported["eval_metrics"] == pytest.approx(best["metrics"])
  assert (model_dir / "eval_summary.json").read_text() == evaluated
  assert os.listdir(model_dir / "export") == [str(step)]
  serve = tf.saved_model.load(str(path)).signatures["serving_default"]
  spec = serve.structured_input_signature[1]["inputs"]
  assert (spec.shape.as_list(), spec.dtype) == ([None, 8, 8, 1], tf.float32)
  accuracy = _accuracy(lambda images: serve(inputs=images)["outputs"],
                       _validation(params))
  assert abs(accuracy - best["metrics"]["accuracy"]) <= 0.01


def test_without_a_best_checkpoint_the_latest_is_exported_once(
    trained, model_dir, capsys):
  shutil.rmtree(model_dir / "best_ckpt")
  path = model_dir / "export" / "300"

  summary, _ = _run("export", model_dir, 300)

  assert (summary.mode, summary.status, summary.global_step) == (
      "export", "completed", 300)
  assert os.listdir(model_dir / "export") == ["300"]
  pb = (path / "saved_model.pb").read_bytes()
  images = tf.random.stateless_uniform([4, 8, 8, 1], [1, 2])
  served = tf.saved_model.load(str(path)).signatures["serving_default"](
      inputs=images)["outputs"]
  # The same SavedModel loads as a Keras model, computing the same.
  np.testing.assert_allclose(tf_keras.models.load_model(path)(images), served,
                             atol=1e-6)

  capsys.readouterr()
  summary, _ = _run("export", model_dir, 300)
  assert summary.status == "completed"
  assert f"export @ step 300 | {path} exists: not overwritten" in (
      capsys.readouterr().out)
  assert (path / "saved_model.pb").read_bytes() == pb


def test_the_user_chooses_the_checkpoint_by_step_or_by_path(
    trained, model_dir, launch_forked):
  _, _, best = trained
  # A step: the latest, not the best, whose metrics no list recorded.
  run = launch_forked("--experiment=digits_convnet", "--mode=export",
                      "--checkpoint_path=300", model_dir=model_dir)
  assert run.returncode == 0, run
  assert f"from {model_dir}/ckpt-300" in run.stdout
  assert run.summary("export_summary.json")["eval_metrics"] == {}
  # TFM's convention: a checkpoint's prefix, here the best by its path.
  best_path = model_dir / "best_ckpt" / best["path"]
  run = launch_forked("--experiment=digits_convnet", "--mode=export",
                      f"--checkpoint_path={best_path}", model_dir=model_dir)
  assert run.returncode == 0, run
  assert sorted(os.listdir(model_dir / "export")) == sorted(
      ["300", str(best["global_step"])])
  assert run.summary("export_summary.json")["global_step"] == (
      best["global_step"])
  # A step or path that names nothing, or another mode: refused, unwritten.
  for args in (("--mode=export", "--checkpoint_path=250"),
               ("--mode=export", f"--checkpoint_path={model_dir}/ckpt-9"),
               ("--mode=eval", "--checkpoint_path=300")):
    before = sorted(os.listdir(model_dir))
    run = launch_forked("--experiment=digits_convnet", *args,
                        model_dir=model_dir)
    assert run.returncode == 2, run
    assert "--checkpoint_path" in run.stderr.splitlines()[-1], run.stderr
    assert sorted(os.listdir(model_dir)) == before


def test_an_interrupted_exports_leftover_is_cleared_first(trained,
                                                       model_dir):
  shutil.rmtree(model_dir / "best_ckpt")
  exports = model_dir / "export"
  # Left by an older version, and by a killed export of this machine.
  dead = subprocess.Popen(["true"])
  dead.wait()
  live = subprocess.Popen(["sleep", "60"])
  me = claim.Process.this()
  owner = me.machine
  leftovers = [".300.partial", f".300.partial.{owner}.{dead.pid}"]
  # In flight: a live process's copy, and another machine's.
  in_flight = [f".300.partial.{owner}.{live.pid}", ".300.partial.0ther.7"]
  # This version's: a copy and its owner's record; a record alone (killed
  # once its copy was placed).
  owners = {"dead1": claim.Process(me.host, dead.pid, me.space),
            "dead2": claim.Process(me.host, dead.pid, me.space),
            "live1": claim.Process(me.host, live.pid, me.space),
            "else1": claim.Process("another-host", dead.pid, me.space)}
  exports.mkdir(exist_ok=True)
  for token, process in owners.items():
    (exports / f".300.owner.{token}.json").write_text(
        json.dumps(process.fields()))
  leftovers += [".300.partial.dead1", ".300.owner.dead1.json",
                ".300.owner.dead2.json"]
  in_flight += [".300.partial.live1", ".300.owner.live1.json",
                ".300.partial.else1", ".300.owner.else1.json"]
  try:
    for name in leftovers + in_flight:
      if not name.endswith(".json"):
        (exports / name).mkdir(parents=True)
        (exports / name / "half_written").write_text("")

    summary, _ = _run("export", model_dir, 300)
  finally:
    live.kill()

  assert summary.status == "completed"
  assert sorted(os.listdir(exports)) == sorted(in_flight + ["300"])
  assert sorted(os.listdir(model_dir / "export" / "300")) == [
      "assets", "fingerprint.pb", "keras_metadata.pb", "saved_model.pb",
      "variables"]


def test_a_trainer_serving_png_bytes_classifies_the_raw_records(
    trained, model_dir):
  _, _, best = trained

  summary, _ = _run("export", model_dir, 300, trainer="png_serving")

  assert summary.global_step == best["global_step"]
  serve = tf.saved_model.load(str(
      model_dir / "export" / str(best["global_step"])
  )).signatures["serving_default"]
  assert list(serve.structured_input_signature[1]) == ["image_bytes"]
  records = tf.data.TFRecordDataset(
      digits_convnet.bundled_tfrecords("validation")).map(
          lambda r: tf.io.parse_single_example(r, {
              "image/encoded": tf.io.FixedLenFeature([], tf.string),
              "image/class/label": tf.io.FixedLenFeature([], tf.int64)}))
  batches = records.batch(120).map(
      lambda f: (f["image/encoded"], f["image/class/label"]))
  accuracy = _accuracy(lambda png: serve(image_bytes=png)["outputs"], batches)
  assert abs(accuracy - best["metrics"]["accuracy"]) <= 0.01


def test_export_without_a_checkpoint_exits_2_before_writing(launch_forked,
                                                           tmp_path):
  model_dir = tmp_path / "empty"

  run = launch_forked("--experiment=digits_convnet", "--mode=export",
                      model_dir=model_dir)

  assert run.returncode == 2, run
  assert "error: No checkpoint in --model_dir=" in run.stderr
  assert "Traceback" not in run.stderr
  assert not model_dir.exists()


def test_an_export_that_fails_leaves_neither_its_copy_nor_its_record(
    tmp_path):
  def write(partial):
    os.makedirs(partial)
    (pathlib.Path(partial) / "half_written").write_text("")
    token = partial.rsplit(".", 1)[1]
    assert sorted(os.listdir(tmp_path)) == [f".300.owner.{token}.json",
                                            f".300.partial.{token}"]
    record = json.loads((tmp_path / f".300.owner.{token}.json").read_text())
    assert record["owner"] == claim.Process.this().id
    raise OSError("a disk that filled up")

  with pytest.raises(OSError, match="filled up"):
    export.write_placed(str(tmp_path / "300"), write)
  assert os.listdir(tmp_path) == []

  export.write_placed(str(tmp_path / "300"), lambda partial: os.makedirs(
      partial))
  assert os.listdir(tmp_path) == ["300"]


def test_an_export_that_another_finished_first_is_dropped(tmp_path):
  finished, mine = tmp_path / "300", tmp_path / ".300.partial.x.1"
  for folder, content in ((finished, b"first"), (mine, b"second")):
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(content)

  with pytest.raises(FileExistsError, match="another export"):
    export.place(str(mine), str(finished))

  assert os.listdir(tmp_path) == ["300"]
  assert (finished / "saved_model.pb").read_bytes() == b"first"


def _garble(prefix):
  """64 zero bytes in the middle of the checkpoint's data: its checksum fails."""
  (data,) = prefix.parent.glob(prefix.name + ".data-*")
  content = data.read_bytes()
  middle = len(content) // 2
  data.write_bytes(content[:middle] + bytes(64) + content[middle + 64:])


def _cut_short(prefix):
  """The checkpoint's data cut in half (TensorFlow's reader: IndexError)."""
  (data,) = prefix.parent.glob(prefix.name + ".data-*")
  data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])


@pytest.mark.parametrize("damage", [_garble, _cut_short])
def test_a_damaged_checkpoint_chosen_is_exit_2_naming_it_and_nothing_exported(
    trained, model_dir, launch_forked, damage):
  # The best, damaged, is skipped (tests/e2e/test_bad_paths.py); chosen, it
  # is refused.
  _, _, best = trained
  best_path = model_dir / "best_ckpt" / best["path"]
  damage(best_path)

  run = launch_forked("--experiment=digits_convnet", "--mode=export",
                      f"--checkpoint_path={best_path}", model_dir=model_dir)

  assert run.returncode == 2, run
  line = run.stderr.splitlines()[-1]
  assert f"{best_path} cannot be read: its data cannot be read back" in line
  assert "Nothing was exported" in line and "Traceback" not in run.stderr
  assert not (model_dir / "export").exists()


def test_with_every_checkpoint_damaged_nothing_is_exported_naming_each(
    model_dir):
  damaged = sorted(p.with_suffix("") for p in model_dir.glob("**/*.index")
                   if "ckpt-" in p.name)
  for prefix in damaged:
    _garble(prefix)

  with pytest.raises(tfm_ext.UsageError) as refused:
    export.checkpoint_to_export(str(model_dir), "best_ckpt")

  message = str(refused.value)
  assert message.startswith(f"No checkpoint in --model_dir='{model_dir}' can "
                            "be exported: ")
  for prefix in damaged:
    assert f"{prefix} (its data cannot be read back" in message
