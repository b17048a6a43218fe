"""Actions: what runs around the model after each training loop or evaluation.

Trainer hooks (`CustomTrainer`) are for model logic; actions, Orbit's plain
callables on a loop's or an evaluation's output (`Callable[[Output], None]`),
are for everything around it: progress lines, divergence recovery,
preemption save-and-stop, TFM's own actions (pruning, EMA checkpoints). A
downstream repo adds its own without subclassing anything, by registering a
factory:

    @tfm_ext.register_action("upload_results", phase="eval")
    def upload_results(context: tfm_ext.ActionContext):
      if not context.chief:
        return None  # Stays out of this run.
      return lambda output: upload(context.model_dir, output)

(Progress sent to a URL needs no action of one's own: `--notify_url`,
`tfm_ext.actions.notify`.)

Every factory registered in the process (its module imported, as a
`--registry` or a fork's `registry_imports` does) is called once per run,
after the driver's own actions are built and before anything runs. Its
action runs on each output of its phase (`train`: after each training loop;
`eval`: after each evaluation), in the order of the factories' names, after
divergence recovery and TFM's actions and before the progress line and the
preemption save: what it adds to the output is printed, written to
TensorBoard and kept in the run summary.

An action cannot end a run by accident (`Guarded`). One that raises is
reported once, as one `warning:` line on the console; each of its failures
is logged with its traceback in the log file and counted in
`run_summary.json` (`action_failures`, by `<phase>/<name>`), and the run goes
on. An action registered with `required=True` is one the run cannot go on
without: when it raises, the run saves a checkpoint at the current step
(a training run's chief, without a multi-worker strategy: there a save is
a collective every worker must join) and fails with exit 3, naming the
action:

    @tfm_ext.register_action("upload_metrics", phase="eval", required=True)

Every action is guarded this way: registered ones, TFM's, those passed to
`run_experiment`, the progress line and the notifications
(`tfm_ext.actions.notify`). An action's deliberate outcomes pass through unchanged:
`RunFailed` (exit 3), `UsageError` (exit 2) and `Preempted`. The
driver's own run-ending actions (divergence recovery, the trainer lease's
check, the preemption save) are not guarded: their failures are the run's.

`sys.exit()` in an action is an action failure like any other exception:
reported and counted (a required action's saves and fails the run, exit
3). An action cannot end a run with exit 0 and no summary; a run stops
cleanly at `train_steps`, when an action asks it to (`context.stop(reason)`,
as early stopping does: `tfm_ext.actions.plateau`), or on a signal
(`tfm_ext.run.preemption`). (In a
trainer hook, which is model logic, `sys.exit()` is a bug: exit 1, the run
summary saying so.)
"""

import dataclasses
import math
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional

from absl import logging
import orbit
import tensorflow as tf

from official.core import actions as tfm_actions
from official.core import config_definitions
from official.modeling import optimization

from tfm_ext.base.errors import Preempted
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import Stopped
from tfm_ext.base.errors import UsageError
from tfm_ext.training import optimizers
from tfm_ext.base import registry

PHASES = ("train", "eval")

Output = Optional[Mapping[str, Any]]
Action = Callable[[Output], None]


@dataclasses.dataclass(frozen=True)
class ActionContext:
  """What an action factory may build its action from: the assembled run."""
  params: config_definitions.ExperimentConfig
  mode: str
  model_dir: str
  trainer: Any  # A `base_trainer.Trainer`.
  checkpoint_manager: Optional[tf.train.CheckpointManager]
  strategy: tf.distribute.Strategy
  # Whether this process writes into model_dir (the chief of its cluster).
  chief: bool
  # `stop(reason)`: asks a training run to stop after the loop or
  # evaluation in flight: it saves, writes its summary with the reason and
  # exits 0 (`tfm_ext.actions.plateau`). Elsewhere (an evaluator) a no-op.
  stop: Callable[[str], None] = lambda reason: None


ACTIONS = {phase: registry.Registry(f"{phase} action") for phase in PHASES}
# The names registered with `required=True`, by phase.
_REQUIRED = {phase: set() for phase in PHASES}


def register_action(name: str, *, phase: str, required: bool = False):
  """Decorator: registers `factory(ActionContext) -> action or None`.

  With `required=True`, an action that raises fails the run (a checkpoint
  saved first, exit 3) instead of being reported while the run goes on;
  see the module docstring.

  Raises `ValueError` for a phase other than "train" or "eval", and
  `RegistryError` for a name already registered in that phase.
  """
  if phase not in PHASES:
    raise ValueError(f"register_action({name!r}, phase={phase!r}): phase "
                     f"must be one of {PHASES}.")
  register = ACTIONS[phase].register(name)

  def decorator(factory):
    register(factory)
    if required:
      _REQUIRED[phase].add(name)
    return factory

  return decorator


