"""The driver's recipe: what a run records in model_dir, by mode.

In-process runs of digits_convnet.
"""

import tf_keras

from tfm_ext.model_dir import run_summary

TINY = ("trainer.train_steps=4,trainer.steps_per_loop=2,"
        "trainer.summary_interval=2,trainer.checkpoint_interval=4,"
        "trainer.validation_interval=4")


def test_an_evaluator_leaves_the_trainers_records_as_they_are(
    run_in_process, tmp_path):
  run_in_process("digits_convnet", "train", tmp_path,
                 TINY + ",trainer.validation_steps=2")
  params_yaml = (tmp_path / "params.yaml").read_text()
  starts = run_summary.training_starts(str(tmp_path))
  assert len(starts) == 1
  assert run_summary.training_complete_step(str(tmp_path)) == 4

  # Evaluators with their own validation_steps: neither writes params.yaml
  # nor a training start, and the trainer's "complete at step 4" stays.
  for mode in ("eval", "continuous_eval"):
    summary, _ = run_in_process("digits_convnet", mode, tmp_path,
                                TINY + ",trainer.validation_steps=1")
    assert (summary.mode, summary.global_step) == (mode, 4)
    assert run_summary.training_complete_step(str(tmp_path)) == 4, mode
  assert (tmp_path / "params.yaml").read_text() == params_yaml
  assert run_summary.training_starts(str(tmp_path)) == starts


def test_a_runs_mixed_precision_policy_ends_with_it(run_in_process, tmp_path):
  # A notebook's next run, or a test's, starts from the policy before.
  before = tf_keras.mixed_precision.global_policy().name
  summary, _ = run_in_process(
      "digits_convnet", "train", tmp_path,
      TINY + ",runtime.mixed_precision_dtype=bfloat16")
  assert summary.status == "completed"
  assert tf_keras.mixed_precision.global_policy().name == before == "float32"
