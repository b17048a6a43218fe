"""TFM's own trainer tests, from the installed wheel, pass against tfm_ext.

`tests/tfm_core_suites.py` loads `official/core/base_trainer_test.py` and
`train_lib_test.py` at run time with `tfm_ext.CustomTrainer`,
`tfm_ext.TrainerConfig` and `tfm_ext.run_experiment` in place of TFM's, in a
process of its own (TFM's test defines TFM's flags, as our launcher does).
Stock TFM passes 21 and 16 of them on a CPU and skips the rest (TPU and GPU
combinations); so must we.
"""

import json
import os

import pytest

from conftest import REPO

# TFM's module -> (tests that pass stock on a CPU, what must have run ours).
SUITES = {
    "base_trainer_test": (21, "custom_trainer"),
    "train_lib_test": (16, "run_experiment"),
}


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(SUITES))
def test_tfms_trainer_tests_pass_on_tfm_ext(module, run_forked):
  # Forked from a process that imported TensorFlow and TFM once (conftest's
  # `run_forked`): the suite runs in a process of its own all the same.
  proc = run_forked(os.path.join(REPO, "tests", "tfm_core_suites.py"), module,
                    timeout=600, env={"PYTHONPATH": REPO,
                                      "TF_CPP_MIN_LOG_LEVEL": "2"})
  record = json.loads(proc.stdout.strip().splitlines()[-1])
  passes, ours = SUITES[module]
  assert record["failed"] == [], proc.stdout[-4000:] + proc.stderr[-4000:]
  assert record["ran"] - record["skipped"] == passes, record
  assert record.get(ours, 0) >= passes - 1, record  # Ours ran, not TFM's.
  assert proc.returncode == 0
