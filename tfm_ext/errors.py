"""Moved to `tfm_ext.base.errors` in 0.2.1; this path goes in 0.3.0."""

from tfm_ext import _moved

_moved.alias(__name__, "tfm_ext.base.errors", since="0.2.1")
