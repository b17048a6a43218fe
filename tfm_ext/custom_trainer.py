"""`CustomTrainer`: TFM's `base_trainer.Trainer` with documented hooks.

Orbit drives the hooks. One `train_and_eval` run calls them in this order
(Python calls; inside `tf.function` the step-level hooks are traced once and
then run as a graph):

    for each loop of `steps_per_loop` steps:               # Orbit Controller
      train_loop_begin()
      repeat steps_per_loop times:                         # tf.while_loop
        train_step(iterator)
          inputs = next_train_inputs(iterator)
          strategy.run(task.train_step)                    # XLA if enable_xla
      logs = train_loop_end()                              # -> train actions
      every validation_interval steps:
        eval_begin()
        for each eval batch:
          logs = eval_step(iterator)
            inputs, passthrough = next_eval_inputs(iterator)
            logs = passthrough | strategy.run(task.validation_step)
          state = eval_reduce(state, logs)                 # task.aggregate_logs
        logs = eval_end(state)                             # -> eval actions

Override any hook in a subclass and register it with
`@tfm_ext.register_trainer("name")`; select it with `--trainer=name`.
"""

import hashlib
import inspect
import json
import math
import os
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tensorflow.python.distribute import multi_worker_util  # pylint: disable=g-direct-tensorflow-import

from official.core import base_trainer
from official.core import train_utils
from official.modeling import optimization

from tfm_ext import trainers
from tfm_ext.errors import RunFailed

Logs = Dict[str, Any]


