"""Every flag of the reference ResNet CTL runner, short names included.

TFM's `resnet_ctl_imagenet_main.py` takes `common.define_keras_flags()`
(through `official.utils.flags.core`) plus two flags of its own; a command
line written for it parses here unchanged: same names, short names
(`--md`, `--bs`, ...), types and defaults (`tests/run/test_legacy_flags.py`
checks them against the installed wheel). What each flag does falls in one
of three kinds:

* honoured: mapped onto the experiment by `reference_runner.translate`;
* GPU-only (`GPU_ONLY`): set up by `configure_gpus` when a GPU is visible,
  as the reference does; on a CPU a flag the user passed is logged as
  having no effect;
* never read by the reference (`UNREAD`): accepted, and a value other than
  the default is logged as ignored.

We declare the flags ourselves instead of calling `define_keras_flags`:
it can only define on the process-wide `flags.FLAGS` (so the flags could not
be parsed into a private `FlagValues`), and its validators fail with absl's
message and exit 1 where our launcher prints one `error:` line and exits 2.
"""

import functools
import os
from typing import List

from absl import flags
from absl import logging
from official.utils.misc import keras_utils

TRAIN_FILES = "train-*-of-01024"
VALIDATION_FILES = "validation-*-of-00128"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
STRATEGIES = ("off", "one_device", "mirrored", "parameter_server",
              "multi_worker_mirrored", "tpu")
CUDNN_BATCHNORM_ENV = "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT"

# Flags the reference acts on only when a GPU is visible, and what they set.
GPU_ONLY = {
    "tf_gpu_thread_mode": "TF_GPU_THREAD_MODE",
    "per_gpu_thread_count": "TF_GPU_THREAD_COUNT",
    "batchnorm_spatial_persistent": CUDNN_BATCHNORM_ENV,
}

_CLUSTER = "multi-worker jobs read TF_CONFIG"
# Flags `define_keras_flags` declares for the Keras-fit runners that the CTL
# runner never reads, each with what to use instead where there is something.
UNREAD = {
    "run_eagerly": "--use_tf_function=false runs steps eagerly",
    "report_accuracy_metrics": "training and evaluation accuracy are always "
                               "reported",
    "enable_get_next_as_optional": "",
    "explicit_gpu_placement": "",
    "use_trivial_model": "",
    "use_tensor_lr": "",
    "set_learning_phase_to_train": "",
    "tf_data_experimental_slack": "",
    "benchmark_logger_type": "",
    "benchmark_log_dir": "",
    "benchmark_test_id": "",
    "gcp_project": "",
    "bigquery_data_set": "",
    "bigquery_run_table": "",
    "bigquery_run_status_table": "",
    "bigquery_metric_table": "",
    "worker_hosts": _CLUSTER,
    "task_index": _CLUSTER,
}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Declares the reference runner's flags, with its short names and defaults.

  Args:
    flag_values: Where to declare them; a private `FlagValues` in tests.
  """
  definers = tuple(functools.partial(define, flag_values=flag_values)
                   for define in (flags.DEFINE_string, flags.DEFINE_integer,
                                  flags.DEFINE_boolean, flags.DEFINE_enum))
  _define_honoured(*definers)
  _define_gpu_only(*definers)
  _define_unread(*definers)


def _define_honoured(string, integer, boolean, enum) -> None:
  """The flags `reference_runner.translate` maps onto the experiment."""
  string("data_dir", "/tmp", f"Directory of {TRAIN_FILES} and "
         f"{VALIDATION_FILES} TFRecords.", short_name="dd")
  string("model_dir", "/tmp", "Where checkpoints and summaries go.",
         short_name="md")
  boolean("clean", False, "Remove model_dir first (only if it holds nothing "
          "but run outputs).")
  integer("batch_size", 32, "Global batch size, split across replicas.",
          short_name="bs")
  integer("train_epochs", 1, "Epochs to train.", short_name="te")
  integer("epochs_between_evals", 1, "Epochs between evaluations.",
          short_name="ebe")
  integer("train_steps", None, "Steps to train, capped at one epoch; "
          "implies one epoch (reference behaviour).")
  boolean("use_synthetic_data", False, "Random images instead of TFRecords.",
          short_name="synth")
  boolean("skip_eval", False, "Train only.")
  integer("num_gpus", 1, "GPUs: 0 for the CPU, -1 for all visible.",
          short_name="ng")
  string("distribution_strategy", "mirrored", f"One of {STRATEGIES}.",
         short_name="ds")
  string("tpu", "", "Cloud TPU name or grpc:// address.")
  enum("dtype", "fp32", list(DTYPES), "Compute dtype.", short_name="dt")
  enum("fp16_implementation", "keras", ["keras", "graph_rewrite"], "With "
       "--dtype=fp16: 'keras' trains in mixed float16, 'graph_rewrite' in "
       "float32 (what the reference does in TF2).")
  string("loss_scale", None, "fp16 loss scale: a number or 'dynamic' "
         "(default 128).", short_name="ls")
  integer("steps_per_loop", None, "Steps per host loop; default and cap: one "
          "epoch.")
  boolean("use_tf_while_loop", True, "Loop on the device (tf.while_loop).")
  boolean("use_tf_function", True, "Trace train and eval steps.")
  boolean("single_l2_loss_op", False, "One L2 op over all non-BN weights.")
  boolean("enable_eager", False, "Accepted; no effect (as in the reference).")
  boolean("enable_tensorboard", False, "Step-level summaries every loop.")
  boolean("enable_checkpoint_and_export", False,
          "Checkpoint every 5 loops, keeping 10.")
  boolean("enable_xla", False, "Compile the train step with XLA.")
  integer("datasets_num_private_threads", None,
          "Private tf.data thread pool size.")
  boolean("training_dataset_cache", False, "Cache training records in memory.")
  enum("data_format", None, ["channels_first", "channels_last"],
       "Model data format; default by device.", short_name="df")
  string("profile_steps", None, "'first,last' global steps to profile.")
  integer("log_steps", 100, "Steps between examples/second reports.")
  string("all_reduce_alg", None, "Mirrored all-reduce algorithm.",
         short_name="ara")
  integer("num_packs", 1, "Gradient packs for all-reduce.")


def _define_gpu_only(string, integer, boolean, unused_enum) -> None:
  """The flags in `GPU_ONLY`."""
  string("tf_gpu_thread_mode", None, "GPU only: TF_GPU_THREAD_MODE, e.g. "
         "'gpu_private' (a thread pool per GPU).", short_name="gt_mode")
  integer("per_gpu_thread_count", 0, "GPU only, with --tf_gpu_thread_mode: "
          "threads per GPU (0: 2).", short_name="pgtc")
  boolean("batchnorm_spatial_persistent", True, "GPU only: cuDNN's spatial "
          "persistent batch norm kernel.")


def _define_unread(string, integer, boolean, enum) -> None:
  """The flags in `UNREAD`, with the reference's types and defaults."""
  def ignored(name):
    instead = f"; {UNREAD[name]}" if UNREAD[name] else ""
    return f"Ignored: the reference CTL runner never reads it{instead}."

  for name, default in (("run_eagerly", False),
                        ("report_accuracy_metrics", True),
                        ("enable_get_next_as_optional", False),
                        ("explicit_gpu_placement", False),
                        ("use_trivial_model", False),
                        ("use_tensor_lr", True),
                        ("set_learning_phase_to_train", True),
                        ("tf_data_experimental_slack", False)):
    boolean(name, default, ignored(name))
  enum("benchmark_logger_type", "BaseBenchmarkLogger",
       ["BaseBenchmarkLogger", "BenchmarkFileLogger"],
       ignored("benchmark_logger_type"))
  for name, default, short_name in (
      ("benchmark_log_dir", None, "bld"),
      ("benchmark_test_id", None, "bti"),
      ("gcp_project", None, "gp"),
      ("bigquery_data_set", "test_benchmark", "bds"),
      ("bigquery_run_table", "benchmark_run", "brt"),
      ("bigquery_run_status_table", "benchmark_run_status", "brst"),
      ("bigquery_metric_table", "benchmark_metric", "bmt"),
      ("worker_hosts", None, None)):
    string(name, default, ignored(name), short_name=short_name)
  integer("task_index", -1, ignored("task_index"))


