"""A name -> object registry whose failed lookups list what is registered.

TFM keeps experiments and tasks in `exp_factory` / `task_factory`; trainers and
models live here, one `Registry` each (see `tfm_ext.training.trainers` and
`tfm_ext.training.models`).
"""

import difflib
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


def _qualname(obj) -> str:
  module = getattr(obj, "__module__", "?")
  return f"{module}.{getattr(obj, '__qualname__', repr(obj))}"
