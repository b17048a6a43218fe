"""The run's checkpoint manager, built before anything that needs it.

TFM's `OrbitExperimentRunner` builds it after the actions that need it;
here it is built right after the trainer, as TFM would build it (the
trainer's checkpoint, `max_to_keep`, `checkpoint_interval`, the trainer's
`initialize` as `init_fn`), with three changes: the start restores
before it, as it checks the checkpoint (`StartRestore`), and its first
`restore_or_initialize` takes that restore; its first save comes
`checkpoint_interval` steps after the step it starts at
(`count_interval_from`); and an evaluator's restores expect to leave the
optimizer's values unread (`PartialRestoreCheckpoint`).

Every save is the run's `save` phase (`tfm_ext.base.failures`). A training
chief's manager is fenced by its lease (`tfm_ext.model_dir.lease`): `before_save`
proves the lease before a save starts, before its files take their
`ckpt-<step>` names (a synchronous save writes them under a name of its
own first, `ckpt-<step>_fenced<token>`), before the state file is
rewritten and before old checkpoints are deleted. A trainer stopped in
the middle of a save, whose lease another took meanwhile, finishes writing
its own files when it wakes, then raises, and never puts them under a name
the new holder uses: it deletes them (the next start deletes those of a
save that was killed).

With `--enable_async_checkpointing` TFM hands Orbit's controller the option,
and only the controller's saves are asynchronous; here every save of the
manager is (`AsyncSavingManager`), so none races another.

A save's sweep past `max_to_keep` keeps what a live evaluator has not
evaluated yet, bounded (`tfm_ext.model_dir.retention`). The lease's holder, at its
manager's build, deletes what a save that did not finish left: the fenced
saves' `*_fenced*` files and TensorFlow's own `ckpt-<step>_temp` folder (a
killed asynchronous save's); a save of the same process still in flight is
waited for first.
"""

import collections
import contextlib
import copy
import os
import secrets
from typing import Callable, Optional, Set
import weakref

from absl import logging
import tensorflow as tf

from tensorflow.python.checkpoint import checkpoint as checkpoint_lib  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import constants as trackable_utils  # pylint: disable=g-direct-tensorflow-import

from tfm_ext.model_dir import files
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import retention
from tfm_ext.base import failures


# A manager whose start did not restore: its first `restore_or_initialize`
# restores the latest, as TF's.
NOT_STARTED = "<not started>"


def managed_checkpoint(trainer, *, evaluates_only: bool
                       ) -> Optional[tf.train.Checkpoint]:
  """What a run restores and saves of `trainer`: `trainer.checkpoint`.

  An evaluator's is a `PartialRestoreCheckpoint` around it: it builds no
  optimizer slots and no training iterator, the checkpoint's values for
  them stay unread on purpose, and without expect_partial TensorFlow logs
  about 20 warnings at exit.
  """
  checkpoint = trainer.checkpoint
  if checkpoint is not None and evaluates_only:
    checkpoint = PartialRestoreCheckpoint(root=checkpoint)
  return checkpoint


class StartRestore:
  """The start's restore, which is also its check (`checkpoint_state.repair`).

  Called with a checkpoint's path, it restores `checkpoint` from it under
  `strategy`'s scope (every worker of a multi-worker run restores, in the
  same order: filling a variable is a collective) and returns the names of
  the tensors it read. In a training run a Keras optimizer's slots are
  created as they are restored, and so read once. TensorFlow defers the
  values of objects that do not exist yet (a layer not built, the
  optimizer's step and hyperparameters, an input iterator until the first
  loop): `repair` reads those back, and TensorFlow reads them again when
  it creates them.
  A restore that fails is followed by the next one's, whose values win
  (TensorFlow fills a deferred value from the newest restore that has one).
  """

  def __init__(self, checkpoint: tf.train.Checkpoint,
               strategy: tf.distribute.Strategy, *, trains: bool):
    self._checkpoint = checkpoint
    self._strategy = strategy
    self._trains = trains
    self.status = None  # The last restore's, for `expect_partial`.

  def __call__(self, path: str) -> Set[str]:
    # In the default strategy's scope TensorFlow defers the slots of an
    # optimizer built outside any: to the first step of a training run,
    # which reads them again then; forever for an evaluator, which then
    # holds none (another strategy's optimizer creates them either way).
    scope = (contextlib.nullcontext()
             if self._trains and self._strategy is tf.distribute.get_strategy()
             else self._strategy.scope())
    try:
      with failures.phase("restore", path), scope:
        self.status = self._checkpoint.restore(path)
    except Exception as e:
      # Partial on purpose: no warning of each value it did not restore.
      failures.forget_failed_restore(e)
      raise
    return tensors_read(self.status)


