"""What a training checkpoint holds of the run besides the model.

A checkpoint of a step where the schedule evaluates is saved before that
evaluation: Orbit's `Controller.train` saves at the end of its loop and
`evaluate` comes after. So the state it holds (early stopping's and the
plateau's counts, `tfm_ext.actions.plateau`) is the state before that
evaluation, unless it was saved after it (a stop asked for, or a signal,
in that evaluation: the save-and-stop action runs after the others).
`RunState`, a module of the checkpoint, says which:

* `evaluated_step`: the step of the last evaluation whose effects the
  state holds (-1: none, or a checkpoint older than this field);
* `train_steps`: the `trainer.train_steps` of the run that saved it
  (-1: not known).

A run resumed at a step where its schedule evaluates runs that evaluation
first unless `evaluated_step` is that step (`pending`): from the
checkpoint's state, which is the state before it, so it comes out as an
uninterrupted run's, killed between the save and the evaluation or not.
No record decides (a record may be older, newer or edited): the checkpoint
restored is the run's state. Orbit's own `train_and_evaluate` counts its
interval from the step it starts at and never evaluates the step it
resumes at; TFM's `run_experiment` inherits that.

    Controller.train(steps=S)   loop; train actions; save ckpt-S
                                (evaluated_step: the evaluation before S)
    Controller.evaluate()       eval_end (best checkpoints); eval actions:
                                early stopping, plateau, `mark`
                                (evaluated_step = S); a stop's save
"""

from typing import Optional

import tensorflow as tf

_ATTRIBUTE = "_tfm_ext_run_state"


class RunState(tf.Module):
  """The run's own variables in its checkpoint; see the module."""

  def __init__(self, *, train_steps: int, global_step: tf.Variable):
    super().__init__(name="run_state")
    self.evaluated_step = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                      name="evaluated_step")
    self.train_steps = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                   name="train_steps")
    self._train_steps = int(train_steps)
    self._global_step = global_step
    # The restored checkpoint's `train_steps` (`restored`); None: unknown.
    self.saved_train_steps: Optional[int] = None

  def restored(self) -> None:
    """Takes note of what the start restored, then holds this run's
    `train_steps` for its own saves. Call it once, after the start's
    restore (and for a run that restored nothing)."""
    saved = int(self.train_steps.numpy())
    self.saved_train_steps = saved if saved >= 0 else None
    self.train_steps.assign(self._train_steps)

  def mark(self, output) -> None:
    """Eval action: the state now holds the evaluation at this step."""
    del output
    self.evaluated_step.assign(int(self._global_step.numpy()))

  def pending(self, step: int) -> bool:
    """Whether the evaluation at `step` (the restored one) is not in the
    state: killed between the save and it, or never run there."""
    return step > 0 and int(self.evaluated_step.numpy()) != step

  @property
  def train_steps_raised(self) -> bool:
    """Whether this run's `train_steps` exceeds the checkpoint's: a run
    that stopped (early stopping) trains on from its step."""
    return (self.saved_train_steps is not None
            and self._train_steps > self.saved_train_steps)


def attach(trainer, state: RunState) -> None:
  """Makes `state` the run state of `trainer` (`of`)."""
  setattr(trainer, _ATTRIBUTE, state)


def of(trainer) -> Optional[RunState]:
  """The run state of `trainer`; None for a run that does not both train
  and evaluate."""
  return getattr(trainer, _ATTRIBUTE, None)
