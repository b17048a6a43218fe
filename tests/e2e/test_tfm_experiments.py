"""TFM's own registered experiments run through our launcher as through stock TFM.

Each experiment of the matrix is shrunk by its YAML in `tests/e2e/tfm_configs/`
(the smallest backbone TFM accepts, 32x32 to 128x128 images, batches of 2)
and fed the records of `tests/tfm_experiment_data.py` (real photos):

  * stock TFM (`official/vision/train.py`; for DLRM
    `official/recommendation/ranking/train.py`) and our launcher each run
    `train_and_eval` for 4 steps (loops of 2) from one initial checkpoint.
    TFM's train.py takes no seed: the model is built and written once
    (`write_initial_checkpoint`) and both read it as `task.init_checkpoint`
    with `init_checkpoint_modules: all`, which restores the whole model in
    each of these tasks. TFM's random draws are made not to matter (no
    flips or crops, or symmetric frames; no dropout; Mask R-CNN samples all
    its anchors, RoIs and masks: see each YAML), so the step-4 checkpoints
    (every weight, batch-norm statistic and optimizer slot) and the
    step-4 losses of TensorBoard's `train/` must be equal bit for bit: the
    same graph of the same task on the same CPU. Ours also writes the first
    step's summary, so ours at steps 1 and 2 average to stock's at step 2
    (to 1e-6: a mean of two floats). Validation metrics at step 4 equal
    stock's (to 1e-6: COCO's evaluator is NumPy on the same inputs);
  * on a copy of our model_dir, a relaunch with more `train_steps` resumes
    from step 4, and `eval` and `continuous_eval` report what stock's
    evaluation at step 4 reported;
  * our `export` takes what stock's exporter
    (`official/vision/serving/export_saved_model.py`, run on our ckpt-4)
    takes, a uint8 image batch, and answers as it does, to 1e-6.

And every mode stock TFM's train_lib can run is one of ours.

DLRM, which TFM has no exporter for, exports its model's own inputs.

Cut for time (the module may add ~5 CPU minutes to the suite): Mask R-CNN,
DeepLab, the video model and MobileNet (a second classifier) run only with
`TFM_EXT_FULL_TFM_MATRIX=1`; the export of the first three against TFM's
exporter runs in every suite (tests/model_dir/test_tfm_export.py).
Measured with it (`-n 0 --durations=0`, on a machine shared with other
runs): 24 minutes wall, 12.8 CPU minutes; their stock comparisons alone
took 230, 250 and 105 s wall, Mask R-CNN's evaluation build 270 s. Without
it, ResNet, MobileNet, RetinaNet and DLRM run every test: 21 tests, 6
minutes wall and 6.2 CPU minutes (`-n 0`). Our launches and
stock's vision runs fork from one process that imported TensorFlow once
(conftest's `run_forked`); DLRM's start afresh.
"""

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Dict, Tuple

import numpy as np
import pytest
import tensorflow as tf

import official

from conftest import REPO
from conftest import TRAIN
from conftest import built_once
from conftest import numeric_tensors
import imagenet_fixtures
import tfm_experiment_data as data

CONFIGS = os.path.join(REPO, "tests", "e2e", "tfm_configs")
OFFICIAL = os.path.dirname(official.__file__)
VISION_TRAIN = os.path.join(OFFICIAL, "vision", "train.py")
VISION_EXPORT = os.path.join(OFFICIAL, "vision", "serving",
                             "export_saved_model.py")
