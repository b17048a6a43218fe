"""A model_dir in an object store: every record through `tf.io.gfile`.

TensorFlow's in-memory `ram://` file system stands in for `gs://`; it lives
in this process only, so the jobs run in-process, through `driver.run` (run
summary, log file and all), and their model_dir is checked here.
"""

import logging as std_logging
import os
import tempfile
import uuid

from absl import flags as absl_flags
from absl import logging
import pytest
import tensorflow as tf

from conftest import REPO
from conftest import SMOKE
from tfm_ext.model_dir import files
from tfm_ext.model_dir import run_summary
from tfm_ext.model_dir import eval_ledger
from tfm_ext.model_dir import log_files


@pytest.fixture
def launcher_logging():
  """absl as `app.run` sets it up for `driver.run`; put back afterwards.

  `driver.run` reads absl's flags and `log_files.log_to_files` points absl's
  handler at a file: the tests after these must find neither changed.
  """
  flags = absl_flags.FLAGS
  parsed = flags.is_parsed()
  if not parsed:
    flags.mark_as_parsed()
  saved_flags = {name: flags[name].value
                 for name in ("logtostderr", "stderrthreshold", "verbosity")}
  handler = logging.get_absl_handler()
  stream = handler.python_handler.stream
  root, absl_logger = std_logging.getLogger(), logging.get_absl_logger()
  levels = root.level, absl_logger.level
  tf_handlers = list(tf.get_logger().handlers)
  raise_exceptions = std_logging.raiseExceptions
  root.addHandler(handler)  # What absl's app.run does, and its parsing:
  flags.verbosity = 0  # INFO, on the root logger. TensorFlow's SavedModel
  # writer saves and restores it, so a bare root level would not last.
  yield
  for name, value in saved_flags.items():
    setattr(flags, name, value)
  if not parsed:
    flags.unparse_flags()  # Sets the absl logger's level: restored below.
  root.removeHandler(handler)
  root.setLevel(levels[0])
  absl_logger.setLevel(levels[1])
  if handler.python_handler.stream is not stream:
    handler.python_handler.stream.close()
    handler.python_handler.stream = stream
  for tf_handler in tf_handlers:
    tf.get_logger().addHandler(tf_handler)
  std_logging.raiseExceptions = raise_exceptions


@pytest.fixture
def run_job(data_dir, launcher_logging):
  """Runs a mode of digits_convnet through `driver.run` in this process."""
  del data_dir, launcher_logging  # Used for their effects.
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  from tfm_ext.run import driver  # pylint: disable=g-import-not-at-top
  from tfm_ext.config import params as params_lib  # pylint: disable=g-import-not-at-top

  def run(mode, model_dir, override=SMOKE):
    params = params_lib.build(params_lib.ConfigSources(
        experiment="digits_convnet", params_override=override))
    plan = driver.prepare(driver.RunRequest(
        experiment="digits_convnet", mode=mode, model_dir=model_dir,
        params=params))
    return driver.run(plan)

  return run


def read_logs(model_dir):
  """The text of every log file copied into `model_dir/logs/`."""
  return [files.read_text(path)
          for path in tf.io.gfile.glob(f"{model_dir}/logs/*")]


