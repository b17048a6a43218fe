"""`RunSummary`: what a run did, written to `model_dir/run_summary.json`."""

import dataclasses
import json
import os
import time
from typing import Dict, Optional

import dataclasses_json

from tfm_ext import _files

FILENAME = "run_summary.json"
STARTS = "training_starts.jsonl"


@dataclasses_json.dataclass_json
@dataclasses.dataclass
class RunSummary:
  """The record of one launcher invocation."""
  experiment: str
  mode: str
  trainer: str
  # "completed", "preempted" (checkpoint saved, exit 42) or "failed".
  status: str = "completed"
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
  train_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  eval_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  examples_per_second: Optional[float] = None
  time_to_first_step_seconds: Optional[float] = None
  wall_seconds: float = 0.0

  def write(self, model_dir: str) -> str:
    """Writes the summary atomically (temp file, fsync, rename)."""
    path = os.path.join(model_dir, FILENAME)
    _files.write_text_atomically(path, self.to_json(indent=2) + "\n")
    return path

  @classmethod
  def read(cls, model_dir: str) -> "RunSummary":
    with open(os.path.join(model_dir, FILENAME)) as f:
      return cls.from_json(f.read())


def record_training_start(model_dir: str, restored_step: int) -> int:
  """Appends this training start to the model_dir's log; returns resumes.

  A start that restored a checkpoint (`restored_step > 0`) is a resume. The
  log is append-only, so a run killed at any point still counts.
  """
  path = os.path.join(model_dir, STARTS)
  with open(path, "a") as f:
    f.write(json.dumps({"restored_step": int(restored_step),
                        "time": time.time()}) + "\n")
    f.flush()
    os.fsync(f.fileno())
  resumes = 0
  with open(path) as f:
    for line in f:
      try:
        resumes += json.loads(line)["restored_step"] > 0
      except (ValueError, KeyError):
        continue  # A line cut short by a kill.
  return resumes


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
