"""Runs one of TFM's trainer test modules, from the installed wheel, on tfm_ext.

    python tests/tfm_core_suites.py base_trainer_test|train_lib_test

The module is loaded from `official/core/` at run time (nothing of TFM's is
copied) and its names are rebound before its tests run:
`base_trainer.Trainer` -> `tfm_ext.CustomTrainer`, `TrainerConfig` ->
`tfm_ext.TrainerConfig`, `train_lib.run_experiment` ->
`tfm_ext.run_experiment`, and `train_lib.OrbitExperimentRunner(**kw).run()`
-> `tfm_ext.run_experiment(**kw)`. The last line printed is a JSON record:
the unittest counts and how often tfm_ext's trainer and `run_experiment`
ran, so a caller can tell that the substitution took.
"""

import collections
import importlib.util
import json
import os
import sys
import types
import unittest

from absl import flags

import official.core
from official.core import base_trainer
from official.core import config_definitions
from official.core import train_lib

import tfm_ext

CALLS = collections.Counter()


class CountingTrainer(tfm_ext.CustomTrainer):
  """tfm_ext's trainer, counting how often a test builds it."""

  def __init__(self, *args, **kwargs):
    CALLS["custom_trainer"] += 1
    super().__init__(*args, **kwargs)


def run_experiment(**kwargs):
  CALLS["run_experiment"] += 1
  return tfm_ext.run_experiment(**kwargs)


class OrbitExperimentRunner:
  """TFM's runner class, as its tests use it: `run()` with the arguments."""

  def __init__(self, **kwargs):
    self._kwargs = kwargs

  def run(self):
    return run_experiment(**self._kwargs)


def _rebound(module, **names):
  """A namespace with `module`'s names, `names` replacing some of them."""
  return types.SimpleNamespace(**{**vars(module), **names})


SUBSTITUTES = {
    "trainer_lib": _rebound(base_trainer, Trainer=CountingTrainer),
    "cfg": _rebound(config_definitions, TrainerConfig=tfm_ext.TrainerConfig),
    "train_lib": _rebound(train_lib, run_experiment=run_experiment,
                          OrbitExperimentRunner=OrbitExperimentRunner),
}


def load(name: str):
  path = os.path.join(os.path.dirname(official.core.__file__), f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for attribute, substitute in SUBSTITUTES.items():
    if hasattr(module, attribute):
      setattr(module, attribute, substitute)
  return module


def main(name: str) -> int:
  module = load(name)
  flags.FLAGS([sys.argv[0]])  # TF's TestCase reads absl flags.
  suite = unittest.defaultTestLoader.loadTestsFromModule(module)
  result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
  print(json.dumps({
      "ran": result.testsRun, "failures": len(result.failures),
      "errors": len(result.errors), "skipped": len(result.skipped),
      "failed": [test.id() for test, _ in result.failures + result.errors],
      **CALLS}), flush=True)
  return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
