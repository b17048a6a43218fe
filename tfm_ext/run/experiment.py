"""`run_experiment`: TFM's `train_lib.run_experiment`, run by tfm_ext's driver.

Code written against TFM calls it with TFM's arguments and gets TFM's
return value, and the run gets what `launchers/train.py` gives: the
registered trainer (`trainer.name`, else `CustomTrainer`), TFM's divergence
recovery that fails cleanly, top-k best checkpoints, progress lines and the
records in `model_dir` (`params.yaml`, `run_summary.json`...).

    model, eval_logs = tfm_ext.run_experiment(
        distribution_strategy=strategy, task=task, mode="train_and_eval",
        params=params, model_dir=model_dir)

TFM's own `base_trainer_test` and `train_lib_test` run against it
(`tests/e2e/test_tfm_core_suites.py`).
"""

from typing import Any, List, Mapping, Optional, Tuple

import orbit
import tensorflow as tf
import tf_keras

from official.core import base_task
from official.core import base_trainer
from official.core import config_definitions

from tfm_ext.config import params as params_lib
from tfm_ext.errors import RunFailed
from tfm_ext.run import assembly
from tfm_ext.run import driver
from tfm_ext.run import modes
from tfm_ext.run import preemption
from tfm_ext.training import trainers


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
  eval_logs = {}
  if run_post_eval:
    with distribution_strategy.scope():
      eval_logs = parts.controller.evaluate(
          steps=params.trainer.validation_steps)
  elif mode == "train_and_post_eval":
    eval_logs = summary.eval_metrics
  return parts.trainer.model, eval_logs or {}
