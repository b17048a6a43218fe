"""The guard around a run's actions: one that raises cannot end the run.

An action that raises is reported once, as one `warning:` line on the
console; each of its failures is logged with its traceback in the log file
and counted (`Guard.failures`, the run summary's `action_failures`), and
the run goes on. A required action's failure saves a checkpoint at the
current step, where this process may save, and fails the run (exit 3).
An action's deliberate outcomes (`OUTCOMES`) pass through unchanged.
"""

import sys
from typing import Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

from tfm_ext.base.errors import Preempted
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import Stopped
from tfm_ext.base.errors import UsageError

from tfm_ext.actions import Action
from tfm_ext.actions import Output

# What an action raises on purpose: the run ends as it says.
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
          " Fix the action (or register it without required=True) and "
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
