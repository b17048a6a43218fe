"""A mutation trial of tfm_ext: small deliberate bugs, and whether tests fail.

Each mutation below is one realistic bug (an off-by-one, an inverted
comparison, a wrong default, a dropped call, a missed edge case), written as
an exact snippet of a library file and its replacement, with the tests that
should catch it. For each one the trial copies the repository (its tracked
files and the untracked ones git does not ignore, as they are in the working
tree now; with `--source=head`, the last commit's files only, without
anyone's uncommitted work) into a scratch directory, applies that one
mutation there, and runs

    python -m pytest -q -x -n 2 <its tests>

in the copy, with the copy first on `PYTHONPATH`, so the copy's `tfm_ext`
is the one imported (checked for each mutation: `tfm_ext.__file__`). A test
failure is "caught"; all passing is "survived". The repository itself is
never modified. Mutation `control` is an obvious bug that must be caught: if
it survives, the trial is not testing the copy.

    python tools/mutation_trial.py                  # every mutation
    python tools/mutation_trial.py --only lease_own_pid,curves_validation_order
    python tools/mutation_trial.py --list           # the table, nothing run
    python tools/mutation_trial.py --baseline       # the tests, unmutated

A snippet that does not occur exactly once in its file stops the trial
before anything runs. Results: a table on stdout and JSON at `--out`
(default under /tmp).
"""

import argparse
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
  id: str
  file: str  # Relative to the repository root.
  old: str  # Must occur exactly once in `file`.
  new: str
  bug: str
  tests: Tuple[str, ...]  # pytest paths or node ids.
  k: str = ""  # A pytest -k expression, if any.
  issue: str = ""  # The bug of issue 17 it stands for, if any.


# Test selections shared by several mutations: the in-process tests of a
# file, without its launcher runs.
LEASE_UNIT = "not two_trainers_started and not sigkilled"
CHECKPOINT_STATE_UNIT = ("not resumes and not continuous_eval_records and "
                         "not two_evaluators")
CLAIMS = "claim or racing"
RECOVERY_UNIT = "not transient and not lasting and not negative"

