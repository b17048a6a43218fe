"""Whether a `model_dir` can be used, checked before anything is written.

Every mode writes into `model_dir` (a checkpoint, a record, a summary, the
log), so before the first byte goes anywhere `check_usable` makes sure
it can:

* its path is one TensorFlow's file systems take (`files.unusable_path`:
  UTF-8, and on a local disk no name longer than the file system allows);
* its path holds no glob metacharacter (`*`, `?`, `[`): TensorFlow's
  `CheckpointManager` and the best-checkpoint exporter delete old
  checkpoints by `glob(prefix + ".*")`, so `job[1]`'s cleanup would match
  and delete `job1`'s checkpoints, and never its own;
* on a local disk: it is a directory, or can be made one (its nearest
  existing ancestor is a directory), on a file system mounted writable,
  that this user may write to;
* elsewhere (`gs://`, `s3://`...): the store answers a stat of its bucket
  and of it within `STORE_TIMEOUT_SECONDS` (with the credentials at hand);
  a missing bucket, credentials refused (401), no permission (403), a
  store that cannot be reached or does not answer: each is refused with
  what to check (tests/e2e/test_gcs.py makes each one happen).

Then every record a run writes there must be of its kind (`RECORDS`,
`check_records`): a file named `train` where the summaries go, a directory
named `metrics.csv`, a file named `export`. `check_usable` checks the rows
whose names are fixed, before the first byte; the driver checks the rows a
config names (`trainer.validation_summary_subdir`,
`trainer.best_checkpoint_export_subdir`) once the config is known, still
before anything is written.

Each problem is a `UsageError` of one paragraph (exit 2). A path that
passed is not checked again in this process.
"""

import dataclasses
import fnmatch
import os
import re
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files

GLOB_CHARACTERS = "*?["
# A stat of a bucket takes well under a second where the store answers;
# TensorFlow's own retries of an unreachable host take minutes (10 tries,
# 1 s to 32 s apart). 20 s lets TensorFlow retry a passing fault 4 times,
# and leaves a user's 60 s budget room for the launcher's own start.
STORE_TIMEOUT_SECONDS = 20.0
# A wait longer than this says what it waits for.
SAY_SECONDS = 10.0
# How often a store wait looks for a stop signal (`files.heard`).
HEAR_SECONDS = 0.1

# Less free space than this on a local model_dir's disk cannot hold a
# checkpoint of any model: refused before the first write.
MIN_FREE_BYTES = 1 << 20
# Stores whose first path element is a bucket that must exist.
BUCKETS = ("gs", "s3")

_checked = set()

FILE = "a file"
DIRECTORY = "a directory"


@dataclasses.dataclass(frozen=True)
class Record:
  """A name a run writes in model_dir, the kind it must be, and what it is.

  `name` is relative to model_dir, `/` between folders; its last part may
  be a glob (`export/[0-9]*`). A `{field}` in it is a config field's value
  (`{trainer.validation_summary_subdir}`), `{mode}` the mode's name; a row
  whose field is empty or unknown names nothing.
  """
  name: str
  kind: str
  what: str


