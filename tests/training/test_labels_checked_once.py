"""The label check is the task's input's: once, whoever builds the input.

The launcher makes a task's `build_inputs` checking (`labels.check_inputs`)
for any trainer; `CustomTrainer` checks the function it is given
(`labels.checking`, through `inputs.threaded_dataset_fn` and
`inputs.host_pipeline`). A function that checks already is not wrapped
again, Orbit still passes it `input_context`, and a training iterator
saved when the check came after the private pool's options restores where
it now comes before them.
"""

import inspect
import types

import tensorflow as tf

from tfm_ext.training import inputs
from tfm_ext.training import labels


class _Task:
  """What `labels` reads of a TFM task: its config's classes, its input."""

  def __init__(self, classes=3):
    self.task_config = types.SimpleNamespace(
        model=types.SimpleNamespace(num_classes=classes))
    self.built = []

  def build_inputs(self, params, input_context=None):
    self.built.append(input_context)
    values = tf.constant(params)
    return tf.data.Dataset.from_tensor_slices(
        (tf.zeros([len(params), 2]), values)).batch(2)


def _map_ops(dataset):
  """How many `map`s the dataset's graph holds (the check is one)."""
  graph = tf.compat.v1.GraphDef.FromString(
      dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  return sum(node.op.startswith(("MapDataset", "ParallelMapDataset"))
             for node in graph.node)


def test_a_checking_task_is_checked_once_by_the_custom_trainers_paths():
  task = _Task()
  labels.check_inputs(task)
  labels.check_inputs(task)  # Again: nothing more.
  checking = task.build_inputs
  assert labels.checking(checking) is checking
  fn = inputs.threaded_dataset_fn(checking, 0, [0, 1, 2, 1])
  assert _map_ops(fn(tf.distribute.InputContext())) == 1
  dataset, _ = inputs.host_pipeline(task, [0, 1, 2, 1],
                                    tf.distribute.get_strategy(), 0)
  assert _map_ops(dataset) == 1


def test_orbit_passes_a_checking_function_its_input_context():
  task = _Task()
  labels.check_inputs(task)
  # Orbit's make_distributed_dataset reads getfullargspec, which follows
  # no __wrapped__.
  assert "input_context" in inspect.getfullargspec(task.build_inputs).args
  context = tf.distribute.InputContext()
  task.build_inputs([0, 1], input_context=context)
  assert task.built == [context]


def test_a_checking_task_fails_a_label_past_its_classes():
  task = _Task(classes=2)
  labels.check_inputs(task)
  iterator = iter(task.build_inputs([0, 1, 1, 5]))
  next(iterator)
  try:
    next(iterator)
  except tf.errors.InvalidArgumentError as e:
    assert "[label value of] [5]" in e.message
  else:
    raise AssertionError("label 5 of 2 classes passed")


def test_an_iterator_saved_with_the_check_after_the_pool_restores_before(
    tmp_path):
  def pipeline():
    return (tf.data.Dataset.range(400).shuffle(50, seed=1)
            .map(lambda x: (tf.cast(x, tf.float32), x % 10)).batch(4))

  before = labels.checked(inputs.with_input_threads(pipeline(), 2), 10)
  now = inputs.with_input_threads(labels.checked(pipeline(), 10), 2)
  saved = iter(before)
  for _ in range(7):
    next(saved)
  path = tf.train.Checkpoint(iterator=saved).write(str(tmp_path / "ckpt"))
  restored = iter(now)
  tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
  expected, got = next(saved), next(restored)
  assert tf.reduce_all(expected[0] == got[0])
  assert tf.reduce_all(expected[1] == got[1])
