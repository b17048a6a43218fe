"""Hosts of their own: workers, an evaluator and trainers on three hosts.

Each host is a network, UTS and mount namespace of the GCS box
(tests/gcs_box.py, `Box.host`): its own address on a LAN that reaches
nothing else (10.77.0.11-13; the bucket's server at 10.77.0.1), its own
host name (host1-3), its own `/tmp` (where each keeps its digits cache,
its TMPDIR and its logs' temp files). The model_dir is one `gs://` prefix
on the box's bucket, reached through TensorFlow's own GCS client over the
LAN. What a test proves is what a cluster relies on across hosts:
`multi_worker_mirrored` over the hosts' addresses, preemption of one worker
saving both at one step, an evaluator on a third host evaluating every
checkpoint, and the trainer lease judging a holder on another host by its
heartbeat's age alone.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import DOUBLES_TRAIN
import gcs_box as gcs_box_lib

# pylint: disable=redefined-outer-name

WORKER_PORT = 2222  # Each host has its own ports: one port for every worker.
STEPS = 40
# TensorFlow would delete the first 2 of the 5 checkpoints (one each loop,
# and the preemption's) before the evaluator on host3 sees them; retention
# (tfm_ext.model_dir.retention) keeps those not yet evaluated while the
# evaluator's presence beats, up to 2 x 3: the run's 5, so none is
# evaluated or deleted by chance.
MAX_TO_KEEP = 3
MULTI = (f"trainer.train_steps={STEPS},trainer.steps_per_loop=10,"
         "trainer.summary_interval=10,trainer.checkpoint_interval=10,"
         f"trainer.max_to_keep={MAX_TO_KEEP},task.model.dropout_rate=0.0,"
         "runtime.distribution_strategy=multi_worker_mirrored")
# The lease's timing, short for the test (defaults: 10 s and 60 s).
HEARTBEAT_SECONDS = 1
STALE_SECONDS = 12


@pytest.fixture(scope="session")
def hosts(gcs_box):
  """host1, host2 and host3, made once a session in the session's box.

  Where the box runs but hosts cannot be made (a kernel without veth or
  bridges), a skip naming why; a failure with `TFM_EXT_GCS_BOX=required`.
  """
  try:
    return [gcs_box.host(f"host{i}") for i in (1, 2, 3)]
  except RuntimeError as e:
    if os.environ.get("TFM_EXT_GCS_BOX") == "required":
      pytest.fail(f"TFM_EXT_GCS_BOX=required, but no hosts in the box: {e}")
    pytest.skip(f"no hosts in the GCS box: {e}")


class Job:
  """A launcher on a host; its stdout and stderr in files of the test's.

  Forked on the host (`forked_in`) from a process that imported TensorFlow
  there once: a job is its own process, with the host's network, name and
  `/tmp`. That `/tmp` hides the test's, so the job writes its output
  through the test's open descriptors (`/proc/PID/fd/N`, the same file on
  any mount). A `held` one starts when the test says `go`.
  """

  def __init__(self, forked_in, host, argv, out_dir, env=None, held=False):
    self.host = host
    self.out = os.path.join(out_dir, f"{host.name}-{uuid.uuid4().hex[:6]}")
    self._files = [open(self.out + ".stdout", "w"),
                   open(self.out + ".stderr", "w")]
    stdout, stderr = (f"/proc/{os.getpid()}/fd/{f.fileno()}"
                      for f in self._files)
    env = {"TFM_EXT_DATA_DIR": "/tmp/data", **(env or {})}
    self._start = lambda: forked_in.start(host, argv, stdout=stdout,
                                          stderr=stderr, env=env,
                                          script=DOUBLES_TRAIN)
    self.proc = None if held else self._start()

  def go(self):
    """Starts a `held` job."""
    self.proc = self._start()

  def stdout(self):
    with open(self.out + ".stdout") as f:
      return f.read()

  def stderr(self):
    with open(self.out + ".stderr") as f:
      return f.read()

  def steps(self):
    """The steps of the `step N/M` lines so far."""
    return [int(line.split()[1].split("/")[0])
            for line in self.stdout().splitlines() if line.startswith("step ")]

  def wait_until(self, predicate, timeout=600):
    deadline = time.monotonic() + timeout
    while not predicate():
      assert self.proc.poll() is None, f"{self} ended first"
      assert time.monotonic() < deadline, f"{self}: not within {timeout}s"
      time.sleep(0.2)

  def finish(self, timeout=600):
    try:
      self.proc.wait(timeout=timeout)
    finally:
      self.proc.kill()
      self.proc.wait()
      for f in self._files:
        f.close()
    return self.proc.returncode

  def __repr__(self):
    code = self.proc and self.proc.poll()
    return (f"job on {self.host.name} (exit {code})\n--- stdout\n"
            f"{self.stdout()[-2000:]}\n--- stderr\n{self.stderr()[-5000:]}")


def _tf_config(workers, index):
  return json.dumps({"cluster": {"worker": [f"{h.ip}:{WORKER_PORT}"
                                            for h in workers]},
                     "task": {"type": "worker", "index": index}})


def _start_workers(forked_in, workers, model_dir, out_dir, env):
  return [Job(forked_in, host, ["--experiment=digits_rows", "--mode=train",
                     f"--model_dir={model_dir}", f"--params_override={MULTI}"],
              out_dir,
              env={"TF_CONFIG": _tf_config(workers, i),
                   # TF's preemption handler asks the GCE metadata server:
                   # a closed port on the host's own loopback.
                   "GCE_METADATA_IP": "127.0.0.1:9", **env})
          for i, host in enumerate(workers)]


def _json(box, name):
  return json.loads(box.read(name))


def _checkpoint_steps(box, prefix):
  return sorted(int(name[len(prefix) + 6:-len(".index")])
                for name in box.list(f"{prefix}/ckpt-")
                if name.endswith(".index"))


def _stop(jobs):
  for job in jobs:
    if job.proc and job.proc.poll() is None:
      job.proc.kill()
      job.proc.wait()


def test_each_host_has_its_name_address_and_tmp_and_reaches_the_lan_alone(
    gcs_box, hosts):
  for host in hosts:
    seen = host.run(["sh", "-c", "hostname; getent hosts www.googleapis.com "
                     "host1 host2 host3 | cut -d' ' -f1; echo $TMPDIR"])
    assert seen.returncode == 0, seen
    assert seen.stdout.split() == [host.name, gcs_box_lib.SERVER_IP,
                                   *(h.ip for h in hosts), "/tmp"], seen
  # A file in one host's /tmp is in no other's, nor in the machine's.
  name = f"only-here-{uuid.uuid4().hex[:6]}"
  assert hosts[0].run(["touch", f"/tmp/{name}"]).returncode == 0
  assert hosts[1].run(["test", "-e", f"/tmp/{name}"]).returncode == 1
  assert not os.path.exists(f"/tmp/{name}")
  # The other hosts, by name, and the server: no route to anything else.
  reach = ("import socket, sys\n"
           "for address in sys.argv[1:]:\n"
           "  try:\n"
           "    socket.create_connection((address, 443), timeout=5).close()\n"
           "    print(address, 'connected')\n"
           "  except OSError as e:\n"
           "    print(address, e.errno)\n")
  tried = hosts[0].run([sys.executable, "-c", reach, "www.googleapis.com",
                        "host2", "8.8.8.8", "127.0.0.2"])
  assert tried.stdout.splitlines() == [
      "www.googleapis.com connected", f"host2 {errno.ECONNREFUSED}",
      f"8.8.8.8 {errno.ENETUNREACH}", f"127.0.0.2 {errno.ECONNREFUSED}"], (
          tried)


def test_a_job_outside_its_host_is_refused_before_it_starts(gcs_box, hosts,
                                                            tmp_path):
  ran = tmp_path / "ran"
  guard = [sys.executable, gcs_box_lib.__file__, "--guard-host"]
  # In the box but on no host; on host2 under host1's name.
  for refused in (gcs_box.run([*guard, "host1", hosts[0].ip, "--", "touch",
                               str(ran)]),
                  subprocess.run(hosts[1].command([*guard, "host1",
                                                   hosts[0].ip, "--", "true"]),
                                 capture_output=True, text=True, check=False)):
    assert refused.returncode == 1, refused
    assert "gcs_box: refusing to run on host host1" in refused.stderr
  assert not ran.exists()


@pytest.mark.slow
def test_workers_on_two_hosts_are_preempted_resume_and_a_third_evaluates_all(
    gcs_box, hosts, forked_in, tmp_path):
  prefix = f"hosts-{uuid.uuid4().hex[:8]}"
  model_dir = gcs_box.bucket_url(prefix)
  workers, evaluator_host = hosts[:2], hosts[2]
  requests = os.path.join(gcs_box.state_dir, "requests.log")
  seen = os.path.getsize(requests)  # The session's other tests' requests.
  # This test's TMPDIR on each host: what the jobs leave there is checked.
  env = {"TMPDIR": f"/tmp/{prefix}"}
  for host in hosts:
    assert host.run(["mkdir", env["TMPDIR"]]).returncode == 0
  # Started first: it waits for the trainer's params.yaml, then for each
  # checkpoint, through the preemption too (up to 300 s without one).
  evaluator = Job(forked_in, evaluator_host, [
      "--experiment=digits_rows", "--mode=continuous_eval",
      f"--model_dir={model_dir}",
      "--params_override=trainer.continuous_eval_timeout=300"], str(tmp_path),
                  env=env)
  jobs = _start_workers(forked_in, workers, model_dir, str(tmp_path), env)
  try:
    # SIGTERM to the worker that is not the chief, once it trained a loop.
    jobs[1].wait_until(lambda: any(s >= 10 for s in jobs[1].steps()))
    jobs[1].proc.send_signal(signal.SIGTERM)
    assert [job.finish() for job in jobs] == [42, 42], jobs
    for job in jobs:
      assert "preempted:" in job.stderr() and "Traceback" not in job.stderr()
    summary = _json(gcs_box, f"{prefix}/run_summary.json")
    saved = summary["global_step"]
    assert summary["status"] == "preempted"
    # At the step in flight when the signal came, on both workers.
    assert 10 <= saved < STEPS, summary
    assert _checkpoint_steps(gcs_box, prefix)[-1] == saved

    jobs = _start_workers(forked_in, workers, model_dir, str(tmp_path), env)
    assert [job.finish() for job in jobs] == [0, 0], jobs
    summary = _json(gcs_box, f"{prefix}/run_summary.json")
    assert (summary["status"], summary["global_step"]) == ("completed", STEPS)
    assert summary["resumed_from_step"] == saved
    # Each worker's replica saw its half of the global batch of 64.
    assert summary["train_metrics"]["rows_per_replica"] == 32

    assert evaluator.finish() == 0, evaluator
  finally:
    _stop([*jobs, evaluator])
  ledger = [_json(gcs_box, name)
            for name in gcs_box.list(f"{prefix}/eval_ledger/")
            if name.endswith(".json")]
  evaluated = sorted(e["global_step"] for e in ledger
                     if e["status"] == "evaluated")
  kept = _checkpoint_steps(gcs_box, prefix)
  print(f"preempted at {saved}, evaluated {evaluated}, "
        f"kept {kept}")
  # Every checkpoint: one each loop (10 steps) from step 10, the
  # preemption's at `saved`, the resumed run's each 10 steps from there,
  # the last at STEPS; none recorded missing.
  assert evaluated[0] == 10 and saved in evaluated, ledger
  assert evaluated[-1] == STEPS and all(
      0 < b - a <= 10 for a, b in zip(evaluated, evaluated[1:])), ledger
  assert [e for e in ledger if e["status"] != "evaluated"] == [], ledger
  assert kept[-1] == STEPS and len(kept) <= 2 * MAX_TO_KEEP, kept
  eval_summary = _json(gcs_box, f"{prefix}/eval_summary.json")
  assert eval_summary["global_step"] == STEPS
  # The bucket heard from each host at its own address, and from nothing
  # else: no job went through the box's loopback.
  with open(requests) as f:
    f.seek(seen)
    clients = {line.split()[1] for line in f if '"' in line}
  assert clients == {h.ip for h in hosts}, clients
  # Each host kept its own files in its own /tmp: the digits cache; and no
  # job (preempted, finished, the evaluator) left a temp dir in TMPDIR:
  # neither the chief's and evaluator's log dirs (copied to the bucket) nor
  # the other worker's checkpoint dirs. (That worker's absl log files stay
  # there: it has no model_dir of its own to keep them.)
  for host in hosts:
    assert host.run(["test", "-s", "/tmp/data/digits/train-00000-of-00001"
                     ".tfrecord"]).returncode == 0, host
    left = host.run(["find", env["TMPDIR"], "-mindepth", "1", "-type", "d"])
    assert (left.returncode, left.stdout) == (0, ""), (host, left)


@pytest.mark.slow
def test_the_lease_judges_a_holder_on_another_host_by_its_heartbeat(
    gcs_box, hosts, forked_in, tmp_path):
  prefix = f"lease-{uuid.uuid4().hex[:8]}"
  model_dir = gcs_box.bucket_url(prefix)
  lease_name = f"{prefix}/trainer_lease.json"
  override = ("--params_override=trainer.train_steps={},"
              "trainer.steps_per_loop=10,trainer.summary_interval=10,"
              "trainer.checkpoint_interval={}")
  train = ["--experiment=digits_convnet", "--mode=train",
           f"--model_dir={model_dir}", override.format(100000, 100000)]
  lease_env = {"TFM_EXT_LEASE_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
               "TFM_EXT_LEASE_STALE_SECONDS": str(STALE_SECONDS),
               "TMPDIR": f"/tmp/{prefix}"}
  for host in hosts[:2]:
    assert host.run(["mkdir", lease_env["TMPDIR"]]).returncode == 0
  holder = Job(forked_in, hosts[0], train, str(tmp_path), env=lease_env)
  # Launched when the test says.
  second = Job(forked_in, hosts[1], train, str(tmp_path), env=lease_env,
               held=True)
  relaunch = Job(forked_in, hosts[1], train[:-1] + [override.format(20, 20)],
                 str(tmp_path), env=lease_env, held=True)
  jobs = [holder, second, relaunch]
  try:
    holder.wait_until(lambda: gcs_box.list(lease_name))
    # A live holder on host1: a trainer on host2 refuses, naming it.
    second.go()
    assert second.finish() == 2, second
    assert f"{model_dir} is in use by another trainer (host host1, pid " \
        f"{holder.proc.pid}," in second.stderr(), second
    assert holder.proc.poll() is None, holder

    # host1's trainer SIGKILLed: its heartbeat stops, its lease stays. Its
    # pid is gone, and host2 is not to care: it is another host's pid (in
    # the same pid namespace here, so the host name alone must decide).
    holder.proc.kill()
    holder.proc.wait()
    lease = _json(gcs_box, lease_name)
    assert (lease["host"], lease["pid"]) == ("host1", holder.proc.pid)
    # Once its heartbeat is older than the 3 beats of a live holder, a
    # relaunch on host2 does not refuse; it watches the lease, and takes it
    # once the heartbeat has not changed for STALE_SECONDS as it watched.
    while time.time() - lease["heartbeat"] <= 3.5 * HEARTBEAT_SECONDS:
      time.sleep(0.1)
    relaunch.go()
    assert relaunch.finish() == 0, relaunch
  finally:
    _stop(jobs)
  log = relaunch.stderr()
  waited = [line for line in log.splitlines() if "waiting until it beats "
            f"again or is {STALE_SECONDS}s old" in line]
  assert waited and "host host1," in waited[0], relaunch
  taken = [line for line in log.splitlines()
           if f"Taking over {model_dir}/trainer_lease.json" in line]
  assert taken and "(host host1," in taken[0], relaunch
  # Judged by its own heartbeat standing still for STALE_SECONDS as host2
  # watched it, not by comparing the hosts' clocks.
  age = float(taken[0].split("it has not changed for ")[1].split("s as ")[0])
  assert age >= STALE_SECONDS - 0.5, taken  # Rounded to the second.
  summary = _json(gcs_box, f"{prefix}/run_summary.json")
  assert (summary["status"], summary["global_step"]) == ("completed", 20)
  assert lease_name not in gcs_box.list(lease_name)  # Released at the end.
  # host2's refused and finished runs left nothing in its TMPDIR. (host1's
  # SIGKILLed trainer left its log's temp dir: nothing cleans that.)
  left = hosts[1].run(["ls", "-A", lease_env["TMPDIR"]])
  assert (left.returncode, left.stdout) == (0, ""), left
