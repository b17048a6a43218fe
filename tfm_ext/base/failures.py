"""The run's one error boundary: what a user did or met, told apart from bugs.

A run goes through phases, in order:

    config -> model_dir -> build -> restore -> step / evaluate / save
           -> export

The code that enters one says so (`with failures.phase("restore", path):`),
and whatever is raised inside carries the innermost phase it passed
through. The launcher runs the whole job inside `boundary()`, which turns
what comes out into one paragraph and an exit code (`classify`):

| what was raised                                  | phase           | exit |
| ------------------------------------------------ | --------------- | ---- |
| `UsageError` (a check refused the input)         | any             | 2    |
| a storage fault: no space, quota, read-only, a   | config,         | 2    |
|   permission, an unreachable bucket (at build:    |   model_dir,    |      |
|   the path the error names, a data folder...)     |   build         |      |
|   the same once the run has started              | later           | 4    |
| out of memory (`ResourceExhaustedError`)         | any             | 4    |
| a file of the model_dir of the wrong kind (a     | any but restore | 2    |
|   directory where a record belongs...)           |                 |      |
| `RunFailed` (a diverged loss, an empty dataset)  | any             | 3    |
| an input op's error (`IteratorGetNext`, a        | build, step,    | 3    |
|   parser, a decoder; or no op named)             |   evaluate      |      |
| a label outside the model's classes (the data's  | step, evaluate  | 3, naming both |
|   or the config's: the paragraph names both)     |                 |      |
| a kernel of the model, loss or metrics           | step, evaluate  | 1, with its traceback |
| a checkpoint that does not fit the model         | restore         | 2    |
| a checkpoint that vanished while read            | restore         | 4    |
| a config file that cannot be read                | config          | 2    |
| a second signal                                  | any             | 42   |
| anything else                                    | any             | 1, with its traceback |

What failed decides, not the error's type alone: TensorFlow names the op
that raised (`failing_op`) and the ops that called it, and the run is
said to have failed on its data only where one of them hands the step its
input (a decoder in a dataset's map runs under `IteratorGetNext`), or
where it names none (a `DataLossError` from a reader); a path of the model_dir in the error is
that file's fault, unless it is an input's.

How a user's fault is told from a bug: a user's fault is a check's own
refusal (`UsageError`, `RunFailed`), an error of TensorFlow's runtime (a
`tf.errors.OpError`, raised by a kernel on the data, a file or a
checkpoint; it carries TensorFlow's reason) or of the operating system on
a file (`OSError`). A bug is a Python exception raised by Python code: a
`TypeError`, an `AttributeError`, a `ValueError` while a function is
traced. Those keep their traceback on the console. Every failure's
traceback goes to the log file (`logs/` in `model_dir` once the log is
open).

`EXIT_STORAGE` (4) means that nothing the run had was lost: the write that
failed was a temporary one (a checkpoint is written beside the last one,
every record whole), so the last checkpoint is intact and the next start
clears what the failed write left; free space or restore the permission
and relaunch the same command to resume.
"""

import contextlib
import dataclasses
import errno
import fnmatch
import logging as std_logging
import re
import sys
import traceback
from typing import Callable, Iterator, Optional, Sequence

from absl import logging
import tensorflow as tf

from tfm_ext.base.errors import EXIT_DATA
from tfm_ext.base.errors import EXIT_PREEMPTED
from tfm_ext.base.errors import EXIT_STORAGE
from tfm_ext.base.errors import EXIT_USAGE
from tfm_ext.base.errors import RunFailed
from tfm_ext.base.errors import UsageError

PHASES = ("config", "model_dir", "build", "restore", "step", "evaluate",
          "save", "export")
# Errors after which a rebuilt strategy, task and trainer can go on from the
# latest checkpoint: a lost peer or an aborted collective (the store not
# answering says the same). `tfm_ext.run.driver` restarts on them; anything
# else is a bug or bad data and fails at once.
TRANSIENT = (tf.errors.UnavailableError, tf.errors.AbortedError)

