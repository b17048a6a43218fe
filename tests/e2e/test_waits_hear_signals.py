"""Every wait a launcher makes ends within 2 s of SIGTERM, SIGINT or SIGHUP.

Through the real launcher (forked), with real signals: a trainer watching
a stale lease, a multi-worker task whose peer never starts (the wait in
Python), one whose peer answers but never joins (TensorFlow's native
connect, where its coordination service has a SIGTERM handler of its
own), an evaluator waiting for its trainer's params.yaml and for a
checkpoint, a training worker whose step waits in a collective for a
peer that was stopped (SIGSTOP). Each exits 42 with its `preempted:`
line and no traceback, having written nothing it did not have before (the
worker a stopped peer held: nothing after its last checkpoint, which
stays intact).
The times measured are printed (`-s`).
"""

import json
import os
import signal
import socket
import time

import pytest

from conftest import free_ports

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
# What the issue asks (2 s), with room for a loaded machine.
SLACK_SECONDS = 5.0


def _started(forked_in, tmp_path, argv, env=None):
  out, err = tmp_path / "stdout", tmp_path / "stderr"
  proc = forked_in.start(None, argv, stdout=out, stderr=err, env=env)
  return proc, out, err


def _when_said(proc, paths, fragment, timeout=90):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if any(fragment in p.read_text() for p in paths):
      return
    assert proc.poll() is None, [p.read_text()[-3000:] for p in paths]
    time.sleep(0.1)
  raise AssertionError(f"no {fragment!r}: {paths[-1].read_text()[-3000:]}")


def _signalled(proc, sig, err, what):
  """Sends `sig`; asserts exit 42 within the slack, the line, no traceback."""
  sent = time.monotonic()
  proc.send_signal(sig)
  while proc.poll() is None and time.monotonic() - sent < 30:
    time.sleep(0.02)
  took = time.monotonic() - sent
  text = err.read_text()
  print(f"{what}: {sig.name} -> exit {proc.returncode} in {took:.2f}s")
  assert proc.returncode == 42, text[-3000:]
  assert took < SLACK_SECONDS, took
  assert f"preempted: {sig.name} received" in text, text[-3000:]
  assert "Traceback" not in text, text[-3000:]
  return took


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_trainer_watching_a_stale_lease_exits_42_on_a_signal(
    forked_in, tmp_path, sig):
  # A lease of another host whose stamp is old: the trainer watches it for
  # the stale time (here 300 s), looking every heartbeat (10 s).
  model_dir = tmp_path / "m"
  model_dir.mkdir()
  lease = {"owner": "vm-far:4121:x", "host": "vm-far", "pid": 4121,
           "pid_space": "far", "token": "0" * 16,
           "started": time.time() - 3600, "beats": 7,
           "heartbeat": time.time() - 600}
  (model_dir / "trainer_lease.json").write_text(json.dumps(lease))
  proc, out, err = _started(
      forked_in, tmp_path,
      [f"--model_dir={model_dir}", "--experiment=digits_convnet",
       "--mode=train"], env={"TFM_EXT_LEASE_STALE_SECONDS": "300"})
  _when_said(proc, [out, err], "watching its lease for 300s")
  _signalled(proc, sig, err, "stale lease")
  # The lease untouched, no claim left; only the run's log was written.
  assert json.loads((model_dir / "trainer_lease.json").read_text()) == lease
  assert not os.listdir(model_dir / "trainer_lease_claims") if (
      model_dir / "trainer_lease_claims").exists() else True
  assert sorted(os.listdir(model_dir)) in (
      ["logs", "trainer_lease.json"],
      ["logs", "trainer_lease.json", "trainer_lease_claims"])


def _worker0(forked_in, tmp_path, peer):
  """Worker 0 of a two-worker multi_worker_mirrored cluster, waiting."""
  own = f"127.0.0.1:{free_ports(1)[0]}"
  model_dir = tmp_path / "m"
  proc, out, err = _started(
      forked_in, tmp_path,
      [f"--model_dir={model_dir}", "--experiment=digits_convnet",
       "--mode=train",
       "--params_override=runtime.distribution_strategy=multi_worker_mirrored"],
      env={"TF_CONFIG": json.dumps({"cluster": {"worker": [own, peer]},
                                    "task": {"type": "worker", "index": 0}})})
  return proc, out, err, model_dir


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_worker_whose_peer_never_starts_exits_42_on_a_signal(
    forked_in, tmp_path, sig):
  peer = f"127.0.0.1:{free_ports(1)[0]}"
  proc, _, err, model_dir = _worker0(forked_in, tmp_path, peer)
  # Said from 10 s on; by then it waits (in Python: `waits.until_answered`).
  _when_said(proc, [err], "waiting for the cluster of TF_CONFIG")
  _signalled(proc, sig, err, "peer never starts")
  assert "while waiting for the cluster of TF_CONFIG" in err.read_text()
  assert not model_dir.exists()


@pytest.fixture
def listener():
  """A peer's address that takes TCP connections but is no TensorFlow."""
  server = socket.create_server(("127.0.0.1", 0))
  yield f"127.0.0.1:{server.getsockname()[1]}"
  server.close()


