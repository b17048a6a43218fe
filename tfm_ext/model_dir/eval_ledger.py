"""The evaluation ledger: what this model_dir's evaluators have dealt with.

`model_dir/eval_ledger/<checkpoint>.json`, one record per checkpoint,
written whole after its evaluation (an object store has no append): its
status ("evaluated", "empty", "missing" or "unreadable"), its metrics, the
evaluator that wrote it and, for any status but "evaluated", why. An older
evaluator's `eval_ledger.jsonl` is read too. The evaluator
(`tfm_ext.run.continuous_eval`) writes and reads it to evaluate each
checkpoint once; the trainer lists it at each save to keep what no
evaluator has recorded yet (`tfm_ext.model_dir.retention`), and records what
it rotated away while no evaluator was present; `Tally` counts it for an
evaluator's end line and run summary.
"""

import dataclasses
import os
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

import tensorflow as tf

from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import files

LEDGER = "eval_ledger"
LEGACY_LEDGER = "eval_ledger.jsonl"
_ENTRY_KEYS = ("checkpoint", "global_step", "status")
# The `why` of a "missing" record the trainer wrote for a checkpoint it
# rotated away while no evaluator was present (`tfm_ext.model_dir.retention`).
UNWATCHED = ("rotated away by max_to_keep while no evaluator was present on "
             "the model_dir")


def recorded_checkpoints(model_dir: str) -> Set[str]:
  """The names of the checkpoints the ledger holds a record of, any status.

  One listing, no record read (what the trainer asks at each save). An
  older evaluator's `eval_ledger.jsonl` is not looked at.
  """
  try:
    names = tf.io.gfile.listdir(os.path.join(model_dir, LEDGER))
  except tf.errors.NotFoundError:
    return set()
  return {n[:-len(".json")] for n in names if n.endswith(".json")}


def record_missing(model_dir: str, checkpoint_path: str, why: str,
                   by: str) -> None:
  """Records `checkpoint_path`, deleted before it was evaluated, as missing.

  Unless a record of it is there by now: an evaluation recorded a moment
  ago stays.
  """
  name = os.path.basename(checkpoint_path)
  if tf.io.gfile.exists(os.path.join(model_dir, LEDGER, name + ".json")):
    return
  files.write_record(os.path.join(model_dir, LEDGER), name,
                      _entry(checkpoint_path, "missing", {}, by, why))


def _entry(checkpoint_path: str, status: str, metrics: Mapping[str, float],
           evaluator: str, why: str = "") -> Dict[str, Any]:
  entry = {"checkpoint": os.path.basename(checkpoint_path),
           "global_step": checkpoint_state.step_of(checkpoint_path),
           "status": status, "metrics": dict(metrics),
           "evaluator": evaluator, "time": time.time()}
  if why:
    entry["why"] = why
  return entry


def read_ledger(model_dir: str) -> List[Dict[str, Any]]:
  """The ledger's entries, one per checkpoint, oldest first.

  `{"checkpoint": "ckpt-20", "global_step": 20, "status": "evaluated",
  "empty", "missing" or "unreadable", "metrics": {...}, "evaluator": ...,
  "time": ...}`. A record that is not whole is skipped with a warning: its
  checkpoint is evaluated again.
  """
  records = files.read_records(
      os.path.join(model_dir, LEDGER), _ENTRY_KEYS,
      legacy_file=os.path.join(model_dir, LEGACY_LEDGER))
  entries = {e["checkpoint"]: e for e in records}  # The latest counts.
  return sorted(entries.values(), key=lambda e: e["global_step"])


class EvalLedger:
  """The checkpoints this model_dir's evaluators have dealt with."""

  def __init__(self, model_dir: str):
    self._model_dir = model_dir
    self.directory = os.path.join(model_dir, LEDGER)
    self.entries: Dict[str, Dict[str, Any]] = {
        e["checkpoint"]: e for e in read_ledger(model_dir)}

  def catch_up(self) -> None:
    """Reads the records written since: one listing, a read of each new one."""
    for name in recorded_checkpoints(self._model_dir) - set(self.entries):
      self.recorded_elsewhere(name)

  def __contains__(self, checkpoint_path: str) -> bool:
    return os.path.basename(checkpoint_path) in self.entries

  def recorded_elsewhere(self, checkpoint_path: str) -> bool:
    """Whether another evaluator has recorded it since this ledger was read.

    Reads that one record, not the whole ledger.
    """
    name = os.path.basename(checkpoint_path)
    try:
      entry = files.read_object(os.path.join(self.directory, name + ".json"),
                                 _ENTRY_KEYS)
    except (tf.errors.NotFoundError, ValueError):
      return False  # Not there, or not whole: not recorded.
    self.entries[name] = entry
    return True

  def record(self, checkpoint_path: str, status: str,
             metrics: Optional[Mapping[str, float]] = None,
             evaluator: str = "", why: str = "") -> None:
    entry = _entry(checkpoint_path, status, metrics or {}, evaluator, why)
    files.write_record(self.directory, entry["checkpoint"], entry)
    self.entries[entry["checkpoint"]] = entry

  def evaluated_steps(self) -> List[int]:
    return sorted(e["global_step"] for e in self.entries.values()
                  if e["status"] == "evaluated")


