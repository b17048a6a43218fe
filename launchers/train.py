"""Trains and evaluates this repository's experiments.

    python launchers/train.py --experiment=digits_convnet \
        --mode=train_and_eval --model_dir=/tmp/digits

`--list` shows the registered experiments, tasks, trainers and models.
"""

import os

# TensorFlow's C++ start-up INFO lines would bury the progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position

import tfm_ext.launcher
import registry_imports  # pylint: disable=unused-import

if __name__ == "__main__":
  app.run(tfm_ext.launcher.main)
