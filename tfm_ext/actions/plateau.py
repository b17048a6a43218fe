"""Early stopping and a learning rate lowered on a plateau, resumed exactly.

`trainer.early_stopping` and `trainer.reduce_lr_on_plateau` (off unless a
`metric` is given; `tfm_ext.training.trainers.EarlyStoppingConfig`) are eval
actions of a training run that evaluates. Each watches one log of every
evaluation and counts the evaluations in a row that fail to beat the best
by more than `min_delta`:

* early stopping, after `patience` such evaluations, asks the run to stop
  (`Stop.request`): the run saves at that step, writes `run_summary.json`
  with `stopped_early_at` and the reason, marks training complete (an
  evaluator beside it ends there) and exits 0;
* the plateau, after `patience` of them, multiplies a factor on top of the
  optimizer's learning rate, whatever TFM schedule it is (`Scaled`), by
  `factor`; the factor never takes the rate below `min_lr` (the schedule
  alone may), and the count starts again.

Their state (the best value, the count, the factor) is variables in the
training checkpoint, so a run resumed after a preemption continues the
count where it was (Keras' callbacks start again from nothing). A
checkpoint is saved before the evaluation at its step, so the state after
each evaluation is also a record of the model_dir, `plateau.json` (written
whole after every evaluation, with the factor's history): a run resumed
from the checkpoint of an evaluated step takes the record's state for that
step (`resume`). Each change is a console line; the factor's history is in
`run_summary.json`.

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
    """The watched log of `output`, or None (then nothing is counted)."""
    value = (output or {}).get(self.metric)
    if value is None:
      return None
    value = float(orbit.utils.get_value(value))
    return value if math.isfinite(value) else None

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

  def __call__(self, output) -> None:
    value = self.plateau.value(output)
    if value is None or not self.plateau.stalled(value):
      return
    p = self.plateau
    self._stop.request(
        f"early stopping: {p.metric} did not improve on its best, "
        f"{float(p.best.numpy()):.6g}, by more than {p.min_delta:g} in "
        f"{p.patience} evaluation(s) (trainer.early_stopping)")


class Scaled(tf_keras.optimizers.schedules.LearningRateSchedule):
  """A learning rate (a schedule or a number) times a factor variable.

  The factor never takes the rate below `min_lr`; the schedule alone may.
  """

  def __init__(self, base, factor: tf.Variable, min_lr: float):
    super().__init__()
    self.base = base
    self.factor = factor
    self.min_lr = float(min_lr)

  def __call__(self, step):
    base = self.base(step) if callable(self.base) else self.base
    base = tf.cast(base, tf.float32)
    scaled = base * self.factor
    floor = tf.minimum(base, self.min_lr)
    return tf.where(self.factor < 1.0, tf.maximum(scaled, floor), scaled)

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
    # (step, factor) of each reduction in this model_dir (`resume`).
    self.reductions: List[Dict[str, Any]] = []
    for inner in optimizers.named_optimizers(optimizer).values():
      inner.learning_rate = Scaled(inner.learning_rate, self.lr_factor,
                                   config.min_lr)

  def __call__(self, output) -> None:
    value = self.plateau.value(output)
    if value is None or not self.plateau.stalled(value):
      return
    self.plateau.wait.assign(0)
    before = float(self.lr_factor.numpy())
    after = before * float(self._config.factor)
    self.lr_factor.assign(after)
    step = int(self._global_step.numpy())
    self.reductions.append({"step": step, "factor": after})
    p = self.plateau
    message = (f"plateau @ step {step} | {p.metric} did not improve on "
               f"{float(p.best.numpy()):.6g} in {p.patience} evaluation(s): "
               f"learning rate factor {before:.4g} -> {after:.4g} "
               "(trainer.reduce_lr_on_plateau)")
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


def resume(actions, model_dir: str, restored_step: int) -> None:
  """Takes `plateau.json`'s state if it is that of `restored_step`.

  Its factor's history up to that step, in any case. A record that cannot
  be read is warned of: the checkpoint's state stands.
  """
  if not actions or not restored_step:
    return
  path = os.path.join(model_dir, RECORD)
  try:
    record = files.read_object(path, required={"global_step": int})
  except (tf.errors.NotFoundError, FileNotFoundError):
    return
  except (tf.errors.OpError, OSError, ValueError) as e:
    logging.warning("%s cannot be read (%s): early stopping and the plateau "
                    "go on from the checkpoint's count.", path, e)
    return
  at_step = record["global_step"] == restored_step
  for action in actions:
    state = record.get(action.plateau.name)
    if not isinstance(state, dict):
      continue
    if isinstance(action, ReduceLROnPlateau):
      action.reductions = [r for r in state.get("reductions", [])
                           if r.get("step", 0) <= restored_step]
    if at_step:
      action.plateau.best.assign(float(state["best"]))
      action.plateau.wait.assign(int(state["wait"]))
      if isinstance(action, ReduceLROnPlateau):
        action.lr_factor.assign(float(state["lr_factor"]))


def stopped_early(actions) -> bool:
  """Whether early stopping's restored count says the run stopped already."""
  return any(isinstance(action, EarlyStopping) and int(
      action.plateau.wait.numpy()) >= action.plateau.patience
             for action in actions)


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
