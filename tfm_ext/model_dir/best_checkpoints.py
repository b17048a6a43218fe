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
recorded checkpoints this run cannot rank (a NaN value, no value for a
changed metric, beyond a smaller k). Every file goes through
`tf.io.gfile`, so `model_dir` may be a bucket.

The exporter ranks; the functions before it read and write the directory's
files (the manifest, TFM's `info.json`, the `checkpoint` state file) and
tidy what a crash left, deciding nothing.
"""

import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from absl import logging
import tensorflow as tf

from official.core import config_definitions
from official.core import train_utils

from tfm_ext.base import logs
from tfm_ext.base import values
from tfm_ext.base import settings
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import claim
from tfm_ext.model_dir import files

MANIFEST = "best_checkpoints.json"
INFO = "info.json"  # TFM's record of the best checkpoint.
PREFIX = "best_ckpt"
# Where the checkpoints go that the exporter keeps but cannot rank.
UNRANKED = "unranked"
# Where exporters that evaluated the same step bid to write it
# (`claim.bid`): `best_ckpt-<step>.<token>.json`, each deleted once decided.
BIDS = "export_bids"
# How often a bid lists the others again while larger ones are there.
BID_POLL_SECONDS = 0.1


def read_manifest(directory: str) -> Dict[str, Any]:
  """The manifest in `directory`, its entries checked.

  Raises:
    files.Damaged: it does not read as a manifest.
    tf.errors.NotFoundError: there is none.
  """
  path = os.path.join(directory, MANIFEST)
  manifest = files.read_object(path, {"checkpoints": list})
  for entry in manifest["checkpoints"]:
    if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and values.is_a(entry.get("global_step"), int)):
      raise files.Damaged(f"{path} is damaged: an entry without a path "
                           f"and a global_step: {entry!r:.80}")
    if not files.in_directory(directory, entry["path"]):
      raise files.Damaged(f"{path} is damaged: it names {entry['path']!r}, "
                           "outside its directory (another run's files)")
  return manifest


def write_manifest(directory: str, header: Mapping[str, Any],
          entries: List[Dict[str, Any]]) -> None:
  """Writes the manifest (`header` and `entries`, best first), then TFM's
  `info.json` and the state file for the best entry, if any."""
  files.write_json(os.path.join(directory, MANIFEST),
                    {**header, "checkpoints": entries})
  if not entries:
    return
  best = entries[0]
  files.write_json(os.path.join(directory, INFO), {
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
    metrics = files.read_object(info,
                                 {"best_ckpt_global_step": (int, float)})
  except files.Damaged as e:
    logging.warning("%s: no best checkpoint to adopt from it.", e)
    return None
  step = int(metrics.pop("best_ckpt_global_step"))
  return os.path.basename(latest), step, metrics


def complete_entries(directory: str,
             entries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """The entries whose checkpoint files are there."""
  return [e for e in entries
          if tf.io.gfile.exists(os.path.join(directory, e["path"]) + ".index")]


def tidy(directory: str, named: Callable[[str], bool],
         kept: Callable[[str], bool],
         busy: Callable[[str], bool] = lambda stem: False
         ) -> Tuple[List[str], List[str]]:
  """Clears what the manifest does not name; returns `(removed, moved)`.

  Temp files go, and so do the files of a checkpoint (by its name, as
  `best_ckpt-500`) that is not `named`, unless it is to be `kept`: those
  move to `unranked/`. The files of a checkpoint another exporter is
  `busy` writing stay.
  """
  removed, moved = [], []
  for name in sorted(tf.io.gfile.listdir(directory)):
    name = name.rstrip("/")  # A bucket may list a "directory" as "name/".
    stem = name.split(".")[0]
    if busy(stem.split("_temp")[0]):
      continue
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
  if not files.in_directory(directory, prefix):
    raise ValueError(f"{prefix} is not in {directory}: not deleted.")
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.remove(path)


def maybe_create(params: config_definitions.ExperimentConfig,
                 model_dir: str) -> Optional["TopKCheckpointExporter"]:
  """Returns the exporter that `params.trainer` asks for, or None."""
  trainer_config = params.trainer
  if not (model_dir and trainer_config.best_checkpoint_export_subdir
          and trainer_config.best_checkpoint_eval_metric):
    return None
  return TopKCheckpointExporter(
      os.path.join(model_dir, trainer_config.best_checkpoint_export_subdir),
      metric_name=trainer_config.best_checkpoint_eval_metric,
      metric_comp=trainer_config.best_checkpoint_metric_comp,
      k=getattr(trainer_config, "best_checkpoint_top_k", 1))


def best_of(model_dir: str, trainer_config) -> Dict[str, Any]:
  """The best checkpoint `trainer_config`'s list holds in `model_dir`.

  `{"metric", "value", "global_step", "path"}` of the list's first entry;
  {} without a list, or with one that is empty or does not read.
  """
  subdir = trainer_config.best_checkpoint_export_subdir
  if not (model_dir and subdir and trainer_config.best_checkpoint_eval_metric):
    return {}
  directory = os.path.join(model_dir, subdir)
  try:
    manifest = read_manifest(directory)
  except (tf.errors.OpError, ValueError):
    return {}
  if not manifest["checkpoints"]:
    return {}
  top = manifest["checkpoints"][0]
  return {"metric": manifest.get("metric"), "value": top.get("value"),
          "global_step": top["global_step"],
          "path": os.path.join(directory, top["path"])}


class TopKCheckpointExporter:
  """Keeps the k best checkpoints by `metric_name` in `export_dir`.

  NaN and infinite values are never kept. A tie keeps the older checkpoint.
  A checkpoint on record that cannot be ranked (a NaN value, or none for a
  new `metric_name`), or is beyond a smaller k than the record's, is moved
  to `unranked/`, never deleted. Several evaluators may export into one
  directory (`_refresh`); of those that evaluated the same step (the
  trainer of `train_and_eval` and an evaluator beside it), one writes it:
  they bid for it in `export_bids/` (`claim.bid`).
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
    self._damage: Optional[files.Damaged] = None
    # Checkpoints on record that this run cannot rank (a NaN value, or no
    # value for its metric): `repair` moves them to `unranked/`.
    self._unrankable: Dict[str, str] = {}
    self._me = claim.Process.this()
    self._bidding = claim.Bidding(
        claim.Judge(settings.get().claim_stale_seconds, me=self._me),
        claim.Unchanged(time.monotonic), time.sleep, time.monotonic,
        BID_POLL_SECONDS, settings.get().claim_renew_seconds)
    self._entries: List[Dict[str, Any]] = self._load()
    self.repair()

  # -- TFM's BestCheckpointExporter interface -------------------------------

  def maybe_export_checkpoint(self, checkpoint: tf.train.Checkpoint,
                              eval_logs: Mapping[str, Any],
                              global_step: int) -> bool:
    """Keeps `checkpoint` if it is among the k best; returns whether it was."""
    step = int(global_step)
    metrics = logs.scalar_tree(eval_logs)
    value = self._value(metrics)
    if value is None:
      raise ValueError(
          f"best_checkpoint_eval_metric {self._metric_name!r} is not in the "
          "eval logs; they have: "
          f"{sorted(name for name, _ in logs.leaves(metrics, '|'))}.")
    if not math.isfinite(value):
      logging.warning("Best-checkpoint metric %r is %s at step %d; not kept.",
                      self._metric_name, value, step)
      return False
    self._refresh()
    if not self._ranks_in(step, value):
      return False
    name = f"{PREFIX}-{step}"
    # The trainer and an evaluator beside it may both have evaluated this
    # step: one writes its files, the other's export is that one's.
    with claim.bid(os.path.join(self._dir, BIDS), name, self._bid_fields,
                   self._bidding, settled=lambda: self._judged(step)) as won:
      if not won:
        return False
      path = checkpoint.write(os.path.join(self._dir, name))
      # Another evaluator may have kept a better one while this one wrote.
      self._refresh()
      if not self._ranks_in(step, value):
        delete_checkpoint(path, self._dir)
        return False
      self._keep(step, value, path, metrics)
    return True

  def _keep(self, step: int, value: float, path: str,
            metrics: Dict[str, Any]) -> None:
    """Commits the written checkpoint of `step`; deletes what it evicts."""
    entry = {"path": os.path.basename(path), "global_step": step,
             "value": value, "metrics": metrics}
    entries = self._sorted(self._entries + [entry])
    kept, evicted = entries[:self._k], entries[self._k:]
    self._commit(kept)
    for old in evicted:
      delete_checkpoint(os.path.join(self._dir, old["path"]), self._dir)

  def _judged(self, step: int) -> bool:
    """Whether another exporter has since recorded `step`."""
    self._refresh()
    return any(e["global_step"] == step for e in self._entries)

  def _bid_fields(self, token: str, renewals: int) -> Dict[str, Any]:
    return {**self._me.fields(), "token": token, "renewals": renewals}

  def _ranks_in(self, step: int, value: float) -> bool:
    """Whether a checkpoint of `step` and `value` gets into the k best."""
    if any(e["global_step"] == step for e in self._entries):
      return False  # Already judged (a re-evaluated checkpoint).
    return len(self._entries) < self._k or self._better(
        value, self._entries[-1]["value"])

  def _refresh(self) -> None:
    """Takes up the manifest as another job on the directory left it.

    Evaluators beside each other (and beside a trainer) export into one
    directory; each reads the manifest before it decides and again before
    it commits, so none ranks against a list another one has since changed.
    An object store has no compare-and-swap: two commits within the same
    few milliseconds still race, and the later one wins. A manifest that
    does not read keeps the list this exporter holds.
    """
    try:
      manifest = read_manifest(self._dir)
    except (files.Damaged, tf.errors.NotFoundError):
      return
    self._entries = self._ranked(manifest)[:self._k]

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
    complete = complete_entries(self._dir, self._entries)
    named = {e["path"] for e in complete}
    # A complete checkpoint whose value only a damaged manifest held, or
    # one this run cannot rank: out of the ranking, but kept.
    busy = claim.live_bids(os.path.join(self._dir, BIDS),
                           self._bidding.judge)
    removed, moved = tidy(
        self._dir, named=named.__contains__,
        kept=lambda stem: bool(self._damage) or stem in self._unrankable,
        busy=busy.__contains__)
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
    write_manifest(self._dir, {"metric": self._metric_name, "comp": self._comp,
                            "k": self._k}, entries)
    self._entries = entries

  def _load(self) -> List[Dict[str, Any]]:
    if not tf.io.gfile.exists(os.path.join(self._dir, MANIFEST)):
      return self._adopt_tfm_export()
    try:
      manifest = read_manifest(self._dir)
    except files.Damaged as e:
      self._damage = e  # `repair` says what it kept.
      return self._adopt_tfm_export()
    if (manifest.get("metric"), manifest.get("comp")) != (self._metric_name,
                                                          self._comp):
      logging.warning("The best-checkpoint manifest ranks by %s/%s, this run "
                      "by %s/%s: ranking its entries again.",
                      manifest.get("metric"), manifest.get("comp"),
                      self._metric_name, self._comp)
    entries = self._ranked(manifest)
    for entry in entries[self._k:]:  # A smaller k than the manifest's.
      self._unrankable[entry["path"]] = (
          f"is beyond best_checkpoint_top_k={self._k}")
    return entries[:self._k]

  def _ranked(self, manifest: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The manifest's rankable entries with their values, best first."""
    entries = []
    for entry in manifest["checkpoints"]:
      value = self._rankable_value(entry["path"], entry.get("metrics", {}))
      if value is not None:
        entries.append({**entry, "value": value})
    return self._sorted(entries)

  def _adopt_tfm_export(self) -> List[Dict[str, Any]]:
    """Takes over a directory that TFM's own exporter wrote (no manifest).

    Also rebuilds from what is left when the manifest is damaged: the
    checkpoint state file names the best checkpoint, and TFM's `info.json`
    holds its metrics.
    """
    best = read_tfm_best(self._dir)
    if best is None:
      return []
    name, step, metrics = best
    value = self._rankable_value(name, metrics)
    if value is None:
      return []
    logging.info("Adopting TFM's best checkpoint %s (step %d).", name, step)
    return [{"path": name, "global_step": step, "value": value,
             "metrics": metrics}]

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
