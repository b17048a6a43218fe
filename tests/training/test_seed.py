"""`runtime.seed` alone makes a run repeatable where it costs nothing.

Without `runtime.deterministic`, a seed still fixes the initial weights
and the data's order (`tfm_ext.training.determinism`): two runs of one
command end near each other, within what kernels that sum in a varying
order can move them, and another seed ends elsewhere. The default, 0,
seeds too, leaving op-seeded draws as stock TFM's.
"""

import numpy as np

from conftest import checkpoint_steps
from conftest import numeric_tensors

STEPS = ("trainer.train_steps=10,trainer.steps_per_loop=10,"
         "trainer.checkpoint_interval=10,trainer.validation_interval=10,"
         "trainer.summary_interval=10")


def _weights(launch_forked, model_dir, seed):
  override = STEPS + (f",runtime.seed={seed}" if seed is not None else "")
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      f"--params_override={override}",
                      model_dir=str(model_dir))
  assert run.returncode == 0, run
  assert checkpoint_steps(str(model_dir)) == [10]
  return numeric_tensors(f"{model_dir}/ckpt-10")


def _largest_difference(a, b):
  return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k])))
             for k in a if "model" in k and a[k].dtype.kind == "f")


def test_a_seed_alone_repeats_the_weights_another_seed_moves_them(
    launch_forked, tmp_path):
  first = _weights(launch_forked, tmp_path / "a", 7)
  again = _weights(launch_forked, tmp_path / "b", 7)
  other = _weights(launch_forked, tmp_path / "c", 8)
  assert _largest_difference(first, again) < 1e-4
  assert _largest_difference(first, other) > 1e-2



def test_the_default_seed_repeats_the_weights_too(launch_forked, tmp_path):
  # Seed 0 seeds TensorFlow with its own default graph seed, which leaves
  # every op-seeded draw (TFM's data configs' `seed`) as stock's: the TFM
  # matrix (tests/e2e/test_tfm_experiments.py) checks ours against stock
  # bit for bit on op-seeded input pipelines.
  first = _weights(launch_forked, tmp_path / "a", None)
  again = _weights(launch_forked, tmp_path / "b", None)
  assert _largest_difference(first, again) < 1e-4