def test_bucket_model_dir_holds_every_record_and_nothing_lands_locally(
    run_job, tmp_path, monkeypatch):
  cwd, local_tmp = tmp_path / "cwd", tmp_path / "tmp"
  cwd.mkdir()
  local_tmp.mkdir()
  monkeypatch.chdir(cwd)  # Where `./ram:/...` used to appear.
  monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))
  model_dir = f"ram://{uuid.uuid4().hex}"

  first = run_job("train_and_eval", model_dir)
  resumed = run_job("train_and_eval", model_dir,
                    SMOKE.replace("train_steps=40", "train_steps=60"))
  assert (first.global_step, resumed.global_step) == (40, 60)
  assert (resumed.resumed_from_step, resumed.resumes) == (40, 1)
  assert len(tf.io.gfile.glob(f"{model_dir}/training_starts/*.json")) == 2
  assert run_summary.training_complete_step(model_dir) == 60
  assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-60"
  for path in ("params.yaml", "operative_config.train_and_eval.gin",
               "train", "validation"):
    assert tf.io.gfile.exists(f"{model_dir}/{path}"), path
  assert tf.io.gfile.glob(f"{model_dir}/validation/events.out.tfevents.*")

  # The top-k exporter: evaluations at steps 20, 40 and 60, all kept.
  manifest = files.read_json(f"{model_dir}/best_ckpt/best_checkpoints.json")
  assert sorted(e["global_step"] for e in manifest["checkpoints"]) == [
      20, 40, 60]
  for entry in manifest["checkpoints"]:
    assert tf.io.gfile.exists(f"{model_dir}/best_ckpt/{entry['path']}.index")
  info = files.read_json(f"{model_dir}/best_ckpt/info.json")
  assert info["best_ckpt_global_step"] == manifest["checkpoints"][0][
      "global_step"]
  assert tf.train.latest_checkpoint(f"{model_dir}/best_ckpt")

  evaluated = run_job("eval", model_dir)
  assert evaluated.global_step == 60 and evaluated.eval_metrics["accuracy"]
  continuous = run_job("continuous_eval", model_dir)
  # An evaluator's summary never overwrites the trainer's.
  trained = run_summary.RunSummary.read(model_dir)
  assert (trained.mode, trained.global_step) == ("train_and_eval", 60)
  summary = run_summary.RunSummary.read(model_dir, run_summary.EVAL_FILENAME)
  assert summary.mode == "continuous_eval"
  assert summary.eval_metrics == continuous.eval_metrics
  # Each checkpoint evaluated once, one ledger record per checkpoint.
  ledger = eval_ledger.read_ledger(model_dir)
  assert [(e["global_step"], e["status"]) for e in ledger] == [
      (20, "evaluated"), (40, "evaluated"), (60, "evaluated")]
  assert sorted(tf.io.gfile.listdir(f"{model_dir}/eval_ledger")) == [
      "ckpt-20.json", "ckpt-40.json", "ckpt-60.json"]

  # The best checkpoint exported into the bucket, whole, under its step
  # (test_export.py checks that a second export leaves it as it is).
  best = manifest["checkpoints"][0]["global_step"]
  exported = run_job("export", model_dir)
  assert (exported.status, exported.global_step) == ("completed", best)
  # `ram://` lists by prefix: export/ shows export_summary.json's tail too.
  exports = [e.rstrip("/") for e in tf.io.gfile.listdir(f"{model_dir}/export")]
  assert str(best) in exports
  assert not [e for e in exports if e.startswith(".")]  # No hidden copy left.
  saved = f"{model_dir}/export/{best}"
  serve = tf.saved_model.load(saved).signatures["serving_default"]
  assert serve(inputs=tf.zeros([3, 8, 8, 1]))["outputs"].shape == [3, 10]

  # A second export, which finds the first in place.
  again = run_job("export", model_dir)
  assert again.global_step == best

  # The absl log of each run, copied into the bucket when it ended.
  logs = read_logs(model_dir)
  assert len(logs) == 6 and all(logs), [len(text) for text in logs]
  text = "".join(logs)
  assert f"Run summary: {model_dir}/run_summary.json" in text
  assert f"Run summary: {model_dir}/eval_summary.json" in text

  assert not os.listdir(cwd)
  assert not os.path.exists(os.path.join(REPO, "ram:"))
  # Each run logged to a local temp dir of its own first (the six logs
  # above), deleted once copied into the bucket.
  assert not list(local_tmp.glob("tfm_ext_logs_*"))


