"""A crash-safe exporter that keeps the top-k checkpoints by an eval metric.

A drop-in for TFM's `BestCheckpointExporter` (same config keys, same
`maybe_export_checkpoint` / `best_ckpt_logs` / `best_ckpt_path` interface),
with `trainer.best_checkpoint_top_k` for k. The record of what is kept is one
JSON manifest, `best_checkpoints.json`:

    {"metric": "accuracy", "comp": "higher", "k": 3,
     "checkpoints": [{"path": "best_ckpt-500", "global_step": 500,
                      "value": 0.98, "metrics": {...all scalar logs...}}, ...]}

best first. Order of writes for a new entry: checkpoint files, then the
manifest (written whole: `_files.write_json`), then TFM's `info.json` and the
`checkpoint` state file for the top entry (so `tf.train.latest_checkpoint` on
the directory and TFM's tooling find the best), then evicted files are
deleted. A crash anywhere leaves the manifest naming complete checkpoints
only; `repair` (run at construction) deletes what the manifest does not name
and drops entries whose files are gone. A damaged manifest (not JSON, not
ours) is rebuilt with one warning from what TFM's `info.json` and the state
file record: the best checkpoint is kept, the others, whose values only the
manifest held, are moved to `unranked/` (kept, out of the ranking), as are
recorded checkpoints this run cannot rank (a NaN value, or no value for a
changed metric). Every file goes through
`tf.io.gfile`, so `model_dir` may be a bucket.
"""

import math
import os
from typing import Any, Dict, List, Mapping, Optional

from absl import logging
import orbit
import tensorflow as tf

from tensorflow.python.checkpoint import checkpoint_management  # pylint: disable=g-direct-tensorflow-import

from official.core import config_definitions
from official.core import train_utils

from tfm_ext import _files

MANIFEST = "best_checkpoints.json"
INFO = "info.json"  # TFM's record of the best checkpoint.
PREFIX = "best_ckpt"
# Where a rebuilt manifest puts the checkpoints it can no longer rank.
UNRANKED = "unranked"


def maybe_create(params: config_definitions.ExperimentConfig,
                 model_dir: str) -> Optional["TopKCheckpointExporter"]:
  """Returns the exporter that `params.trainer` asks for, or None."""
  trainer = params.trainer
  if not (model_dir and trainer.best_checkpoint_export_subdir
          and trainer.best_checkpoint_eval_metric):
    return None
  return TopKCheckpointExporter(
      os.path.join(model_dir, trainer.best_checkpoint_export_subdir),
      metric_name=trainer.best_checkpoint_eval_metric,
      metric_comp=trainer.best_checkpoint_metric_comp,
      k=getattr(trainer, "best_checkpoint_top_k", 1))


def scalar_logs(logs: Mapping[str, Any]) -> Dict[str, Any]:
  """The scalar leaves of (nested) eval logs as floats, nesting kept."""
  out = {}
  for key, value in logs.items():
    if isinstance(value, Mapping):
      out[key] = scalar_logs(value)
      continue
    value = orbit.utils.get_value(value)
    if getattr(value, "size", 1) == 1:
      try:
        out[key] = float(value)
      except (TypeError, ValueError):
        pass
  return out


