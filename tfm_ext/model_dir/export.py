"""Exports a model as a SavedModel whose `serving_default` serves it.

`--mode=export` writes the checkpoint `--checkpoint_path` names (a prefix,
a directory or a step), by default the best checkpoint of `model_dir` (the
one `best_ckpt/`'s state file names: ours and TFM's exporter both keep it on
the best; of equal values, the older), else the latest, to
`model_dir/export/<step>/`; `export_summary.json` keeps the metrics the
best list recorded for it:

    restore(checkpoint, model=..., global_step=...)   every model weight
    serving_inputs(model, task, trainer)   -> ServingInputs (the hook below)
    ServingModule(params, model, inputs)   TFM's `export_base.ExportModule`
    save(module, export_dir)               written whole, never overwritten

A task of TFM's vision tasks (classification, RetinaNet, Mask R-CNN,
segmentation, video) is exported as TFM's `export_saved_model.py` exports
it, by TFM's own module, preprocessing inside
(`tfm_ext.model_dir.tfm_serving`: `--input_type`, `--batch_size`,
`--input_image_size`); a task of TFM's NLP tasks (sentence prediction,
tagging...) as its `export_savedmodel.py` exports it, by the module its
table names (`tfm_ext.model_dir.nlp_serving`: `--function_keys`,
`--serving_params`). Any other model is exported by `ServingModule`.
Its signature's tensors are named after the model's inputs: `inputs` for
a model with one (float32 `[None, 8, 8, 1]` for digits_convnet), the keys
or input names for several. Its outputs are the model's: a dict as it is,
one tensor as `outputs`, several as `outputs_0`, `outputs_1`...

How serving inputs become model inputs is a hook. A trainer or task (the
trainer's wins) that defines

    def serving_inputs(self, model) -> tfm_ext.ServingInputs:
      return ServingInputs(
          specs={"image_bytes": tf.TensorSpec([None], tf.string)},
          prepare=lambda inputs: tf.map_fn(decode_png, inputs["image_bytes"],
                                           fn_output_signature=image_spec))

exports a model that takes PNG bytes (`PngServingTrainer` in
tests/model_dir/test_export.py is the whole of one); `prepare` is traced into the
SavedModel and must hold no state of its own (variables and tables belong in
the model, which the SavedModel tracks). TFM's ranking task (DLRM, DCN),
for which TFM has no exporter, defines one: Criteo rows as dense floats
and sparse ids (`tfm_ext.training._ranking_task`). The TF-Hub exports of
ResNet50 (`experiments/imagenet/export.py`) are two more uses of
`restore`, `ServingModule` and `save`.
"""

import dataclasses
import logging
import os
import secrets
from typing import Any, Callable, Dict, List, Mapping, Optional

from absl import logging as absl_logging
from google.protobuf import message
import tensorflow as tf
import tf_keras

from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-direct-tensorflow-import

from official.core import export_base

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import best_checkpoints
from tfm_ext.model_dir import files
from tfm_ext.model_dir import checkpoint_state
from tfm_ext.model_dir import claim
from tfm_ext.model_dir import nlp_serving
from tfm_ext.model_dir import project_serving
from tfm_ext.model_dir import tfm_serving
from tfm_ext.base import failures

SUBDIR = "export"
_SAVED_MODEL_PB = "saved_model.pb"
# An export's copy in progress has its owner's record beside it
# (`_owner_record`).
_RECORD = ".json"
SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY


@dataclasses.dataclass(frozen=True)
class ServingInputs:
  """What `serving_default` takes and how that becomes the model's inputs.

  Attributes:
    specs: the signature's tensors by name; a batch dimension of None lets
      a client send any number of examples.
    prepare: takes `{name: tensor}` as `specs` describe them and returns
      what the model is called on; traced into the SavedModel.
  """
  specs: Mapping[str, tf.TensorSpec]
  prepare: Callable[[Dict[str, tf.Tensor]], Any]


