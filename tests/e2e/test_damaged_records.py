"""Damaged records, YAML that is more than data, and signals at any moment.

Each damaged record in a trained `model_dir` is read by what reads it in a
run, in-process: it is refused with one `UsageError` before anything is
written, skipped with a warning, or rebuilt as documented, and nothing else
in `model_dir` changes. Configs load as data: a Python tag, an empty file
or an alias bomb is one short error. A few rows run the launcher for real:
exit codes, the one `error:`/`preempted:` line, and signals in start-up and
to an evaluator.
"""

import logging as std_logging
import os
import shutil
import signal
import time

import pytest

from conftest import built_once

# The trained model_dir: three evaluations, so three best checkpoints
# (digits_convnet keeps the top 3 by accuracy).
TRAIN = ("trainer.train_steps=6,trainer.steps_per_loop=2,"
         "trainer.summary_interval=2,trainer.checkpoint_interval=2,"
         "trainer.validation_interval=2,trainer.validation_steps=2")
EXP = "digits_convnet"

MANIFEST = "best_ckpt/best_checkpoints.json"
# Binary, on one line (for the JSON-lines rows).
BINARY = b"\x89PNG\r\x1a\x00\xff\xfe\xfd garbage"
# 9 levels of 9 aliases: 382 bytes that stand for 9**9 nodes.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9)
    + "]\n" for i in range(8))


def _modules():
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  from tfm_ext.model_dir import best_checkpoints  # pylint: disable=g-import-not-at-top
  from tfm_ext.model_dir import eval_ledger  # pylint: disable=g-import-not-at-top
  from tfm_ext.run import driver  # pylint: disable=g-import-not-at-top
  from tfm_ext.config import params as params_lib  # pylint: disable=g-import-not-at-top
  from tfm_ext.model_dir import run_summary  # pylint: disable=g-import-not-at-top
  return best_checkpoints, eval_ledger, driver, params_lib, run_summary


def _train(folder):
  """Fills `folder`/m: 6 steps of train_and_eval, and a continuous ledger."""
  _, eval_ledger, driver, params_lib, _ = _modules()
  model_dir = os.path.join(folder, "m")
  params = params_lib.build(params_lib.ConfigSources(
      experiment=EXP, params_override=TRAIN))
  summary = driver.execute(driver.prepare(driver.RunRequest(
      experiment=EXP, mode="train_and_eval", model_dir=model_dir,
      params=params)))
  assert summary.status == "completed", summary.message
  ledger = eval_ledger.EvalLedger(model_dir)
  for step in (2, 4, 6):
    ledger.record(f"{model_dir}/ckpt-{step}", "evaluated", {"accuracy": 0.5})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
  """The trained model_dir, built once a session; tests get a copy."""
  del data_dir  # Sets TFM_EXT_DATA_DIR.
  return os.path.join(
      built_once(tmp_path_factory, "damaged_records_trained", _train), "m")


@pytest.fixture
def model_dir(trained, tmp_path):
  path = str(tmp_path / "m")
  shutil.copytree(trained, path)
  return path


def snapshot(model_dir, skip=()):
  """Every file under `model_dir` (but those under `skip`): name -> bytes."""
  files = {}
  for root, _, names in os.walk(model_dir):
    for name in names:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, model_dir)
      if not rel.startswith(skip):
        with open(path, "rb") as f:
          files[rel] = f.read()
  return files


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb" if isinstance(data, bytes) else "w") as f:
    f.write(data)


# -- Records a run reads ------------------------------------------------------

def _resume(model_dir):
  """What a training launch does before writing: `driver.prepare`."""
  _, _, driver, params_lib, _ = _modules()
  params = params_lib.build(params_lib.ConfigSources(
      experiment=EXP, params_override=TRAIN))
  return driver.prepare(driver.RunRequest(
      experiment=EXP, mode="train", model_dir=model_dir, params=params))


def _follow(model_dir):
  """What an evaluator launch does first: follow the trainer's params.yaml."""
  _, _, _, params_lib, _ = _modules()
  sources = params_lib.ConfigSources(experiment=EXP)
  return params_lib.follow_trainer(sources, params_lib.build(sources),
                                   model_dir, wait=False)


