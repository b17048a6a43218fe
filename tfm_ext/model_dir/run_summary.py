"""What a run did, in `model_dir`: its summary, its starts, its end.

`RunSummary` is written to `model_dir/run_summary.json`. A run that does
not train writes its own instead, so that no mode overwrites another's
record: `eval` and `continuous_eval` write `eval_summary.json` (an evaluator
beside a trainer never overwrites the trainer's), `export` writes
`export_summary.json` (`path`). A training run records each start
(`training_starts/`, `record_training_start`) and its end
(`training_complete.json`, `mark_training_complete`): an evaluator beside it
stops once it has evaluated that step (`tfm_ext.run.continuous_eval`).
"""

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional

import dataclasses_json
import tensorflow as tf

from tfm_ext.model_dir import files

FILENAME = "run_summary.json"
EVAL_FILENAME = "eval_summary.json"
EXPORT_FILENAME = "export_summary.json"
# One record per training start; the append-only file of older versions is
# still read.
STARTS = "training_starts"
LEGACY_STARTS = "training_starts.jsonl"
_START_KEYS = {"restored_step": int, "time": (int, float)}


COMPLETE_MARKER = "training_complete.json"


def path(model_dir: str, mode) -> str:
  """Where a run of `mode` (a `tfm_ext.run.modes.Mode`) writes its summary:
  `run_summary.json` if it trains, else `eval_summary.json` if it
  evaluates, else `export_summary.json`."""
  name = (FILENAME if mode.trains else
          EVAL_FILENAME if mode.evaluates else EXPORT_FILENAME)
  return os.path.join(model_dir, name)


def mark_training_complete(model_dir: str, global_step: int) -> None:
  """Tells evaluators that no checkpoint after `global_step` will come."""
  files.write_json(
      os.path.join(model_dir, COMPLETE_MARKER),
      {"global_step": int(global_step), "time": time.time()})


def clear_training_complete(model_dir: str) -> None:
  """Removes the marker: a training run is (again) in progress."""
  marker = os.path.join(model_dir, COMPLETE_MARKER)
  if tf.io.gfile.exists(marker):
    tf.io.gfile.remove(marker)


def training_complete_step(model_dir: str) -> Optional[int]:
  """The step `mark_training_complete` recorded, or None."""
  try:
    return int(files.read_json(os.path.join(model_dir,
                                             COMPLETE_MARKER))["global_step"])
  except (tf.errors.NotFoundError, ValueError, KeyError, TypeError):
    return None


@dataclasses_json.dataclass_json
@dataclasses.dataclass
class RunSummary:
  """The record of one launcher invocation."""
  experiment: str
  mode: str
  trainer: str
  # "completed", "preempted" (checkpoint saved, exit 42) or "failed".
  status: str = "completed"
  # Why a run was preempted or failed (or that it had nothing to train).
  message: str = ""
  # The launcher's exit code: 0 completed, 42 preempted, for a failed run
  # 3 its data, 4 its storage, 1 a bug (`tfm_ext.base.failures`).
  exit_code: int = 0
  global_step: int = 0
  train_steps: int = 0
  # The step this process started from, and how many training starts in
  # this model_dir (processes or in-process restarts) resumed a checkpoint.
  resumed_from_step: int = 0
  resumes: int = 0
  # In-process restarts after transient errors in this process.
  restarts: int = 0
  # runtime.deterministic, and whether checkpoints hold the input iterator:
  # a resume is exact (bitwise an uninterrupted run) only with both.
  deterministic: bool = False
  input_in_checkpoint: bool = False
  # The strategy the run built (`none`: TF's default) and its replicas.
  strategy: str = ""
  replicas: int = 1
  # Threads of the tf.data pool given to the run's datasets (those that do
  # not size their own); 0: tf.data's own pool.
  input_threads: int = 0
  # False on the non-chief workers of a multi-worker job, which write no
  # summary into model_dir.
  chief: bool = True
  # `<phase>/<action>` -> how often that action raised while the run went
  # on (`tfm_ext.actions.guard.Guard`); a required one's failure ends the run.
  action_failures: Dict[str, int] = dataclasses.field(default_factory=dict)
  train_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  eval_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  # The best checkpoint when the run ended
  # (`tfm_ext.model_dir.best_checkpoints`): metric, value, global_step,
  # path; empty without one.
  best: Dict[str, Any] = dataclasses.field(default_factory=dict)
  # A continuous_eval's count of the checkpoints it knew of, as its end line
  # says it (`tfm_ext.model_dir.eval_ledger.Tally.fields`): `evaluated_here`,
  # `evaluated_by_others`, `not_evaluated` and `complete`, the `missed` ones
  # (checkpoint, global_step, status, why), `claims_taken_over`, and the
  # line itself (`said`); empty for the other modes.
  evaluations: Dict[str, Any] = dataclasses.field(default_factory=dict)
  # A run an action asked to stop (`tfm_ext.actions.plateau`: early
  # stopping, `context.stop`): the step it saved and stopped at, and why.
  stopped_early_at: Optional[int] = None
  stop_reason: str = ""
  # `trainer.reduce_lr_on_plateau`'s factor: each reduction (step, factor)
  # of this model_dir's runs, and the factor when the run ended.
  lr_reductions: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  lr_factor: Optional[float] = None
  examples_per_second: Optional[float] = None
  time_to_first_step_seconds: Optional[float] = None
  wall_seconds: float = 0.0

  def write(self, model_dir: str, filename: str = FILENAME) -> str:
    """Writes the summary whole (`files.write_text`); returns its path."""
    path = os.path.join(model_dir, filename)
    files.write_text(path, self.to_json(indent=2) + "\n")
    return path

  @classmethod
  def read(cls, model_dir: str, filename: str = FILENAME) -> "RunSummary":
    return cls.from_json(files.read_text(os.path.join(model_dir, filename)))


def record_training_start(model_dir: str, restored_step: int) -> int:
  """Records this training start in `model_dir`; returns the resumes so far.

  A start that restored a checkpoint (`restored_step > 0`) is a resume. Each
  start is an object of its own, `training_starts/<time_ns>-<pid>.json`,
  written before training, so a run killed at any point still counts.
  """
  now = time.time_ns()
  start = {"restored_step": int(restored_step), "time": now / 1e9}
  files.write_record(os.path.join(model_dir, STARTS), f"{now}-{os.getpid()}",
                      start)
  starts = training_starts(model_dir)
  if start not in starts:  # A listing may lag behind the write just made.
    starts.append(start)
  return sum(s["restored_step"] > 0 for s in starts)


def training_starts(model_dir: str) -> List[Dict[str, float]]:
  """Every training start recorded in `model_dir`, oldest first.

  A record that is not whole (cut short by a kill, or damaged) is skipped
  with a warning: the count of resumes may then miss that start.
  """
  starts = files.read_records(
      os.path.join(model_dir, STARTS), _START_KEYS,
      legacy_file=os.path.join(model_dir, LEGACY_STARTS))
  return sorted(starts, key=lambda s: s["time"])


def process_start_time() -> float:
  """When this process started (Linux: from /proc), else when we got here."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return time.time()