def tensors_read(status) -> Set[str]:
  """The checkpoint's tensors that the restore of `status` has read.

  Those of the objects it matched, but their attributes it left unused,
  and the object graph; an object created later is restored later. A
  tensor is named by its attribute's key, or by the key and a suffix the
  object gives it (an input iterator's `ITERATOR_STATE`).
  """
  # pylint: disable=protected-access
  coordinator = getattr(status, "_checkpoint", None)
  graph = getattr(coordinator, "object_graph_proto", None)
  if graph is None:
    return set()  # Not an object-based restore: all is read back.
  keys = collections.defaultdict(list)  # Object path -> its read keys.
  for node_id, node in enumerate(graph.nodes):
    if node_id not in coordinator.matched_proto_ids:
      continue
    unused = coordinator.unused_attributes.get(node_id, ())
    for attribute in node.attributes:
      if attribute.name not in unused:
        key = attribute.checkpoint_key
        keys[key.partition(_ATTRIBUTES)[0]].append(key)
  return {trackable_utils.OBJECT_GRAPH_PROTO_KEY} | {
      name for name in coordinator.dtype_map
      if any(name.startswith(key)
             for key in keys.get(name.partition(_ATTRIBUTES)[0], ()))}


_ATTRIBUTES = "/.ATTRIBUTES/"


def build_manager(trainer, directory: str, trainer_config, *,
                  evaluates_only: bool, init_fn: Optional[Callable[[], None]],
                  max_to_keep: int, enable_async: bool = False,
                  before_save: Optional[Callable[[], None]] = None,
                  records_unwatched: bool = False,
                  checkpoint: Optional[tf.train.Checkpoint] = None,
                  started_from: Optional[str] = NOT_STARTED
                  ) -> Optional[tf.train.CheckpointManager]:
  """The manager of `trainer.checkpoint` in `directory`; None without one.

  A `FencedManager`, an `AsyncSavingManager` with `enable_async`; fenced by
  `before_save` when given (see the module docstring); with
  `records_unwatched`, what it rotates away while no evaluator is present
  is recorded in the ledger as missing (`tfm_ext.model_dir.retention`).
  `checkpoint`: what it saves and restores, `managed_checkpoint`'s by
  default. `started_from`: the checkpoint the start restored
  (`StartRestore`), or None for none; its first `restore_or_initialize`
  reads nothing then. Left `NOT_STARTED`, that one restores the latest
  the state file names, as TF's.
  """
  fenced = before_save is not None
  if checkpoint is None:
    checkpoint = managed_checkpoint(trainer, evaluates_only=evaluates_only)
  if checkpoint is None:
    return None
  manager_cls = AsyncSavingManager if enable_async else FencedManager
  manager = manager_cls(
      checkpoint, directory=directory, max_to_keep=max_to_keep,
      step_counter=trainer.global_step,
      checkpoint_interval=trainer_config.checkpoint_interval,
      init_fn=init_fn)
  manager.records_unwatched = records_unwatched
  manager.started_from = started_from
  if fenced:
    # pylint: disable=protected-access
    manager.before_save = before_save
    manager._checkpoint = _WrittenAside(manager._checkpoint, before_save)
    clear_aside(directory)
  _managers.add(manager)
  return manager


# What a fenced save writes before its files take their names, and what
# TensorFlow's writes before the merge that names them (`<prefix>_temp/`).
_ASIDE = "_fenced"
_TEMP = f"{checkpoint_state.PREFIX}-*_temp*"
# This process's managers: a save of theirs may be in flight (an
# asynchronous one, across an in-process restart).
_managers = weakref.WeakSet()


