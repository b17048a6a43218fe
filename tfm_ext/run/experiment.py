"""The Python API: `launch` (the launcher's job from Python) and TFM's
`run_experiment`, both run by tfm_ext's driver.

`launch` is what `tfm-ext-train` does, from a notebook or a script: the
same config (files, overrides, gin), the same checks before anything is
written, the same records in `model_dir`; it returns the run summary.

    summary = tfm_ext.launch(
        "digits_convnet", model_dir="/tmp/digits", mode="train_and_eval",
        params_override="trainer.train_steps=200")
    summary.eval_metrics["accuracy"], summary.best

A refused run raises `UsageError` (nothing written), one that failed
`RunFailed`, one stopped by a signal (Ctrl-C, the kernel's interrupt: the
checkpoint of the step saved) `Preempted`; the message is the one line the
launcher prints, and its `exit_code` what the launcher would exit with.

`run_experiment` is TFM's `train_lib.run_experiment`:

Code written against TFM calls it with TFM's arguments and gets TFM's
return value, and the run gets what `launchers/train.py` gives: the
registered trainer (`trainer.name`, else `CustomTrainer`), TFM's divergence
recovery that fails cleanly, top-k best checkpoints, progress lines and the
records the run itself writes in `model_dir` (`params.yaml`, checkpoints,
summaries, `best_ckpt/`, `metrics.csv`), the trainer lease held while it
trains. The job's own records stay with the launcher and `launch`:
`run_summary.json` and `logs/`.

    model, eval_logs = tfm_ext.run_experiment(
        distribution_strategy=strategy, task=task, mode="train_and_eval",
        params=params, model_dir=model_dir)

TFM's own `base_trainer_test` and `train_lib_test` run against it
(`tests/e2e/test_tfm_core_suites.py`).
"""

import json
import os
import sys
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from absl import flags as absl_flags
import orbit
import tensorflow as tf
import tf_keras

from official.core import base_task
from official.core import base_trainer
from official.core import config_definitions
from official.core import task_factory

from tfm_ext import actions as actions_lib
from tfm_ext.config import params as params_lib
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import export
from tfm_ext.model_dir import files
from tfm_ext.model_dir.run_summary import RunSummary
from tfm_ext.run import assembly
from tfm_ext.run import driver
from tfm_ext.base import failures
from tfm_ext.run import modes
from tfm_ext.run import preemption
from tfm_ext.training import trainers
from tfm_ext.base.errors import EXIT_PREEMPTED


def run_experiment(
    distribution_strategy: tf.distribute.Strategy,
    task: base_task.Task,
    mode: str,
    params: config_definitions.ExperimentConfig,
    model_dir: str,
    run_post_eval: bool = False,
    save_summary: bool = True,
    train_actions: Optional[List[orbit.Action]] = None,
    eval_actions: Optional[List[orbit.Action]] = None,
    trainer: Optional[base_trainer.Trainer] = None,
    controller_cls=orbit.Controller,
    summary_manager: Optional[orbit.utils.SummaryManager] = None,
    eval_summary_manager: Optional[orbit.utils.SummaryManager] = None,
    enable_async_checkpointing: bool = False,
) -> Tuple[tf_keras.Model, Mapping[str, Any]]:
  """Runs `mode` of the experiment; TFM's arguments and return value.

  Returns `(model, eval_logs)`: the trained model, and the logs of an
  evaluation after the mode when `run_post_eval` or the mode is
  `train_and_post_eval` (else `{}`).

  Raises:
    UsageError: the mode, trainer or config cannot run (what the launcher
      reports with exit 2).
    RunFailed: the run failed on its data (a corrupt record, a loss that
      diverged past `trainer.recovery_max_trials`); a `RuntimeError`, as
      TFM's recovery raises.
    preemption.Preempted: a preemption checkpoint was saved.
  """
  params = params_lib.with_tfm_ext_fields(params)
  name = params.trainer.name if trainer is None else ""
  plan = driver.Plan(
      request=driver.RunRequest(
          experiment=getattr(task, "name", "") or "", mode=mode,
          model_dir=model_dir, params=params,
          enable_async_checkpointing=enable_async_checkpointing),
      mode=modes.get_mode(mode),
      trainer_cls=type(trainer) if trainer else trainers.get_trainer(name),
      strategy=distribution_strategy)
  watcher = preemption.SignalWatcher(signals=())
  with driver.assembled(plan, watcher, assembly.Supplied(
      task=task, trainer=trainer, train_actions=train_actions or (),
      eval_actions=eval_actions or (), controller_cls=controller_cls,
      summary_manager=summary_manager,
      eval_summary_manager=eval_summary_manager, save_summary=save_summary,
      post_eval=run_post_eval)) as parts:
    summary = driver.drive(plan, parts, watcher)
  if summary.status == "failed":
    raise RunFailed(summary.message)
  if summary.status == "preempted":
    raise preemption.Preempted(summary.global_step, "a signal")
  return parts.trainer.model, _post_eval_logs(plan, parts, summary,
                                              run_post_eval)


def _post_eval_logs(plan, parts, summary: RunSummary,
                    run_post_eval: bool) -> Mapping[str, Any]:
  """The logs of the evaluation after the mode, as TFM returns them."""
  if run_post_eval:
    with plan.strategy.scope():
      return parts.controller.evaluate(
          steps=plan.request.params.trainer.validation_steps) or {}
  if plan.request.mode == "train_and_post_eval":
    return summary.eval_metrics or {}
  return {}


