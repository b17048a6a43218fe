"""Two worker processes on loopback: MultiWorkerMirroredStrategy through the launcher."""

import json
import os
import re
import signal
import time

import pytest
import tensorflow as tf

from conftest import DOUBLES_TRAIN
from conftest import free_ports

STEPS = 100
OVERRIDE = (f"trainer.train_steps={STEPS},trainer.steps_per_loop=10,"
            "trainer.summary_interval=10,trainer.checkpoint_interval=10,"
            "trainer.validation_interval=50,task.model.dropout_rate=0.0,"
            "runtime.deterministic=true")
MULTI = OVERRIDE + ",runtime.distribution_strategy=multi_worker_mirrored"
# digits_convnet whose training metrics count the rows each replica sees.
ARGS = ("--experiment=digits_rows", "--mode=train_and_eval")


def worker_env(ports, index):
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  # No GCE_METADATA_IP: nothing asks the GCE metadata server where it runs
  # (TF's preemption handler, which did, is not used).
  return {"TF_CONFIG": json.dumps({"cluster": cluster,
                                   "task": {"type": "worker", "index": index}})}


def start_workers(start, model_dir, ports, override=MULTI):
  return [start(*ARGS, f"--params_override={override}", model_dir=model_dir,
                env=worker_env(ports, i), script=DOUBLES_TRAIN)
          for i in range(len(ports))]


@pytest.mark.slow
def test_two_workers_train_like_one_worker_and_only_chief_writes(
    start_forked, launch_forked, tmp_path):
  single = launch_forked(*ARGS, f"--params_override={OVERRIDE}",
                         model_dir=tmp_path / "single", script=DOUBLES_TRAIN)
  assert single.returncode == 0, single

  model_dir = tmp_path / "multi"
  workers = start_workers(start_forked, model_dir, free_ports(2))
  results = [w.finish(timeout=300) for w in workers]
  for result in results:
    assert result.returncode == 0, result
  latest = tf.train.latest_checkpoint(str(model_dir))
  assert latest.endswith(f"ckpt-{STEPS}")
  summary = results[0].summary()
  assert summary["global_step"] == STEPS
  # Each worker's one replica trained on its half of the global batch of 64,
  # and the last loop (10 steps) saw 10 global batches across both workers.
  assert summary["train_metrics"]["rows_per_replica"] == 32
  assert summary["train_metrics"]["examples_seen"] == 10 * 64
  assert single.summary()["train_metrics"]["rows_per_replica"] == 64
  # Same global batch (64 = 2 workers x 32), schedule and seed; the data
  # order differs (each worker reads its own shard), so the results agree
  # within a tolerance, not bitwise: validation loss within 0.05, accuracy
  # within 3 points after 100 steps (measured: 0.064 vs 0.101, 97.8 % vs
  # 95.6 %; both runs are deterministic, so this does not flake).
  multi, one = summary["eval_metrics"], single.summary()["eval_metrics"]
  print("validation multi-worker:", multi, "single:", one)
  assert abs(multi["validation_loss"] - one["validation_loss"]) <= 0.05
  assert abs(multi["accuracy"] - one["accuracy"]) <= 0.03
  # Only the chief wrote into model_dir: no worker-named files or dirs.
  names = os.listdir(model_dir)
  assert not [n for n in names if "worker" in n.lower()], names
  assert len(os.listdir(model_dir / "train")) == 1  # One event file.


def _saved_step(model_dir):
  return int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("sig,while_loop", [(signal.SIGTERM, True),
                                            (signal.SIGHUP, False)],
                         ids=["SIGTERM", "SIGHUP-python-loop"])