def model_inputs(model: tf_keras.Model) -> ServingInputs:
  """The model's own inputs, as a functional or Sequential model declares them.

  Raises:
    UsageError: the model declares none (a subclassed model never called);
      define `serving_inputs` on the task or trainer.
  """
  try:
    structure = model.input
  except (AttributeError, ValueError) as e:
    raise UsageError(
        f"Cannot tell what model {model.name!r} takes ({e}). Define "
        "`serving_inputs(self, model)` on the task or trainer, returning a "
        "tfm_ext.ServingInputs.") from e

  def spec(keras_tensor, name):
    return tf.TensorSpec([None] + list(keras_tensor.shape[1:]),
                         keras_tensor.dtype, name=name)

  if isinstance(structure, Mapping):
    return ServingInputs({k: spec(t, k) for k, t in structure.items()}, dict)
  if isinstance(structure, (list, tuple)):
    names = list(model.input_names)
    return ServingInputs({n: spec(t, n) for n, t in zip(names, structure)},
                         lambda inputs: [inputs[n] for n in names])
  return ServingInputs({"inputs": spec(structure, "inputs")},
                       lambda inputs: inputs["inputs"])


def serving_inputs(model: tf_keras.Model, *owners,
                   data: Optional[Callable[[], Any]] = None) -> ServingInputs:
  """The first of `owners` (trainer, task) with `serving_inputs`, else the
  model's own inputs, else those of `data()` (the task's validation
  input: `inputs_of_data`)."""
  for owner in owners:
    hook = getattr(owner, "serving_inputs", None)
    if hook is not None:
      return hook(model)
  try:
    return model_inputs(model)
  except UsageError as undeclared:
    if data is None:
      raise
    return inputs_of_data(model, data, undeclared)


def inputs_of_data(model: tf_keras.Model, data: Callable[[], Any],
                   undeclared: UsageError) -> ServingInputs:
  """What the model is fed in evaluation, from the dataset's element spec.

  A model that declares no inputs (a Sequential without an `InputLayer`, a
  subclassed model) is served what the task's validation input gives it:
  the features of its `(features, labels)` elements, a tensor or a dict
  of them, batch dimension None.

  Raises:
    UsageError: the input cannot be built here, or gives no features;
      `undeclared` says what the model lacks.
  """
  try:
    spec = data().element_spec
  except Exception as e:  # pylint: disable=broad-except
    failures.reraise_interrupt(e)
    raise UsageError(
        f"{undeclared} Its task's validation input, which would say it, "
        f"cannot be built here: {type(e).__name__}: {e}") from e
  features = spec[0] if isinstance(spec, tuple) else spec
  if isinstance(features, Mapping) and all(
      isinstance(v, tf.TensorSpec) for v in features.values()):
    return ServingInputs({k: _unbatched(v, k) for k, v in features.items()},
                         dict)
  if isinstance(features, tf.TensorSpec):
    return ServingInputs({"inputs": _unbatched(features, "inputs")},
                         lambda inputs: inputs["inputs"])
  raise UsageError(f"{undeclared} Its task's validation input gives "
                   f"{features}, not a tensor or a dict of tensors.")


def _unbatched(spec: tf.TensorSpec, name: str) -> tf.TensorSpec:
  """`spec` with any number of examples: its batch dimension None."""
  return tf.TensorSpec([None] + list(spec.shape[1:]), spec.dtype, name=name)


def _infer(inputs, model):
  # TFM's default step is `model.call`, which leaves `training` to the
  # model's default; dropout and batch norm must run as in evaluation.
  return model(inputs, training=False)


def _named(outputs) -> Dict[str, tf.Tensor]:
  if isinstance(outputs, Mapping):
    return dict(outputs)
  if isinstance(outputs, (list, tuple)):
    return {f"outputs_{i}": t for i, t in enumerate(outputs)}
  return {"outputs": outputs}


class ServingModule(export_base.ExportModule):
  """TFM's export module for any model: `serve` prepares inputs, then infers."""

  def __init__(self, params, model: tf_keras.Model, inputs: ServingInputs):
    super().__init__(params, model, inference_step=_infer,
                     preprocessor=inputs.prepare)
    self._specs = dict(inputs.specs)

  @tf.function
  def serve(self, **inputs) -> Dict[str, tf.Tensor]:
    """`{name: tensor}` as `ServingInputs.specs` says -> named model outputs."""
    return _named(self.inference_step(self.preprocessor(inputs)))

  def get_inference_signatures(self, function_keys: Mapping[str, str]):
    """`serve` under each signature name of `function_keys`' values."""
    serve = self.serve.get_concrete_function(**self._specs)
    return {name: serve for name in function_keys.values()}