def launch(experiment: str, *, model_dir: str, mode: str = "train_and_eval",
           params_override: str = "", config_files: Sequence[str] = (),
           trainer: str = "", gin_files: Sequence[str] = (),
           gin_params: Sequence[str] = (), registry: Sequence[str] = (),
           allow_config_change: bool = False,
           checkpoint_path: str = "",
           actions: Sequence[actions_lib.RunAction] = ()) -> RunSummary:
  """Runs `mode` of `experiment` as `tfm-ext-train` would; see the module.

  The arguments are the launcher's flags of the same names
  (`config_files`: `--config_file`, repeatable; `registry`: modules to
  import for their registrations), and `actions`, this run's own
  (`tfm_ext.RunAction`: after the registered ones, for this run only).

  Returns:
    The run's `RunSummary` (also `model_dir/run_summary.json`).

  Raises:
    UsageError: refused (exit 2 from the launcher).
    RunFailed: failed (its data, storage; `exit_code` 3 or 4).
    preemption.Preempted: stopped by a signal, the checkpoint saved.
  """
  if not absl_flags.FLAGS.is_parsed():
    # A notebook or a script of its own parsed no absl flags: their
    # defaults (the log goes to model_dir/logs/, warnings to the console).
    absl_flags.FLAGS([sys.argv[0] if sys.argv else "tfm_ext"])
  _register_the_default()
  failures.reset()
  wrong = [a for a in actions if not isinstance(a, actions_lib.RunAction)]
  if wrong:
    error = UsageError(
        f"launch(actions=...) takes tfm_ext.RunAction items, as "
        f"tfm_ext.RunAction(\"eval\", function); got {wrong[0]!r:.80}.")
    error.exit_code = UsageError.EXIT_CODE
    raise error
  request = driver.RunRequest(
      experiment=experiment, mode=mode, model_dir=model_dir,
      sources=params_lib.ConfigSources(
          experiment=experiment, config_files=tuple(config_files),
          params_override=params_override, trainer=trainer),
      gin_files=tuple(gin_files), gin_params=tuple(gin_params),
      registry=tuple(registry), allow_config_change=allow_config_change,
      checkpoint_path=checkpoint_path, actions=tuple(actions))
  try:
    plan = driver.plan_for(request)
  except UsageError as e:
    e.exit_code = UsageError.EXIT_CODE
    raise
  try:
    return driver.run(plan)
  except SystemExit as e:  # The job's end, as the launcher would exit.
    raise _error_of(e) from None


def load(model_dir: str, *, checkpoint: str = "",
         experiment: str = "") -> tf_keras.Model:
  """The model a run trained in `model_dir`, with a checkpoint's weights.

      summary = tfm_ext.launch("digits_convnet", model_dir="/tmp/digits")
      model = tfm_ext.load("/tmp/digits")   # its best checkpoint
      model.predict(images)

  The model is built as the run built it, from its `params.yaml` (and the
  experiment `run_summary.json` names, or `experiment`), by its task; the
  weights are read from `checkpoint` (as `--checkpoint_path` takes it: a
  prefix, a directory or a step), else the best checkpoint that reads
  whole, else the latest, as `--mode=export` chooses.

  Raises:
    UsageError: no run or no checkpoint there, or one that does not fit.
  """
  _register_the_default()
  experiment = experiment or _experiment_of(model_dir)
  follow = params_lib.trainer_params(model_dir)
  if not follow:
    raise UsageError(f"{model_dir} holds no params.yaml of a training run "
                     "to build its model from.")
  params = params_lib.build(params_lib.ConfigSources(experiment=experiment),
                            follow=follow)
  path = export.checkpoint_to_export(
      model_dir, params.trainer.best_checkpoint_export_subdir, checkpoint)
  model = task_factory.get_task(params.task).build_model()
  export.restore(path, model=model)
  return model


def _register_the_default() -> None:
  """The embedded default is always registered, as the launcher has it."""
  from tfm_ext.examples import digits_convnet  # pylint: disable=g-import-not-at-top,unused-import


def _experiment_of(model_dir: str) -> str:
  """The experiment the run in `model_dir` says it ran."""
  for name in ("run_summary.json", "eval_summary.json"):
    try:
      return json.loads(files.read_text(os.path.join(model_dir, name)))[
          "experiment"]
    except (OSError, ValueError, KeyError, tf.errors.NotFoundError):
      continue
  raise UsageError(f"{model_dir} has no run_summary.json naming its "
                   "experiment: pass experiment= to tfm_ext.load.")


def _error_of(exit: SystemExit) -> Exception:
  """The exception `launch` raises for the launcher's exit `exit`."""
  code = exit.code if isinstance(exit.code, int) else 1
  reported = failures.last_reported()
  message = reported.message if reported else f"The run ended with exit {code}."
  if code == EXIT_PREEMPTED:
    error = preemption.Preempted(-1, "a signal")
    error.args = (message,)
  elif code == UsageError.EXIT_CODE:
    error = UsageError(message)
  else:
    error = RunFailed(message)
  error.exit_code = code
  return error