def clear_aside(directory: str) -> None:
  """Deletes what saves in `directory` that did not finish left there.

  Called by the lease's holder, the one process that saves there, before
  its manager's first save. Waits first for the saves of this process's
  other managers of `directory`: those are not left over.
  """
  for manager in list(_managers):
    if manager.directory == directory:
      manager.sync()
  for pattern in (f"*{_ASIDE}*", _TEMP):
    for path in _delete(os.path.join(directory, pattern)):
      logging.warning("Deleted %s, left by a save that did not finish.", path)


def _delete(pattern: str):
  """Deletes what matches `pattern` (TF's `<prefix>_temp/` folders too)."""
  paths = tf.io.gfile.glob(pattern)
  for path in paths:
    try:
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
      pass  # Under a folder deleted before it (an object store lists both).
  return paths


class _WrittenAside:
  """A checkpoint whose synchronous writes go aside, then into place."""

  def __init__(self, checkpoint: tf.train.Checkpoint,
               before_save: Callable[[], None]):
    self._checkpoint = checkpoint
    self._before_save = before_save
    self._token = secrets.token_hex(4)

  def __getattr__(self, name):
    return getattr(self._checkpoint, name)

  def _write(self, file_prefix, options=None):
    if options is not None and options.experimental_enable_async_checkpoint:
      return self._checkpoint._write(file_prefix, options=options)  # pylint: disable=protected-access
    # The manager records and sweeps in a write callback: once in place.
    options = copy.copy(options or tf.train.CheckpointOptions())
    callbacks = options.experimental_write_callbacks or []
    options.experimental_write_callbacks = None
    aside = f"{file_prefix}{_ASIDE}{self._token}"
    self._checkpoint._write(aside, options=options)  # pylint: disable=protected-access
    try:
      self._before_save()
    except BaseException:
      _delete(aside + "*")  # The lease was lost as they were written.
      raise
    for path in tf.io.gfile.glob(aside + ".*"):
      tf.io.gfile.rename(path, file_prefix + path[len(aside):],
                         overwrite=True)
    checkpoint_lib._execute_callbacks(callbacks, file_prefix)  # pylint: disable=protected-access
    return file_prefix


def count_interval_from(manager: Optional[tf.train.CheckpointManager],
                        step: int) -> None:
  """The first save of `manager` comes `checkpoint_interval` after `step`.

  A `CheckpointManager` that restored a checkpoint counts the interval from
  it; one that found none saves at its first check, after the first loop
  (stock TFM writes `ckpt-<steps_per_loop>`; our first loop is one step):
  an untrained model's checkpoint that costs a full save
  (benchmarks/RESULTS.md#default-no-first-loop-checkpoint), holds one of
  `max_to_keep`'s places and is a full evaluation for an evaluator beside
  training. Every worker of a multi-worker run counts from the step it
  starts at, so all save at the same steps.

  This is the one place that sets a private attribute of a TF object: TF's
  constructor cannot express "last saved at step 0" (it reads
  `last_checkpoint_step or None`). The SMOKE and compat launcher tests,
  which count the checkpoints a run leaves, fail if TF renames it.
  """
  # pylint: disable=protected-access
  if (manager is not None and manager._checkpoint_interval is not None
      and manager._last_checkpoint_step is None):
    manager._last_checkpoint_step = step


class PartialRestoreCheckpoint(tf.train.Checkpoint):
  """A checkpoint whose restores expect to leave saved values unread.

  Each restore reads the checkpoint it names, and only that one. A
  `tf.train.Checkpoint(root=...)` creates its save counter after its first
  restore that succeeds and fills it from the first restore it ever began
  (TF's `_maybe_create_save_counter` takes `restore[0]`): when that one had
  failed (a checkpoint rotated away while it was read), the next restore
  raised NotFound naming the earlier checkpoint, and the later one was
  recorded unreadable (issue 34). Here the counter exists from the start,
  and each restore's deferred value for the root's (never created) save
  counter is dropped with it.
  """

  def __init__(self, root):
    super().__init__(root=root)
    self._maybe_create_save_counter()

  def restore(self, save_path, options=None):
    try:
      return super().restore(save_path, options).expect_partial()
    finally:
      # pylint: disable-next=protected-access
      self.root._deferred_dependencies.pop("save_counter", None)


