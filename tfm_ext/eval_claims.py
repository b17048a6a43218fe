"""Which of several evaluators on one model_dir evaluates a checkpoint.

`continuous_eval` claims a checkpoint before evaluating it, in
`model_dir/eval_claims/<checkpoint>.json`, renews the claim while it
evaluates and releases it once its ledger record is written; the others
leave a live claim alone. Every claim goes through `tf.io.gfile`, so it
holds on a bucket.

A lost claim is fenced: each claim an evaluator wins carries a token of its
own, and before it records the checkpoint the evaluator reads the claim back
and finds its owner and that token (`holds`). An evaluator that was
suspended (SIGSTOP, a paused VM) longer than `STALE_CLAIM_SECONDS` while
evaluating, whose claim another evaluator took over, then recorded and
maybe released, finds another owner, another token, or no claim at all, and
records nothing; nor does it renew a claim that is no longer its own. What
stays open is the time between that read and the write it guards
(milliseconds), as for the trainer lease (`tfm_ext.lease`): an object store
has no conditional write to close it.

The renewal period and staleness may be set by the environment
(`TFM_EXT_CLAIM_RENEW_SECONDS`, `TFM_EXT_CLAIM_STALE_SECONDS`), for tests and
for clusters whose pauses need more room.
"""

import contextlib
import os
import secrets
import socket
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, Optional

from absl import logging
import tensorflow as tf

from tfm_ext import _files
from tfm_ext import lease

CLAIMS = "eval_claims"
# A claim is written, then read back this much later: longer than any
# evaluator takes from reading a claim to writing its own (see `Claims`).
CLAIM_SETTLE_SECONDS = 1.0
# An evaluator rewrites its claim this often while it evaluates; a claim
# that has not changed for STALE_CLAIM_SECONDS is its dead evaluator's.
CLAIM_RENEW_SECONDS = float(
    os.environ.get("TFM_EXT_CLAIM_RENEW_SECONDS", "5"))
STALE_CLAIM_SECONDS = float(
    os.environ.get("TFM_EXT_CLAIM_STALE_SECONDS", "30"))
# One id per process: an evaluator rebuilt in the same process (an
# in-process restart) takes its own claims back at once.
_PROCESS_OWNER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Claims:
  """Which of several evaluators on one model_dir evaluates a checkpoint.

  An object store has no create-if-absent, so a claim is won, not taken:
  an evaluator that finds no live claim writes its own, waits
  `CLAIM_SETTLE_SECONDS`, and reads the claim back; the last writer wins.
  Two that both found none wrote within the settle time of each other, so
  each reads back the later one's, and only that one goes on. A winner
  renews its claim while it evaluates (`renewed`); a claim seen unchanged
  for `STALE_CLAIM_SECONDS` on this evaluator's clock (no two machines'
  clocks are compared) is taken over. A claim is this evaluator's while the
  file holds its owner and the token of its last win (`holds`).
  """

  def __init__(self, model_dir: str, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep,
               owner: str = _PROCESS_OWNER):
    self._dir = os.path.join(model_dir, CLAIMS)
    self._clock, self._sleep = clock, sleep
    self.owner = owner
    # Where a pid names one process, as for the trainer lease.
    self._here = {"host": socket.gethostname(), "pid_space": lease.pid_space()}
    # Checkpoint -> (another's claim as last read, when it was first seen).
    self._seen: Dict[str, Any] = {}
    # Checkpoint -> the token of this evaluator's latest claim on it.
    self._tokens: Dict[str, str] = {}

  def acquire(self, checkpoint_path: str) -> bool:
    """Whether this evaluator now holds the claim on `checkpoint_path`."""
    name = os.path.basename(checkpoint_path)
    held = self._read(name)
    if held is not None and held.get("owner") != self.owner:
      gone = self._gone_because(name, held)
      if not gone:
        return False
      logging.warning("Taking over the claim on %s of evaluator %s: %s.",
                      name, held.get("owner"), gone)
    self._tokens[name] = secrets.token_hex(8)
    self._write(name, renewals=0)
    self._sleep(CLAIM_SETTLE_SECONDS)
    return self._ours(name, self._read(name))

  def holds(self, checkpoint_path: str) -> bool:
    """Whether the claim on `checkpoint_path` is still this evaluator's.

    Reads the claim back: called before each write the claim guards.
    """
    name = os.path.basename(checkpoint_path)
    return self._ours(name, self._read(name))

  @contextlib.contextmanager
  def renewed(self, checkpoint_path: str) -> Iterator[None]:
    """Renews the claim every `CLAIM_RENEW_SECONDS` while the block runs."""
    name = os.path.basename(checkpoint_path)
    done = threading.Event()

    def renew():
      renewals = 0
      while not done.wait(CLAIM_RENEW_SECONDS):
        renewals += 1
        try:
          if not self._ours(name, self._read(name)):
            # Taken over while this one stalled (and maybe released since):
            # not ours to renew.
            return
          self._write(name, renewals=renewals)
        except tf.errors.OpError as e:
          logging.warning("Could not renew the claim on %s: %s", name,
                          str(e).splitlines()[0])

    thread = threading.Thread(target=renew, daemon=True,
                              name=f"claim {name}")
    thread.start()
    try:
      yield
    finally:
      done.set()
      thread.join()

  def release(self, checkpoint_path: str) -> None:
    """Removes this evaluator's claim (once its ledger record is written)."""
    name = os.path.basename(checkpoint_path)
    if self._ours(name, self._read(name)):
      try:
        tf.io.gfile.remove(self._path(name))
      except tf.errors.NotFoundError:
        pass
    self._tokens.pop(name, None)

  def _ours(self, name: str, held: Optional[Dict[str, Any]]) -> bool:
    """Whether `held`, the claim on `name` as read, is this one's last win."""
    return (held is not None and held.get("owner") == self.owner
            and held.get("token") == self._tokens.get(name))

  def _gone_because(self, name: str, held: Dict[str, Any]) -> str:
    """Why the evaluator of claim `held` is gone; "" when it may be alive."""
    pid = held.get("pid")
    if (all(held.get(k) == v for k, v in self._here.items())
        and isinstance(pid, int) and pid > 0 and not lease.pid_alive(pid)):
      return "its process is gone"
    key = (held.get("owner"), held.get("token"), held.get("renewals"))
    now = self._clock()
    seen = self._seen.get(name)
    if seen is None or seen[0] != key:
      self._seen[name] = (key, now)
      return ""
    if now - seen[1] > STALE_CLAIM_SECONDS:
      return f"not renewed for {now - seen[1]:.0f} s"
    return ""

  def _path(self, name: str) -> str:
    return os.path.join(self._dir, name + ".json")

  def _read(self, name: str) -> Optional[Dict[str, Any]]:
    try:
      return _files.read_object(self._path(name), {"owner": str})
    except (tf.errors.NotFoundError, ValueError):
      return None  # None, or a claim cut short: no live claim either way.

  def _write(self, name: str, renewals: int) -> None:
    _files.write_record(self._dir, name, {
        "checkpoint": name, "owner": self.owner,
        "token": self._tokens.get(name, ""), **self._here,
        "pid": os.getpid(), "renewals": renewals, "time": time.time()})