@trainers.register_trainer("custom")
class CustomTrainer(base_trainer.Trainer):
  """A `base_trainer.Trainer` whose loop pieces are public, documented hooks.

  Differences from TFM's `Trainer`:
    * With `trainer.checkpoint_input_iterator` (the default) the training
      input iterator is in the checkpoint: a resumed run reads exactly the
      batches an uninterrupted one would; so are the random generators of
      Keras layers, when they use them (deterministic mode).
    * `runtime.enable_xla` compiles the train step with XLA on CPU too (TFM
      compiles only when `num_gpus > 0`); see `_build_xla_step`.
    * `train_loop_end` reports the learning rate of every optimizer when the
      model trains with several (`learning_rate/<name>`).
    * `eval_end` reads `best_<metric>` through TFM's `|`-nested metric names.
    * A NaN or infinite training loss stops the run at the end of its loop
      (`RunFailed`, naming the loop's steps), before that loop is saved.
    * Its datasets get a private tf.data pool of `input_threads` threads
      (`runtime.dataset_num_private_threads`, which TFM declares and
      ignores; unset, half the cores when the replicas are CPUs).
  """

  def __init__(self, config, task, model, optimizer, train=True,
               evaluate=True, train_dataset=None, **kwargs):
    strategy = tf.distribute.get_strategy()
    self.input_threads = input_threads(config.runtime, strategy)
    host_iterator = None
    if (train and train_dataset is None
        and getattr(config.trainer, "checkpoint_input_iterator", False)
        and host_input_supported(strategy)):
      train_dataset = with_input_threads(
          task.build_inputs(config.task.train_data,
                            input_context=host_input_context(strategy)),
          self.input_threads)
      host_iterator = iter(train_dataset)
      why_not = unsaveable_reason(host_iterator)
      if why_not:
        logging.warning(
            "The training input pipeline cannot be checkpointed (%s), so a "
            "resumed run will not see exactly the data of an uninterrupted "
            "one. Use stateless random ops (tf.random.stateless_*) in the "
            "pipeline, or set trainer.checkpoint_input_iterator=false to "
            "silence this.", why_not)
        train_dataset = host_iterator = None
    self._host_input = host_iterator is not None
    super().__init__(config, task, model, optimizer, train=train,
                     evaluate=evaluate, train_dataset=train_dataset, **kwargs)
    extra = {}
    if self._host_input:
      # Orbit builds the iterator at the first train(); the checkpoint needs
      # it now, since the controller restores before training.
      self._train_iter = host_iterator
      # Keyed by the data config: a position in one pipeline means nothing
      # in another (`--allow_config_change` with a new batch size, say), so
      # a changed pipeline starts afresh instead of failing to restore.
      extra["train_input"] = {
          _fingerprint(config.task.train_data.as_dict()): self._train_iter}
    generators = random_generators(model)
    if generators:
      extra["random_generators"] = generators
    if extra:
      self._checkpoint = tf.train.Checkpoint(
          global_step=self.global_step, model=self.model,
          optimizer=self.optimizer, **extra,
          **getattr(model, "checkpoint_items", {}))
    self._loop_steps = None  # The number of steps of the loop in flight.
    self._read_train_logs = self.read_train_logs  # Traced later.
    self._loop_ends = 0
    self._task_train_step = task.train_step
    self._run_replicas = self._run_replicas_eagerly_or_traced
    if config.runtime.enable_xla:
      self._build_xla_step()

  def _build_xla_step(self):
    """Compiles the task step, or the whole replicated step, with XLA."""
    where = xla_scope(local_devices(self.strategy))
    if where == "task_step":
      self._task_train_step = tf.function(self.task.train_step,
                                          jit_compile=True)
    elif where == "replicated_step":
      self._run_replicas = tf.function(self._run_replicas_eagerly_or_traced,
                                       jit_compile=True)
    else:
      raise ValueError(xla_unsupported_message(local_devices(self.strategy)))

  def distribute_dataset(self, dataset_or_fn, *args, **kwargs):
    """TFM's `distribute_dataset`, the datasets given `input_threads`."""
    threads = self.input_threads
    if isinstance(dataset_or_fn, tf.data.Dataset):
      return super().distribute_dataset(
          with_input_threads(dataset_or_fn, threads), *args, **kwargs)
    takes_context = "input_context" in inspect.getfullargspec(
        dataset_or_fn).args
    input_options = kwargs.pop("input_options", None)  # Orbit's, not the fn's.

    def dataset_fn(input_context=None):  # Orbit passes it by this name.
      fn_kwargs = dict(kwargs, input_context=input_context) if (
          takes_context) else kwargs
      return with_input_threads(dataset_or_fn(*args, **fn_kwargs), threads)

    return super().distribute_dataset(dataset_fn, input_options=input_options)

  # -- Training hooks -------------------------------------------------------

  def train_loop_begin(self):
    """Runs in Python before each loop of `steps_per_loop` steps."""
    super().train_loop_begin()

  def next_train_inputs(self, iterator) -> Any:
    """Returns the next training batch; runs on the host, once per step.

    Usually traced into the training loop's graph. Override to filter,
    restructure or count what reaches the model.
    """
    return next(iterator)

  def train_step(self, iterator) -> None:
    """Runs one training step on every replica; returns nothing.

    Fetches inputs through `next_train_inputs`, then runs `task.train_step`
    (compiled with XLA when `runtime.enable_xla` is set), updates the training
    loss and increments the global step.
    """

    inputs = self.next_train_inputs(iterator)
    if self._host_input:
      inputs = self._split_across_replicas(inputs)
    self._run_replicas(inputs)

  @property
  def checkpoints_input_iterator(self) -> bool:
    """Whether checkpoints hold the training input iterator's position."""
    return self._host_input

  def _split_across_replicas(self, inputs):
    return split_across_replicas(inputs, self.strategy)

  def _run_replicas_eagerly_or_traced(self, inputs):
    def step_fn(inputs):
      logs = self._task_train_step(
          inputs,
          model=self.model,
          optimizer=self.optimizer,
          metrics=self.train_metrics)
      self.train_loss.update_state(logs[self.task.loss])
      self.global_step.assign_add(1)

    self.strategy.run(step_fn, args=(inputs,), options=self._runtime_options)

  def train(self, num_steps: tf.Tensor) -> Optional[Logs]:
    """Runs `num_steps` steps between `train_loop_begin` and `train_loop_end`."""
    self._loop_steps = num_steps
    return super().train(num_steps)

  def train_loop_end(self) -> Logs:
    """Runs in Python after each training loop; returns the logs to report.

    Raises `RunFailed` if the loop's mean training loss is NaN or infinite:
    a step of the loop had such a loss (or the losses' sum overflowed). The
    message names the loop's steps; the check costs no op in the step (one
    in the step made digits_convnet's steps 1.5 to 6 % slower:
    `benchmarks/loop_costs.py`).
    Returns training metrics, `training_loss`, and the learning rate: under
    `learning_rate` for one optimizer, under `learning_rate/<name>` for each
    optimizer of a composite one (an optimizer with an `optimizers` list or
    dict). Values stay tensors: the controller reads them once per loop.

    The reads and resets run as one `tf.function` (`read_train_logs`, traced
    at the second loop end, off the path to the first progress line): run
    eagerly, each metric read, reset and learning rate schedule is a string
    of small ops, about 4 ms of host time a loop on digits_convnet against
    0.5 ms traced (benchmarks/RESULTS.md).
    """
    self.join()
    self._loop_ends += 1
    if self._loop_ends == 2:
      self._read_train_logs = self._traced_read_train_logs()
    logs = self._read_train_logs()
    loss = logs.get(self.train_loss.name)
    if loss is not None and not math.isfinite(float(loss)):
      raise RunFailed(self._nonfinite_loss_message())
    return logs

  def _nonfinite_loss_message(self) -> str:
    last = int(self.global_step.numpy())
    steps = int(self._loop_steps) if self._loop_steps is not None else 1
    if steps == 1:
      return f"The training loss is not finite (NaN or inf) at step {last}."
    same_batches = ("a resumed run reads the same batches" if
                    self._host_input else "this run's input position is not "
                    "in its checkpoints, so a resumed run may read other "
                    "batches")
    return (f"The training loss is not finite (NaN or inf) in steps "
            f"{last - steps + 1}-{last} (one loop). To find the step, resume "
            f"from the last checkpoint with "
            f"--params_override=trainer.steps_per_loop=1 ({same_batches}).")

  def _traced_read_train_logs(self):
    """`read_train_logs` as a graph, or as it is if it cannot be traced."""
    if self._coordinator:  # A parameter server's coordinator stays eager.
      return self.read_train_logs
    read = tf.function(self.read_train_logs, autograph=False)
    try:
      read.get_concrete_function()  # Traces; runs nothing.
    except Exception as e:  # pylint: disable=broad-except
      # Python logic on tensor values, say: eager still runs it, and a real
      # bug raises there with its own traceback.
      logging.warning("read_train_logs cannot be traced (%s: %s); it runs "
                      "eagerly.", type(e).__name__, e)
      return self.read_train_logs
    return read

  def read_train_logs(self) -> Logs:
    """Returns the training metrics and learning rates; resets the metrics.

    `train_loop_end` runs it as a graph from the second loop on (eagerly
    under a parameter server's coordinator, or if it cannot be traced).
    """
    logs = {}
    for metric in self.train_metrics + [self.train_loss]:
      logs[metric.name] = metric.result()
      metric.reset_states()
    logs.update(self.learning_rates())
    return logs

  def learning_rates(self) -> Logs:
    """Returns the current learning rate of every optimizer, by stable name."""
    named = named_optimizers(self.optimizer)
    if len(named) == 1:
      return {"learning_rate": _current_learning_rate(
          next(iter(named.values())), self.global_step)}
    return {f"learning_rate/{name}": _current_learning_rate(opt,
                                                            self.global_step)
            for name, opt in named.items()}

  # -- Evaluation hooks -----------------------------------------------------

  def eval_begin(self):
    """Runs in Python before each evaluation: resets metrics, swaps in EMA."""
    super().eval_begin()

  def next_eval_inputs(self, iterator) -> Tuple[Any, Logs]:
    """Returns `(inputs, passthrough_logs)` for one evaluation step.

    `passthrough_logs` stay on the host (they never reach the accelerator) and
    are merged into the step's logs, which `eval_reduce` then receives. On a
    key clash the model's value wins and a warning is logged.
    """
    return next(iterator), {}

  def eval_step(self, iterator) -> Logs:
    """Runs one evaluation step; returns the model's logs plus passthrough."""

    def step_fn(inputs):
      logs = self.task.validation_step(
          inputs, model=self.model, metrics=self.validation_metrics)
      if self.task.loss in logs:
        self.validation_loss.update_state(logs[self.task.loss])
      return logs

    inputs, passthrough_logs = self.next_eval_inputs(iterator)
    outputs = self.strategy.run(step_fn, args=(inputs,))
    logs = tf.nest.map_structure(self.strategy.experimental_local_results,
                                 outputs)
    clash = sorted(set(logs) & set(passthrough_logs))
    if clash:
      logging.warning(
          "Passthrough logs %s clash with the model's logs; the model's values "
          "are kept.", clash)
    return {**passthrough_logs, **logs}

  def eval_reduce(self, state=None, step_outputs=None):
    """Folds one step's logs into the running state (`task.aggregate_logs`)."""
    return self.task.aggregate_logs(state, step_outputs)

  def eval_end(self, aggregated_logs=None) -> Logs:
    """Runs after each evaluation; returns the evaluation logs.

    In order: metric results and `validation_loss`; the task's
    `reduce_aggregated_logs`; the best-checkpoint exporter (which sees the
    EMA weights when the optimizer averages); then the EMA swap back to the
    training weights.
    """
    self.join()
    logs = {metric.name: metric.result() for metric in self.validation_metrics}
    if self.validation_loss.count.numpy() != 0:
      logs[self.validation_loss.name] = self.validation_loss.result()
    if aggregated_logs:
      logs.update(self.task.reduce_aggregated_logs(
          aggregated_logs, global_step=self.global_step))
    if self.checkpoint_exporter:
      self.checkpoint_exporter.maybe_export_checkpoint(
          self.checkpoint, logs, self.global_step.numpy())
      metric_name = self.config.trainer.best_checkpoint_eval_metric
      logs["best_" + metric_name.replace("|", "/")] = (
          train_utils.get_leaf_nested_dict(
              self.checkpoint_exporter.best_ckpt_logs, metric_name.split("|")))
    if isinstance(self.optimizer, optimization.ExponentialMovingAverage):
      self.optimizer.swap_weights()
    return logs


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


