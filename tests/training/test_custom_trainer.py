"""CustomTrainer's hooks on real runs: order, counts, XLA, optimizers, passthrough."""

import os
import re

import pytest
import tensorflow as tf

import downstream_registry
import tfm_ext
from tfm_ext.training import inputs

EAGER = ("trainer.train_tf_function=false,trainer.eval_tf_function=false,"
         "trainer.train_tf_while_loop=false,")


def test_hooks_run_in_documented_order_and_number(run_in_process, tmp_path):
  # Eager loops, so every step is a Python call that the trainer records.
  override = EAGER + ("trainer.train_steps=10,trainer.steps_per_loop=5,"
                      "trainer.validation_interval=10,trainer.validation_steps=2,"
                      "trainer.summary_interval=5,trainer.checkpoint_interval=5")
  summary, _ = run_in_process("digits_convnet", "train_and_eval",
                              tmp_path / "m", override, trainer="recording")
  trainer = downstream_registry.RecordingTrainer.instances[-1]

  def loop(steps):
    return (["train_loop_begin"] + ["train_step", "next_train_inputs"] * steps
            + ["train_loop_end"])

  # The first loop of a process runs one step, later loops end on multiples
  # of steps_per_loop (1, then 4 to step 5, then 5 to step 10).
  expected = loop(1) + loop(4) + loop(5)
  expected += (["eval_begin"]
               + ["eval_step", "next_eval_inputs", "eval_reduce"] * 2
               + ["eval_end"])
  assert trainer.calls == expected
  assert summary.global_step == 10
  assert summary.train_metrics["downstream/loop_ends"] == 3.0


def test_enable_xla_compiles_nothing_on_cpu_as_in_tfm(run_in_process,
                                                       tmp_path):
  run_in_process("digits_convnet", "train", tmp_path / "m",
                 "runtime.enable_xla=true,trainer.train_steps=2,"
                 "trainer.steps_per_loop=1", trainer="recording")
  trainer = downstream_registry.RecordingTrainer.instances[-1]
  # pylint: disable=protected-access
  assert not isinstance(trainer._run_replicas,
                        tf.types.experimental.GenericFunction)
  assert trainer._task_train_step == trainer.task.train_step


def test_xla_on_cpu_compiles_the_replicated_step(run_in_process, tmp_path):
  override = ("runtime.xla_on_cpu=true,trainer.train_steps=20,"
              "trainer.steps_per_loop=10,trainer.validation_interval=20")
  summary, _ = run_in_process("digits_convnet", "train", tmp_path / "m",
                              override, trainer="recording")
  trainer = downstream_registry.RecordingTrainer.instances[-1]
  # On one CPU device XLA compiles the whole replicated step.
  step_fn = trainer._run_replicas  # pylint: disable=protected-access
  assert isinstance(step_fn, tf.types.experimental.GenericFunction)
  # The compiled step's HLO exists only if XLA really compiled it.
  inputs = (tf.zeros([4, 8, 8, 1]), tf.zeros([4], tf.int32))
  with trainer.strategy.scope():
    hlo = step_fn.experimental_get_compiler_ir(inputs)(stage="hlo")
  assert "HloModule" in hlo and "convolution" in hlo
  assert summary.global_step == 20
  assert summary.train_metrics["training_loss"] < 2.3


def test_xla_path_rejects_an_op_xla_cannot_compile(run_in_process, tmp_path):
  """Without XLA the string op runs; with XLA the same step must fail."""
  original = downstream_registry.TwoOptimizerTask.train_step

  def train_step(self, inputs, model, optimizer, metrics=None):
    tf.strings.as_string(tf.constant(1))  # No XLA kernel for AsString.
    return original(self, inputs, model, optimizer, metrics)

  downstream_registry.TwoOptimizerTask.train_step = train_step
  try:
    base = "trainer.train_steps=2,trainer.steps_per_loop=1,"
    summary, _ = run_in_process("digits_two_optimizers", "train",
                                tmp_path / "no_xla", base)
    assert summary.global_step == 2
    try:
      failed, _ = run_in_process("digits_two_optimizers", "train",
                                 tmp_path / "xla",
                                 base + "runtime.xla_on_cpu=true")
      assert failed.status == "failed", failed
      reason = failed.message  # The run's error boundary classified it.
    except tf.errors.InvalidArgumentError as e:  # A driver without one.
      reason = str(e)
    assert re.search("XLA|compil", reason), reason
  finally:
    downstream_registry.TwoOptimizerTask.train_step = original


