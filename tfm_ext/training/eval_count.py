"""How many batches an evaluation read: none is an error, never "accuracy 0".

A validation set that yields no batch (a global batch larger than the set
with `drop_remainder`, an empty file) still ends in `eval_end`, whose
metrics over nothing read 0, and the best-checkpoint exporter, which ranks
that 0. `watch(trainer)` counts the batches each evaluation of any
`official.core.base_trainer.Trainer` reads (`tfm_ext.CustomTrainer` watches
itself) and raises `EmptyEvaluation`, a `RunFailed` (exit 3) naming
`task.validation_data`, before `eval_end` runs: nothing is ranked, no
summary is written, no eval action sees the logs. `tfm_ext.run.continuous_eval`
catches it and records the checkpoint as "empty".

What it counts: Orbit's Python evaluation loop (`trainer.eval_tf_while_loop`
false, TFM's default) passes each step's outputs to `eval_reduce` from
Python, once per batch read; a trainer that overrides `eval_reduce` is still
counted, since the wrapper calls its own. Not `validation_loss.count`:
a task's `validation_step` need not return a loss. With
`eval_tf_while_loop` the loop is one graph that runs `validation_steps`
steps (Orbit refuses -1 there), where a dataset that ends early raises
TensorFlow's `OutOfRangeError`: it cannot read zero batches silently, and
the count is unknown (None).

    evaluate()
      eval_begin()                 count = 0
      loop: eval_step, eval_reduce count += 1 per batch
      eval_end()                   count == 0: EmptyEvaluation, before
                                   anything of eval_end (the exporter) runs
"""

from typing import Optional

import tensorflow as tf

from official.modeling import optimization

from tfm_ext.training import input_files
from tfm_ext.base.errors import RunFailed
from tfm_ext.training import optimizers

_ATTRIBUTE = "_tfm_ext_eval_count"


class EmptyEvaluation(RunFailed):
  """An evaluation read no batch: its metrics would be those of nothing."""


class _Count:
  """The batches the current evaluation has read; None: unknown."""

  def __init__(self):
    self.batches: Optional[int] = None


def watch(trainer) -> None:
  """Counts the batches of each evaluation of `trainer`; see the module.

  Idempotent. Wraps the trainer's own `eval_begin`, `eval_reduce` and
  `eval_end` (subclasses' overrides included), so call it once the trainer
  is built, before its first evaluation.
  """
  if getattr(trainer, _ATTRIBUTE, None) is not None:
    return
  count = _Count()
  begin, reduce, end = trainer.eval_begin, trainer.eval_reduce, trainer.eval_end

  def eval_begin():
    count.batches = 0
    return begin()

  def eval_reduce(state=None, step_outputs=None):
    # Traced into a graph (a while loop with state) it runs once per trace.
    if tf.inside_function() or count.batches is None:
      count.batches = None
    else:
      count.batches += 1
    return reduce(state, step_outputs)

  def eval_end(*args):
    if count.batches == 0 and not _in_one_graph(trainer):
      _undo_eval_begin(trainer)
      raise EmptyEvaluation(empty_message(trainer))
    return end(*args)

  trainer.eval_begin, trainer.eval_reduce = eval_begin, eval_reduce
  trainer.eval_end = eval_end
  setattr(trainer, _ATTRIBUTE, count)


def batches(trainer) -> Optional[int]:
  """The batches `trainer`'s latest evaluation read; None if not known."""
  count = getattr(trainer, _ATTRIBUTE, None)
  return None if count is None else count.batches


def empty_message(trainer) -> str:
  """What `EmptyEvaluation` says: the validation data, why, what to do."""
  data = trainer.config.task.validation_data
  batch = getattr(data, "global_batch_size", None)
  drop = bool(getattr(data, "drop_remainder", False))
  pattern = getattr(data, "input_path", "")
  records = input_files.record_count(data)
  held = ("" if records is None else
          f"; its files hold {records} record{'s' * (records != 1)}")
  if records == 0:
    advice = ("Point task.validation_data.input_path at a validation set "
              "that holds records.")
  elif drop and (records is None or batch is None or records < batch):
    advice = ("With drop_remainder=true a set smaller than one global batch "
              "gives no batch: set task.validation_data.drop_remainder=false"
              + (f" or a global_batch_size of at most {records}"
                 if records else " or lower its global_batch_size")
              + (", or point input_path at a validation set that holds "
                 "records." if records is None else "."))
  else:
    advice = ("Check that task.validation_data.input_path is the validation "
              "set and that the task's pipeline keeps some of its records.")
  return (
      f"The evaluation at step {int(trainer.global_step.numpy())} read no "
      f"batch of task.validation_data.input_path={pattern!r}"
      f"{'' if pattern else ' (the task default)'} "
      f"(global_batch_size={batch}, drop_remainder={str(drop).lower()}"
      f"{held}): its metrics would be those of no example, such as an "
      f"accuracy of 0. {advice}")


def _in_one_graph(trainer) -> bool:
  """Whether the trainer's evaluation loop is one `tf.while_loop`."""
  return bool(getattr(trainer.config.trainer, "eval_tf_while_loop", False))


def _undo_eval_begin(trainer) -> None:
  """Swaps the EMA weights back, as `eval_end` would have."""
  if isinstance(trainer.optimizer, optimization.ExponentialMovingAverage):
    optimizers.swap_ema_weights(trainer.optimizer)