def test_a_signal_to_one_worker_stops_all_within_a_step_and_they_resume(
    start_forked, tmp_path, sig, while_loop):
  # A loop of 100000 steps (minutes): a signal on the worker that is not
  # the chief stops both after the same step, both save there, exit 42,
  # in a traced loop and in a Python one; relaunched, both resume there.
  model_dir = tmp_path / "multi"
  override = (MULTI.replace(f"train_steps={STEPS}", "train_steps=100001")
              .replace("steps_per_loop=10", "steps_per_loop=100000")
              .replace("_interval=10", "_interval=100000")
              .replace("validation_interval=50", "validation_interval=100000")
              + f",trainer.train_tf_while_loop={str(while_loop).lower()}")
  workers = start_workers(start_forked, model_dir, free_ports(2), override)
  workers[1].wait_for_line(lambda l: l.startswith("step 1/"))
  time.sleep(3)  # Into the long loop.
  sent = time.monotonic()
  workers[1].proc.send_signal(sig)
  results = [w.finish(timeout=120) for w in workers]
  exited = time.monotonic() - sent
  assert [r.returncode for r in results] == [42, 42], results
  assert exited < 20, exited
  name = signal.Signals(sig).name
  saved = _saved_step(model_dir)
  print(f"both exited {exited:.1f}s after the signal, saved at {saved}")
  assert 1 < saved < 20000, saved
  assert (f"preempted: {name} received: saved a checkpoint at step {saved}"
          in results[1].stderr), results[1].stderr[-2000:]
  assert ("preempted: another worker received a signal: saved a checkpoint "
          f"at step {saved}" in results[0].stderr), results[0].stderr[-2000:]
  for result in results:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "did not update `global_step`" not in result.stderr
  summary = results[0].summary()
  assert (summary["status"], summary["exit_code"], summary["global_step"]) == (
      "preempted", 42, saved)
  if not while_loop:
    return
  relaunched = start_workers(start_forked, model_dir, free_ports(2),
                             override.replace("train_steps=100001",
                                              f"train_steps={saved + 10}"))
  results = [w.finish(timeout=300) for w in relaunched]
  assert [r.returncode for r in results] == [0, 0], results
  summary = results[0].summary()
  assert (summary["resumed_from_step"], summary["global_step"]) == (
      saved, saved + 10)


