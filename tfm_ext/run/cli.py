"""`tfm-ext-train`: the launcher with its flags (`tfm_ext.run.launcher`).

    tfm-ext-train --experiment=digits_convnet --mode=train_and_eval \
        --model_dir=/tmp/digits
    tfm-ext-train --registry=my_project.registry_imports --experiment=mine ...
"""


def main() -> None:
  """Runs the launcher; its import quiets TensorFlow's start-up first.

  The current directory comes first on `sys.path`, as with
  `python -m tfm_ext`, so `--registry=my_project.registry_imports` finds a
  project run from its own directory.
  """
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  # pylint: disable=g-import-not-at-top
  from tfm_ext.base import startup
  # Signals exit 42, TensorFlow quiet (tfm_ext/base/startup.py).
  startup.begin()
  from absl import app
  import tfm_ext.run.launcher
  startup.end()
  app.run(tfm_ext.run.launcher.main)