class TopKCheckpointExporter:
  """Keeps the k best checkpoints by `metric_name` in `export_dir`.

  NaN and infinite values are never kept. A tie keeps the older checkpoint.
  A checkpoint on record that cannot be ranked (a NaN value, or none for a
  new `metric_name`) is moved to `unranked/`, never deleted.
  `metric_name` may be nested with TFM's `|` separator ("coco|AP").
  """

  def __init__(self, export_dir: str, *, metric_name: str, metric_comp: str,
               k: int = 1):
    if metric_comp not in ("higher", "lower"):
      raise ValueError("best_checkpoint_metric_comp must be 'higher' or "
                       f"'lower', got {metric_comp!r}.")
    if k < 1:
      raise ValueError(f"best_checkpoint_top_k must be >= 1, got {k}.")
    self._dir = export_dir
    self._metric_name = metric_name
    self._metric_path = metric_name.split("|")
    self._comp = metric_comp
    self._k = k
    tf.io.gfile.makedirs(export_dir)
    self._damage: Optional[_files.Damaged] = None
    # Checkpoints on record that this run cannot rank (a NaN value, or no
    # value for its metric): `repair` moves them to `unranked/`.
    self._unrankable: Dict[str, str] = {}
    self._entries: List[Dict[str, Any]] = self._load()
    self.repair()

  # -- TFM's BestCheckpointExporter interface -------------------------------

  def maybe_export_checkpoint(self, checkpoint: tf.train.Checkpoint,
                              eval_logs: Mapping[str, Any],
                              global_step: int) -> bool:
    """Keeps `checkpoint` if it is among the k best; returns whether it was."""
    step = int(global_step)
    metrics = scalar_logs(eval_logs)
    value = self._value(metrics)
    if value is None:
      raise ValueError(
          f"best_checkpoint_eval_metric {self._metric_name!r} is not in the "
          f"eval logs; they have: {sorted(_leaf_names(metrics))}.")
    if not math.isfinite(value):
      logging.warning("Best-checkpoint metric %r is %s at step %d; not kept.",
                      self._metric_name, value, step)
      return False
    if any(e["global_step"] == step for e in self._entries):
      return False  # Already judged (a re-evaluated checkpoint).
    if len(self._entries) >= self._k and not self._better(
        value, self._entries[-1]["value"]):
      return False
    path = checkpoint.write(os.path.join(self._dir, f"{PREFIX}-{step}"))
    entry = {"path": os.path.basename(path), "global_step": step,
             "value": value, "metrics": metrics}
    entries = self._sorted(self._entries + [entry])
    kept, evicted = entries[:self._k], entries[self._k:]
    self._commit(kept)
    for old in evicted:
      _delete_checkpoint_files(os.path.join(self._dir, old["path"]))
    return True

  @property
  def best_ckpt_logs(self) -> Optional[Dict[str, Any]]:
    """The eval logs of the best checkpoint, or None before the first."""
    return self._entries[0]["metrics"] if self._entries else None

  @property
  def best_ckpt_path(self) -> Optional[str]:
    return (os.path.join(self._dir, self._entries[0]["path"])
            if self._entries else None)

  @property
  def kept(self) -> List[Dict[str, Any]]:
    """The manifest's entries, best first."""
    return [dict(e) for e in self._entries]

  # -- Crash safety ---------------------------------------------------------

  def repair(self) -> None:
    """Makes the directory agree with the manifest after a crash.

    Drops entries whose checkpoint files are missing, deletes checkpoint
    files and temp files the manifest does not name, and rewrites the
    manifest, `info.json` and the state file from what remains. Says what
    it removed, and why, in one warning.
    """
    complete = [e for e in self._entries
                if tf.io.gfile.exists(os.path.join(self._dir, e["path"])
                                      + ".index")]
    named = {e["path"] for e in complete}
    removed, moved = [], []
    for name in sorted(tf.io.gfile.listdir(self._dir)):
      name = name.rstrip("/")  # A bucket may list a "directory" as "name/".
      stem = name.split(".")[0]
      orphan = stem.startswith(PREFIX) and stem not in named
      # Temp files: ours end in .tmp, TensorFlow's in .tmp<hex>.
      temp = ".tmp" in name or "_temp" in name
      target = os.path.join(self._dir, name)
      if orphan and (self._damage or stem in self._unrankable) and not temp:
        # A complete checkpoint whose value only the damaged manifest held,
        # or one this run cannot rank: out of the ranking, but kept.
        tf.io.gfile.makedirs(os.path.join(self._dir, UNRANKED))
        tf.io.gfile.rename(target, os.path.join(self._dir, UNRANKED, name),
                           overwrite=True)
        moved.append(name)
      elif orphan or temp:
        removed.append(name)
        if tf.io.gfile.isdir(target):
          tf.io.gfile.rmtree(target)
        else:
          tf.io.gfile.remove(target)
    if self._damage:
      kept = (f"keeps {complete[0]['path']}, the best that {INFO} records"
              if complete else "keeps no checkpoint")
      logging.warning(
          "%s. Rebuilt from %s and the state file: it %s%s.", self._damage,
          INFO, kept, f"; moved {', '.join(moved)}, whose values only the "
          f"manifest held, to {UNRANKED}/" if moved else "")
    elif moved:
      stems = sorted({name.split(".")[0] for name in moved})
      logging.warning("Moved %s to %s/, out of the ranking by %s: %s.",
                      ", ".join(moved), UNRANKED, self._metric_name,
                      "; ".join(f"{stem} {self._unrankable[stem]}"
                                for stem in stems))
    if removed and not self._damage:
      logging.warning("Removed %s: not in the best-checkpoint manifest (left "
                      "by an interrupted export).", ", ".join(removed))
    if complete or self._entries or self._damage:
      self._commit(complete)
    self._damage = None

  def _commit(self, entries: List[Dict[str, Any]]) -> None:
    _files.write_json(os.path.join(self._dir, MANIFEST), {
        "metric": self._metric_name, "comp": self._comp, "k": self._k,
        "checkpoints": entries})
    self._entries = entries
    if entries:
      best = entries[0]
      _files.write_json(os.path.join(self._dir, INFO), {
          **best["metrics"], "best_ckpt_global_step": float(best["global_step"])})
      others = sorted(entries[1:], key=lambda e: e["global_step"])
      # What tf.train.CheckpointManager uses: an atomic write of the state.
      # Full paths, as the manager passes them: TF stores each relative to
      # the directory, and takes a bare name in a relative or bucket
      # directory (`gs://`) as relative to the working directory.
      paths = [os.path.join(self._dir, e["path"]) for e in others + [best]]
      checkpoint_management.update_checkpoint_state_internal(
          self._dir, paths[-1], all_model_checkpoint_paths=paths,
          save_relative_paths=True)

  def _load(self) -> List[Dict[str, Any]]:
    path = os.path.join(self._dir, MANIFEST)
    if not tf.io.gfile.exists(path):
      return self._adopt_tfm_export()
    try:
      manifest = _files.read_object(path, {"checkpoints": list})
      for entry in manifest["checkpoints"]:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and _is_step(entry.get("global_step"))):
          raise _files.Damaged(f"{path} is damaged: an entry without a path "
                               f"and a global_step: {entry!r:.80}")
    except _files.Damaged as e:
      self._damage = e  # `repair` says what it kept.
      return self._adopt_tfm_export()
    if (manifest.get("metric"), manifest.get("comp")) != (self._metric_name,
                                                          self._comp):
      logging.warning("The best-checkpoint manifest ranks by %s/%s, this run "
                      "by %s/%s: ranking its entries again.",
                      manifest.get("metric"), manifest.get("comp"),
                      self._metric_name, self._comp)
    entries = []
    for entry in manifest["checkpoints"]:
      value = self._rankable_value(entry["path"], entry.get("metrics", {}))
      if value is not None:
        entries.append({**entry, "value": value})
    return self._sorted(entries)[:self._k] if entries else []

  def _adopt_tfm_export(self) -> List[Dict[str, Any]]:
    """Takes over a directory that TFM's own exporter wrote (no manifest).

    Also rebuilds from what is left when the manifest is damaged: the
    checkpoint state file names the best checkpoint, and TFM's `info.json`
    holds its metrics.
    """
    latest = tf.train.latest_checkpoint(self._dir)
    info = os.path.join(self._dir, INFO)
    if not (latest and tf.io.gfile.exists(info)):
      return []
    try:
      metrics = _files.read_object(info,
                                   {"best_ckpt_global_step": (int, float)})
    except _files.Damaged as e:
      logging.warning("%s: no best checkpoint to adopt from it.", e)
      return []
    step = int(metrics.pop("best_ckpt_global_step"))
    value = self._rankable_value(os.path.basename(latest), metrics)
    if value is None:
      return []
    logging.info("Adopting TFM's best checkpoint %s (step %d).", latest, step)
    return [{"path": os.path.basename(latest), "global_step": step,
             "value": value, "metrics": metrics}]

  # -- Ranking --------------------------------------------------------------

  def _value(self, metrics: Mapping[str, Any]) -> Optional[float]:
    try:
      return float(train_utils.get_leaf_nested_dict(dict(metrics),
                                                    self._metric_path))
    except (KeyError, TypeError, ValueError):
      return None

  def _rankable_value(self, path: str,
                      metrics: Mapping[str, Any]) -> Optional[float]:
    """The finite value of a recorded checkpoint, else None, noting why."""
    value = self._value(metrics)
    if value is not None and math.isfinite(value):
      return value
    self._unrankable[path] = (f"has no {self._metric_name!r}" if value is None
                              else f"has {self._metric_name}={value}")
    return None

  def _better(self, new: float, old: float) -> bool:
    return new > old if self._comp == "higher" else new < old

  def _sorted(self, entries):
    sign = -1.0 if self._comp == "higher" else 1.0
    # Best first; among equal values the older (lower step) first, so a tie
    # never displaces a kept checkpoint.
    return sorted(entries, key=lambda e: (sign * e["value"], e["global_step"]))


def _is_step(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _leaf_names(logs: Mapping[str, Any], prefix: str = ""):
  for key, value in logs.items():
    if isinstance(value, Mapping):
      yield from _leaf_names(value, f"{prefix}{key}|")
    else:
      yield prefix + key


def _delete_checkpoint_files(prefix: str) -> None:
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.remove(path)
