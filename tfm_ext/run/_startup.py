"""A quiet, fast start for entry points that import TensorFlow and TFM.

    from tfm_ext.run import _startup
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
#default-gc-freeze). `tfm_ext.run.launcher` does both, so a fork that imports it
first gets them.

`end` also lists the physical devices once, the first time, which
TensorFlow does anyway after absl's flags are parsed (a hook of
`tf.distribute`'s test combinations). On a machine without a GPU, CUDA's
`failed call to cuInit: ... UNKNOWN ERROR (303)` line, which that listing
logs at error level, is dropped; whatever else it logs is kept. With NVIDIA
devices (`/dev/nvidia*`) the line says a driver is broken and stays.
"""

import gc
import glob
import os
import sys
import tempfile

# Nested begin/end pairs (a launcher script around `tfm_ext.run.launcher`'s own):
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
  if _depth == 0:
    _list_devices_once()


_listed = False
# What CUDA logs when it finds no device to initialize.
_NO_GPU_NOISE = b"failed call to cuInit"


def _list_devices_once() -> None:
  """Lists the physical devices; see the module docstring."""
  global _listed
  if _listed or "tensorflow" not in sys.modules:
    return
  _listed = True
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if glob.glob("/dev/nvidia*"):
    tf.config.list_physical_devices()
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      tf.config.list_physical_devices()
    finally:
      # Also on a signal's exit: what was logged is shown, less the noise.
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().splitlines(keepends=True)
              if _NO_GPU_NOISE not in line]
      os.write(2, b"".join(kept))
