"""TFM's own registered experiments run through our launcher as through stock TFM.

Each experiment of the matrix keeps TFM's task, its decoder and head kinds,
losses, metrics and serving module, and is shrunk by its YAML in
`tests/e2e/tfm_configs/` (ResNet-10 backbones, a quarter-width MobileNetV1,
the 3D ResNet-50, TFM's smallest; 32x32 to 64x64 images, batches of 2); it
is fed the records of `tests/tfm_experiment_data.py` (real photos):

  * stock TFM (`official/vision/train.py`; for DLRM
    `official/recommendation/ranking/train.py`; for BERT
    `official/nlp/train.py`) and our launcher each run
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
  * our `export` of ckpt-4 takes what stock's exporter
    (`export_saved_model.py`'s `export_inference_graph` on our ckpt-4, both
    told `--batch_size`, stock's the image size ours takes from the config)
    takes, a uint8 image batch, and answers as it does, to 1e-6. DLRM,
    which TFM has no exporter for, serves its model's own inputs and
    answers as the model restored from ckpt-4 does;
  * on a copy of our model_dir, a relaunch (`train`) with more
    `train_steps` resumes from step 4, and `eval` and `continuous_eval`
    report what stock's evaluation at step 4 reported.

And every mode stock TFM's train_lib can run is one of ours.

TFM's NLP experiments, `bert/tagging` and `bert/sentence_prediction`, run
a BERT of one layer of width 16 on sentences of 16 tokens of a 100-word
vocabulary (`tfm_experiment_data.write_tagging`,
`write_sentence_prediction`), with our `--registry=official.common.
registry_imports`. Their tasks restore the encoder alone from
`task.init_checkpoint`, so their YAMLs start the heads at zero. Tagging
trains bit for bit as stock does. Sentence prediction cannot: TFM's
`BertClassifier` drops 0.1 of its pooled output in training, a rate no
config sets, and stock's train.py draws it unseeded; its losses are
compared to 0.01 (0.002 apart at step 4 on 2026-12-07), and its
evaluations to stock's `--mode=eval` of our ckpt-4, equal. Both are
exported by TFM's NLP module for the task (`--function_keys`,
`--serving_params`) and answer as stock's `export_savedmodel.py` (run as
a subprocess, our `params.yaml` its `--config_file`) of our ckpt-4 does:
tagging's `serve_examples` the validation records, sentence prediction's
`serve` word ids.

Shared: an experiment's initial checkpoint, both runs and stock's export are
one fixture (`trained`), built once a session for every xdist worker; the
tests read it or work on copies. Our launches and stock's runs fork from one
process that imported TensorFlow once (conftest's `run_forked`); the initial
checkpoint and stock's export are written in the test process, stock's
without Keras's traces of each layer (serving calls none).

Cut for time: the third point runs for ResNet, RetinaNet and DLRM; for
MobileNet, Mask R-CNN, DeepLab and the video model only with
`TFM_EXT_FULL_TFM_MATRIX=1` or the nightly tier's `TFM_EXT_NIGHTLY=1`
(about 2.5 CPU minutes more). MobileNet, Mask R-CNN and the video model
train and export against stock only with it too (about 110 CPU seconds
for MobileNet and the video model, the matrix's second dearest fixture;
Mask R-CNN's fixture and tests, the dearest, took 6 of the suite's 23
minutes of worker time on 2 loaded cores on 2026-12-07): MobileNet runs
the code path ResNet runs here (TFM's classification task and export
module; only TFM's backbone differs), Mask R-CNN the detection task,
COCO evaluator and detection export module RetinaNet runs (its mask head
and masks apart); the video model's export options and sizes are checked
in every suite by tests/model_dir/test_tfm_export.py, its trained export
and served call only with the flag. Measured on
2026-12-05 (`-n 0`, 2 cores shared with other runs, load average 1 to 3),
with tests/model_dir/test_tfm_export.py (which no longer exports TFM's
experiments on untrained checkpoints: this matrix does on trained ones):
31 tests, 6.9 minutes wall, 6.9 CPU minutes. CPU seconds of an
experiment's fixture and export: Mask R-CNN 75 and 24, the video model 52
and 28, RetinaNet 37 and 14, DeepLab 30 and 12, ResNet 24 (the session's
data and forking process included) and 6, MobileNet 19 and 11, DLRM 11 and
2; the third point 31 for RetinaNet, 13 for ResNet, 8 for DLRM. Before,
when only ResNet, RetinaNet and DLRM ran here, in the same conditions: 26
tests, 6.8 minutes wall, 6.3 CPU minutes. RetinaNet's figures predate its
FPN levels 3 and 4 of one anchor a location (were 3 to 5 of 9; its YAML
says what that saved).

The NLP rows run with `TFM_EXT_FULL_TFM_MATRIX=1` (or the nightly tier):
the suite's 15 minutes on 2 cores have no room for them (the fresh-clone
CI, 804 s of tests with them, 892 s with the venv's install).
bert/sentence_prediction (the same encoder and reader; another head and
serving module) runs stock once more (the evaluation of our checkpoint),
and its training is compared loosely. In every suite NLP's export is
checked by tests/model_dir/test_nlp_serving.py (module, params, refusals).
Measured on 2026-12-08 (`-n 0`, load average 8 to 9 on 2 cores): tagging's
5 tests 71 s wall, 44 CPU seconds, the session's data and forking process
included (its fixture 39 s wall: the data, the initial checkpoint, both
runs and stock's export; its eval and continuous_eval 9, export 7, resume
4); with the flag, sentence prediction's 5 tests 112 s wall, 56 CPU
seconds (load average 4 to 6).
"""