DATA_WRITERS = os.path.join(REPO, "tests", "tfm_experiment_data.py")
STEPS = 4
FULL = os.environ.get("TFM_EXT_FULL_TFM_MATRIX") == "1"


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One TFM experiment of the matrix and how it is fed and served."""
  name: str
  data: str  # A folder of the data fixture.
  train: str  # Input patterns, in that folder.
  validation: str
  image_size: Tuple[int, ...] = ()  # What stock's exporter is told.
  extra: str = ""  # More overrides; {data} is the folder.
  ranking: bool = False
  cheap: bool = True  # Its tests run without TFM_EXT_FULL_TFM_MATRIX.


_COCO = ",task.annotation_file={data}/val.json"
EXPERIMENTS = {e.name: e for e in [
    Experiment("resnet_imagenet", "imagenet", "train-*", "validation-*",
               (64, 64)),
    # A second classifier: ResNet's tests cover the task; cut for time.
    Experiment("mobilenet_imagenet", "imagenet", "train-*", "validation-*",
               (64, 64), cheap=False),
    Experiment("retinanet_resnetfpn_coco", "detection", "train.tfrecord",
               "val.tfrecord", (128, 128), extra=_COCO),
    Experiment("maskrcnn_resnetfpn_coco", "detection", "train.tfrecord",
               "val.tfrecord", (128, 128), extra=_COCO, cheap=False),
    Experiment("seg_deeplabv3_pascal", "segmentation", "train.tfrecord",
               "val.tfrecord", (64, 64), cheap=False),
    Experiment("video_classification_kinetics400", "video", "train.tfrecord",
               "val.tfrecord", (32, 32), cheap=False),
    Experiment("dlrm_criteo", "criteo", "train.tsv", "val.tsv",
               ranking=True),
]}
VISION = [n for n, e in EXPERIMENTS.items() if not e.ranking]


def _experiment_params():
  """The experiments whose tests run: the cheap ones, or all if FULL."""
  return [pytest.param(name, marks=() if e.cheap or FULL else pytest.mark.skip(
      reason="set TFM_EXT_FULL_TFM_MATRIX=1 (20-45 CPU s a launch)"))
          for name, e in EXPERIMENTS.items()]


def _env(experiment: Experiment) -> Dict[str, str]:
  env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO,
         "PYTHONUNBUFFERED": "1"}
  if experiment.ranking:  # TensorFlow Recommenders needs Keras 2.
    env["TF_USE_LEGACY_KERAS"] = "1"
  return env


@pytest.fixture(scope="session")
def tfm_data(tmp_path_factory) -> str:
  """Every experiment's records, written once a session."""

  def write(path):
    imagenet_fixtures.write_imagenet(os.path.join(path, "imagenet"))
    data.write_detection(os.path.join(path, "detection"))
    data.write_segmentation(os.path.join(path, "segmentation"))
    data.write_video(os.path.join(path, "video"))
    data.write_criteo(os.path.join(path, "criteo"))

  return built_once(tmp_path_factory, "tfm_experiment_data", write)


def overrides(experiment: Experiment, folder: str, steps: int = STEPS,
              init_checkpoint: str = "") -> str:
  """The `--params_override` both runs take beside the experiment's YAML."""
  where = os.path.join(folder, experiment.data)
  fields = [
      f"task.train_data.input_path={where}/{experiment.train}",
      f"task.validation_data.input_path={where}/{experiment.validation}",
      "runtime.distribution_strategy=one_device", "runtime.num_gpus=0",
      f"trainer.train_steps={steps}", "trainer.steps_per_loop=2",
      "trainer.summary_interval=2", "trainer.checkpoint_interval=2",
      f"trainer.validation_interval={STEPS}", "trainer.validation_steps=1",
      "trainer.continuous_eval_timeout=1"]
  if not experiment.ranking:
    fields.append("runtime.mixed_precision_dtype=float32")
  if init_checkpoint:
    fields.append(f"task.init_checkpoint={init_checkpoint}")
  return ",".join(fields) + experiment.extra.format(data=where)


def config_file(experiment: Experiment) -> str:
  return os.path.join(CONFIGS, f"{experiment.name}.yaml")


def _run(argv, env, timeout=600) -> subprocess.CompletedProcess:
  """A fresh interpreter: stock TFM as a user runs it, or our launcher."""
  return subprocess.run([sys.executable, *argv], capture_output=True,
                        text=True, timeout=timeout, cwd=REPO,
                        env={**os.environ, **env})


def _failed(proc) -> str:
  return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
          f"--- stderr\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="session")
def python(run_forked):
  """`python(experiment, argv)`: `python ARGV...` to its end.

  Forked (conftest's `run_forked`: a fresh process but for the third-party
  imports), but for DLRM: TensorFlow Recommenders needs `tf.keras`
  undecided when its process starts, so DLRM's runs start afresh.
  """

  def run(experiment: Experiment, argv) -> subprocess.CompletedProcess:
    if experiment.ranking:
      return _run(argv, _env(experiment))
    return run_forked(*argv, timeout=600, env=_env(experiment))

  return run


