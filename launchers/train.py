"""Trains and evaluates this repository's experiments.

    python launchers/train.py --experiment=digits_convnet \
        --mode=train_and_eval --model_dir=/tmp/digits

`--list` shows the registered experiments, tasks, trainers and models.
"""

import gc
import os

# TensorFlow's C++ start-up INFO lines would bury the progress lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# The imports below make hundreds of thousands of objects that live as long
# as the process, and Python's collector would rescan them in several full
# collections while they load. It is off until they are in; `gc.freeze`
# then keeps later collections from rescanning them (benchmarks/startup.py;
# benchmarks/RESULTS.md#default-collector-off-while-importing and
# #default-gc-freeze).
gc.disable()

# pylint: disable=g-import-not-at-top,wrong-import-position
from tfm_ext import _startup_signals

# SIGTERM or SIGINT from here until the run starts: exit 42, nothing to
# save yet (Python's default, while TensorFlow loads, is exit 143).
_startup_signals.install()
from absl import app

import tfm_ext.launcher
import registry_imports  # pylint: disable=unused-import
# pylint: enable=g-import-not-at-top,wrong-import-position

gc.freeze()
gc.enable()

if __name__ == "__main__":
  app.run(tfm_ext.launcher.main)
