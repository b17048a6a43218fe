"""The launcher's modes: one table from name to what the mode does.

Unknown names are rejected up front with the list, unlike TFM's flag enum
that accepts modes `train_lib` then cannot run.
"""

import dataclasses
import time
from typing import Any, Callable, Mapping, Optional

from absl import logging
import orbit
import tensorflow as tf

from official.core import config_definitions

from tfm_ext import registry
from tfm_ext.errors import UsageError

Logs = Optional[Mapping[str, Any]]
# How often continuous_eval looks for a new checkpoint, in seconds.
CHECKPOINT_POLL_SECONDS = 1


@dataclasses.dataclass(frozen=True)
class Mode:
  """What a mode needs and the function that runs it on a controller."""
  trains: bool
  evaluates: bool
  run: Callable[[orbit.Controller, config_definitions.ExperimentConfig], Logs]
  needs_checkpoint: bool = False


def _train(controller, params) -> Logs:
  controller.train(steps=params.trainer.train_steps)
  return None


def _eval(controller, params) -> Logs:
  return controller.evaluate(steps=params.trainer.validation_steps)


def _train_and_eval(controller, params) -> Logs:
  return controller.train_and_evaluate(
      train_steps=params.trainer.train_steps,
      eval_steps=params.trainer.validation_steps,
      eval_interval=params.trainer.validation_interval)


def _train_and_post_eval(controller, params) -> Logs:
  _train(controller, params)
  return _eval(controller, params)


def _continuous_eval(controller, params) -> Logs:
  """Evaluates each new checkpoint until the one at `train_steps`.

  Gives up after `continuous_eval_timeout` seconds without a new checkpoint.
  Unlike Orbit's `evaluate_continuously` it polls every
  `CHECKPOINT_POLL_SECONDS`, so it exits right after the final checkpoint
  instead of waiting out the whole timeout.
  """
  last_new = time.monotonic()
  output = None

  def done() -> bool:
    if controller.global_step.numpy() >= params.trainer.train_steps:
      return True
    waited = time.monotonic() - last_new
    if waited > params.trainer.continuous_eval_timeout:
      logging.warning("No new checkpoint in %s for %.0f s; stopping.",
                      controller.checkpoint_manager.directory, waited)
      return True
    return False

  for path in tf.train.checkpoints_iterator(
      controller.checkpoint_manager.directory,
      timeout=CHECKPOINT_POLL_SECONDS, timeout_fn=done):
    controller.restore_checkpoint(path)
    output = controller.evaluate(steps=params.trainer.validation_steps)
    last_new = time.monotonic()
  return output


MODES = {
    "train": Mode(trains=True, evaluates=False, run=_train),
    "eval": Mode(trains=False, evaluates=True, run=_eval,
                 needs_checkpoint=True),
    "train_and_eval": Mode(trains=True, evaluates=True, run=_train_and_eval),
    "train_and_post_eval": Mode(trains=True, evaluates=True,
                                run=_train_and_post_eval),
    "continuous_eval": Mode(trains=False, evaluates=True,
                            run=_continuous_eval),
}


def get_mode(name: str) -> Mode:
  """Returns the mode called `name`, or raises `UsageError` listing them."""
  if name not in MODES:
    raise UsageError(registry.unknown_name_message("mode", str(name),
                                                   list(MODES)))
  return MODES[name]