def unsaveable_reason(iterator) -> Optional[str]:
  """Why `iterator`'s state cannot be checkpointed, or None if it can.

  A pipeline with stateful ops (`tf.image.random_*`,
  `sample_distorted_bounding_box`) cannot be saved; finding out now, while
  the iterator holds nothing, costs one small write instead of a failure at
  the first checkpoint.
  """
  with tempfile.TemporaryDirectory() as probe:
    try:
      tf.train.Checkpoint(iterator=iterator).write(
          os.path.join(probe, "probe"))
    except tf.errors.OpError as e:
      return e.message.splitlines()[0]
  return None


def input_threads(runtime, strategy: tf.distribute.Strategy) -> int:
  """Threads of the tf.data pool private to this run's datasets; 0: tf.data's.

  `runtime.dataset_num_private_threads` when set (TFM declares the field but
  its trainer ignores it). Unset, a run whose replicas are all on CPUs gives
  its input half the cores: the model's ops already use every core, and
  tf.data's own pool of one thread per core makes the two contend
  (digits_convnet on 2 cores: 1.14x-1.15x the examples/s of tf.data's pool,
  `benchmarks/RESULTS.md`; 2 threads were no faster than tf.data's pool).
  With a GPU or TPU the input has the cores to itself: tf.data's pool.
  """
  if runtime.dataset_num_private_threads is not None:
    return runtime.dataset_num_private_threads
  if all("CPU" in device.upper() for device in local_devices(strategy)):
    return max(1, usable_cores() // 2)
  return 0


def usable_cores() -> int:
  """The cores this process may run on (its affinity, where the OS has one)."""
  if hasattr(os, "sched_getaffinity"):  # Not on macOS.
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def with_input_threads(dataset: tf.data.Dataset,
                       threads: int) -> tf.data.Dataset:
  """`dataset` with a private pool of `threads` threads (0: as it is).

  A pipeline that sizes its own pool keeps it. The pool changes neither the
  order of the data (tf.data stays deterministic) nor the iterator's
  checkpoint: checkpoints restore across thread counts.
  """
  if not threads or dataset.options().threading.private_threadpool_size:
    return dataset
  options = tf.data.Options()
  options.threading.private_threadpool_size = threads
  return dataset.with_options(options)


def host_input_supported(strategy: tf.distribute.Strategy) -> bool:
  """Whether training input can come from one host iterator per worker.

  A `tf.distribute` iterator cannot be checkpointed; a plain tf.data one
  can, so with `checkpoint_input_iterator` each worker reads its shard
  through a plain iterator and splits batches across its replicas. TPU and
  parameter-server strategies need their distributed iterators.
  """
  return not isinstance(strategy, (
      tf.distribute.TPUStrategy,
      tf.distribute.experimental.ParameterServerStrategy))


def local_devices(strategy: tf.distribute.Strategy) -> Sequence[str]:
  """The devices of this worker's replicas; with no strategy, the one in use."""
  try:
    return strategy.extended.worker_devices
  except RuntimeError:  # The default strategy (distribution_strategy=off).
    gpus = tf.config.list_logical_devices("GPU")
    return [(gpus or tf.config.list_logical_devices("CPU"))[0].name]


def _fingerprint(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True, default=str)
                        .encode()).hexdigest()[:12]


