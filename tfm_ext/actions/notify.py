"""Notifications: a run's progress POSTed as JSON to a URL the user gives.

    tfm-ext-train ... --notify_url=https://hooks.example.com/run-progress
    # or in the config: runtime.notify_url: https://...

Each event is one POST of a JSON object (`Content-Type: application/json`):

    {"event": "train" | "eval" | "end",
     "status": "running" | "completed" | "preempted" | "failed",
     "run": model_dir, "experiment": ..., "mode": ...,
     "step": 20, "train_steps": 40,
     "metrics": {"training_loss": 0.41, ...},   # that loop's or evaluation's
     "eta_seconds": 12.0 or null,                # training's, from the
                                                 #   progress line
     "time": 1764660000.0,
     # "end" only:
     "eval_metrics": {...}, "message": "...", "exit_code": 0}

after each training loop (`train`), each evaluation (`eval`) and once when
the run ends (`end`: completed, preempted or failed, with the exit code;
also a run that ends without a run summary: a bug, exit 1, or a failure
while building). Only the chief of a multi-worker job sends.

Sending never blocks or fails the run: events go to a bounded queue that a
background thread POSTs, each with a timeout (`Notifier.timeout`) and at
most `attempts` tries (a refused or timed-out connection, a 5xx or 429
answer is tried again after `backoff` seconds, doubling); a full queue
drops its oldest event. The first event that could not be delivered is one
`warning:` line on the console, every other one a line in the log. At the
end of the run the events still queued are sent in order, one try each
(once one fails, the others are dropped), then the `end` event with its
tries, all within `END_WAIT_SECONDS`: a dead server delays a preempted
job's exit by no more than that.

The flag wins over the config. The config is saved in `params.yaml` with
the run, the flag is not: give a URL that holds a token by the flag.
Warnings name only the URL's scheme and host.
"""

import collections
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Deque, Dict, Mapping, Optional

from absl import logging

from tfm_ext.base import console
from tfm_ext.base.errors import UsageError
from tfm_ext.base import failures
from tfm_ext.base.errors import EXIT_PREEMPTED
from tfm_ext.base import logs

# How long the end of a run waits for its `end` event to be delivered.
END_WAIT_SECONDS = 5.0
# HTTP answers after which a POST is tried again.
_RETRY_STATUSES = (429, 500, 502, 503, 504)


def url_of(request) -> str:
  """The URL a `driver.RunRequest` notifies: its flag, else its config."""
  return request.notify_url or getattr(request.params.runtime, "notify_url",
                                       "") or ""


def check_url(url: str) -> None:
  """Raises `UsageError` unless `url` is empty or an http(s) URL."""
  parts = urllib.parse.urlsplit(url)
  if url and (parts.scheme not in ("http", "https") or not parts.hostname):
    raise UsageError(f"--notify_url / runtime.notify_url={url!r} is not an "
                     "http:// or https:// URL: give the URL to POST the "
                     "run's progress to, or none.")


def where(url: str) -> str:
  """`url`'s scheme and host, what a message may show of it."""
  parts = urllib.parse.urlsplit(url)
  return f"{parts.scheme}://{parts.hostname or ''}" + (
      f":{parts.port}" if parts.port else "")