# What the operating system and TensorFlow's file systems say when storage
# fails under a run (TensorFlow words it as strerror does).
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                   errno.EPERM, errno.EFBIG)
_STORAGE_WORDS = re.compile(
    r"No space left on device|Disk quota exceeded|Read-only file system|"
    r"Permission denied|File too large|Could not resolve host|"
    r"Couldn't resolve host|Error executing an HTTP request|"
    r"Couldn't connect to server|Timeout was reached|"
    r"Operation not permitted")
# The ops of a step that hand it the input pipeline's next batch: an error
# raised there was raised by the pipeline (a record, a decoder, a parser).
_INPUT_OPS = re.compile(
    r"^(\w+/)*(IteratorGetNext\w*|MultiDeviceIteratorGetNext\w*|"
    r"OptionalGetValue|\w*Dataset\w*|ParseExample\w*|ParseSingleExample|"
    r"Decode\w+)(_\d+)?$")
# Where TensorFlow names the op that failed: in a function's graph, then eagerly.
_FAILED_NODE = re.compile(r"\{\{node ([^}]+)\}\}|Detected at node '?([\w/.-]+)")
# The ops that called it, innermost first: `[[IteratorGetNext]]` under a
# failed dataset function's op.
_CALLING_NODE = re.compile(r"^\s*\[\[([\w/.-]+)\]\]", re.M)
_FAILED_EAGER_OP = re.compile(r"\[Op:(\w+)")
# A sparse loss's labels outside its classes: the data's or the config's.
_LABEL_RANGE = re.compile(
    r"label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)")
# The same, as the input's own check says it (`tfm_ext.training.labels`).
_CHECKED_LABEL = re.compile(
    r"\[label value of\] \[(-?\d+)\] \[which is outside the valid range "
    r"of \[0,\] \[(\d+)\]")
_PHASE_ATTRIBUTE = "_tfm_ext_phase"
_FAILURE_ATTRIBUTE = "_tfm_ext_failure"
# What the phases do, as the paragraph says it.
_DOING = {
    "config": "reading the config",
    "model_dir": "checking the model_dir",
    "build": "building the task, model and input pipelines",
    "restore": "restoring a checkpoint",
    "step": "training",
    "evaluate": "evaluating",
    "save": "saving",
    "export": "exporting",
}


@dataclasses.dataclass
class _Run:
  """What the boundary knows of the run, to name files in its paragraph."""
  phase: str = "config"
  subject: str = ""
  model_dir: str = ""
  params: object = None
  global_step: Optional[Callable[[], int]] = None
  log_file: str = ""
  # What the run lost meanwhile, as the error it explains (`explain_with`).
  explanations: list = dataclasses.field(default_factory=list)
  # The failure `report` printed last.
  reported: Optional["Failure"] = None


_run = _Run()


def set_run(*, model_dir: Optional[str] = None, params=None,
            global_step: Optional[Callable[[], int]] = None,
            log_file: Optional[str] = None) -> None:
  """Tells the boundary what it names: the model_dir, config, step, log."""
  for name, value in (("model_dir", model_dir), ("params", params),
                      ("global_step", global_step), ("log_file", log_file)):
    if value is not None:
      setattr(_run, name, value)


def reset() -> None:
  """Forgets the run (a new one starts in this process)."""
  global _run
  _run = _Run()


def explain_with(explain: Callable[[BaseException], Optional[BaseException]],
                 model_dir: str = "") -> Callable[[], None]:
  """`classify` asks `explain` first what an error is; returns its remover.

  For what the run lost and its errors only show: a trainer whose lease
  another took (`tfm_ext.model_dir.lease`) meets a `NotFoundError` where
  its save's temporary files were deleted; `explain` returns the error to
  classify instead (`LeaseLost`), or None. A `UsageError` or a second
  signal keeps its own words. With `model_dir`, only while the run is
  one of that model_dir (`set_run`): a process runs several (tests, a
  notebook), and a lease lost in one explains nothing of the next.
  """
  explanations = _run.explanations
  entry = (model_dir, explain)
  explanations.append(entry)

  def remove():
    if entry in explanations:
      explanations.remove(entry)
  return remove