# SIGHUP takes SIGINT's way there (the main thread's Python handler): the
# suite's time is better spent elsewhere.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT],
                         ids=lambda s: s.name)
def test_a_worker_held_in_tensorflows_connect_exits_42_on_a_signal(
    forked_in, tmp_path, listener, sig):
  # Its peer answers, so TensorFlow connects, and waits for a peer that
  # never joins; meanwhile TensorFlow's coordination service has a SIGTERM
  # handler of its own. The connect runs on a thread of its own
  # (`waits.connect_released`): each signal ends it at once.
  proc, _, err, model_dir = _worker0(forked_in, tmp_path, listener)
  _when_said(proc, [err], "waiting for the cluster of TF_CONFIG")
  _signalled(proc, sig, err, "held in TensorFlow's connect")
  assert "while waiting for the cluster of TF_CONFIG" in err.read_text()
  assert not model_dir.exists()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_an_evaluator_waiting_for_its_trainer_exits_42_on_a_signal(
    forked_in, tmp_path, sig):
  # No params.yaml yet (it waits in the start-up), then none of a
  # checkpoint (it waits in the run: the watcher's flag).
  model_dir = tmp_path / "m"
  proc, out, err = _started(
      forked_in, tmp_path,
      [f"--model_dir={model_dir}", "--experiment=digits_convnet",
       "--mode=continuous_eval",
       "--params_override=trainer.continuous_eval_timeout=600"])
  _when_said(proc, [out, err], "waiting up to 600s for a trainer's")
  _signalled(proc, sig, err, "evaluator, no params.yaml")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_an_evaluator_waiting_for_a_checkpoint_exits_42_on_a_signal(
    forked_in, launch_forked, tmp_path, sig):
  # A trainer's params.yaml and no checkpoint yet: it waits in the run,
  # polling every second (`continuous_eval`; the poll's sleep ends at the
  # signal).
  model_dir = tmp_path / "m"
  model_dir.mkdir()
  shown = launch_forked("--experiment=digits_convnet", "--print_config",
                        model_dir=model_dir)
  assert shown.returncode == 0, shown
  (model_dir / "params.yaml").write_text(shown.stdout)
  proc, _, err = _started(
      forked_in, tmp_path,
      [f"--model_dir={model_dir}", "--experiment=digits_convnet",
       "--mode=continuous_eval",
       "--params_override=trainer.continuous_eval_timeout=600"])
  log = model_dir / "logs" / "tfm_ext.INFO"
  deadline = time.monotonic() + 90
  while not (log.exists() and "No checkpoint file found" in log.read_text()):
    assert proc.poll() is None and time.monotonic() < deadline, (
        err.read_text()[-3000:])
    time.sleep(0.1)
  time.sleep(3)  # Into its loop of listings.
  _signalled(proc, sig, err, "evaluator, no checkpoint")
  assert "stopped evaluating at step 0" in err.read_text()


def test_a_worker_held_by_a_stopped_peer_exits_42_on_a_signal(
    forked_in, tmp_path):
  # Two workers train; worker 1 is stopped (SIGSTOP: alive, silent), so
  # worker 0's step waits in a collective that TensorFlow would end only
  # once worker 1's heartbeats time out (10 s and more). A SIGTERM to
  # worker 0 ends it within 2 s: its line names the silent peer and the
  # last checkpoint, which stays intact; the step it was at is not saved.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "m"
  workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
  procs = []
  for index in range(2):
    (tmp_path / str(index)).mkdir()
    procs.append(_started(
        forked_in, tmp_path / str(index),
        [f"--model_dir={model_dir}", "--experiment=digits_convnet",
         "--mode=train", "--params_override=runtime.distribution_strategy="
         "multi_worker_mirrored,trainer.train_steps=100000,"
         "trainer.steps_per_loop=50,trainer.checkpoint_interval=50,"
         "trainer.summary_interval=100000,"
         "trainer.validation_interval=100000"],
        env={"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                      "task": {"type": "worker",
                                               "index": index}})}))
  (chief, _, err), (peer, _, _) = procs
  deadline = time.monotonic() + 120
  while not (model_dir / "ckpt-50.index").exists():
    assert chief.poll() is None and time.monotonic() < deadline, (
        err.read_text()[-3000:])
    time.sleep(0.1)
  peer.send_signal(signal.SIGSTOP)
  try:
    time.sleep(0.5)  # Worker 0 now waits for it.
    _signalled(chief, signal.SIGTERM, err, "held by a stopped peer")
  finally:
    peer.send_signal(signal.SIGCONT)
  latest = tf.train.latest_checkpoint(str(model_dir))
  assert (f"preempted: SIGTERM received while waiting for worker 1 "
          f"({workers[1]}), which does not answer, in a collective"
          in err.read_text()), err.read_text()[-3000:]
  assert f"The last checkpoint, {latest}, is intact." in err.read_text()
  assert tf.train.load_checkpoint(latest).get_tensor(
      "global_step/.ATTRIBUTES/VARIABLE_VALUE") == int(latest.split("-")[-1])