PARAMS_DAMAGE = [
    ("binary", BINARY, "params.yaml is not UTF-8 text"),
    ("not_yaml", "trainer: {train_steps: [4\n", "params.yaml is not valid "
     "YAML: "),
    ("empty", "", "params.yaml is empty"),
    ("a_list", "- trainer\n- task\n", "params.yaml holds a list, not a "
     "mapping"),
    ("python_tag", "task: !!python/name:os.system\n", "params.yaml holds "
     "more than data"),
    ("alias_bomb", ALIAS_BOMB, "params.yaml repeats more than 100000 YAML "
     "nodes"),
    ("section_not_mapping", "trainer: [1, 2]\n", "params.yaml is damaged: "
     "its trainer is a list"),
]


@pytest.mark.parametrize("reader", [_resume, _follow],
                         ids=["resume_train", "evaluator_follows"])
@pytest.mark.parametrize("damage, fragment", [
    *[(d, f) for _, d, f in PARAMS_DAMAGE],
    # Our added fields, beside it.
    ({"tfm_ext_params.yaml": BINARY}, "tfm_ext_params.yaml is not UTF-8"),
], ids=[i for i, _, _ in PARAMS_DAMAGE] + ["added_fields_binary"])
def test_a_damaged_params_yaml_is_refused_before_anything_is_written(
    model_dir, reader, damage, fragment):
  from tfm_ext.base.errors import UsageError  # pylint: disable=g-import-not-at-top
  damage = damage if isinstance(damage, dict) else {"params.yaml": damage}
  for name, data in damage.items():
    _write(os.path.join(model_dir, name), data)
  before = snapshot(model_dir)
  with pytest.raises(UsageError) as e:
    reader(model_dir)
  first_line = str(e.value).splitlines()[0]
  assert fragment in first_line, first_line
  assert len(str(e.value)) < 1000, str(e.value)[:2000]
  assert snapshot(model_dir) == before


def _starts(model_dir):
  return _modules()[4].training_starts(model_dir)


def _ledger(model_dir):
  return _modules()[1].read_ledger(model_dir)


SKIPPED = [
    # (id, reader, damaged file, bytes, records still read)
    ("start_binary", _starts, "training_starts/9-1.json", BINARY, 1),
    ("start_cut_short", _starts, "training_starts/9-1.json",
     b'{"restored_step": 0, "ti', 1),
    ("start_a_list", _starts, "training_starts/9-1.json", b"[1, 2]", 1),
    ("start_wrong_types", _starts, "training_starts/9-1.json",
     b'{"restored_step": "four", "time": null}', 1),
    ("start_legacy_binary_line", _starts, "training_starts.jsonl",
     b'{"restored_step": 2, "time": 1.0}\n' + BINARY + b"\n", 2),
    ("ledger_binary", _ledger, "eval_ledger/ckpt-8.json", BINARY, 3),
    ("ledger_empty", _ledger, "eval_ledger/ckpt-8.json", b"", 3),
    ("ledger_legacy_binary_line", _ledger, "eval_ledger.jsonl",
     BINARY + b"\n", 3),
]


@pytest.mark.parametrize("reader, name, data, count",
                         [row[1:] for row in SKIPPED],
                         ids=[row[0] for row in SKIPPED])
def test_a_damaged_event_record_is_skipped_with_one_warning(
    model_dir, caplog, reader, name, data, count):
  path = os.path.join(model_dir, name)
  _write(path, data)
  before = snapshot(model_dir)
  with caplog.at_level(std_logging.WARNING):
    records = reader(model_dir)
  assert len(records) == count, records
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno >= std_logging.WARNING]
  assert len(warnings) == 1 and warnings[0].startswith(f"Skipping {path}"), (
      warnings)
  assert snapshot(model_dir) == before


