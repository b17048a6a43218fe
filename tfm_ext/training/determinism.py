"""Deterministic mode: `runtime.deterministic=true`, set once, here.

With it, the same command gives bitwise the same weights, and a run killed
and resumed gives bitwise the weights of one never interrupted (with the
input iterator in the checkpoint, `trainer.checkpoint_input_iterator`).
It sets:
  * Python, NumPy and TensorFlow seeds from `runtime.seed`;
  * TensorFlow op determinism (deterministic kernels, tf.data in order);
  * Keras random layers (dropout...) on `tf.random.Generator`, whose state
    is a variable of the layer and so travels in the checkpoint, where the
    default stateful random ops keep their state in the kernel and restart
    from their seed after a resume.

All three are process-wide and cannot be undone in the process.
"""

from typing import Dict

from absl import logging
import tensorflow as tf
import tf_keras


def apply(runtime) -> bool:
  """Sets deterministic mode if `runtime.deterministic`; returns whether set."""
  if not getattr(runtime, "deterministic", False):
    return False
  tf_keras.utils.set_random_seed(int(runtime.seed))
  tf.config.experimental.enable_op_determinism()
  tf_keras.backend.experimental.enable_tf_random_generator()
  logging.info("Deterministic mode: seed %d, op determinism, Keras RNG on "
               "tf.random.Generator.", runtime.seed)
  return True


def random_generators(model) -> Dict[str, tf.random.Generator]:
  """The `tf.random.Generator` of each Keras random layer (dropout...).

  Keras keeps them out of checkpoints (for old checkpoints' sake), so a
  resumed run would draw other dropout masks than an uninterrupted one.
  They exist when Keras layers use generators (deterministic mode turns
  that on); they are created here, before the checkpoint is restored.
  """
  generators = {}
  for layer in getattr(model, "submodules", ()):
    rng = getattr(layer, "_random_generator", None)
    if rng is None or not hasattr(rng, "_maybe_init"):
      continue
    rng._maybe_init()  # pylint: disable=protected-access
    generator = getattr(rng, "_generator", None)
    if isinstance(generator, tf.random.Generator):
      generators[layer.name] = generator
  return generators
