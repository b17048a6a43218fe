"""Which checkpoint a run restores, and the state file that names it.

`tf.train.CheckpointManager` keeps its list of checkpoints in one small
text file, `model_dir/checkpoint`, and restores the one it names last. Left
to TensorFlow, a run whose state file is gone starts from scratch (its saves
then overwrite the old `ckpt-<step>` files and `max_to_keep` deletes the
rest), a damaged one raises, and a latest checkpoint that cannot be read (a
full disk cut it short, a power cut zeroed it) crashes every mode.

`repair(model_dir)` runs before the manager is built (`tfm_ext.run.assembly`), in
every mode, since evaluators restore through a manager too:

* it reads the state file itself: damage is a finding, not an exception;
* it reads the checkpoint the run would restore whole, so checksums catch
  zeroed or garbled data; if that one is unreadable it falls back to the
  newest readable one the file lists. In a run that read is the start's
  restore (`restore=`, `tfm_ext.model_dir.checkpointing.StartRestore`):
  the checkpoint checked is the one restored, by construction, and the
  start reads each tensor once: by the restore or, where TensorFlow defers
  it to the object's creation (a layer built at the first step), back by
  the check, since a restore alone would find that damage after training
  began (TensorFlow reads such a value again when it creates the object). An
  export checks cheaply here and reads what it exports itself
  (`tfm_ext.model_dir.export.restore`);
* a missing or damaged state file is rebuilt from the `ckpt-<step>.index`
  files, each checked cheaply (the index opens, the data files are there and
  hold at least the bytes of the numeric tensors), the newest read whole;
* it rewrites the file only then, as the manager writes it, and warns once,
  naming what it skipped and why;
* if there are checkpoints and none is readable it raises `UsageError`
  naming each, before anything is written.

A skipped checkpoint is never deleted or moved, nor listed (so `max_to_keep`
never deletes it); a run that reaches its step again saves over it. While
the state file reads, only the checkpoints it lists count for an
evaluator, as for TensorFlow: the files of a save still being written
beside it are not looked at. A training start (`trains`) also looks at
the `ckpt-<step>` files newer than the one the state file names (a state
file rolled back by hand, or a save killed after its files took their
names and before the file named them): the newest of them that reads
whole is restored instead, said in a warning naming both, since training
on from the older one would write over it. An evaluator after
training also looks at the files (`tfm_ext.run.continuous_eval`), and records
the skipped ones as unreadable.

Every file goes through `tf.io.gfile`, so `model_dir` may be a bucket.
"""

import os
import re
import time
from typing import Callable, List, Optional, Set, Tuple

from absl import logging
from google.protobuf import text_format
import tensorflow as tf

from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-direct-tensorflow-import

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files

STATE_FILE = "checkpoint"
# The checkpoint name of TFM's (and TensorFlow's) CheckpointManager.
PREFIX = "ckpt"
# Tensors read back per RestoreV2 call, so a large checkpoint is checked
# without holding all of it in memory.
_READ_BATCH_BYTES = 64 << 20
_LOOKS = 3
# What an eager op's error adds around its cause.
_OP_DECORATION = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]")
# `<prefix>.data-00000-of-00001`, not a temp file beside it.
_DATA_FILE = re.compile(r"\.data-\d+-of-\d+")


def step_of(path: str) -> int:
  """The step in a checkpoint's name: `.../ckpt-40` -> 40."""
  return int(path.rsplit("-", 1)[-1])