class FencedManager(tf.train.CheckpointManager):
  """A manager whose saves are phase `save`, fenced by `before_save`."""

  before_save: Callable[[], None] = staticmethod(lambda: None)
  # Records what it rotates away unevaluated while no evaluator is present
  # (a `train` job's, which a continuous_eval may join later).
  records_unwatched: bool = False
  # What the start restored (see `restore_or_initialize`).
  started_from: Optional[str] = NOT_STARTED
  _retention: Optional[retention.Retention] = None

  def restore_or_initialize(self):
    """TF's; the first call, the controller's, takes what the start did.

    The start restored `started_from` (`StartRestore`) as it checked it, so
    nothing is read again, and a checkpoint another job saved since (a
    trainer beside an `eval`) is not taken: it was never checked. A start
    that found no checkpoint initializes (`init_fn`), as TF's. Later calls
    (a divergence rollback) restore the latest, as TF's do.
    """
    # pylint: disable=protected-access
    started_from, self.started_from = self.started_from, NOT_STARTED
    if started_from == NOT_STARTED:
      return super().restore_or_initialize()
    if started_from is None:
      if self._init_fn is not None:
        self._init_fn()
      return None
    if self._checkpoint_interval is not None:
      self._last_checkpoint_step = int(self._step_counter.numpy())
    return started_from

  def save(self, checkpoint_number=None, check_interval=True, options=None):
    with failures.phase("save", self.directory):
      if self._should_save(check_interval):
        self.before_save()
      return super().save(checkpoint_number=checkpoint_number,
                          check_interval=check_interval, options=options)

  def _record_state(self):
    self.before_save()
    super()._record_state()

  def _sweep(self):
    """TF's sweep, but what a live evaluator waits for stays (`retention`)."""
    self.before_save()
    # pylint: disable=protected-access
    if not self._max_to_keep:
      super()._sweep()
      return
    if self._retention is None:
      self._retention = retention.Retention(
          self.directory, self._max_to_keep,
          records_unwatched=self.records_unwatched)
    # Never another directory's files, whatever a state file said.
    kept = [path for path in self._maybe_delete
            if not files.in_directory(self.directory, path)]
    kept += self._retention.kept(
        [path for path in self._maybe_delete if path not in kept])
    managed = list(self._maybe_delete.items())
    for path in kept:
      del self._maybe_delete[path]
    super()._sweep()  # Deletes as TF would, of the rest.
    left = set(self._maybe_delete)
    self._maybe_delete.clear()
    self._maybe_delete.update((path, stamp) for path, stamp in managed
                              if path in left or path in kept)
    self._retention.record_deleted()

  def _should_save(self, check_interval: bool) -> bool:
    """Whether `save` will write: TF's own test, step against interval."""
    # pylint: disable=protected-access
    if self._checkpoint_interval is None or self._last_checkpoint_step is None:
      return True
    step = int(self._step_counter.numpy())
    last = self._last_checkpoint_step
    return step != last and not (
        check_interval and step < last + self._checkpoint_interval)


class AsyncSavingManager(FencedManager):
  """A manager whose saves are asynchronous unless the caller passes options.

  Orbit's controller passes asynchronous options to its saves; the other
  savers (the preemption save, TFM's actions) pass none. A synchronous save
  made while an asynchronous one is still being written runs beside it: the
  older one's write callback can then land last and record it as the latest
  checkpoint, so a resume would go back past the newer one. Asynchronous
  saves instead wait for the one in flight. `sync()` waits for the last.
  """

  def save(self, checkpoint_number=None, check_interval=True, options=None):
    return super().save(
        checkpoint_number=checkpoint_number, check_interval=check_interval,
        options=options or tf.train.CheckpointOptions(enable_async=True))
