"""Data-parallel batches: each replica's step sees global / replicas rows.

The rows are counted inside `task.train_step` (the metrics of the
`digits_rows` test double), so these tests check what the model trained
on, not what a pipeline was configured to yield. Multi-worker runs (two
loopback workers, 32 rows each of a global 64) are checked in
test_multi_worker.py.
"""

import json
import subprocess
import sys

import pytest

from conftest import REPO, TWO_CPUS_TRAIN

GLOBAL_BATCH = 16
LOOP = 10
OVERRIDE = (f"task.train_data.global_batch_size={GLOBAL_BATCH},"
            f"trainer.train_steps={2 * LOOP},trainer.steps_per_loop={LOOP},"
            f"trainer.summary_interval={LOOP},"
            f"trainer.checkpoint_interval={2 * LOOP}")


@pytest.mark.parametrize("in_checkpoint", [True, False])
def test_mirrored_replicas_each_train_on_their_share_of_the_global_batch(
    launch_forked, tmp_path, in_checkpoint):
  result = launch_forked(
      "--experiment=digits_rows", "--mode=train",
      f"--params_override={OVERRIDE},"
      f"trainer.checkpoint_input_iterator={str(in_checkpoint).lower()}",
      model_dir=tmp_path, script=TWO_CPUS_TRAIN)
  assert result.returncode == 0, result
  summary = result.summary()
  assert (summary["strategy"], summary["replicas"]) == ("MirroredStrategy", 2)
  assert summary["input_in_checkpoint"] is in_checkpoint
  metrics = summary["train_metrics"]
  assert metrics["rows_per_replica"] == GLOBAL_BATCH / 2
  # The last loop ran LOOP steps of the whole global batch.
  assert metrics["examples_seen"] == LOOP * GLOBAL_BATCH


def test_one_replica_trains_on_the_whole_global_batch(run_in_process,
                                                      tmp_path):
  summary, _ = run_in_process("digits_rows", "train", tmp_path, OVERRIDE)
  assert summary.status == "completed", summary
  assert (summary.strategy, summary.replicas) == ("MirroredStrategy", 1)
  metrics = summary.train_metrics
  assert metrics["rows_per_replica"] == GLOBAL_BATCH
  assert metrics["examples_seen"] == LOOP * GLOBAL_BATCH


# Worker 1 of a 2-worker cluster whose workers have 2 local replicas each:
# TensorFlow builds that only with GPUs (its MultiWorkerMirroredStrategy uses
# one CPU device per worker), so the strategy's layout is described by a
# stand-in, and everything after it is real: the context the trainer gives
# its host pipeline, TFM's InputReader over the digits records, and the
# split over a real MirroredStrategy's 2 replicas.
PER_WORKER_SPLIT = r"""
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import registry_imports  # noqa
from experiments import digits_convnet
from tfm_ext.training import inputs

GLOBAL = 64
local = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


class Worker:
  "MultiWorkerMirroredStrategy's layout on worker `index` of 2, 2 GPUs each."

  def __init__(self, index):
    self.num_replicas_in_sync = 4
    self.extended = local.extended
    self.cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["h0:1", "h1:1"]}),
        task_type="worker", task_id=index)


task = digits_convnet.DigitsTask(digits_convnet.DigitsTaskConfig())
data = task.task_config.train_data.replace(global_batch_size=GLOBAL,
                                           shuffle_buffer_size=1)
out = {}
for index in (0, 1):
  context = inputs.host_input_context(Worker(index))
  batch = next(iter(task.build_inputs(data, input_context=context)))
  split = inputs.split_across_replicas(batch, local)
  images = [local.experimental_local_results(split)[r][0] for r in (0, 1)]
  out[index] = {
      "context": [context.num_input_pipelines, context.input_pipeline_id,
                  context.num_replicas_in_sync],
      "worker_rows": int(batch[0].shape[0]),
      "replica_rows": [int(i.shape[0]) for i in images],
      "replica_sums": [float(tf.reduce_sum(i)) for i in images],
  }
print(json.dumps(out))
"""


