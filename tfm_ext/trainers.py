"""The trainer registry: trainers are chosen by name from the experiment.

A trainer is a class with the constructor of
`official.core.base_trainer.Trainer`. TFM's own `Trainer` is registered as
`"tfm_base"`; `tfm_ext.CustomTrainer` as `"custom"`.
"""

import dataclasses

from official.core import base_trainer
from official.core import config_definitions

from tfm_ext import registry

TRAINERS = registry.Registry("trainer")
DEFAULT_TRAINER = "custom"


@dataclasses.dataclass
class TrainerConfig(config_definitions.TrainerConfig):
  """TFM's `TrainerConfig` plus `name`, the registered trainer to run.

  Experiments whose config lacks `name` (TFM's own) get it added with the
  default `"custom"` when the launcher builds their params.
  """
  name: str = DEFAULT_TRAINER


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


register_trainer("tfm_base")(base_trainer.Trainer)
