"""`ScalarSummaryManager`: Orbit's `SummaryManager`, one op per directory.

Orbit writes every loop's (and every evaluation's) outputs through its
`SummaryManager` with `tf.summary.scalar`: per value a name scope, a
metadata proto, a read of the global step, an eager op and a writer flush,
on the host while the device waits
(benchmarks/RESULTS.md#default-summary-manager). This manager writes the
same events (tag, step, float32 tensor, the scalar plugin's metadata), all
the numeric scalars of one directory as one `Summary` proto in one op, with
the step read once.
"""

import collections
import numbers
import os
from typing import Any, Dict, Mapping

import numpy as np
import orbit
import tensorflow as tf

from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto import tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2
from tensorboard.compat.proto import types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tfm_ext.base import values

# The names TFM's tasks and `ImageScalarSummaryManager` give images.
IMAGE_PREFIX = "image/"
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(
    display_name=None, description=None)


class ScalarSummaryManager(orbit.utils.SummaryManager):
  """Writes numeric scalars in one op per directory; anything else as Orbit.

  A drop-in `orbit.utils.SummaryManager`: same directories, nesting (a dict
  value is a subdirectory), `summary_fn` for values that are not real
  numeric scalars, and `tf.summary.record_if` is honoured.
  """

  def __init__(self, *args, max_images: int = 20, **kwargs):
    super().__init__(*args, **kwargs)
    self._max_images = max_images

  def write_summaries(self, summary_dict: Mapping[str, Any]) -> None:
    if not self._enabled:
      return
    scalars = collections.defaultdict(list)
    others = collections.defaultdict(dict)
    _sort_leaves(summary_dict, "", scalars, others)
    step = None
    # `tf.summary.scalar` prefixes tags with the enclosing name scope.
    scope = tf.get_current_name_scope()
    scope = scope + "/" if scope else ""
    for relative_path, tagged in scalars.items():
      if step is None:
        step = int(self._global_step.numpy())
      proto = summary_pb2.Summary(value=[
          summary_pb2.Summary.Value(tag=scope + name,
                                    tensor=_float_tensor(value),
                                    metadata=_SCALAR_METADATA)
          for name, value in tagged])
      with self.summary_writer(relative_path).as_default():
        tf.summary.experimental.write_raw_pb(proto.SerializeToString(),
                                             step=step)
    for relative_path, tagged in others.items():
      with self.summary_writer(relative_path).as_default():
        for name, value in tagged.items():
          self._write_other(name, value)

  def _write_other(self, name: str, value: Any) -> None:
    """An image, a histogram for another tensor, else `summary_fn`'s."""
    step = self._global_step
    if name.startswith(IMAGE_PREFIX):
      tf.summary.image(name, value, step, max_outputs=self._max_images)
    elif tf.is_tensor(value) or isinstance(value, np.ndarray):
      if tf.rank(value) == 0:
        self._summary_fn(name, value, step=step)
      else:
        tf.summary.histogram(name, value, step)
    else:
      self._summary_fn(name, value, step=step)


def _sort_leaves(summary_dict: Mapping[str, Any], relative_path: str,
                 scalars: Dict[str, list], others: Dict[str, dict]) -> None:
  """Splits leaves into numeric scalars and others, by directory."""
  for name, value in summary_dict.items():
    if isinstance(value, dict):
      _sort_leaves(value, os.path.join(relative_path, name), scalars, others)
    elif _is_real_scalar(value):
      scalars[relative_path].append((name, value))
    else:
      others[relative_path][name] = value


def _is_real_scalar(value: Any) -> bool:
  if values.is_a(value, numbers.Real):  # Python and NumPy scalars.
    return True
  return (isinstance(value, np.ndarray) and value.ndim == 0
          and np.issubdtype(value.dtype, np.number)
          and not np.issubdtype(value.dtype, np.complexfloating))


def _float_tensor(value) -> tensor_pb2.TensorProto:
  """`value` as `tf.summary.scalar` stores it: a float32 scalar tensor."""
  return tensor_pb2.TensorProto(
      dtype=types_pb2.DT_FLOAT, tensor_shape=tensor_shape_pb2.TensorShapeProto(),
      float_val=[float(np.float32(value))])