M = Mutation
MUTATIONS: Sequence[Mutation] = (
    # -- The control: obvious, must be caught. ------------------------------
    M("control", "tfm_ext/console.py",
      "  if steps <= 0 or seconds <= 0:\n    return None\n"
      "  return steps * global_batch_size / seconds\n",
      "  return None\n",
      "examples_per_second always None (control: must be caught)",
      ("tests/test_console.py",)),

    # -- The five bugs issue 17 lists. --------------------------------------
    M("issue_a_whole_batch_per_replica", "tfm_ext/inputs.py",
      "      return t[index * size:(index + 1) * size]\n",
      "      return t\n",
      "split_across_replicas gives every replica the worker's whole batch",
      ("tests/test_batches.py::"
       "test_each_worker_reads_its_share_and_splits_it_over_its_replicas",
       "tests/test_batches.py::"
       "test_mirrored_replicas_each_train_on_their_share_of_the_global_batch"),
      issue="a"),
    M("issue_b_complete_marker_kept", "tfm_ext/driver.py",
      "    continuous_eval.clear_training_complete(request.model_dir)\n",
      "",
      "training_complete.json is not cleared when a training run starts",
      ("tests/test_continuous_eval.py::"
       "test_a_training_run_clears_a_stale_training_complete_marker",),
      issue="b"),
    M("issue_c_rate_per_step", "tfm_ext/console.py",
      "  return steps * global_batch_size / seconds\n",
      "  return steps / seconds\n",
      "TrainProgress ex/s counts steps, not examples (off by the batch size)",
      ("tests/test_console.py",
       "tests/test_batches.py::"
       "test_examples_per_second_and_eta_count_global_batches"),
      issue="c"),
    M("issue_c_eta_by_batch", "tfm_ext/console.py",
      "        eta = remaining * steady_seconds / steady_steps\n",
      "        eta = remaining * steady_seconds / (steady_steps * "
      "max(self._batch, 1))\n",
      "TrainProgress ETA divided by the batch size",
      ("tests/test_console.py",
       "tests/test_batches.py::"
       "test_examples_per_second_and_eta_count_global_batches"),
      issue="c"),
    M("issue_d_ties_newest_first", "tfm_ext/best_checkpoint.py",
      'key=lambda e: (sign * e["value"], e["global_step"])',
      'key=lambda e: (sign * e["value"], -e["global_step"])',
      "best-checkpoint ties among the kept k ranked newest first",
      ("tests/test_best_checkpoint.py",), issue="d"),
    M("issue_e_reload_keeps_nan", "tfm_ext/best_checkpoint.py",
      "    if value is not None and math.isfinite(value):\n"
      "      return value\n",
      "    if value is not None:\n      return value\n",
      "a reloaded best-checkpoint manifest keeps a NaN entry",
      ("tests/test_best_checkpoint.py",), issue="e"),

    # -- export.py ----------------------------------------------------------
    M("export_latest_over_best", "tfm_ext/export.py",
      "  checkpoint = best or tf.train.latest_checkpoint(model_dir)\n",
      "  checkpoint = tf.train.latest_checkpoint(model_dir) or best\n",
      "--mode=export writes the latest checkpoint although a best exists",
      ("tests/test_export.py::"
       "test_launcher_exports_the_best_checkpoint_that_classifies_as_it_"
       "evaluated",)),
    M("export_stale_partial_kept", "tfm_ext/export.py",
      "  if tf.io.gfile.exists(partial):\n    tf.io.gfile.rmtree(partial)\n",
      "",
      "an interrupted export's hidden .partial directory is not cleared, so "
      "the next export of that step fails",
      ("tests/test_export.py",)),

    # -- curves.py ----------------------------------------------------------
    M("curves_validation_order", "tfm_ext/curves.py",
      "          if step < last and subdir == TRAIN_SUBDIR:\n",
      "          if step < last:\n",
      "an evaluation of an older checkpoint (an evaluator beside the "
      "trainer) drops the later validation rows, as a training resume does",
      ("tests/test_curves.py",)),
    M("curves_event_files_by_name", "tfm_ext/curves.py",
      '  return [(0, int(part), "") if part.isdigit() else (1, 0, part)\n'
      '          for part in name.split(".")]\n',
      '  return [(1, 0, part) for part in name.split(".")]\n',
      "event files ordered by name: writer 10 of a second read before "
      "writer 9, so a resume's rows are dropped instead of the lost ones",
      ("tests/test_curves.py",)),
    M("curves_columns_alphabetical", "tfm_ext/curves.py",
      "key=lambda name: (name.startswith(VALIDATION_PREFIX), name))",
      "key=lambda name: name)",
      "metrics.csv columns alphabetical: a training scalar after 'v' lands "
      "among the validation ones",
      ("tests/test_curves.py",)),
    M("curves_first_refresh_at_once", "tfm_ext/curves.py",
      "    self._due = clock() + every_seconds\n",
      "    self._due = clock()\n",
      "RefreshResults refreshes on its first output instead of waiting its "
      "interval",
      ("tests/test_curves.py",)),
    M("curves_pending_not_merged", "tfm_ext/curves.py",
      "      rows.setdefault(step, {}).update(values)\n",
      "      rows.setdefault(step, values)\n",
      "an evaluation's output is dropped when training logged the same step",
      ("tests/test_curves.py::"
       "test_train_and_eval_leaves_a_row_per_logged_step_and_a_figure",)),

    # -- console.py ---------------------------------------------------------
    M("console_ticker_boundary", "tfm_ext/console.py",
      "    if now - self._printed < self._every:\n",
      "    if now - self._printed <= self._every:\n",
      "EvalTicker prints a beat late (at more than every_seconds)",
      ("tests/test_console.py",)),
    M("console_ticker_not_reset", "tfm_ext/console.py",
      "    self._step, self._batches = global_step, 0\n",
      "    self._step = global_step\n",
      "EvalTicker.begin does not reset the batch count: the second "
      "evaluation counts on from the first",
      ("tests/test_console.py",)),
    M("console_ticker_negative_total", "tfm_ext/console.py",
      "    self._total = total if total and total > 0 else None\n",
      "    self._total = total\n",
      "EvalTicker with total=-1 (the whole validation set) prints "
      "'batch b/-1' and a negative ETA",
      ("tests/test_console.py",)),
    M("console_smoothing_swapped", "tfm_ext/console.py",
      "          SMOOTHING * new + (1 - SMOOTHING) * old\n",
      "          (1 - SMOOTHING) * new + SMOOTHING * old\n",
      "ex/s smoothing weights swapped (0.7 on the latest loop)",
      ("tests/test_console.py",)),
    M("console_nested_logs_flattened", "tfm_ext/console.py",
      '      out.update({f"{key}/{k}": v for k, v in '
      'scalars(value).items()})\n',
      "      out.update(scalars(value))\n",
      "nested logs lose their parent's name in the progress line and the "
      "run summary ('coco/AP' becomes 'AP', colliding with others)",
      ("tests/test_console.py",)),

    # -- params_file.py -----------------------------------------------------
    M("params_file_defaults_override", "tfm_ext/params_file.py",
      "      tree[section].setdefault(name, value)\n",
      "      tree[section][name] = value\n",
      "reading params.yaml, our fields' defaults replace the values an "
      "earlier tfm_ext wrote inline",
      ("tests/test_params_file.py::"
       "test_added_fields_an_earlier_version_wrote_inline_read_as_they_are",
       "tests/test_params_file.py::"
       "test_stock_tfm_parses_our_params_yaml_strictly",
       "tests/test_params_file.py::"
       "test_a_model_dir_stock_tfm_wrote_resumes_without_allow_config_change",
       "tests/test_params_file.py::"
       "test_python_tags_other_than_tfms_tuples_are_refused",
       "tests/test_config_drift.py")),
    M("params_file_added_fields_kept", "tfm_ext/params_file.py",
      "      del tree[section][name]\n",
      "      pass\n",
      "params.yaml keeps tfm_ext's added fields: stock TFM's strict parse "
      "refuses it",
      ("tests/test_params_file.py::"
       "test_stock_tfm_parses_our_params_yaml_strictly",)),
    M("params_file_alias_count", "tfm_ext/params_file.py",
      "      sizes[key] = 1 + sum(sizes[id(child)] for child in children)\n",
      "      sizes[key] = 1 + len(children)\n",
      "the alias-bomb check counts children, not what aliases expand to",
      ("tests/test_damaged_records.py::"
       "test_yaml_that_is_more_than_a_config_is_one_short_error",)),
    M("params_file_empty_file", "tfm_ext/params_file.py",
      '  if tree is None:\n    raise NotConfig("is empty")\n',
      "",
      "an empty YAML file reads as 'holds a NoneType' instead of 'is empty'",
      ("tests/test_damaged_records.py::"
       "test_yaml_that_is_more_than_a_config_is_one_short_error",)),

    # -- config_checks.py ---------------------------------------------------
    M("config_checks_validation_steps_zero", "tfm_ext/config_checks.py",
      "lambda v: _config_types.integer(v) and (v > 0 or v == -1),",
      "lambda v: _config_types.integer(v) and (v >= 0 or v == -1),",
      "validation_steps=0 accepted (an evaluation of nothing)",
      ("tests/test_config_checks.py",)),
    M("config_checks_loss_check_off_at_zero", "tfm_ext/config_checks.py",
      "    return self.trains and _config_types.integer(trials) and "
      "trials >= 0\n",
      "    return self.trains and _config_types.integer(trials) and "
      "trials > 0\n",
      "with recovery_max_trials=0 (TFM's default, the check on) "
      "loss_upper_bound and recovery_begin_steps are not checked",
      ("tests/test_config_checks.py",)),
    M("config_checks_modulo_swapped", "tfm_ext/config_checks.py",
      "      trainer.summary_interval % trainer.steps_per_loop):\n",
      "      trainer.steps_per_loop % trainer.summary_interval):\n",
      "summary_interval multiple check inverted (100 with loops of 50 "
      "refused)",
      ("tests/test_config_checks.py",)),
    M("config_checks_evaluator_reads_interval", "tfm_ext/config_checks.py",
      "         lambda use: use.trains and use.evaluates, "
      "_at_least(0, or_null=True),\n",
      "         _evaluates, _at_least(0, or_null=True),\n",
      "an evaluator refuses validation_interval, which only training reads",
      ("tests/test_config_checks.py",)),

    # -- _config_types.py ---------------------------------------------------
    M("config_types_bool_is_int", "tfm_ext/_config_types.py",
      "def integer(value) -> bool:\n"
      "  return isinstance(value, int) and not isinstance(value, bool)\n",
      "def integer(value) -> bool:\n  return isinstance(value, int)\n",
      "true passes as a whole number (trainer.train_steps=true is 1 step)",
      ("tests/test_config_checks.py",)),
    M("config_types_int_not_a_number", "tfm_ext/_config_types.py",
      "  return isinstance(value, (int, float)) and not "
      "isinstance(value, bool)\n",
      "  return isinstance(value, float)\n",
      "an integer refused where a float is declared "
      "(trainer.loss_upper_bound=100)",
      ("tests/test_config_checks.py",)),
    M("config_types_one_value_for_a_list", "tfm_ext/_config_types.py",
      "      return _accepts(args[0], value)\n    return all(",
      "      return False\n    return all(",
      "one value for a list field refused, though TFM's own configs run "
      "with it",
      ("tests/test_config_checks.py",)),

    # -- lease.py -----------------------------------------------------------
    M("lease_own_pid", "tfm_ext/lease.py",
      "    if here and held[\"pid\"] == self._pid:\n"
      "      return \"its pid is this process's: an earlier run of it left "
      "the lease\"\n",
      "",
      "a lease this process left (an earlier in-process run) is judged "
      "alive: the restarted run is refused for 60 s",
      ("tests/test_lease.py",), k=LEASE_UNIT),
    M("lease_deleted_means_taken", "tfm_ext/lease.py",
      "    if held is not None and not self._ours(held):\n",
      "    if not self._ours(held):\n",
      "a lease file deleted under the holder reads as taken over: the "
      "trainer stops instead of writing it again",
      ("tests/test_lease.py",), k=LEASE_UNIT),
    M("lease_pid_zero", "tfm_ext/lease.py",
      "            and held[\"pid\"] > 0):",
      "            ):",
      "a lease naming pid 0 is read as a lease: os.kill(0) signals the "
      "group, so it looks alive and blocks the relaunch",
      ("tests/test_lease.py",), k=LEASE_UNIT),

    # -- checkpoint_state.py ------------------------------------------------
    M("checkpoint_state_chosen_twice", "tfm_ext/checkpoint_state.py",
      "  kept = [p for p in candidates if step_of(p) < step_of(chosen)]\n",
      "  kept = [p for p in candidates if step_of(p) <= step_of(chosen)]\n",
      "a rebuilt state file lists the restored checkpoint twice",
      ("tests/test_checkpoint_state.py",), k=CHECKPOINT_STATE_UNIT),
    M("checkpoint_state_elements_not_bytes", "tfm_ext/checkpoint_state.py",
      "  return count * dtype.size\n",
      "  return count\n",
      "the cheap check counts elements, not bytes: an older checkpoint cut "
      "to a fraction of its data is listed as whole",
      ("tests/test_checkpoint_state.py",), k=CHECKPOINT_STATE_UNIT),
    M("checkpoint_state_oldest_first", "tfm_ext/checkpoint_state.py",
      "  for path in reversed(candidates):\n",
      "  for path in candidates:\n",
      "the oldest readable checkpoint is restored, not the newest",
      ("tests/test_checkpoint_state.py",), k=CHECKPOINT_STATE_UNIT),
    M("checkpoint_state_preserved", "tfm_ext/checkpoint_state.py",
      "      last_preserved_timestamp=min(stamps) - 1)\n",
      "      last_preserved_timestamp=max(stamps))\n",
      "a rebuilt state file marks its checkpoints preserved: max_to_keep "
      "never rotates them",
      ("tests/test_checkpoint_state.py",), k=CHECKPOINT_STATE_UNIT),

    # -- eval_claims.py -----------------------------------------------------
    M("claims_release_anothers", "tfm_ext/eval_claims.py",
      "    if held is not None and held.get(\"owner\") == self.owner:\n"
      "      try:\n",
      "    if held is not None:\n      try:\n",
      "release deletes the claim of the evaluator that took it over",
      ("tests/test_checkpoint_state.py",), k=CLAIMS),
    M("claims_no_settle", "tfm_ext/eval_claims.py",
      "    self._write(name, renewals=0)\n"
      "    self._sleep(CLAIM_SETTLE_SECONDS)\n",
      "    self._write(name, renewals=0)\n",
      "a claim is read back at once, without the settle time: two "
      "evaluators both win",
      ("tests/test_checkpoint_state.py",), k=CLAIMS),
    M("claims_renew_over_takeover", "tfm_ext/eval_claims.py",
      "          held = self._read(name)\n"
      "          if held is not None and held.get(\"owner\") != self.owner:\n"
      "            return  # Taken over while this one stalled: not ours to "
      "renew.\n",
      "",
      "a stalled evaluator's renewal overwrites the claim of the one that "
      "took it over",
      ("tests/test_checkpoint_state.py",), k=CLAIMS),
    M("claims_renewal_not_seen", "tfm_ext/eval_claims.py",
      "    if seen is None or seen[0] != key:\n",
      "    if seen is None:\n",
      "a renewed claim is judged by when it was first seen: taken over "
      "while its evaluator is alive",
      ("tests/test_checkpoint_state.py",), k=CLAIMS),

    # -- actions.py (DivergenceRecovery) ------------------------------------
    M("recovery_begin_from_first", "tfm_ext/actions.py",
      "      if first_loop or last < self._begin_steps or "
      "loss <= self._bound:\n",
      "      if first_loop or first < self._begin_steps or "
      "loss <= self._bound:\n",
      "the loss bound counts from the loop's first step, not the global "
      "step at its end (TFM's RecoveryCondition): the loop that reaches "
      "recovery_begin_steps is not checked",
      ("tests/test_recovery.py",), k=RECOVERY_UNIT),
    M("recovery_loop_start_kept", "tfm_ext/actions.py",
      "    self._loop_start = int(self._global_step.numpy())\n    message",
      "    message",
      "after a restore, the next failure names steps from before it",
      ("tests/test_recovery.py",), k=RECOVERY_UNIT),
    M("recovery_one_trial_short", "tfm_ext/actions.py",
      "    if self.trials > self._max_trials or latest is None:\n",
      "    if self.trials >= self._max_trials or latest is None:\n",
      "recovery_max_trials=N recovers N-1 times",
      ("tests/test_recovery.py",), k=RECOVERY_UNIT),
    M("recovery_every_loop_first", "tfm_ext/actions.py",
      "    first_loop, self._first_loop = self._first_loop, False\n",
      "    first_loop = self._first_loop\n",
      "every loop is treated as the one-step first loop: the bound is "
      "never checked",
      ("tests/test_recovery.py",), k=RECOVERY_UNIT),

    # -- best_checkpoint.py -------------------------------------------------
    M("best_orphans_moved_not_removed", "tfm_ext/_best_checkpoint_files.py",
      "    if orphan and kept(stem) and not temp:\n",
      "    if orphan and not temp:\n",
      "an interrupted export's orphan is moved to unranked/ instead of "
      "removed, though the manifest is intact",
      ("tests/test_best_checkpoint.py",
       "tests/test_damaged_records.py::"
       "test_a_damaged_best_checkpoint_manifest_is_rebuilt_from_info_json")),
    M("best_reevaluated_twice", "tfm_ext/best_checkpoint.py",
      "    if any(e[\"global_step\"] == step for e in self._entries):\n"
      "      return False  # Already judged (a re-evaluated checkpoint).\n",
      "",
      "a re-evaluated checkpoint is entered twice in the top k",
      ("tests/test_best_checkpoint.py",)),
    M("best_tie_displaces", "tfm_ext/best_checkpoint.py",
      "    return new > old if self._comp == \"higher\" else new < old\n",
      "    return new >= old if self._comp == \"higher\" else new <= old\n",
      "a tie with the worst kept gets in",
      ("tests/test_best_checkpoint.py",)),
    M("best_adopts_nan", "tfm_ext/best_checkpoint.py",
      "    value = self._rankable_value(name, metrics)\n",
      "    value = self._value(metrics)\n",
      "a NaN best that TFM's exporter recorded in info.json is adopted",
      ("tests/test_best_checkpoint.py",)),
    M("best_unrankable_deleted", "tfm_ext/best_checkpoint.py",
      "kept=lambda stem: bool(self._damage) or stem in self._unrankable)",
      "kept=lambda stem: bool(self._damage))",
      "a recorded checkpoint this run cannot rank (NaN, a changed metric) is "
      "deleted at start-up instead of moved to unranked/",
      ("tests/test_best_checkpoint.py",)),
    M("best_smaller_k_deletes", "tfm_ext/best_checkpoint.py",
      "    for entry in entries[self._k:]:  # A smaller k than the manifest's.\n",
      "    for entry in []:  # A smaller k than the manifest's.\n",
      "a smaller best_checkpoint_top_k deletes the best checkpoints beyond it "
      "at start-up",
      ("tests/test_best_checkpoint.py",)),
    M("best_stale_manifest", "tfm_ext/best_checkpoint.py",
      "    self._entries = self._ranked(manifest)[:self._k]\n",
      "    del manifest\n",
      "an exporter ranks against the manifest as it read it at start-up, so "
      "an evaluator beside another one drops the other's better checkpoint",
      ("tests/test_best_checkpoint.py",)),

    # -- inputs.py ----------------------------------------------------------
    M("inputs_private_pool_by_default", "tfm_ext/inputs.py",
      "  return runtime.dataset_num_private_threads or 0\n",
      "  return runtime.dataset_num_private_threads or 2\n",
      "a private tf.data pool of 2 threads by default, not tf.data's own",
      ("tests/test_inputs.py",)),
    M("inputs_pool_overrides_pipeline", "tfm_ext/inputs.py",
      "  if not threads or "
      "dataset.options().threading.private_threadpool_size:\n",
      "  if not threads:\n",
      "with_input_threads replaces the pool a pipeline sized itself",
      ("tests/test_inputs.py",)),
    M("inputs_context_counts_replicas", "tfm_ext/inputs.py",
      "                                    num_replicas_in_sync=workers)\n",
      "                                    num_replicas_in_sync="
      "strategy.num_replicas_in_sync)\n",
      "the host pipeline's context counts replicas, not workers: each "
      "worker reads global / replicas rows",
      ("tests/test_inputs.py",
       "tests/test_batches.py::"
       "test_each_worker_reads_its_share_and_splits_it_over_its_replicas")),
    M("inputs_context_always_passed", "tfm_ext/inputs.py",
      "    fn_kwargs = (dict(kwargs, input_context=input_context) if "
      "takes_context\n                 else kwargs)\n",
      "    fn_kwargs = dict(kwargs, input_context=input_context)\n",
      "threaded_dataset_fn passes input_context to a dataset function that "
      "takes none",
      ("tests/test_inputs.py",)),

    # -- experiment.py ------------------------------------------------------
    M("experiment_post_eval_logs_dropped", "tfm_ext/experiment.py",
      "  elif mode == \"train_and_post_eval\":\n"
      "    eval_logs = summary.eval_metrics\n",
      "",
      "run_experiment returns {} for train_and_post_eval, not the "
      "evaluation's logs",
      ("tests/test_experiment.py", "tests/test_tfm_core_suites.py")),

    # -- devices.py ---------------------------------------------------------
    M("devices_xla_on_several_cpus", "tfm_ext/devices.py",
      "  if len(devices) == 1:\n    return \"replicated_step\"\n",
      "  if devices:\n    return \"replicated_step\"\n",
      "runtime.xla_on_cpu over several CPU devices is not refused",
      ("tests/test_devices.py",)),
    M("devices_wrong_step_compiled", "tfm_ext/devices.py",
      "  if where == \"task_step\":\n"
      "    task_step = tf.function(task_step, jit_compile=True)\n",
      "  if where == \"task_step\":\n"
      "    replicated_step = tf.function(replicated_step, jit_compile=True)\n",
      "with GPUs enable_xla compiles the replicated step, which "
      "synchronizes replicas, not each replica's task step",
      ("tests/test_devices.py",)),
)