def restore(checkpoint_path: str, **objects) -> None:
  """Reads `objects` (`model=`, `global_step=`) from a checkpoint.

  What else the checkpoint holds (the optimizer, the input iterator) is
  left unread. This read is the export's only one of the checkpoint.

  Raises:
    UsageError: the checkpoint is damaged (`checkpoint_state.restore_failed`).
    AssertionError: a weight of `objects` has no value in the checkpoint (a
      different architecture or `num_classes`), as TFM's export asserts.
  """
  try:
    status = tf.train.Checkpoint(**objects).read(checkpoint_path)
  # TensorFlow's reader raises IndexError for data cut short.
  except (tf.errors.OpError, ValueError, IndexError) as e:
    why = checkpoint_state.restore_failed(checkpoint_path, e)
    raise UsageError(
        f"The checkpoint {checkpoint_path} cannot be read: {why}. Nothing "
        "was exported. Export another with --checkpoint_path (a prefix, a "
        "directory or a step).") from e
  status.expect_partial().assert_existing_objects_matched()


def save(module: ServingModule, export_dir: str) -> str:
  """Writes `module.model` with the module's `serving_default`; returns the dir.

  TFM's `export_base.export` saves the module as the SavedModel's root;
  here the root is the model, so the SavedModel also loads with
  `tf_keras.models.load_model` (the TF-Hub exports rely on it). Written as
  `write_placed` writes.

  Raises:
    FileExistsError: `export_dir` exists, or another export put it there
      meanwhile; it is never overwritten.
  """
  def write(partial):
    tf_logger = tf.get_logger()
    tf_logger.addFilter(_demote_compile_warning)
    try:
      module.model.save(partial, save_format="tf", include_optimizer=False,
                        signatures=module.get_inference_signatures(
                            {"serve": SIGNATURE}))
    finally:
      tf_logger.removeFilter(_demote_compile_warning)

  return write_placed(export_dir, write)


def write_placed(export_dir: str, write: Callable[[str], None]) -> str:
  """`write(partial)` fills a new folder that then becomes `export_dir`.

  `partial` is a hidden sibling of this process's own, moved into place
  (`place`): on a local disk a reader (TF Serving watching `export/`)
  never sees it half-written. Two exports of one directory at once each
  write their own; the first to place it wins and the other's copy is
  dropped. What an interrupted export of this machine left is cleared
  first (`_clear_leftovers`). Returns `export_dir`.

  Raises:
    FileExistsError: `export_dir` exists, or another export put it there
      meanwhile; it is never overwritten.
  """
  export_dir = export_dir.rstrip("/")
  if tf.io.gfile.exists(export_dir):
    raise FileExistsError(f"{export_dir} exists; not overwritten.")
  parent, name = os.path.split(export_dir)
  _clear_leftovers(parent, name)
  token = secrets.token_hex(4)
  partial = os.path.join(parent, f".{name}.partial.{token}")
  # The copy's owner record, written before the copy, deleted after it.
  tf.io.gfile.makedirs(parent)
  owner = claim.Record(_owner_record(parent, name, token),
                       lambda _: claim.Process.this().fields())
  owner.write()
  try:
    write(partial)
    place(partial, export_dir)
  finally:
    if tf.io.gfile.exists(partial):  # It failed: nothing half-written stays.
      tf.io.gfile.rmtree(partial)
    owner.remove()
  return export_dir


def _demote_compile_warning(record: logging.LogRecord) -> bool:
  """tf_keras's "compiled metrics have yet to be built", as INFO.

  Saving a compiled model that was never fitted in this process (an
  export) logs it; a SavedModel for serving takes no compiled metrics, so
  it belongs in the log file, not on the console.
  """
  if record.levelno == logging.WARNING and str(record.msg).startswith(
      "Compiled the loaded model, but the compiled metrics"):
    record.levelno, record.levelname = logging.INFO, "INFO"
  return True


def place(partial: str, export_dir: str) -> None:
  """Moves the finished `partial` to `export_dir`, which it never replaces.

  On a local disk that is one rename. An object store renames a folder
  object by object, if at all (`ram://` moves the folder's name alone), so
  there each file is copied, `saved_model.pb` last: a SavedModel is
  complete once it is there.

  Raises:
    FileExistsError: `export_dir` appeared while `partial` was written (a
      second export of it); `partial` is deleted.
  """
  try:
    if files.local_path(export_dir) is not None:
      tf.io.gfile.rename(partial, export_dir)
    else:
      _copy_saved_model(partial, export_dir)
      tf.io.gfile.rmtree(partial)
  except (tf.errors.OpError, OSError):
    if not tf.io.gfile.exists(export_dir):
      raise
    tf.io.gfile.rmtree(partial)
    raise FileExistsError(f"{export_dir} was written by another export "
                          "meanwhile; not overwritten.") from None