import contextlib
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
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
NLP_TRAIN = os.path.join(OFFICIAL, "nlp", "train.py")
NLP_EXPORT = os.path.join(OFFICIAL, "nlp", "serving", "export_savedmodel.py")
RANKING_TRAIN = os.path.join(OFFICIAL, "recommendation", "ranking", "train.py")
DATA_WRITERS = os.path.join(REPO, "tests", "tfm_experiment_data.py")
STEPS = 4
FULL = (os.environ.get("TFM_EXT_FULL_TFM_MATRIX") == "1"
        or os.environ.get("TFM_EXT_NIGHTLY") == "1")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One TFM experiment of the matrix and how it is fed and served."""
  name: str
  data: str  # A folder of the data fixture.
  train: str  # Input patterns, in that folder.
  validation: str
  image_size: Tuple[int, ...] = ()  # Stock's exporter's; frames first.
  extra: str = ""  # More overrides; {data} is the folder.
  ranking: bool = False
  # TFM's NLP exporter's module, and the function both exports serve.
  nlp_module: str = ""
  function_key: str = "serve"
  serving_params: str = ""  # Both exporters'; stock's also the length.
  # Why training cannot be bit for bit stock's; its checkpoint is then
  # evaluated by stock too (`Trained.stock_evaluated`).
  unseeded: str = ""
  # Its eval, continuous_eval and resume tests run without
  # TFM_EXT_FULL_TFM_MATRIX.
  every_mode: bool = True
  # Its training and export against stock run without it (module docstring).
  every_suite: bool = True


_COCO = ",task.annotation_file={data}/val.json"
EXPERIMENTS = {e.name: e for e in [
    Experiment("resnet_imagenet", "imagenet", "train-*", "validation-*",
               (32, 32)),
    Experiment("mobilenet_imagenet", "imagenet", "train-*", "validation-*",
               (64, 64), every_mode=False, every_suite=False),
    Experiment("retinanet_resnetfpn_coco", "detection", "train.tfrecord",
               "val.tfrecord", (64, 64), extra=_COCO),
    Experiment("maskrcnn_resnetfpn_coco", "detection", "train.tfrecord",
               "val.tfrecord", (64, 64), extra=_COCO, every_mode=False,
               every_suite=False),
    Experiment("seg_deeplabv3_pascal", "segmentation", "train.tfrecord",
               "val.tfrecord", (32, 32), every_mode=False),
    Experiment("video_classification_kinetics400", "video", "train.tfrecord",
               "val.tfrecord", (4, 32, 32), every_mode=False,
               every_suite=False),
    Experiment("dlrm_criteo", "criteo", "train.tsv", "val.tsv",
               ranking=True),
    # The full tier's: the suite's 15 minutes on 2 cores have no room for
    # its ~80 s (stock's NLP train.py and exporter are fresh interpreters);
    # tests/model_dir/test_nlp_serving.py runs in every suite.
    Experiment("bert/tagging", "tagging", "train.tfrecord", "val.tfrecord",
               nlp_module="Tagging", function_key="serve_examples",
               # The names TFM's readers take (input_ids, segment_ids).
               serving_params="use_v2_feature_names=false",
               every_mode=False, every_suite=False),
    Experiment("bert/sentence_prediction", "sentence_prediction",
               "train.tfrecord", "val.tfrecord",
               nlp_module="SentencePrediction", every_mode=False,
               every_suite=False,
               unseeded="TFM's BertClassifier drops 0.1 of the pooled output "
               "in training, a rate no config sets, and stock's train.py "
               "draws it unseeded"),
]}
VISION = [n for n, e in EXPERIMENTS.items()
          if not (e.ranking or e.nlp_module)]
NLP = [n for n, e in EXPERIMENTS.items() if e.nlp_module]
SEEDED = [n for n, e in EXPERIMENTS.items() if not e.unseeded]
SERVING_BATCH = 2  # Both exporters' --batch_size.


def _params(names=tuple(EXPERIMENTS), field="every_suite"):
  """`names`; those whose `field` is false skipped unless FULL."""
  return [pytest.param(name, marks=() if getattr(EXPERIMENTS[name], field)
                       or FULL else pytest.mark.skip(
                           reason="TFM_EXT_FULL_TFM_MATRIX=1 runs it "
                           "(module docstring)"))
          for name in names]


def _every_mode_params():
  return _params(field="every_mode")


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
    data.write_sentence_prediction(os.path.join(path, "sentence_prediction"))
    data.write_tagging(os.path.join(path, "tagging"))

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
  return os.path.join(CONFIGS, f"{_flat(experiment.name)}.yaml")


def _flat(name: str) -> str:
  """A file name of an experiment's: TFM's NLP names are nested (bert/...)."""
  return name.replace("/", "_")


def _failed(proc) -> str:
  return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
          f"--- stderr\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="session")
def python(run_forked):
  """`python(experiment, SCRIPT, ARGV...)`: `python SCRIPT ARGV...` to its end.

  Forked (conftest's `run_forked`: a fresh process but for the third-party
  imports, which leave `tf.keras` undecided: DLRM's take Keras 2).
  """

  def run(experiment: Experiment, *argv) -> subprocess.CompletedProcess:
    return run_forked(*argv, timeout=600, env=_env(experiment))

  return run


def _train_command(experiment: Experiment, mode: str, model_dir: str,
                   override: str, flags=()):
  return [f"--experiment={experiment.name}", f"--mode={mode}",
          f"--model_dir={model_dir}",
          f"--config_file={config_file(experiment)}",
          f"--params_override={override}", *flags]


@pytest.fixture(scope="session")
def ours(python):
  """`ours(experiment, mode, model_dir, override, flags)`: our launcher's
  run, with more `flags` if given."""

  def run(experiment: Experiment, mode: str, model_dir: str, override: str,
          flags=()):
    registry = (["--registry=tfm_ext.training.ranking", "--trainer=ranking"]
                if experiment.ranking else
                ["--registry=official.common.registry_imports"]
                if experiment.nlp_module else
                ["--registry=official.vision.registry_imports"])
    return python(experiment, TRAIN, *registry, *_train_command(
        experiment, mode, model_dir, override, flags))

  return run


@pytest.fixture(scope="session")
def stock(python):
  """`stock(experiment, mode, model_dir, override)`: stock TFM's train.py."""

  def run(experiment: Experiment, mode: str, model_dir: str, override: str):
    script = (RANKING_TRAIN if experiment.ranking else
              NLP_TRAIN if experiment.nlp_module else VISION_TRAIN)
    return python(experiment, script, *_train_command(
        experiment, mode, model_dir, override))

  return run


@dataclasses.dataclass(frozen=True)
class Trained:
  """Both runs of an experiment from the same initial checkpoint, and
  stock's export of ours."""
  experiment: Experiment
  data: str
  init_checkpoint: str
  stock: str  # model_dirs
  ours: str
  stock_export: str  # Stock's exporter's SavedModel of our ckpt-4.
  # Where stock's evaluation at step 4 is: `stock`, else (an `unseeded`
  # experiment) a copy of `ours` that stock's train.py evaluated.
  stock_evaluated: str

  def override(self, steps=STEPS):
    return overrides(self.experiment, self.data, steps, self.init_checkpoint)


@contextlib.contextmanager
def _float32_without_traces():
  """Keras's float32 policy, as a new process's, and saves without traces.

  For TFM's code run in this process: a session's earlier test may have set
  a bfloat16 policy. Without Keras's traces of each layer's `call`, stock's
  exporter writes the same `serving_default` (serving calls none of them)
  in about half the time.
  """
  import tf_keras  # pylint: disable=g-import-not-at-top
  from tf_keras.src.saving.legacy.saved_model import utils  # pylint: disable=g-import-not-at-top
  policy = tf_keras.mixed_precision.global_policy()
  tf_keras.mixed_precision.set_global_policy("float32")
  try:
    with utils.keras_option_scope(save_traces=False):
      yield
  finally:
    tf_keras.mixed_precision.set_global_policy(policy)


def _stock_export(experiment: Experiment, override: str, checkpoint: str,
                  export_dir: str) -> None:
  """What stock's export_saved_model.py writes of `checkpoint` (uint8 image
  tensors): its `export_inference_graph` as its main calls it."""
  from official.vision.serving import export_saved_model_lib  # pylint: disable=g-import-not-at-top
  params = data.experiment_params(experiment.name, config_file(experiment),
                                  override)
  params.validate()
  params.lock()
  export_saved_model_lib.export_inference_graph(
      input_type="image_tensor", batch_size=SERVING_BATCH,
      input_image_size=list(experiment.image_size), params=params,
      checkpoint_path=checkpoint, export_dir=export_dir,
      export_checkpoint_subdir="checkpoint",
      export_saved_model_subdir="saved_model")


def _stock_nlp_export(python, experiment: Experiment, path: str) -> None:
  """Stock's `export_savedmodel.py` of our ckpt-4, as a user runs it: our
  `params.yaml` its `--config_file`, into `path/stock_export/<time>/`."""
  ours = os.path.join(path, "ours")
  proc = python(experiment, NLP_EXPORT, f"--task_name={experiment.nlp_module}",
                f"--config_file={ours}/params.yaml",
                f"--checkpoint_path={ours}/ckpt-{STEPS}",
                f"--export_savedmodel_dir={path}/stock_export",
                f"--function_keys={experiment.function_key}",
                "--serving_params=" + ",".join(filter(None, [
                    f"parse_sequence_length={data.SEQ_LENGTH}",
                    experiment.serving_params])))
  assert proc.returncode == 0, f"stock's export: {_failed(proc)}"


def _stock_evaluation_of_ours(stock, experiment: Experiment, path: str,
                              override: str) -> None:
  """Stock's `--mode=eval` of a copy of our model_dir (less our validation
  summary) into `path/stock_evaluated`: where the runs' weights differ,
  the evaluations compare on one checkpoint."""
  model_dir = os.path.join(path, "stock_evaluated")
  shutil.copytree(os.path.join(path, "ours"), model_dir,
                  ignore=shutil.ignore_patterns("validation"))
  proc = stock(experiment, "eval", model_dir, override)
  assert proc.returncode == 0, f"stock's eval: {_failed(proc)}"


@pytest.fixture(scope="session")
def trained(tfm_data, tmp_path_factory, python, stock, ours):
  """`trained(name)`: a `Trained`, built once a session for every worker.

  The initial checkpoint and stock's export are written in this process
  (for DLRM, the checkpoint in a process of Keras 2): stock's exporter then
  reuses what building the model converted (AutoGraph, which is most of a
  Mask R-CNN's build), instead of a process of its own converting it again.
  """

  def build(name) -> Trained:
    experiment = EXPERIMENTS[name]

    def train(path):
      init = os.path.join(path, "init", "ckpt")
      if experiment.ranking:
        written = python(experiment, DATA_WRITERS, "init_checkpoint", name,
                         config_file(experiment),
                         overrides(experiment, tfm_data), init)
        assert written.returncode == 0, _failed(written)
      else:
        import official.common.registry_imports  # pylint: disable=g-import-not-at-top,unused-import
        with _float32_without_traces():
          data.write_initial_checkpoint(name, config_file(experiment),
                                        overrides(experiment, tfm_data), init)
      override = overrides(experiment, tfm_data, init_checkpoint=init)
      for run, where in ((stock, "stock"), (ours, "ours")):
        proc = run(experiment, "train_and_eval", os.path.join(path, where),
                   override)
        assert proc.returncode == 0, f"{where}: {_failed(proc)}"
      if experiment.nlp_module:
        _stock_nlp_export(python, experiment, path)
        if experiment.unseeded:
          _stock_evaluation_of_ours(stock, experiment, path, override)
      elif not experiment.ranking:
        with _float32_without_traces():
          _stock_export(experiment, override,
                        os.path.join(path, "ours", f"ckpt-{STEPS}"),
                        os.path.join(path, "stock_export"))

    path = built_once(tmp_path_factory, f"tfm_{_flat(name)}", train)
    stock_export = os.path.join(path, "stock_export", "saved_model")
    if experiment.nlp_module:  # In the one folder it timestamped.
      stock_export, = glob.glob(os.path.join(path, "stock_export", "*"))
    return Trained(experiment, tfm_data, os.path.join(path, "init", "ckpt"),
                   os.path.join(path, "stock"), os.path.join(path, "ours"),
                   stock_export, os.path.join(
                       path, "stock_evaluated" if experiment.unseeded
                       else "stock"))

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
  """ckpt-`step`'s weights and optimizer slots: not its input iterator, nor
  the run's own state that ours keeps beside them (`run_state`: the last
  evaluation the checkpoint holds)."""
  tensors = numeric_tensors(os.path.join(model_dir, f"ckpt-{step}"))
  return {k: v for k, v in tensors.items()
          if not k.startswith(("train_input", "save_counter", "run_state"))}


def _ours_on_a_copy(ours, runs: Trained, mode: str, tmp_path, steps=STEPS,
                    without=(), flags=()):
  """Our launcher in `mode` (with more `flags`) on a copy of our trained
  model_dir, less its subfolders `without`; it must exit 0. Returns it and
  the copy."""
  model_dir = str(tmp_path / mode)
  shutil.copytree(runs.ours, model_dir)
  for subdir in without:
    shutil.rmtree(os.path.join(model_dir, subdir))
  proc = ours(runs.experiment, mode, model_dir, runs.override(steps), flags)
  assert proc.returncode == 0, f"{mode}: {_failed(proc)}"
  assert f"done | {mode} | step {steps}" in proc.stdout, proc.stdout
  return proc, model_dir


def _our_export(ours, runs: Trained, tmp_path, flags=()):
  """`serving_default` of our `--mode=export` of ckpt-4, and its folder."""
  proc, model_dir = _ours_on_a_copy(ours, runs, "export", tmp_path,
                                    flags=flags)
  path = os.path.join(model_dir, "export", str(STEPS))
  assert (f"export @ step {STEPS} | {path} | from {model_dir}/ckpt-{STEPS}"
          in proc.stdout), proc.stdout
  with open(os.path.join(model_dir, "export_summary.json")) as f:
    assert json.load(f)["global_step"] == STEPS
  # The SavedModel itself; no copy left.
  assert os.listdir(os.path.dirname(path)) == [str(STEPS)]
  assert {"saved_model.pb", "variables"} <= set(os.listdir(path))
  return tf.saved_model.load(path).signatures["serving_default"], path


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(SEEDED))
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


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(sorted(set(EXPERIMENTS) -
                                                set(SEEDED))))
