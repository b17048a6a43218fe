"""Refuses to resume with a config that would make the resume wrong.

A training job that finds a checkpoint in `model_dir` compares its config
with the `params.yaml` the earlier run wrote. Fields that only change how
long or how often things happen (`HARMLESS`) may differ; any other change
(model, data, batch size, optimizer, trainer name...) is refused with a
readable diff, unless the user passes `--allow_config_change`.
"""

from typing import Any, Dict, List, Tuple

import tensorflow as tf
import yaml

from tfm_ext.base import logs
from tfm_ext.model_dir import params_file
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.config import added_fields

# Dotted prefixes of fields that a resumed run may change.
HARMLESS = (
    "trainer.train_steps",
    "trainer.steps_per_loop",
    "trainer.summary_interval",
    "trainer.checkpoint_interval",
    "trainer.max_to_keep",
    "trainer.validation_interval",
    "trainer.validation_steps",
    "trainer.continuous_eval_timeout",
    "trainer.best_checkpoint_",
    # When to stop: it changes no step (more patience goes on training).
    "trainer.early_stopping",
    "runtime.tpu",
    # A one-replica mirror or none: the same data and math (only dropout's
    # random stream differs), and either restores the other's checkpoints.
    "runtime.mirror_one_device",
    # Threads change neither the data's order nor the iterator's checkpoint.
    "runtime.dataset_num_private_threads",
    # Where progress is POSTed (`tfm_ext.actions.notify`).
    "runtime.notify_url",
)


def diff(old: Dict[str, Any], new: Dict[str, Any],
         harmless: Tuple[str, ...] = HARMLESS) -> List[str]:
  """Lines `key: old -> new` for every field that differs, but `harmless`."""
  # Every leaf, as it is: a list of sub-configs compares whole.
  old_flat, new_flat = dict(logs.leaves(old, ".")), dict(logs.leaves(new, "."))
  lines = []
  for key in sorted(set(old_flat) | set(new_flat)):
    if key.startswith(harmless):
      continue
    before = old_flat.get(key, "<absent>")
    after = new_flat.get(key, "<absent>")
    if before != after:
      lines.append(f"  {key}: {before!r} -> {after!r}")
  return lines


def check_unchanged(params, model_dir: str, allow_change: bool) -> None:
  """Raises `UsageError` if resuming `model_dir` with `params` is unsafe."""
  saved = f"{model_dir}/params.yaml"
  if not (tf.io.gfile.exists(saved) and checkpoint_state.latest(model_dir)):
    return
  # A params.yaml stock TFM wrote lacks our fields: they are their defaults.
  try:
    old = params_file.read(saved, defaults=added_fields.defaults())
  except ValueError as e:  # _files.Damaged, naming the file.
    raise UsageError(
        f"{e}, so resuming --model_dir={model_dir!r} cannot be checked "
        f"against the config of its checkpoints. Restore the file, or remove "
        f"{params_file.PARAMS} and {params_file.ADDED} to resume with this "
        "config.") from e
  # Round-trip through YAML, so both sides have one type.
  new = yaml.load(params_file.dump(params.as_dict()), Loader=params_file.Loader)
  lines = diff(old, new)
  if lines and not allow_change:
    raise UsageError(
        f"--model_dir={model_dir!r} holds a checkpoint of a run with another "
        "config, and resuming it with this one would not continue that run:\n"
        + "\n".join(lines) + "\nUse a new --model_dir, or pass "
        "--allow_config_change to resume anyway.")