def notes(fv, gpus_visible: int) -> List[str]:
  """Returns one warning per flag passed that does nothing in this run.

  Args:
    fv: Parsed flags from `define_flags`.
    gpus_visible: GPUs this machine shows; with none, a GPU-only flag the
      user passed has no effect.
  """
  found = []
  if not gpus_visible:
    found += [f"--{name}={_text(fv[name].value)} has no effect: no GPU is "
              f"visible (on a GPU it sets {env}, as in the reference)."
              for name, env in GPU_ONLY.items() if fv[name].present]
  elif fv.per_gpu_thread_count and not fv.tf_gpu_thread_mode:
    found.append(f"--per_gpu_thread_count={fv.per_gpu_thread_count} has no "
                 "effect without --tf_gpu_thread_mode, as in the reference.")
  for name, instead in UNREAD.items():
    if fv[name].value != fv[name].default:
      hint = f"; {instead}" if instead else ""
      found.append(f"--{name}={_text(fv[name].value)} is ignored: the "
                   f"reference CTL runner never reads it{hint}.")
  return found


def configure_gpus(fv) -> None:
  """Sets the GPU thread mode and cuDNN batch norm mode as the reference does.

  Call it only when a GPU is visible, before TensorFlow initialises the
  GPUs (the variables are read then). Thread mode and count go through the
  reference's own `keras_utils.set_gpu_thread_mode_and_count`; the batch
  norm mode repeats `common.set_cudnn_batchnorm_mode`, which reads the
  global `FLAGS` instead of taking them.
  """
  if fv.tf_gpu_thread_mode:
    keras_utils.set_gpu_thread_mode_and_count(
        per_gpu_thread_count=fv.per_gpu_thread_count,
        gpu_thread_mode=fv.tf_gpu_thread_mode,
        num_gpus=fv.num_gpus,
        datasets_num_private_threads=fv.datasets_num_private_threads)
  if fv.batchnorm_spatial_persistent:
    os.environ[CUDNN_BATCHNORM_ENV] = "1"
  else:
    os.environ.pop(CUDNN_BATCHNORM_ENV, None)
  logging.info("%s=%s", CUDNN_BATCHNORM_ENV,
               os.environ.get(CUDNN_BATCHNORM_ENV, "(unset)"))


def _text(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)
