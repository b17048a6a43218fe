"""Issue 31's four data-loss cases, as real launcher processes.

Each case once lost or overwrote what another run (or the same run) had
written; each test compares the files before and after, and says which
process wrote what:

a. a `model_dir` whose name holds a glob character (`job[1]`, `job*`,
   `job?`) beside `job1`: refused with exit 2 and one `error:` line, nothing
   written anywhere (TF's checkpoint sweep deletes by `glob(prefix + ".*")`
   and once deleted `job1`'s checkpoints);
b. a trainer that lost its lease (SIGSTOPped past the lease's stale time
   while another trainer took over) writes nothing once continued;
c. a relaunch of a finished run, a resume below the checkpoint's step and a
   relaunch after a SIGTERM in the final evaluation keep the run's record;
d. an evaluator whose claim was taken over while it was stopped records
   nothing: each checkpoint is in `eval_ledger/` once, as its taker wrote it.

The lease and claim timings come from the environment
(`TFM_EXT_LEASE_HEARTBEAT_SECONDS`, `TFM_EXT_LEASE_STALE_SECONDS`,
`TFM_EXT_CLAIM_RENEW_SECONDS`, `TFM_EXT_CLAIM_STALE_SECONDS`); those runs
are forked (`start_forked`) before they import tfm_ext, so the variables
hold whether they are read at import or at construction.
"""

import csv
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import time

import pytest
import tensorflow as tf

EXPERIMENT = "--experiment=digits_convnet"
CADENCE = ("trainer.steps_per_loop=10,trainer.summary_interval=10,"
           "trainer.checkpoint_interval=10")