@contextlib.contextmanager
def phase(name: str, subject: str = "") -> Iterator[None]:
  """Marks the block as phase `name` (of `PHASES`), about `subject`.

  An exception leaving the block carries the innermost phase it passed
  through, for `classify`.
  """
  if name not in PHASES:
    raise ValueError(f"Unknown phase {name!r}; one of {PHASES}.")
  before = (_run.phase, _run.subject)
  _run.phase, _run.subject = name, subject
  try:
    yield
  except BaseException as e:
    if not hasattr(e, _PHASE_ATTRIBUTE):
      try:
        setattr(e, _PHASE_ATTRIBUTE, (name, subject))
      except AttributeError:
        pass  # A builtin exception without a __dict__: the phase in force.
    raise
  finally:
    _run.phase, _run.subject = before


def phased(name: str, function: Callable, subject: str = "") -> Callable:
  """`function`, run as phase `name`: for methods Orbit calls."""
  def run(*args, **kwargs):
    with phase(name, subject):
      return function(*args, **kwargs)
  return run


def phase_of(error: BaseException):
  """The (phase, subject) `error` was raised in."""
  return getattr(error, _PHASE_ATTRIBUTE, (_run.phase, _run.subject))


@dataclasses.dataclass(frozen=True)
class Failure:
  """A classified failure: the exit code and the paragraph to print.

  `refusal`, of a usage error (exit 2): a job refused, which leaves the
  model_dir as it found it, its log included; False for one that ran
  first (`UsageError.refusal`: a lost lease, also where it explains
  another error).
  """
  code: int
  message: str
  kind: str = "error"
  refusal: bool = True

  def line(self) -> str:
    """`kind: message`, as the console shows every failure."""
    return f"{self.kind}: {self.message}"


def tf_reason(error: BaseException) -> str:
  """TensorFlow's own reason for `error`, without its graph trace.

  A `tf.function` error reads "Graph execution error:", the Python frames
  the failing op was defined at, then the kernel's reason and the node;
  the reason is what a user can act on.
  """
  text = getattr(error, "message", None) or str(error)
  lines = _without_gin_frames(text).splitlines()
  if lines and lines[0].startswith("in user code:"):
    return _staged_reason(lines)
  if lines and lines[0].startswith("Graph execution error"):
    kept = []
    for line in lines[1:]:
      if (not line.strip() or line.startswith("Detected at node")
          or line[:1].isspace() or line.startswith("{{function_node")):
        continue
      kept.append(line)
    lines = kept or lines
  reason = " ".join(line.strip() for line in lines
                    if line.strip() and not line.strip().startswith("[["))
  # The kernel's wrapper names its own function and op: not the user's.
  reason = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", reason)
  reason = re.sub(r"\s*\[Op:[^\]]*\]", "", reason).strip()
  return _clipped(reason).rstrip(".") or type(error).__name__


def _clipped(reason: str) -> str:
  # A kernel may quote a whole batch ("Label values: 99 99 ..."); the
  # paragraph ends the reason's sentence itself.
  return reason if len(reason) <= 300 else reason[:300] + "..."


# A frame of an error AutoGraph raised while tracing: `File "f", line n, in
# fn` and, for code it converted (the user's), a closing `*`.
_STAGED_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in \S+(\s+\*)?')


def _staged_reason(lines: Sequence[str]) -> str:
  """The reason of an error raised while tracing: "in user code:", the
  frames, then the original `Type: message` on the last line. The message,
  then where in converted (user) code it was raised."""
  frames = [m for m in map(_STAGED_FRAME.match, lines) if m]
  last = next((line.strip() for line in reversed(lines) if line.strip()), "")
  reason = _clipped(re.sub(r"^[\w.]+: ", "", last).rstrip("."))
  converted = [m for m in frames if m.group(3)] or frames
  if converted:
    path, line = converted[-1].group(1, 2)
    reason += f" (raised at {path}, line {line})"
  return reason or "an error while tracing"


