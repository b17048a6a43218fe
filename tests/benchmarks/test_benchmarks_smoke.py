"""The benchmark harness on stand-in trainers: pairs, results files, RESULTS.md.

The stand-ins are tiny Python processes that burn a fixed CPU time per step
and print `TrainProgress`-shaped lines, so that the harness's own code
(stopping and resuming children, busy cores, windows, ratios, the results
file and its rendering) runs in seconds; the real trainers run in
`python benchmarks/run_all.py --smoke` (and `first_step.py --smoke`, about
4 minutes on 2 shared cores: not run here).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, REPO)

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
from benchmarks import first_step
from benchmarks import precision
from benchmarks import run_all
from benchmarks import training_loops
# pylint: enable=g-import-not-at-top,wrong-import-position

# Burns `ms` of CPU time a step, prints a progress line every `loop` steps.
STAND_IN = """
import sys, time
ms, loop = float(sys.argv[1]), int(sys.argv[2])
step = 0
while True:
  for _ in range(loop):
    end = time.process_time() + ms / 1e3
    while time.process_time() < end:
      pass
    step += 1
  print(f"step {step}/100000000 | loss 1.0", flush=True)
"""
# CPU ms a step of each stand-in: stock TFM takes twice ours.
MS_PER_STEP = {"ours": 3.0, "stock_tfm": 6.0}
TINY = training_loops.Workload("digits_convnet", 8, 10**8, 10, 10)


@pytest.fixture(name="stand_ins")
def _stand_ins(monkeypatch):
  def argv(workload, variant, model_dir):
    del model_dir
    name = next(n for n, v in training_loops.VARIANTS.items() if v == variant)
    return [sys.executable, "-c", STAND_IN, str(MS_PER_STEP[name]),
            str(workload.steps_per_loop)]
  monkeypatch.setattr(training_loops, "_argv", argv)
  monkeypatch.setitem(training_loops.WORKLOADS, "digits_convnet", TINY)


def test_a_stopped_child_does_not_train_until_resumed(stand_ins):
  del stand_ins
  child = training_loops.Live("ours", training_loops._argv(
      TINY, training_loops.VARIANTS["ours"], ""))
  try:
    _, step, _ = child.next_mark(30)
    child.pause()
    time.sleep(0.5)  # Ten loops' worth, had it run on.
    child.resume()
    # The loop the stop cut short ends next, then the one after it.
    assert [child.next_mark(30)[1] for _ in range(2)] == [step + 10,
                                                          step + 20]
  finally:
    child.close()
  assert child.proc.poll() is not None


def test_spinners_hold_as_many_cores_as_asked():
  with _common.Spinners(2) as busy:
    busy.hold(1)
    pids = [proc.pid for proc in busy._procs]
    before = [_common.thread_cpu(pid) for pid in pids]
    time.sleep(0.5)
    used = [_common.cpu_between(b, _common.thread_cpu(pid))
            for pid, b in zip(pids, before)]
  # A loaded machine gives the running one less than a core, never none;
  # the other is stopped (the scheduler's count, in ns, may still see it
  # take the signal).
  assert used[0] > 0.01 and used[1] < 0.001


@pytest.mark.skipif(not shutil.which("perf"), reason="no perf")
def test_perf_counts_a_process_for_a_window():
  # Software events: the path hardware counters take where a VM has them.
  with _common.Spinners(1) as busy:
    busy.hold(1)
    counters = training_loops.Counters(busy._procs[0].pid, ["task-clock"])
    time.sleep(0.3)
    counts = counters.stop()
  assert counts["task-clock"] > 0


def test_a_run_writes_one_file_of_paired_windows_and_renders_its_rows(
    stand_ins, tmp_path, monkeypatch):
  del stand_ins
  monkeypatch.setitem(run_all.SESSIONS, "smoke", {
      "digits_convnet": ("digits_convnet", ("ours", "stock_tfm"), 2, 2)})
  path = run_all.run("smoke", "test", out_dir=str(tmp_path))
  assert os.path.basename(path).endswith("-smoke-test.json")
  with open(path) as f:
    results = json.load(f)
  session = results["sessions"]["digits_convnet"]
  windows = [dict(zip(session["window_fields"], w))
             for w in session["windows"]]
  # 2 rounds x 2 conditions x 2 variants, each of 2 loops of 10 steps.
  assert len(windows) == 8 and {w["steps"] for w in windows} == {20}
  assert {(w["condition"], w["variant"]) for w in windows} == {
      (c, v) for c in ("idle", "loaded") for v in ("ours", "stock_tfm")}
  # Stock TFM's stand-in burns twice ours' CPU a step: so say the pairs.
  ratios = run_all.pair_ratios(session, "stock_tfm")
  for condition in ("idle", "loaded"):
    assert ratios[condition]["cpu"]["n"] == 2
    assert 1.4 < ratios[condition]["cpu"]["median"] < 2.8
  text = run_all.render(str(tmp_path))
  row = next(line for line in text.splitlines()
             if 'id="target-digits-convnet-stock-tfm"' in line)
  assert "| met |" in row and os.path.basename(path) in row
  # A row this run did not measure says so, with its anchor.
  assert re.search(r'id="default-input-pool".*not measured', text)


def test_tfm_experiments_run_ours_and_stock_tfms_own_loop_on_one_config():
  # No process: what each side of a TFM experiment's pair is started with.
  for name, stock, registry in (
      ("seg_deeplabv3_pascal", "stock_tfm",
       "official.vision.registry_imports"),
      ("dlrm_criteo", "stock_ranking",
       "official.recommendation.ranking.train")):
    workload = training_loops.WORKLOADS[name]
    ours, theirs = (training_loops._argv(
        workload, training_loops.VARIANTS[v], "/m")
                    for v in ("ours", "stock_tfm"))
    shared = [f"--experiment={name}",
              f"--config_file={workload.config_file}"]
    assert os.path.exists(workload.config_file)
    assert training_loops.TRAIN in ours and set(shared) <= set(ours)
    assert f"--child={stock}" in theirs and set(shared) <= set(theirs)
    assert f"--registry={registry}" in theirs
    override = next(a for a in ours if a.startswith("--params_override="))
    assert override in theirs and "trainer.train_steps=" in override
  assert "--trainer=ranking" in ours and ours[:2] == [
      "env", "TF_USE_LEGACY_KERAS=1"]
  assert run_all.GROUPS["tfm_experiments"] == tuple(
      n for n in run_all.SESSIONS["full"] if n in run_all.GROUPS[
          "tfm_experiments"])


def _session(rows):
  return {"window_fields": list(training_loops.WINDOW_FIELDS),
          "windows": [[r, c, v, 10, wall, cpu, 0.0]
                      for r, c, v, wall, cpu in rows]}


def test_pairs_are_the_windows_of_one_round_and_condition():
  session = _session([
      (0, "idle", "ours", 1.0, 2.0), (0, "idle", "stock_tfm", 1.1, 2.4),
      (0, "loaded", "ours", 2.0, 2.0), (0, "loaded", "stock_tfm", 1.0, 2.2),
      (1, "idle", "stock_tfm", 1.0, 1.8),  # Ours never ran: no pair.
  ])
  ratios = run_all.pair_ratios(session, "stock_tfm")
  assert ratios["idle"]["cpu"]["n"] == 1
  assert ratios["idle"]["cpu"]["median"] == pytest.approx(1.2)
  assert ratios["loaded"]["wall"]["median"] == pytest.approx(0.5)


def test_a_row_is_missed_only_when_most_pairs_fall_short_idle_or_loaded():
  def cell(median, q3):
    return {"median": median, "q3": q3}
  assert run_all.verdict([cell(1.01, 1.1), cell(1.0, 1.2)], 1.0) == "met"
  assert run_all.verdict([cell(1.05, 1.1), cell(0.985, 0.99)],
                         1.0) == "parity"
  assert run_all.verdict([cell(1.05, 1.1), cell(0.95, 1.03)],
                         1.0) == "within the spread"
  assert run_all.verdict([cell(1.05, 1.1), cell(0.95, 0.99)],
                         1.0) == "**missed**"


# Burns `before` CPU seconds, says step 1 on `stream` as ours (stdout) or
# stock's Orbit through absl (stderr) does, burns `after`, exits.
FIRST_STEP_STAND_IN = """
import sys, time
before, after, stream = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def burn(seconds):
  end = time.process_time() + seconds
  while time.process_time() < end:
    pass
