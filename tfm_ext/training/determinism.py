"""Seeds always, deterministic mode on request: set once, here.

Every run seeds Python, NumPy and TensorFlow from `runtime.seed` (default
0), which costs nothing: the same command on the same machine builds the
same initial weights and reads the data in the same order, and another
seed gives another draw. Seed 0 gives TensorFlow its own default graph
seed (`DEFAULT_GRAPH_SEED`), the one it pairs with an op's seed when no
global seed is set: so every op given a seed of its own (TFM's data
configs' `seed`) draws what it draws in stock TFM, which sets no global
seed, and only the ops without one (Keras initializers, an unseeded
shuffle), random in stock, are fixed. What seeding does not give is the
same weights after training: some CPU and GPU kernels sum in an order
that varies from run to run, and Keras's dropout draws from a stream a
resume restarts.

`runtime.deterministic=true` seeds TensorFlow with the seed itself, 0
included (its runs draw as they always have, none of them stock's), and
adds what makes the weights bitwise the same,
for a run twice and for a run killed and resumed against one never
interrupted (with the input iterator in the checkpoint,
`trainer.checkpoint_input_iterator`), at some cost in speed:

  * TensorFlow op determinism (deterministic kernels, tf.data in order);
  * Keras random layers (dropout...) on `tf.random.Generator`, whose state
    is a variable of the layer and so travels in the checkpoint, where the
    default stateful random ops keep their state in the kernel and restart
    from their seed after a resume.

All of it is process-wide and cannot be undone in the process.
"""

import random
from typing import Dict

from absl import logging
import numpy as np
import tensorflow as tf
import tf_keras

# TensorFlow's: what it pairs with an op's own seed when no global is set.
from tensorflow.python.framework import random_seed  # pylint: disable=g-direct-tensorflow-import


def apply(runtime) -> bool:
  """Seeds from `runtime.seed` (see the module); sets deterministic mode
  if `runtime.deterministic`; returns whether it is set."""
  seed = int(getattr(runtime, "seed", 0) or 0)
  deterministic = bool(getattr(runtime, "deterministic", False))
  random.seed(seed)
  np.random.seed(seed)
  tf.random.set_seed(seed if seed or deterministic
                     else random_seed.DEFAULT_GRAPH_SEED)
  if not deterministic:
    return False
  tf.config.experimental.enable_op_determinism()
  tf_keras.backend.experimental.enable_tf_random_generator()
  logging.info("Deterministic mode: seed %d, op determinism, Keras RNG on "
               "tf.random.Generator.", seed)
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