def test_trains_as_stock_tfm_but_for_what_it_draws_unseeded(trained, name):
  """The same variables trained from the same weights, losses close.

  Not equal: `Experiment.unseeded` says what each run draws its own way
  (0.002 apart at step 4 here, of a loss that fell 0.02 from ln 2).
  """
  runs = trained(name)
  theirs, mine = (checkpoint_at(runs.stock, STEPS),
                  checkpoint_at(runs.ours, STEPS))
  assert sorted(theirs) == sorted(mine)
  before = checkpoint_at(runs.ours, STEPS - 2)
  assert any(not np.array_equal(before[k], mine[k]) for k in mine
             if k.startswith("model/")), "no weight moved"
  theirs, mine = scalars(runs.stock, "train"), scalars(runs.ours, "train")
  for step in (2, STEPS):
    assert mine[("training_loss", step)] == pytest.approx(
        theirs[("training_loss", step)], abs=0.01), step


def _validation_metrics(model_dir: str, step: int) -> Dict[str, float]:
  return {tag: value for (tag, at), value in
          scalars(model_dir, "validation").items()
          if at == step and tag != "steps_per_second"}


@pytest.mark.slow
@pytest.mark.parametrize("name", _params())
def test_evaluates_as_stock_tfm(trained, name):
  runs = trained(name)
  theirs = _validation_metrics(runs.stock_evaluated, STEPS)
  assert theirs, "stock wrote no validation summary"
  assert _validation_metrics(runs.ours, STEPS) == pytest.approx(
      theirs, rel=1e-6, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", _every_mode_params())
def test_resumes_from_the_saved_step_with_more_train_steps(trained, ours,
                                                           name, tmp_path):
  # `train`: every training mode restores alike; what evaluation adds is
  # the next test's.
  proc, model_dir = _ours_on_a_copy(ours, trained(name), "train", tmp_path,
                                    steps=STEPS + 2)
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
@pytest.mark.parametrize("name", _every_mode_params())
def test_eval_and_continuous_eval_report_what_stock_evaluated(
    trained, ours, name, tmp_path):
  runs = trained(name)
  theirs = _validation_metrics(runs.stock_evaluated, STEPS)
  for mode in ("eval", "continuous_eval"):
    _, model_dir = _ours_on_a_copy(ours, runs, mode, tmp_path,
                                   without=["validation"])
    assert _validation_metrics(model_dir, STEPS) == pytest.approx(
        theirs, rel=1e-6, abs=1e-6), mode


def _serving_inputs(signature, size) -> Dict[str, tf.Tensor]:
  """A batch of photo crops of `size` (frames first for a video), for a
  signature that takes uint8 images."""
  _, specs = signature.structured_input_signature
  (key, spec), = specs.items()
  assert spec.dtype == tf.uint8, specs
  shape = [spec.shape[0], *size, spec.shape[-1]]
  frames = data.uint8_images(size[-1], int(np.prod(shape[:-3])))
  return {key: tf.constant(frames.reshape(shape))}


def _assert_served(answer: Dict[str, np.ndarray], size) -> None:
  """What a user reads in the answer of TFM's serving modules."""
  if "probs" in answer:  # Classifiers, images and videos.
    np.testing.assert_allclose(answer["probs"].sum(axis=-1), 1, rtol=1e-5)
  if "num_detections" in answer:  # Detectors: a threshold of 0 keeps some.
    assert answer["num_detections"].min() > 0, answer["num_detections"]
  if "detection_masks" in answer:  # Mask R-CNN: a mask a detection.
    assert answer["detection_masks"].shape[:2] == (
        answer["detection_boxes"].shape[:2])
  if "logits" in answer and answer["logits"].ndim == 4:  # Segmentation:
    assert answer["logits"].shape[1:3] == tuple(size)  # the image's size.


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(VISION))
def test_export_serves_uint8_images_as_stocks_exporter(trained, ours, name,
                                                       tmp_path):
  """Both exporters told --batch_size; ours sizes images as evaluation does,
  stock's is told that size."""
  runs = trained(name)
  stock_signature = tf.saved_model.load(
      runs.stock_export).signatures["serving_default"]
  served, path = _our_export(ours, runs, tmp_path,
                             flags=[f"--batch_size={SERVING_BATCH}"])
  # And the config it was built from, which stock TFM reads strictly (it
  # held tfm_ext's fields: "'deterministic' does not exist in RuntimeConfig").
  data.experiment_params(name, os.path.join(path, "params.yaml"), "")
  assert (served.structured_input_signature ==
          stock_signature.structured_input_signature)
  inputs = _serving_inputs(stock_signature, runs.experiment.image_size)
  expected = stock_signature(**inputs)

  answer = {key: value.numpy() for key, value in served(**inputs).items()}
  assert sorted(answer) == sorted(expected)
  for key, value in expected.items():
    assert answer[key].shape == value.shape, key
    if value.dtype.is_floating:
      assert np.all(np.isfinite(answer[key])), key
    np.testing.assert_allclose(answer[key], value.numpy(),
                               rtol=1e-6, atol=1e-6, err_msg=key)
  _assert_served(answer, runs.experiment.image_size[-2:])