burn(before)
if stream == "stdout":
  print("step 1/1 | loss 1.0", flush=True)
elif stream == "stderr":
  print("I1205 controller.py:1] train | step:      1 | steps/sec: 1.0",
        file=sys.stderr, flush=True)
burn(after)
"""


def _first_step_stand_in(before, after, stream):
  return [sys.executable, "-c", FIRST_STEP_STAND_IN, str(before), str(after),
          stream]


def test_first_step_stamps_the_step_line_on_either_stream_and_renders_pairs(
    tmp_path):
  # Stock's stand-in burns twice ours' CPU before its step and after it.
  record = first_step.measure({"rounds": 2}, {"digits_convnet": {
      "ours": _first_step_stand_in(0.1, 0.1, "stdout"),
      "stock": _first_step_stand_in(0.2, 0.2, "stderr")}})
  rows = [dict(zip(record["fields"], row)) for row in record["processes"]]
  # Pairs alternate which runs first.
  assert [(r["round"], r["variant"]) for r in rows] == [
      (0, "ours"), (0, "stock"), (1, "stock"), (1, "ours")]
  for row in rows:
    assert 0.1 <= row["first_step_cpu_s"] < row["exit_cpu_s"]
    assert row["first_step_wall_s"] < row["exit_wall_s"]
    assert 0 < row["first_step_live_threads_cpu_s"] <= row["exit_cpu_s"]
  ratios = first_step.pair_ratios(record)["digits_convnet"]
  assert ratios["exit_cpu_s"]["n"] == 2
  for figure in ("first_step_cpu_s", "exit_cpu_s"):
    assert 1.3 < ratios[figure]["median"] < 2.8
  _common.write_json(str(tmp_path / "2026-01-01-0000-first-step.json"), {
      "mode": "first-step", "label": "", "busy_cores_throughout": 0,
      "machine": _common.machine(), "first_step": record})
  text = run_all.render(str(tmp_path))
  lines = text.splitlines()
  at = next(i for i, line in enumerate(lines)
            if 'id="first-step-digits-convnet"' in line)
  assert [line.split(" | ")[1] for line in lines[at:at + 3]] == [
      "ours", "stock", "stock/ours"]
  assert re.search(r'id="first-step-resnet-imagenet".*not measured', text)


def test_first_step_without_the_step_line_fails_with_the_childs_output():
  with pytest.raises(_common.ChildFailed, match="no first step's line"):
    first_step.time_process(_first_step_stand_in(0, 0, "neither"))


def test_precision_pairs_each_seeds_two_runs_and_renders_its_rows(tmp_path):
  # What `precision.measure` records, from runs made up here: seed 1's
  # bfloat16 is missing (a run that failed), so seed 1 is left out.
  runs = [(0, "float32", 0.99, 10.0), (0, "bfloat16", 0.98, 8.0),
          (1, "float32", 0.97, 10.0), (2, "bfloat16", 0.97, 6.0),
          (2, "float32", 0.96, 12.0)]
  record = {"digits": [{"seed": s, "dtype": d, "accuracy": a, "cpu_s": c}
                       for s, d, a, c in runs],
            "resnet50": [
                {"dtype": "float32", "cpu_s": 30.0,
                 "loss": [[1, 7.0], [5, 6.0], [10, 5.0]]},
                {"dtype": "bfloat16", "cpu_s": 20.0,
                 "loss": [[1, 7.1], [5, 5.5], [10, 5.2]]}]}
  figures = precision.summary(record)
  assert figures["digits"]["float32"]["n"] == 2
  assert figures["digits"]["difference"]["min"] == pytest.approx(-0.01)
  assert figures["digits"]["difference"]["max"] == pytest.approx(0.01)
  assert figures["digits"]["cpu_ratio"]["median"] == pytest.approx(1.625)
  assert figures["resnet50"]["largest_gap"] == pytest.approx(0.5)
  assert figures["resnet50"]["cpu_ratio"] == pytest.approx(1.5)
  (tmp_path / "2026-01-01-0000-precision.json").write_text(json.dumps({
      "machine": _common.machine(), "precision": record}))
  text = run_all.render(str(tmp_path))
  assert '<a id="bfloat16-accuracy-digits"></a>' in text
  assert "7.0000 -> 5.0000 | 7.1000 -> 5.2000" in text


def test_results_md_is_the_rendering_of_the_results_files():
  with open(os.path.join(REPO, "benchmarks", "RESULTS.md")) as f:
    committed = f.read()
  assert committed == run_all.render(run_all.RESULTS_DIR), (
      "re-render: python benchmarks/run_all.py --render")


def test_every_link_into_results_md_names_an_anchor_it_has():
  with open(os.path.join(REPO, "benchmarks", "RESULTS.md")) as f:
    anchors = set(re.findall(r'<a id="([^"]+)">', f.read()))
  links = set()
  files = [os.path.join(REPO, name) for name in os.listdir(REPO)]
  for folder in ("tfm_ext", "launchers", "experiments"):
    files += [os.path.join(root, name) for root, _, names
              in os.walk(os.path.join(REPO, folder)) for name in names]
  for name in files:
    if name.endswith((".py", ".md")):
      with open(name) as f:
        links |= set(re.findall(r"RESULTS\.md#([a-z0-9-]+)", f.read()))
  assert links and links <= anchors, sorted(links - anchors)


def test_the_gpu_script_without_a_gpu_says_so_and_writes_nothing(tmp_path):
  out = tmp_path / "gpu_results.json"
  env = dict(os.environ, PATH=str(tmp_path))  # No nvidia-smi to find.
  done = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", "gpu_resnet50.py"),
       f"--out={out}"], capture_output=True, text=True, env=env, timeout=120,
      check=False)
  assert done.returncode == 2, done
  assert done.stderr.startswith("error: no GPU (nvidia-smi lists none)")
  assert "Traceback" not in done.stderr and not out.exists()
