"""What the benchmarks share: fresh processes, their peak memory, medians.

Every measured variant runs in a process of its own, so that each pays its
own start-up (time to first step) and its peak resident memory is its own;
what it prints is timestamped here, as it arrives.
"""

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TensorFlow's C++ INFO lines would bury what a child prints.
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONPATH": REPO}
# Each condition: how many cores other processes keep busy while a run
# measures. Training hosts are shared (other jobs, data loaders, an
# evaluator beside the trainer); a default is kept only if it wins or ties
# in both.
CONDITIONS = {"idle": 0, "loaded": max(1, (os.cpu_count() or 2) // 2)}


class ChildFailed(RuntimeError):
  """A benchmark subprocess exited with an error or ran out of time."""


def run_child(argv: Sequence[str], timeout: float = 900.0,
              echo: bool = False) -> Dict[str, Any]:
  """Runs `argv` from the repository root in a fresh process.

  Returns `lines`, each line of its output as `(seconds, line,
  peak_rss_mib, cpu_seconds)`: its arrival time since the child was started
  (a clock outside the child, the same for every variant), the child's peak
  resident memory so far and the CPU time all its threads used so far (user
  and system; None once it is gone); `peak_rss_mib`,
  the child's peak over its whole life (from `wait4`); and
  `process_seconds`, its wall time. With `echo`, lines are printed as they
  come.

  Raises:
    ChildFailed: on a non-zero exit or after `timeout` seconds, with the
      tail of the child's output.
  """
  env = {**os.environ, **CHILD_ENV}
  start = time.time()
  proc = subprocess.Popen(list(argv), cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  watchdog = threading.Timer(timeout, proc.kill)
  watchdog.start()
  lines = []
  with proc.stdout:
    for line in proc.stdout:
      lines.append((time.time() - start, line.rstrip("\n"),
                    _peak_rss_so_far(proc.pid), _cpu_seconds(proc.pid)))
      if echo:
        print(line, end="", flush=True)
  watchdog.cancel()
  # `wait4` rather than `Popen.wait`: it returns the child's own rusage,
  # where `RUSAGE_CHILDREN` would give the largest of all children so far.
  _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  seconds = time.time() - start
  if proc.returncode != 0:
    tail = "\n".join(line for _, line, *_ in lines[-40:])
    raise ChildFailed(f"{' '.join(argv)} exited with {proc.returncode} "
                      f"after {seconds:.0f}s:\n{tail}")
  return {"lines": lines,
          "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB.
          "process_seconds": seconds}


def _peak_rss_so_far(pid: int) -> Optional[float]:
  """`VmHWM` of a live process, in MiB; None once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return None


def _cpu_seconds(pid: int) -> Optional[float]:
  """User and system CPU time of a live process, all its threads; None once
  it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      # Fields 14 and 15 (utime, stime), counted after the command name,
      # which may hold spaces but ends at the last ")".
      fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  except (OSError, IndexError, ValueError):
    return None


def _spin(seconds: float, results) -> None:
  wall, cpu = time.perf_counter(), time.process_time()
  while time.perf_counter() - wall < seconds:
    pass
  results.put((time.process_time() - cpu) / (time.perf_counter() - wall))


def available_cores(seconds: float = 0.25) -> float:
  """How many cores a busy loop per core got just now, summed (0..cores).

  The machine may be shared: a neighbour's work shows as a busy loop that
  gets less CPU time than wall time.
  """
  context = multiprocessing.get_context("fork")
  results = context.Queue()
  workers = [context.Process(target=_spin, args=(seconds, results))
             for _ in range(os.cpu_count() or 1)]
  for worker in workers:
    worker.start()
  total = sum(results.get() for _ in workers)
  for worker in workers:
    worker.join()
  return total


def wait_for_quiet(min_cores: float, max_wait: float = 10.0) -> float:
  """Waits (up to `max_wait` s) until `available_cores() >= min_cores`.

  Returns the last figure, recorded with each run: a run that started on a
  busy machine is seen as such.
  """
  deadline = time.time() + max_wait
  cores = available_cores()
  while cores < min_cores and time.time() < deadline:
    time.sleep(1.0)
    cores = available_cores()
  return cores


@contextlib.contextmanager
def busy_cores(count: int):
  """Keeps `count` cores busy while the block runs: a neighbour's job.

  Each is a separate process spinning a plain Python loop, outside the
  measured run, as another job on a shared training host would be. A
  spinner stops by itself once this process is gone (killed, so that this
  block's exit never ran): it would otherwise load the machine for good,
  and hold open an output pipe its parent's reader waits on.
  """
  spin = ("import os\nparent = os.getppid()\n"
          "while os.getppid() == parent:\n"
          "  for _ in range(1000000):\n    pass\n")
  spinners = [subprocess.Popen([sys.executable, "-c", spin])
              for _ in range(count)]
  try:
    if spinners:
      time.sleep(0.5)  # Let them reach their loops.
    yield
  finally:
    for spinner in spinners:
      spinner.kill()
      spinner.wait()


def median(values: Sequence[Optional[float]]) -> Optional[float]:
  """The median of the values that are not None; None if there are none."""
  present = [v for v in values if v is not None]
  return statistics.median(present) if present else None


def rotated(items: Sequence[Any], shift: int) -> List[Any]:
  """`items` rotated left by `shift` places: run in this order at the
  `shift`-th repeat, no item always runs first or after the same other."""
  shift %= max(len(items), 1)
  return list(items[shift:]) + list(items[:shift])


def medians(runs: List[Dict[str, Any]], keys: Sequence[str]
            ) -> Dict[str, Optional[float]]:
  """`{key: median over runs}` for each of `keys`."""
  return {key: median([run.get(key) for run in runs]) for key in keys}


def timed(fn, repeats: int) -> List[float]:
  """Calls `fn()` `repeats` times; returns each call's seconds."""
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    seconds.append(time.perf_counter() - start)
  return seconds


def python() -> str:
  """The interpreter running the benchmarks, for their children."""
  return sys.executable


def script(name: str) -> str:
  """The path of `benchmarks/<name>`."""
  return os.path.join(REPO, "benchmarks", name)


def sized_main(doc: str, measure: Callable[[Dict[str, Any]], Dict[str, Any]],
               sizes: Dict[str, Any], smoke_sizes: Dict[str, Any],
               argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """`main` of a benchmark that `measure`s at `sizes` (`--smoke`: smaller).

  With `--busy=N`, N cores spin in other processes while it measures (the
  loaded condition). Writes the results as JSON to `--out` if given, and
  returns them.
  """
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--smoke", action="store_true",
                      help="Tiny sizes: checks that it runs.")
  parser.add_argument("--busy", type=int, default=0,
                      help="Cores kept busy by other processes meanwhile.")
  parser.add_argument("--out", help="Write the results as JSON here.")
  args = parser.parse_args(argv)
  with busy_cores(args.busy):
    results = measure(smoke_sizes if args.smoke else sizes)
  results["busy_cores"] = args.busy
  if args.out:
    write_json(args.out, results)
  return results


def write_json(path: str, value: Any) -> None:
  """Writes `value` as indented JSON to `path`."""
  with open(path, "w") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")


def machine() -> Dict[str, Any]:
  """The machine and code measured: CPU, cores, versions and commit."""
  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f
                 if line.startswith("model name"))
  except (OSError, StopIteration):
    pass

  def git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                          text=True, check=False).stdout.strip()

  from importlib import metadata  # pylint: disable=g-import-not-at-top
  return {
      "cpu": cpu,
      "cores": os.cpu_count(),
      "memory_gib": round(os.sysconf("SC_PAGE_SIZE")
                          * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
      "python": platform.python_version(),
      "tensorflow": metadata.version("tensorflow"),
      "tf_models_official": metadata.version("tf-models-official"),
      "commit": git("rev-parse", "--short", "HEAD"),
      # Benchmarks run on the working tree: say whether its code differs
      # from HEAD (the results files an earlier run just wrote do not count).
      "uncommitted_changes": bool(git(
          "status", "--porcelain", "--untracked-files=no", "--", ".",
          ":!benchmarks/*.json", ":!benchmarks/RESULTS.md")),
      "date": time.strftime("%Y-%m-%d %H:%M %Z"),
      "bf16": cpu_bf16(),
  }


def cpu_bf16() -> Dict[str, bool]:
  """Which of the x86 bfloat16 instruction sets this CPU has.

  `avx512_bf16` converts and multiplies bfloat16 in vectors; `amx_bf16`
  multiplies bfloat16 tiles. Without either, TensorFlow runs bfloat16
  through float32 and conversions: slower than float32.
  """
  flags = set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          flags = set(line.split(":", 1)[1].split())
          break
  except OSError:
    pass
  return {flag: flag in flags for flag in ("avx512_bf16", "amx_bf16")}
