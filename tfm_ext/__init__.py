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
in TFM's `exp_factory` and `task_factory`. The driver is `tfm_ext.launcher`
(it defines absl flags, so it is not imported here); `tfm-ext-train` and
`python -m tfm_ext` run it.

The names below load on first use (PEP 562), so that `import
tfm_ext.launcher` can quiet TensorFlow and pause the garbage collector
before TensorFlow loads (`tfm_ext._startup`).
"""

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "ActionContext": "tfm_ext.actions",
    "register_action": "tfm_ext.actions",
    "CustomTrainer": "tfm_ext.custom_trainer",
    "UsageError": "tfm_ext.errors",
    "run_experiment": "tfm_ext.experiment",
    "build_model": "tfm_ext.models",
    "MODELS": "tfm_ext.models",
    "register_model": "tfm_ext.models",
    "Registry": "tfm_ext.registry",
    "RegistryError": "tfm_ext.registry",
    "get_trainer": "tfm_ext.trainers",
    "register_trainer": "tfm_ext.trainers",
    "TrainerConfig": "tfm_ext.trainers",
    "TRAINERS": "tfm_ext.trainers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f"module 'tfm_ext' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
