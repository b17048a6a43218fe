"""A builder that fills its config in changes no recorded config.

TFM's builders may complete the config they are given while they build
(ViT's `model_name` writes `hidden_size` and the rest, YOLO's input its
data seed). The run records the config the user gave, as stock TFM does
(it writes `params.yaml` before it builds), so the same command relaunched
resumes.
"""

import os

import yaml

from conftest import DOUBLES_TRAIN
from conftest import SMOKE

PRESET = "task.model.name=preset_convnet"


def test_the_same_command_resumes_after_a_builder_filled_its_config(
    launch_forked, tmp_path):
  model_dir = str(tmp_path / "run")
  first = launch_forked(
      "--experiment=digits_convnet", "--mode=train",
      f"--params_override={SMOKE.replace('train_steps=40', 'train_steps=20')}"
      f",{PRESET}", model_dir=model_dir, script=DOUBLES_TRAIN)
  assert first.returncode == 0, first.stderr
  again = launch_forked(
      "--experiment=digits_convnet", "--mode=train",
      f"--params_override={SMOKE},{PRESET}", model_dir=model_dir,
      script=DOUBLES_TRAIN)
  assert again.returncode == 0, again.stderr
  assert "another config" not in again.stderr
  assert "step 40/40" in again.stdout
  with open(os.path.join(model_dir, "params.yaml"), encoding="utf-8") as f:
    recorded = yaml.safe_load(f)["task"]["model"]
  # As given, not as the builder filled it (filters [8], dense_units 16).
  assert recorded["filters"] == [32, 64] and recorded["dense_units"] == 128
