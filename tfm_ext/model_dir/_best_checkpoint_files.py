"""The files of a best-checkpoint directory (`tfm_ext.actions.best_checkpoint`).

Its manifest (`best_checkpoints.json`, ours), TFM's `info.json` and the
`checkpoint` state file, and the tidying of what a crash left. No ranking:
the exporter decides, this module reads and writes. Every file goes
through `tf.io.gfile`, so the directory may be in a bucket.
"""

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from absl import logging
import tensorflow as tf

from tfm_ext.config import _types
from tfm_ext.model_dir import _files
from tfm_ext.model_dir import checkpoint_state

MANIFEST = "best_checkpoints.json"
INFO = "info.json"  # TFM's record of the best checkpoint.
PREFIX = "best_ckpt"
# Where the checkpoints go that the exporter keeps but cannot rank.
UNRANKED = "unranked"


def read_manifest(directory: str) -> Dict[str, Any]:
  """The manifest in `directory`, its entries checked.

  Raises:
    _files.Damaged: it does not read as a manifest.
    tf.errors.NotFoundError: there is none.
  """
  path = os.path.join(directory, MANIFEST)
  manifest = _files.read_object(path, {"checkpoints": list})
  for entry in manifest["checkpoints"]:
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and _types.is_a(entry.get("global_step"), int)):
      raise _files.Damaged(f"{path} is damaged: an entry without a path "
                           f"and a global_step: {entry!r:.80}")
    if not _files.in_directory(directory, entry["path"]):
      raise _files.Damaged(f"{path} is damaged: it names {entry['path']!r}, "
                           "outside its directory (another run's files)")
  return manifest


def write(directory: str, header: Mapping[str, Any],
          entries: List[Dict[str, Any]]) -> None:
  """Writes the manifest (`header` and `entries`, best first), then TFM's
  `info.json` and the state file for the best entry, if any."""
  _files.write_json(os.path.join(directory, MANIFEST),
                    {**header, "checkpoints": entries})
  if not entries:
    return
  best = entries[0]
  _files.write_json(os.path.join(directory, INFO), {
      **best["metrics"], "best_ckpt_global_step": float(best["global_step"])})
  others = sorted(entries[1:], key=lambda e: e["global_step"])
  checkpoint_state.write_state(
      directory, [os.path.join(directory, e["path"]) for e in others + [best]])


def read_tfm_best(directory: str
                  ) -> Optional[Tuple[str, int, Dict[str, Any]]]:
  """`(checkpoint name, step, metrics)` of the best checkpoint that the
  state file and TFM's `info.json` record, or None (warning if the info is
  damaged)."""
  latest = checkpoint_state.latest(directory)
  info = os.path.join(directory, INFO)
  if not (latest and tf.io.gfile.exists(info)):
    return None
  try:
    metrics = _files.read_object(info,
                                 {"best_ckpt_global_step": (int, float)})
  except _files.Damaged as e:
    logging.warning("%s: no best checkpoint to adopt from it.", e)
    return None
  step = int(metrics.pop("best_ckpt_global_step"))
  return os.path.basename(latest), step, metrics


def complete(directory: str,
             entries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """The entries whose checkpoint files are there."""
  return [e for e in entries
          if tf.io.gfile.exists(os.path.join(directory, e["path"]) + ".index")]


def tidy(directory: str, named: Callable[[str], bool],
         kept: Callable[[str], bool]) -> Tuple[List[str], List[str]]:
  """Clears what the manifest does not name; returns `(removed, moved)`.

  Temp files go, and so do the files of a checkpoint (by its name, as
  `best_ckpt-500`) that is not `named`, unless it is to be `kept`: those
  move to `unranked/`.
  """
  removed, moved = [], []
  for name in sorted(tf.io.gfile.listdir(directory)):
    name = name.rstrip("/")  # A bucket may list a "directory" as "name/".
    stem = name.split(".")[0]
    orphan = stem.startswith(PREFIX) and not named(stem)
    # Temp files: ours end in .tmp, TensorFlow's in .tmp<hex>.
    temp = ".tmp" in name or "_temp" in name
    target = os.path.join(directory, name)
    if orphan and kept(stem) and not temp:
      tf.io.gfile.makedirs(os.path.join(directory, UNRANKED))
      tf.io.gfile.rename(target, os.path.join(directory, UNRANKED, name),
                         overwrite=True)
      moved.append(name)
    elif orphan or temp:
      removed.append(name)
      if tf.io.gfile.isdir(target):
        tf.io.gfile.rmtree(target)
      else:
        tf.io.gfile.remove(target)
  return removed, moved


def delete_checkpoint(prefix: str, directory: str) -> None:
  """Deletes the files of the checkpoint at `prefix`, one of `directory`'s.

  Raises:
    ValueError: `prefix` is not in `directory` (a bug: nothing is deleted).
  """
  if not _files.in_directory(directory, prefix):
    raise ValueError(f"{prefix} is not in {directory}: not deleted.")
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.remove(path)
