"""The reference ResNet CTL runner's interface, mapped onto our experiment.

TFM's `resnet_ctl_imagenet_main.py` is driven by flags;
`reference_flags.define_flags` declares all of them, `translate` turns their
values into config sources for `resnet50_imagenet_ctl` and a mode (and says
which flags do nothing in this run), and `build_stats` gives the
reference's stats dictionary from our run summary.

Reference behaviours kept on purpose, each logged as a warning when it
applies: `--train_steps` makes one "epoch" of at most one real epoch and
ignores `--train_epochs`; `--steps_per_loop` is cut to that epoch;
`--enable_eager` does nothing; `--fp16_implementation=graph_rewrite` trains
in float32. Also kept: 1001 model outputs (so reference checkpoints load),
an epoch of 1,281,167 images, evaluation over ceil(50,000 / batch) steps,
checkpoints only with `--enable_checkpoint_and_export` (every
`5 * steps_per_loop` steps, 10 kept).
Honoured where the reference is silent: `--profile_steps` (the reference
ignores it in the CTL runner) and `--num_gpus=-1` (all visible GPUs; the
reference passes -1 on and fails).
"""

import dataclasses
import fnmatch
import math
import os
from typing import Any, Dict, List, Optional

import tensorflow as tf
import yaml

from experiments.imagenet import input_pipeline
from experiments.imagenet import reference_flags
from tfm_ext.config.params import ConfigSources
from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir.run_summary import RunSummary

EXPERIMENT = "resnet50_imagenet_ctl"
REFERENCE_NUM_CLASSES = 1001
GPU_STRATEGIES = ("one_device", "mirrored")
# What a run of this launcher (or of the reference) writes into model_dir;
# `--clean` removes a directory only if it holds nothing else.
RUN_OUTPUTS = ("checkpoint", "ckpt-*", "model.ckpt-*", "params.yaml",
               "run_summary.json", "eval_summary.json", "*.tmp*", "train",
               "validation", "eval", "logs", "best_ckpt", "events.out.*",
               "operative_config.*", "training_*", "eval_ledger*")


@dataclasses.dataclass(frozen=True)
class Iterations:
  """The reference's step counts (`get_num_train_iterations`)."""
  steps_per_epoch: int
  train_epochs: int
  eval_steps: int
  notes: List[str]


def iterations(batch_size: int, train_epochs: int,
               train_steps: Optional[int]) -> Iterations:
  """Returns the reference's epochs, steps per epoch and evaluation steps."""
  steps_per_epoch = input_pipeline.NUM_TRAIN_IMAGES // batch_size
  eval_steps = math.ceil(input_pipeline.NUM_VALIDATION_IMAGES / batch_size)
  notes = []
  if train_steps:
    capped = min(train_steps, steps_per_epoch)
    ignored = (f", ignoring --train_epochs={train_epochs}"
               if train_epochs != 1 else "")
    cut = (f" (an ImageNet epoch at batch {batch_size} is {steps_per_epoch} "
           "steps)" if capped < train_steps else "")
    notes.append(f"--train_steps={train_steps} trains one epoch of {capped} "
                 f"steps{ignored}{cut}, as the reference runner does.")
    steps_per_epoch, train_epochs = capped, 1
  return Iterations(steps_per_epoch, train_epochs, eval_steps, notes)


@dataclasses.dataclass(frozen=True)
class Translation:
  """What to run: config sources, mode, model_dir, and warnings to log."""
  sources: ConfigSources
  mode: str
  model_dir: str
  notes: List[str]


def translate(fv, gpus_visible: int) -> Translation:
  """Maps parsed reference flags onto the experiment; raises `UsageError`."""
  if fv.batch_size <= 0:
    raise UsageError(f"--batch_size must be positive, got {fv.batch_size}.")
  if fv.fp16_implementation == "graph_rewrite" and fv.dtype != "fp16":
    # The reference's own validator, with its message.
    raise UsageError("--fp16_implementation should not be specified unless "
                     "--dtype=fp16")
  if fv.use_tf_while_loop and not fv.use_tf_function:
    raise UsageError("--use_tf_while_loop needs --use_tf_function; pass "
                     "--use_tf_while_loop=false to run steps eagerly.")
  its = iterations(fv.batch_size, fv.train_epochs, fv.train_steps)
  notes = list(its.notes)
  steps_per_loop = fv.steps_per_loop or its.steps_per_epoch
  if steps_per_loop <= 0:
    raise UsageError(f"--steps_per_loop must be positive, got "
                     f"{fv.steps_per_loop}.")
  if steps_per_loop > its.steps_per_epoch:
    notes.append(f"--steps_per_loop={steps_per_loop} is cut to the epoch, "
                 f"{its.steps_per_epoch} steps, as the reference runner does.")
    steps_per_loop = its.steps_per_epoch
  if fv.enable_eager:
    notes.append("--enable_eager has no effect in the CTL runner (nor in the "
                 "reference); --use_tf_function=false runs steps eagerly.")
  if fv.fp16_implementation == "graph_rewrite":
    notes.append("--fp16_implementation=graph_rewrite trains in float32, as "
                 "the reference does in TF2 (no graph rewrite is applied).")
  notes += reference_flags.notes(fv, gpus_visible)
  override = {"task": _task(fv),
              "trainer": _trainer(fv, its, steps_per_loop),
              "runtime": _runtime(fv, gpus_visible)}
  return Translation(
      sources=ConfigSources(experiment=EXPERIMENT, tpu=fv.tpu or "",
                            params_override=yaml.safe_dump(override)),
      mode="train" if fv.skip_eval else "train_and_eval",
      model_dir=os.path.expanduser(fv.model_dir),
      notes=notes)