# Every record tfm_ext writes in a model_dir (docs/model-dir.md lists them):
# a new record is one row. Temporary names (`*.tmp*`, `ckpt-*_temp`, an
# export's hidden copy) are not records: their writers clear them.
RECORDS = (
    Record("checkpoint", FILE, "the checkpoint state file"),
    Record("ckpt-*.index", FILE, "a checkpoint's index"),
    Record("ckpt-*.data-*", FILE, "a checkpoint's data"),
    Record("params.yaml", FILE, "the run's config"),
    Record("tfm_ext_params.yaml", FILE, "the fields tfm_ext adds to it"),
    Record("operative_config.{mode}.gin", FILE, "gin's operative config"),
    Record("train", DIRECTORY, "TensorBoard's training summaries"),
    Record("{trainer.validation_summary_subdir}", DIRECTORY,
           "TensorBoard's validation summaries"),
    Record("metrics.csv", FILE, "the curves' table"),
    Record("curves.png", FILE, "the curves' figure"),
    Record("plateau.json", FILE, "early stopping's and the plateau's record"),
    Record("run_summary.json", FILE, "the training run's summary"),
    Record("eval_summary.json", FILE, "the evaluation's summary"),
    Record("export_summary.json", FILE, "the export's summary"),
    Record("training_starts", DIRECTORY, "the record of training starts"),
    Record("training_starts/*.json", FILE, "a training start's record"),
    Record("training_complete.json", FILE, "the end-of-training marker"),
    Record("trainer_lease.json", FILE, "the trainer lease"),
    Record("trainer_lease_claims", DIRECTORY, "claims of the trainer lease"),
    Record("trainer_lease_claims/*.json", FILE, "a claim of the lease"),
    Record("eval_ledger", DIRECTORY, "the evaluators' ledger"),
    Record("eval_ledger/*.json", FILE, "an entry of the ledger"),
    Record("eval_claims", DIRECTORY, "the evaluators' claims"),
    Record("eval_claims/*.json", FILE, "an evaluator's claim"),
    Record("eval_claim_bids", DIRECTORY, "the evaluators' bids"),
    Record("eval_claim_bids/*.json", FILE, "an evaluator's bid"),
    Record("evaluators", DIRECTORY, "the evaluators' presences"),
    Record("evaluators/*.json", FILE, "an evaluator's presence"),
    Record("logs", DIRECTORY, "the jobs' log files"),
    Record("logs/tfm_ext*", FILE, "a job's log"),
    Record("export", DIRECTORY, "the exported SavedModels"),
    Record("export/[0-9]*", DIRECTORY, "an exported SavedModel"),
    Record("{trainer.best_checkpoint_export_subdir}", DIRECTORY,
           "the best checkpoints"),
    Record("{trainer.best_checkpoint_export_subdir}/best_checkpoints.json",
           FILE, "the best checkpoints' manifest"),
    Record("{trainer.best_checkpoint_export_subdir}/info.json", FILE,
           "TFM's record of the best checkpoint"),
    Record("{trainer.best_checkpoint_export_subdir}/checkpoint", FILE,
           "the best checkpoints' state file"),
    Record("{trainer.best_checkpoint_export_subdir}/best_ckpt-*", FILE,
           "a best checkpoint's file"),
    Record("{trainer.best_checkpoint_export_subdir}/export_bids", DIRECTORY,
           "the bids to write a best checkpoint"),
    Record("{trainer.best_checkpoint_export_subdir}/unranked", DIRECTORY,
           "the best checkpoints out of the ranking"),
)
_FIELD = re.compile(r"\{([\w.]+)\}")
# Names of writes in flight: TensorFlow's `_temp` folders and `.tmp<hex>`
# files, ours, an export's hidden copy (`.40.partial.<token>`).
_TEMPORARY = re.compile(r"_temp|\.tmp|^\.")


def check_usable(model_dir: str, *,
                 store_timeout: float = STORE_TIMEOUT_SECONDS) -> None:
  """Raises `UsageError` if `model_dir` cannot be written; writes nothing."""
  if model_dir in _checked:
    return
  if not model_dir:
    raise UsageError("--model_dir is empty: give the directory to write to.")
  found = sorted(set(GLOB_CHARACTERS) & set(model_dir))
  if found:
    raise UsageError(
        f"--model_dir={model_dir!r} holds {' and '.join(map(repr, found))}: "
        "TensorFlow deletes old checkpoints by a glob of their path, which "
        "would match other directories' checkpoints (for 'job[1]': job1's) "
        "and never this one's. Use a path without *, ? and [.")
  unusable = files.unusable_path(model_dir)
  if unusable:
    shown = model_dir.encode("utf-8", "surrogateescape").decode(
        "utf-8", "backslashreplace")
    raise UsageError(f"--model_dir='{shown}' cannot be used: {unusable}. "
                     "Give another path.")
  local = files.local_path(model_dir)
  if local is not None:
    _check_local(model_dir, local)
  else:
    _check_store(model_dir, store_timeout)
  check_records(model_dir)
  _checked.add(model_dir)


def check_records(model_dir: str, params=None, mode: str = "") -> None:
  """Raises `UsageError` naming each record of `RECORDS` of the wrong kind.

  Without `params` (and `mode`), only the rows that name no config field;
  with them, every row. Reads listings only: a folder that does not exist
  yet holds nothing of the wrong kind.
  """
  wrong = []
  listings = {}  # One listing a folder: a request each on a bucket.
  for record in RECORDS:
    name = _resolved(record.name, params, mode)
    if name is None:
      continue
    for path, kind in _present(model_dir, name, listings):
      if kind != record.kind:
        wrong.append(f"{path} is {kind}, where the run writes {record.kind} "
                     f"({record.what})")
  if wrong:
    raise UsageError(
        f"--model_dir={model_dir!r} holds what its records cannot be: "
        f"{'; '.join(wrong)}. Nothing was written. Move it out of the "
        "model_dir (tfm_ext writes it again), then relaunch.")


