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
  # A signal while TensorFlow loads: exit 42, nothing to save yet.
  from tfm_ext.run import _startup_signals  # pylint: disable=g-import-not-at-top
  _startup_signals.install()
  from absl import app  # pylint: disable=g-import-not-at-top
  import tfm_ext.run.launcher  # pylint: disable=g-import-not-at-top
  app.run(tfm_ext.run.launcher.main)
