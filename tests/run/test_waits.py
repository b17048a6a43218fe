"""A start-up wait is said while it lasts and ends on a signal: exit 42."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO
from conftest import TRAIN
from conftest import free_ports


def _started(args, tmp_path, env=None):
  err = open(tmp_path / "stderr", "w+")  # pylint: disable=consider-using-with
  proc = subprocess.Popen(
      [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=err,
      cwd=REPO, env={**os.environ, "PYTHONPATH": REPO,
                     "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
  return proc, tmp_path / "stderr"


def _wait_for(path, fragment, proc, timeout):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    text = path.read_text()
    if fragment in text:
      return time.monotonic()
    assert proc.poll() is None, text
    time.sleep(0.1)
  proc.kill()
  raise AssertionError(f"no {fragment!r} within {timeout}s: {path.read_text()}")


def _signalled(proc, sig):
  sent = time.monotonic()
  proc.send_signal(sig)
  code = proc.wait(timeout=30)
  return code, time.monotonic() - sent


def test_a_signal_ends_a_wait_whose_handler_cannot_run(tmp_path):
  # The handler is Python's, but does nothing: as when the main thread is
  # held in TensorFlow's native code and never gets to run it.
  proc, err = _started(["-c", (
      "import signal, time\n"
      "from tfm_ext.run import waits\n"
      "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
      "  signal.signal(s, lambda *a: None)\n"
      "with waits.announced(\"the test's peer\", first=1.0):\n"
      "  time.sleep(120)\n")], tmp_path)
  started = time.monotonic()
  said = _wait_for(err, "waiting for the test's peer (1s)", proc, 60)
  assert said - started < 30
  code, took = _signalled(proc, signal.SIGHUP)
  assert code == 42 and took < 5, err.read_text()
  assert ("preempted: SIGHUP received while waiting for the test's peer: "
          "nothing to save yet; exit 42") in err.read_text()


def _cluster_task(tmp_path, strategy, cluster, said, sig):
  """Worker 0 of `cluster`, none of whose peers runs: its end on `sig`."""
  model_dir = tmp_path / "m"
  proc, err = _started(
      [TRAIN, "--experiment=digits_convnet", "--mode=train",
       f"--model_dir={model_dir}",
       f"--params_override=runtime.distribution_strategy={strategy}"],
      tmp_path, env={"TF_CONFIG": json.dumps(
          {"cluster": cluster, "task": {"type": "worker", "index": 0}})})
  _wait_for(err, "waiting for the cluster of TF_CONFIG to answer (this is "
            f"worker 0; {said})", proc, 60)
  code, took = _signalled(proc, sig)
  assert (f"preempted: {sig.name} received while waiting for the cluster"
          in err.read_text()), err.read_text()
  assert not model_dir.exists()
  return code, took


def test_a_parameter_server_task_says_it_waits_for_its_cluster(tmp_path):
  chief, worker, ps = (f"127.0.0.1:{p}" for p in free_ports(3))
  code, took = _cluster_task(
      tmp_path, "parameter_server",
      {"chief": [chief], "worker": [worker], "ps": [ps]},
      f"chief {chief}; ps {ps}; worker {worker}", signal.SIGTERM)
  assert code == 42 and took < 5


def test_a_multi_worker_task_whose_peer_never_starts_says_so_and_ends(
    tmp_path):
  # Its connect holds the interpreter's lock: no thread of it runs, and
  # the watcher ends it (SIGKILL) where the lock stays held.
  workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
  code, took = _cluster_task(
      tmp_path, "multi_worker_mirrored", {"worker": workers},
      f"worker {', '.join(workers)}", signal.SIGINT)
  assert code in (42, -signal.SIGKILL) and took < 8
