"""Notifications (`tfm_ext.actions.notify`), POSTed to an HTTP server on 127.0.0.1."""

import http.server
import json
import re
import signal
import socket
import threading
import time

import pytest
import tensorflow as tf

from tfm_ext.actions import notify
from tfm_ext.base.errors import UsageError

from conftest import DOUBLES_TRAIN, SMOKE


class Hook(http.server.ThreadingHTTPServer):
  """A server on 127.0.0.1 that records the JSON POSTed to it.

  It answers with the codes of `answers` in turn, then 200; while `hold` is
  clear it keeps each request waiting (`held` is set once one waits).
  """

  daemon_threads = True

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.bodies = []  # Every request's body, in order, answered or not.
    self.answers = []
    self.hold = threading.Event()
    self.hold.set()
    self.held = threading.Event()
    self.url = f"http://127.0.0.1:{self.server_address[1]}/hook"

  def events(self):
    """The bodies answered 200, as (event, step) pairs."""
    return [(b["event"], b["step"]) for b, code in self.bodies if code == 200]


class _Handler(http.server.BaseHTTPRequestHandler):

  def do_POST(self):  # pylint: disable=invalid-name
    server = self.server
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    if not server.hold.is_set():
      server.held.set()
      server.hold.wait()
    code = server.answers.pop(0) if server.answers else 200
    server.bodies.append((body, code))
    self.send_response(code)
    self.send_header("Content-Length", "0")
    self.end_headers()

  def log_message(self, *args):
    pass


@pytest.fixture
def hook():
  server = Hook()
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield server
  server.hold.set()
  server.shutdown()
  server.server_close()


def dead_url() -> str:
  """A URL on 127.0.0.1 where no server listens: connections are refused."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}/hook"


def _wait_for(predicate, timeout=60):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.05)


def test_a_5xx_is_tried_again_a_4xx_is_not(hook):
  hook.answers = [503, 500, 200, 404]
  notifier = notify.Notifier(hook.url, run={"run": "r"}, backoff=0.01)
  notifier.send("train", step=1, metrics={"loss": 0.5})
  notifier.send("train", step=2, metrics={})
  _wait_for(lambda: len(hook.bodies) == 4)  # Before the end cuts retries.
  assert notifier.end("completed", step=2)
  assert [(b["step"], code) for b, code in hook.bodies] == [
      (1, 503), (1, 500), (1, 200), (2, 404), (2, 200)]
  first, end = hook.bodies[2][0], hook.bodies[-1][0]
  assert first["run"] == "r" and first["metrics"] == {"loss": 0.5}
  assert (end["event"], end["status"]) == ("end", "completed")
  assert (notifier.sent, notifier.lost) == (2, 1)


def test_a_server_that_is_down_is_one_warning_and_blocks_nothing(capsys):
  notifier = notify.Notifier(dead_url(), run={"run": "r"}, backoff=0.01,
                             capacity=4)
  for step in range(20):
    notifier.send("train", step=step)
  assert not notifier.end("preempted", wait=2.0, step=20)
  err = capsys.readouterr().err
  assert err.count("warning: could not notify http://127.0.0.1:") == 1, err
  assert "Connection refused" in err
  # Each event either failed its tries or was dropped: none is left.
  assert (notifier.sent, notifier.lost) == (0, 21)


def test_sending_never_waits_for_the_server_and_the_end_waits_at_most(hook):
  hook.hold.clear()
  notifier = notify.Notifier(hook.url, run={})
  for step in range(50):
    notifier.send("train", step=step)
  assert hook.held.wait(30)
  # 50 sends returned while the server held the first request.
  assert not hook.hold.is_set() and hook.bodies == []
  assert not notifier.end("completed", wait=0.5)
  hook.hold.set()


def test_a_url_that_is_not_http_is_refused_before_the_run():
  notify.check_url("")
  notify.check_url("https://hooks.example.com/x?token=1")
  with pytest.raises(UsageError, match="is not an http:// or https:// URL"):
    notify.check_url("hooks.example.com/x")
  assert notify.where("https://u:p@hooks.example.com:8443/t/SECRET?k=v") == (
      "https://hooks.example.com:8443")


def test_a_run_notifies_each_loop_evaluation_and_its_end(launch_forked, hook,
                                                         tmp_path):
  run = launch_forked("--experiment=digits_convnet", "--mode=train_and_eval",
                      f"--params_override={SMOKE}", f"--notify_url={hook.url}",
                      model_dir=tmp_path / "m")
  assert run.returncode == 0, run
  assert hook.events() == [("train", 1), ("train", 10), ("train", 20),
                           ("eval", 20), ("train", 30), ("train", 40),
                           ("eval", 40), ("end", 40)]
  bodies = [body for body, _ in hook.bodies]
  assert {(b["run"], b["experiment"], b["mode"], b["train_steps"])
          for b in bodies} == {(str(tmp_path / "m"), "digits_convnet",
                                "train_and_eval", 40)}
  assert all(b["status"] == "running" for b in bodies[:-1])
  train = [b for b in bodies if b["event"] == "train"]
  assert all("training_loss" in b["metrics"] for b in train)
  # The ETA the progress line printed: none after the first loop (a step).
  assert train[0]["eta_seconds"] is None
  assert all(b["eta_seconds"] >= 0 for b in train[1:])
  assert train[-1]["eta_seconds"] == 0
  assert "accuracy" in bodies[3]["metrics"]
  end, summary = bodies[-1], run.summary()
  assert (end["status"], end["exit_code"]) == ("completed", 0)
  assert end["eval_metrics"] == summary["eval_metrics"]
  assert end["metrics"] == summary["train_metrics"]
  # The flag is not saved with the config.
  assert hook.url not in (tmp_path / "m" / "tfm_ext_params.yaml").read_text()


def test_a_preempted_run_notifies_its_end_from_the_config(start_forked, hook,
                                                          tmp_path):
  job = start_forked(
      "--experiment=digits_convnet", "--mode=train",
      "--params_override=trainer.train_steps=400,trainer.steps_per_loop=10,"
      f"trainer.checkpoint_interval=100,runtime.notify_url={hook.url}",
      model_dir=tmp_path / "m")
  job.wait_for_line(lambda line: re.match(r"step [1-9]\d/", line))
  job.proc.send_signal(signal.SIGTERM)
  run = job.finish()
  assert run.returncode == 42, run
  saved = int(tf.train.latest_checkpoint(run.model_dir).rsplit("-", 1)[1])
  end = hook.bodies[-1][0]
  assert (end["event"], end["status"], end["exit_code"], end["step"]) == (
      "end", "preempted", 42, saved)
  assert "SIGTERM received" in end["message"]
  assert [e for e, _ in hook.events()].count("end") == 1
