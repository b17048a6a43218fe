"""Early stopping and a learning rate lowered on a plateau, resumed exactly.

`trainer.early_stopping` and `trainer.reduce_lr_on_plateau` (off unless a
`metric` is given; `tfm_ext.training.trainers.EarlyStoppingConfig`) are eval
actions of a training run that evaluates. Each watches one log of every
evaluation (a nested one by TFM's `|`: `coco|AP`) and counts the
evaluations in a row that fail to beat the best by more than `min_delta`:

* early stopping, after `patience` such evaluations, asks the run to stop
  (`Stop.request`): the run saves at that step, writes `run_summary.json`
  with `stopped_early_at` and the reason, marks training complete (an
  evaluator beside it ends there) and exits 0;
* the plateau, after `patience` of them, multiplies a factor on top of the
  optimizer's learning rate, whatever TFM schedule it is (`Scaled`), by
  `factor`; the factor never takes the rate below `min_lr` (the schedule
  alone may), and the count starts again. A reduction that `min_lr` cuts
  short says so; one that would not lower the rate at all is not made.

Their state (the best value, the count, the factor) is variables in the
training checkpoint, and only the checkpoint decides it: a run resumed
after a preemption continues the count where it was (Keras' callbacks
start again from nothing). A checkpoint is saved before the evaluation at
its step, so a run resumed from it runs that evaluation first
(`tfm_ext.training.run_state`), from the checkpoint's state. The record
`plateau.json` (written whole after every evaluation, with the factor's
history) only reports it: a record that cannot be read, or that disagrees
with the checkpoint of the step it names, is warned of and ignored
(`check_record`). Each change is a console line; the factor's history is
in `run_summary.json`.

A stopped run relaunched trains nothing; with a larger `patience` (the
checkpoint's count no longer reaches it) or a larger `trainer.train_steps`
than the checkpoint was saved with (`RunState.train_steps_raised`: early
stopping's stop at the step it resumes at is not asked again) it trains
on.

An action of one's own can ask the run to stop too, with the context it
was built from: `context.stop("reason")`. The run stops after the loop or
evaluation in flight, as above.
"""
import math
import os
from typing import Any, Dict, List, Optional

from absl import logging
import orbit
import tensorflow as tf
import tf_keras

from tfm_ext.base import logs
from tfm_ext.model_dir import files
from tfm_ext.training import optimizers


def mode_of(metric: str, mode: str) -> str:
  """"min" or "max"; "auto" is "min" for a loss or an error, else "max"."""
  if mode != "auto":
    return mode
  return "min" if any(word in metric.lower() for word in ("loss", "error")) \
      else "max"


class Stop:
  """A run's request to stop cleanly: who asked, and why.

  The run's save-and-stop action (`tfm_ext.run.preemption`) reads it after
  every loop and evaluation; a signal, if one came too, wins.
  """

  def __init__(self):
    self.reason: Optional[str] = None

  def request(self, reason: str) -> None:
    if self.reason is None:
      self.reason = str(reason)
      logging.info("Stop requested: %s", self.reason)


class Plateau(tf.Module):
  """The evaluations in a row that did not beat the best (in the checkpoint)."""

  def __init__(self, config, name: str):
    super().__init__(name=name)
    self.metric = config.metric
    self.mode = mode_of(config.metric, config.mode)
    self.min_delta = abs(float(config.min_delta))
    self.patience = int(config.patience)
    worst = math.inf if self.mode == "min" else -math.inf
    self.best = tf.Variable(worst, dtype=tf.float64, trainable=False,
                            name="best")
    self.wait = tf.Variable(0, dtype=tf.int64, trainable=False, name="wait")

  def value(self, output) -> Optional[float]:
    """The watched log of `output`, or None (then nothing is counted).

    A nested log by its keys joined with `|`, as TFM's best-checkpoint
    exporter reads `best_checkpoint_eval_metric`.
    """
    value = dict(logs.leaves(output or {}, "|")).get(self.metric)
    if value is None:
      return None
    value = logs.scalar(value)
    return value if value is not None and math.isfinite(value) else None

  def stalled(self, value: float) -> bool:
    """Counts `value`; True once `patience` evaluations in a row stalled."""
    best = float(self.best.numpy())
    better = (value < best - self.min_delta if self.mode == "min"
              else value > best + self.min_delta)
    if better:
      self.best.assign(value)
      self.wait.assign(0)
      return False
    self.wait.assign_add(1)
    return int(self.wait.numpy()) >= self.patience


class EarlyStopping:
  """Eval action: asks the run to stop once the metric stalls; see above."""

  def __init__(self, config, stop: Stop, global_step: tf.Variable):
    self.plateau = Plateau(config, name="early_stopping")
    self._stop = stop
    self._global_step = global_step
    # A stop at this step or before is not asked again: a stopped run
    # relaunched with a larger train_steps trains on (`assembly`).
    self.trains_on_from = -1

  def __call__(self, output) -> None:
    value = self.plateau.value(output)
    if value is None or not self.plateau.stalled(value):
      return
    if int(self._global_step.numpy()) <= self.trains_on_from:
      return
    p = self.plateau
    self._stop.request(
        f"early stopping: {p.metric} did not improve on its best, "
        f"{float(p.best.numpy()):.6g}, by more than {p.min_delta:g} in "
        f"{p.patience} evaluation(s) {_EARLY_STOPPING}")


