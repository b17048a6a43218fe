"""The training driver: every flag of TFM's `train.py`, and a few of ours.

Installed, it is `tfm-ext-train` and `python -m tfm_ext`; `--registry=MODULE`
(repeatable) imports a downstream repository's registrations. A downstream
repository may instead fork it in three lines, and gets the same quiet, fast
start (`tfm_ext.base.startup`) by importing this module first:

    from absl import app
    import tfm_ext.run.launcher
    import my_project.registry_imports  # registers experiments, trainers...
    app.run(tfm_ext.run.launcher.main)

The embedded default experiment, `digits_convnet`, is always registered.

Exit codes (`tfm_ext.base.failures`, the one boundary every failure goes
through): 0 done; 2 bad input (unknown names, malformed YAML, unknown
override keys, bad gin, unsplittable batches, empty input patterns, `eval`
without a checkpoint, an unusable `--model_dir`), printed as one paragraph
before `model_dir` is touched, or a checkpoint that does not fit the model;
3 the run failed on its data (corrupt records, a NaN loss), the last
checkpoint intact; 4 its storage failed while running (a full disk, a lost
permission), nothing lost; 42 preempted (SIGTERM, SIGINT or SIGHUP, at any
moment): a checkpoint was saved at the current step, or there was nothing
to save yet (start-up, an evaluator), as the one `preempted:` line says, or
a second signal aborted it; relaunch the same command to resume; 1 a bug,
with its traceback.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
from tfm_ext.base import startup

startup.begin(signals=False)  # An import changes no signal handler.

import sys

from absl import app
from absl import flags
from absl import logging

from official.common import flags as tfm_flags

from tfm_ext.config import params as params_lib
from tfm_ext.examples import digits_convnet  # pylint: disable=unused-import
from tfm_ext.model_dir import run_summary
from tfm_ext.model_dir import tfm_serving
from tfm_ext.run import driver
from tfm_ext.run import modes

startup.end()
# pylint: enable=g-import-not-at-top,wrong-import-position

# TFM's train.py flags, defined by TFM: its names, types, defaults and help.
tfm_flags.define_flags()
FLAGS = flags.FLAGS
# TFM's --mode is an enum that takes two modes train_lib cannot run and turns
# any other name into absl's "FATAL Flags parsing error" (exit 1). Ours takes
# any name; `modes.get_mode` refuses unknown ones, with the list (exit 2).
delattr(FLAGS, "mode")
flags.DEFINE_string("mode", None, f"Mode to run: {', '.join(modes.MODES)}.")
# TFM's train.py defines this one itself. It defaults to true there; here it
# is off, so a run keeps the synchronous saves that the preemption and
# kill -9 tests cover unless the user asks for it.
flags.DEFINE_bool(
    "enable_async_checkpointing", False,
    "Save checkpoints in a background thread, as TFM's train.py does by "
    "default; training waits for a save only at the end of Orbit's "
    "train() and before the next save.")

flags.DEFINE_string("trainer", None,
                    "Registered trainer; beats the config and gin.")
flags.DEFINE_integer(
    "max_restarts", 3,
    "In-process restarts after transient errors (UnavailableError, "
    "AbortedError) before the job fails.")
flags.DEFINE_float("restart_backoff_seconds", 2.0,
                   "Wait before the n-th restart: this times 2**(n-1).")
flags.DEFINE_string(
    "checkpoint_path", None,
    "For --mode=export, the checkpoint to export, as TFM's export scripts "
    "take it: a checkpoint's prefix (MODEL_DIR/ckpt-300), a directory (its "
    "latest) or a step (300). Default: the best (of equal values, the "
    "older), else the latest.")
# TFM's official/vision/serving/export_saved_model.py flags, for --mode=export
# of TFM's vision tasks (tfm_ext.model_dir.tfm_serving).
flags.DEFINE_string(
    "input_type", None,
    "For --mode=export of TFM's vision tasks: one of `image_tensor` (the "
    "default), `image_bytes`, `tf_example` and `tflite`.")
flags.DEFINE_integer(
    "batch_size", None,
    "For --mode=export of TFM's vision tasks: the signature's batch size. "
    "Default: any.")
flags.DEFINE_string(
    "input_image_size", None,
    "For --mode=export of TFM's vision tasks: height,width (a video's "
    "frames,height,width). Default: the size the task's evaluation feeds "
    "its model, else 224,224.")
# TFM's official/nlp/serving/export_savedmodel.py flags (nlp_serving).
flags.DEFINE_string("function_keys", None, "For --mode=export of TFM's NLP "
                    "tasks: the function served (default: serve).")
flags.DEFINE_string("serving_params", None, "For --mode=export of TFM's NLP "
                    "tasks: the module's Params (YAML, JSON or k=v,...).")
flags.DEFINE_bool(
    "allow_config_change", False,
    "Resume a model_dir even though the config differs from its params.yaml "
    "in more than cadence fields (train_steps, intervals...).")
flags.DEFINE_bool("list", False,
                  "List registered experiments, tasks, trainers, models and "
                  "actions, each with a line on what it is.")
flags.DEFINE_bool(
    "print_config", False,
    "Print the operative config of --experiment as YAML, every file, "
    "override and flag applied, and write nothing.")
flags.DEFINE_string(
    "notify_url", None,
    "POST the run's progress as JSON to this URL after each training loop "
    "and evaluation, and when it ends (tfm_ext.actions.notify); beats "
    "runtime.notify_url and, unlike it, is not saved in params.yaml.")
flags.DEFINE_multi_string(
    "registry", None,
    "A module to import for its registrations (experiments, tasks, trainers, "
    "models, actions), e.g. my_project.registry_imports; repeatable.")

# `--help` lists the key flags of the main module, and the launcher script
# (ours or a fork's three lines) defines none: the flags above are its.
for _flag in (FLAGS.get_flags_for_module(__name__)
              + FLAGS.get_flags_for_module(tfm_flags.__name__)):
  FLAGS.register_key_flag_for_module(sys.argv[0], _flag)



class _AnsweredHelp:
  """A help flag that exits 0: absl's print the help and exit 1."""

  def parse(self, arg):
    try:
      super().parse(arg)  # pytype: disable=attribute-error
    except SystemExit as e:
      raise SystemExit(0 if e.code == 1 else e.code) from None