def storage_fault(error: BaseException) -> bool:
  """Whether `error` is storage failing: space, quota, a permission, a host."""
  if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
    return True
  return (isinstance(error, (tf.errors.OpError, OSError))
          and bool(_STORAGE_WORDS.search(str(error))))


def classify(error: BaseException) -> Optional[Failure]:
  """The `Failure` that `error` is, or None for a bug (see the module).

  An error is classified once: where the run first asks (the driver, while
  the trainer lease it may have lost is held), and what asks again (the
  boundary) is given that answer.

  The rows of the module's table, in order: what explains it (a lost
  lease), what a check raised on purpose, storage and memory, the user's
  input (model_dir, config, checkpoint, deterministic mode), then an op's
  error by the op that raised it.
  """
  if hasattr(error, _FAILURE_ATTRIBUTE):
    return getattr(error, _FAILURE_ATTRIBUTE)
  failure = _classified(error)
  try:
    setattr(error, _FAILURE_ATTRIBUTE, failure)
  except AttributeError:
    pass  # A builtin exception without a __dict__: asked again, if at all.
  return failure


def _classified(error: BaseException) -> Optional[Failure]:
  if not isinstance(error, (UsageError, KeyboardInterrupt)):
    for model_dir, explain in list(_run.explanations):
      if model_dir and model_dir != _run.model_dir:
        continue
      explained = explain(error)
      if explained is not None:
        return classify(explained)
  name, subject = phase_of(error)
  return (_declared(error) or _storage_or_memory(error, name, subject)
          or _users_input(error, name, subject)
          or _op_failed(error, name, subject))


def _declared(error: BaseException) -> Optional[Failure]:
  """What a check raised on purpose, and a second signal."""
  if isinstance(error, UsageError):
    return Failure(EXIT_USAGE, _without_gin_frames(str(error)),
                   refusal=getattr(error, "refusal", True))
  if isinstance(error, KeyboardInterrupt):
    return aborted(str(error))
  if isinstance(error, RunFailed):
    return Failure(EXIT_DATA, _sentences(str(error), _last_checkpoint()))
  return None


def _storage_or_memory(error: BaseException, name: str,
                       subject: str) -> Optional[Failure]:
  """Storage that failed under the run, or memory that ran out."""
  if storage_fault(error):
    where = subject or (_run.model_dir if name != "config" else "") or (
        "a config file or input")
    if name == "build":
      # The start's setup, nothing trained yet: a read-only data folder
      # (a task writing its records' cache), a model_dir's folder. The
      # path is the error's, not the phase's model_dir.
      where = _path_named(error) or where
    if name in ("config", "model_dir", "build"):
      return Failure(EXIT_USAGE, (
          f"{where} cannot be used: {tf_reason(error)}. Check the path, its "
          "permissions and free space (for a bucket: its name, the "
          "credentials at hand and the network), then relaunch."))
    return Failure(EXIT_STORAGE, _sentences(
        f"Storage failed while {_doing(name)} (in {where}): "
        f"{tf_reason(error)}.",
        _last_checkpoint(), "Free space or restore the permission, then "
        "relaunch the same command to resume."))
  if isinstance(error, tf.errors.ResourceExhaustedError):
    return Failure(EXIT_STORAGE, _sentences(
        f"The run ran out of memory while {_doing(name)}: "
        f"{tf_reason(error)}.", _last_checkpoint(), "Lower the global batch "
        f"({_batch_field(name)}) or the model's size, or free the device's "
        "memory, then relaunch the same command to resume."))
  return None


