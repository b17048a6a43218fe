"""Signals act within a step: a long loop stops at the next step (issue 46).

Real launchers, real signals, a loop of 100000 steps (minutes on this
CPU): the signal's line comes at once, the checkpoint is saved at the step
the loop was at, the process exits 42 within seconds and a relaunch
resumes from that step.
"""

import os
import re
import signal
import textwrap
import time

import pytest
import tensorflow as tf

from conftest import REPO

HUGE_LOOP = ("--experiment=digits_convnet", "--mode=train",
             "--params_override=trainer.train_steps=100001,"
             "trainer.steps_per_loop=100000,"
             "trainer.checkpoint_interval=100000,"
             "trainer.summary_interval=100000")


def _stderr_when(job, pattern, timeout):
  """The forked job's stderr once `pattern` is in it, and how long it took."""
  start = time.monotonic()
  while time.monotonic() - start < timeout:
    with open(job.proc._stderr) as f:  # pylint: disable=protected-access
      text = f.read()
    if re.search(pattern, text):
      return text, time.monotonic() - start
    time.sleep(0.05)
  raise AssertionError(f"no {pattern!r} on stderr within {timeout}s")


def _in_the_long_loop(start_forked, model_dir, *flags):
  """A job past its one-step first loop, a few seconds into the long one."""
  job = start_forked(*HUGE_LOOP, *flags, model_dir=model_dir)
  job.wait_for_line(lambda l: l.startswith("step 1/"))
  time.sleep(3)  # About 200 steps of digits on two shared cores.
  return job


def _saved_step(model_dir):
  latest = tf.train.latest_checkpoint(str(model_dir))
  return int(latest.rsplit("-", 1)[1]) if latest else None


@pytest.mark.slow
@pytest.mark.parametrize("sig,trainer", [
    (signal.SIGINT, "custom"), (signal.SIGTERM, "custom"),
    (signal.SIGHUP, "custom"), (signal.SIGTERM, "tfm_base")],
                         ids=["SIGINT", "SIGTERM", "SIGHUP", "tfm_base"])
def test_a_signal_mid_loop_saves_at_the_next_step_and_exits_42(
    start_forked, launch_forked, tmp_path, sig, trainer):
  model_dir = tmp_path / "m"
  job = _in_the_long_loop(start_forked, model_dir, f"--trainer={trainer}")
  sent = time.monotonic()
  job.proc.send_signal(sig)
  name = signal.Signals(sig).name
  said, took = _stderr_when(job, f"{name} received: stopping after the step "
                            "in flight", timeout=10)
  assert took < 1.5, took  # As the signal arrives, not after the loop.
  run = job.finish(timeout=60)
  exited = time.monotonic() - sent
  assert run.returncode == 42, run
  assert exited < 15, exited
  saved = _saved_step(model_dir)
  print(f"line after {took:.2f}s, exit after {exited:.2f}s, saved {saved}")
  # Well before the loop's end (step 100001), after its first steps.
  assert saved is not None and 1 < saved < 20000, saved
  assert "Traceback" not in run.stderr
  assert "did not update `global_step`" not in run.stderr
  assert run.stderr.count(f"\n{name} received:") + run.stderr.startswith(
      f"{name} received:") == 1, run.stderr
  assert f"preempted: {name} received: saved a checkpoint at step {saved}" in (
      run.stderr)
  summary = run.summary()
  assert (summary["status"], summary["exit_code"], summary["global_step"]) == (
      "preempted", 42, saved)

  resumed = launch_forked(
      "--experiment=digits_convnet", "--mode=train", f"--trainer={trainer}",
      f"--params_override=trainer.train_steps={saved + 10},"
      "trainer.steps_per_loop=10", model_dir=model_dir)
  assert resumed.returncode == 0, resumed
  summary = resumed.summary()
  assert (summary["resumed_from_step"], summary["global_step"],
          summary["exit_code"]) == (saved, saved + 10, 0)


@pytest.mark.slow
def test_a_second_signal_mid_loop_aborts_at_once_without_saving(
    start_forked, tmp_path):
  model_dir = tmp_path / "m"
  job = _in_the_long_loop(start_forked, model_dir)
  sent = time.monotonic()
  # Both reach the process while its main thread runs the traced loop
  # (two of one kind sent at once would be one: the kernel merges them).
  job.proc.send_signal(signal.SIGTERM)
  job.proc.send_signal(signal.SIGINT)
  run = job.finish(timeout=60)
  assert run.returncode == 42, run
  assert time.monotonic() - sent < 10
  # Python runs the handlers of two pending signals in its own order
  # (SIGINT's number first): either may be the first, the other the second.
  assert len(re.findall(r"SIG(INT|TERM) received: stopping",
                        run.stderr)) == 1, run.stderr
  assert len(re.findall(r"aborted: a second SIG(INT|TERM): stopped at once "
                        "without saving", run.stderr)) == 1, run.stderr
  assert "saved a checkpoint" not in run.stderr
  assert _saved_step(model_dir) is None  # The interval saves none before.
  assert "Traceback" not in run.stderr


_QUITS = textwrap.dedent("""
    import sys
    import tfm_ext

    @tfm_ext.register_action("quits", phase="train")
    def quits(context):
      step = context.trainer.global_step
      def act(output):
        if int(step.numpy()) >= 20:
          sys.exit(0)  # A user's script helper, called from an action.
      return act
    """)


def test_sys_exit_in_an_action_is_that_actions_failure(launch, tmp_path):
  (tmp_path / "quits_at_20.py").write_text(_QUITS)
  run = launch("--experiment=digits_convnet", "--mode=train",
               "--registry=quits_at_20",
               "--params_override=trainer.train_steps=40,"
               "trainer.steps_per_loop=10",
               model_dir=tmp_path / "m",
               env={"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
  assert run.returncode == 0, run
  assert ("warning: the train action 'quits' failed at step 20: SystemExit: 0"
          in run.stderr), run
  summary = run.summary()
  assert (summary["status"], summary["global_step"], summary["exit_code"]) == (
      "completed", 40, 0)
  assert summary["action_failures"] == {"train/quits": 3}  # 20, 30, 40.


_QUITS_IN_A_HOOK = textwrap.dedent("""
    import sys
    import tfm_ext

    @tfm_ext.register_trainer("quits_in_a_hook")
    class QuitsInAHook(tfm_ext.CustomTrainer):
      def train_loop_end(self):
        if int(self.global_step.numpy()) >= 20:
          sys.exit(0)
        return super().train_loop_end()
    """)


def test_sys_exit_in_a_trainer_hook_is_a_bug_with_its_summary(launch,
                                                              tmp_path):
  (tmp_path / "quits_in_a_hook.py").write_text(_QUITS_IN_A_HOOK)
  run = launch("--experiment=digits_convnet", "--mode=train",
               "--registry=quits_in_a_hook", "--trainer=quits_in_a_hook",
               "--params_override=trainer.train_steps=40,"
               "trainer.steps_per_loop=10",
               model_dir=tmp_path / "m",
               env={"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
  assert run.returncode == 1, run
  assert "RuntimeError: sys.exit(0) inside the run" in run.stderr, run
  summary = run.summary()
  assert (summary["status"], summary["global_step"], summary["exit_code"]) == (
      "failed", 20, 1)
  assert "a bug: SystemExit" in summary["message"]
