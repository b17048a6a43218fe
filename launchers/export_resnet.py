"""Exports a ResNet50 checkpoint as classification and feature-vector SavedModels.

    python launchers/export_resnet.py --checkpoint=/tmp/resnet50 \
        --export_dir=/tmp/resnet50_hub

`--checkpoint` is a checkpoint prefix or a directory (its latest checkpoint
is used). The model's config (`num_classes`, batch norm epsilon) comes from
`params.yaml` beside the checkpoint when there is one, else from
`resnet50_imagenet_ctl`'s defaults; `--num_classes` overrides it (1001 for
the reference runner's checkpoints). See `experiments/imagenet/export.py`
for what is written. Bad input prints one `error:` paragraph and exits 2.
"""

import os
import sys

# This repository's experiments/, wherever it runs.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from tfm_ext.base import startup

# As in launchers/train.py: TensorFlow quiet, no collections while
# importing. Python's own signals: this tool runs no job that a restart
# resumes, so a signal is no preemption (no exit 42).
startup.begin(signals=False)
from absl import app
from absl import flags
import tensorflow as tf

from official.modeling import hyperparams

from experiments.imagenet import export
from experiments.imagenet import resnet50
from tfm_ext.base.errors import UsageError

startup.end()

flags.DEFINE_string("checkpoint", None, "Checkpoint prefix or directory.")
flags.DEFINE_string("export_dir", None, "Where the SavedModels go.")
flags.DEFINE_integer("num_classes", None, "Outputs of fc1000, if not the "
                     "checkpoint's params.yaml value.")
FLAGS = flags.FLAGS


def main(argv) -> None:
  """Resolves the checkpoint and model config, then exports."""
  del argv
  try:
    checkpoint, model_config = _resolve()
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(UsageError.EXIT_CODE)
  paths = export.export_saved_models(checkpoint, FLAGS.export_dir,
                                     model_config)
  for name, path in paths.items():
    print(f"exported {name}: {path}")


def _resolve():
  """Returns `(checkpoint prefix, ResNet50Config)`; raises `UsageError`."""
  if not FLAGS.checkpoint or not FLAGS.export_dir:
    raise UsageError("Pass --checkpoint (a prefix or a directory) and "
                     "--export_dir.")
  checkpoint = FLAGS.checkpoint
  directory = os.path.dirname(checkpoint)
  if tf.io.gfile.isdir(checkpoint):
    directory, checkpoint = checkpoint, tf.train.latest_checkpoint(checkpoint)
    if not checkpoint:
      raise UsageError(f"No checkpoint in --checkpoint={FLAGS.checkpoint!r}.")
  elif not tf.io.gfile.exists(checkpoint + ".index"):
    raise UsageError(f"--checkpoint={checkpoint!r} is neither a directory "
                     "nor a checkpoint prefix (no .index file).")
  existing = [name for name in export.SAVED_MODELS
              if tf.io.gfile.exists(os.path.join(FLAGS.export_dir, name))]
  if existing:
    raise UsageError(f"--export_dir={FLAGS.export_dir!r} already holds "
                     f"{', '.join(existing)}; choose another directory.")

  model_config = resnet50.ResNet50Config()
  params_yaml = os.path.join(directory, "params.yaml")
  if tf.io.gfile.exists(params_yaml):
    saved = hyperparams.read_yaml_to_params_dict(params_yaml).as_dict()
    model_config.override(saved["task"]["model"], is_strict=False)
  if FLAGS.num_classes:
    model_config.override({"num_classes": FLAGS.num_classes})
  return checkpoint, model_config


if __name__ == "__main__":
  app.run(main)