# -- Copies ------------------------------------------------------------------

def source_files(repo: str) -> List[str]:
  """Tracked files and untracked ones git does not ignore, as they are now."""
  out = subprocess.run(
      ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
      cwd=repo, check=True, capture_output=True).stdout.decode()
  return sorted({p for p in out.split("\0")
                 if p and os.path.isfile(os.path.join(repo, p))})


def copy_tree(repo: str, files: Sequence[str], dest: str) -> None:
  for path in files:
    target = os.path.join(dest, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(os.path.join(repo, path), target)


def copy_source(repo: str, source: str, dest: str) -> int:
  """Copies the repository into `dest`; returns how many files.

  `source` "worktree": the working tree's files (`source_files`); "head":
  the last commit only, without others' uncommitted work.
  """
  if source == "worktree":
    files = source_files(repo)
    copy_tree(repo, files, dest)
    return len(files)
  os.makedirs(dest)
  archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"],
                           cwd=repo, check=True, capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
  return len(_git("ls-files").splitlines())


def apply(root: str, mutation: Mutation) -> None:
  path = os.path.join(root, mutation.file)
  with open(path) as f:
    text = f.read()
  count = text.count(mutation.old)
  if count != 1:
    raise SystemExit(f"mutation {mutation.id}: its snippet occurs {count} "
                     f"times in {mutation.file}, not once:\n{mutation.old}")
  with open(path, "w") as f:
    f.write(text.replace(mutation.old, mutation.new))


def check_snippets(root: str, mutations: Sequence[Mutation]) -> None:
  """Stops the trial if any snippet is not in its file exactly once."""
  problems = []
  for m in mutations:
    with open(os.path.join(root, m.file)) as f:
      count = f.read().count(m.old)
    if count != 1:
      problems.append(f"{m.id}: {count} occurrences in {m.file}")
  ids = [m.id for m in mutations]
  problems += [f"{i}: id used twice" for i in set(ids) if ids.count(i) > 1]
  if problems:
    raise SystemExit("Mutations that do not apply:\n  " +
                     "\n  ".join(problems))


def imported_from(root: str) -> str:
  """`tfm_ext.__file__` as a test process in the copy imports it."""
  return subprocess.run(
      [sys.executable, "-c", "import tfm_ext; print(tfm_ext.__file__)"],
      cwd=root, env=_env(root), check=True, capture_output=True,
      text=True).stdout.strip()


def _env(root: str):
  env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("TFM_EXT_DATA_DIR", None)  # Each session makes its own.
  return env


# -- Runs --------------------------------------------------------------------

def pytest_command(tests: Sequence[str], k: str, basetemp: str,
                   workers: int) -> List[str]:
  command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", str(workers),
             "-p", "no:cacheprovider", f"--basetemp={basetemp}",
             "-o", "console_output_style=classic"]
  if k:
    command += ["-k", k]
  return command + list(tests)


