"""The timings tfm_ext takes from the environment: one typed object.

Operators and tests tune a few timings from the environment: how the
records one process owns in `model_dir` are renewed and judged gone (the
trainer lease, the evaluators' claims and presence:
`tfm_ext.model_dir.claim`), how often a long training loop says where it
is, and how stale TensorFlow's GCS client may read an object (its own
`GCS_STAT_CACHE_MAX_AGE`, which tfm_ext must wait out). Each is a field of
`Settings`:

* `lease_heartbeat_seconds`: `TFM_EXT_LEASE_HEARTBEAT_SECONDS`, 10;
* `lease_stale_seconds`: `TFM_EXT_LEASE_STALE_SECONDS`, 60;
* `claim_renew_seconds`: `TFM_EXT_CLAIM_RENEW_SECONDS`, 5;
* `claim_stale_seconds`: `TFM_EXT_CLAIM_STALE_SECONDS`, 30;
* `evaluator_heartbeat_seconds`: `TFM_EXT_EVALUATOR_HEARTBEAT_SECONDS`, 5;
* `evaluator_stale_seconds`: `TFM_EXT_EVALUATOR_STALE_SECONDS`, 30;
* `loop_progress_seconds`: `TFM_EXT_LOOP_PROGRESS_SECONDS`, 30 (0: off);
* `gcs_stat_cache_seconds`: `GCS_STAT_CACHE_MAX_AGE`, 5 (0: no cache).

Nothing reads the environment at import: a malformed value would raise
there, before any run or its error boundary exists. A job parses it inside
its error boundary, before anything is written (`load`, from
`tfm_ext.run.driver`): a value it cannot take is a `UsageError` (exit 2,
one line naming the variable, the value and what is accepted). Code reads
the parsed object (`get`; it parses on first use where no job did, as in
a notebook).
"""

import dataclasses
import math
import os
from typing import Mapping, Optional

from tfm_ext.base.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Settings:
  """The timings, in seconds; see the module docstring for each."""
  lease_heartbeat_seconds: float = 10.0
  lease_stale_seconds: float = 60.0
  claim_renew_seconds: float = 5.0
  claim_stale_seconds: float = 30.0
  evaluator_heartbeat_seconds: float = 5.0
  evaluator_stale_seconds: float = 30.0
  loop_progress_seconds: float = 30.0
  gcs_stat_cache_seconds: float = 5.0

  @property
  def stale_read_seconds(self) -> float:
    """How long a record another process rewrote may read stale.

    TF's GCS client caches an object's length for `GCS_STAT_CACHE_MAX_AGE`
    seconds: another process's rewrite then reads as "File contents are
    inconsistent" (shorter) or cut short at the old length (longer).
    """
    return self.gcs_stat_cache_seconds + 1

  def replace(self, **changes) -> "Settings":
    return dataclasses.replace(self, **changes)


# Field -> (its environment variable, whether 0 is a value it takes).
VARIABLES = {
    "lease_heartbeat_seconds": ("TFM_EXT_LEASE_HEARTBEAT_SECONDS", False),
    "lease_stale_seconds": ("TFM_EXT_LEASE_STALE_SECONDS", False),
    "claim_renew_seconds": ("TFM_EXT_CLAIM_RENEW_SECONDS", False),
    "claim_stale_seconds": ("TFM_EXT_CLAIM_STALE_SECONDS", False),
    "evaluator_heartbeat_seconds": ("TFM_EXT_EVALUATOR_HEARTBEAT_SECONDS",
                                    False),
    "evaluator_stale_seconds": ("TFM_EXT_EVALUATOR_STALE_SECONDS", False),
    "loop_progress_seconds": ("TFM_EXT_LOOP_PROGRESS_SECONDS", True),
    "gcs_stat_cache_seconds": ("GCS_STAT_CACHE_MAX_AGE", True),
}

_current: Optional[Settings] = None


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Settings:
  """The settings `environ` (the process's environment) sets.

  Raises:
    UsageError: naming the first variable whose value it cannot take.
  """
  environ = os.environ if environ is None else environ
  values = {}
  for field, (name, zero) in VARIABLES.items():
    raw = environ.get(name)
    if raw is None or not raw.strip():
      continue
    try:
      value = float(raw)
    except ValueError:
      value = math.nan
    if not (math.isfinite(value) and (value > 0 or (zero and value == 0))):
      raise UsageError(
          f"{name}={raw!r} (in the environment): give a number of seconds, "
          f"{'0 or more' if zero else 'more than 0'}, or unset it for its "
          "default.")
    values[field] = value
  return Settings(**values)


def load(environ: Optional[Mapping[str, str]] = None) -> Settings:
  """Parses the environment (`from_environment`); `get` returns it from now."""
  global _current
  _current = from_environment(environ)
  return _current


def get() -> Settings:
  """The settings `load` parsed; parsed now if nothing loaded them yet."""
  return _current if _current is not None else load()
