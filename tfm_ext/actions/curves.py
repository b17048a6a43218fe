"""Results at a glance: `metrics.csv` and `curves.png` in `model_dir`.

Both are drawn from the run's TensorBoard event files (`train/` and the
validation subdir) and rewritten whole through `tf.io.gfile`, so they work
in a bucket and a reader never sees half a file. `metrics.csv` has one row
per logged step: `step`, the training scalars under their own names
(`training_loss`, `accuracy`, `learning_rate`...), then the validation
scalars prefixed `validation_` (`validation_loss` stays as it is,
`accuracy` becomes `validation_accuracy`); a cell is empty where that
scalar was not logged at that step. `curves.png` has one figure: every
scalar against the step, training solid, validation dashed with markers,
losses first, then the metrics (`trainer.best_checkpoint_eval_metric`
first), then the learning rate; scalars of different scales on their own
axes, and a log scale where the values span orders of magnitude
(`panels`).

Who refreshes them (`RefreshResults`, built by `refresh_actions` for the
chief only):

    after a training loop    at most every TRAIN_REFRESH_SECONDS (2 min)
    after an evaluation      at most every EVAL_REFRESH_SECONDS (30 s),
                             a trainer's or an evaluator's
    when a mode ends         always (`tfm_ext.run.driver.drive`)

A refresh rereads the event files and draws the whole figure, a few tenths
of a second of host time on a CPU (matplotlib's ticks and text, mostly),
so a short run (digits_convnet's evaluations come a second apart) is drawn
once, when it ends; an hour's run, at each evaluation.

A trainer and an evaluator beside it both rewrite the files from the same
event files, so whichever writes last holds everything flushed by then.
This module imports matplotlib and TensorBoard's event reader in its first
refresh, not on start-up (Keras 3, which TensorFlow loads, imports
matplotlib itself where it is installed).
"""

import collections
import io
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from tfm_ext import actions
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import files
from tfm_ext.base import failures
from tfm_ext.base import logs

METRICS_CSV = "metrics.csv"
CURVES_PNG = "curves.png"
TRAIN_SUBDIR = "train"
VALIDATION_PREFIX = "validation_"
TRAINING_PREFIX = "training_"
TRAIN_REFRESH_SECONDS = 120.0
EVAL_REFRESH_SECONDS = 30.0
# Scalars kept in the CSV but not drawn.
_NOT_DRAWN = ("steps_per_second",)
# How `panels` lays the scalars out.
SPAN_SHARE = 0.25
LOG_SPAN = 100.0
MAX_PANELS = 9
_MAX_PER_PANEL = 4
_PANELS_PER_ROW = 3

Rows = Dict[int, Dict[str, float]]


def subdirs(validation_subdir: str = "validation") -> Dict[str, str]:
  """Column prefix -> summary subdir: training's names as they are."""
  return {"": TRAIN_SUBDIR, VALIDATION_PREFIX: validation_subdir}


def column(prefix: str, tag: str) -> str:
  """The CSV column of `tag` from the subdir of `prefix`."""
  return tag if tag.startswith(prefix) else prefix + tag


def read_scalars(model_dir: str, dirs: Mapping[str, str]) -> Rows:
  """Every scalar in the event files under `model_dir/<subdir>`, by step.

  `dirs` maps a column prefix to a subdir (`subdirs`); a nested directory's
  tags are `<relative dir>/<tag>`. Where training's steps go back (a run
  resumed from a checkpoint older than its last logged step, after a kill
  or a divergence), the rows after the step it went back to are dropped, as
  TensorBoard does; evaluations have no such order (an evaluator beside the
  trainer may evaluate old checkpoints last), so a later file's value of a
  step just replaces an earlier one. A record cut short at the end of a
  file being written ends that file.
  """
  rows: Rows = collections.defaultdict(dict)
  read = set()
  for prefix, subdir in dirs.items():
    top = os.path.join(model_dir, subdir)
    if top in read or not tf.io.gfile.isdir(top):
      continue
    read.add(top)
    for directory, _, names in tf.io.gfile.walk(top):
      relative = directory[len(top):].strip("/")
      tag_prefix = relative + "/" if relative else ""
      written = set()  # This directory's columns.
      last = -1
      for name in sorted((f for f in names if ".tfevents." in f),
                         key=_creation_order):
        for step, tag, value in _scalar_events(os.path.join(directory, name)):
          if step < last and subdir == TRAIN_SUBDIR:
            _drop_after(rows, step, written)
          last = step
          col = column(prefix, tag_prefix + tag)
          written.add(col)
          rows[step][col] = value
  return {step: values for step, values in sorted(rows.items()) if values}