def run_tests(root: str, tests: Sequence[str], k: str, workers: int,
              timeout: float) -> dict:
  basetemp = os.path.join(root, ".pytest_tmp")
  command = pytest_command(tests, k, basetemp, workers)
  start = time.monotonic()
  try:
    proc = subprocess.run(command, cwd=root, env=_env(root),
                          capture_output=True, text=True, timeout=timeout)
    rc, output = proc.returncode, proc.stdout + proc.stderr
  except subprocess.TimeoutExpired as e:
    rc = None
    output = ((e.stdout or b"").decode(errors="replace") if isinstance(
        e.stdout, bytes) else (e.stdout or ""))
  seconds = time.monotonic() - start
  failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output,
                                 re.MULTILINE)))
  summary = [l for l in output.splitlines() if re.search(
      r"\b(passed|failed|error|no tests ran)\b", l)]
  return {"rc": rc, "seconds": round(seconds, 1), "failed": failed,
          "summary": summary[-1] if summary else "",
          "tail": output[-4000:], "command": command}


def outcome(result: dict) -> str:
  rc = result["rc"]
  if rc is None:
    return "timeout"  # A hang: counted as caught, and shown as such.
  if rc == 0:
    return "survived"
  if rc in (1, 2):  # Tests failed, or collection failed / -x stopped.
    return "caught"
  return f"error(rc={rc})"  # 4: usage, 5: no tests ran.


