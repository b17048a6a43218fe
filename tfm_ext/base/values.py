"""Type checks where `true` is no number, for configs and records alike.

Python's bool is an int (`isinstance(True, int)`), so a YAML or JSON `true`
would pass for a step, a count or a rate. Every type check that wants a
number (`_config_types`, `_files`' records, the best-checkpoint manifest,
`checks`, summaries) asks `is_a`.
"""

from typing import Tuple, Type, Union


def is_a(value, kinds: Union[Type, Tuple[Type, ...]]) -> bool:
  """`isinstance(value, kinds)`, but a bool is only a `bool` or an `object`."""
  if isinstance(value, bool):
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return bool in kinds or object in kinds
  return isinstance(value, kinds)
