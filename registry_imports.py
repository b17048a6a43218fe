"""Imports this repository's registrations: experiments, tasks, models.

Trainers shipped by the library (`custom`, `tfm_base`) register themselves on
`import tfm_ext`. Keep this file to registrations: nothing heavy beyond them.
"""

# pylint: disable=unused-import
import tfm_ext
from experiments import digits_convnet
from experiments import resnet50_imagenet_ctl
# TFM's ranking experiments and trainer (`--trainer=ranking`), which load
# TensorFlow Recommenders only when a run uses them.
from tfm_ext.training import ranking
