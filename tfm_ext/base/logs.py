"""The numbers in Orbit's logs, and the one walk of a nested mapping.

A trainer's and an evaluator's logs are nested mappings (`{"coco": {"AP":
...}}`) of tensors, NumPy values and Python numbers, with now and then a
value that is no number (an image). What the progress lines, the
evaluation ledger, the notifications, `metrics.csv` and the
best-checkpoint manifest record of them is decided here, once:

* `scalar` is the leaf rule: one real number, as a float;
* `leaves` is the walk: every value that is not itself a mapping, under its
  keys joined by a separator ('/' for the console, TFM's '|' for a metric
  name, '.' for a config field);
* `scalar_tree` keeps the numbers with their nesting (the best-checkpoint
  manifest, as TFM's `info.json` holds them), `scalars` flattens them.
"""

from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import numpy as np
import orbit


def scalar(value: Any) -> Optional[float]:
  """`value` as a float if it is one real number, else None.

  A tensor, array or list of one element counts; a bool, a string, a
  complex number or anything larger does not.
  """
  value = np.asarray(orbit.utils.get_value(value))
  if (value.size == 1 and np.issubdtype(value.dtype, np.number)
      and not np.issubdtype(value.dtype, np.complexfloating)):
    return float(value.reshape(()))
  return None


def leaves(tree: Mapping[str, Any], separator: str,
           prefix: str = "") -> Iterator[Tuple[str, Any]]:
  """`(path, value)` of every value in `tree` that is not a mapping.

  A path is the keys down to the value joined by `separator`: `coco/AP`.
  A mapping left empty has no leaves.
  """
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping):
      yield from leaves(value, separator, path + separator)
    else:
      yield path, value


def scalar_tree(logs: Mapping[str, Any]) -> Dict[str, Any]:
  """The numbers of (nested) logs as floats, nesting kept (`scalar`'s rule)."""
  out = {}
  for key, value in logs.items():
    if isinstance(value, Mapping):
      out[key] = scalar_tree(value)
      continue
    number = scalar(value)
    if number is not None:
      out[key] = number
  return out


def scalars(logs: Mapping[str, Any]) -> Dict[str, float]:
  """The numbers of (nested) logs as floats, under keys joined with '/'."""
  return dict(leaves(scalar_tree(logs), "/"))