def _train_command(experiment: Experiment, mode: str, model_dir: str,
                   override: str):
  return [f"--experiment={experiment.name}", f"--mode={mode}",
          f"--model_dir={model_dir}",
          f"--config_file={config_file(experiment)}",
          f"--params_override={override}"]


@pytest.fixture(scope="session")
def ours(python):
  """`ours(experiment, mode, model_dir, override)`: our launcher's run."""

  def run(experiment: Experiment, mode: str, model_dir: str, override: str):
    launcher = (["-m", "tfm_ext", "--registry=tfm_ext.training.ranking",
                 "--trainer=ranking"] if experiment.ranking else
                [TRAIN, "--registry=official.vision.registry_imports"])
    return python(experiment, launcher + _train_command(
        experiment, mode, model_dir, override))

  return run


@pytest.fixture(scope="session")
def stock(python):
  """`stock(experiment, mode, model_dir, override)`: stock TFM's train.py."""

  def run(experiment: Experiment, mode: str, model_dir: str, override: str):
    script = (["-m", "official.recommendation.ranking.train"]
              if experiment.ranking else [VISION_TRAIN])
    return python(experiment, script + _train_command(
        experiment, mode, model_dir, override))

  return run


@dataclasses.dataclass(frozen=True)
class Trained:
  """Both runs of an experiment, from the same initial checkpoint."""
  experiment: Experiment
  data: str
  init_checkpoint: str
  stock: str  # model_dirs
  ours: str

  def override(self, steps=STEPS):
    return overrides(self.experiment, self.data, steps, self.init_checkpoint)


@pytest.fixture(scope="session")
def trained(tfm_data, tmp_path_factory, python, stock, ours):
  """`trained(name)`: a `Trained`, built once a session for every worker."""

  def build(name) -> Trained:
    experiment = EXPERIMENTS[name]

    def train(path):
      init = os.path.join(path, "init", "ckpt")
      written = python(experiment, [
          DATA_WRITERS, "init_checkpoint", name, config_file(experiment),
          overrides(experiment, tfm_data), init])
      assert written.returncode == 0, _failed(written)
      override = overrides(experiment, tfm_data, init_checkpoint=init)
      for run, where in ((stock, "stock"), (ours, "ours")):
        proc = run(experiment, "train_and_eval", os.path.join(path, where),
                   override)
        assert proc.returncode == 0, f"{where}: {_failed(proc)}"

    path = built_once(tmp_path_factory, f"tfm_{name}", train)
    return Trained(experiment, tfm_data, os.path.join(path, "init", "ckpt"),
                   os.path.join(path, "stock"), os.path.join(path, "ours"))

  return build


def scalars(model_dir: str, subdir: str) -> Dict[Tuple[str, int], float]:
  """Every scalar of `model_dir/subdir`'s TensorBoard files, by (tag, step)."""
  found = {}
  for path in sorted(glob.glob(os.path.join(model_dir, subdir,
                                            "events.out.tfevents.*"))):
    for record in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.HasField("tensor") and not value.tensor.tensor_shape.dim:
          array = tf.make_ndarray(value.tensor)
          if array.dtype.kind == "f":
            found[(value.tag, event.step)] = float(array)
        elif value.HasField("simple_value"):
          found[(value.tag, event.step)] = value.simple_value
  return found


def checkpoint_at(model_dir: str, step: int) -> Dict[str, np.ndarray]:
  """ckpt-`step`'s weights and optimizer slots: not its input iterator."""
  tensors = numeric_tensors(os.path.join(model_dir, f"ckpt-{step}"))
  return {k: v for k, v in tensors.items()
          if not k.startswith(("train_input", "save_counter"))}


def _ours_on_a_copy(ours, runs: Trained, mode: str, tmp_path, steps=STEPS,
                    without=()):
  """Our launcher in `mode` on a copy of our trained model_dir, less
  its subfolders `without`; it must exit 0. Returns it and the copy."""
  model_dir = str(tmp_path / mode)
  shutil.copytree(runs.ours, model_dir)
  for subdir in without:
    shutil.rmtree(os.path.join(model_dir, subdir))
  proc = ours(runs.experiment, mode, model_dir, runs.override(steps))
  assert proc.returncode == 0, f"{mode}: {_failed(proc)}"
  assert f"done | {mode} | step {steps}" in proc.stdout, proc.stdout
  return proc, model_dir


