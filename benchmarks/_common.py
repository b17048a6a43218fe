"""What the benchmarks share: child processes, busy loops, medians, the machine.

Every measured variant runs in a process of its own, so that each pays its
own start-up and its memory and CPU time are its own; what it prints is
timestamped here, as it arrives.
"""

import argparse
import ctypes
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# TensorFlow's C++ INFO lines would bury what a child prints.
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONPATH": REPO}


class ChildFailed(RuntimeError):
  """A benchmark subprocess exited with an error or ran out of time."""


def _die_with_parent() -> None:
  # A child stopped with SIGSTOP cannot notice its parent is gone: the
  # kernel kills it instead (PR_SET_PDEATHSIG), so that a crashed benchmark
  # leaves no stopped process holding gigabytes or a busy core.
  ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def popen(argv: Sequence[str]) -> subprocess.Popen:
  """Starts `argv` from the repository root; its output (and errors) piped."""
  return subprocess.Popen(list(argv), cwd=REPO, env={**os.environ,
                                                     **CHILD_ENV},
                          text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT,
                          preexec_fn=_die_with_parent)


def run_child(argv: Sequence[str], timeout: float = 900.0) -> Dict[str, Any]:
  """Runs `argv` to its end in a fresh process.

  Returns `lines`, each line of its output as `(seconds, line)`: its
  arrival since the child was started (a clock outside the child, the same
  for every variant); `peak_rss_mib`, the child's peak over its whole
  life, and `cpu_s`, its user and system time, all threads (from `wait4`);
  and `wall_s`.

  Raises:
    ChildFailed: on a non-zero exit or after `timeout` seconds, with the
      tail of the child's output.
  """
  start = time.time()
  proc = popen(argv)
  watchdog = threading.Timer(timeout, proc.kill)
  watchdog.start()
  with proc.stdout:
    lines = [(time.time() - start, line.rstrip("\n")) for line in proc.stdout]
  watchdog.cancel()
  # `wait4` rather than `Popen.wait`: it returns the child's own rusage.
  _, status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode != 0:
    tail = "\n".join(line for _, line in lines[-40:])
    raise ChildFailed(f"{' '.join(argv)} exited with {proc.returncode} "
                      f"after {time.time() - start:.0f}s:\n{tail}")
  return {"lines": lines, "peak_rss_mib": usage.ru_maxrss / 1024,
          "cpu_s": usage.ru_utime + usage.ru_stime,
          "wall_s": time.time() - start}


