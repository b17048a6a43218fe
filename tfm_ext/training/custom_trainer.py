"""`CustomTrainer`: TFM's `base_trainer.Trainer` with documented hooks.

Orbit drives the hooks. One `train_and_eval` run calls them in this order
(Python calls; inside `tf.function` the step-level hooks are traced once and
then run as a graph):

    for each loop of `steps_per_loop` steps:               # Orbit Controller
      train_loop_begin()
      repeat steps_per_loop times, or until a signal:      # tf.while_loop
        train_step(iterator)
          inputs = next_train_inputs(iterator)
          strategy.run(replica_step)     # task.train_step; XLA if configured
      logs = train_loop_end()            # -> train actions (tfm_ext.actions)
      every validation_interval steps:
        eval_begin()
        for each eval batch:
          logs = eval_step(iterator)
            inputs, passthrough = next_eval_inputs(iterator)
            logs = passthrough | strategy.run(task.validation_step)
          state = eval_reduce(state, logs)                 # task.aggregate_logs
        no batch read: raise EmptyEvaluation             # tfm_ext.training.eval_count
        logs = eval_end(state)             # -> eval actions (tfm_ext.actions)

The loop itself is Orbit's, its condition also reading the stop variable
a signal sets (`tfm_ext.run.preemption.stop_within_a_step`): a subclass
that overrides `create_train_loop_fn` stops only at its loop's end.

Override any hook in a subclass and register it with
`@tfm_ext.register_trainer("name")`; select it with `--trainer=name`. State
of the subclass's own (a `tf.Variable`) joins the checkpoint through
`add_to_checkpoint`. The
hooks are for model logic; what runs around it (progress, checks, exports,
notifications) is an action (`tfm_ext.register_action`).
"""

from typing import Any, Dict, Tuple

from absl import logging
import orbit
import tensorflow as tf

from official.core import base_trainer
from official.core import train_utils
from official.modeling import optimization

from tfm_ext.base import console
from tfm_ext.training import input_files
from tfm_ext.base import devices
from tfm_ext.training import determinism
from tfm_ext.training import eval_count
from tfm_ext.training import inputs
from tfm_ext.training import optimizers

Logs = Dict[str, Any]