def _users_input(error: BaseException, name: str,
                 subject: str) -> Optional[Failure]:
  """A file of the model_dir, a config file, a value or a checkpoint of the
  user's that the run cannot take, or the deterministic mode it chose."""
  record = _model_dir_file(error) if name != "restore" else ""
  if record:
    return Failure(EXIT_USAGE, _sentences(
        f"{record}, a file of --model_dir, is not what the run reads or "
        f"writes there: {tf_reason(error)}.", _last_checkpoint(),
        "Move it out of the model_dir (tfm_ext writes it again) and "
        "relaunch the same command."))
  if name == "model_dir" and isinstance(error, (OSError, tf.errors.OpError)):
    return Failure(EXIT_USAGE, (
        f"--model_dir={subject or _run.model_dir!r} cannot be used: "
        f"{tf_reason(error)}. Give a directory this job may write."))
  if name == "config" and isinstance(error, (OSError, tf.errors.OpError)):
    return Failure(EXIT_USAGE, f"{subject or 'A config file'} cannot be "
                               f"read: {tf_reason(error)}")
  if (name in ("build", "step", "evaluate") and _deterministic()
      and "determinis" in _message(error)):
    # TensorFlow's op determinism refused an op: a random op without a
    # seed (in the task's input or model), a kernel with no deterministic
    # implementation. The mode is the user's choice, not a bug.
    return Failure(EXIT_USAGE, _sentences(
        f"runtime.deterministic=true cannot run this task while "
        f"{_doing(name)}: {tf_reason(error)}.", _last_checkpoint(),
        "Set runtime.deterministic=false, or seed those ops "
        "(tf.random.stateless_*), then relaunch."))
  if name == "build" and isinstance(error, ValueError) and _raised_in_library(
      error):
    # Keras, TensorFlow or TFM refused a value the config gave them (a
    # negative number of filters): a ValueError of the user's own code is
    # still a bug.
    return Failure(EXIT_USAGE, (
        f"The task or model could not be built from the config: "
        f"{tf_reason(error)}. Check the task's fields (task.model...)."))
  if name == "restore" and isinstance(error, (ValueError, AssertionError)):
    # TensorFlow's checkpoint reader says a shape or an object does not
    # match in Python: the checkpoint is the user's, not a bug.
    return _does_not_fit(subject, error)
  return None


def _op_failed(error: BaseException, name: str,
               subject: str) -> Optional[Failure]:
  """An error TensorFlow's runtime raised: the checkpoint's, the data's, or
  (None) a kernel of the model's; anything else raised is a bug (None)."""
  if not isinstance(error, tf.errors.OpError) or isinstance(error, TRANSIENT):
    # Raised by Python code: a bug keeps its traceback. So does a peer or
    # collective lost past the in-process restarts (`driver._with_recovery`).
    return None
  if name == "restore":
    if isinstance(error, tf.errors.NotFoundError):
      return Failure(EXIT_STORAGE, _sentences(
          f"The checkpoint {subject or 'being restored'} vanished while it "
          f"was read: {tf_reason(error)}. Another job deleted it (a "
          "trainer's trainer.max_to_keep rotates its checkpoints).",
          "Relaunch the same command: it reads what is there then."))
    return _does_not_fit(subject, error)
  if name not in ("build", "step", "evaluate"):
    return None
  labels = (_LABEL_RANGE.search(str(error))
            or _CHECKED_LABEL.search(str(error)))
  if labels:
    value, bound = labels.groups()
    return Failure(EXIT_DATA, _sentences(
        f"The run failed while {_doing(name)}: a label is {value}, outside "
        f"[0, {bound}), the classes the model has "
        f"({_field_of_value(int(bound), 'num_classes')}). Either the data "
        f"holds labels it should not (input: {_input_pattern(name)}) or "
        "that field is too small for it.", _last_checkpoint(),
        "Fix the one that is wrong and relaunch to resume."))
  op = failing_op(error)
  if op and not any(_INPUT_OPS.match(each) for each in (
      op, *_CALLING_NODE.findall(_message(error)))):
    # A kernel of the model, its loss or metrics failed on a batch the
    # input gave it: not the data's fault, and its traceback says where.
    # An op of the pipeline's own functions (a decoder, a map's kernel)
    # runs under the op that gets the next batch: the data's.
    return None
  return Failure(EXIT_DATA, _sentences(
      f"The run failed on its data while {_doing(name)}: "
      f"{tf_reason(error)}.", f"Input: {_input_pattern(name)}.",
      _last_checkpoint(), "Fix or remove the bad input and relaunch to "
      "resume."))