def test_a_damaged_training_complete_marker_reads_as_absent(model_dir):
  _, _, _, _, run_summary = _modules()
  assert run_summary.training_complete_step(model_dir) == 6
  _write(os.path.join(model_dir, run_summary.COMPLETE_MARKER), BINARY)
  before = snapshot(model_dir)
  # An evaluator then stops at train_steps; the next training rewrites it.
  assert run_summary.training_complete_step(model_dir) is None
  assert snapshot(model_dir) == before


def test_a_resume_rebuilds_or_skips_every_other_damaged_record(
    model_dir, caplog):
  _, _, driver, params_lib, run_summary = _modules()
  for name in ("run_summary.json", "training_complete.json", MANIFEST,
               "training_starts/9-1.json", "eval_ledger/ckpt-8.json"):
    _write(os.path.join(model_dir, name), BINARY)
  params = params_lib.build(params_lib.ConfigSources(
      experiment=EXP, params_override=TRAIN.replace("=6", "=8")))
  with caplog.at_level(std_logging.WARNING):
    summary = driver.execute(driver.prepare(driver.RunRequest(
        experiment=EXP, mode="train_and_eval", model_dir=model_dir,
        params=params)))
  assert summary.status == "completed", summary.message
  assert (summary.resumed_from_step, summary.global_step) == (6, 8)
  assert summary.resumes == 1  # The damaged start is not counted.
  assert run_summary.training_complete_step(model_dir) == 8
  assert len(run_summary.training_starts(model_dir)) == 2
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno >= std_logging.WARNING]
  assert [w for w in warnings if w.startswith(
      f"Skipping {model_dir}/training_starts/9-1.json")], warnings
  assert [w for w in warnings if "best_checkpoints.json is damaged" in w
          and "Rebuilt" in w], warnings
  # The driver does not read the run summary; the launcher rewrites it.
  with open(os.path.join(model_dir, "run_summary.json"), "rb") as f:
    assert f.read() == BINARY


def _best(model_dir):
  best_checkpoints, _, _, params_lib, _ = _modules()
  params = params_lib.build(params_lib.ConfigSources(
      experiment=EXP, params_override=TRAIN))
  return best_checkpoints.maybe_create(params, model_dir)


@pytest.mark.parametrize("damage, kept", [
    ({MANIFEST: BINARY}, "info"),
    ({MANIFEST: b'{"metric": "accuracy", "checkpoints": [{"pa'}, "info"),
    ({MANIFEST: b"[]"}, "info"),
    ({MANIFEST: b'{"checkpoints": [{"metrics": {"accuracy": 1.0}}]}'},
     "info"),
    ({MANIFEST: BINARY, "best_ckpt/info.json": BINARY}, None),
], ids=["binary", "cut_short", "a_list", "entry_without_path",
        "info_json_too"])
def test_a_damaged_best_checkpoint_manifest_is_rebuilt_from_info_json(
    model_dir, caplog, damage, kept):
  import json  # pylint: disable=g-import-not-at-top
  with open(os.path.join(model_dir, MANIFEST)) as f:
    best = json.load(f)["checkpoints"][0]
  others = set(os.listdir(os.path.join(model_dir, "best_ckpt")))
  for name, data in damage.items():
    _write(os.path.join(model_dir, name), data)
  before = snapshot(model_dir, skip="best_ckpt")
  with caplog.at_level(std_logging.WARNING):
    exporter = _best(model_dir)
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno >= std_logging.WARNING and "best" in r.getMessage()]
  rebuilt = [w for w in warnings if "is damaged" in w and "Rebuilt" in w]
  assert len(rebuilt) == 1, warnings
  assert f"{MANIFEST} is damaged" in rebuilt[0]
  if kept:
    assert [e["path"] for e in exporter.kept] == [best["path"]]
    assert f"keeps {best['path']}" in rebuilt[0]
  else:
    assert exporter.kept == []
  # The documented repair: the manifest is whole again, naming what is kept;
  # the other checkpoints are kept in unranked/; nothing outside best_ckpt/
  # changed.
  with open(os.path.join(model_dir, MANIFEST)) as f:
    assert [e["path"] for e in json.load(f)["checkpoints"]] == (
        [best["path"]] if kept else [])
  left = set(os.listdir(os.path.join(model_dir, "best_ckpt")))
  assert {n.split(".")[0] for n in left if n.startswith("best_ckpt-")} == (
      {best["path"]} if kept else set())
  assert left <= others | {"best_checkpoints.json", "info.json",
                           "checkpoint", "unranked"}
  unranked_dir = os.path.join(model_dir, "best_ckpt", "unranked")
  unranked = (set(os.listdir(unranked_dir)) if os.path.isdir(unranked_dir)
              else set())
  assert unranked | {n for n in left if n.startswith("best_ckpt-")} == {
      n for n in others if n.startswith("best_ckpt-")}
  assert snapshot(model_dir, skip="best_ckpt") == before
  # And it reads back without a word.
  caplog.clear()
  with caplog.at_level(std_logging.WARNING):
    _best(model_dir)
  assert not [r for r in caplog.records if r.levelno >= std_logging.WARNING]