def registered(phase: str, context: ActionContext,
               guard: "Guard") -> List[Action]:
  """The actions the registered factories of `phase` give, each guarded."""
  built = ((name, ACTIONS[phase].get(name)(context))
           for name in ACTIONS[phase].names())
  return [guard(action, phase=phase, name=name,
                required=name in _REQUIRED[phase])
          for name, action in built if action is not None]


# What an action raises on purpose: the run's own ending, passed through.
OUTCOMES = (RunFailed, UsageError, Preempted, Stopped)


def name_of(action: Action) -> str:
  """A name for an action that was not registered: its function or class."""
  name = getattr(action, "__name__", None)
  return name if isinstance(name, str) else type(action).__name__


class Guard:
  """Wraps a run's actions so that one that raises cannot end it by accident.

  One `Guard` serves a run: `failures` (`<phase>/<name>` -> count) is what
  the run summary reports. `save` saves a checkpoint at the current step
  and returns its path, or is None where this process must not save (an
  evaluator, a non-chief or multi-worker job).
  """

  def __init__(self, *, global_step: Callable[[], int],
               save: Optional[Callable[[], str]] = None):
    self._global_step = global_step
    self._save = save
    self.failures: Dict[str, int] = {}

  def __call__(self, action: Action, *, phase: str, name: str = "",
               required: bool = False) -> Action:
    """`action`, guarded; see `Guarded`."""
    return Guarded(action, key=f"{phase}/{name or name_of(action)}",
                   guard=self, required=required)

  def all(self, phase: str, actions: List[Action]) -> List[Action]:
    """Each of `actions` guarded as optional (`Guarded`), named by its type."""
    return [action if isinstance(action, Guarded) else self(action,
                                                            phase=phase)
            for action in actions]

  def failed(self, key: str, error: BaseException, required: bool) -> None:
    """Counts and reports `error` of action `key`; raises if `required`."""
    count = self.failures[key] = self.failures.get(key, 0) + 1
    step = self._global_step()
    said = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    phase, name = key.split("/", 1)
    # INFO: the log file's, not the console's (`log_files.log_to_files`).
    logging.info("The %s action %r failed (%d so far) at step %d.", phase,
                 name, count, step, exc_info=(type(error), error,
                                              error.__traceback__))
    if required:
      saved = self._save() if self._save else ""
      raise RunFailed(
          f"The required {phase} action {name!r} failed at step {step}: "
          f"{said}." + (f" Saved {saved}." if saved else "") +
          f" Fix the action (or register it without required=True) and "
          "relaunch to resume.") from error
    if count == 1:
      print(f"warning: the {phase} action {name!r} failed at step {step}: "
            f"{said}. The run goes on; each failure is counted in the run "
            "summary (action_failures) and logged with its traceback in the "
            "log file.", file=sys.stderr, flush=True)


class Guarded:
  """An action whose exceptions its `Guard` counts and reports.

  Exceptions of `OUTCOMES` and a `KeyboardInterrupt` (a second signal)
  pass through unchanged; `SystemExit` (an action's `sys.exit()`) is a
  failure of the action, as any `Exception`.
  """

  def __init__(self, action: Action, *, key: str, guard: Guard,
               required: bool = False):
    self.action = action
    self.key = key
    self.required = required
    self._guard = guard

  def __call__(self, output: Output) -> None:
    try:
      self.action(output)
    except OUTCOMES:
      raise
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
      self._guard.failed(self.key, e, self.required)


def save_now(manager: tf.train.CheckpointManager,
             global_step: tf.Variable) -> str:
  """Saves a checkpoint at the current step, unless the latest is at it.

  Returns the path of the checkpoint at that step.
  """
  step = int(global_step.numpy())
  if not (manager.latest_checkpoint or "").endswith(f"-{step}"):
    manager.save(checkpoint_number=step, check_interval=False)
  manager.sync()
  return manager.latest_checkpoint


class EMACheckpointing(tfm_actions.EMACheckpointing):
  """TFM's action that saves the averaged weights, with any strategy.

  TFM's swaps the weights with `swap_weights`, which needs a strategy's
  cross-replica context; this one swaps with `optimizers.swap_ema_weights`,
  so EMA also works without a strategy.
  """

  def __call__(self, output: Output) -> None:
    del output
    optimizers.swap_ema_weights(self._optimizer)
    self._checkpoint_manager.save(checkpoint_number=self._optimizer.iterations)
    optimizers.swap_ema_weights(self._optimizer)


def tfm_eval_actions(params: config_definitions.ExperimentConfig, trainer,
                     model_dir: str) -> List[Action]:
  """TFM's eval actions (`official.core.actions.get_eval_actions`).

  That is the EMA checkpointing of an averaging optimizer, here the one
  that works without a strategy (`EMACheckpointing`).
  """
  if not isinstance(trainer.optimizer, optimization.ExponentialMovingAverage):
    return []
  return [EMACheckpointing(export_dir=model_dir, optimizer=trainer.optimizer,
                           checkpoint=trainer.checkpoint,
                           max_to_keep=params.trainer.max_to_keep)]


