"""The launcher's modes: one table from name to what the mode does.

Unknown names are rejected up front with the list, unlike TFM's flag enum
that accepts modes `train_lib` then cannot run.
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional

import orbit

from official.core import config_definitions

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import export
from tfm_ext.model_dir import tfm_serving
from tfm_ext.run import continuous_eval
from tfm_ext.base import failures
from tfm_ext.base import registry
from tfm_ext.training import run_state

Logs = Optional[Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class ModeContext:
  """What a mode runs on."""
  controller: orbit.Controller
  params: config_definitions.ExperimentConfig
  model_dir: str
  # Polled between evaluations by continuous_eval (a preemption signal).
  should_stop: Callable[[], bool] = lambda: False
  # --checkpoint_path: the checkpoint an export takes.
  checkpoint_path: str = ""
  # --input_type, --batch_size, --input_image_size: how TFM's vision tasks
  # are served (`tfm_ext.model_dir.tfm_serving`).
  serving: tfm_serving.ServingOptions = tfm_serving.ServingOptions()
  # Filled by continuous_eval, however it ends, with its count of the
  # checkpoints (the run summary's `evaluations`).
  evaluations: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Mode:
  """What a mode needs and the function that runs it."""
  trains: bool
  evaluates: bool
  run: Callable[[ModeContext], Logs]
  needs_checkpoint: bool = False
  # Started beside a trainer, it may come first: it waits for the trainer's
  # params.yaml (`params.await_trainer_params`) before it builds anything.
  waits_for_trainer: bool = False
  # It polls `ModeContext.should_stop` and stops early on a signal, saving
  # nothing (an evaluator). A mode that trains saves and stops instead
  # (`tfm_ext.run.preemption`); any other runs to its end.
  stops_on_signal: bool = False
  # Its start restores the latest readable checkpoint; an export restores
  # the one it exports itself.
  restores_latest: bool = True


def _train(ctx: ModeContext) -> Logs:
  ctx.controller.train(steps=ctx.params.trainer.train_steps)
  return None


def _eval(ctx: ModeContext) -> Logs:
  return ctx.controller.evaluate(steps=ctx.params.trainer.validation_steps)


def _train_and_eval(ctx: ModeContext) -> Logs:
  """Trains, evaluating at every multiple of `validation_interval`.

  Orbit's `train_and_evaluate` counts the interval from the step it starts
  at, so a resumed run would evaluate at other steps than an uninterrupted
  one; here evaluations stay on the same grid. A run resumed at a step of
  the grid whose checkpoint was saved before that step's evaluation (as
  each is, unless a stop or a signal in that evaluation saved it) runs
  that evaluation first (`tfm_ext.training.run_state`): Orbit's would
  never run it.
  """
  trainer, controller = ctx.params.trainer, ctx.controller
  interval = trainer.validation_interval or trainer.train_steps
  output = None
  step = int(controller.global_step.numpy())
  if evaluation_pending(ctx.params, step, controller.trainer):
    output = controller.evaluate(steps=trainer.validation_steps)
  while step < trainer.train_steps:
    stop = min((step // interval + 1) * interval, trainer.train_steps)
    controller.train(steps=stop,
                     checkpoint_at_completion=stop == trainer.train_steps)
    output = controller.evaluate(steps=trainer.validation_steps)
    step = int(controller.global_step.numpy())
  return output


def evaluates_at(trainer_config, step: int) -> bool:
  """Whether a training mode's schedule evaluates at `step`: a multiple of
  `validation_interval` (`_train_and_eval`), or `train_steps` and past it
  (the evaluation after training, in every mode that evaluates)."""
  interval = trainer_config.validation_interval
  return step > 0 and (step >= trainer_config.train_steps
                       or bool(interval) and step % interval == 0)


def evaluation_pending(params, step: int, trainer) -> bool:
  """Whether the run resumed at `step` must run the evaluation of `step`
  first: the schedule evaluates there and the checkpoint's state does not
  hold that evaluation (`run_state.RunState.pending`)."""
  state = run_state.of(trainer)
  return bool(state is not None and state.pending(step)
              and evaluates_at(params.trainer, step))


def _train_and_post_eval(ctx: ModeContext) -> Logs:
  _train(ctx)
  return _eval(ctx)


def _continuous_eval(ctx: ModeContext) -> Logs:
  trainer_config = ctx.params.trainer
  return continuous_eval.evaluate_continuously(
      ctx.controller, model_dir=ctx.model_dir,
      eval_steps=trainer_config.validation_steps,
      train_steps=trainer_config.train_steps,
      timeout=trainer_config.continuous_eval_timeout,
      should_stop=ctx.should_stop, evaluations=ctx.evaluations)


def _export(ctx: ModeContext) -> Logs:
  """Writes the chosen, best or latest checkpoint to `model_dir/export/<step>/`.

  Its logs are the checkpoint's recorded metrics.
  """
  with failures.phase("export", ctx.model_dir):
    return export.export_model_dir(ctx.controller.evaluator, ctx.params,
                                   ctx.model_dir, ctx.checkpoint_path,
                                   ctx.serving)


MODES = {
    "train": Mode(trains=True, evaluates=False, run=_train),
    "eval": Mode(trains=False, evaluates=True, run=_eval,
                 needs_checkpoint=True),
    "train_and_eval": Mode(trains=True, evaluates=True, run=_train_and_eval),
    "train_and_post_eval": Mode(trains=True, evaluates=True,
                                run=_train_and_post_eval),
    "continuous_eval": Mode(trains=False, evaluates=True,
                            run=_continuous_eval, waits_for_trainer=True,
                            stops_on_signal=True),
    "export": Mode(trains=False, evaluates=False, run=_export,
                   needs_checkpoint=True, restores_latest=False),
}


# Modes of TFM's other drivers that are not runs of one experiment here,
# with what to run instead.
ELSEWHERE = {
    "continuous_train_and_eval": (
        "--mode=continuous_train_and_eval is TFM NLP's continuous fine-tuning "
        "(official/nlp/train.py, continuous_finetune_lib): it fine-tunes and "
        "evaluates each new checkpoint of a pretraining run in turn, a "
        "model_dir for each. Run official/nlp/train.py for it, or fine-tune "
        "one checkpoint here: --mode=train_and_eval with "
        "--params_override=task.init_checkpoint=PATH."),
}


def get_mode(name: str) -> Mode:
  """Returns the mode called `name`, or raises `UsageError` listing them."""
  if name in ELSEWHERE:
    raise UsageError(ELSEWHERE[name])
  if name not in MODES:
    raise UsageError(registry.unknown_name_message("mode", str(name),
                                                   list(MODES)))
  return MODES[name]
