"""TFM's own experiments in the benchmarks, shrunk and fed as the tests do.

    python benchmarks/_tfm_experiments.py DIR NAME...   # writes their data

`tests/e2e/test_tfm_experiments.py` runs TFM's registered experiments
through our launcher and through stock TFM, each shrunk by its YAML in
`tests/e2e/tfm_configs/` and fed records cut from real photos
(`tests/tfm_experiment_data.py`; DLRM: Criteo-format rows). The benchmarks
run the same configs on the same data: `launch(name)` says how each side
starts an experiment (`training_loops.Workload`'s fields), `prepared` and
`write` write its data and return the test's overrides for it, less its
`trainer.*` fields, which the benchmark sets. Writing imports TensorFlow
and the test module: it runs in a process of its own, so that the process
that measures stays small.
"""

import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # pylint: disable=g-import-not-at-top,wrong-import-position

# The experiments of issue 48's rows; the others of the test's matrix
# (ResNet, MobileNet) are image classification, which `resnet50` and
# `first_step.py`'s `resnet_imagenet` cover.
NAMES = ("retinanet_resnetfpn_coco", "maskrcnn_resnetfpn_coco",
         "seg_deeplabv3_pascal", "video_classification_kinetics400",
         "dlrm_criteo")
CONFIGS = os.path.join(_common.REPO, "tests", "e2e", "tfm_configs")
_OFFICIAL = importlib.util.find_spec("official").submodule_search_locations[0]
# Stock TFM's own train.py of each kind, as a user runs it.
VISION_TRAIN = os.path.join(_OFFICIAL, "vision", "train.py")
RANKING_TRAIN = os.path.join(_OFFICIAL, "recommendation", "ranking", "train.py")


def launch(name: str) -> Dict[str, Any]:
  """`training_loops.Workload`'s fields that start experiment `name`, and
  its loop length.

  Vision: both sides import `official.vision.registry_imports`, stock
  runs `official/vision/train.py`'s path. DLRM: ours `--trainer=ranking`,
  stock the `RankingTrainer` of `official/recommendation/ranking/train.py`;
  both with Keras 2 (`TF_USE_LEGACY_KERAS=1`, as the tests run it:
  TensorFlow Recommenders needs it).
  """
  fields = {"config_file": os.path.join(CONFIGS, f"{name}.yaml"),
            "tfm_data": name}
  if name == "dlrm_criteo":
    # A step takes about a millisecond of CPU: loops of 500 steps.
    return dict(fields, steps_per_loop=500, summary_interval=500,
                registry="tfm_ext.training.ranking", trainer="ranking",
                stock="stock_ranking",
                stock_registry="official.recommendation.ranking.train",
                env=("TF_USE_LEGACY_KERAS=1",))
  # From scratch: the tests start both sides from a checkpoint they write;
  # TFM's defaults name pretrained ones on GCS (DeepLab's).
  # Steps of 50 ms (DeepLab) to a few hundred (Mask R-CNN) of CPU: loops
  # of 10. A small constant learning rate: a session trains hundreds of
  # steps on 4 images, and TFM's schedules (RetinaNet's warms up to 0.32)
  # diverge there, which ours stops at (`trainer.loss_upper_bound`).
  return dict(fields, steps_per_loop=10, summary_interval=10,
              overrides=",".join((
                  "task.init_checkpoint=''",
                  "trainer.optimizer_config.learning_rate.type=constant",
                  "trainer.optimizer_config.learning_rate.constant."
                  "learning_rate=0.0001",
                  "trainer.optimizer_config.warmup.linear."
                  "warmup_learning_rate=0.0001")),
              registry="official.vision.registry_imports",
              stock_registry="official.vision.registry_imports")


def stock_script(name: str, relative: bool = False) -> str:
  """Stock TFM's train.py for experiment `name` (`relative`: from the
  folder holding `official/`)."""
  path = RANKING_TRAIN if name == "dlrm_criteo" else VISION_TRAIN
  return os.path.relpath(path, os.path.dirname(_OFFICIAL)) if relative else path


def write(directory: str, names: Sequence[str]) -> Dict[str, str]:
  """Writes the data of `names` into `directory` (in a child process);
  returns `{name: its overrides}`."""
  done = subprocess.run(
      [_common.python(), os.path.abspath(__file__), directory, *names],
      cwd=_common.REPO, env={**os.environ, **_common.CHILD_ENV},
      capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise _common.ChildFailed(f"writing {names}: {done.stderr[-3000:]}")
  return json.loads(done.stdout.splitlines()[-1])


def fed(workload, overrides: Dict[str, str]):
  """`workload` with its data's overrides (of `write`'s `overrides`) added."""
  return dataclasses.replace(workload, overrides=",".join(
      part for part in (workload.overrides, overrides[workload.tfm_data])
      if part))


@contextlib.contextmanager
def prepared(workload) -> Iterator[Any]:
  """`workload` with its data written and the test's overrides added; as
  it is if it is not one of TFM's experiments."""
  if not workload.tfm_data:
    yield workload
    return
  directory = tempfile.mkdtemp(prefix="bench_tfm_data_")
  try:
    yield fed(workload, write(directory, [workload.tfm_data]))
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def _write_here(directory: str, names: Sequence[str]) -> Dict[str, str]:
  """`write`'s work, in this process: the test's writers and overrides."""
  tests = os.path.join(_common.REPO, "tests")
  sys.path[:0] = [tests, os.path.join(tests, "e2e")]
  # pylint: disable=g-import-not-at-top
  import test_tfm_experiments as matrix
  import tfm_experiment_data as data
  # pylint: enable=g-import-not-at-top
  writers = {"detection": data.write_detection,
             "segmentation": data.write_segmentation,
             "video": data.write_video, "criteo": data.write_criteo}
  experiments = [matrix.EXPERIMENTS[name] for name in names]
  for folder in {e.data for e in experiments}:
    writers[folder](os.path.join(directory, folder))
  return {e.name: ",".join(
      part for part in matrix.overrides(e, directory).split(",")
      if not part.startswith("trainer.")) for e in experiments}


if __name__ == "__main__":
  print(json.dumps(_write_here(sys.argv[1], sys.argv[2:])))