def tfm_train_actions(params: config_definitions.ExperimentConfig, trainer,
                      model_dir: str, checkpoint_manager) -> List[Action]:
  """TFM's train actions (`official.core.actions.get_train_actions`).

  That is pruning and on-demand preemption checkpoints where configured,
  without TFM's divergence recovery: `DivergenceRecovery` replaces it.
  """
  return [action for action in tfm_actions.get_train_actions(
      params, trainer, model_dir, checkpoint_manager=checkpoint_manager)
          if not (isinstance(action, orbit.actions.ConditionalAction) and
                  isinstance(action.condition, tfm_actions.RecoveryCondition))]


class DivergenceRecovery:
  """TFM's divergence recovery, with a run that fails cleanly when it ends.

  After each training loop it reads the loop's mean training loss (no op in
  the step: benchmarks/RESULTS.md#default-nan-check). A loop diverged if
  that loss is NaN or infinite, or above `trainer.loss_upper_bound` once the
  global step reaches `trainer.recovery_begin_steps`: TFM's
  `RecoveryCondition`. Each divergence uses one of
  `trainer.recovery_max_trials`: the latest checkpoint is restored (weights,
  optimizer, step and, where saved, the input position) and training goes
  on. Once the trials are used up, or with no checkpoint to go back to, the
  run fails with `RunFailed` naming the loop's steps. It runs before the
  loop's checkpoint is saved, so the last checkpoint stays the last good one.

  Beyond TFM: the first loop of a process, a single step
  (`assembly.FirstStepThenEvery`), is held only to finiteness, since one
  step's loss is not a loop's mean; and a divergence with nothing to restore
  fails instead of training on from the diverged weights.
  `recovery_max_trials < 0` turns the check off, as in TFM.
  """

  def __init__(self, *, loss_name: str, global_step: tf.Variable,
               start_step: int, input_in_checkpoint: bool,
               checkpoint_manager: Optional[tf.train.CheckpointManager] = None,
               max_trials: int = 0, loss_upper_bound: float = math.inf,
               begin_steps: int = 0):
    self._loss_name = loss_name
    self._global_step = global_step
    self._loop_start = start_step  # The step the next loop starts after.
    self._input_in_checkpoint = input_in_checkpoint
    self._manager = checkpoint_manager
    self._max_trials = max_trials
    self._bound = loss_upper_bound
    self._begin_steps = begin_steps
    self._first_loop = True
    self.trials = 0  # Divergences so far in this process.

  @classmethod
  def from_config(cls, trainer_config, **kwargs) -> "DivergenceRecovery":
    """Built from `trainer.recovery_*` and `trainer.loss_upper_bound`."""
    return cls(max_trials=trainer_config.recovery_max_trials,
               loss_upper_bound=trainer_config.loss_upper_bound,
               begin_steps=trainer_config.recovery_begin_steps, **kwargs)

  def __call__(self, output: Output) -> None:
    first, last = self._loop_start + 1, int(self._global_step.numpy())
    self._loop_start = last
    first_loop, self._first_loop = self._first_loop, False
    loss = (output or {}).get(self._loss_name)
    if loss is None:
      return
    loss = float(orbit.utils.get_value(loss))
    if math.isfinite(loss):
      if first_loop or last < self._begin_steps or loss <= self._bound:
        return
      problem = (f"The training loss, {loss:.4g}, is above "
                 f"trainer.loss_upper_bound={self._bound:g}")
    else:
      problem = "The training loss is not finite (NaN or inf)"
    problem += (f" at step {last}." if first >= last else
                f" in steps {first}-{last} (one loop).")
    self.trials += 1
    latest = self._manager.latest_checkpoint if self._manager else None
    if self.trials > self._max_trials or latest is None:
      raise RunFailed(self._failure(problem, first, last, latest))
    self._manager.restore_or_initialize()
    self._loop_start = int(self._global_step.numpy())
    message = (f"recovery {self.trials}/{self._max_trials}: {problem} "
               f"Restored {latest} (step {self._loop_start}) and training on.")
    logging.warning(message)
    print(message, flush=True)

  def _failure(self, problem: str, first: int, last: int,
               latest: Optional[str]) -> str:
    if self._max_trials > 0:
      problem += (f" It diverged {self.trials} times; "
                  f"trainer.recovery_max_trials={self._max_trials}.")
      if latest is None:
        problem += " There is no checkpoint yet to recover from."
    if first >= last:
      return problem
    same_batches = ("a resumed run reads the same batches" if
                    self._input_in_checkpoint else "this run's input "
                    "position is not in its checkpoints, so a resumed run may "
                    "read other batches")
    return (f"{problem} To find the step, resume from the last checkpoint "
            f"with --params_override=trainer.steps_per_loop=1 "
            f"({same_batches}).")