def read_state(model_dir: str) -> Tuple[Optional[List[str]], Optional[str]]:
  """The checkpoints the state file lists, oldest first, and what is wrong.

  Returns `(paths, None)` for a state file that reads (its latest last, each
  path `model_dir/<name>`), `(None, None)` when there is none, and
  `(None, why)` when it is damaged. Logs nothing and never raises for
  damage, unlike `tf.train.get_checkpoint_state`.
  """
  path = os.path.join(model_dir, STATE_FILE)
  try:
    text = files.read_text(path)
  except tf.errors.NotFoundError:
    return None, None
  except UnicodeDecodeError:
    return None, "it is not text"
  state = checkpoint_management.CheckpointState()
  try:
    text_format.Merge(text, state)  # As TensorFlow reads it.
  except text_format.ParseError as e:
    return None, f"it does not parse ({e})"
  if not state.model_checkpoint_path:
    return None, "it names no checkpoint"
  elsewhere = [p for p in [*state.all_model_checkpoint_paths,
                            state.model_checkpoint_path]
               if not files.in_directory(model_dir, p)]
  if elsewhere:
    # TensorFlow's manager would restore them, and delete them to keep
    # max_to_keep: the files of another run (a copied model_dir's state).
    return None, (f"it names {elsewhere[0]!r}, outside this model_dir: "
                  "another run's checkpoints, never followed")
  names = [os.path.basename(p) for p in state.all_model_checkpoint_paths]
  latest = os.path.basename(state.model_checkpoint_path)
  try:
    names = sorted(set(names) | {latest}, key=step_of)
  except ValueError:
    return None, f"it names {latest!r}, not a {PREFIX}-<step> checkpoint"
  # The manager's latest is the last it saved, which holds the largest step.
  names.remove(latest)
  return [os.path.join(model_dir, n) for n in names + [latest]], None


def latest(model_dir: str) -> Optional[str]:
  """What `tf.train.latest_checkpoint` would say, without raising or logging.

  With the state file missing or damaged, the newest `ckpt-<step>.index`:
  callers that only ask whether a run has checkpoints (and `repair` then
  rebuilds the file) get the answer the rebuilt file will give.
  """
  listed, _ = read_state(model_dir)
  found = listed or checkpoint_files(model_dir)
  return found[-1] if found else None


# Restores a run's objects from a checkpoint; returns the tensors it read.
Restore = Callable[[str], Set[str]]


def repair(model_dir: str, *, write: bool = True,
           restore: Optional[Restore] = None,
           read_tensors: bool = True, trains: bool = False) -> Optional[str]:
  """Makes the state file name the newest readable checkpoint; returns it.

  Returns None when `model_dir` holds no checkpoint. Writes the state file
  only when it was missing, damaged or named an unreadable latest, and only
  with `write` (a multi-worker job's other workers just read).

  A checkpoint is read whole to be chosen: with `restore`, by restoring it
  (the run's objects then hold the checkpoint returned) and reading back
  only the tensors the restore did not read; without, every tensor is
  read back. Without `read_tensors` only the cheap checks are made (an
  export reads the checkpoint it exports itself). With `trains`, newer
  checkpoint files than the state file names are candidates too (see the
  module).

  Raises:
    UsageError: there are checkpoints and none of them can be read, or the
      state file is damaged and no checkpoint files are there to rebuild it.
    ValueError, AssertionError, tf.errors.OpError: `restore` failed on a
      checkpoint that reads whole: it does not fit the run's objects.
  """
  state_path = os.path.join(model_dir, STATE_FILE)
  for _ in range(_LOOKS):
    listed, damage = read_state(model_dir)
    candidates = _candidates(model_dir, listed, trains)
    chosen, skipped = _newest_readable(candidates, restore, read_tensors)
    # A trainer beside this evaluator may have saved and rotated away what
    # was listed while it was read: then look again.
    if not skipped or read_state(model_dir) == (listed, damage):
      break
  if not candidates:
    if damage:
      raise UsageError(
          f"The checkpoint state file {state_path} is damaged ({damage}) and "
          f"there are no {PREFIX}-* files in --model_dir={model_dir!r} to "
          "rebuild it from. Remove it to train from scratch.")
    return None
  if chosen is None:
    raise UsageError(
        f"--model_dir={model_dir!r} holds checkpoints, but none can be read: "
        f"{_named(skipped)}. Nothing was changed. Restore them from a copy, "
        f"or move them ({PREFIX}-*) and the state file {state_path} out of "
        "the directory to train from scratch.")
  if listed is not None and not skipped and chosen == listed[-1]:
    return chosen  # The usual case: the state file names a readable latest.
  kept = _rewrite_state(model_dir, candidates, chosen, skipped, listed,
                        damage, read_tensors)
  if write:
    write_state(model_dir, kept + [chosen])
  return chosen