def failing_op(error: BaseException) -> str:
  """The op TensorFlow says `error` was raised by, or ''."""
  text = _message(error)
  nodes = [a or b for a, b in _FAILED_NODE.findall(text)]
  if nodes:
    return nodes[-1]
  eager = _FAILED_EAGER_OP.search(text)
  return eager.group(1) if eager else ""


def _deterministic() -> bool:
  """Whether the run asked for `runtime.deterministic`."""
  runtime = getattr(_run.params, "runtime", None)
  return bool(getattr(runtime, "deterministic", False))


def _message(error: BaseException) -> str:
  return getattr(error, "message", None) or str(error)


def _model_dir_file(error: BaseException) -> str:
  """The path of the model_dir that `error` names, if it names one."""
  if not _run.model_dir:
    return ""
  if not isinstance(error, (OSError, tf.errors.OpError)):
    return ""
  root = _run.model_dir.rstrip("/") + "/"
  text = getattr(error, "message", None) or str(error)
  match = re.search(re.escape(root) + r"[^\s;:'\"]+", text)
  if not match:
    return ""
  if _TEMP.search(match.group(0)):
    return ""  # A write of the run's own in progress: not the user's file.
  task = getattr(_run.params, "task", None)
  patterns = [getattr(getattr(task, field, None), "input_path", "") or ""
              for field in ("train_data", "validation_data")]
  if any(fnmatch.fnmatch(match.group(0), p) for pattern in patterns
         for p in str(pattern).split(",") if p):
    return ""  # An input that lives in the model_dir: the data's.
  return match.group(0)


# A file a write in progress stages: TensorFlow's checkpoint shards
# (`<prefix>_temp/`), its local writes (`.tempstate<n>`), ours (`.tmp<hex>`).
_TEMP = re.compile(r"_temp/|\.tempstate|\.tmp")

# A path in an error's message: absolute, or a store's URL.
_PATH = re.compile(r"(?:^|[\s'\"])((?:/|[a-z][\w+.-]*://)[^\s;:'\"]+)")


def _path_named(error: BaseException) -> str:
  """The path `error` is about: an `OSError`'s file name, else the first
  path of its message; "" if it names none."""
  filename = getattr(error, "filename", None)
  if filename:
    return str(filename)
  match = _PATH.search(_message(error))
  return match.group(1) if match else ""


def _batch_field(name: str) -> str:
  field = "validation_data" if name == "evaluate" else "train_data"
  return f"task.{field}.global_batch_size"


def _field_of_value(value: int, suffix: str) -> str:
  """The config field ending in `suffix` that holds `value`, as `f=v`."""
  as_dict = getattr(_run.params, "as_dict", None)
  if as_dict is None:
    return f"*.{suffix}"

  def walk(tree, prefix):
    for key, leaf in tree.items():
      if isinstance(leaf, dict):
        yield from walk(leaf, f"{prefix}{key}.")
      elif key.endswith(suffix) and leaf == value:
        yield f"{prefix}{key}={leaf}"

  found = list(walk(as_dict(), ""))
  return found[0] if found else f"*.{suffix}"


# Where the libraries that check the values a config passes them live.
_LIBRARIES = re.compile(r"/(tf_keras|keras|tensorflow|official|orbit)/")


