"""TFM's ranking recipe (DLRM, DCN on Criteo), trained by the launcher.

    pip install -e ".[ranking]"
    SMOKE=$(python -m tfm_ext.training.ranking)  # Prints `SMOKE`.
    python launchers/train.py --experiment=dlrm_criteo --trainer=ranking \
        --mode=train_and_eval --model_dir=/tmp/dlrm --params_override="$SMOKE"

`SMOKE` shrinks it to a smoke run on synthetic data (20 steps of 16 rows,
three small tables; under a minute on a CPU). TFM sizes these experiments
for TPUs: `dlrm_criteo`'s 26 tables hold 188 million rows, 48 GB of float32
at its 64 dimensions. For Criteo itself, set `task.train_data.input_path`
and `task.validation_data.input_path` to its TSV files instead.

Importing this module registers TFM's ranking experiments (`dlrm_criteo`,
`dcn_criteo`, `dlrm_dcn_v2_criteo`), TFM's own `RankingTrainer`, unmodified,
as trainer "ranking", and TFM's `RankingTask` for those experiments' task
config. The trainer and the task need TensorFlow Recommenders, an optional
extra: they load (`tfm_ext.training._ranking_task`, which says what it adapts) when
a run first asks for them, so the base install lists them and can run
everything else. `registry_imports.py` imports this module for
`launchers/train.py`; `tfm-ext-train` takes `--registry=tfm_ext.training.ranking`.

With `task.use_synthetic_data=true` the task makes its data and reads no
`input_path`; the input files are not checked then
(`tfm_ext.training.input_files`).
"""

from official.core import task_factory
# Registers TFM's ranking experiments in `exp_factory`.
from official.recommendation.ranking.configs import config as ranking_config

from tfm_ext.base.errors import UsageError
from tfm_ext.training import trainers

SMOKE = ",".join([
    "task.use_synthetic_data=true", "trainer.use_orbit=true",
    "task.model.vocab_sizes=[40,30,20]", "task.model.embedding_dim=4",
    "task.model.bottom_mlp=[8,4]", "task.model.top_mlp=[8,1]",
    "task.train_data.global_batch_size=16",
    "task.validation_data.global_batch_size=16",
    "trainer.train_steps=20", "trainer.steps_per_loop=10",
    "trainer.summary_interval=10", "trainer.checkpoint_interval=10",
    "trainer.validation_interval=10", "trainer.validation_steps=5"])
EXTRA = "pip install -e \".[ranking]\" (or pip install tensorflow-recommenders)"


def _load():
  """`tfm_ext.training._ranking_task`, or `UsageError` saying what is missing."""
  try:
    from tfm_ext.training import _ranking_task  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    if getattr(e, "name", None) == "tensorflow_recommenders":
      raise UsageError(
          "TFM's ranking trainer and task need TensorFlow Recommenders, "
          f"which is not installed: {EXTRA}.") from e
    # TensorFlow Recommenders' own message: tf.keras is Keras 3 here, as
    # something in this process read it before (`tfm_ext.training._ranking_task`).
    raise UsageError(
        f"TFM's ranking trainer and task cannot be loaded: {e} (in the "
        "environment before Python starts: this process read tf.keras "
        "before they loaded, which fixed it to Keras 3)") from e
  return _ranking_task


trainers.TRAINERS.register_lazily(
    "ranking", lambda: _load().RankingTrainer,
    doc="TFM's RankingTrainer (DLRM, DCN), unmodified; needs "
        "TensorFlow Recommenders: pip install -e \".[ranking]\".")


@task_factory.register_task_cls(ranking_config.Task)
def ranking_task(params: ranking_config.Task, *,
                 trainer_config: ranking_config.TrainerConfig,
                 logging_dir=None, name=None):
  """TFM's RankingTask (DLRM, DCN), with the trainer config it needs."""
  return _load().RankingTask(params, trainer_config=trainer_config,
                             logging_dir=logging_dir, name=name)


if __name__ == "__main__":
  print(SMOKE)
