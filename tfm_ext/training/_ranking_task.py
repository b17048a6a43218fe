"""TFM's ranking task, adapted to be built as `task_factory` builds tasks.

Loaded by `tfm_ext.training.ranking` when a run first needs the ranking trainer or
task: it imports TensorFlow Recommenders, which the base install lacks.

TFM's own `train.py` builds `RankingTask` by hand; two things keep it from
being built the way every other task is, and are adapted here:

* its constructor takes the trainer config (its optimizers and learning
  rates are `trainer.optimizer_config`): `tfm_ext.training.ranking`'s builder
  declares `trainer_config`, so `tfm_ext.run.assembly.build_task` passes it;
* it builds its optimizers (one for the embeddings, one for the dense
  layers, composed) in `build_model` and returns None from
  `create_optimizer`: here `create_optimizer` returns that composite, which
  the trainer then steps, checkpoints, and whose learning rates
  `RankingTrainer.train_loop_end` logs, as in TFM's `train.py`.

TFM has no exporter for it; `serving_inputs` says what `--mode=export`'s
`serving_default` takes (`tfm_ext.model_dir.export`).

TensorFlow Recommenders needs `tf.keras` to be Keras 2 (`tf_keras`), which
TensorFlow decides the first time anything reads `tf.keras`, from the
environment variable `TF_USE_LEGACY_KERAS`. This module sets it to 1, unless
it is set already, before it imports TensorFlow Recommenders: the launcher
and TFM use `tf_keras` by name and do not read `tf.keras` before, so a user
need not set it. It stays set for the process (and the processes it
starts); where `tf.keras` was read before, TensorFlow Recommenders' own
`ImportError` says to set it before Python starts.
"""

import os

# Before TensorFlow Recommenders reads `tf.keras` (see the docstring).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
import tensorflow_recommenders
import tensorflow as tf

from official.recommendation.ranking import task as ranking_task
from official.recommendation.ranking.configs import config as ranking_config
# TFM's trainer, unmodified: `tfm_ext.training.ranking` registers it as "ranking".
from official.recommendation.ranking.train import RankingTrainer

from tfm_ext.model_dir import export
# pylint: enable=g-import-not-at-top,wrong-import-position,unused-import


class RankingTask(ranking_task.RankingTask):
  """TFM's `RankingTask`, whose optimizer `create_optimizer` returns."""

  def __init__(self, params: ranking_config.Task, *,
               trainer_config: ranking_config.TrainerConfig,
               logging_dir=None, name=None):
    super().__init__(params, trainer_config=trainer_config,
                     logging_dir=logging_dir, name=name)
    self._composite_optimizer = None

  def build_model(self):
    """TFM's model, compiled with the composite optimizer it builds."""
    model = super().build_model()
    self._composite_optimizer = model.optimizer
    return model

  # An instance method where TFM's is a class method: the optimizer is the
  # one `build_model` built, and `train_utils.create_trainer` calls
  # `build_model` first.
  def create_optimizer(self, optimizer_config=None, runtime_config=None):  # pylint: disable=arguments-differ
    """The composite optimizer `build_model` built (None before it ran)."""
    del optimizer_config, runtime_config  # Read by `build_model` already.
    return self._composite_optimizer

  def serving_inputs(self, model) -> export.ServingInputs:
    """Criteo rows as the model takes them; it returns its predictions.

    `dense_features`: float32 `[batch, num_dense_features]`;
    `sparse_features`: int32 `[batch, tables]`, column i an id of table i
    (`vocab_sizes[i]`), which becomes the model's `sparse_features["i"]`.
    """
    del model  # TFM's Ranking model, called as its task's data feeds it.
    config = self.task_config.model
    tables = len(config.vocab_sizes)

    def prepare(inputs):
      return {"dense_features": inputs["dense_features"],
              "sparse_features": {str(i): inputs["sparse_features"][:, i]
                                  for i in range(tables)}}

    return export.ServingInputs(
        specs={"dense_features": tf.TensorSpec(
                   [None, config.num_dense_features], tf.float32),
               "sparse_features": tf.TensorSpec([None, tables], tf.int32)},
        prepare=prepare)