def _raised_in_library(error: BaseException) -> bool:
  """Whether `error` was raised in Keras, TensorFlow, TFM or Orbit."""
  tb = error.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb is not None and bool(_LIBRARIES.search(tb.tb_frame.f_code.co_filename))


def _does_not_fit(subject: str, error: BaseException) -> Failure:
  where = subject or "in " + (_run.model_dir or "--model_dir")
  return Failure(EXIT_USAGE, (
      f"The checkpoint {where} does not fit this run's model: "
      f"{tf_reason(error)}. It was written by another model or config: go "
      "back to the config that wrote it, train in a new --model_dir, or move "
      "the checkpoints out."))


def forget_failed_restore(error: BaseException) -> None:
  """Marks the restore that `error` cut short as partial on purpose.

  TensorFlow keeps a failed restore's record until the model goes, then
  logs a warning for each value it did not restore (about 20 for
  digits_convnet); at interpreter exit, with the log file closed, each is a
  "--- Logging error ---" traceback. Its `expect_partial` silences them;
  the restore that raised never returned the status that sets it, so it
  is found in the frames the error passed through.
  """
  for frame, _ in traceback.walk_tb(error.__traceback__):
    for value in frame.f_locals.values():
      if type(value).__name__ == "_CheckpointRestoreCoordinator":
        value.expect_partial = True


def report(failure: Failure, error: Optional[BaseException] = None) -> None:
  """Prints `failure` as one paragraph; logs `error` with its traceback.

  Only once the run's log file is open (`set_run(log_file=...)`): before,
  the absl log is the console, and nothing is written anywhere.
  """
  if error is not None and _run.log_file:
    # INFO: the log file's, not the console's (`log_files.log_to_files`).
    logging.info("%s (%s)", failure.message, type(error).__name__,
                 exc_info=(type(error), error, error.__traceback__))
  _run.reported = failure
  print(failure.line(), file=sys.stderr, flush=True)


def last_reported() -> Optional[Failure]:
  """The failure `report` printed last in this run (`tfm_ext.launch`'s)."""
  return _run.reported


class Ended(BaseException):
  """A job that decided how it ends: `failure`, printed and exited with by
  the boundary (a run preempted or failed, its summary written).

  As `SystemExit`, no `except Exception` on its way takes it for an error.
  """

  def __init__(self, failure: Failure):
    super().__init__(failure.message)
    self.failure = failure


@contextlib.contextmanager
def boundary() -> Iterator[None]:
  """Runs a job: a classified failure exits with its code, a bug raises.

  The one place a job ends with an exit code: what is raised is classified
  (`classify`), or says itself how it ends (`Ended`), then printed as one
  paragraph (`report`) and raised as `SystemExit`. A `SystemExit` raised
  inside (`--help`) passes through.
  """
  try:
    yield
  except SystemExit:
    raise
  except BaseException as e:  # pylint: disable=broad-except
    failure = e.failure if isinstance(e, Ended) else classify(e)
    if failure is None:
      if _run.log_file:  # Python prints it on the console too.
        logging.info("A bug (not a problem with the input): %s",
                      type(e).__name__,
                      exc_info=(type(e), e, e.__traceback__))
      raise
    # An `Ended` job wrote its own record: no traceback to keep.
    report(failure, None if isinstance(e, Ended) else e)
    forget_failed_restore(e)
    # What TensorFlow logs at interpreter exit (a restore the failure cut
    # short warns of its unrestored values) finds absl's file closed: such
    # records are dropped, not printed as "--- Logging error ---".
    logging.flush()
    std_logging.raiseExceptions = False
    exiting = SystemExit(failure.code)
    exiting.refusal = failure.refusal  # Whether the job's traces go back.
    raise exiting


def _without_gin_frames(message: str) -> str:
  """`message` less the lines gin adds where a configurable raised it."""
  return "\n".join(line for line in message.splitlines()
                   if not line.lstrip().startswith("In call to configurable"))


def _sentences(*parts: str) -> str:
  return " ".join(part for part in parts if part)