def test_every_optimizer_learning_rate_is_logged(run_in_process, tmp_path):
  # Deterministic: 20 steps from a random start were at 0.13-0.2 accuracy.
  override = ("trainer.train_steps=20,trainer.steps_per_loop=10,"
              "trainer.validation_interval=20,runtime.deterministic=true")
  summary, _ = run_in_process("digits_two_optimizers", "train_and_eval",
                              tmp_path / "m", override)
  logs = summary.train_metrics
  assert "learning_rate" not in logs
  # Body: polynomial decay 0.05 -> 0 over 100 steps. A Keras 2 optimizer
  # reports the rate it applied last: at the 20th step, iteration 19.
  assert logs["learning_rate/body"] == pytest.approx(0.05 * 0.81, rel=1e-5)
  assert logs["learning_rate/head"] == pytest.approx(0.002, rel=1e-6)
  assert summary.eval_metrics["accuracy"] > 0.15  # Chance is 0.1.


def test_single_optimizer_keeps_tfm_learning_rate_key(run_in_process, tmp_path):
  summary, _ = run_in_process(
      "digits_convnet", "train", tmp_path / "m",
      "trainer.train_steps=10,trainer.steps_per_loop=10")
  assert "learning_rate" in summary.train_metrics
  assert not [k for k in summary.train_metrics if k.startswith("learning_rate/")]


@tfm_ext.register_trainer("passthrough")
class PassthroughTrainer(tfm_ext.CustomTrainer):
  """Sends a host-side count and a clashing key through next_eval_inputs."""

  reduced = []

  def next_eval_inputs(self, iterator):
    inputs, logs = super().next_eval_inputs(iterator)
    logs["host_batch_size"] = tf.shape(inputs[0])[0]
    logs["loss"] = tf.constant(-1.0)  # Clashes with the task's loss key.
    return inputs, logs

  def eval_reduce(self, state=None, step_outputs=None):
    PassthroughTrainer.reduced.append(step_outputs)
    return super().eval_reduce(state, step_outputs)


def test_passthrough_logs_merge_and_model_keys_win(run_in_process, tmp_path,
                                                   caplog):
  override = ("trainer.train_steps=10,trainer.steps_per_loop=10,"
              "trainer.validation_interval=10")
  run_in_process("digits_convnet", "train_and_eval", tmp_path / "m", override,
                 trainer="passthrough")
  outputs = PassthroughTrainer.reduced
  assert len(outputs) == 3  # 360 validation images in batches of 120.
  for logs in outputs:
    assert int(logs["host_batch_size"]) == 120
    loss = tf.nest.flatten(logs["loss"])[0]
    assert float(loss) > 0  # The model's loss, not the passthrough's -1.
  assert "clash with the model's logs" in caplog.text


class LoopLogsTrainer(tfm_ext.CustomTrainer):
  """Records each loop end's logs, what eager reads gave just before, and
  whether the metrics were reset."""

  loops = []

  def train_loop_end(self):
    expected = {metric.name: float(metric.result())
                for metric in self.train_metrics + [self.train_loss]}
    expected.update({k: float(v) for k, v in self.learning_rates().items()})
    logs = super().train_loop_end()
    LoopLogsTrainer.loops.append((
        expected, {k: float(v) for k, v in logs.items()},
        float(self.train_loss.count.numpy()),
        self._read_train_logs == self.read_train_logs))  # pylint: disable=comparison-with-callable
    return logs


@tfm_ext.register_trainer("loop_logs_untraceable")
class UntraceableLoopLogsTrainer(LoopLogsTrainer):

  def read_train_logs(self):
    logs = super().read_train_logs()
    if float(logs["training_loss"]) < 0:  # Python on a tensor's value.
      raise AssertionError("a loss below zero")
    return logs


tfm_ext.register_trainer("loop_logs")(LoopLogsTrainer)


