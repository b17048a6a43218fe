"""Moved to `tfm_ext.base.startup` in 0.2.1; this path goes in 0.3.0.

A fork's launcher imports it first, before TensorFlow: so does the shim.
"""

from tfm_ext import _moved

_moved.alias(__name__, "tfm_ext.base.startup", since="0.2.1")