def _token_inputs(experiment: Experiment, signature, folder: str):
  """What an NLP signature takes: the validation records' serialized
  tf.Examples (`serve_examples`), else a batch of word ids (int32) and, if
  it takes them, their mask and segment ids."""
  _, specs = signature.structured_input_signature
  if experiment.function_key == "serve_examples":
    records = os.path.join(folder, experiment.data, experiment.validation)
    return {"examples": tf.constant(
        [r.numpy() for r in tf.data.TFRecordDataset(records)])}
  ids, mask = data.token_rows(2, seed=1)
  inputs = {"input_word_ids": ids, "input_mask": mask,
            "input_type_ids": np.zeros_like(ids)}
  return {k: tf.constant(v, tf.int32) for k, v in inputs.items() if k in specs}


@pytest.mark.slow
@pytest.mark.parametrize("name", _params(NLP))
def test_export_serves_as_stocks_nlp_exporter(trained, ours, name, tmp_path):
  """Ours told the experiment's `--function_keys` (none: `serve`) and
  `--serving_params`, the sequence length `serve_examples` parses taken
  from the config; stock's told the length too."""
  runs = trained(name)
  key, params = runs.experiment.function_key, runs.experiment.serving_params
  stock_signature = tf.saved_model.load(
      runs.stock_export).signatures["serving_default"]
  served, _ = _our_export(ours, runs, tmp_path, flags=(
      [f"--function_keys={key}"] if key != "serve" else []) + (
          [f"--serving_params={params}"] if params else []))
  assert (served.structured_input_signature ==
          stock_signature.structured_input_signature)
  inputs = _token_inputs(runs.experiment, stock_signature, runs.data)
  expected = stock_signature(**inputs)

  answer = {key: value.numpy() for key, value in served(**inputs).items()}
  assert sorted(answer) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(answer[key], value.numpy(),
                               rtol=1e-6, atol=1e-6, err_msg=key)
  # What a user reads: a tag's logits for each token, a class's for each
  # sentence.
  shape = ([2, data.SEQ_LENGTH, data.NUM_TAGS] if "logits" in answer
           else [2, 2])
  assert list(next(iter(answer.values())).shape) == shape, answer