_EARLY_STOPPING = "(trainer.early_stopping)"


def asked_by_early_stopping(reason: Optional[str]) -> bool:
  """Whether a stop's recorded `reason` is early stopping's: its stop is
  decided by the checkpoint's count, not by a record."""
  return bool(reason) and reason.endswith(_EARLY_STOPPING)


class Scaled(tf_keras.optimizers.schedules.LearningRateSchedule):
  """A learning rate (a schedule or a number) times a factor variable.

  The factor never takes the rate below `min_lr`; the schedule alone may.
  """

  def __init__(self, base, factor: tf.Variable, min_lr: float):
    super().__init__()
    self.base = base
    self.factor = factor
    self.min_lr = float(min_lr)

  def __call__(self, step, factor=None):
    """The rate at `step`; with `factor`, the rate that factor would give."""
    base = self.base(step) if callable(self.base) else self.base
    base = tf.cast(base, tf.float32)
    factor = self.factor if factor is None else tf.cast(factor, tf.float32)
    scaled = base * factor
    floor = tf.minimum(base, self.min_lr)
    return tf.where(factor < 1.0, tf.maximum(scaled, floor), scaled)

  def get_config(self) -> Dict[str, Any]:
    return {"min_lr": self.min_lr}


class ReduceLROnPlateau:
  """Eval action: lowers the learning rate's factor on a plateau; see above."""

  def __init__(self, config, optimizer, global_step: tf.Variable):
    self.plateau = Plateau(config, name="reduce_lr_on_plateau")
    self.lr_factor = tf.Variable(1.0, dtype=tf.float32, trainable=False,
                                 name="lr_factor")
    self._config = config
    self._global_step = global_step
    # (step, factor) of each reduction in this model_dir (`check_record`).
    self.reductions: List[Dict[str, Any]] = []
    self._scaled = []
    for inner in optimizers.named_optimizers(optimizer).values():
      inner.learning_rate = Scaled(inner.learning_rate, self.lr_factor,
                                   config.min_lr)
      self._scaled.append(inner.learning_rate)

  def __call__(self, output) -> None:
    value = self.plateau.value(output)
    if value is None or not self.plateau.stalled(value):
      return
    self.plateau.wait.assign(0)
    before = float(self.lr_factor.numpy())
    after = before * float(self._config.factor)
    step = int(self._global_step.numpy())
    rate = self._scaled[0] if self._scaled else None
    old, new = ((float(rate(step)), float(rate(step, after))) if rate
                else (before, after))
    p = self.plateau
    head = (f"plateau @ step {step} | {p.metric} did not improve on "
            f"{float(p.best.numpy()):.6g} in {p.patience} evaluation(s): ")
    if new >= old:  # Held at min_lr already: nothing would change.
      _say(f"{head}learning rate {old:.4g} already at min_lr="
           f"{self._config.min_lr:g}: not lowered, factor stays {before:.4g} "
           "(trainer.reduce_lr_on_plateau)")
      return
    self.lr_factor.assign(after)
    self.reductions.append({"step": step, "factor": after})
    held = (f", held at min_lr={self._config.min_lr:g}"
            if not math.isclose(new, old * float(self._config.factor),
                                rel_tol=1e-4) else "")
    _say(f"{head}learning rate {old:.4g} -> {new:.4g}{held} (factor "
         f"{before:.4g} -> {after:.4g}) (trainer.reduce_lr_on_plateau)")


def _say(message: str) -> None:
  logging.info(message)
  print(message, flush=True)


def state(actions) -> Dict[str, tf.Module]:
  """What the checkpoint keeps of `actions`, by name."""
  kept = {}
  for action in actions:
    if isinstance(action, EarlyStopping):
      kept["early_stopping"] = action.plateau
    elif isinstance(action, ReduceLROnPlateau):
      module = action.plateau
      module.lr_factor = action.lr_factor
      kept["reduce_lr_on_plateau"] = module
  return kept


RECORD = "plateau.json"


class Recorder:
  """Eval action after the others: writes their state as of this step."""

  def __init__(self, actions, model_dir: str, global_step: tf.Variable):
    self._actions = list(actions)
    self._path = os.path.join(model_dir, RECORD)
    self._global_step = global_step

  def __call__(self, output) -> None:
    del output
    record = {"global_step": int(self._global_step.numpy())}
    for action in self._actions:
      p = action.plateau
      state = {"best": float(p.best.numpy()), "wait": int(p.wait.numpy())}
      if isinstance(action, ReduceLROnPlateau):
        state.update(lr_factor=float(action.lr_factor.numpy()),
                     reductions=action.reductions)
      record[p.name] = state
    files.write_json(self._path, record)