def _our_export(ours, runs: Trained, tmp_path):
  """`serving_default` of our `--mode=export` of ckpt-4."""
  _, model_dir = _ours_on_a_copy(ours, runs, "export", tmp_path)
  return tf.saved_model.load(os.path.join(
      model_dir, "export", str(STEPS))).signatures["serving_default"]


@pytest.mark.slow
@pytest.mark.parametrize("name", _experiment_params())
def test_trains_as_stock_tfm_from_the_same_weights(trained, name):
  runs = trained(name)
  theirs, mine = (checkpoint_at(runs.stock, STEPS),
                  checkpoint_at(runs.ours, STEPS))
  assert sorted(theirs) == sorted(mine)
  assert any(k.startswith(("model/", "backbone/")) for k in mine), sorted(mine)
  different = {k: float(np.max(np.abs(theirs[k] - mine[k])))
               for k in theirs if not np.array_equal(theirs[k], mine[k])}
  assert not different, sorted(different.items(), key=lambda kv: -kv[1])[:5]
  # The weights moved: this compares training, not initialization. (Equal
  # after training, both started from the initial checkpoint: TFM's runs
  # draw their own initial weights, unseeded, whenever it is not read.)
  before = checkpoint_at(runs.ours, STEPS - 2)
  assert any(not np.array_equal(before[k], mine[k]) for k in mine
             if k.startswith(("model/", "backbone/"))), "no weight moved"
  # Every loss stock wrote: equal at step 4; at step 2, the mean of ours
  # at steps 1 and 2 (ours also writes the first step's).
  theirs, mine = scalars(runs.stock, "train"), scalars(runs.ours, "train")
  losses = sorted(tag for tag, step in theirs
                  if step == STEPS and tag.endswith("loss"))
  assert "training_loss" in losses, sorted(theirs)
  for tag in losses:
    assert mine[(tag, STEPS)] == theirs[(tag, STEPS)], tag
    assert np.isfinite(mine[(tag, STEPS)]), tag
    assert (mine[(tag, 1)] + mine[(tag, 2)]) / 2 == pytest.approx(
        theirs[(tag, 2)], rel=1e-6, abs=1e-6), tag


def _validation_metrics(model_dir: str, step: int) -> Dict[str, float]:
  return {tag: value for (tag, at), value in
          scalars(model_dir, "validation").items()
          if at == step and tag != "steps_per_second"}