def trial(mutations: Sequence[Mutation], args) -> List[dict]:
  scratch = tempfile.mkdtemp(prefix="mutation_trial_", dir=args.scratch)
  template = os.path.join(scratch, "template")
  count = copy_source(REPO, args.source, template)
  check_snippets(template, mutations)
  print(f"{count} files copied from {REPO} ({args.source}) to {template}; "
        f"{len(mutations)} mutations", flush=True)
  results = []
  for number, mutation in enumerate(mutations, 1):
    root = os.path.join(scratch, mutation.id)
    shutil.copytree(template, root, symlinks=True)
    apply(root, mutation)
    where = imported_from(root)
    if not where.startswith(root + os.sep):
      raise SystemExit(f"{mutation.id}: the copy imports tfm_ext from "
                       f"{where}, not from {root}")
    result = run_tests(root, mutation.tests, mutation.k, args.workers,
                       args.timeout)
    result.update(id=mutation.id, file=mutation.file, bug=mutation.bug,
                  issue=mutation.issue, tests=list(mutation.tests),
                  k=mutation.k, tfm_ext_file=where,
                  outcome=outcome(result))
    results.append(result)
    print(f"[{number}/{len(mutations)}] {mutation.id}: {result['outcome']} "
          f"in {result['seconds']:.0f} s "
          f"{' '.join(result['failed'][:2]) or result['summary']}",
          flush=True)
    if not args.keep:
      shutil.rmtree(root, ignore_errors=True)
  if not args.keep:
    shutil.rmtree(scratch, ignore_errors=True)
  return results


