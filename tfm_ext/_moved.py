"""Old module paths, kept working for a release after a move (a shim each).

    # tfm_ext/launcher.py
    _moved.alias(__name__, "tfm_ext.run.launcher", since="0.2.0")

The old path then is the new module itself (`sys.modules`), so its flags,
registries and state exist once, and importing it warns
(`DeprecationWarning`, at the importing line: shown where `__main__`
imports it, as a fork's launcher script does) naming the new path.
"""

import importlib
import sys
import warnings

# The release that drops the old paths.
REMOVED_IN = "0.3.0"


def _importer_level() -> int:
  """The `stacklevel` of the first frame outside the import machinery."""
  frame, level = sys._getframe(2), 2  # pylint: disable=protected-access
  while frame is not None and frame.f_code.co_filename.startswith(
      "<frozen importlib"):
    frame, level = frame.f_back, level + 1
  return level


def alias(old: str, new: str, since: str) -> None:
  """Makes module `old` the module `new`, warning of the move."""
  warnings.warn(
      f"{old} moved to {new} in tfm_ext {since}; import {new} (the old path "
      f"goes in {REMOVED_IN}).", DeprecationWarning,
      stacklevel=_importer_level() + 1)
  sys.modules[old] = importlib.import_module(new)