@pytest.mark.slow
def test_a_worker_killed_ends_the_other_in_one_paragraph_exit_42(
    start_forked, tmp_path):
  # SIGKILL (no signal to handle): the chief finds its peer gone once
  # TensorFlow's heartbeats stop, says which, writes its summary, exit 42
  # for the cluster manager to restart both.
  model_dir = tmp_path / "multi"
  override = (MULTI.replace(f"train_steps={STEPS}", "train_steps=100001")
              .replace("steps_per_loop=10", "steps_per_loop=100000")
              .replace("_interval=10", "_interval=100000")
              .replace("validation_interval=50", "validation_interval=100000"))
  workers = start_workers(start_forked, model_dir, free_ports(2), override)
  workers[1].wait_for_line(lambda l: l.startswith("step 1/"))
  time.sleep(2)
  workers[1].proc.kill()
  chief = workers[0].finish(timeout=120)
  assert chief.returncode == 42, chief
  errors = [l for l in chief.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, chief.stderr[-3000:]
  assert re.search(r"Worker /job:worker/replica:0/task:1 stopped answering "
                   r"\(.+\) while training at step \d+", errors[0]), errors
  assert "Traceback" not in chief.stderr, chief.stderr[-3000:]
  summary = chief.summary()
  assert (summary["status"], summary["exit_code"]) == ("failed", 42), summary


@pytest.mark.slow
@pytest.mark.parametrize("asked_by", ["chief_action", "early_stopping"])
def test_a_stop_asked_on_the_chief_stops_every_worker_cleanly(
    start_forked, tmp_path, asked_by):
  # `context.stop` called on the chief only, or early stopping (each worker
  # judges the same all-reduced metric): every worker saves at the same
  # step and exits 0, the summary saying why.
  model_dir = tmp_path / "multi"
  override = MULTI.replace(f"train_steps={STEPS}", "train_steps=60")
  env = {"CHIEF_STOPS_AT": "30"}
  if asked_by == "early_stopping":  # No gain of 1.0: stops at the third.
    override = (override.replace("validation_interval=50",
                                 "validation_interval=10")
                + ",trainer.validation_steps=2,"
                "trainer.early_stopping.metric=accuracy,"
                "trainer.early_stopping.patience=2,"
                "trainer.early_stopping.min_delta=1.0")
    env = {}
  workers = [start_forked(*ARGS, f"--params_override={override}",
                          model_dir=model_dir,
                          env={**worker_env(ports, i), **env},
                          script=DOUBLES_TRAIN)
             for ports in [free_ports(2)] for i in range(2)]
  results = [w.finish(timeout=300) for w in workers]
  assert [r.returncode for r in results] == [0, 0], results
  assert _saved_step(model_dir) == 30
  summary = results[0].summary()
  assert (summary["status"], summary["global_step"],
          summary["stopped_early_at"]) == ("completed", 30, 30), summary
  chief_said = results[0].stdout + results[0].stderr
  other_said = results[1].stdout + results[1].stderr
  if asked_by == "chief_action":
    assert "the chief's action at step 30" in chief_said, chief_said[-2000:]
    assert "another worker asked the run to stop" in other_said, (
        other_said[-2000:])
  else:
    assert "early stopping" in chief_said, chief_said[-2000:]
  for result in results:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


SERVER = """
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                     task_index=resolver.task_id, protocol="grpc").join()
"""


@pytest.mark.slow
def test_a_parameter_server_cluster_trains_and_a_sidecar_evaluates(
    launch_forked, forked_in, tmp_path):
  # TFM's parameter-server training: a worker and a ps (TensorFlow's
  # servers, as a cluster runs them) and the chief, our launcher, on
  # loopback; then the evaluator the refusal of train_and_eval names. All
  # five are forked (`forked_in`, `launch_forked`): none is about an
  # interpreter's start-up.
  chief, worker, ps = free_ports(3)
  cluster = {"chief": [f"127.0.0.1:{chief}"],
             "worker": [f"127.0.0.1:{worker}"], "ps": [f"127.0.0.1:{ps}"]}

  def tf_config(kind):
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}})

  server_py = tmp_path / "server.py"
  server_py.write_text(SERVER)
  servers = [forked_in.start(None, [], stdout=tmp_path / f"{kind}.stdout",
                             stderr=tmp_path / f"{kind}.stderr",
                             env={"TF_CONFIG": tf_config(kind)},
                             script=str(server_py))
             for kind in ("worker", "ps")]
  try:
    model_dir = tmp_path / "ps"
    trained = launch_forked(
        "--experiment=digits_convnet", "--mode=train",
        "--params_override=runtime.distribution_strategy=parameter_server,"
        "trainer.train_steps=20,trainer.steps_per_loop=10,"
        "trainer.summary_interval=10,trainer.checkpoint_interval=10",
        model_dir=model_dir, env={"TF_CONFIG": tf_config("chief"),
                                  "GCE_METADATA_IP": "127.0.0.1:9"})
  finally:
    for server in servers:
      server.kill()
      server.wait()
  assert trained.returncode == 0, trained
  assert "done | train | step 20" in trained.stdout, trained.stdout
  summary = trained.summary()
  assert summary["strategy"].startswith("ParameterServerStrategy"), summary
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-20")
  refused = launch_forked(
      "--experiment=digits_convnet", "--mode=train_and_eval",
      "--params_override=runtime.distribution_strategy=parameter_server",
      model_dir=tmp_path / "refused", env={"TF_CONFIG": tf_config("chief")})
  assert refused.returncode == 2, refused
  assert "--mode=continuous_eval" in refused.stderr, refused.stderr
  sidecar = launch_forked(
      "--experiment=digits_convnet", "--mode=continuous_eval",
      "--params_override=runtime.distribution_strategy=one_device",
      model_dir=model_dir)
  assert sidecar.returncode == 0, sidecar
  assert "continuous_eval | 2 checkpoint(s) evaluated here" in (
      sidecar.stdout), sidecar.stdout


@pytest.mark.slow
def test_a_worker_started_seconds_after_the_other_joins_and_both_train(
    start_forked, tmp_path):
  # The one started first waits in Python (`waits.until_answered`), its
  # own address answering from a placeholder socket; the late one finds
  # it, and TensorFlow connects both: the placeholder was closed in time.
  model_dir = tmp_path / "multi"
  ports = free_ports(2)
  override = (MULTI.replace(f"train_steps={STEPS}", "train_steps=20")
              .replace("validation_interval=50", "validation_interval=1000"))
  late = start_forked("--experiment=digits_convnet", "--mode=train",
                      f"--params_override={override}", model_dir=model_dir,
                      env=worker_env(ports, 1))
  time.sleep(5)
  chief = start_forked("--experiment=digits_convnet", "--mode=train",
                       f"--params_override={override}", model_dir=model_dir,
                       env=worker_env(ports, 0))
  results = [w.finish(timeout=300) for w in (chief, late)]
  assert [r.returncode for r in results] == [0, 0], results
  assert _saved_step(model_dir) == 20
  for result in results:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