@pytest.mark.slow
def test_export_serves_dlrm_on_criteo_rows_as_its_model_predicts(
    trained, ours, python, tmp_path):
  """TFM has no exporter for ranking: ours serves the model's own inputs,
  and answers as the model restored from the same checkpoint."""
  runs = trained("dlrm_criteo")
  served, _ = _our_export(ours, runs, tmp_path)
  rows_path = os.path.join(runs.data, "criteo", "val.tsv")
  rows = data.criteo_rows(rows_path)
  proc = python(runs.experiment, DATA_WRITERS, "ranking_predictions",
                config_file(runs.experiment), runs.override(),
                os.path.join(runs.ours, f"ckpt-{STEPS}"), rows_path)
  assert proc.returncode == 0, _failed(proc)
  predictions = json.loads(proc.stdout.splitlines()[-1])

  _, specs = served.structured_input_signature
  # Criteo's 13 dense features, one id for each of the 3 tables.
  assert {k: (v.shape.as_list(), v.dtype.name) for k, v in specs.items()} == {
      "dense_features": ([None, 13], "float32"),
      "sparse_features": ([None, 3], "int32")}
  outputs = served(dense_features=tf.constant(rows[:, 1:14]),
                   sparse_features=tf.constant(rows[:, 14:], tf.int32))
  assert sorted(outputs) == ["outputs"]
  np.testing.assert_allclose(outputs["outputs"].numpy(), predictions,
                             rtol=1e-6, atol=1e-6)


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