def _task(fv) -> Dict[str, Any]:
  return {
      "model": {"num_classes": REFERENCE_NUM_CLASSES,
                "data_format": fv.data_format or ""},
      "single_l2_loss_op": fv.single_l2_loss_op,
      "train_data": _data(fv, reference_flags.TRAIN_FILES,
                          cache=fv.training_dataset_cache),
      "validation_data": _data(fv, reference_flags.VALIDATION_FILES),
  }


def _trainer(fv, its: Iterations, steps_per_loop: int) -> Dict[str, Any]:
  return {
      "train_steps": its.steps_per_epoch * its.train_epochs,
      "steps_per_loop": steps_per_loop,
      "validation_interval": fv.epochs_between_evals * its.steps_per_epoch,
      "validation_steps": its.eval_steps,
      # The reference's CheckpointManager gets no interval, so Orbit saves
      # nothing, unless --enable_checkpoint_and_export.
      "checkpoint_interval": (steps_per_loop * 5
                              if fv.enable_checkpoint_and_export else 0),
      "max_to_keep": 10,
      "summary_interval": steps_per_loop if fv.enable_tensorboard else None,
      "best_checkpoint_export_subdir": "",
      "validation_summary_subdir": "eval",
      "train_tf_function": fv.use_tf_function,
      "eval_tf_function": fv.use_tf_function,
      "train_tf_while_loop": fv.use_tf_while_loop,
      "log_steps": fv.log_steps,
      "profile_steps": fv.profile_steps or "",
  }


def _runtime(fv, gpus_visible: int) -> Dict[str, Any]:
  """Returns the runtime override; checks the strategy and GPU count."""
  strategy = fv.distribution_strategy.lower()
  if strategy not in reference_flags.STRATEGIES:
    raise UsageError(f"Unknown --distribution_strategy={strategy!r}; use one "
                     f"of {', '.join(reference_flags.STRATEGIES)}.")
  num_gpus = gpus_visible if fv.num_gpus == -1 else fv.num_gpus
  if num_gpus < 0:
    raise UsageError(f"--num_gpus must be -1 (all), 0 (CPU) or a count, got "
                     f"{fv.num_gpus}.")
  if strategy in GPU_STRATEGIES and num_gpus > gpus_visible:
    raise UsageError(
        f"--num_gpus={fv.num_gpus} asks for {num_gpus} GPUs but this machine "
        f"has {gpus_visible}. Pass --num_gpus=0 to train on the CPU, or "
        f"--num_gpus=-1 for every visible GPU.")
  runtime = {
      "distribution_strategy": strategy,
      "num_gpus": num_gpus,
      "tpu": fv.tpu or "",
      "all_reduce_alg": fv.all_reduce_alg,
      "num_packs": fv.num_packs,
      "enable_xla": fv.enable_xla,
      "mixed_precision_dtype": _compute_dtype(fv),
  }
  if fv.loss_scale is not None:
    runtime["loss_scale"] = _loss_scale(fv.loss_scale)
  return runtime


def _data(fv, files: str, cache: bool = False) -> Dict[str, Any]:
  synthetic = fv.use_synthetic_data
  return {
      "input_path": "" if synthetic else os.path.join(fv.data_dir, files),
      "use_synthetic_data": synthetic,
      "global_batch_size": fv.batch_size,
      "dtype": _compute_dtype(fv),
      "cache": cache,
      "private_threadpool_size": fv.datasets_num_private_threads or 0,
  }


def _compute_dtype(fv) -> str:
  """The reference's `get_tf_dtype`: graph_rewrite builds in float32."""
  if fv.fp16_implementation == "graph_rewrite":
    return "float32"
  return reference_flags.DTYPES[fv.dtype]


def _loss_scale(text: str):
  if text == "dynamic":
    return text
  try:
    value = float(text)
  except ValueError:
    value = 0.0
  if value <= 0:
    raise UsageError(f"--loss_scale must be a positive number or 'dynamic', "
                     f"got {text!r}.")
  return value


def check_cleanable(model_dir: str) -> None:
  """Raises `UsageError` if `model_dir` holds anything a run did not write.

  The reference removes `--model_dir` whatever it holds, and its default is
  `/tmp`.
  """
  if not tf.io.gfile.isdir(model_dir):
    return
  foreign = sorted(
      name for name in (n.rstrip("/") for n in tf.io.gfile.listdir(model_dir))
      if not any(fnmatch.fnmatch(name, p) for p in RUN_OUTPUTS))
  if foreign:
    listed = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
    raise UsageError(
        f"--clean would remove --model_dir={model_dir!r}, which holds files "
        f"no run wrote ({listed}). Point --model_dir at a run's directory or "
        "drop --clean.")


def build_stats(summary: RunSummary, skip_eval: bool) -> Dict[str, float]:
  """Returns the reference's stats: losses, accuracies, examples/second."""
  stats = {}
  if not skip_eval:
    stats["eval_loss"] = summary.eval_metrics.get("validation_loss")
    stats["eval_acc"] = summary.eval_metrics.get("accuracy")
  stats["train_loss"] = summary.train_metrics.get("training_loss")
  stats["train_acc"] = summary.train_metrics.get("accuracy")
  if summary.examples_per_second is not None:
    stats["avg_exp_per_second"] = summary.examples_per_second
  return stats
