"""`RunSummary`: what a run did, written to `model_dir/run_summary.json`."""

import dataclasses
import os
from typing import Dict, Optional

import dataclasses_json

FILENAME = "run_summary.json"


@dataclasses_json.dataclass_json
@dataclasses.dataclass
class RunSummary:
  """The record of one launcher invocation."""
  experiment: str
  mode: str
  trainer: str
  global_step: int = 0
  train_steps: int = 0
  train_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  eval_metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
  examples_per_second: Optional[float] = None
  time_to_first_step_seconds: Optional[float] = None
  wall_seconds: float = 0.0

  def write(self, model_dir: str) -> str:
    """Writes the summary atomically (temp file, fsync, rename)."""
    path = os.path.join(model_dir, FILENAME)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.write(self.to_json(indent=2) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    return path

  @classmethod
  def read(cls, model_dir: str) -> "RunSummary":
    with open(os.path.join(model_dir, FILENAME)) as f:
      return cls.from_json(f.read())