def check_record(actions, model_dir: str, evaluated_step: int) -> None:
  """Reads `plateau.json` to report, never to decide; see the module.

  The checkpoint restored holds the state of the evaluation at
  `evaluated_step` (`tfm_ext.training.run_state`). A record of that step
  must say the same: one that says otherwise, or cannot be read, is
  warned of (one line) and ignored. A record of another step (the
  checkpoint's state is from before the evaluation at its step, or the
  run went back to an older checkpoint) cannot be compared: the next
  evaluation rewrites it. The factor's history up to `evaluated_step` is
  taken from a record that reads and does not disagree, for the run
  summary.
  """
  if not actions or evaluated_step < 0:
    return
  path = os.path.join(model_dir, RECORD)
  try:
    record = files.read_object(path, required={"global_step": int})
    recorded = _record_state(record, actions)
    disagree = [name for name in recorded
                if record["global_step"] == evaluated_step
                and not _agrees(record[name], _state_of(name, actions))]
  except (tf.errors.NotFoundError, FileNotFoundError):
    return
  except (tf.errors.OpError, OSError, ValueError, TypeError, KeyError) as e:
    _warn_ignored(path, f"it cannot be read ({_reason(e)})")
    return
  if disagree:
    _warn_ignored(path, f"its {', '.join(disagree)} state at step "
                  f"{evaluated_step} is not the checkpoint's")
    return
  for action in actions:
    if isinstance(action, ReduceLROnPlateau) and action.plateau.name in recorded:
      history = record[action.plateau.name].get("reductions")
      action.reductions = [
          r for r in (history if isinstance(history, list) else [])
          if isinstance(r, dict) and isinstance(r.get("step"), int)
          and r["step"] <= evaluated_step]


def _record_state(record, actions) -> List[str]:
  """The names of `actions` whose state `record` holds (a dict each)."""
  names = [action.plateau.name for action in actions]
  for name in names:
    if name in record and not isinstance(record[name], dict):
      raise ValueError(f"{name} is not an object")
  return [name for name in names if name in record]


def _state_of(name: str, actions) -> Dict[str, float]:
  """The checkpoint's state of the action called `name`, as numbers."""
  for action in actions:
    p = action.plateau
    if p.name == name:
      state = {"best": float(p.best.numpy()), "wait": float(p.wait.numpy())}
      if isinstance(action, ReduceLROnPlateau):
        state["lr_factor"] = float(action.lr_factor.numpy())
      return state
  raise KeyError(name)


def _agrees(recorded: Dict[str, Any], state: Dict[str, float]) -> bool:
  """Whether `recorded` says what `state` holds (`float` of a value that is
  no number raises: a record that cannot be read)."""
  for key, value in state.items():
    mine = float(recorded[key])
    if not (mine == value or math.isclose(mine, value, rel_tol=1e-6)):
      return False
  return True


def _warn_ignored(path: str, why: str) -> None:
  logging.warning("%s: %s; ignored: early stopping and the plateau go on "
                  "from the checkpoint's state.", path, why)


def _reason(error: Exception) -> str:
  return str(error).splitlines()[0] if str(error) else type(error).__name__


def stopped_early(actions) -> bool:
  """Whether early stopping's restored count says the run stopped already
  (a count at or over a larger `patience` does not)."""
  return any(isinstance(action, EarlyStopping) and int(
      action.plateau.wait.numpy()) >= action.plateau.patience
             for action in actions)


def train_on_from(actions, step: int) -> None:
  """Early stopping asks no stop at `step` or before: a stopped run
  relaunched with a larger `trainer.train_steps` trains on from it."""
  for action in actions:
    if isinstance(action, EarlyStopping):
      action.trains_on_from = step


def summary_fields(actions) -> Dict[str, Any]:
  """What `run_summary.json` keeps of the plateau: its factor, this run's
  reductions (the driver adds earlier runs')."""
  for action in actions:
    if isinstance(action, ReduceLROnPlateau):
      return {"lr_factor": float(action.lr_factor.numpy()),
              "lr_reductions": list(action.reductions)}
  return {}


def join_checkpoint(trainer, items: Dict[str, tf.Module]) -> None:
  """Adds `items` to `trainer`'s checkpoint, under these names."""
  if not items:
    return
  if hasattr(trainer, "add_to_checkpoint"):  # `CustomTrainer`'s.
    trainer.add_to_checkpoint(**items)
  else:  # TFM's `Trainer`: its `tf.train.Checkpoint` tracks attributes.
    for name, item in items.items():
      setattr(trainer.checkpoint, name, item)


def build(trainer_config, trainer, stop: Stop) -> List[Any]:
  """The actions `trainer_config` turns on, for a training run's trainer.

  Wraps the optimizer's learning rate for a plateau; call it before the
  first step is traced and before the checkpoint is restored (the actions'
  `state` joins the checkpoint).
  """
  built = []
  early = getattr(trainer_config, "early_stopping", None)
  if early is not None and early.metric:
    built.append(EarlyStopping(early, stop, trainer.global_step))
  plateau = getattr(trainer_config, "reduce_lr_on_plateau", None)
  if plateau is not None and plateau.metric:
    built.append(ReduceLROnPlateau(plateau, trainer.optimizer,
                                   trainer.global_step))
  return built