def _copy_saved_model(source: str, target: str) -> None:
  """Copies the SavedModel `source` to a new `target`, `saved_model.pb` last.

  Raises:
    FileExistsError: `target` exists.
  """
  if tf.io.gfile.exists(target):
    raise FileExistsError(target)
  files = [os.path.join(folder, name)[len(source):].lstrip("/")
           for folder, _, names in tf.io.gfile.walk(source) for name in names]
  for name in sorted(files, key=lambda name: name == _SAVED_MODEL_PB):
    tf.io.gfile.makedirs(os.path.dirname(os.path.join(target, name)))
    tf.io.gfile.copy(os.path.join(source, name), os.path.join(target, name))


def _clear_leftovers(parent: str, name: str) -> None:
  """Deletes the hidden copies of `name` that interrupted exports left.

  A copy `.<name>.partial.<token>` has its owner's record beside it,
  `.<name>.owner.<token>.json` (`tfm_ext.model_dir.claim`; not a name that
  begins with the copy's, which an object store lists as in it). Where
  `claim.Judge` finds its owner gone (a process of this machine that is
  not running; an export has no heartbeat, so another machine's copy may
  be one in flight and stays), the copy and its record go. So do the copies of versions
  that named them `.<name>.partial`, or `.<name>.partial.<machine>.<pid>`
  (this machine's, judged by the pid alone).
  """
  prefix, owners = f".{name}.partial", f".{name}.owner."
  if not tf.io.gfile.isdir(parent):
    return
  judge = claim.Judge()  # Never stale: an export has no heartbeat.
  entries = [entry.rstrip("/") for entry in tf.io.gfile.listdir(parent)]
  for entry in entries:
    path = os.path.join(parent, entry)
    if entry == prefix or _left_by_a_gone_pid(entry, prefix, judge):
      tf.io.gfile.rmtree(path)
    elif entry.startswith(owners) and entry.endswith(_RECORD):
      try:
        record = claim.read(path, {"host": str, "pid": int})
      except files.Damaged:
        continue  # Whose it is cannot be told: it stays.
      if record is not None and judge.gone_because(record):
        copy = f"{prefix}.{entry[len(owners):-len(_RECORD)]}"
        if copy in entries:
          tf.io.gfile.rmtree(os.path.join(parent, copy))
        claim.remove(path)


def _owner_record(parent: str, name: str, token: str) -> str:
  """Where the owner of the copy `.<name>.partial.<token>` is recorded."""
  return os.path.join(parent, f".{name}.owner.{token}{_RECORD}")


def _left_by_a_gone_pid(entry: str, prefix: str, judge: claim.Judge) -> bool:
  """Whether `entry` is a copy an older version named after this machine
  and a pid (`<prefix>.<machine>.<pid>`) that is gone."""
  mine = f"{prefix}.{judge.me.machine}."
  pid = entry[len(mine):] if entry.startswith(mine) else ""
  # The name holds the pid only: judged by it alone.
  other = {**judge.me.fields(), "pid": int(pid or 0)}
  other.pop("pid_start", None)
  return pid.isdigit() and bool(judge.gone_because(other))