def _candidates(model_dir: str, listed: Optional[List[str]],
                trains: bool) -> List[str]:
  """The checkpoints a start may restore, oldest first: those the state
  file lists (all there are without one), and for a training start those
  newer than the one it names."""
  if listed is None:
    return checkpoint_files(model_dir)
  if not trains:
    return listed
  named = step_of(listed[-1])
  newer = [p for p in checkpoint_files(model_dir) + listed[:-1]
           if step_of(p) > named]
  if not newer:
    return listed
  return sorted(set(listed) | set(newer), key=step_of)


def _rewrite_state(model_dir: str, candidates: List[str], chosen: str,
                   skipped, listed, damage, read_tensors: bool) -> List[str]:
  """The checkpoints older than `chosen` the rewritten state file keeps,
  said in one warning with what was skipped and why."""
  state_path = os.path.join(model_dir, STATE_FILE)
  kept = [p for p in candidates if step_of(p) < step_of(chosen)]
  if listed is None:
    # Files no state file listed: only those that look whole are managed.
    found = [(p, unreadable(p, read_tensors=False)) for p in kept]
    kept = [p for p, why in found if why is None]
    skipped = skipped + [(p, why) for p, why in found if why is not None]
    head = (f"The checkpoint state file {state_path} "
            f"{'was missing' if damage is None else f'is damaged ({damage})'}"
            f"; rebuilt it from the {PREFIX}-* files")
  elif step_of(chosen) > step_of(listed[-1]):
    named, newer = os.path.basename(listed[-1]), os.path.basename(chosen)
    head = (f"The checkpoint state file {state_path} names {named}, older "
            f"than {newer}, which reads whole: training on from {named} "
            f"would write over {newer}. To go back to {named}, move the "
            f"newer {PREFIX}-<step>.* files out of the model_dir. Rewrote it")
  else:
    head = f"Rewrote the checkpoint state file {state_path}"
  names = [os.path.basename(p) for p in kept + [chosen]]
  message = (f"{head}: it lists {len(names)} ({', '.join(names)}) and the "
             f"run restores {names[-1]}, the newest readable")
  if skipped:
    message += (f"; skipped {_named(skipped)}. Skipped files are left as "
                "they are: a run that reaches their step again saves over "
                "them")
  logging.warning("%s.", message)
  return kept


def _newest_readable(candidates: List[str], restore: Optional[Restore],
                     read_tensors: bool):
  """The newest of `candidates` that reads whole, and those skipped, why."""
  skipped = []
  for path in reversed(candidates):
    why = unreadable(path, read_tensors=read_tensors, restore=restore)
    if why is None:
      return path, skipped
    skipped.append((path, why))
  return None, skipped


def unreadable(path: str, *, read_tensors: bool,
               restore: Optional[Restore] = None) -> Optional[str]:
  """Why the checkpoint at `path` cannot be restored; None if it can.

  Without `read_tensors` the check is cheap (no data is read): the index
  opens, every data file it needs is there, and they hold at least the
  bytes of its numeric tensors. With it, every tensor is read and its
  checksum checked: by `restore`, then the rest read back, or all read
  back without it.

  Raises:
    What `restore` raised, when the checkpoint reads whole without it
    (`restore_failed`).
  """
  if not tf.io.gfile.exists(path + ".index"):
    return "its .index file is missing"
  try:
    dtypes, sizes = _tensors(path)
  except (tf.errors.OpError, ValueError) as e:
    return f"its index cannot be read: {first_line(e)}"
  data_files = [f for f in tf.io.gfile.glob(path + ".data-*-of-*")
                if _DATA_FILE.fullmatch(f[len(path):])]
  shards = {f.rsplit("-of-", 1)[1] for f in data_files}
  if len(shards) != 1 or len(data_files) != int(shards.pop()):
    return "its data files are missing"
  size = sum(tf.io.gfile.stat(f).length for f in data_files)
  needed = sum(sizes.values())
  if size < needed:
    return f"its data is cut short: {size} bytes, its tensors need {needed}"
  if not read_tensors:
    return None
  if restore is None:
    return _read_back(path, dtypes, sizes)
  try:
    read = restore(path)
  except (tf.errors.OpError, ValueError, AssertionError) as e:
    return restore_failed(path, e)
  return _read_back(path, {n: d for n, d in dtypes.items() if n not in read},
                    sizes)


