"""The launcher, killing itself (SIGKILL) between a save and an evaluation.

With `$KILL_BEFORE_EVAL_AT=N` the process kills itself as Orbit's
controller is asked to evaluate at step N: the checkpoint of step N was
saved at the end of the training loop (`Controller.train`), and nothing of
that evaluation has run (tests/actions/test_killed_between_save_and_eval.py).
"""
import os
import runpy
import signal
import sys

import orbit

TRAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "launchers", "train.py")
_evaluate = orbit.Controller.evaluate


def _killed_at_step(self, *args, **kwargs):
  at = os.environ.get("KILL_BEFORE_EVAL_AT")
  if at and int(self.global_step.numpy()) == int(at):
    print(f"killed before the evaluation @ step {at}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
  return _evaluate(self, *args, **kwargs)


orbit.Controller.evaluate = _killed_at_step
sys.argv[0] = TRAIN
runpy.run_path(TRAIN, run_name="__main__")