def checkpoint_to_export(model_dir: str, best_subdir: str,
                         chosen: str = "") -> str:
  """The checkpoint `chosen` names, else the best, else the latest.

  `chosen` is `--checkpoint_path`, as TFM's export scripts take it: a
  checkpoint's prefix (`MODEL_DIR/ckpt-300`), a directory (its latest), or
  a step (`300`: `ckpt-300` in `model_dir`, else `best_ckpt-300` in
  `best_subdir`). The best is the first of `best_subdir`'s ranking: of
  checkpoints with equal values, the older
  (`tfm_ext.model_dir.best_checkpoints`). Without `chosen`, a damaged
  checkpoint is skipped with a warning: the next best, then the latest
  that reads (`_first_readable`); a `chosen` one that is damaged is
  refused when it is read (`restore`).

  Raises:
    UsageError: nothing to export, or `chosen` names no checkpoint.
  """
  best_dir = os.path.join(model_dir, best_subdir) if best_subdir else ""
  if chosen:
    if chosen.isdigit():
      candidates = [os.path.join(model_dir, f"ckpt-{chosen}")] + (
          [os.path.join(best_dir, f"{best_checkpoints.PREFIX}-{chosen}")]
          if best_dir else [])
    elif tf.io.gfile.isdir(chosen):
      candidates = [tf.train.latest_checkpoint(chosen) or ""]
    else:
      candidates = [chosen]
    for candidate in candidates:
      if candidate and tf.io.gfile.exists(candidate + ".index"):
        return candidate
    raise UsageError(
        f"--checkpoint_path={chosen!r} names no checkpoint (looked for "
        f"{', '.join(repr(c + '.index') for c in candidates if c) or 'a checkpoint in it'}). "
        "Give a checkpoint's prefix (MODEL_DIR/ckpt-300), a directory or a "
        "step; leave it out to export the best checkpoint.")
  return _first_readable(model_dir, _best_first(best_dir) + list(
      reversed(_listed(model_dir))))


def _first_readable(model_dir: str, candidates: List[str]) -> str:
  """The first of `candidates` that reads whole (every tensor read back).

  A damaged one is skipped with a warning naming it and why, as a
  training start skips a damaged latest (`checkpoint_state.repair`).

  Raises:
    UsageError: there is no candidate, or none reads.
  """
  skipped = []
  for candidate in dict.fromkeys(candidates):
    why = checkpoint_state.unreadable(candidate, read_tensors=True)
    if why is None:
      if skipped:
        absl_logging.warning(
            "Skipped %s: exporting %s, the next best that reads whole. "
            "Skipped files are left as they are.", _said(skipped), candidate)
      return candidate
    skipped.append((candidate, why))
  if not skipped:
    raise UsageError(f"No checkpoint in --model_dir={model_dir!r} to export. "
                     "Train first, or point --model_dir at a directory that "
                     "holds checkpoints.")
  raise UsageError(
      f"No checkpoint in --model_dir={model_dir!r} can be exported: "
      f"{_said(skipped)}. Nothing was exported. Restore them from a copy, "
      "or export another run's with --checkpoint_path.")


def _said(skipped) -> str:
  return "; ".join(f"{path} ({why})" for path, why in skipped)


def _best_first(best_dir: str) -> List[str]:
  """`best_dir`'s checkpoints, best first: its manifest's ranking, else the
  one its state file names (TFM's exporter keeps only that one)."""
  if not (best_dir and tf.io.gfile.isdir(best_dir)):
    return []
  try:
    manifest = best_checkpoints.read_manifest(best_dir)
  except (files.Damaged, tf.errors.OpError):
    try:
      best = tf.train.latest_checkpoint(best_dir)
    except (tf.errors.OpError, ValueError):
      best = None  # A state file that does not read names none.
    return [best] if best else []
  return [os.path.join(best_dir, entry["path"])
          for entry in manifest["checkpoints"]]


def _listed(model_dir: str) -> List[str]:
  """`model_dir`'s checkpoints, oldest first, as a training start finds them."""
  listed, _ = checkpoint_state.read_state(model_dir)
  return listed or checkpoint_state.checkpoint_files(model_dir)


def saved_model_problem(path: str) -> str:
  """Why `path` is not a SavedModel that loads; "" if it is one.

  Its `saved_model.pb` parses, and the variables its objects hold read
  back whole; the graph is not loaded (that would cost a model's build).
  """
  if not tf.io.gfile.isdir(path):
    return "it is a file, not a SavedModel's folder"
  graph = os.path.join(path, _SAVED_MODEL_PB)
  if not tf.io.gfile.exists(graph):
    return f"it holds no {_SAVED_MODEL_PB} (empty, or a copy cut short)"
  try:
    with tf.io.gfile.GFile(graph, "rb") as f:
      saved = saved_model_pb2.SavedModel.FromString(f.read())
  except (message.DecodeError, tf.errors.OpError) as e:
    return f"its {_SAVED_MODEL_PB} does not parse ({e})"
  if any(node.WhichOneof("kind") == "variable" for graph_def in
         saved.meta_graphs for node in graph_def.object_graph_def.nodes):
    why = checkpoint_state.unreadable(
        os.path.join(path, "variables", "variables"), read_tensors=True)
    if why:
      return f"its variables cannot be read: {why}"
  return ""


