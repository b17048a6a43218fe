"""Class labels checked in the input, where a task's loss cannot check them.

TFM's image classification one-hot-encodes its labels (`tf.one_hot`, in
its loss and its metrics): a label outside `[0, num_classes)` becomes an
all-zero target, and the run trains on it to exit 0 without a word. A
sparse loss (digits_convnet's) raises on it, but only where its kernel
checks. So each batch of a classification-style input goes through one
check, an op of the input pipeline: a label outside `[0, num_classes)`
raises there, worded as TensorFlow's sparse losses word it, and
`tfm_ext.base.failures` makes it exit 3, naming the data and the
config's `num_classes` (either may be wrong).

Classification-style is read off the task and its data, not a list of
tasks: the task's config has `model.num_classes` (a positive int), and the
input's elements are `(features, labels)` with int32 or int64 labels of
rank 1 (one per example). One-hot or multi-hot labels (rank 2), float labels
(mixup, cutmix) and dicts of labels (detection, segmentation) are left
alone: they carry no class index to check.

The check belongs to the task's input, not to one trainer: every trainer
reads its data through `task.build_inputs` (TFM's own `tfm_base` hands it
to Orbit as the dataset function), so the launcher makes the task's
`build_inputs` checking (`check_inputs`) before any trainer is built, and
`CustomTrainer`, built by a user's own code, checks the function it is
given (`checking`). Either way once: a checking function is not wrapped
again. The check changes no value, so a run whose labels are in range
trains as it would without it (stock TFM's numbers, bit for bit).

What it costs is in benchmarks/RESULTS.md#label-check (the row
benchmarks/label_check.py writes): one max of each batch's labels.
"""

import inspect
from typing import Callable, Optional

import tensorflow as tf

# What the check's assertion says, as `tfm_ext.base.failures` reads it
# (`_CHECKED_LABEL`): the label's value and the classes, each in brackets.
SAYS = ("label value of", "which is outside the valid range of [0,",
        "), checked in the input (tfm_ext.training.labels)")
_UNSIGNED = {tf.int32: tf.uint32, tf.int64: tf.uint64}
# Marks a dataset function whose datasets `checking` checks.
_CHECKS = "tfm_ext_checks_labels"


def num_classes(task) -> Optional[int]:
  """`task.task_config.model.num_classes` if a positive int, else None."""
  model = getattr(getattr(task, "task_config", None), "model", None)
  classes = getattr(model, "num_classes", None)
  return classes if isinstance(classes, int) and classes > 0 else None


def checkable(dataset: tf.data.Dataset) -> bool:
  """Whether `dataset`'s elements are `(features, integer labels of rank 1)`."""
  spec = dataset.element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2
          and isinstance(spec[1], tf.TensorSpec)):
    return False
  labels = spec[1]
  return labels.dtype in _UNSIGNED and labels.shape.rank == 1


def checked(dataset: tf.data.Dataset, classes: Optional[int]
            ) -> tf.data.Dataset:
  """`dataset`, each batch's labels checked to be in `[0, classes)`.

  As it is where `classes` is None or its elements are not checkable.
  A label out of range raises `InvalidArgumentError` from the iterator's
  next batch, naming the largest such label (a negative one before any
  other) and `classes` in the words of `SAYS`.

  Seen as unsigned, a negative label is larger than any class: one max
  checks both ends. The assertion's data are strings and int32, which
  TensorFlow asserts without a `cond`: the fewest ops (each op of a
  dataset function costs microseconds; benchmarks/RESULTS.md#label-check).
  """
  if classes is None or not checkable(dataset):
    return dataset
  unsigned = _UNSIGNED[dataset.element_spec[1].dtype]

  def check(features, labels):
    largest = tf.reduce_max(tf.bitcast(labels, unsigned))
    value = tf.cast(tf.bitcast(largest, labels.dtype), tf.int32)
    ok = tf.debugging.Assert(largest < classes, [
        SAYS[0], value, SAYS[1], tf.constant(classes, tf.int32), SAYS[2]])
    with tf.control_dependencies([ok]):
      return features, tf.identity(labels)

  return dataset.map(check)


def checking(build_inputs: Callable[..., tf.data.Dataset]
             ) -> Callable[..., tf.data.Dataset]:
  """`build_inputs` (a task's bound method), its datasets `checked`.

  As it is where it checks already, or where it is not a task's method or
  the task has no `num_classes`. The function returned has
  `build_inputs`' signature, which Orbit reads (`input_context` is passed
  only to a function that names it).
  """
  if getattr(build_inputs, _CHECKS, False):
    return build_inputs
  classes = num_classes(getattr(build_inputs, "__self__", None))
  if classes is None:
    return build_inputs

  def build(*args, **kwargs):
    return checked(build_inputs(*args, **kwargs), classes)

  build.__signature__ = inspect.signature(build_inputs)
  build.__doc__ = build_inputs.__doc__
  setattr(build, _CHECKS, True)
  return build


def check_inputs(task) -> None:
  """Makes `task.build_inputs` `checking`, for whichever trainer reads it.

  Sets the task's own attribute (its class is untouched); again, it does
  nothing more.
  """
  task.build_inputs = checking(task.build_inputs)