def restore_failed(path: str, error: Exception) -> str:
  """Why a restore of `path` raised `error`, if the checkpoint is damaged.

  A checkpoint that reads back whole did not fit what was restored from it
  (another model's shapes, a missing object): `error` is raised again.
  """
  why = _read_back(path, *_tensors(path))
  if why is None:
    raise error
  return why


def _tensors(path: str):
  """The dtype of each tensor of `path`, and the bytes of the numeric ones."""
  reader = tf.compat.v1.train.NewCheckpointReader(path)
  dtypes = reader.get_variable_to_dtype_map()
  shapes = reader.get_variable_to_shape_map()
  return dtypes, {n: _numeric_bytes(dtypes[n], shapes[n]) for n in dtypes}


def _read_back(path, dtypes, sizes) -> Optional[str]:
  """Why reading the tensors `dtypes` names back fails; None if it does not."""
  plain = sorted(n for n in dtypes if dtypes[n] != tf.variant)
  # Variants (an input iterator's state) last, in a read of their own:
  # TensorFlow logs an error itself when one does not decode.
  variants = sorted(n for n in dtypes if dtypes[n] == tf.variant)
  batches, batch, batch_bytes = [], [], 0
  for name in plain:
    if batch and batch_bytes + sizes[name] > _READ_BATCH_BYTES:
      batches.append(batch)
      batch, batch_bytes = [], 0
    batch.append(name)
    batch_bytes += sizes[name]
  for names in batches + [batch, variants]:
    if not names:
      continue
    try:
      with tf.device("/cpu:0"):
        tf.raw_ops.RestoreV2(prefix=path, tensor_names=names,
                             shape_and_slices=[""] * len(names),
                             dtypes=[dtypes[n] for n in names])
    except tf.errors.OpError as e:
      return f"its data cannot be read back: {first_line(e)}"
  return None


def _numeric_bytes(dtype: tf.DType, shape: List[int]) -> int:
  if dtype in (tf.string, tf.variant, tf.resource):
    return 0  # Their size is not in the index's shape.
  count = 1
  for dim in shape:
    count *= dim
  return count * dtype.size


def checkpoint_files(model_dir: str) -> List[str]:
  """Every `ckpt-<step>` with an index file in `model_dir`, oldest first."""
  paths = []
  for index in tf.io.gfile.glob(os.path.join(model_dir, PREFIX + "-*.index")):
    path = index[:-len(".index")]
    if path.rsplit("-", 1)[-1].isdigit():
      paths.append(os.path.join(model_dir, os.path.basename(path)))
  return sorted(paths, key=step_of)


def write_state(directory: str, paths: List[str]) -> None:
  """Writes the state file of `directory` as `tf.train.CheckpointManager` would.

  The one writer of a state file: `repair`'s for a run's checkpoints, and
  the best-checkpoint exporter's for its own directory. `paths` are full
  paths (`directory/<name>`, as the manager passes them), the one to
  restore last: TensorFlow stores each relative to `directory`, and takes
  a bare name in a relative or bucket (`gs://`) directory as relative to
  the working directory.
  """
  # The manager manages (and `max_to_keep` rotates) only checkpoints newer
  # than its last preserved timestamp: all of these.
  stamps = [_mtime(p + ".index") for p in paths]
  # An atomic write of the whole file.
  checkpoint_management.update_checkpoint_state_internal(
      directory, paths[-1], all_model_checkpoint_paths=paths,
      save_relative_paths=True, all_model_checkpoint_timestamps=stamps,
      last_preserved_timestamp=min(stamps) - 1)


def _mtime(path: str) -> float:
  try:
    mtime = tf.io.gfile.stat(path).mtime_nsec / 1e9
  except tf.errors.NotFoundError:
    # Deleted since it was listed (another evaluator's export evicted it):
    # the state file is still written, as the manager would list it.
    return time.time()
  return mtime if mtime > 0 else time.time()


def _named(problems) -> str:
  return "; ".join(f"{os.path.basename(p)} ({why})" for p, why in problems)


def first_line(error: Exception) -> str:
  """The cause an error states, without TensorFlow's op decorations."""
  text = _OP_DECORATION.sub("", getattr(error, "message", None) or str(error))
  return text.strip().splitlines()[0] if text.strip() else type(error).__name__
