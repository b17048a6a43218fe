"""A start-up wait is said while it lasts and ends on a signal: exit 42."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT,
                                 signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_ends_a_wait_that_holds_the_interpreter_with_exit_42(
    tmp_path, sig):
  # The main thread locks a mutex it holds, in C, with the interpreter's
  # lock held (`PyDLL`): as TensorFlow's multi-worker connect waits, no
  # thread of the process runs. The watcher's signal 42 (libc's `_exit`)
  # ends it: exit 42, not a SIGKILL.
  proc, err = _started(["-c", (
      "import ctypes\n"
      "from tfm_ext.run import waits\n"
      "libc = ctypes.PyDLL(None)\n"
      "mutex = ctypes.create_string_buffer(64)\n"
      "with waits.announced(\"the test's peer\", first=1.0):\n"
      "  libc.pthread_mutex_lock(mutex)\n"
      "  libc.pthread_mutex_lock(mutex)\n")], tmp_path)
  started = time.monotonic()
  said = _wait_for(err, "waiting for the test's peer (1s)", proc, 60)
  assert said - started < 30
  code, took = _signalled(proc, sig)
  print(f"held in C: {sig.name} -> exit {code} in {took:.2f}s")
  assert code == 42 and took < 5, err.read_text()
  assert (f"preempted: {sig.name} received while waiting for the test's "
          "peer: nothing to save yet; exit 42") in err.read_text()


def test_a_signal_ends_a_python_wait_at_once(tmp_path):
  proc, err = _started(["-c", (
      "import time\n"
      "from tfm_ext.run import waits\n"
      "with waits.announced(\"the test's peer\", first=1.0):\n"
      "  time.sleep(120)\n")], tmp_path)
  _wait_for(err, "waiting for the test's peer (1s)", proc, 60)
  code, took = _signalled(proc, signal.SIGTERM)
  assert code == 42 and took < 1, (took, err.read_text())


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
  # It waits in Python for its peer (`waits.until_answered`), before
  # TensorFlow's connect, which would hold the interpreter.
  workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
  code, took = _cluster_task(
      tmp_path, "multi_worker_mirrored", {"worker": workers},
      f"worker {', '.join(workers)}", signal.SIGTERM)
  assert code == 42 and took < 5


def test_a_sigterm_handler_tensorflow_installs_in_the_block_is_taken_back(
    tmp_path):
  # TensorFlow's coordination service installs a SIGTERM handler of its own
  # (in C) while a multi-worker strategy connects; after the block the
  # start-up's handler is back, so a SIGTERM before the run's is heard.
  proc, err = _started(["-c", (
      "import ctypes, os, signal, time\n"
      "from tfm_ext.base import startup\n"
      "from tfm_ext.run import waits\n"
      "startup.install_signals()\n"
      "libc = ctypes.CDLL(None)\n"
      "with waits.announced(\"the test's peer\"):\n"
      "  libc.signal(signal.SIGTERM, ctypes.c_void_p(1))  # SIG_IGN, in C.\n"
      "os.kill(os.getpid(), signal.SIGTERM)\n"
      "time.sleep(5)\n"
      "print('SIGTERM lost')\n")], tmp_path)
  code = proc.wait(timeout=60)
  assert code == 42, err.read_text()
  assert "preempted: SIGTERM received during start-up" in err.read_text()
