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

The guard is `tfm_ext.actions.guard`; the driver's divergence recovery
`tfm_ext.actions.divergence`; TFM's own actions `tfm_ext.actions.from_tfm`.

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
from typing import Any, Callable, List, Mapping, Optional, Sequence

import tensorflow as tf

from official.core import config_definitions

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


@dataclasses.dataclass(frozen=True)
class RunAction:
  """An action of one run, as a registered one is but for that run only.

      def show(output):
        print("accuracy", output["accuracy"])

      tfm_ext.launch("digits_convnet", model_dir="/tmp/digits",
                     actions=[tfm_ext.RunAction("eval", show)])

  `call` is the action itself; `factory(ActionContext)` builds it for the
  run instead (None: stays out), as a registered factory does. It runs
  on each output of its `phase`, after the registered actions, in the
  order given, guarded as they are (`required` as in `register_action`).
  Its `name` (by default the function's) is the one its failures are
  reported and counted under.

  Raises:
    ValueError: a phase other than "train" or "eval", or not exactly one
      of `call` and `factory`.
  """
  phase: str
  call: Optional[Action] = None
  factory: Optional[Callable[[ActionContext], Optional[Action]]] = None
  name: str = ""
  required: bool = False

  def __post_init__(self):
    if self.phase not in PHASES:
      raise ValueError(f"RunAction(phase={self.phase!r}): phase must be one "
                       f"of {PHASES}.")
    if (self.call is None) == (self.factory is None):
      raise ValueError("RunAction takes exactly one of call= (the action) "
                       "and factory= (a function of the ActionContext).")
    if not self.name:
      given = self.call or self.factory
      object.__setattr__(self, "name", getattr(
          given, "__name__", type(given).__name__))

  def build(self, context: ActionContext) -> Optional[Action]:
    return self.call if self.factory is None else self.factory(context)


def registered(phase: str, context: ActionContext,
               guard: Callable[..., Action],
               per_run: Sequence[RunAction] = ()) -> List[Action]:
  """The actions the registered factories of `phase` give, then those of
  the run's `per_run` actions of `phase`, each guarded (`guard`: the run's
  `tfm_ext.actions.guard.Guard`)."""
  built = [(name, ACTIONS[phase].get(name)(context),
            name in _REQUIRED[phase]) for name in ACTIONS[phase].names()]
  built += [(own.name, own.build(context), own.required)
            for own in per_run if own.phase == phase]
  return [guard(action, phase=phase, name=name, required=required)
          for name, action, required in built if action is not None]
