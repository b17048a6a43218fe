"""The launcher, stopping itself (SIGSTOP) inside its first checkpoint save.

It stops once the save has written its shards into TensorFlow's temporary
folder (`<prefix>_temp/`), before they are merged into place: a trainer
suspended inside a save (tests/e2e/test_lease_lost_in_save.py).
"""
import os
import runpy
import signal
import sys

from tensorflow.python.ops import gen_io_ops  # pylint: disable=g-direct-tensorflow-import

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "launchers", "train.py")
_merge = gen_io_ops.merge_v2_checkpoints
_stopped = []


def _stop_then_merge(checkpoint_prefixes, destination_prefix, **kwargs):
  # A training save's (fenced) files, not another save's (a startup check).
  if not _stopped and b"_fenced" in destination_prefix.numpy():
    _stopped.append(True)
    print("stopping inside a save", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
  return _merge(checkpoint_prefixes, destination_prefix, **kwargs)


gen_io_ops.merge_v2_checkpoints = _stop_then_merge
sys.argv[0] = TRAIN
runpy.run_path(TRAIN, run_name="__main__")