class CustomTrainer(base_trainer.Trainer):
  """A `base_trainer.Trainer` whose loop pieces are public, documented hooks.

  Differences from TFM's `Trainer`:
    * With `trainer.checkpoint_input_iterator` (the default) the training
      input iterator is in the checkpoint: a resumed run reads exactly the
      batches an uninterrupted one would; so are the random generators of
      Keras layers, when they use them (deterministic mode).
    * `runtime.enable_xla` compiles the train step with GPUs, as TFM does;
      `runtime.xla_on_cpu` compiles it on one CPU device too
      (`devices.xla_scope`).
    * `train_loop_end` reports the learning rate of every optimizer when the
      model trains with several (`learning_rate/<name>`).
    * It creates the optimizer's slots before the first loop, where Keras
      creates them inside the loop's first trace: the loop is traced once,
      not twice (`optimizers.create_weights`).
    * `eval_end` reads `best_<metric>` through TFM's `|`-nested metric names.
    * Its datasets get a private tf.data pool of `input_threads` threads:
      `runtime.dataset_num_private_threads` (TFM declares the field and
      ignores it), or when unset half the cores on a run whose replicas are
      CPUs, where the input shares the cores with the model
      (`inputs.input_threads`).
    * Before it builds them, it checks the TFRecord files they read
      (`tfm_ext.training.input_files`: a file cut short is exit 3 naming
      it, where TensorFlow would read part of it without a word), and an
      evaluation
      that reads no batch raises `tfm_ext.training.eval_count.EmptyEvaluation`
      instead of reporting metrics over nothing (`eval_count.watch`).
  """

  def __init__(self, config, task, model, optimizer, train=True,
               evaluate=True, train_dataset=None, **kwargs):
    strategy = tf.distribute.get_strategy()
    input_files.check_framing(config, trains=train, evaluates=evaluate)
    self.input_threads = inputs.input_threads(
        config.runtime, devices.local_devices(strategy))
    host_iterator = None
    if (train and train_dataset is None
        and getattr(config.trainer, "checkpoint_input_iterator", False)):
      train_dataset, host_iterator = inputs.host_pipeline(
          task, config.task.train_data, strategy, self.input_threads)
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
          inputs.fingerprint(config.task.train_data.as_dict()):
              self._train_iter}
    generators = determinism.random_generators(model)
    if generators:
      extra["random_generators"] = generators
    self._checkpoint_items = dict(
        global_step=self.global_step, model=self.model,
        optimizer=self.optimizer,
        **getattr(model, "checkpoint_items", {}))
    if extra:
      self.add_to_checkpoint(**extra)
    self._read_train_logs = self.read_train_logs  # Traced later.
    self.eval_ticker = console.EvalTicker(total=config.trainer.validation_steps)
    self._loop_ends = 0
    self._task_train_step, self._run_replicas = devices.xla_compiled(
        config.runtime, devices.local_devices(self.strategy),
        task_step=task.train_step,
        replicated_step=self._run_replicas_eagerly_or_traced)
    if evaluate:
      eval_count.watch(self)
    self._after_first_loop = lambda: None
    if train and type(self).replica_step is CustomTrainer.replica_step:
      # The task's step updates the model's trainable variables: the first
      # loop is then traced once, not twice (`create_weights`). A model
      # built at its first call (a Sequential without an input shape) has
      # none yet, and Keras raises for them: its slots are then made in the
      # first trace, as before.
      try:
        variables = self.model.trainable_variables
      except ValueError:
        variables = []
      if variables:
        self._after_first_loop = optimizers.create_weights(self.optimizer,
                                                           variables)

  def distribute_dataset(self, dataset_or_fn, *args, **kwargs):
    """TFM's `distribute_dataset`, the datasets given `input_threads`."""
    if isinstance(dataset_or_fn, tf.data.Dataset):
      return super().distribute_dataset(
          inputs.with_input_threads(dataset_or_fn, self.input_threads),
          *args, **kwargs)
    input_options = kwargs.pop("input_options", None)  # Orbit's, not the fn's.
    return super().distribute_dataset(
        inputs.threaded_dataset_fn(dataset_or_fn, self.input_threads,
                                   *args, **kwargs),
        input_options=input_options)

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

    batch = self.next_train_inputs(iterator)
    if self._host_input:
      batch = inputs.split_across_replicas(batch, self.strategy)
    self._run_replicas(batch)

  @property
  def checkpoints_input_iterator(self) -> bool:
    """Whether checkpoints hold the training input iterator's position."""
    return self._host_input

  def replica_step(self, inputs) -> Logs:
    """Runs on each replica: one step on its share of the batch; returns logs.

    The default is the task's `train_step` (compiled with XLA where
    configured). Override it to replace the whole step (two optimizers, a
    GAN's two updates, a counter of your own); the trainer then adds
    `logs[task.loss]` to `training_loss` and counts the step. Overridden,
    the optimizer's slots are made in the loop's first trace, as Keras makes
    them (the default's are made before: `optimizers.create_weights`).
    """
    return self._task_train_step(inputs, model=self.model,
                                 optimizer=self.optimizer,
                                 metrics=self.train_metrics)

  def add_to_checkpoint(self, **items) -> None:
    """Saves and restores `items` (variables, modules) with the checkpoint.

    Call it in a subclass's `__init__`, after `super().__init__()`: the
    checkpoint manager is built after the trainer, so the items are saved
    with every checkpoint and restored on resume, under these names.
    """
    self._checkpoint_items.update(items)
    self._checkpoint = tf.train.Checkpoint(**self._checkpoint_items)

  def _run_replicas_eagerly_or_traced(self, inputs):
    def step_fn(inputs):
      logs = self.replica_step(inputs)
      self.train_loss.update_state(logs[self.task.loss])
      self.global_step.assign_add(1)

    self.strategy.run(step_fn, args=(inputs,), options=self._runtime_options)

  def train_loop_end(self) -> Logs:
    """Runs in Python after each training loop; returns the logs to report.

    Returns training metrics, `training_loss`, and the learning rate: under
    `learning_rate` for one optimizer, under `learning_rate/<name>` for each
    optimizer of a composite one (an optimizer with an `optimizers` list or
    dict). Values stay tensors: the controller reads them once per loop.
    The train actions then see them (`tfm_ext.actions`: a diverged loss
    is recovered from or fails the run there, before the loop is saved).

    The reads and resets run as one `tf.function` (`read_train_logs`, traced
    at the second loop end, off the path to the first progress line): run
    eagerly, each is a string of small ops on the host
    (benchmarks/RESULTS.md#default-traced-train-logs).
    """
    self.join()
    self._loop_ends += 1
    if self._loop_ends == 1:
      self._after_first_loop()
    if self._loop_ends == 2 and not self._coordinator:
      # A parameter server's coordinator stays eager.
      self._read_train_logs = devices.traced_or_eager(self.read_train_logs)
    return self._read_train_logs()

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
    named = optimizers.named_optimizers(self.optimizer)
    if len(named) == 1:
      return {"learning_rate": optimizers.current_learning_rate(
          next(iter(named.values())), self.global_step)}
    return {f"learning_rate/{name}": optimizers.current_learning_rate(
        opt, self.global_step) for name, opt in named.items()}

  # -- Evaluation hooks -----------------------------------------------------

  def eval_begin(self):
    """Runs in Python before each evaluation: resets metrics, swaps in EMA.

    TFM's `eval_begin` but for the swap, which works without a strategy
    too (`optimizers.swap_ema_weights`).
    """
    for metric in self.validation_metrics + [self.validation_loss]:
      metric.reset_states()
    if isinstance(self.optimizer, optimization.ExponentialMovingAverage):
      optimizers.swap_ema_weights(self.optimizer)
    self.eval_ticker.begin(int(self.global_step.numpy()))

  def create_eval_loop_fn(self, has_state: bool):
    """Orbit's evaluation loop; run from Python, it ticks `eval_ticker`.

    So a long evaluation prints a line with its ETA every few seconds
    (`console.EvalTicker`). With `trainer.eval_tf_while_loop` the loop is one
    graph, Orbit's, and prints nothing until it ends.
    """
    if self._eval_options.use_tf_while_loop:
      return super().create_eval_loop_fn(has_state)
    step = self.eval_step
    if self._eval_options.use_tf_function:
      step = tf.function(step)

    def ticking_step(iterator):
      outputs = step(iterator)
      self.eval_ticker.tick()
      return outputs

    return orbit.utils.create_loop_fn(ticking_step)

  def next_eval_inputs(self, iterator) -> Tuple[Any, Logs]:
    """Returns `(inputs, passthrough_logs)` for one evaluation step.

    `passthrough_logs` stay on the host (they never reach the accelerator) and
    are merged into the step's logs, which `eval_reduce` then receives. On a
    key clash the model's value wins and a warning is logged.
    """
    return next(iterator), {}

  def eval_step(self, iterator) -> Logs:
    """Runs one evaluation step; returns the model's logs plus passthrough.

    TFM's `eval_step` but for its warning on a key clash, which names the
    model's keys as the passthrough's and the other way round.
    """

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

    TFM's `eval_end` but for the `best_<metric>` log, which TFM reads with
    the whole `|`-nested name as one key (a KeyError for "coco|AP") and
    which is read here through TFM's own nested lookup.

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
      optimizers.swap_ema_weights(self.optimizer)
    return logs