# -- YAML is data -------------------------------------------------------------

def _build(tmp_path, text=None, override=""):
  """Builds the config from `text` as a config file, and `override`.

  `{f}` in `override` is the file's path; then `text` is written there and
  is no --config_file.
  """
  _, _, _, params_lib, _ = _modules()
  path = str(tmp_path / "c.yaml")
  if text is not None:
    _write(path, text)
  files = [path] if text is not None and "{f}" not in override else []
  return params_lib.build(params_lib.ConfigSources(
      experiment=EXP, config_files=files,
      params_override=override.replace("{f}", path)))


CONFIG_REFUSED = [
    ("config_python_name", "task: !!python/name:os.system\n", "",
     "--config_file '{f}' holds more than data, which is not read: could "
     "not determine a constructor for the tag"),
    ("config_python_apply",
     "trainer: !!python/object/apply:os.system ['true']\n", "",
     "holds more than data"),
    ("config_empty", "", "", "--config_file '{f}' is empty."),
    ("config_only_comments", "# nothing\n", "", "is empty."),
    ("config_alias_bomb", ALIAS_BOMB, "",
     "repeats more than 100000 YAML nodes through its aliases (*name): 28 "
     "written stand for 490329064"),
    ("config_alias_cycle", "a: &a [*a]\n", "", "inside its own anchor"),
    ("config_nested_too_deep", "[" * 1000 + "]" * 1000, "",
     "nests more than 100 levels deep"),
    ("config_binary", BINARY, "", "is not UTF-8 text"),
    ("config_a_list", "- 1\n", "", "holds a list, not a mapping"),
    ("override_python_name", None, "trainer: !!python/name:os.system",
     "--params_override holds more than data"),
    ("override_alias_bomb", None, ALIAS_BOMB.replace("\n", ", ").join("{}"),
     "--params_override repeats more than 100000 YAML nodes"),
    ("override_file_empty", "", "{f}", "--params_override file '{f}' is "
     "empty."),
    ("override_neither", None, "[1, 2]", "--params_override is neither "
     "`key=value,...`, a YAML mapping nor a file"),
]


@pytest.mark.parametrize("text, override, fragment",
                         [row[1:] for row in CONFIG_REFUSED],
                         ids=[row[0] for row in CONFIG_REFUSED])
def test_yaml_that_is_more_than_a_config_is_one_short_error(
    tmp_path, text, override, fragment):
  from tfm_ext.base.errors import UsageError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UsageError) as e:
    _build(tmp_path, text, override)
  fragment = fragment.replace("{f}", str(tmp_path / "c.yaml"))
  assert fragment in str(e.value), str(e.value)[:2000]
  assert len(str(e.value)) < 1000, str(e.value)[:2000]


@pytest.mark.parametrize("text, override", [
    (None, "trainer.train_steps=7,trainer.loss_upper_bound=1e5"),
    (None, "{trainer: {train_steps: 7, loss_upper_bound: 1e5}}"),
    ("trainer:\n  train_steps: 7\n  loss_upper_bound: 1e5\n", ""),
    ("trainer:\n  train_steps: 7\n  loss_upper_bound: 1e5\n", "{f}"),
    ("trainer:\n  train_steps: &n 7\n  validation_steps: *n\n"
     "  loss_upper_bound: 1.0e+5\n", ""),
], ids=["override_key_value", "override_yaml", "config_file",
        "override_file", "config_file_with_an_alias"])