def _doing(name: str) -> str:
  step = _step()
  where = f" at step {step}" if step is not None and name in (
      "step", "evaluate", "save") else ""
  return _DOING.get(name, name) + where


def _step() -> Optional[int]:
  try:
    return _run.global_step() if _run.global_step else None
  except Exception:  # pylint: disable=broad-except
    return None  # The step lives on a device that failed: say less.


def _input_pattern(name: str) -> str:
  task = getattr(_run.params, "task", None)
  field = "validation_data" if name == "evaluate" else "train_data"
  data = getattr(task, field, None)
  pattern = getattr(data, "input_path", "") or getattr(data, "tfds_name", "")
  return f"task.{field}.input_path={pattern!r}" if data is not None else (
      "the task's input")


def reraise_interrupt(error: BaseException) -> None:
  """Raises the second signal's `KeyboardInterrupt` that `error` is made of.

  For an `except Exception` that would go on after `error` (a figure not
  drawn, a function left eager): a second signal ends the job wherever it
  finds it, and the code it interrupts may raise its own error of it (an
  extension module whose initialization it cut short raises `ImportError:
  initialization failed`). That error is the signal, not the code's fault.
  """
  seen = set()
  cause: Optional[BaseException] = error
  while cause is not None and id(cause) not in seen:
    if isinstance(cause, KeyboardInterrupt):
      raise cause
    seen.add(id(cause))
    cause = cause.__cause__ or cause.__context__


_TASK = re.compile(r"/job:\w+/replica:\d+/task:\d+")


def peer_lost(error: BaseException) -> Failure:
  """What a worker of a multi-worker job says when another was lost.

  TensorFlow aborts every collective once a peer stops sending heartbeats
  (killed, preempted without a signal, its host gone): the job cannot go
  on, and nothing is wrong with the survivors. Exit 42: as after a
  preemption, every worker is restarted and resumes from the last
  checkpoint.
  """
  name, _ = phase_of(error)
  text = str(error)
  tasks = sorted(set(_TASK.findall(text)))
  if "stopped sending heartbeats" in text:
    why = "it stopped sending heartbeats"
  else:  # "...aborted by: recvmsg:Connection reset by peer": the cause.
    why = text.split("aborted by: ", 1)[-1].splitlines()[0].split(":")[-1]
  lost = (f"Worker {' and '.join(tasks)} stopped answering ({why.strip()})"
          if tasks else f"A worker of the cluster was lost ({tf_reason(error)})")
  return Failure(EXIT_PREEMPTED, _sentences(
      f"{lost} while {_doing(name)}: a multi-worker job cannot go on "
      "without every worker.", _last_checkpoint(),
      "Restart every worker of the job to resume."))


def _last_checkpoint() -> str:
  if not _run.model_dir:
    return ""
  try:
    latest = tf.train.latest_checkpoint(_run.model_dir)
  except (tf.errors.OpError, OSError):
    latest = None
  return (f"The last checkpoint, {latest}, is intact." if latest else
          "No checkpoint had been saved yet.")


def held(signal_name: str, peer: str) -> Failure:
  """A signalled worker that a silent `peer` holds in a collective: ended
  where it waits, unsaved (`tfm_ext.run.preemption.SignalWatcher`)."""
  return Failure(EXIT_PREEMPTED, _sentences(
      f"{signal_name} received while waiting for {peer}, which does not "
      f"answer, in a collective ({_DOING.get(_run.phase, _run.phase)}): "
      "nothing saved at this step.", _last_checkpoint(),
      "Restart every worker of the job to resume."), kind="preempted")


def aborted(signal_name: str) -> Failure:
  """A job a second signal (`signal_name`, "SIGTERM") ended, unsaved."""
  return Failure(EXIT_PREEMPTED, _sentences(
      f"a second {signal_name or 'signal'}: stopped at once without "
      "saving.", _last_checkpoint(), "Relaunch the same command to resume."),
      kind="aborted")