def test_each_worker_reads_its_share_and_splits_it_over_its_replicas(
    data_dir):
  proc = subprocess.run(
      [sys.executable, "-c", PER_WORKER_SPLIT], capture_output=True,
      text=True, timeout=180, cwd=REPO,
      env={"PYTHONPATH": REPO, "TFM_EXT_DATA_DIR": data_dir,
           "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": ""})
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  for index in ("0", "1"):
    worker = out[index]
    # Two input pipelines, this worker's id; a batch of global / workers.
    assert worker["context"] == [2, int(index), 2]
    assert worker["worker_rows"] == 64 // 2
    assert worker["replica_rows"] == [64 // 4, 64 // 4]
    # The replicas got different rows of the worker's batch.
    assert worker["replica_sums"][0] != worker["replica_sums"][1]
  # The workers read different shards.
  assert out["0"]["replica_sums"] != out["1"]["replica_sums"]


# The input paths of this repo's ResNet50 and of TFM's own image
# classification (`resnet_imagenet`) on MirroredStrategy over 2 CPUs: the
# distributed path (iterator not in the checkpoint; their random crops are
# stateful) and the host path the trainer takes when it can checkpoint.
IMAGE_PIPELINES = r"""
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import registry_imports  # noqa
import official.vision.registry_imports  # noqa
from official.core import exp_factory, task_factory
from tfm_ext.training import inputs

GLOBAL = 4
data_dir = sys.argv[1]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
out = {}
for name, overrides in [
    ("resnet50_imagenet_ctl", {"input_path": data_dir + "/train-*"}),
    ("resnet_imagenet", {"input_path": data_dir + "/train-*"})]:
  params = exp_factory.get_exp_config(name)
  if name == "resnet_imagenet":
    params.task.model.input_size = [32, 32, 3]
  data = params.task.train_data.replace(global_batch_size=GLOBAL,
                                        shuffle_buffer_size=8, **overrides)
  task = task_factory.get_task(params.task)
  distributed = iter(strategy.distribute_datasets_from_function(
      lambda ctx: task.build_inputs(data, input_context=ctx)))
  images = strategy.experimental_local_results(next(distributed)[0])
  host = next(iter(task.build_inputs(
      data, input_context=inputs.host_input_context(strategy))))
  split = strategy.experimental_local_results(
      inputs.split_across_replicas(host, strategy))
  out[name] = {"distributed": [int(i.shape[0]) for i in images],
               "host": int(host[0].shape[0]),
               "split": [int(s[0].shape[0]) for s in split]}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_image_pipelines_give_each_replica_its_share(data_dir, tmp_path):
  import imagenet_fixtures  # pylint: disable=g-import-not-at-top
  records = imagenet_fixtures.write_imagenet(str(tmp_path / "imagenet"))
  proc = subprocess.run(
      [sys.executable, "-c", IMAGE_PIPELINES, records], capture_output=True,
      text=True, timeout=300, cwd=REPO,
      env={"PYTHONPATH": REPO + ":" + REPO + "/tests",
           "TFM_EXT_DATA_DIR": data_dir, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": ""})
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  for name in ("resnet50_imagenet_ctl", "resnet_imagenet"):
    assert out[name] == {"distributed": [2, 2], "host": 4, "split": [2, 2]}


def test_examples_per_second_and_eta_count_global_batches():
  import io  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfm_ext.base import console  # pylint: disable=g-import-not-at-top
  step = tf.Variable(0, dtype=tf.int64)
  now = [10.0]
  stream = io.StringIO()
  progress = console.TrainProgress(
      global_step=step, total_steps=101, global_batch_size=GLOBAL_BATCH,
      start_time=0.0, clock=lambda: now[0], stream=stream)
  for steps, seconds in ((1, 0.0), (10, 2.0), (10, 2.0)):
    step.assign_add(steps)
    now[0] += seconds
    progress({})
  # 20 global batches of 16 rows in 4 s after the first step.
  assert progress.examples_per_second == 20 * GLOBAL_BATCH / 4.0
  last = stream.getvalue().splitlines()[-1]
  assert f"{10 * GLOBAL_BATCH / 2.0:.0f} ex/s" in last
  # 80 steps left at 0.2 s a step.
  assert "ETA 0:00:16" in last
