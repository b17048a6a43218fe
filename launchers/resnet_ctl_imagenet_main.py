"""TFM's legacy ResNet50 CTL runner's command line, run by our driver.

Takes every flag of `official/legacy/image_classification/resnet/
resnet_ctl_imagenet_main.py`, with its short name and default
(`experiments/imagenet/reference_flags.py`), and runs the
`resnet50_imagenet_ctl` experiment with the `resnet_ctl` trainer. The
reference README's command lines run unchanged but for paths:

    python launchers/resnet_ctl_imagenet_main.py --data_dir=/data/imagenet \
        --model_dir=/tmp/model_dir/something --num_gpus=2 --batch_size=128 \
        --train_epochs=90 --train_steps=10 --use_synthetic_data=false

The mapping, and which reference behaviours are kept (and logged), is in
`experiments/imagenet/reference_runner.py`; flags that do nothing in a run
(GPU-only ones on a CPU, ones the reference never reads) are logged too.
Progress lines go to stdout, then the reference's `Run stats: {...}`; the
absl log goes to `model_dir/logs/` (`--alsologtostderr` for the console),
and signals, restarts and exit codes are those of `launchers/train.py`. Bad
flags print one `error:` paragraph and exit 2 before anything is written.
"""

import os
import sys

# This repository's experiments/ and registry_imports.py, wherever it runs.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tfm_ext.base import startup

# As in launchers/train.py: a signal from here until the run starts exits
# 42, nothing to save yet; TensorFlow quiet and no collections while
# importing (tfm_ext/base/startup.py).
startup.begin()
from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

import registry_imports  # pylint: disable=unused-import
from experiments.imagenet import reference_flags
from experiments.imagenet import reference_runner
from tfm_ext.config import params as params_lib
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import run_summary
from tfm_ext.run import driver

startup.end()

reference_flags.define_flags()
flags.adopt_module_key_flags(reference_flags)  # --helpshort lists them.
FLAGS = flags.FLAGS


def main(argv) -> None:
  """Translates the flags, checks everything, then trains (and evaluates)."""
  summary = driver.job(lambda: _plan(argv))
  stats = reference_runner.build_stats(summary, FLAGS.skip_eval)
  logging.info("Run stats:\n%s", stats)
  print(f"Run stats: {stats}", flush=True)


def _plan(argv) -> driver.Plan:
  """The checked plan of the reference runner's flags (`--clean` done)."""
  if len(argv) > 1:
    raise UsageError(f"Unexpected arguments: {' '.join(argv[1:])}.")
  gpus_visible = len(tf.config.list_physical_devices("GPU"))
  translation = reference_runner.translate(FLAGS, gpus_visible)
  if gpus_visible:
    # Where the reference does it: before the strategy starts the GPUs.
    reference_flags.configure_gpus(FLAGS)
  params = params_lib.build(translation.sources)
  plan = driver.prepare(driver.RunRequest(
      experiment=reference_runner.EXPERIMENT, mode=translation.mode,
      model_dir=translation.model_dir, params=params,
      start_time=run_summary.process_start_time()))
  if FLAGS.clean:
    reference_runner.check_cleanable(translation.model_dir)
  for note in translation.notes:
    logging.warning(note)
  if FLAGS.clean and tf.io.gfile.exists(translation.model_dir):
    logging.warning("--clean: removing %s", translation.model_dir)
    tf.io.gfile.rmtree(translation.model_dir)
  return plan


if __name__ == "__main__":
  app.run(main)