@pytest.mark.parametrize("trainer", ["loop_logs", "loop_logs_untraceable"])
def test_loop_end_reads_as_a_graph_give_the_eager_values(run_in_process,
                                                         tmp_path, caplog,
                                                         trainer):
  # Traced from the second loop end on, or eager after a failed trace.
  override = ("trainer.train_steps=30,trainer.steps_per_loop=10,"
              "trainer.validation_interval=30")
  LoopLogsTrainer.loops = []
  run_in_process("digits_convnet", "train", tmp_path, override,
                 trainer=trainer)
  loops = LoopLogsTrainer.loops
  eager_reads = [eager for _, _, _, eager in loops]
  if trainer == "loop_logs":
    assert eager_reads == [True, False, False, False]
  else:
    assert eager_reads == [True] * 4
    assert "read_train_logs cannot be traced" in caplog.text
  for expected, logs, count, _ in loops:
    assert logs == expected
    assert count == 0.0  # Reset at each loop end.
  # Each loop's own loss, not a running mean over loops.
  assert len({logs["training_loss"] for _, logs, _, _ in loops}) == 4


def _private_pools(trainer):
  """The pool size of the trainer's datasets (each worker's, under a
  strategy's distributed dataset)."""
  return [dataset.options().threading.private_threadpool_size
          for distributed in (trainer.train_dataset, trainer.eval_dataset)
          for dataset in getattr(distributed, "_datasets", [distributed])]


def test_input_pool_is_half_the_cores_on_cpus_and_a_resume_may_change_it(
    run_in_process, tmp_path):
  """TFM declares runtime.dataset_num_private_threads and ignores it; ours
  sizes the trainer's datasets' tf.data pool with it, 0 for tf.data's own
  pool (stock TFM's), and unset on CPUs gives them half the cores. The input
  iterator in the checkpoint restores under another count."""
  override = ("trainer.train_steps=20,trainer.steps_per_loop=10,"
              "trainer.validation_interval=20,trainer.validation_steps=2")
  half = max(1, len(os.sched_getaffinity(0)) // 2)
  summary, _ = run_in_process("digits_convnet", "train_and_eval", tmp_path,
                              override, trainer="recording")
  assert summary.input_threads == half
  assert _private_pools(
      downstream_registry.RecordingTrainer.instances[-1]) == [half, half]
  for steps, threads, pools in ((30, 3, [3, 3]), (40, 0, [None, None])):
    summary, _ = run_in_process(
        "digits_convnet", "train_and_eval", tmp_path,
        override.replace("train_steps=20", f"train_steps={steps}")
        + f",runtime.dataset_num_private_threads={threads}",
        trainer="recording")
    assert (summary.resumed_from_step, summary.global_step) == (steps - 10,
                                                                steps)
    assert summary.input_in_checkpoint
    assert summary.input_threads == threads
    assert _private_pools(
        downstream_registry.RecordingTrainer.instances[-1]) == pools


def test_a_pipeline_that_sizes_its_own_pool_keeps_it():
  own = tf.data.Options()
  own.threading.private_threadpool_size = 5
  sized = tf.data.Dataset.range(4).with_options(own)
  pool = lambda d: d.options().threading.private_threadpool_size  # pylint: disable=unnecessary-lambda-assignment
  assert pool(inputs.with_input_threads(sized, 1)) == 5
  unsized = tf.data.Dataset.range(4)
  assert pool(inputs.with_input_threads(unsized, 2)) == 2
  assert pool(inputs.with_input_threads(unsized, 0)) == pool(unsized)
  assert list(inputs.with_input_threads(unsized, 2).as_numpy_iterator()
              ) == [0, 1, 2, 3]


def test_a_subclass_counter_joins_the_checkpoint_and_survives_a_resume(
    run_in_process, tmp_path):
  # tests/downstream's `counting` trainer: add_to_checkpoint + replica_step.
  override = ("trainer.train_steps={},trainer.steps_per_loop=10,"
              "trainer.checkpoint_interval=10,"
              "task.train_data.global_batch_size=16")
  summary, _ = run_in_process("digits_convnet", "train", tmp_path,
                              override.format(20), trainer="counting")
  assert summary.train_metrics["downstream/examples"] == 20 * 16
  summary, _ = run_in_process("digits_convnet", "train", tmp_path,
                              override.format(40), trainer="counting")
  assert summary.resumed_from_step == 20
  assert summary.train_metrics["downstream/examples"] == 40 * 16
