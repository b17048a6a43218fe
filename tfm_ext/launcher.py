"""The training driver: TFM's `train.py` flags, plus `--trainer` and `--list`.

A downstream repository forks it in three lines:

    from absl import app
    import tfm_ext.launcher
    import my_project.registry_imports  # registers experiments, trainers...
    app.run(tfm_ext.launcher.main)

Exit codes: 0 done; 2 bad input (unknown names, malformed YAML, unknown
override keys, bad gin, unsplittable batches, empty input patterns, `eval`
without a checkpoint), printed as one paragraph before `model_dir` is
touched; 3 the run failed on its data (corrupt records, a NaN loss), the last
checkpoint intact; 42 preempted (SIGTERM or SIGINT): a checkpoint was saved
at the current step, relaunch the same command to resume.
"""

import os

from absl import flags

from official.core import task_factory

from tfm_ext import driver
from tfm_ext import job
from tfm_ext import models
from tfm_ext import modes
from tfm_ext import params as params_lib
from tfm_ext import run_summary
from tfm_ext import trainers
from tfm_ext.errors import UsageError



flags.DEFINE_string("experiment", None, "Registered experiment to run.")
flags.DEFINE_string("mode", None, f"One of: {', '.join(modes.MODES)}.")
flags.DEFINE_string("model_dir", None,
                    "Where checkpoints, summaries and records go.")
flags.DEFINE_multi_string(
    "config_file", None,
    "YAML overrides of the experiment, applied in the order given.")
flags.DEFINE_string("params_override", None,
                    "YAML string or file applied after --config_file.")
flags.DEFINE_multi_string("gin_file", None, "Gin files to parse.")
flags.DEFINE_multi_string("gin_params", None, "Gin bindings to parse.")
flags.DEFINE_string("tpu", None, "Cloud TPU name or grpc:// address.")
flags.DEFINE_string("trainer", None,
                    "Registered trainer; beats the config and gin.")
flags.DEFINE_integer(
    "max_restarts", 3,
    "In-process restarts after transient errors (UnavailableError, "
    "AbortedError) before the job fails.")
flags.DEFINE_float("restart_backoff_seconds", 2.0,
                   "Wait before the n-th restart: this times 2**(n-1).")
flags.DEFINE_bool(
    "allow_config_change", False,
    "Resume a model_dir even though the config differs from its params.yaml "
    "in more than cadence fields (train_steps, intervals...).")
flags.DEFINE_bool("list", False,
                  "List registered experiments, tasks, trainers and models.")

FLAGS = flags.FLAGS


def registered() -> str:
  """Returns the registered experiments, tasks, trainers and models."""
  tasks = sorted(cls.__name__ for cls in
                 task_factory._REGISTERED_TASK_CLS.values())  # pylint: disable=protected-access
  sections = [("experiments", params_lib.experiment_names()),
              ("tasks", tasks),
              ("trainers", trainers.TRAINERS.names()),
              ("models", models.MODELS.names())]
  return "\n".join(f"{title}:\n" + "".join(f"  {n}\n" for n in names)
                   for title, names in sections)


def main(argv) -> None:
  """Runs the experiment the flags describe; see the module docstring."""
  del argv
  if FLAGS.list:
    print(registered(), end="")
    return
  try:
    plan = driver.prepare(_request())
  except UsageError as e:
    job.exit_with(e, UsageError.EXIT_CODE)
  summary = job.run(plan, driver.Recovery(
      max_restarts=FLAGS.max_restarts,
      backoff_seconds=FLAGS.restart_backoff_seconds))
  path = os.path.join(plan.request.model_dir,
                      run_summary.summary_filename(plan.mode.trains))
  written = f" | summary {path}" if summary.chief else ""
  print(f"done | {summary.mode} | step {summary.global_step} | "
        f"{summary.wall_seconds:.1f}s{written}")


def _request() -> driver.RunRequest:
  missing = [name for name in ("experiment", "mode", "model_dir")
             if not FLAGS[name].value]
  if missing:
    raise UsageError("Missing required flags: " + ", ".join(
        f"--{m}" for m in missing) + ". (--list shows what is registered.)")
  mode = modes.get_mode(FLAGS.mode)
  model_dir = os.path.expanduser(FLAGS.model_dir)
  params_lib.parse_gin(FLAGS.gin_file, FLAGS.gin_params)
  sources = params_lib.ConfigSources(
      experiment=FLAGS.experiment,
      config_files=FLAGS.config_file or (),
      params_override=FLAGS.params_override or "",
      tpu=FLAGS.tpu or "",
      trainer=FLAGS.trainer or "")
  params = params_lib.build(sources)
  if not mode.trains:
    params = params_lib.follow_trainer(sources, params, model_dir,
                                       wait=mode.waits_for_trainer)
  return driver.RunRequest(
      experiment=FLAGS.experiment, mode=FLAGS.mode,
      model_dir=model_dir, params=params,
      start_time=run_summary.process_start_time(),
      allow_config_change=FLAGS.allow_config_change)
