"""Which experiments a run can name, and where TFM's other ones come from.

Stock TFM's `official/vision/train.py` imports `official.vision.
registry_imports`, which registers TFM's vision experiments
(`resnet_imagenet`, `retinanet_resnetfpn_coco`, `seg_deeplabv3_pascal`...)
and their tasks. The launcher registers the same, without a flag, but only
where a run needs them: it names an experiment nobody else registered,
gives gin bindings (which may name their configurables, as with stock), or
lists what is registered (`--list`). A run of digits_convnet or of a
downstream repository's experiment does not pay for their import
(start-up against stock's: benchmarks/RESULTS.md#first-step-resnet-imagenet). A downstream registration of the
same name comes first, as its `--registry` module is imported before.

An experiment that is still unknown is looked up in TFM's source: the error
says which module registers it and which `--registry=` brings it in
(`unknown_message`).
"""

import difflib
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import gin

from official.core import exp_factory
from official.core import task_factory

from tfm_ext.base import failures
from tfm_ext.base.errors import UsageError

# What stock's train.py imports for its registrations.
DEFAULTS = ("official.vision.registry_imports",)

# `--registry` modules for TFM's families that register experiments and
# their tasks together; an experiment of a family not here is named with
# the module that registers it.
FAMILIES = {
    "official/nlp/": "official.common.registry_imports",
    "official/vision/": "official.vision.registry_imports",
    # TFM's RankingTask and RankingTrainer, as tfm_ext runs them.
    "official/recommendation/ranking/": "tfm_ext.training.ranking",
}
EXAMPLES = ("official.common.registry_imports (TFM's NLP experiments)",
            "tfm_ext.training.ranking (DLRM, DCN)",
            "official.projects.maxvit.registry_imports",
            "my_project.registry_imports")

_REGISTERED_AS = re.compile(
    r"register_config_factory\(\s*['\"]([^'\"]+)['\"]")


def registered() -> Dict[str, Callable[[], Any]]:
  """Every registered experiment's factory by the name TFM gives it.

  TFM's registry nests a name with slashes (`bert/sentence_prediction` is
  `["bert"]["sentence_prediction"]`); a group (`bert`) is no experiment.
  """
  return dict(_leaves(exp_factory._REGISTERED_CONFIGS))  # pylint: disable=protected-access


def _leaves(collection: Dict[str, Any], prefix: str = ""):
  for key, value in collection.items():
    if isinstance(value, dict):
      yield from _leaves(value, f"{prefix}{key}/")
    else:
      yield f"{prefix}{key}", value


def names() -> List[str]:
  """The experiments registered now, sorted, nested ones as `a/b`."""
  return sorted(registered())


def load_defaults() -> None:
  """Registers what stock's `train.py` registers (`DEFAULTS`); idempotent.

  Gin may be finalized by then (the Python API, an evaluator following its
  trainer): their configurables are added to it all the same.
  """
  with gin.unlock_config():
    for module in DEFAULTS:
      importlib.import_module(module)


def register_for(experiment: str, gin_given: bool) -> None:
  """Registers the defaults where a run needs them, before gin is parsed.

  That is where `experiment` is registered by no one else, or gin
  bindings are given (they may name the defaults' configurables, as they
  may with stock's `train.py`).
  """
  if gin_given or experiment not in registered():
    load_defaults()


def is_known(name: str) -> bool:
  """Whether `name` is registered, after the defaults if it was not."""
  if name in registered():
    return True
  load_defaults()
  return name in registered()


def unknown_message(name: str) -> str:
  """Says `name` is unknown, the closest registered ones, how to add more.

  A registry module it names is one that was imported here and registered
  `name` and its task (`registry_registering`), not a guess from a path.
  """
  load_defaults()
  known = names()
  message = f"Unknown experiment {name!r}."
  group = [n for n in known if n.startswith(f"{name.rstrip('/')}/")]
  if group:
    return message + (f" {name!r} is a group of TFM's registry, not an "
                      "experiment; its experiments: "
                      + ", ".join(f"--experiment={n}" for n in group) + ".")
  close = difflib.get_close_matches(name, known, n=3)
  if close:
    message += f" Did you mean {close[0]!r}?"
  if close[1:]:
    message += " (Also close: " + ", ".join(map(repr, close[1:])) + ".)"
  where = tfm_module_registering(name)
  if where:
    registry, failed = registry_registering(name, where)
    if registry:
      return message + (f" TFM's {where} registers it: pass "
                        f"--registry={registry}.")
    apart = registries_apart(name, where)
    if apart:
      return message + (f" TFM's {where} registers it, and {apart[1]} its "
                        "task: pass " + " ".join(
                            f"--registry={m}" for m in apart) + ".")
    return message + (f" TFM's {where} registers it, but it cannot be "
                      f"imported here: {failed}")
  return message + (
      f" {len(known)} are registered (--list shows them): this "
      "repository's or tfm_ext's, TFM's vision experiments and those of "
      "each --registry module. --registry=MODULE (repeatable) imports more, e.g. "
      + ", ".join(f"--registry={e}" for e in EXAMPLES) + ".")


def tfm_module_registering(name: str) -> Optional[str]:
  """The module of TFM's source that registers experiment `name`, or None.

  Read as text, not imported: most of TFM's families need packages of
  their own.
  """
  return next(_tfm_modules(lambda text: name in _REGISTERED_AS.findall(text)),
              None)