@pytest.mark.slow
@pytest.mark.parametrize("name", _experiment_params())
def test_evaluates_as_stock_tfm(trained, name):
  runs = trained(name)
  theirs = _validation_metrics(runs.stock, STEPS)
  assert theirs, "stock wrote no validation summary"
  assert _validation_metrics(runs.ours, STEPS) == pytest.approx(
      theirs, rel=1e-6, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", _experiment_params())
def test_resumes_from_the_saved_step_with_more_train_steps(trained, ours,
                                                           name, tmp_path):
  proc, model_dir = _ours_on_a_copy(ours, trained(name), "train_and_eval",
                                    tmp_path, steps=STEPS + 2)
  # It restored ckpt-4 and trained steps 5 and 6 only.
  with open(os.path.join(model_dir, "run_summary.json")) as f:
    assert json.load(f)["resumed_from_step"] == STEPS
  trained_steps = [int(line.split()[1].split("/")[0])
                   for line in proc.stdout.splitlines()
                   if line.startswith("step ")]
  assert trained_steps and min(trained_steps) > STEPS, proc.stdout
  assert os.path.exists(os.path.join(model_dir, f"ckpt-{STEPS + 2}.index"))
  losses = scalars(model_dir, "train")
  assert np.isfinite(losses[("training_loss", STEPS + 2)])
  assert ("training_loss", 1) in losses  # The first run's are kept.


@pytest.mark.slow
@pytest.mark.parametrize("name", _experiment_params())
def test_eval_and_continuous_eval_report_what_stock_evaluated(
    trained, ours, name, tmp_path):
  runs = trained(name)
  theirs = _validation_metrics(runs.stock, STEPS)
  for mode in ("eval", "continuous_eval"):
    _, model_dir = _ours_on_a_copy(ours, runs, mode, tmp_path,
                                   without=["validation"])
    assert _validation_metrics(model_dir, STEPS) == pytest.approx(
        theirs, rel=1e-6, abs=1e-6), mode


def _serving_inputs(signature) -> Dict[str, np.ndarray]:
  """Inputs for a signature: photo crops where it takes uint8 images."""
  _, specs = signature.structured_input_signature
  inputs = {}
  for key, spec in specs.items():
    shape = [2 if d is None else d for d in spec.shape.as_list()]
    if spec.dtype == tf.uint8 and len(shape) in (4, 5):
      frames = data.uint8_images(shape[-2], shape[0] * (
          shape[1] if len(shape) == 5 else 1))
      inputs[key] = tf.constant(frames.reshape(shape))
    else:
      inputs[key] = tf.zeros(shape, spec.dtype)
  return inputs


@pytest.mark.slow
@pytest.mark.parametrize("name", [p for p in _experiment_params()
                                  if p.values[0] in VISION])
def test_export_serves_uint8_images_as_stocks_exporter(trained, python, ours,
                                                       name, tmp_path):
  runs = trained(name)
  experiment = runs.experiment
  stock_dir = str(tmp_path / "stock_export")
  proc = python(experiment, [VISION_EXPORT, f"--experiment={name}",
               f"--export_dir={stock_dir}",
               f"--checkpoint_path={runs.ours}/ckpt-{STEPS}",
               f"--config_file={config_file(experiment)}",
               f"--params_override={runs.override()}",
               "--input_type=image_tensor",
               "--input_image_size=" + ",".join(
                   map(str, experiment.image_size))])
  assert proc.returncode == 0, f"stock export: {_failed(proc)}"
  stock_signature = tf.saved_model.load(
      os.path.join(stock_dir, "saved_model")).signatures["serving_default"]
  inputs = _serving_inputs(stock_signature)
  expected = stock_signature(**inputs)

  answer = _our_export(ours, runs, tmp_path)(**inputs)
  assert sorted(answer) == sorted(expected)
  for key, value in expected.items():
    assert answer[key].shape == value.shape, key
    if value.dtype.is_floating:
      assert np.all(np.isfinite(answer[key].numpy())), key
    np.testing.assert_allclose(answer[key].numpy(), value.numpy(),
                               rtol=1e-6, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_export_serves_dlrm_on_criteo_rows(trained, ours, tmp_path):
  """TFM has no exporter for ranking: ours serves the model's own inputs."""
  runs = trained("dlrm_criteo")
  served = _our_export(ours, runs, tmp_path)
  with open(os.path.join(runs.data, "criteo", "val.tsv")) as f:
    rows = np.array([line.split("\t") for line in f.read().splitlines()[:2]],
                    dtype=np.float32)  # label, 13 dense, 3 ids
  _, specs = served.structured_input_signature
  outputs = served(dense_features=tf.constant(rows[:, 1:14]),
                   sparse_features=tf.cast(rows[:, 14:],
                                           specs["sparse_features"].dtype))
  assert sorted(outputs) == ["outputs"]
  assert outputs["outputs"].shape == [2]
  assert np.all(np.isfinite(outputs["outputs"].numpy()))


def test_every_mode_stock_tfm_runs_is_one_of_ours():
  """TFM's --mode enum, less the two its train_lib has no branch for."""
  from tfm_ext.run import modes  # pylint: disable=g-import-not-at-top
  with open(os.path.join(OFFICIAL, "common", "flags.py")) as f:
    flags_source = f.read()
  enum = re.search(r"'mode',\s*default=None,\s*enum_values=\[([^\]]*)\]",
                   flags_source)
  stock_modes = set(re.findall(r"'(\w+)'", enum.group(1)))
  with open(os.path.join(OFFICIAL, "core", "train_lib.py")) as f:
    run = f.read().split("def run(self)")[1].split("\n  def ")[0]
  runnable = {m for m in stock_modes if f"'{m}'" in run}
  assert runnable == {"train", "eval", "train_and_eval", "continuous_eval",
                      "train_and_post_eval"}, runnable
  assert runnable <= set(modes.MODES), sorted(runnable - set(modes.MODES))
