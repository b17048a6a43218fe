"""A quiet, fast start for entry points that import TensorFlow and TFM.

    from tfm_ext import _startup
    _startup.begin()
    ...import TensorFlow, TFM, the registrations...
    _startup.end()

`begin` sets TensorFlow's C++ log level to warnings (its start-up INFO lines
would bury the progress lines; a value the user set wins) and turns Python's
garbage collector off: the imports make hundreds of thousands of objects
that live as long as the process, and the collector would rescan them in
several full collections while they load. `end` freezes what they made, so
later collections skip it, and turns the collector back on
(benchmarks/RESULTS.md#default-collector-off-while-importing,
#default-gc-freeze). `tfm_ext.launcher` does both, so a fork that imports it
first gets them.
"""

import gc
import os

# Nested begin/end pairs (a launcher script around `tfm_ext.launcher`'s own):
# the outermost pair pauses and resumes the collector.
_depth = 0
_paused = False


def begin() -> None:
  """Quiets TensorFlow's start-up and pauses the collector; see the module."""
  global _depth, _paused
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  if _depth == 0 and gc.isenabled():
    gc.disable()
    _paused = True
  _depth += 1


def end() -> None:
  """Freezes what the imports made and resumes the collector (outermost)."""
  global _depth, _paused
  _depth = max(_depth - 1, 0)
  if _depth == 0 and _paused:
    gc.freeze()
    gc.enable()
    _paused = False