def _tfm_modules(matches: Callable[[str], Any]):
  """The modules of TFM's source (tests left out) whose text `matches`."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(exp_factory.__file__)))
  top = os.path.dirname(root)
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for file in sorted(files):
      if not file.endswith(".py") or file.endswith("_test.py"):
        continue
      path = os.path.join(folder, file)
      try:
        with open(path, encoding="utf-8") as f:
          text = f.read()
      except (OSError, UnicodeError):
        continue
      if matches(text):
        yield os.path.relpath(path, top)[:-len(".py")].replace(os.sep, ".")


def registries_apart(name: str, module: str) -> List[str]:
  """`[module, M]`: TFM's `module` registers experiment `name` and M its
  task, where no registry module imports both (DETR: `configs.detr` and
  `tasks.detection`, which its own train.py imports); [] if none does.

  M is found by its text (`register_task_cls(<the task config's class>)`,
  nearest to `module` first) and checked by importing it, after `module`
  (`registry_registering` imported it).
  """
  factory = registered().get(name)
  try:
    task_class = type(factory().task) if factory else None
  except Exception as e:  # pylint: disable=broad-except
    failures.reraise_interrupt(e)
    task_class = None
  if task_class is None:
    return []
  registers = re.compile(r"register_task_cls\(\s*(?:[\w.]+\.)?"
                         + re.escape(task_class.__name__) + r"\s*\)")
  shared = lambda m: len(os.path.commonprefix([m.split("."), module.split(".")]))
  for candidate in sorted(_tfm_modules(registers.search), key=shared,
                          reverse=True):
    try:
      with gin.unlock_config():
        importlib.import_module(candidate)
    except Exception as e:  # pylint: disable=broad-except
      failures.reraise_interrupt(e)
      continue
    if _registers_task(name):
      return [module, candidate]
  return []


def registry_for(module: str) -> str:
  """The `--registry` that registers `module`'s experiments and their tasks.

  Checked by importing the candidates (`registry_registering`) where the
  experiment is known; else the first candidate, or `module` itself.
  """
  return next(iter(_candidates(module)), module)


def registry_registering(name: str, module: str) -> Tuple[str, str]:
  """(the first candidate registry of `module` that, imported, registers
  experiment `name` and its task; '') or ('', why none did)."""
  why = f"no registry module of {module} registers it and its task."
  for candidate in _candidates(module):
    try:
      with gin.unlock_config():
        importlib.import_module(candidate)
    except Exception as e:  # pylint: disable=broad-except
      # Any error of a module of TFM's that needs packages of its own.
      failures.reraise_interrupt(e)
      why = f"importing {candidate} failed: {type(e).__name__}: {e}"
      continue
    if _registers_task(name):
      return candidate, ""
  return "", why


def _registers_task(name: str) -> bool:
  """Whether experiment `name` is registered and so is its task."""
  factory = registered().get(name)
  if factory is None:
    return False
  try:
    task_config = factory().task
  except Exception as e:  # pylint: disable=broad-except
    failures.reraise_interrupt(e)
    return False
  return type(task_config) in task_factory._REGISTERED_TASK_CLS  # pylint: disable=protected-access


def _candidates(module: str) -> List[str]:
  """The modules that may register `module`'s experiments and tasks: its
  family's (`FAMILIES`), a `registry_imports` of its project (nearest
  first), then `module` itself."""
  path = module.replace(".", "/") + "/"
  found = [family for prefix, family in FAMILIES.items()
           if path.startswith(prefix)]
  package = module.rsplit(".", 1)[0]
  while package.count(".") >= 2:  # official.projects.X.configs -> X
    spec = _find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
      found += [name for name in _registry_files(folder, package)
                if name not in found]
    package = package.rsplit(".", 1)[0]
  return found + [module]


def _registry_files(folder: str, package: str) -> List[str]:
  """The `registry_imports` modules of `package` (in `folder`), nearest
  first: found by their files, not imported (a package's import may need
  what is not installed, or add gin configurables when gin is locked)."""
  names = []
  for root, dirs, files in os.walk(folder):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    if "registry_imports.py" in files:
      parts = os.path.relpath(root, folder).split(os.sep)
      names.append(".".join([package] + [p for p in parts if p != "."]
                            + ["registry_imports"]))
  return sorted(names, key=lambda name: (name.count("."), name))


def _find_spec(name: str):
  try:
    return importlib.util.find_spec(name)
  except ImportError:
    return None


def import_registries(modules) -> None:
  """Imports each `--registry` module; one that fails is a `UsageError`."""
  for module in modules or ():
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise UsageError(f"--registry={module} cannot be imported: {e}."
                       f"{_where_python_looked(module, e)}") from e


def _where_python_looked(module: str, error: ImportError) -> str:
  """What to do when `module` (or its package) is not on `sys.path`."""
  top = module.split(".")[0]
  if not isinstance(error, ModuleNotFoundError) or error.name not in (
      module, top) and not module.startswith(f"{error.name}."):
    return f" ({module} was found; one of its own imports failed.)"
  parent, _, name = (error.name or "").rpartition(".")
  if parent:  # The package is there; the module in it is not.
    package = sys.modules.get(parent)
    where = list(getattr(package, "__path__", []))
    found = sorted(info.name for info in pkgutil.iter_modules(where))
    close = difflib.get_close_matches(name, found, n=1)
    return (f" The package {parent} was found ({', '.join(where)}), and it "
            f"has no module {name!r}" + (
                f": did you mean --registry={parent}.{close[0]}?" if close
                else f"; its modules: {', '.join(found) or 'none'}."))
  cwd = os.getcwd()
  on_path = cwd in map(os.path.abspath, filter(None, sys.path)) or (
      "" in sys.path)
  return (f" Python looked for {top!r} in the current directory ({cwd}, "
          f"{'on' if on_path else 'NOT on'} its path) and in the installed "
          "packages. Run from the directory that holds "
          f"{top}/ (`tfm-ext-train` and `python -m tfm_ext` add it), add that "
          f"directory with PYTHONPATH=DIR, or `pip install -e` the project.")
