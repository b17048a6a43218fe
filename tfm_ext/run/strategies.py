"""The run's `tf.distribute.Strategy`: built, described, and who is chief."""

import contextlib
from typing import Optional

from absl import logging
import tensorflow as tf
from tensorflow.python.eager import context as tf_context

from official.common import distribute_utils
from official.core import config_definitions

from tfm_ext.config import cluster as cluster_lib
from tfm_ext.run import waits


def start(params: config_definitions.ExperimentConfig
          ) -> tf.distribute.Strategy:
  """The strategy of `params`, once `TF_CONFIG` is checked and its cluster
  answers.

  `TF_CONFIG` is refused first if it names a cluster that cannot form
  (`tfm_ext.config.cluster`: `UsageError`, nothing waited for). A wait
  for something outside the process is said and ends on a signal
  (`waits.announced`); a `multi_worker_mirrored` cluster is waited for in
  Python first (`waits.until_answered`), then TensorFlow connects on a
  thread of its own (`waits.connect_released`), where a signal still
  ends the wait (a peer lost between the two).
  """
  strategy = params.runtime.distribution_strategy
  cluster = cluster_lib.read(strategy)
  what = waits_for(params, cluster)
  with waits.announced(what) if what else contextlib.nullcontext():
    if cluster is not None and strategy == "multi_worker_mirrored" and (
        cluster.task_type != "evaluator"):
      waits.until_answered(cluster.address,
                           cluster.others(("chief", "worker")))
      with waits.connect_released():
        return build_strategy(params)
    return build_strategy(params)


def build_strategy(params: config_definitions.ExperimentConfig):
  """Returns the `tf.distribute.Strategy` that `params.runtime` asks for.

  TFM's semantics, with two changes to `mirrored` with `num_gpus=0`:

  * over several logical CPU devices (a process that split its CPU with
    `tf.config.set_logical_device_configuration`) it mirrors over all of
    them, where TFM uses CPU:0 only;
  * `runtime.mirror_one_device=false`, in a process with one CPU device and
    no GPU, returns the default strategy, as `off` does, where TFM (and the
    default, `true`) builds a one-replica `MirroredStrategy`: the same data
    and math, bit for bit, and checkpoints that either restores; only
    random ops in replica context (Keras's generator-backed dropout) draw
    from another stream. It is not the default: it did not win or tie both
    idle and loaded (benchmarks/RESULTS.md#default-one-replica-mirror).
  """
  runtime = params.runtime
  if runtime.distribution_strategy == "mirrored" and runtime.num_gpus == 0:
    # Listing devices starts the runtime, so only here: a multi-worker
    # strategy must be made before that.
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) > 1:
      return tf.distribute.MirroredStrategy([d.name for d in cpus])
    # With a GPU in the process the default strategy would place the steps
    # there; TFM's mirror keeps them on the CPU that `num_gpus=0` asks for.
    if not (getattr(runtime, "mirror_one_device", True)
            or tf.config.list_logical_devices("GPU")):
      logging.info("runtime.mirror_one_device=false: no strategy for "
                   "runtime.distribution_strategy=mirrored on one CPU "
                   "device.")
      return tf.distribute.get_strategy()
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=runtime.distribution_strategy,
      all_reduce_alg=runtime.all_reduce_alg,
      num_gpus=runtime.num_gpus,
      num_packs=runtime.num_packs,
      tpu_address=runtime.tpu)

def describe_strategy(strategy: tf.distribute.Strategy) -> str:
  """`MirroredStrategy`, ..., or `none` for the default strategy."""
  name = type(strategy).__name__
  return "none" if name == "_DefaultDistributionStrategy" else name

def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` spans several workers (processes)."""
  resolver = getattr(strategy, "cluster_resolver", None)
  return bool(resolver and resolver.cluster_spec().jobs
              and strategy.extended._in_multi_worker_mode())  # pylint: disable=protected-access

# How long each peer has to answer `silent_peer`.
PEER_ANSWER_SECONDS = 0.8


def silent_peer(strategy: tf.distribute.Strategy) -> str:
  """The first other worker of `strategy`'s cluster that does not answer.

  Returns it as `worker 1 (host:port)`, or '' if every one answers. Each
  is asked for at most `PEER_ANSWER_SECONDS` (TensorFlow's collective
  health check: its gRPC server answers whatever its main thread does).
  One that is stopped (SIGSTOP), frozen or cut off does not answer; one
  that is gone (its port refuses) is not silent: TensorFlow's collectives
  fail of it at once, and a worker that saved and exited is gone.
  """
  resolver = strategy.cluster_resolver
  spec = resolver.cluster_spec()
  for job in ("chief", "worker"):
    for index in spec.task_indices(job) if job in spec.jobs else ():
      if (job, index) == (resolver.task_type, resolver.task_id):
        continue
      try:
        tf_context.context().check_collective_ops_peer_health(
            f"/job:{job}/replica:0/task:{index}",
            timeout_in_ms=int(PEER_ANSWER_SECONDS * 1000))
      except tf.errors.DeadlineExceededError:
        return f"{job} {index} ({spec.task_address(job, index)})"
      except tf.errors.OpError:
        continue
  return ""


def waits_for(params: config_definitions.ExperimentConfig,
              cluster: Optional[cluster_lib.Cluster]) -> str:
  """What building the strategy waits for outside this process, or ''.

  A TPU's strategy connects to the TPU, one of `TF_CONFIG`'s `cluster` to
  every task of it; others wait for nothing.
  """
  if params.runtime.distribution_strategy == "tpu":
    return f"the TPU {params.runtime.tpu} to answer"
  if cluster is None:
    return ""
  return (f"the cluster of TF_CONFIG to answer ({cluster.describe()}): "
          "start every task of it")


def is_chief_process() -> bool:
  """Whether this process is the chief, from `TF_CONFIG` (before a strategy).

  The chief is the `chief` task, or worker 0 of a cluster without one.
  """
  cluster = cluster_lib.read()
  return cluster is None or cluster.is_chief()

def host_readable(global_step: tf.Variable,
                  strategy: tf.distribute.Strategy) -> tf.Variable:
  """A variable that reads as `global_step` and is cheaper to read.

  The controller, the summaries and the progress line read the step about
  ten times a loop. A `MirroredVariable`'s `numpy()` goes through the
  distribution machinery, several times slower than reading its first
  local component (benchmarks/RESULTS.md#default-host-readable-step),
  which holds the same value (every replica's copy is updated
  with the first replica's, and a cross-replica read returns one of them).
  Other strategies' variables are returned as they are.
  """
  if (isinstance(global_step, tf.distribute.DistributedValues)
      and isinstance(strategy, (tf.distribute.MirroredStrategy,
                                tf.distribute.MultiWorkerMirroredStrategy))):
    return strategy.experimental_local_results(global_step)[0]
  return global_step