def test_a_job_that_exits_still_copies_its_log(run_job, tmp_path,
                                               monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  model_dir = f"ram://{uuid.uuid4().hex}"
  # No trainer, no checkpoint: exit 2 once the timeout has passed.
  with pytest.raises(SystemExit) as exited:
    run_job("continuous_eval", model_dir, "trainer.continuous_eval_timeout=1")
  assert exited.value.code == 2
  logs = read_logs(model_dir)
  assert len(logs) == 1 and "tf.data:" in logs[0], logs


def test_logs_of_one_name_are_all_kept(tmp_path):
  # absl names a log by host, user, second and pid: two runs of one process
  # within a second write two local logs of one name.
  model_dir = f"ram://{uuid.uuid4().hex}"
  texts = ("first run\n", "second run\n", "third run\n")
  for n, text in enumerate(texts):
    local = tmp_path / str(n) / "tfm_ext.host.user.log.INFO.20261201-120000.7"
    local.parent.mkdir()
    local.write_text(text)
    log_files._copy_log(str(local), f"{model_dir}/logs")  # pylint: disable=protected-access
  assert sorted(tf.io.gfile.listdir(f"{model_dir}/logs")) == [
      "tfm_ext.host.user.log.INFO.20261201-120000.7",
      "tfm_ext.host.user.log.INFO.20261201-120000.7.1",
      "tfm_ext.host.user.log.INFO.20261201-120000.7.2"]
  assert sorted(read_logs(model_dir)) == sorted(texts)


def test_records_cut_short_are_skipped_with_a_warning(caplog):
  model_dir = f"ram://{uuid.uuid4().hex}"
  ledger = eval_ledger.EvalLedger(model_dir)
  ledger.record(f"{model_dir}/ckpt-10", "evaluated", {"accuracy": 0.5})
  ledger.record(f"{model_dir}/ckpt-20", "missing")
  assert run_summary.record_training_start(model_dir, 0) == 0
  # What a writer killed mid-object, or a stray object, leaves behind.
  broken = {f"{model_dir}/eval_ledger/ckpt-30.json": '{"checkpoint": "ckp',
            f"{model_dir}/eval_ledger/ckpt-40.json": "[]",
            f"{model_dir}/training_starts/1-2.json": ""}
  for path, text in broken.items():
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(text)

  with caplog.at_level(std_logging.WARNING):
    ledger = eval_ledger.EvalLedger(model_dir)
    resumes = run_summary.record_training_start(model_dir, 10)
  assert [(e["global_step"], e["status"]) for e in ledger.entries.values()
          ] == [(10, "evaluated"), (20, "missing")]
  assert f"{model_dir}/ckpt-30" not in ledger  # So it is evaluated again.
  assert resumes == 1
  assert len(run_summary.training_starts(model_dir)) == 2
  skipped = {r.getMessage().split()[1].rstrip(":") for r in caplog.records
             if r.getMessage().startswith("Skipping")}
  assert skipped == set(broken), skipped


def test_an_older_model_dirs_append_only_records_still_count(tmp_path):
  model_dir = str(tmp_path)
  (tmp_path / eval_ledger.LEGACY_LEDGER).write_text(
      '{"checkpoint": "ckpt-10", "global_step": 10, "status": "evaluated", '
      '"metrics": {}, "time": 1.0}\n{"checkpoint": "ckpt-2')  # Cut by a kill.
  (tmp_path / run_summary.LEGACY_STARTS).write_text(
      '{"restored_step": 0, "time": 1.0}\n'
      '{"restored_step": 10, "time": 2.0}\n')

  ledger = eval_ledger.EvalLedger(model_dir)
  assert f"{model_dir}/ckpt-10" in ledger
  ledger.record(f"{model_dir}/ckpt-20", "evaluated")
  assert eval_ledger.EvalLedger(model_dir).evaluated_steps() == [10, 20]
  assert run_summary.record_training_start(model_dir, 20) == 2
  # New records are objects of their own; the old file is only read.
  assert (tmp_path / "eval_ledger" / "ckpt-20.json").exists()
  assert len((tmp_path / eval_ledger.LEGACY_LEDGER).read_text()
             .splitlines()) == 2
