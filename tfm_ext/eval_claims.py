"""Which of several evaluators on one model_dir evaluates a checkpoint.

`continuous_eval` claims a checkpoint before evaluating it, in
`model_dir/eval_claims/<checkpoint>.json`, renews the claim while it
evaluates and releases it once its ledger record is written; the others
leave a live claim alone. Every claim goes through `tf.io.gfile`, so it
holds on a bucket.
"""

import contextlib
import os
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
CLAIM_RENEW_SECONDS = 5.0
STALE_CLAIM_SECONDS = 30.0
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
  clocks are compared) is taken over.
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
    self._write(name, renewals=0)
    self._sleep(CLAIM_SETTLE_SECONDS)
    won = self._read(name)
    return won is not None and won.get("owner") == self.owner

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
          held = self._read(name)
          if held is not None and held.get("owner") != self.owner:
            return  # Taken over while this one stalled: not ours to renew.
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
    held = self._read(name)
    if held is not None and held.get("owner") == self.owner:
      try:
        tf.io.gfile.remove(self._path(name))
      except tf.errors.NotFoundError:
        pass

  def _gone_because(self, name: str, held: Dict[str, Any]) -> str:
    """Why the evaluator of claim `held` is gone; "" when it may be alive."""
    pid = held.get("pid")
    if (all(held.get(k) == v for k, v in self._here.items())
        and isinstance(pid, int) and pid > 0 and not lease.pid_alive(pid)):
      return "its process is gone"
    key = (held.get("owner"), held.get("renewals"))
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
        "checkpoint": name, "owner": self.owner, **self._here,
        "pid": os.getpid(), "renewals": renewals, "time": time.time()})