def host_input_context(strategy: tf.distribute.Strategy
                       ) -> tf.distribute.InputContext:
  """The `InputContext` of this worker's host pipeline: one batch per worker.

  The host pipeline (the iterator in the checkpoint) yields one batch for all
  of this worker's replicas, which `split_across_replicas` then slices. So
  its context counts input pipelines (workers) as its replicas:
  `get_per_replica_batch_size(global)` is `global / num_workers`, and TFM's
  `InputReader` shards the files by worker. With the strategy's own replica
  count each replica would train on `global / num_replicas / local_replicas`
  rows.
  """
  workers, worker_index = worker_layout(strategy)
  return tf.distribute.InputContext(num_input_pipelines=workers,
                                    input_pipeline_id=worker_index,
                                    num_replicas_in_sync=workers)


def worker_layout(strategy: tf.distribute.Strategy) -> Tuple[int, int]:
  """`(number of workers, this worker's index among them)`.

  The index is TensorFlow's id in the cluster (a `chief` task is 0 and the
  workers follow), as `MultiWorkerMirroredStrategy` numbers input pipelines.
  """
  local = len(local_devices(strategy))
  workers = max(strategy.num_replicas_in_sync // local, 1)
  resolver = getattr(strategy, "cluster_resolver", None)
  if workers == 1 or resolver is None or not resolver.cluster_spec().jobs:
    return workers, 0
  return workers, multi_worker_util.id_in_cluster(
      resolver.cluster_spec(), resolver.task_type, resolver.task_id)


def split_across_replicas(inputs, strategy: tf.distribute.Strategy):
  """Gives each of this worker's replicas its slice of the worker's batch.

  `inputs` is one host batch of `global / num_workers` rows
  (`host_input_context`); replica i of this worker gets rows
  `[i * n, (i + 1) * n)` with `n = rows // local_replicas`. With one local
  replica the batch is returned as it is.
  """
  replicas = len(local_devices(strategy))
  if replicas == 1:
    return inputs

  def replica_slice(ctx):
    index = ctx.replica_id_in_sync_group % replicas

    def take(t):
      size = tf.shape(t)[0] // replicas
      return t[index * size:(index + 1) * size]

    return tf.nest.map_structure(take, inputs)

  return strategy.experimental_distribute_values_from_function(replica_slice)


def xla_scope(devices: Sequence[str]) -> Optional[str]:
  """Says what XLA can compile on `devices`, or None if nothing.

  A task step applies gradients, which synchronizes replicas. TensorFlow lets
  a compiled function synchronize only on GPUs (TFM's case): there each
  replica's task step is compiled ("task_step"). On a single device (CPU
  included) the whole `strategy.run` is compiled, so the synchronization
  happens inside the compiled function ("replicated_step").
  """
  if all("GPU" in d.upper() for d in devices):
    return "task_step"
  if len(devices) == 1:
    return "replicated_step"
  return None


def xla_unsupported_message(devices: Sequence[str]) -> str:
  return (f"runtime.enable_xla=true cannot compile a step replicated over "
          f"{len(devices)} non-GPU devices {list(devices)}: TensorFlow "
          "compiles replica synchronization only on GPUs. Use one device or "
          "set runtime.enable_xla=false.")


def named_optimizers(optimizer) -> Mapping[str, Any]:
  """Returns `{name: optimizer}`; a composite optimizer yields its parts.

  A composite optimizer (TFRS's `CompositeOptimizer`, the RankingTrainer case)
  exposes `optimizers` as a list or a dict. List entries are named
  `<index>_<ClassName>`, which stays the same from run to run.
  """
  parts = getattr(optimizer, "optimizers", None)
  if hasattr(parts, "items"):  # A dict, or tf.Module's tracking wrapper of one.
    return dict(parts.items())
  if isinstance(parts, (list, tuple)) and parts:
    return {f"{i}_{type(opt).__name__}": opt for i, opt in enumerate(parts)}
  return {"": optimizer}


def _current_learning_rate(optimizer, global_step: tf.Variable) -> Optional[Any]:
  lr = optimizer.learning_rate
  if callable(lr):
    step = getattr(optimizer, "iterations", None)
    return lr(global_step if step is None else step)
  return lr
