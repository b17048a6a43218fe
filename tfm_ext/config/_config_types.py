"""Config values against their annotations: what `checks` refuses by type.

TFM's overrides keep whatever YAML parsed, so `trainer.train_steps=abc` is
the string 'abc'; `check_types` refuses it up front, naming the field, the value
and the type the config class declares.
"""

import collections.abc
import functools
import types
import typing
from typing import Any, Dict, Sequence

from official.modeling import hyperparams

from tfm_ext.base import values
from tfm_ext.base.errors import UsageError
from tfm_ext.config import added_fields


def show(value) -> str:
  """`value` as a user would write it in YAML ('abc' quoted: a string)."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  return repr(value) if isinstance(value, str) else str(value)


def integer(value) -> bool:
  return values.is_a(value, int)


def number(value) -> bool:
  return values.is_a(value, (int, float))


_TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number",
               str: "a string"}
_SEQUENCES = (list, tuple, collections.abc.Sequence)


def check_types(config: hyperparams.Config, prefix: str,
                skip: Sequence[str] = ()) -> None:
  """Refuses a value of `config` (recursively) that its annotation does not.

  Fields tfm_ext adds to TFM's configs without annotations
  (`added_fields.defaults()`) are held to the type of their default. None
  passes: it is TFM's "unset", and `checks.RULES` refuse it where
  it cannot run. Fields named in `skip` are left to another check.
  """
  hints = _hints(type(config), prefix.split(".")[0])
  for name in config.as_dict():
    field, value = f"{prefix}.{name}", getattr(config, name)
    if field in skip:
      continue
    if isinstance(value, hyperparams.Config):
      check_types(value, field, skip)
    elif not _accepts(hints.get(name), value):
      raise UsageError(
          f"{field}={show(value)}: give {_describe(hints[name])}.")


@functools.lru_cache(maxsize=None)
def _hints(config_cls: type, section: str) -> Dict[str, Any]:
  added = added_fields.defaults().get(section, {})
  hints = {name: type(default) for name, default in added.items()
           if default is not None}
  try:
    hints.update(typing.get_type_hints(config_cls))
  except Exception:  # pylint: disable=broad-except
    # An annotation that does not resolve outside its module: unchecked.
    pass
  return hints


def _accepts(hint, value) -> bool:
  if value is None or hint is None or hint is typing.Any:
    return True
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    return any(_accepts(arg, value) for arg in typing.get_args(hint)
               if arg is not type(None))
  if origin in _SEQUENCES:
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    if len(args) != 1:
      return isinstance(value, (list, tuple))
    if not isinstance(value, (list, tuple)):
      # TFM's own configs give one value for a list now and then (ViT's
      # include_in_weight_decay regex), and run.
      return _accepts(args[0], value)
    return all(_accepts(args[0], v) for v in value)
  if hint is bool:
    return isinstance(value, bool)
  if hint is int:
    return integer(value)
  if hint is float:
    return number(value)
  if hint is str:
    return isinstance(value, str)
  return True  # A sub-config (walked on its own), a dict, another class.


def _describe(hint) -> str:
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    return " or ".join(_describe(arg) for arg in typing.get_args(hint)
                       if arg is not type(None))
  if typing.get_origin(hint) in _SEQUENCES:
    return "a list"
  return _TYPE_NAMES.get(hint, getattr(hint, "__name__", str(hint)))
