"""Any Keras model exports: its signature from the task's validation input.

A Sequential without an `InputLayer` and a subclassed model declare no
inputs; `--mode=export` serves them what the task's evaluation feeds them
(the dataset's element spec), and the served call answers as the model
restored from the same checkpoint does.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfm_ext

from conftest import DOUBLES_TRAIN

STEPS = ("trainer.train_steps=10,trainer.steps_per_loop=10,"
         "trainer.summary_interval=10,trainer.checkpoint_interval=10,"
         "trainer.validation_interval=10,trainer.validation_steps=1")


@pytest.mark.parametrize("model", ["lazy_sequential", "subclassed"])
def test_a_model_that_declares_no_inputs_exports_and_serves_as_it_calls(
    launch_forked, tmp_path, model):
  model_dir = tmp_path / "m"
  override = f"--params_override={STEPS},task.model.name={model}"
  trained = launch_forked("--experiment=digits_convnet",
                          "--mode=train_and_eval", override,
                          model_dir=model_dir, script=DOUBLES_TRAIN)
  assert trained.returncode == 0, trained
  exported = launch_forked("--experiment=digits_convnet", "--mode=export",
                           override, model_dir=model_dir,
                           script=DOUBLES_TRAIN)
  assert exported.returncode == 0, exported
  served = tf.saved_model.load(str(model_dir / "export" / "10"))
  serve = served.signatures["serving_default"]
  spec = serve.structured_input_signature[1]["inputs"]
  assert (spec.shape.as_list(), spec.dtype) == ([None, 8, 8, 1], tf.float32)
  images = np.random.default_rng(0).random([3, 8, 8, 1]).astype(np.float32)
  answer = serve(inputs=tf.constant(images))["outputs"].numpy()
  # The model itself, built by its task and restored from ckpt-10.
  import doubles  # pylint: disable=g-import-not-at-top,unused-import
  called = tfm_ext.load(str(model_dir), checkpoint="10")(
      tf.constant(images), training=False).numpy()
  np.testing.assert_allclose(answer, called, rtol=1e-6, atol=1e-6)
  assert answer.shape == (3, 10)