@dataclasses.dataclass(frozen=True)
class Tally:
  """What became of the checkpoints an evaluator knew of: one count for its
  end line (`line`) and its run summary's `evaluations` (`fields`).

  The checkpoints are those of the ledger and those the evaluator saw
  listed. `missed` are those no evaluator evaluated, oldest first, each
  `{"checkpoint", "global_step", "status", "why"}`: "missing",
  "unreadable" or "empty" as recorded, or "unrecorded" (seen listed, but
  no evaluator recorded it: this one stopped first, or it was deleted
  since). `claims_lost`: what this one evaluated but left to the
  evaluator that took its claim over.
  """
  evaluated_here: int
  evaluated_by_others: int
  missed: Tuple[Dict[str, Any], ...]
  claims_lost: Tuple[str, ...] = ()

  @classmethod
  def of(cls, entries: Iterable[Mapping[str, Any]], owner: str,
         seen: Iterable[str] = (), listed: Iterable[str] = (),
         claims_lost: Iterable[str] = ()) -> "Tally":
    """The count of the ledger's `entries`, by evaluator `owner`.

    `seen`: the checkpoints it saw listed; `listed`: those of its last
    listing.
    """
    entries = list(entries)
    evaluated = [e for e in entries if e["status"] == "evaluated"]
    here = sum(e.get("evaluator") == owner for e in evaluated)
    missed = [{"checkpoint": e["checkpoint"],
               "global_step": e["global_step"], "status": e["status"],
               "why": e.get("why") or ""}
              for e in entries if e["status"] != "evaluated"]
    recorded = {e["checkpoint"] for e in entries}
    still = {os.path.basename(p) for p in listed}
    missed += [{"checkpoint": name,
                "global_step": checkpoint_state.step_of(name),
                "status": "unrecorded",
                "why": _STOPPED_FIRST if name in still else _DELETED}
               for name in {os.path.basename(p) for p in seen} - recorded]
    return cls(evaluated_here=here,
               evaluated_by_others=len(evaluated) - here,
               missed=tuple(sorted(missed, key=lambda m: m["global_step"])),
               claims_lost=tuple(claims_lost))

  def line(self) -> str:
    """`continuous_eval | 8 checkpoint(s) evaluated here, 0 by other
    evaluators | not evaluated: 2 missing (ckpt-300, ckpt-400: why)`."""
    not_evaluated = []
    for status in ("missing", "unreadable", "empty", "unrecorded"):
      of_status = [m for m in self.missed if m["status"] == status]
      if not of_status:
        continue
      names = [m["checkpoint"] for m in of_status]
      whys = sorted({m["why"] for m in of_status} - {""})
      label = "never recorded" if status == "unrecorded" else status
      not_evaluated.append(f"{len(names)} {label} ({ranges(names)}"
                           + (f": {'; '.join(whys)}" if whys else "") + ")")
    line = (f"continuous_eval | {self.evaluated_here} checkpoint(s) "
            f"evaluated here, {self.evaluated_by_others} by other evaluators")
    if not_evaluated:
      line += f" | not evaluated: {', '.join(not_evaluated)}"
    if self.claims_lost:
      line += (f" | {len(self.claims_lost)} claim(s) taken over while "
               f"evaluated here ({ranges(list(self.claims_lost))}: left to "
               "the evaluator that took it over)")
    return line

  def fields(self) -> Dict[str, Any]:
    """The run summary's `evaluations` (`tfm_ext.model_dir.run_summary`)."""
    return {"checkpoints": (self.evaluated_here + self.evaluated_by_others
                            + len(self.missed)),
            "evaluated_here": self.evaluated_here,
            "evaluated_by_others": self.evaluated_by_others,
            "not_evaluated": len(self.missed),
            "complete": not self.missed,
            "missed": [dict(m) for m in self.missed],
            "claims_taken_over": list(self.claims_lost),
            "said": self.line()}


# The `why` of a checkpoint seen listed that no evaluator recorded.
_STOPPED_FIRST = "this evaluator stopped first"
_DELETED = "deleted before any evaluator recorded it"


def ranges(names: List[str]) -> str:
  """`ckpt-10, ckpt-20 ... ckpt-90`: at most the first two and the last."""
  names = sorted(names, key=checkpoint_state.step_of)
  if len(names) <= 3:
    return ", ".join(names)
  return f"{names[0]}, {names[1]} ... {names[-1]}"