def baseline(mutations: Sequence[Mutation], args) -> List[dict]:
  """Runs each distinct test selection on the unmutated copy: all must pass."""
  scratch = tempfile.mkdtemp(prefix="mutation_baseline_", dir=args.scratch)
  root = os.path.join(scratch, "repo")
  copy_source(REPO, args.source, root)
  groups = {}
  for m in mutations:
    groups.setdefault(m.k, set()).update(m.tests)
  results = []
  for k, tests in sorted(groups.items()):
    # A node id inside a file that is selected whole runs with the file.
    whole = {t for t in tests if "::" not in t}
    tests = sorted(whole | {t for t in tests
                            if t.split("::")[0] not in whole})
    result = run_tests(root, tests, k, args.workers, args.timeout * 3)
    result.update(id=f"baseline[{k or 'all'}]", tests=tests, k=k,
                  outcome="passed" if result["rc"] == 0 else "FAILED")
    print(f"{result['id']}: {result['outcome']} in {result['seconds']:.0f} s "
          f"{result['summary']} {' '.join(result['failed'])}", flush=True)
    results.append(result)
  if not args.keep:
    shutil.rmtree(scratch, ignore_errors=True)
  return results


def _git(*args) -> str:
  return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                        text=True).stdout


def table(results: Sequence[dict]) -> str:
  lines = [f"{'id':40} {'module':22} {'outcome':9} {'s':>5}  caught by"]
  for r in results:
    module = os.path.basename(r.get("file", ""))
    caught_by = ", ".join(t.split("::", 1)[-1] for t in r.get("failed", []))
    lines.append(f"{r['id']:40} {module:22} {r['outcome']:9} "
                 f"{r['seconds']:5.0f}  {caught_by}")
  caught = sum(r["outcome"] in ("caught", "timeout") for r in results)
  lines.append(f"caught {caught} of {len(results)}; "
               f"{sum(r['seconds'] for r in results) / 60:.1f} min")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="",
                      help="comma-separated mutation ids (default: all)")
  parser.add_argument("--list", action="store_true",
                      help="print the mutations and exit")
  parser.add_argument("--baseline", action="store_true",
                      help="run the tests unmutated instead")
  stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
  parser.add_argument("--out", default=f"/tmp/mutation_trial_{stamp}.json")
  parser.add_argument("--scratch", default=None,
                      help="where the copies go (default: the temp dir)")
  parser.add_argument("--source", choices=("worktree", "head"),
                      default="worktree",
                      help="copy the working tree's files, or HEAD's only")
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--timeout", type=float, default=900,
                      help="seconds per mutation's test run")
  parser.add_argument("--keep", action="store_true",
                      help="keep the mutated copies")
  args = parser.parse_args(argv)

  mutations = list(MUTATIONS)
  if args.only:
    wanted = args.only.split(",")
    unknown = set(wanted) - {m.id for m in mutations}
    if unknown:
      parser.error(f"unknown mutation ids: {sorted(unknown)}")
    mutations = [m for m in mutations if m.id in wanted]
  if args.list:
    check_snippets(REPO, mutations)
    for m in mutations:
      tests = " ".join(m.tests) + (f" -k '{m.k}'" if m.k else "")
      print(f"{m.id} [{m.file}] {m.bug}\n    {tests}")
    return 0

  # The state the copies are taken from (others may be editing the tree).
  head, status = _git("rev-parse", "HEAD").strip(), _git("status", "--short")
  start = time.monotonic()
  results = baseline(mutations, args) if args.baseline else trial(
      mutations, args)
  wall = time.monotonic() - start
  if not args.baseline:
    print(table(results))
  print(f"wall {wall / 60:.1f} min; JSON: {args.out}")
  with open(args.out, "w") as f:
    json.dump({"repo": REPO, "source": args.source, "head": head,
               "status": status,
               "wall_seconds": round(wall, 1),
               "baseline": args.baseline, "results": results}, f, indent=1)
  if args.baseline:
    return int(any(r["rc"] != 0 for r in results))
  control = [r for r in results if r["id"] == "control"]
  if control and control[0]["outcome"] != "caught":
    print("The control survived: the trial does not test the copy.")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