def recorded_metrics(model_dir: str, best_subdir: str,
                     checkpoint: str) -> Dict[str, Any]:
  """What an evaluation recorded for `checkpoint`: the best list's, else {}.

  `best_subdir`'s manifest keeps the metrics of each checkpoint it ranks;
  a checkpoint of `model_dir` is found there by its step.
  """
  if not best_subdir:
    return {}
  best_dir = os.path.join(model_dir, best_subdir)
  if os.path.dirname(checkpoint) not in (model_dir, best_dir):
    return {}  # Another run's checkpoint: its steps are not this list's.
  step = checkpoint.rpartition("-")[2]
  try:
    manifest = best_checkpoints.read_manifest(
        os.path.join(model_dir, best_subdir))
  except (tf.errors.OpError, ValueError):
    return {}  # Damaged or unreadable: the export goes on without them.
  for entry in manifest.get("checkpoints", ()):
    if str(entry.get("global_step")) == step:
      return dict(entry.get("metrics") or {})
  return {}


def export_model_dir(
    trainer, params, model_dir: str, chosen: str = "",
    serving: tfm_serving.ServingOptions = tfm_serving.ServingOptions()
) -> Dict[str, Any]:
  """Exports `model_dir`'s chosen, best or latest checkpoint to `export/<step>/`.

  `chosen` is `--checkpoint_path` (`checkpoint_to_export`). A task of TFM's
  vision tasks is exported by TFM's own module, as `serving` says
  (`tfm_ext.model_dir.tfm_serving`); any other model by `ServingModule`,
  taking what `serving_inputs` says. The checkpoint is read once, into the
  exported model and `trainer`'s global step, so the run records the
  exported step. Prints `export @ step N | <dir>`, or that the step's
  export exists (left as it is); returns the checkpoint's recorded metrics
  (`recorded_metrics`), which the export's summary keeps.

  Raises:
    UsageError: no checkpoint to export, or `serving` does not fit the task.
  """
  best_subdir = params.trainer.best_checkpoint_export_subdir
  checkpoint = checkpoint_to_export(model_dir, best_subdir, chosen)
  # TFM's module builds the model it serves, so it exists before the read.
  vision = tfm_module(trainer, params, serving)
  with failures.phase("restore", checkpoint):
    restore(checkpoint, model=vision.module.model if vision else trainer.model,
            global_step=trainer.global_step)
  step = int(trainer.global_step.numpy())
  export_dir = os.path.join(model_dir, SUBDIR, str(step))
  metrics = recorded_metrics(model_dir, best_subdir, checkpoint)
  # Checked first, so an existing export never traces the serving module.
  _check_existing(export_dir)
  if not tf.io.gfile.exists(export_dir):
    try:
      if vision:
        write_placed(export_dir, vision.write)
      else:
        save(ServingModule(params, trainer.model, serving_inputs(
            trainer.model, trainer, trainer.task,
            data=lambda: trainer.task.build_inputs(
                params.task.validation_data))), export_dir)
    except FileExistsError:  # Another export finished first.
      pass
    else:
      print(f"export @ step {step} | {export_dir} | from {checkpoint}",
            flush=True)
      return metrics
  print(f"export @ step {step} | {export_dir} exists: not overwritten",
        flush=True)
  return metrics


def tfm_module(trainer, params, serving: tfm_serving.ServingOptions
               ) -> Optional[tfm_serving.VisionExport]:
  """TFM's own export module of the task: its project's
  (`tfm_ext.model_dir.project_serving`), else NLP's
  (`tfm_ext.model_dir.nlp_serving`: it refuses NLP flags for any other
  task), else vision's; None: none."""
  return (project_serving.project_export(trainer.task, params, serving)
          or nlp_serving.nlp_export(params, serving)
          or tfm_serving.vision_export(params, serving))


def _check_existing(export_dir: str) -> None:
  """Refuses an `export_dir` there that is not a SavedModel that loads.

  It is never reported as an export, nor replaced: an empty or partial
  folder may be a copy someone is making.

  Raises:
    UsageError: naming it and what is wrong with it.
  """
  if not tf.io.gfile.exists(export_dir):
    return
  problem = saved_model_problem(export_dir)
  if problem:
    raise UsageError(
        f"{export_dir} exists, but is not a SavedModel that loads: {problem}. "
        "Nothing was exported, and it was left as it is. Move or delete it, "
        "then export again.")
