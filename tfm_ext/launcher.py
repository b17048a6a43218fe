"""Moved to `tfm_ext.run.launcher` in 0.2.0; this path goes in 0.3.0."""

from tfm_ext import _moved

_moved.alias(__name__, "tfm_ext.run.launcher", since="0.2.0")
