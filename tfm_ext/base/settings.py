"""The environment variables tfm_ext reads: parsed once, refused in the boundary.

Timings a test or an operator sets from the environment are read where the
module that uses them is imported, before any run, its checks or its error
boundary exist: a malformed value raised there, a traceback at import. So
each is read through `seconds`, which keeps the default for a value it
cannot take and records why; the launcher's start and `driver.prepare`
call `check`, which refuses the first such value as a `UsageError`
(exit 2, one line naming the variable, the value and what is accepted),
before anything is written.
"""

import math
import os
from typing import Dict

from tfm_ext.base.errors import UsageError

_refused: Dict[str, str] = {}


def seconds(name: str, default: float, *, zero: bool = False) -> float:
  """`name`'s value as a number of seconds, else `default`.

  Positive and finite (`zero`: or 0). A value it cannot take leaves
  `default` in force and is refused by `check`.
  """
  raw = os.environ.get(name)
  if raw is None or not raw.strip():
    return default
  try:
    value = float(raw)
  except ValueError:
    value = math.nan
  if math.isfinite(value) and (value > 0 or (zero and value == 0)):
    return value
  _refused[name] = (f"{name}={raw!r} (in the environment): give a number of "
                    f"seconds, {'0 or more' if zero else 'more than 0'}, or "
                    "unset it for its default")
  return default


def check() -> None:
  """Refuses the first environment value `seconds` could not take.

  Raises:
    UsageError: naming the variable, its value and what is accepted.
  """
  for message in _refused.values():
    raise UsageError(message + ".")