def _creation_order(name: str) -> list:
  """A sort key: event files by the time, then TF's counter, in their name.

  `events.out.tfevents.<seconds>.<host>.<pid>.<counter>.v2`: numbers compare
  as numbers, so writer 10 of a second comes after writer 9.
  """
  return [(0, int(part), "") if part.isdigit() else (1, 0, part)
          for part in name.split(".")]


def _scalar_events(path: str) -> Iterator[Tuple[int, str, float]]:
  """`(step, tag, value)` of each real scalar in the event file `path`.

  Read by TensorBoard's own loader, which ends a file at a record cut
  short (one being written) and reads any file system TensorFlow has.
  """
  # Imported here, not on start-up: it loads TensorBoard's TF stub.
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top
  for event in event_file_loader.LegacyEventFileLoader(path).Load():
    for value in event.summary.value:
      if value.HasField("tensor"):
        array = tf.make_ndarray(value.tensor)
        if array.size != 1 or not np.issubdtype(array.dtype, np.number):
          continue  # An image, a histogram, text.
        number = float(array.reshape(()))
      elif value.HasField("simple_value"):
        number = value.simple_value
      else:
        continue
      yield event.step, value.tag, number


def logged_at(directory: str, step: int) -> bool:
  """Whether an event file under `directory` holds a scalar of `step`.

  An evaluation run again at a step already logged (a run resumed from a
  checkpoint saved before that step's evaluation, which had run) writes
  nothing there again: an event file only grows, and TensorBoard would
  draw the point twice (`tfm_ext.run.assembly`).
  """
  if not tf.io.gfile.isdir(directory):
    return False
  for folder, _, names in tf.io.gfile.walk(directory):
    for name in names:
      if ".tfevents." in name and any(
          logged == step for logged, _, _ in _scalar_events(
              os.path.join(folder, name))):
        return True
  return False


def _drop_after(rows: Rows, step: int, columns) -> None:
  for later in [s for s in rows if s > step]:
    for name in columns:
      rows[later].pop(name, None)


def metrics_csv(rows: Rows) -> str:
  """`rows` as CSV text: `step`, training columns, validation columns."""
  names = sorted({name for values in rows.values() for name in values},
                 key=lambda name: (name.startswith(VALIDATION_PREFIX), name))
  lines = [",".join(["step"] + [_csv_cell(n) for n in names])]
  for step, values in sorted(rows.items()):
    lines.append(",".join([str(step)] + [
        str(np.float32(values[n])) if n in values else "" for n in names]))
  return "\n".join(lines) + "\n"


def _csv_cell(text: str) -> str:
  return f'"{text}"' if any(c in text for c in ',"\n') else text