def _tree(root, skip=()):
  """Every file under `root`: relative path -> (size, mtime_ns, sha1).

  Paths under a name in `skip` (a top-level file or folder) are left out.
  """
  files = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      rel = os.path.relpath(path, root)
      if rel.split(os.sep)[0] in skip or os.path.islink(path):
        continue
      with open(path, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()
      stat = os.stat(path)
      files[rel] = (stat.st_size, stat.st_mtime_ns, digest)
  return files


def _changes(before, after):
  """What differs between two `_tree`s: added, removed, changed paths."""
  return {"added": sorted(set(after) - set(before)),
          "removed": sorted(set(before) - set(after)),
          "changed": sorted(p for p in set(before) & set(after)
                            if before[p] != after[p])}


def _no_changes(before, after):
  changes = _changes(before, after)
  return not any(changes.values()), changes


def _error_lines(stderr):
  return [l for l in stderr.splitlines() if l.startswith("error:")]


def _step_of(line):
  match = re.match(r"step (\d+)/", line)
  return int(match.group(1)) if match else None


def _latest_step(model_dir):
  latest = tf.train.latest_checkpoint(str(model_dir))
  return int(latest.rsplit("-", 1)[1]) if latest else None


# -- a. A model_dir whose name holds glob characters ------------------------

# job1: 40 steps, a checkpoint every 10, all kept; an evaluation every 20,
# so best_ckpt/ holds best_ckpt-20 and -40 (it is c.'s finished run too).
# The glob-named run keeps one of each, so its sweep deletes ckpt-10, -20,
# -30 and one best checkpoint: on today's code, job1's as well as its own.
JOB1 = ("--mode=train_and_eval", "--params_override=trainer.train_steps=40,"
        + CADENCE + ",trainer.validation_interval=20,trainer.max_to_keep=10")
GLOBBED = ("--mode=train_and_eval", "--params_override=trainer.train_steps=40,"
           + CADENCE + ",trainer.validation_interval=20,"
           "trainer.max_to_keep=1,trainer.best_checkpoint_top_k=1")


@pytest.fixture(scope="module")
def job1(launch_forked, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("job1_trained") / "job1"
  run = launch_forked(EXPERIMENT, *JOB1, model_dir=model_dir)
  assert run.returncode == 0, run
  assert sorted(glob.glob(f"{model_dir}/ckpt-*.index")) == [
      f"{model_dir}/ckpt-{s}.index" for s in (10, 20, 30, 40)]
  assert glob.glob(f"{model_dir}/best_ckpt/best_ckpt-*.index")
  return model_dir


@pytest.mark.parametrize("name,char", [("job[1]", "["), ("job*", "*"),
                                       ("job?", "?")])
def test_glob_model_dir_is_refused_and_writes_nothing(
    launch_forked, job1, tmp_path, name, char):
  shutil.copytree(job1, tmp_path / "job1")
  before = _tree(tmp_path)
  ckpts = sorted(glob.glob(f"{tmp_path}/job1/ckpt-*"))
  best = sorted(glob.glob(f"{tmp_path}/job1/best_ckpt/*"))
  bad = tmp_path / name

  run = launch_forked(EXPERIMENT, *GLOBBED, model_dir=bad, timeout=180)
  # Whatever the run did, job1 keeps every checkpoint and best checkpoint.
  assert sorted(glob.glob(f"{tmp_path}/job1/ckpt-*")) == ckpts, run
  assert sorted(glob.glob(f"{tmp_path}/job1/best_ckpt/*")) == best, run
  assert run.returncode == 2, run
  errors = _error_lines(run.stderr)
  assert len(errors) == 1, run
  # It says why (a glob) and names the character, not only in the path.
  assert re.search("glob", errors[0], re.I), errors
  assert char in errors[0].replace(str(bad), ""), errors
  assert "Traceback" not in run.stderr, run
  assert not os.path.lexists(bad), "the refused model_dir was created"
  unchanged, changes = _no_changes(before, _tree(tmp_path))
  assert unchanged, changes  # Nothing written anywhere, job1 included.


# -- b. A trainer that lost its lease --------------------------------------

LEASE_ENV = {"TFM_EXT_LEASE_HEARTBEAT_SECONDS": "1",
             "TFM_EXT_LEASE_STALE_SECONDS": "4"}
FOREVER = ("--mode=train", "--params_override=trainer.train_steps=1000000,"
           + CADENCE)
# What the test does not compare: the log each process keeps open, the
# TensorBoard events of the loop in flight, and what is drawn from them.
NOT_RECORDS = ("logs", "train", "validation", "metrics.csv", "curves.png")


def _lease(model_dir):
  try:
    with open(os.path.join(model_dir, "trainer_lease.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _lease_holder(model_dir):
  return _lease(model_dir).get("pid")


def _wait_for(predicate, timeout, what):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.1)


def test_trainer_that_lost_its_lease_writes_nothing(start_forked, tmp_path):
  model_dir = tmp_path / "m"
  a = start_forked(EXPERIMENT, *FOREVER, model_dir=model_dir, env=LEASE_ENV)
  a.wait_for_line(lambda l: _step_of(l) is not None
                  and _latest_step(model_dir) is not None)
  a.proc.send_signal(signal.SIGSTOP)  # Suspended: its heartbeat stops.
  stopped_at = _latest_step(model_dir)
  try:
    # B starts once A has missed its beats (a fresh interpreter's import
    # took that long; a forked B starts at once and would be refused by a
    # live holder); A's heartbeat goes stale (4 s); B takes the lease,
    # resumes A's checkpoint and trains on past it, saving checkpoints of
    # its own.
    beat = float(LEASE_ENV["TFM_EXT_LEASE_HEARTBEAT_SECONDS"])
    _wait_for(lambda: time.time() - _lease(model_dir).get("heartbeat", 1e12)
              > 3.5 * beat, 30, "A's missed beats")
    b = start_forked(EXPERIMENT, *FOREVER, model_dir=model_dir,
                     env=LEASE_ENV)
    b.wait_for_line(lambda l: (_step_of(l) or 0) > stopped_at + 10
                    and _latest_step(model_dir) > stopped_at, timeout=180)
    assert _lease_holder(model_dir) == b.proc.pid
    # B suspended too: from here on, any change in model_dir is A's.
    b.proc.send_signal(signal.SIGSTOP)
    time.sleep(0.5)
    before = _tree(model_dir, skip=NOT_RECORDS)
    b_step = _latest_step(model_dir)

    a.proc.send_signal(signal.SIGCONT)
    lost = a.finish(timeout=120)
  finally:
    a.proc.send_signal(signal.SIGCONT)
  after = _tree(model_dir, skip=NOT_RECORDS)

  unchanged, changes = _no_changes(before, after)
  assert unchanged, (changes, lost)  # No ckpt, state file, record or lease.
  assert _latest_step(model_dir) == b_step
  assert lost.returncode not in (0, None), lost
  assert re.search(r"another trainer took over", lost.stderr, re.I), lost
  assert "Traceback" not in lost.stderr, lost

  # B, continued, still holds the lease and stops as a preempted job does.
  b.proc.send_signal(signal.SIGCONT)
  assert _lease_holder(model_dir) == b.proc.pid
  b.proc.send_signal(signal.SIGTERM)
  stopped = b.finish()
  assert stopped.returncode == 42, stopped
  assert stopped.summary()["global_step"] == _latest_step(model_dir)


# -- c. A run never erases its own results ---------------------------------

FINISHED = JOB1


@pytest.fixture(scope="module")
def finished(job1):
  """A finished 40-step train_and_eval (job1's) and its run summary."""
  with open(os.path.join(job1, "run_summary.json")) as f:
    summary = json.load(f)
  assert summary["global_step"] == 40 and summary["eval_metrics"], summary
  return job1, summary


def _log_text(model_dir):
  text = ""
  for path in glob.glob(f"{model_dir}/logs/*"):
    if not os.path.islink(path):
      with open(path, errors="replace") as f:
        text += f.read()
  return text


def _assert_record_kept(run, first):
  """`run` relaunched a finished run: exit 0, the first run's results."""
  assert run.returncode == 0, run
  summary = run.summary()
  assert summary["global_step"] == 40, summary
  assert summary["train_metrics"], summary
  assert summary["eval_metrics"], summary
  for key in ("train_metrics", "eval_metrics", "examples_per_second"):
    assert summary[key] == first[key], (key, summary, first)
  said = (summary.get("message", "") + run.stdout).lower()
  assert "already complete" in said, (summary, run)
  assert "could not be found" not in run.stderr, run
  assert "could not be found" not in _log_text(run.model_dir), run
  assert "Traceback" not in run.stderr, run
  assert _latest_step(run.model_dir) == 40


def test_relaunching_a_finished_run_keeps_its_record(
    launch_forked, finished, tmp_path):
  model_dir = tmp_path / "m"
  shutil.copytree(finished[0], model_dir)
  run = launch_forked(EXPERIMENT, *FINISHED, model_dir=model_dir)
  _assert_record_kept(run, finished[1])


def test_resume_below_the_checkpoints_step_keeps_its_record(
    launch_forked, finished, tmp_path):
  model_dir = tmp_path / "m"
  shutil.copytree(finished[0], model_dir)
  run = launch_forked(EXPERIMENT, FINISHED[0],
                      FINISHED[1].replace("train_steps=40", "train_steps=20"),
                      model_dir=model_dir)
  _assert_record_kept(run, finished[1])


def _metrics_row(model_dir, step):
  with open(os.path.join(model_dir, "metrics.csv")) as f:
    rows = {int(r["step"]): r for r in csv.DictReader(f)}
  return rows.get(step, {})


def test_sigterm_in_the_final_evaluation_then_relaunch_records_it(
    start_forked, launch_forked, tmp_path):
  """The supervisor loop of docs/failures.md: restart on 42 until the run is done."""
  model_dir = tmp_path / "m"
  job = start_forked(EXPERIMENT, *FINISHED, model_dir=model_dir)
  job.wait_for_line(lambda l: l.startswith("step 40/40"))
  job.proc.send_signal(signal.SIGTERM)  # The final evaluation comes next.
  preempted = job.finish()
  assert preempted.returncode in (0, 42), preempted
  assert "Traceback" not in preempted.stderr, preempted

  relaunch = launch_forked(EXPERIMENT, *FINISHED, model_dir=model_dir)
  assert relaunch.returncode == 0, relaunch
  summary = relaunch.summary()
  assert (summary["status"], summary["global_step"]) == ("completed", 40)
  assert summary["eval_metrics"], (summary, relaunch)
  assert summary["train_metrics"], (summary, relaunch)
  # The evaluation of step 40 is recorded, as an uninterrupted run's is.
  assert _metrics_row(model_dir, 40).get("validation_accuracy"), (
      open(os.path.join(model_dir, "metrics.csv")).read())
  assert "could not be found" not in relaunch.stderr, relaunch


# -- d. An evaluator whose claim was taken over ----------------------------

CLAIM_ENV = {"TFM_EXT_CLAIM_RENEW_SECONDS": "0.5",
             "TFM_EXT_CLAIM_STALE_SECONDS": "3"}
# Evaluation fields only (the evaluator follows the trainer's params.yaml):
# eager, two images a step, so one evaluation takes several seconds and the
# evaluator can be stopped in the middle of it.
SLOW_EVAL = ("--params_override=task.validation_data.global_batch_size=2,"
             "trainer.eval_tf_function=false,"
             "trainer.continuous_eval_timeout=120")
# The checkpoints of conftest's `two_checkpoints`, which the session shares.
EVAL_STEPS = (10, 20)
# What is not compared: logs, the TensorBoard events and what is drawn from
# them, and what each evaluator writes of its own run as it exits.
# What an evaluator writes of its own besides records: its presence in
# evaluators/ (retention's heartbeat, removed when it stops) among them.
NOT_LEDGER = ("logs", "validation", "metrics.csv", "curves.png",
              "eval_summary.json", "operative_config.continuous_eval.gin",
              "evaluators")


def _claim(model_dir, checkpoint):
  try:
    with open(os.path.join(model_dir, "eval_claims",
                           checkpoint + ".json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _ledger(model_dir):
  entries = {}
  for path in glob.glob(f"{model_dir}/eval_ledger/*.json"):
    with open(path) as f:
      entry = json.load(f)
    entries.setdefault(entry["checkpoint"], []).append(entry)
  return entries


@pytest.mark.slow
def test_stalled_evaluator_whose_claim_was_taken_over_records_nothing(
    start_forked, two_checkpoints, tmp_path):
  model_dir = tmp_path / "m"
  shutil.copytree(two_checkpoints, model_dir)
  ledger = os.path.join(model_dir, "eval_ledger")
  first = start_forked(EXPERIMENT, "--mode=continuous_eval", SLOW_EVAL,
                       model_dir=model_dir, env=CLAIM_ENV)
  # It evaluates ckpt-10, then claims ckpt-20 (the final step), and is
  # stopped in the middle of that evaluation: once it has renewed the claim
  # twice (a second into it), or 4 s after it was claimed.
  _wait_for(lambda: _claim(model_dir, "ckpt-20").get("pid") == first.proc.pid
            or first.proc.poll() is not None, 180, "a claim on ckpt-20")
  claimed = time.monotonic()
  _wait_for(lambda: (_claim(model_dir, "ckpt-20").get("renewals") or 0) >= 2
            or time.monotonic() > claimed + 4, 30, "a renewed claim")
  first.proc.send_signal(signal.SIGSTOP)
  try:
    assert first.proc.poll() is None, first.finish()
    assert not os.path.exists(os.path.join(ledger, "ckpt-20.json")), (
        "the evaluation ended before the evaluator was stopped")
    # The second takes the claim over once unrenewed for 3 s, evaluates
    # ckpt-20, records it, and stops: the training's final step is done.
    second = start_forked(EXPERIMENT, "--mode=continuous_eval", SLOW_EVAL,
                          model_dir=model_dir, env=CLAIM_ENV)
    took_over = second.finish(timeout=240)
    assert took_over.returncode == 0, took_over
    assert "eval @ step 20" in took_over.stdout, took_over
    before = _tree(model_dir, skip=NOT_LEDGER)
    recorded = _ledger(model_dir)

    first.proc.send_signal(signal.SIGCONT)  # It wakes and evaluates on.
    stalled = first.finish(timeout=180)
  finally:
    first.proc.send_signal(signal.SIGCONT)
  after = _tree(model_dir, skip=NOT_LEDGER)

  unchanged, changes = _no_changes(before, after)
  assert unchanged, (changes, stalled)  # Ledger, claims, best_ckpt/.
  entries = _ledger(model_dir)
  assert entries == recorded
  assert sorted(entries) == [f"ckpt-{s}" for s in EVAL_STEPS], entries
  assert all(len(e) == 1 and e[0]["status"] == "evaluated"
             for e in entries.values()), entries
  assert "Traceback" not in stalled.stderr, stalled


# -- e. A copied model_dir whose records name the original's files ---------

def _name_absolutely(state_file, directory):
  """Rewrites a state file to name its checkpoints by `directory`'s path,
  as a state file written there by path (an older tool's) reads."""
  with open(state_file) as f:
    text = f.read()
  with open(state_file, "w") as f:
    f.write(re.sub(r'"([^"/]+)"', lambda m: f'"{directory}/{m.group(1)}"',
                   text))


def test_a_copy_whose_state_names_the_original_never_deletes_it(
    launch_forked, job1, tmp_path):
  original, copy = tmp_path / "original", tmp_path / "copy"
  shutil.copytree(job1, original)
  shutil.copytree(original, copy)
  _name_absolutely(copy / "checkpoint", original)
  _name_absolutely(copy / "best_ckpt" / "checkpoint", original / "best_ckpt")
  assert str(original) in (copy / "checkpoint").read_text()
  before = _tree(original)

  # Keeps one checkpoint and one best: TF's sweep deleted the original's
  # ckpt-20 and ckpt-40 on the code before.
  run = launch_forked(EXPERIMENT, *GLOBBED[:1],
                      GLOBBED[1].replace("train_steps=40", "train_steps=60"),
                      model_dir=copy, timeout=180)
  assert run.returncode == 0, run
  unchanged, changes = _no_changes(before, _tree(original))
  assert unchanged, changes
  # The copy resumed from its own step 40, its state file rebuilt.
  assert run.summary()["resumed_from_step"] == 40
  assert _latest_step(copy) == 60
  assert str(original) not in (copy / "checkpoint").read_text()
  log = ""
  for path in glob.glob(f"{copy}/logs/*"):  # job1's, copied, and its own.
    with open(path) as f:
      log += f.read()
  assert "outside this model_dir" in log, log[-3000:]
