"""The test suite's wall and CPU time, commits against each other, interleaved.

    python benchmarks/suite_time.py baa8e29 HEAD --pairs=2

Each round runs the suite once for every commit, from a fresh clone, as CI
does (`.ci/run` less its system packages: `pip install -e ".[test]"`, not
timed, then the README's `python -m pytest -q tests`, timed); the order
rotates each round, so that no commit always runs first or after the same
other. A round's runs are a pair: minutes apart on the same machine, so the
ratio of a pair cancels most of what the machine does to both. Per run it
records the wall time and the CPU time of the suite's whole process tree
(user and system, each process's once it was reaped), and the suite's last
line; per commit the spread of each, and per round the ratio of every
commit's wall and CPU to the first commit's (below 1: faster than it).

Writes `benchmarks/suite/<date>-<first>-<others>.json`, with the tests
that failed in a run; the suite's output goes to a `.log` per run beside
the clones, kept only when it failed.
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # pylint: disable=g-import-not-at-top

OUT_DIR = os.path.join(_common.REPO, "benchmarks", "suite")
ENV = {"CI": "true", "TFM_EXT_GCS_BOX": "required",
       "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore"}


def _git(*args) -> str:
  return subprocess.run(["git", *args], cwd=_common.REPO, check=True,
                        capture_output=True, text=True).stdout.strip()


def _children_cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def run_suite(commit: str, work: str) -> dict:
  """One fresh clone of `commit`, installed, its suite run and timed."""
  clone = os.path.join(work, commit)
  shutil.rmtree(clone, ignore_errors=True)
  subprocess.run(["git", "clone", "-q", _common.REPO, clone], check=True)
  subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
  env = {**os.environ, **ENV}
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e",
                  ".[test]"], cwd=clone, env=env, check=True)
  started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
  log = os.path.join(work, f"{commit}-{started[:19].replace(' ', '-')}.log")
  cpu, began = _children_cpu(), time.monotonic()
  with open(log, "w") as out:
    code = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests"],
                          cwd=clone, env=env, stdout=out,
                          stderr=subprocess.STDOUT, check=False).returncode
  wall, cpu = time.monotonic() - began, _children_cpu() - cpu
  with open(log) as f:
    lines = f.read().strip().splitlines()
  shutil.rmtree(clone, ignore_errors=True)
  if code == 0:
    os.remove(log)
  result = {"commit": commit, "started": started, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "returncode": code,
            "last_line": lines[-1],
            "failed": [l for l in lines if l.startswith(("FAILED", "ERROR"))]}
  print(result, flush=True)
  return result


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("commits", nargs="+", help="Commits; the first is the "
                      "one the others' ratios are to.")
  parser.add_argument("--pairs", type=int, default=2, help="Rounds.")
  parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(),
                                                     "suite_time"))
  args = parser.parse_args(argv)
  commits = [_git("rev-parse", "--short", c) for c in args.commits]
  os.makedirs(args.work, exist_ok=True)
  rounds = []
  for i in range(args.pairs):
    runs = {c: run_suite(c, args.work) for c in _common.rotated(commits, i)}
    rounds.append([runs[c] for c in commits])
  summary = {}
  for j, commit in enumerate(commits):
    summary[commit] = {
        key: _common.spread([r[j][key] for r in rounds])
        for key in ("wall_s", "cpu_s")}
    if j:
      for key in ("wall_s", "cpu_s"):
        summary[commit][f"{key}_ratio"] = _common.spread(
            [r[j][key] / r[0][key] for r in rounds])
  results = {"machine": _common.machine(), "commits": commits,
             "rounds": rounds, "summary": summary}
  os.makedirs(OUT_DIR, exist_ok=True)
  name = time.strftime("%Y-%m-%d-%H%M", time.gmtime())
  path = os.path.join(OUT_DIR, f"{name}-{'-'.join(commits)}.json")
  _common.write_json(path, results)
  for commit, each in summary.items():
    print(commit, {k: (v["median"], v["min"], v["max"])
                   for k, v in each.items()})
  print("wrote", path)
  return results


if __name__ == "__main__":
  main()
