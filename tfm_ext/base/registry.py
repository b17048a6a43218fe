"""A name -> object registry whose failed lookups list what is registered.

TFM keeps experiments and tasks in `exp_factory` / `task_factory`; trainers and
models live here, one `Registry` each (see `tfm_ext.training.trainers` and
`tfm_ext.training.models`).

A name registered twice is refused, unless the second is the same
definition run again (`same_definition`: a notebook's cell run twice, a
module reloaded): that one replaces the first, with a warning where its
code changed. `allow_definitions_again` gives TFM's `exp_factory` and
`task_factory` the same rule.
"""

import functools
import sys
from typing import Any, Callable, Dict, Generic, List, Optional, TypeVar

from tfm_ext.base.errors import UsageError

T = TypeVar("T")


class RegistryError(UsageError, LookupError):
  """A lookup or registration that a user can fix by changing a name.

  A `UsageError`: where the lookup runs inside the build (a task's model
  name), the run's boundary still reports it as one paragraph, exit 2.
  """


def unknown_name_message(kind: str, name: str, known: List[str],
                         known_as: Optional[str] = None) -> str:
  """Says that `name` is not a known `kind`, lists the known ones and a guess.

  `known_as` heads the list (default: "Registered <kind>s").
  """
  message = f"Unknown {kind} {name!r}."
  import difflib  # pylint: disable=g-import-not-at-top
  close = difflib.get_close_matches(name, known, n=1)
  if close:
    message += f" Did you mean {close[0]!r}?"
  listed = ", ".join(repr(k) for k in known) if known else "(none)"
  return message + f" {known_as or f'Registered {kind}s'}: {listed}."


class _Deferred:
  """An entry `Registry.register_lazily` made, not loaded yet."""

  def __init__(self, load: Callable[[], Any], doc: str):
    self.load = load
    self.__doc__ = doc


class Registry(Generic[T]):
  """Maps names to objects; registering a name twice raises.

  >>> trainers = Registry("trainer")
  >>> @trainers.register("mine")
  ... class MyTrainer: ...
  >>> trainers.get("mine") is MyTrainer
  True
  """

  def __init__(self, kind: str):
    self._kind = kind
    self._entries: Dict[str, T] = {}

  @property
  def kind(self) -> str:
    return self._kind

  def register(self, name: str) -> Callable[[T], T]:
    """Returns a decorator that registers its argument under `name`."""
    if not isinstance(name, str) or not name:
      raise RegistryError(f"A {self._kind} name must be a non-empty string, "
                          f"got {name!r}.")

    def decorator(obj: T) -> T:
      if name in self._entries and _again(self._kind, name,
                                          self._entries[name], obj):
        self._entries[name] = obj
        return obj
      if name in self._entries:
        raise RegistryError(
            f"{self._kind} {name!r} is already registered (to "
            f"{_qualname(self._entries[name])}); cannot register "
            f"{_qualname(obj)} under the same name.")
      self._entries[name] = obj
      return obj

    return decorator

  def register_lazily(self, name: str, load: Callable[[], T],
                      doc: str) -> None:
    """Registers `name` as what `load()` returns, called at its first `get`.

    For an object whose module needs an optional dependency: the name is
    known and listed (`doc` is its line in `--list`) without it; `load`
    imports it once a run asks for the name, and raises `UsageError`
    saying what to install where it cannot.
    """
    self.register(name)(_Deferred(load, doc))

  def get(self, name: str) -> T:
    """Returns the object registered as `name`, or raises `RegistryError`."""
    try:
      entry = self._entries[name]
    except KeyError:
      raise RegistryError(
          unknown_name_message(self._kind, name, self.names())) from None
    if isinstance(entry, _Deferred):
      entry = self._entries[name] = entry.load()
    return entry

  def entries(self) -> Dict[str, Any]:
    """Each name and its object, without loading those registered lazily.

    A lazy entry's value is a placeholder whose `__doc__` is its `doc`.
    """
    return dict(sorted(self._entries.items()))

  def names(self) -> List[str]:
    return sorted(self._entries)

  def __contains__(self, name: str) -> bool:
    return name in self._entries


def same_definition(old: Any, new: Any) -> bool:
  """Whether `new` is `old`'s definition run again: the same module and
  qualified name (a notebook cell's are `__main__`'s), another object."""
  return (old is not new and not isinstance(old, _Deferred)
          and getattr(old, "__module__", None) is not None
          and _qualname(old) == _qualname(new))


def _code(obj) -> Any:
  """What `obj`'s definition compiles to, to tell an edit from a re-run."""
  if isinstance(obj, type):
    return sorted((k, _code(v)) for k, v in vars(obj).items()
                  if callable(v) and hasattr(v, "__code__"))
  code = getattr(obj, "__code__", None)
  return (code.co_code, code.co_consts, code.co_names) if code else None


def _again(kind: str, name: str, old: Any, new: Any) -> bool:
  """Whether `new` replaces `old` (see the module docstring); warns where
  its code changed."""
  if not same_definition(old, new):
    return False
  if _code(old) != _code(new):
    import warnings  # pylint: disable=g-import-not-at-top
    warnings.warn(
        f"{kind} {name!r} registered again by {_qualname(new)}, with other "
        "code: the new definition replaces the one before.", stacklevel=4)
  return True


def allow_definitions_again() -> None:
  """Lets TFM's registries (`exp_factory`, `task_factory`) take a definition
  run again as `Registry` does, from when TFM's registry is imported.

  TFM raises `KeyError: ... registered multiple times` for any second
  registration, so a notebook's cell that registers an experiment fails
  when it runs again. Any other second registration still raises TFM's
  error. Importing TFM loads TensorFlow, so this does not import it: it
  changes TFM's `registry.register` once something else does.
  """
  module = sys.modules.get(_TFM_REGISTRY)
  if module is not None:
    _take_definitions_again(module)
  elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())


_TFM_REGISTRY = "official.core.registry"


class _AfterImport:
  """Runs `_take_definitions_again` on TFM's registry as it is imported."""

  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname != _TFM_REGISTRY:
      return None
    sys.meta_path.remove(self)
    import importlib.util  # pylint: disable=g-import-not-at-top
    spec = importlib.util.find_spec(fullname)
    if spec is not None and spec.loader is not None:
      exec_module = spec.loader.exec_module

      def exec_then(module):
        exec_module(module)
        _take_definitions_again(module)

      spec.loader.exec_module = exec_then
    return spec


def _take_definitions_again(tfm_registry) -> None:
  register = tfm_registry.register
  if getattr(register, "_tfm_ext_again", False):
    return

  @functools.wraps(register)
  def again(registered_collection, reg_key):
    decorator = register(registered_collection, reg_key)

    def registering(fn_or_cls):
      try:
        return decorator(fn_or_cls)
      except KeyError:
        *path, leaf = (reg_key.split("/") if isinstance(reg_key, str)
                       else [reg_key])
        collection = registered_collection
        for entry in path:
          collection = collection.get(entry, {})
        kind = "experiment" if isinstance(reg_key, str) else "task"
        name = getattr(reg_key, "__name__", reg_key)
        if not (isinstance(collection, dict) and leaf in collection
                and _again(kind, name, collection[leaf], fn_or_cls)):
          raise
        collection[leaf] = fn_or_cls
        return fn_or_cls

    return registering

  again._tfm_ext_again = True  # pylint: disable=protected-access
  tfm_registry.register = again


def _qualname(obj) -> str:
  module = getattr(obj, "__module__", "?")
  return f"{module}.{getattr(obj, '__qualname__', repr(obj))}"
