"""Moved to `tfm_ext.training.ranking` in 0.2.0; this path goes in 0.3.0.

`--registry=tfm_ext.ranking` and `python -m tfm_ext.ranking` still work.
"""

import runpy

from tfm_ext import _moved

if __name__ == "__main__":
  runpy.run_module("tfm_ext.training.ranking", run_name="__main__")
else:
  _moved.alias(__name__, "tfm_ext.training.ranking", since="0.2.0")