def _resolved(name: str, params, mode: str) -> Optional[str]:
  """`name` with its `{field}`s filled in; None where one cannot be."""
  fields = set(_FIELD.findall(name))
  if ("mode" in fields and not mode) or (params is None and fields - {"mode"}):
    return None

  def value(match):
    if match.group(1) == "mode":
      return mode
    found = params
    for part in match.group(1).split("."):
      found = getattr(found, part, None)
    return found if isinstance(found, str) else ""

  resolved = _FIELD.sub(value, name)
  return None if "" in resolved.split("/") else resolved


def _present(model_dir: str, name: str,
             listings: Dict[str, List[str]]) -> List[Tuple[str, str]]:
  """`(path, kind)` of what matches `name` (its last part a glob) there;
  `listings` keeps each folder's listing for the next row."""
  folder, _, pattern = name.rpartition("/")
  parent = os.path.join(model_dir, folder) if folder else model_dir
  if parent not in listings:
    try:
      listings[parent] = tf.io.gfile.listdir(parent)
    except tf.errors.OpError:
      listings[parent] = []  # Not there, or not a folder: its row says so.
  entries = listings[parent]
  found = []
  for entry in entries:
    if _TEMPORARY.search(entry):
      continue  # Its writer clears it (a save or an export cut short).
    if fnmatch.fnmatchcase(entry.rstrip("/"), pattern):
      path = os.path.join(parent, entry.rstrip("/"))
      found.append((path, _kind(path, entry)))
  return found


def _kind(path: str, entry: str) -> str:
  """FILE or DIRECTORY, from the listing where it says: a bucket lists a
  folder as `name/` (TensorFlow's GCS client, measured in tests/gcs_box.py)
  and an object without the `/`, so that a folder of many records costs
  no request more; a disk is asked, and any other store."""
  if entry.endswith("/"):
    return DIRECTORY
  local = files.local_path(path)
  if local is not None:
    return DIRECTORY if os.path.isdir(local) else FILE
  if path.partition("://")[0] in BUCKETS:
    return FILE
  return DIRECTORY if tf.io.gfile.isdir(path) else FILE


def _check_local(model_dir: str, path: str) -> None:
  path = os.path.abspath(path)
  existing = path
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  what = ("--model_dir" if existing == path
          else f"--model_dir={model_dir!r}: its parent")
  if not os.path.isdir(existing):
    kind = "a file" if os.path.exists(existing) else "a dangling link"
    raise UsageError(
        f"{what} {existing!r} is {kind}, not a directory. Give a directory "
        "(it is made if missing).")
  try:
    stat = os.statvfs(existing)
  except OSError:
    stat = None
  if stat is not None and stat.f_flag & os.ST_RDONLY:
    raise UsageError(
        f"{what} {existing!r} is on a read-only file system. Give a "
        "directory where this job may write.")
  free = stat.f_bavail * stat.f_frsize if stat is not None else None
  if free is not None and free < MIN_FREE_BYTES:
    raise UsageError(
        f"{what} {existing!r} is on a file system with {free} bytes free: "
        "too little for a checkpoint. Free space, or give a directory on "
        "another disk.")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(
        f"{what} {existing!r} is not writable by this user (uid "
        f"{os.getuid()}). Give a directory where this job may write, or "
        "change its permissions.")


def _check_store(model_dir: str, timeout: float) -> None:
  """Stats `model_dir` in a thread; refuses an error or no answer in time.

  The bucket first, with `stat`: TensorFlow's `isdir` and `exists` answer
  False for any error (a 401 reads as a missing bucket), and its `makedirs`
  in a missing bucket asks again without end. A thread that did not answer
  in time is a daemon, left blocked in TensorFlow's client: the job exits
  at once with its error, so it makes no request after that.
  """
  result = {}
  scheme, _, rest = model_dir.partition("://")
  bucket = f"{scheme}://{rest.split('/')[0]}" if scheme in BUCKETS else ""

  def stat():
    try:
      if bucket:
        tf.io.gfile.stat(bucket)
      result["exists"] = tf.io.gfile.exists(model_dir)
      if result["exists"]:
        result["isdir"] = tf.io.gfile.isdir(model_dir)
    except Exception as e:  # pylint: disable=broad-except
      result["error"] = e

  where = f"--model_dir={model_dir!r}"
  within(stat, where, bucket or "the store", timeout)
  error: Optional[BaseException] = result.get("error")
  if error is not None:
    raise UsageError(f"{where}: " + _store_refusal(error, bucket))
  if result.get("exists") and not result.get("isdir"):
    raise UsageError(f"{where} is an object, not a directory. Give a "
                     "directory.")


