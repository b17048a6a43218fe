"""Trains and evaluates this repository's experiments.

    python launchers/train.py --experiment=digits_convnet \
        --mode=train_and_eval --model_dir=/tmp/digits

`--list` shows the registered experiments, tasks, trainers and models.
"""

import gc
import os

# TensorFlow's C++ start-up INFO lines would bury the progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# The imports below make about 490,000 objects that live as long as the
# process, and Python's collector would rescan them in seven full
# collections while they load: 0.7 s of a 5.7 s time to first step. It is
# off until they are in; `gc.freeze` then keeps later collections from
# rescanning them (benchmarks/startup.py; its row in benchmarks/RESULTS.md).
gc.disable()

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app

import tfm_ext.launcher
import registry_imports  # pylint: disable=unused-import
# pylint: enable=g-import-not-at-top,wrong-import-position

gc.freeze()
gc.enable()

if __name__ == "__main__":
  app.run(tfm_ext.launcher.main)