app.define_help_flags()
for _name in ("help", "helpshort", "helpfull", "helpxml"):
  _absl_help = type(FLAGS[_name])
  for _key in {_name, FLAGS[_name].short_name} - {None}:
    delattr(FLAGS, _key)
  flags.DEFINE_flag(type(_absl_help.__name__, (_AnsweredHelp, _absl_help),
                         {})(), module_name=app.__name__)

# TFM's flags that its open-source train.py defines and never reads.
UNREAD_TFM_FLAGS = ("tpu_platform", "tfhub_handle", "tflex_output_uri")


def main(argv) -> None:
  """Runs the experiment the flags describe; see the module docstring."""
  del argv
  driver.main(_request)


def _request() -> driver.RunRequest:
  """The request the flags make (in the job's error boundary)."""
  params_lib.check_command_line(sys.argv[1:], FLAGS)
  shown = "list" if FLAGS.list else "config" if FLAGS.print_config else ""
  given = dict(
      experiment=FLAGS.experiment or "", sources=_sources(),
      gin_files=FLAGS.gin_file or (), gin_params=FLAGS.gin_params or (),
      registry=FLAGS.registry or (), show=shown)
  if shown:
    return driver.RunRequest(mode="", model_dir="", **given)
  for name in UNREAD_TFM_FLAGS:
    if FLAGS[name].value:
      logging.warning("--%s=%s has no effect: TFM's train.py does not read "
                      "it either.", name, FLAGS[name].value)
  return driver.RunRequest(
      mode=FLAGS.mode or "", model_dir=FLAGS.model_dir or "",
      start_time=run_summary.process_start_time(),
      allow_config_change=FLAGS.allow_config_change,
      enable_async_checkpointing=FLAGS.enable_async_checkpointing,
      notify_url=FLAGS.notify_url or "",
      checkpoint_path=FLAGS.checkpoint_path or "",
      serving=tfm_serving.ServingOptions.from_flags(
          input_type=FLAGS.input_type, batch_size=FLAGS.batch_size,
          input_image_size=FLAGS.input_image_size,
          function_keys=FLAGS.function_keys,
          serving_params=FLAGS.serving_params),
      max_restarts=FLAGS.max_restarts,
      restart_backoff_seconds=FLAGS.restart_backoff_seconds,
      **given)


def _sources() -> params_lib.ConfigSources:
  return params_lib.ConfigSources(
      experiment=FLAGS.experiment,
      config_files=FLAGS.config_file or (),
      params_override=FLAGS.params_override or "",
      tpu=FLAGS.tpu or "",
      tf_data_service=FLAGS.tf_data_service or "",
      trainer=FLAGS.trainer or "")