def panels(rows: Rows, main_metrics: Optional[List[str]] = None
           ) -> List[Tuple[str, List[str], bool]]:
  """What `draw_curves` draws: `(title, scalars, log scale)` per panel.

  Every scalar is drawn (by its name without `validation_`/`training_`;
  not the speeds, nor the exporter's `best_<metric>` beside its metric):
  losses, then `main_metrics`, the other metrics, then the learning rates.
  Scalars of one kind share a panel only where each would fill a good part
  of it (`_readable_together`: accuracy and an error rate of 0.05 do not;
  two losses that fall alike do), at most `_MAX_PER_PANEL` to a panel and
  `MAX_PANELS` panels. A panel of positive values spanning more
  than `LOG_SPAN` is drawn on a log scale (a warm-up's learning rate, a
  loss that falls by orders of magnitude).
  """
  series = _series(rows)
  drawn = [b for b in series if b not in _NOT_DRAWN
           and not (b.startswith("best_") and b[len("best_"):] in series)]
  losses = [b for b in drawn if b.endswith("loss")]
  rates = [b for b in drawn if "learning_rate" in b]
  metrics = [b for b in drawn if b not in losses and b not in rates]
  main = [b for b in (main_metrics or []) if b in metrics]
  metrics = main + [b for b in metrics if b not in main]

  def values(base):
    found = [v for _, points in series[base].values() for v in points
             if v is not None and np.isfinite(v)]
    return np.asarray(found, dtype=float)

  groups: List[List[str]] = []
  for kind in (losses, metrics, rates):
    mine: List[List[str]] = []
    for base in kind:
      fits = [g for g in mine if len(g) < _MAX_PER_PANEL
              and _readable_together([values(b) for b in g + [base]])]
      if fits:
        fits[0].append(base)
      else:
        mine.append([base])
    groups += mine
  planned = []
  for bases in groups[:MAX_PANELS]:
    found = np.concatenate([values(b) for b in bases])
    log = bool(found.size and found.min() > 0
               and found.max() > LOG_SPAN * found.min())
    title = bases[0] if len(bases) == 1 else ", ".join(bases)
    planned.append((title, bases, log))
  return planned


def _readable_together(scalars: List[np.ndarray]) -> bool:
  """Whether each scalar's own range fills `SPAN_SHARE` of their shared axis.

  Accuracy (0.1 to 0.98) and an error rate (0.04 to 0.06), or a weight
  norm (5 to 11): no, the second would be a flat line. A training and a
  validation loss: yes.
  """
  found = [v for v in scalars if v.size]
  if len(found) < 2:
    return True
  low = min(v.min() for v in found)
  high = max(v.max() for v in found)
  if high == low:
    return True
  return all(v.max() - v.min() >= SPAN_SHARE * (high - low) for v in found)