class Notifier:
  """POSTs events to `url` from a background thread; see the module.

  Args:
    url: an http(s) URL.
    run: fields every event carries (run, experiment, mode, train_steps).
    timeout: seconds a POST may take.
    attempts: tries of one event, at most.
    backoff: seconds before the second try; doubled before each next one.
    capacity: events queued at most; a full queue drops its oldest.
  """

  def __init__(self, url: str, *, run: Mapping[str, Any],
               timeout: float = 5.0, attempts: int = 3, backoff: float = 1.0,
               capacity: int = 32, clock: Callable[[], float] = time.time):
    check_url(url)
    self.url = url
    self.timeout = timeout
    self._run = dict(run)
    self._attempts = max(1, attempts)
    self._backoff = backoff
    self._clock = clock
    self._queue: Deque[Dict[str, Any]] = collections.deque(maxlen=capacity)
    self._wake = threading.Condition()
    self._closing = False
    self._deadline = float("inf")
    self._warned = False
    self._ended = False  # Whether the `end` event was delivered.
    # Events delivered, and events not (failed after their tries, dropped
    # from a full queue or at the end).
    self.sent = 0
    self.lost = 0
    self._thread = threading.Thread(target=self._work, daemon=True,
                                    name="tfm_ext.actions.notify")
    self._thread.start()

  def send(self, event: str, status: str = "running",
           **fields: Any) -> None:
    """Queues one event; returns at once."""
    body = dict(self._run, event=event, status=status, time=self._clock(),
                **fields)
    with self._wake:
      if not self._closing:
        self._put(body)

  def end(self, status: str, wait: float = END_WAIT_SECONDS,
          **fields: Any) -> bool:
    """Sends the `end` event, waiting at most `wait` s; whether it arrived.

    Events still queued go first, one try each; no event is sent after
    this one.
    """
    body = dict(self._run, event="end", status=status, time=self._clock(),
                **fields)
    with self._wake:
      if self._closing:
        return False
      self._put(body)
      self._closing = True
      self._deadline = time.monotonic() + wait
    self._thread.join(wait)
    return self._ended

  def _put(self, body: Dict[str, Any]) -> None:
    """Queues `body` (the lock held); a full queue drops its oldest."""
    if len(self._queue) == self._queue.maxlen:
      self.lost += 1
    self._queue.append(body)
    self._wake.notify()

  def _work(self) -> None:
    while True:
      with self._wake:
        while not self._queue and not self._closing:
          self._wake.wait()
        if not self._queue:
          return
        body = self._queue.popleft()
        # At the end, the `end` event matters most: the others get one try.
        once = self._closing and body["event"] != "end"
      ok = self._deliver(body, attempts=1 if once else self._attempts)
      with self._wake:
        self._ended = ok and body["event"] == "end"
        if ok:
          self.sent += 1
        else:
          self.lost += 1
          if once:  # The server is not answering: straight to the end.
            self.lost += len(self._queue) - 1
            while len(self._queue) > 1:
              self._queue.popleft()
        if self._closing and not self._queue:
          return

  def _deliver(self, body: Dict[str, Any], attempts: int) -> bool:
    """POSTs `body`, tried up to `attempts` times; whether it arrived."""
    data = json.dumps(body).encode()
    delay = self._backoff
    problem, attempt = "no time left at the end of the run", 0
    for attempt in range(1, attempts + 1):
      timeout = min(self.timeout, self._deadline - time.monotonic())
      if timeout <= 0:
        break
      request = urllib.request.Request(
          self.url, data=data, method="POST",
          headers={"Content-Type": "application/json"})
      try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
          answer.read()
        return True
      except urllib.error.HTTPError as e:
        problem, again = f"HTTP {e.code} {e.reason}", e.code in (
            _RETRY_STATUSES)
      except (urllib.error.URLError, OSError, ValueError) as e:
        # Refused, unreachable, timed out, reset: the server may come back.
        problem, again = str(getattr(e, "reason", None) or e), True
      if not again or attempt == attempts:
        break
      if (time.monotonic() + delay >= self._deadline or
          (self._closing and body["event"] != "end")):
        break  # The end is near: its event goes next.
      time.sleep(delay)
      delay *= 2
    self._report(body, f"{problem} (after {attempt} "
                       f"{'try' if attempt == 1 else 'tries'})")
    return False

  def _report(self, body: Dict[str, Any], problem: str) -> None:
    message = (f"could not notify {where(self.url)} of the {body['event']} "
               f"event at step {body.get('step')}: {problem}")
    logging.info("%s", message)  # The log file's.
    if not self._warned:
      self._warned = True
      print(f"warning: {message}. The run goes on; later failures to "
            "notify are in the log file only.", file=sys.stderr, flush=True)


class Progress:
  """The Orbit actions that notify after each training loop and evaluation.

  Built with the run's progress lines (`console.TrainProgress`,
  `console.EvalProgress`), and run after them: an event carries what the
  line printed, the loop's metrics and the ETA.
  """

  def __init__(self, notifier: Notifier, *, global_step: Callable[[], int],
               progress: Optional[console.TrainProgress] = None):
    self._notifier = notifier
    self._global_step = global_step
    self._progress = progress

  def _eta(self) -> Optional[float]:
    return getattr(self._progress, "eta_seconds", None)

  def train(self, output) -> None:
    """After a training loop: its metrics and the ETA."""
    self._notifier.send("train", step=self._global_step(),
                        metrics=logs.scalars(output or {}),
                        eta_seconds=self._eta())

  def eval(self, output) -> None:
    """After an evaluation: its metrics."""
    self._notifier.send("eval", step=self._global_step(),
                        metrics=logs.scalars(output or {}),
                        eta_seconds=self._eta())


def for_request(request, chief: bool) -> Optional[Notifier]:
  """The `Notifier` of a `driver.RunRequest`, or None: no URL, not the chief.

  The URL was checked (`check`) when the request was prepared.
  """
  url = url_of(request)
  if not url or not chief:
    return None
  return Notifier(url, run={
      "run": request.model_dir, "experiment": request.experiment,
      "mode": request.mode,
      "train_steps": request.params.trainer.train_steps})


def run_ended(notifier: Optional[Notifier], summary=None,
              error: Optional[BaseException] = None) -> None:
  """Sends the `end` event of a run, from its `RunSummary` or what ended it.

  Without a summary, `error` is what is ending the process: a `SystemExit`
  (its code: 42 preempted, others failed) or a bug (failed, exit 1).
  """
  if notifier is None:
    return
  if summary is not None:
    exit_code = {"completed": 0, "preempted": EXIT_PREEMPTED}.get(
        summary.status, summary.exit_code or failures.EXIT_DATA)
    notifier.end(summary.status, step=summary.global_step,
                 metrics=summary.train_metrics,
                 eval_metrics=summary.eval_metrics, message=summary.message,
                 exit_code=exit_code,
                 eta_seconds=0.0 if summary.status == "completed" else None)
    return
  code = error.code if isinstance(error, SystemExit) else 1
  code = code if isinstance(code, int) else 1
  notifier.end("preempted" if code == EXIT_PREEMPTED else "failed",
               message=("" if isinstance(error, SystemExit) else
                        f"{type(error).__name__}: {error}"[:500]),
               exit_code=code, step=None, metrics={}, eval_metrics={},
               eta_seconds=None)
