"""The trainer registry: trainers are chosen by name from the experiment.

A trainer is a class with the constructor of
`official.core.base_trainer.Trainer`. TFM's own `Trainer` is registered as
`"tfm_base"`; `tfm_ext.CustomTrainer` as `"custom"`.
"""

import dataclasses

from official.core import base_trainer
from official.core import config_definitions
from official.modeling import hyperparams

from tfm_ext.base import registry

TRAINERS = registry.Registry("trainer")
DEFAULT_TRAINER = "custom"


@dataclasses.dataclass
class EarlyStoppingConfig(hyperparams.Config):
  """`trainer.early_stopping`: ends training when an evaluation stalls.

  Attributes:
    metric: the evaluation's log to watch (`accuracy`, `validation_loss`;
      a nested log by its keys joined with `|`, `coco|AP`), checked whole
      against what the evaluations log; "" (the default) turns it off.
    mode: "max" (higher is better) or "min"; "auto": "min" for a name with
      "loss" or "error" in it, else "max".
    patience: how many evaluations in a row may fail to improve on the best
      by more than `min_delta` before the run stops (saving first).
    min_delta: the least change that counts as better.
  """
  metric: str = ""
  mode: str = "auto"
  patience: int = 5
  min_delta: float = 0.0


@dataclasses.dataclass
class ReduceLROnPlateauConfig(hyperparams.Config):
  """`trainer.reduce_lr_on_plateau`: lowers the learning rate on a plateau.

  A factor on top of any TFM learning-rate schedule: after `patience`
  evaluations in a row without improving on the best by more than
  `min_delta`, the factor is multiplied by `factor`, while the schedule's
  rate times the factor stays above `min_lr` (a `min_lr` at or above the
  schedule's rate is refused: no reduction could act). `metric`, `mode`:
  as `EarlyStoppingConfig`'s; "" turns it off.
  """
  metric: str = ""
  mode: str = "auto"
  factor: float = 0.1
  patience: int = 2
  min_delta: float = 0.0
  min_lr: float = 0.0


@dataclasses.dataclass
class TrainerConfig(config_definitions.TrainerConfig):
  """TFM's `TrainerConfig` plus the fields tfm_ext adds.

  Attributes:
    name: the registered trainer to run.
    best_checkpoint_top_k: how many best checkpoints the exporter keeps.
    checkpoint_input_iterator: whether checkpoints hold the training input
      iterator's position, so a resumed run sees exactly the data an
      uninterrupted one would (`CustomTrainer`; costs the size of the
      iterator's buffers in each checkpoint).
    early_stopping: ends training when an evaluation metric stalls
      (`EarlyStoppingConfig`; off by default).
    reduce_lr_on_plateau: lowers the learning rate when it stalls
      (`ReduceLROnPlateauConfig`; off by default).

  Experiments whose config lacks these fields (TFM's own) get them, with
  these defaults, when the launcher builds their params.
  """
  name: str = DEFAULT_TRAINER
  best_checkpoint_top_k: int = 1
  checkpoint_input_iterator: bool = True
  early_stopping: EarlyStoppingConfig = dataclasses.field(
      default_factory=EarlyStoppingConfig)
  reduce_lr_on_plateau: ReduceLROnPlateauConfig = dataclasses.field(
      default_factory=ReduceLROnPlateauConfig)


def added_fields():
  """The fields `TrainerConfig` adds to TFM's, with their defaults."""
  base = {f.name for f in dataclasses.fields(config_definitions.TrainerConfig)}
  return {f.name: (f.default_factory().as_dict()
                   if f.default is dataclasses.MISSING else f.default)
          for f in dataclasses.fields(TrainerConfig) if f.name not in base}


def register_trainer(name: str):
  """Class decorator: registers a `base_trainer.Trainer` subclass as `name`."""
  register = TRAINERS.register(name)

  def decorator(cls):
    if not (isinstance(cls, type) and issubclass(cls, base_trainer.Trainer)):
      raise registry.RegistryError(
          f"register_trainer({name!r}) needs a subclass of "
          f"official.core.base_trainer.Trainer, got {cls!r}.")
    return register(cls)

  return decorator


def get_trainer(name: str):
  """Returns the trainer class registered as `name`."""
  return TRAINERS.get(name)


def _custom_trainer():
  from tfm_ext.training import custom_trainer  # pylint: disable=g-import-not-at-top
  return custom_trainer.CustomTrainer


register_trainer("tfm_base")(base_trainer.Trainer)
# The library's own trainer, the default: its module imports the input,
# determinism and evaluation modules, and none of them this registry.
TRAINERS.register_lazily(
    DEFAULT_TRAINER, _custom_trainer,
    doc="A `base_trainer.Trainer` whose loop pieces are public, documented "
        "hooks.")
