"""Trains and evaluates this repository's experiments.

    python launchers/train.py --experiment=digits_convnet \
        --mode=train_and_eval --model_dir=/tmp/digits

`--list` shows the registered experiments, tasks, trainers and models. It is
`tfm-ext-train` with this repository's registrations (`registry_imports.py`),
which are not installed with the library.
"""

import os
import sys

# This repository's experiments/ and registry_imports.py, wherever it runs.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tfm_ext.base import startup

# SIGTERM, SIGINT or SIGHUP from here until the run starts: exit 42,
# nothing to save yet (Python's default, while TensorFlow loads, is exit
# 143). Quiet TensorFlow and no collections while importing
# (tfm_ext/base/startup.py;
# benchmarks/RESULTS.md#default-collector-off-while-importing).
startup.begin()
from absl import app

import tfm_ext.run.launcher
import registry_imports  # pylint: disable=unused-import
startup.end()
# pylint: enable=g-import-not-at-top,wrong-import-position

if __name__ == "__main__":
  app.run(tfm_ext.run.launcher.main)
