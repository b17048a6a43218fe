"""A TFM project's task served by its project's own export module.

A project of TFM's (`official/projects/<name>/`) that serves its models
ships `official.projects.<name>.serving`: an export module (a class of
`export_base.ExportModule`, or a factory `get_export_module` that picks
one by task, as YOLO's does) and an `export_saved_model.py` script that
builds it from its flags and saves it with vision's
`export_saved_model_lib.export_inference_graph`. `--mode=export` of a task
defined in such a project does the same, with the same flags:

    project_export(task, params, options)   None: not a project's task,
                                            or its project serves none
      official.projects.<name>.serving      from the task's module
      its builder: `get_export_module`, else the one module class there
      builder(params=, input_type=, batch_size=, input_image_size=)
                                            what it takes of them
    VisionExport.write(dir)                 export_inference_graph

A task the project's builder does not serve ("not implemented", as TFM's
factories say) and a task of no project take the generic path
(`tfm_ext.model_dir.export`). The scripts are never imported: they
define absl flags at import, which clash with the launcher's and each
other's.

Where this differs from a script, it is in what a script hard-codes
rather than takes from its flags: volumetric_models' builds its module for
a batch of 1 and `--num_channels` (default 1) channels, here the
`--batch_size` given and the module's 3; DeepMAC's builds its module
for `image_tensor` whatever `--input_type` says, which shows for
`tflite` only (its script's module preprocesses; here, as in vision's
exporter, it does not). YOLO's is equal: tests/e2e/test_project_export.py.
"""

import importlib
import importlib.util
import inspect
import pkgutil
from typing import Callable, List, Optional

from absl import logging
import gin

from official.core import config_definitions
from official.core import export_base

from tfm_ext.base.errors import UsageError
from tfm_ext.model_dir import tfm_serving

_PROJECTS = "official.projects."
# What TFM's project factories are called (YOLO's).
_FACTORY = "get_export_module"


def serving_package(*owners) -> Optional[str]:
  """`official.projects.<name>.serving` of the first of `owners` (a task,
  its config) whose class, or a class it derives from (a downstream
  subclass of YOLO's task), a TFM project defines, if that project has one."""
  for cls in (c for owner in owners for c in type(owner).__mro__):
    module = cls.__module__
    if module.startswith(_PROJECTS):
      package = ".".join(module.split(".")[:3]) + ".serving"
      if _spec(package) is not None:
        return package
  return None


def _spec(name: str):
  try:
    return importlib.util.find_spec(name)
  except ImportError:
    return None


def builder(package: str) -> Optional[Callable[..., export_base.ExportModule]]:
  """The export module builder `package` defines: its `get_export_module`,
  else its one `ExportModule` class; None where it has neither, or several
  classes and no factory to choose (logged: which one a script uses cannot
  be told).

  Raises:
    UsageError: a module of `package` cannot be imported (it needs a package
      that is not installed).
  """
  try:
    # Gin is locked by then; their configurables are added all the same.
    with gin.unlock_config():
      modules = [importlib.import_module(name) for name in _library(package)]
  except ImportError as e:
    raise UsageError(
        f"{package}, where this task's project keeps its export module, "
        f"cannot be imported here: {e}. Install what it needs, then export "
        "again.") from e
  factories = [m.__dict__[_FACTORY] for m in modules if _FACTORY in m.__dict__]
  if factories:
    return factories[0]
  classes = [value for m in modules for value in vars(m).values()
             if inspect.isclass(value) and value.__module__ == m.__name__
             and issubclass(value, export_base.ExportModule)]
  if len(classes) == 1:
    return classes[0]
  if classes:
    logging.warning("%s defines %s: not one export module; exported as any "
                    "model is.", package, ", ".join(c.__name__ for c in classes))
  return None


def _library(package: str) -> List[str]:
  """`package`'s modules but its tests and scripts (a `__main__` block)."""
  found = []
  for info in pkgutil.iter_modules(_spec(package).submodule_search_locations,
                                   f"{package}."):
    origin = getattr(_spec(info.name), "origin", None) or ""
    if info.ispkg or info.name.endswith("_test") or not origin.endswith(".py"):
      continue
    with open(origin, encoding="utf-8") as f:
      if "__name__ == '__main__'" in f.read().replace('"', "'"):
        continue
    found.append(info.name)
  return sorted(found)


def project_export(
    task, params: config_definitions.ExperimentConfig,
    options: tfm_serving.ServingOptions) -> Optional[tfm_serving.VisionExport]:
  """The task's project's export module, with a new model; else None.

  Built as the project's `export_saved_model.py` builds it, from a copy of
  `params` (TFM's modules may set fields of theirs; ours are locked) and
  the flags the builder takes; the image size is `--input_image_size`,
  else the task's (`tfm_serving.image_size`). Keras's policy is float32
  while it builds, as in the script.

  Raises:
    UsageError: NLP's flags given (`--function_keys`, `--serving_params`).
  """
  package = serving_package(task, params.task)
  build = builder(package) if package else None
  if build is None:
    return None
  # Like the project's script, it takes no --function_keys.
  tfm_serving.refuse_flags(options, tfm_serving.NLP_FLAGS, "NLP", params.task)
  input_type = options.input_type or tfm_serving.INPUT_TYPES[0]
  size = tfm_serving.image_size(params.task, options)
  # num_channels and input_name are left to the builder's defaults: the
  # scripts' for every project but volumetric_models' (--num_channels=1).
  given = dict(params=params.replace(), input_type=input_type,
               batch_size=options.batch_size, input_image_size=size)
  taken = inspect.signature(build).parameters
  try:
    with tfm_serving.float32():
      module = build(**{k: v for k, v in given.items() if k in taken})
  except (ValueError, NotImplementedError) as e:
    if "not implemented" not in str(e).lower():
      raise
    logging.info("%s serves no %s (%s): exported as any model is.", package,
                 type(params.task).__name__, e)
    return None
  return tfm_serving.VisionExport(module, input_type, options.batch_size, size)
