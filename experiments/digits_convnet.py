"""The embedded default experiment, under this repository's name for it.

It lives in the library, `tfm_ext.examples.digits_convnet`, so that a plain
`pip install` runs it; this module is that one (one module object, so its
registrations happen once whichever name imports it first).
"""

import sys

from tfm_ext.examples import digits_convnet

sys.modules[__name__] = digits_convnet
