"""SGD with momentum and the reference's learning rate, stated in epochs.

The reference ResNet runner (`common.PiecewiseConstantDecayWithWarmup`)
scales 0.1 by `global_batch / 256`, warms up linearly from 0 over 5 epochs,
then multiplies by 0.1 after epochs 30, 60 and 80. Stated in epochs, it
follows the training batch size; `optimization_config` turns it into TFM's
step-based `OptimizationConfig` (SGD, `stepwise`, `linear` warmup), whose
values are the reference's at every step.
"""

import dataclasses
from typing import List

from official.modeling import hyperparams
from official.modeling import optimization


@dataclasses.dataclass
class EpochSchedule(hyperparams.Config):
  """Momentum SGD whose learning rate changes at epoch boundaries.

  Attributes:
    momentum: SGD momentum.
    base_learning_rate: The rate for `base_batch_size`; scaled linearly.
    base_batch_size: The batch size `base_learning_rate` is for.
    warmup_epochs: Linear warmup from 0 to the scaled rate.
    boundary_epochs: Epochs after which the next multiplier applies.
    multipliers: Of the scaled rate, one more than `boundary_epochs`.
  """
  momentum: float = 0.9
  base_learning_rate: float = 0.1
  base_batch_size: int = 256
  warmup_epochs: int = 5
  boundary_epochs: List[int] = dataclasses.field(
      default_factory=lambda: [30, 60, 80])
  multipliers: List[float] = dataclasses.field(
      default_factory=lambda: [1.0, 0.1, 0.01, 0.001])


def optimization_config(schedule: EpochSchedule, global_batch_size: int,
                        examples_per_epoch: int
                        ) -> optimization.OptimizationConfig:
  """Returns TFM's step-based config of `schedule` for this batch size."""
  if len(schedule.multipliers) != len(schedule.boundary_epochs) + 1:
    raise ValueError(
        f"schedule.multipliers needs one more entry than boundary_epochs: got "
        f"{list(schedule.multipliers)} for {list(schedule.boundary_epochs)}.")
  # Integer division, as the reference: the last partial batch is dropped.
  steps_per_epoch = examples_per_epoch // global_batch_size
  if steps_per_epoch < 1:
    raise ValueError(f"An epoch of {examples_per_epoch} examples is shorter "
                     f"than one batch of {global_batch_size}.")
  learning_rate = (schedule.base_learning_rate * global_batch_size
                   / schedule.base_batch_size)
  config = {
      "optimizer": {"type": "sgd", "sgd": {"momentum": schedule.momentum}},
      "learning_rate": {
          "type": "stepwise",
          "stepwise": {
              "boundaries": [e * steps_per_epoch
                             for e in schedule.boundary_epochs],
              "values": [learning_rate * m for m in schedule.multipliers],
          },
      },
  }
  if schedule.warmup_epochs:
    config["warmup"] = {"type": "linear", "linear": {
        "warmup_steps": schedule.warmup_epochs * steps_per_epoch,
        "warmup_learning_rate": 0.0}}
  return optimization.OptimizationConfig(config)