def within(call: Callable[[], Any], where: str, store: str,
           timeout: float = STORE_TIMEOUT_SECONDS) -> Any:
  """`call()`'s value, if a store answers it within `timeout` seconds.

  In a daemon thread: TensorFlow's client retries an unreachable or silent
  store for minutes. From `SAY_SECONDS` on, the wait is said; past
  `timeout`, the thread is left blocked and the job refused (it exits at
  once, so it makes no request after that). What `call` raises is raised.
  A stop signal ends the wait within `HEAR_SECONDS` (`_join`): the run's
  look raises (`files.listening`), and the thread is left as at `timeout`.

  Raises:
    UsageError: no answer in time, naming `where` (the flag or field) and
      `store`.
  """
  result = {}

  def run():
    try:
      result["value"] = call()
    except BaseException as e:  # pylint: disable=broad-except
      result["error"] = e

  thread = threading.Thread(target=run, daemon=True,
                            name="tfm_ext_store_within")
  thread.start()
  _join(thread, min(timeout, SAY_SECONDS))
  if thread.is_alive():  # Said, as every wait of the start is.
    print(f"waiting for {store} to answer ({SAY_SECONDS:.0f}s; at most "
          f"{timeout:.0f}s)", file=sys.stderr, flush=True)
    _join(thread, max(timeout - SAY_SECONDS, 0))
  if thread.is_alive():
    raise UsageError(
        f"{where}: {store} could not be reached within {timeout:.0f}s (no "
        "connection, or no answer: TensorFlow retries for minutes). Check "
        "the network: that this host reaches the store (www.googleapis.com "
        "for gs://), through a proxy if it needs one (HTTPS_PROXY), and "
        "that a firewall lets it through.")
  if "error" in result:
    raise result["error"]
  return result.get("value")


def _join(thread: threading.Thread, seconds: float) -> None:
  """Waits `seconds` for `thread`, hearing a stop signal (`files.heard`)
  every `HEAR_SECONDS`: a run that listens ends the wait at once
  (`files.listening`). Before the run's signal watcher, a signal ends the
  process from its handler, which Python runs inside the join."""
  end = time.monotonic() + seconds
  while thread.is_alive() and time.monotonic() < end:
    thread.join(min(HEAR_SECONDS, max(end - time.monotonic(), 0.0)))
    files.heard()


def store_of(path: str) -> str:
  """The bucket (`gs://b`) or store (`s3://b`, `ram://`) that `path` is in."""
  scheme, _, rest = path.partition("://")
  return f"{scheme}://{rest.split('/')[0]}" if scheme in BUCKETS else (
      f"{scheme}://")


def _store_refusal(error: BaseException, bucket: str) -> str:
  """What the store's `error` means for a user, and what to check."""
  text = str(error).strip()
  http = re.search(r"HTTP response code (\d+)", text)
  # GCS's own words, from the JSON body TensorFlow quotes.
  said = re.search(r'"message": "((?:[^"\\]|\\.)*)"', text)
  reason = (said.group(1) if said else (
      text.splitlines()[0] if text else type(error).__name__)).rstrip(".")
  code = int(http.group(1)) if http else None
  if isinstance(error, tf.errors.NotFoundError) and bucket:
    return (f"the bucket {bucket} does not exist. Check the bucket's name "
            "(gsutil ls, or the cloud console), or create it.")
  if code == 401 or isinstance(error, tf.errors.UnauthenticatedError):
    return (f"{bucket or 'the store'} refused these credentials ({reason}). "
            "Check the credentials at hand: the key file "
            "GOOGLE_APPLICATION_CREDENTIALS names, `gcloud auth "
            "application-default login`, or the VM's service account.")
  if code == 403 or isinstance(error, tf.errors.PermissionDeniedError):
    return (f"these credentials have no permission on {bucket or 'it'} "
            f"({reason}). Check the bucket's name, and that the account "
            "has a role to read and write objects in it (e.g. Storage "
            "Object Admin).")
  return (f"{bucket or 'the store'} cannot be used: {reason}. Check the "
          "bucket's name, the credentials at hand "
          "(GOOGLE_APPLICATION_CREDENTIALS, gcloud auth) and the network.")