def peak_rss_mib(pid: int) -> Optional[float]:
  """`VmHWM` of a live process, in MiB; None once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      return next(int(line.split()[1]) / 1024 for line in f
                  if line.startswith("VmHWM:"))
  except (OSError, StopIteration):
    return None


def thread_cpu(pid: int) -> Optional[Dict[str, int]]:
  """Nanoseconds each live thread of `pid` has run, by thread id.

  The scheduler's own count (`/proc/<pid>/task/<tid>/schedstat`), exact to
  the nanosecond; `/proc/<pid>/stat`'s user and system time are samples at
  the clock's tick (10 ms), a few percent of a window. None once `pid` is
  gone.
  """
  tasks = f"/proc/{pid}/task"
  out = {}
  try:
    tids = os.listdir(tasks)
  except OSError:
    return None
  for tid in tids:
    try:
      with open(f"{tasks}/{tid}/schedstat") as f:
        out[tid] = int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
      pass  # The thread ended.
  return out


def cpu_between(start: Dict[str, int], end: Dict[str, int]) -> float:
  """Seconds the threads ran from one `thread_cpu` reading to another.

  A thread started in between counts whole; one that ended in between
  counts nothing of its last share (TensorFlow's and tf.data's pools live as
  long as the process).
  """
  return sum(ns - start.get(tid, 0) for tid, ns in end.items()) / 1e9


class Spinners:
  """`count` processes each able to keep a core busy: a neighbour's job.

  Each spins a plain Python loop; `hold(n)` lets the first `n` run and
  stops the others (SIGSTOP), so that switching conditions costs no
  process start.
  """

  def __init__(self, count: int):
    self._procs = [subprocess.Popen(
        [sys.executable, "-c", "while True:\n  pass\n"],
        preexec_fn=_die_with_parent) for _ in range(count)]
    self.hold(0)

  def hold(self, n: int) -> None:
    for i, proc in enumerate(self._procs):
      proc.send_signal(signal.SIGCONT if i < n else signal.SIGSTOP)

  def close(self) -> None:
    for proc in self._procs:
      proc.kill()
      proc.wait()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def median(values: Sequence[Optional[float]]) -> Optional[float]:
  """The median of the values that are not None; None if there are none."""
  present = [v for v in values if v is not None]
  return statistics.median(present) if present else None


def spread(values: Sequence[float]) -> Dict[str, float]:
  """Median, quartiles (of the inclusive method), min, max and count."""
  values = sorted(values)
  if len(values) < 2:
    q1 = q3 = values[0]
  else:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
  return {"median": statistics.median(values), "q1": q1, "q3": q3,
          "min": values[0], "max": values[-1], "n": len(values)}


def medians(runs: List[Dict[str, Any]], keys: Sequence[str]
            ) -> Dict[str, Optional[float]]:
  """`{key: median over runs}` for each of `keys`."""
  return {key: median([run.get(key) for run in runs]) for key in keys}


def rotated(items: Sequence[Any], shift: int) -> List[Any]:
  """`items` rotated left by `shift` places: run in this order at the
  `shift`-th repeat, no item always runs first or after the same other."""
  shift %= max(len(items), 1)
  return list(items[shift:]) + list(items[:shift])


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

  With `--busy=N`, N cores spin in other processes meanwhile (the loaded
  condition). Writes the results as JSON to `--out` if given; returns them.
  """
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--smoke", action="store_true",
                      help="Tiny sizes: checks that it runs.")
  parser.add_argument("--busy", type=int, default=0,
                      help="Cores kept busy by other processes meanwhile.")
  parser.add_argument("--out", help="Write the results as JSON here.")
  args = parser.parse_args(argv)
  with Spinners(args.busy) as busy:
    busy.hold(args.busy)
    results = measure(smoke_sizes if args.smoke else sizes)
  results["busy_cores"] = args.busy
  if args.out:
    write_json(args.out, results)
  return results


def write_json(path: str, value: Any) -> None:
  """Writes `value` as JSON to `path`, a list of numbers or strings on one
  line (a window of `training_loops.pairs` is one line)."""
  with open(path, "w") as f:
    f.write(_dumps(value) + "\n")


def _dumps(value: Any, indent: str = "") -> str:
  inner = indent + " "
  if isinstance(value, dict) and value:
    items = [f"{inner}{json.dumps(str(k))}: {_dumps(value[k], inner)}"
             for k in sorted(value)]
  elif isinstance(value, list) and any(isinstance(v, (dict, list))
                                       for v in value):
    items = [inner + _dumps(v, inner) for v in value]
  else:
    return json.dumps(value)
  opening, closing = "{}" if isinstance(value, dict) else "[]"
  return opening + "\n" + ",\n".join(items) + "\n" + indent + closing


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
      # from HEAD (results and RESULTS.md do not count).
      "uncommitted_changes": bool(git(
          "status", "--porcelain", "--untracked-files=no", "--", ".",
          ":!benchmarks/results", ":!benchmarks/RESULTS.md")),
      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
      "bf16": cpu_bf16(),
  }


def cpu_bf16() -> Dict[str, bool]:
  """Which of the x86 bfloat16 instruction sets this CPU has.

  Without `avx512_bf16` or `amx_bf16`, TensorFlow runs bfloat16 through
  float32 and conversions: slower than float32.
  """
  flags = set()
  try:
    with open("/proc/cpuinfo") as f:
      flags = set(next(line for line in f if line.startswith("flags"))
                  .split(":", 1)[1].split())
  except (OSError, StopIteration):
    pass
  return {flag: flag in flags for flag in ("avx512_bf16", "amx_bf16")}