def test_configs_and_overrides_read_as_tfm_reads_them(tmp_path, text,
                                                      override):
  params = _build(tmp_path, text, override)
  assert params.trainer.train_steps == 7
  # TFM reads `1e5` as a float, not YAML 1.1's string.
  assert params.trainer.loss_upper_bound == 1e5
  assert isinstance(params.trainer.loss_upper_bound, float)


# -- The launcher, for real ---------------------------------------------------

def _usage_error(run):
  assert run.returncode == 2, run
  assert "Traceback" not in run.stderr, run
  assert len(run.stderr) < 2048, run.stderr[:3000]
  errors = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1, run
  assert not os.path.exists(run.model_dir), "model_dir was written"
  return errors[0]


@pytest.mark.parametrize("text, fragment", [
    ("task: !!python/name:os.system\n", "holds more than data"),
    ("", "is empty."),
    (ALIAS_BOMB, "repeats more than 100000 YAML nodes"),
], ids=["python_name", "empty", "alias_bomb"])
def test_launcher_refuses_a_config_file_that_is_not_data(
    launch_forked, tmp_path, text, fragment):
  config = tmp_path / "c.yaml"
  config.write_text(text)
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      f"--config_file={config}", model_dir=tmp_path / "m")
  assert fragment in _usage_error(run)


def _catches(pid, sig, timeout=10.0):
  """Waits until process `pid` handles `sig` (Linux: /proc); returns it."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(f"/proc/{pid}/status") as f:
      caught = next(l for l in f if l.startswith("SigCgt:")).split()[1]
    if int(caught, 16) >> (sig - 1) & 1:
      return True
    time.sleep(0.01)
  return False


def test_sigterm_during_start_up_exits_42_with_nothing_to_save(
    start, tmp_path):
  job = start(f"--experiment={EXP}", "--mode=train", model_dir=tmp_path / "m")
  # As soon as the launcher handles it: Python is loading TensorFlow.
  assert _catches(job.proc.pid, signal.SIGTERM)
  job.proc.send_signal(signal.SIGTERM)
  run = job.finish()
  assert run.returncode == 42, run
  assert run.stderr.strip().splitlines()[-1] == (
      "preempted: SIGTERM received during start-up: nothing to save yet; "
      "exit 42 to be restarted."), run
  assert "Traceback" not in run.stderr
  assert not run.stdout and not os.path.exists(run.model_dir)


def test_sigterm_to_an_evaluator_exits_42_saying_it_saved_nothing(
    start_forked, model_dir):
  # The trainer is (as far as the evaluator knows) still running: its
  # params.yaml says 8 steps, and it has not marked training complete.
  params = os.path.join(model_dir, "params.yaml")
  with open(params) as f:
    text = f.read()
  _write(params, text.replace("train_steps: 6", "train_steps: 8"))
  os.remove(os.path.join(model_dir, "training_complete.json"))
  # ckpt-2 and ckpt-4 are in its ledger already: it evaluates ckpt-6 only.
  os.remove(os.path.join(model_dir, "eval_ledger", "ckpt-6.json"))
  checkpoints = sorted(n for n in os.listdir(model_dir)
                       if n.startswith("ckpt-"))
  job = start_forked(f"--experiment={EXP}", "--mode=continuous_eval",
                     model_dir=model_dir)
  job.wait_for_line(lambda l: l.startswith("eval @ step 6"))
  job.proc.send_signal(signal.SIGTERM)
  run = job.finish()
  assert run.returncode == 42, run
  assert ("preempted: SIGTERM received: stopped evaluating at step 6; "
          "nothing to save; exit 42 to be restarted.") in run.stderr, run
  assert "Traceback" not in run.stderr
  assert sorted(n for n in os.listdir(model_dir)
                if n.startswith("ckpt-")) == checkpoints
  assert run.summary("eval_summary.json")["status"] == "preempted"
