"""Crash-safe file writes shared by the records tfm_ext keeps in model_dir."""

import json
import os
from typing import Any


def write_text_atomically(path: str, text: str) -> None:
  """Writes `text` to `path`: temp file, fsync, rename; never half-written."""
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_json_atomically(path: str, value: Any) -> None:
  """Writes `value` as indented JSON to `path`, atomically."""
  write_text_atomically(path, json.dumps(value, indent=2) + "\n")