def draw_curves(rows: Rows, title: str = "",
                main_metrics: Optional[List[str]] = None) -> bytes:
  """One PNG of every scalar against the step, panels as `panels` says.

  Each panel draws a scalar's training values (solid) and validation values
  (dashed, markers), in two colours, or in the scalar's colour where a
  panel has several; three panels to a row.
  """
  # Not pyplot: no global backend or figure list to change in a caller.
  # pylint: disable=g-import-not-at-top
  from matplotlib import figure
  from matplotlib.backends import backend_agg
  # pylint: enable=g-import-not-at-top
  series = _series(rows)
  planned = panels(rows, main_metrics)
  columns = min(max(len(planned), 1), _PANELS_PER_ROW)
  lines = -(-max(len(planned), 1) // columns)
  # Fixed margins: a layout engine would double the drawing time.
  fig = figure.Figure(figsize=(4.2 * columns, 3.6 * lines), dpi=100)
  fig.subplots_adjust(left=0.2 / columns, right=0.98,
                      bottom=0.14 / lines, top=1 - 0.16 / lines,
                      wspace=0.3, hspace=0.45)
  backend_agg.FigureCanvasAgg(fig)
  for index, (name, bases, log) in enumerate(planned):
    ax = fig.add_subplot(lines, columns, index + 1)
    for number, base in enumerate(bases):
      for role, (steps, values) in sorted(series[base].items()):
        validation = role == "validation"
        # One scalar: a colour per role; several: a colour per scalar.
        colour = f"C{int(validation) if len(bases) == 1 else number}"
        ax.plot(steps, values, color=colour,
                linestyle="--" if validation else "-",
                marker="o" if validation else None, markersize=4,
                label=role if len(bases) == 1 else f"{role} {base}")
    if log:
      ax.set_yscale("log")
    ax.set_title(name, y=1.0)  # Placed, not fitted above the ticks: faster.
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
  if title:
    fig.suptitle(title, fontsize="medium")
  png = io.BytesIO()
  fig.savefig(png, format="png")
  return png.getvalue()


def _series(rows: Rows) -> Dict[str, Dict[str, Tuple[list, list]]]:
  """base name -> role ("training", "validation") -> (steps, values)."""
  series = collections.defaultdict(dict)
  for step, values in sorted(rows.items()):
    for name, value in values.items():
      role, base = "training", name
      if name.startswith(VALIDATION_PREFIX):
        role, base = "validation", name[len(VALIDATION_PREFIX):]
      elif name.startswith(TRAINING_PREFIX):
        base = name[len(TRAINING_PREFIX):]
      steps, points = series[base].setdefault(role, ([], []))
      steps.append(step)
      points.append(value)
  return dict(series)


def refresh(model_dir: str, trainer_config, pending: Optional[Rows] = None
            ) -> bool:
  """Rewrites `metrics.csv` and `curves.png`; returns whether it did.

  `trainer_config` (`params.trainer`) names the validation subdir and the
  main metric; `pending` rows (values not yet in an event file) are put in
  over what was read. Where no event file holds a scalar (summaries off),
  nothing is written. A failure is logged as a warning: a figure must
  never stop a run.
  """
  try:
    rows = read_scalars(model_dir,
                        subdirs(trainer_config.validation_summary_subdir))
    if not rows:
      return False
    for step, values in (pending or {}).items():
      rows.setdefault(step, {}).update(values)
    files.write_text(os.path.join(model_dir, METRICS_CSV),
                      metrics_csv(rows))
    metric = trainer_config.best_checkpoint_eval_metric
    files.write_bytes(os.path.join(model_dir, CURVES_PNG), draw_curves(
        dict(rows), title=f"{model_dir} (step {max(rows)})",
        main_metrics=[metric] if metric else None))
    return True
  except Exception as e:  # pylint: disable=broad-except
    failures.reraise_interrupt(e)
    # A full disk, or a trainer that lost its lease (nothing written): one
    # line; anything else may be a bug, with its traceback.
    expected = isinstance(e, UsageError) or failures.storage_fault(e)
    logging.warning("Could not refresh %s and %s in %s%s", METRICS_CSV,
                    CURVES_PNG, model_dir,
                    f": {failures.tf_reason(e)}" if expected else ".",
                    exc_info=not expected)
    return False


class RefreshResults:
  """Action: refreshes the files after a loop or an evaluation (`refresh`).

  Orbit writes an output's summaries after its actions run, so the output
  this action is given is put in at the current global step, under
  `prefix`'s columns. It refreshes at most once every `every_seconds` of
  `clock`, counted from construction (0: on every output).
  """

  def __init__(self, *, model_dir: str, trainer_config,
               global_step: tf.Variable, prefix: str,
               every_seconds: float = 0.0,
               clock: Callable[[], float] = time.monotonic):
    self._model_dir = model_dir
    self._trainer_config = trainer_config
    self._global_step = global_step
    self._prefix = prefix
    self._every = every_seconds
    self._clock = clock
    self._due = clock() + every_seconds
    self.refreshes = 0

  def __call__(self, output: Optional[Mapping[str, Any]]) -> None:
    now = self._clock()
    if now < self._due:
      return
    self._due = now + self._every
    step = int(self._global_step.numpy())
    pending = {step: {column(self._prefix, name): value for name, value
                      in logs.scalars(output or {}).items()}}
    if refresh(self._model_dir, self._trainer_config, pending):
      self.refreshes += 1


def refresh_actions(context: actions.ActionContext,
                    phase: str) -> List[actions.Action]:
  """The chief's `RefreshResults` for `phase` ("train" or "eval"); else []."""
  if not context.chief:
    return []
  prefix, every_seconds = (("", TRAIN_REFRESH_SECONDS) if phase == "train"
                           else (VALIDATION_PREFIX, EVAL_REFRESH_SECONDS))
  return [RefreshResults(
      model_dir=context.model_dir, trainer_config=context.params.trainer,
      global_step=context.trainer.global_step, prefix=prefix,
      every_seconds=every_seconds)]
