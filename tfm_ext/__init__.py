"""tfm_ext: pluggable trainers for TensorFlow Model Garden.

    import tfm_ext

    @tfm_ext.register_trainer("mine")
    class MyTrainer(tfm_ext.CustomTrainer):
      def train_loop_end(self):
        logs = super().train_loop_end()
        ...
        return logs

    @tfm_ext.register_model("my_convnet")
    def build(model_config):
      return tf_keras.Sequential([...])

    @tfm_ext.register_action("notify", phase="eval")
    def notify(context: tfm_ext.ActionContext):
      return lambda output: ...  # After every evaluation of every run.

Select the trainer with `--trainer=mine`, `--params_override=trainer.name=mine`
or the gin binding `tfm_ext.trainer.name = 'mine'`. Experiments and tasks stay
in TFM's `exp_factory` and `task_factory`. The driver is `tfm_ext.run.launcher`
(it defines absl flags, so it is not imported here); `tfm-ext-train` and
`python -m tfm_ext` run it.

What is stable: the names below (`__all__`), the launchers' command lines,
and for a fork of the launcher `tfm_ext.run.launcher` (import it first, then
the registrations, then `app.run(tfm_ext.run.launcher.main)`). The
subpackages are the library's concepts, each with a docstring that says
what it holds: `run` (from the command line to an exit code), `config`
(the operative config and its checks), `training` (the trainer, its
registries and input), `actions` (what runs around each loop and
evaluation), `model_dir` (every record a run keeps). Their modules may
change between versions. A change to what is stable keeps the old name
or path working for a release, with a `DeprecationWarning` naming the new
one: `tfm_ext.launcher` and `tfm_ext.ranking` (before 0.2.0's move into
subpackages) go in 0.3.0. `tests/e2e/test_stable_api.py` pins all of it.

The names below load on first use (PEP 562), so that `import
tfm_ext.run.launcher` can quiet TensorFlow and pause the garbage collector
before TensorFlow loads (`tfm_ext.base.startup`).
"""

import importlib
import os as _os
from typing import Any

from tfm_ext.base import registry as _registry
from tfm_ext.base import startup as _startup

# A notebook's cell that registers an experiment may run again.
_registry.allow_definitions_again()
# TensorFlow, loaded after this import, logs natively at warning level and
# up, as under a launcher (a value the user set wins).
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.2.1"

# Public name -> the module that defines it.
_EXPORTS = {
    "ActionContext": "tfm_ext.actions",
    "register_action": "tfm_ext.actions",
    "RunAction": "tfm_ext.actions",
    "CustomTrainer": "tfm_ext.training.custom_trainer",
    "UsageError": "tfm_ext.base.errors",
    "RunFailed": "tfm_ext.base.errors",
    "Preempted": "tfm_ext.base.errors",
    "ServingInputs": "tfm_ext.model_dir.export",
    "run_experiment": "tfm_ext.run.experiment",
    "launch": "tfm_ext.run.experiment",
    "load": "tfm_ext.run.experiment",
    "build_model": "tfm_ext.training.models",
    "MODELS": "tfm_ext.training.models",
    "register_model": "tfm_ext.training.models",
    "Registry": "tfm_ext.base.registry",
    "RegistryError": "tfm_ext.base.registry",
    "get_trainer": "tfm_ext.training.trainers",
    "register_trainer": "tfm_ext.training.trainers",
    "TrainerConfig": "tfm_ext.training.trainers",
    "TRAINERS": "tfm_ext.training.trainers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f"module 'tfm_ext' has no attribute {name!r}")
  # TensorFlow loads as a launcher loads it (`tfm_ext.base.startup`): its
  # native INFO lines and CUDA's cuInit line quiet, in a notebook too.
  _startup.begin(signals=False)
  try:
    module = importlib.import_module(_EXPORTS[name])
  finally:
    _startup.end()
  value = getattr(module, name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
