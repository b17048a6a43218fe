"""AutoGraph's conversions kept on disk, as `__pycache__` keeps Python's.

Each process that traces a `tf.function` first has AutoGraph rewrite every
Python function the trace calls (the task's steps, the model's layers,
TFM's box and anchor ops) into graph-building code: parse the source,
analyse it, transform it, print and compile it. TensorFlow caches that
per process only, so every launch of the same experiment (a restart after
preemption, the evaluator beside training, the next run of a sweep) pays
it again before its first step (what it costs and what the cache saves:
benchmarks/RESULTS.md#first-step-resnet-imagenet).

`install(directory)` makes AutoGraph look in `directory` before it
converts, and write there what it converted. An entry is the generated
module's source, its factory's name and its source map (which maps errors
in generated code back to the user's lines), under a key of everything
the conversion reads: the function's source text, file, first line and
free variables, the module's `__future__` imports and global names (the
generated code's own names avoid those), the conversion options and the
versions of TensorFlow, Python and this format. So an edited function, an
upgraded TensorFlow or other options are other keys; nothing is trusted
that could have changed. A hit is then what TensorFlow's own cache does
for a second call in one process: the factory is instantiated on the
function's own globals, closure and defaults.

What is not cached, and converts as before: lambdas (their source is a
line, which AutoGraph disambiguates by the code object) and functions
whose source cannot be read. An entry that cannot be read (a damaged or
foreign file) is converted again and rewritten; a directory that cannot be
created or written turns the cache off for the process, with one warning.
Entries are written whole and renamed into place (a local directory: two
processes converting the same function write the same entry). An entry
read is marked used (its time set, at most once a day); at most once a
day, `install` removes the entries unused for `UNUSED_DAYS`, so edited
functions' old entries do not pile up.

The launcher installs it (`TFM_EXT_AUTOGRAPH_CACHE`: a directory; `off`
turns it off; by default `$XDG_CACHE_HOME/tfm_ext/autograph`, else
`~/.cache/tfm_ext/autograph`). It is TensorFlow's private transpiler that
is wrapped (`tensorflow.python.autograph`), checked at install: another
TensorFlow whose transpiler looks different leaves AutoGraph as it is.
"""

import hashlib
import os
import pickle
import sys
import tempfile
import time
from typing import Optional

from absl import logging
import tensorflow as tf

from tfm_ext.base import failures

ENV = "TFM_EXT_AUTOGRAPH_CACHE"
OFF = "off"
# Bump when an entry's layout or what its key covers changes.
_FORMAT = 1
# Entries not read for this long are removed (`_prune`).
UNUSED_DAYS = 30
_DAY = 24 * 3600
_PRUNED = ".pruned"  # Its time: the last pruning.

_installed: Optional["_DiskCache"] = None


def default_directory() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tfm_ext", "autograph")


def directory_from_environment() -> Optional[str]:
  """The directory `TFM_EXT_AUTOGRAPH_CACHE` names, or None for `off`."""
  raw = os.environ.get(ENV, "").strip()
  if raw.lower() == OFF:
    return None
  return os.path.expanduser(raw) if raw else default_directory()


def install(directory: Optional[str] = None) -> Optional[str]:
  """Makes this process's AutoGraph read and write conversions in `directory`.

  `directory` defaults to `directory_from_environment()`. Idempotent: a
  second call changes nothing. Returns the directory in use, or None when
  the cache is off (asked for, or the transpiler or the directory is not
  what it needs; a warning says which).
  """
  global _installed
  if _installed is not None:
    return _installed.directory
  directory = directory if directory is not None else (
      directory_from_environment())
  if directory is None:
    return None
  if "://" in directory:  # Compiled code is read at every launch: local.
    logging.warning("AutoGraph's conversions are not cached on disk: %s=%s "
                    "is not a local directory.", ENV, directory)
    return None
  try:
    from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top
    from tensorflow.python.autograph.pyct import inspect_utils  # pylint: disable=g-import-not-at-top
    from tensorflow.python.autograph.pyct import loader  # pylint: disable=g-import-not-at-top
    from tensorflow.python.autograph.pyct import origin_info  # pylint: disable=g-import-not-at-top
    from tensorflow.python.autograph.pyct import transpiler  # pylint: disable=g-import-not-at-top
    transpiler_ = api._TRANSPILER  # pylint: disable=protected-access
    factory_cls = transpiler._PythonFnFactory  # pylint: disable=protected-access
    for owner, names in ((transpiler_, ("transform_function", "_cache",
                                        "_cache_lock", "get_caching_key",
                                        "get_extra_locals")),
                         (factory_cls, ("instantiate",)),
                         (loader, ("load_source",)),
                         (origin_info, ("LineLocation",)),
                         (inspect_utils, ("getimmediatesource",
                                          "getfutureimports"))):
      missing = [n for n in names if not hasattr(owner, n)]
      if missing:
        raise AttributeError(f"{owner!r} has no {', '.join(missing)}")
  except (ImportError, AttributeError) as e:
    logging.warning("AutoGraph's conversions are not cached on disk: this "
                    "TensorFlow's transpiler is not the one tfm_ext knows "
                    "(%s).", e)
    return None
  try:
    os.makedirs(directory, exist_ok=True)
    if not os.access(directory, os.W_OK | os.X_OK):
      raise PermissionError(f"{directory} is not writable")
  except OSError as e:
    logging.warning("AutoGraph's conversions are not cached on disk: %s "
                    "(set %s to another directory, or to %s).", e, ENV, OFF)
    return None
  _prune(directory)
  _installed = _DiskCache(directory, transpiler_, factory_cls, loader,
                          origin_info, inspect_utils)
  transpiler_.transform_function = _installed.transform_function
  logging.info("AutoGraph's conversions are cached in %s", directory)
  return directory


def _prune(directory: str, now: Optional[float] = None) -> int:
  """Removes entries unused for `UNUSED_DAYS`, at most once a day.

  Returns how many were removed. Errors (another process pruning, a file
  gone) are skipped: pruning is housekeeping.
  """
  now = time.time() if now is None else now
  marker = os.path.join(directory, _PRUNED)
  try:
    if now - os.stat(marker).st_mtime < _DAY:
      return 0
  except OSError:
    pass
  removed = 0
  try:
    with open(marker, "w"):
      pass
    os.utime(marker, (now, now))
    for shard in os.scandir(directory):
      if not shard.is_dir():
        continue
      for entry in os.scandir(shard.path):
        try:
          if now - entry.stat().st_mtime > UNUSED_DAYS * _DAY:
            os.unlink(entry.path)
            removed += 1
        except OSError:
          pass
  except OSError:
    pass
  return removed


class _DiskCache:
  """Wraps the transpiler's `transform_function` with a read and a write."""

  def __init__(self, directory, transpiler_, factory_cls, loader,
               origin_info, inspect_utils):
    self.directory = directory
    self._transpiler = transpiler_
    self._convert = transpiler_.transform_function  # Bound: TF's own.
    self._factory_cls = factory_cls
    self._loader = loader
    self._origin_info = origin_info
    self._inspect_utils = inspect_utils
    self.hits = 0
    self.writes = 0

  def transform_function(self, fn, user_context):
    cache = self._transpiler._cache  # pylint: disable=protected-access
    subkey = self._transpiler.get_caching_key(user_context)
    if cache.has(fn, subkey):  # Converted in this process: TF's own path.
      return self._convert(fn, user_context)
    key = self._key(fn, subkey)
    if key is None:
      return self._convert(fn, user_context)
    path = os.path.join(self.directory, key[:2], key + ".pkl")
    factory = self._read(path, fn)
    if factory is not None:
      with self._transpiler._cache_lock:  # pylint: disable=protected-access
        if not cache.has(fn, subkey):
          cache[fn][subkey] = factory
      self.hits += 1
      return self._convert(fn, user_context)
    converted = self._convert(fn, user_context)
    if cache.has(fn, subkey):
      self._write(path, cache[fn][subkey])
    return converted

  def _key(self, fn, subkey) -> Optional[str]:
    """A digest of what the conversion of `fn` reads, or None: not cached."""
    code = getattr(fn, "__code__", None)
    if code is None or fn.__name__ == "<lambda>":
      return None
    try:
      source = self._inspect_utils.getimmediatesource(fn)
      future = sorted(self._inspect_utils.getfutureimports(fn))
    except (OSError, TypeError, ValueError):
      return None
    options = subkey.as_tuple() if hasattr(subkey, "as_tuple") else (subkey,)
    options = tuple(sorted(map(str, o)) if isinstance(o, frozenset) else o
                    for o in options)
    globals_ = getattr(fn, "__globals__", {})
    names = sorted(n for n in globals_ if not n.startswith("__"))
    digest = hashlib.sha256()
    for part in (_FORMAT, tf.__version__, sys.version, code.co_filename,
                 code.co_firstlineno, fn.__name__, code.co_freevars,
                 future, repr(options), source, names):
      digest.update(repr(part).encode("utf-8", "backslashreplace"))
      digest.update(b"\0")
    return digest.hexdigest()

  def _read(self, path, fn):
    """The factory saved at `path`, loaded for `fn`; None if none is usable."""
    try:
      with open(path, "rb") as f:
        entry = pickle.load(f)
        if time.time() - os.fstat(f.fileno()).st_mtime > _DAY:
          os.utime(path)  # Used: not pruned (`_prune`).
      if entry.get("format") != _FORMAT:
        return None
      module, _ = self._loader.load_source(entry["source"],
                                           delete_on_exit=True)
      factory = self._factory_cls(entry["name"], fn.__code__.co_freevars,
                                  self._transpiler.get_extra_locals())
      factory._unbound_factory = getattr(module, entry["outer"])()  # pylint: disable=protected-access
      factory.module = module
      factory.source_map = {
          self._origin_info.LineLocation(module.__file__, line): origin
          for line, origin in entry["source_map"]}
      return factory
    except FileNotFoundError:
      return None
    except Exception as e:  # pylint: disable=broad-except
      failures.reraise_interrupt(e)
      # A damaged, truncated or foreign entry: convert and rewrite it.
      logging.info("AutoGraph cache entry %s is not usable (%s: %s); "
                   "converting again.", path, type(e).__name__, e)
      return None

  def _write(self, path, factory) -> None:
    unbound = getattr(factory, "_unbound_factory", None)
    module = getattr(factory, "module", None)
    if unbound is None or module is None:
      return
    temporary = None
    try:
      with open(module.__file__, encoding="utf-8") as f:
        source = f.read()
      entry = {
          "format": _FORMAT,
          "source": source,
          "name": factory._name,  # pylint: disable=protected-access
          # `outer_factory.<locals>.inner_factory`: the module's function.
          "outer": unbound.__qualname__.split(".")[0],
          "source_map": [(location.lineno, origin) for location, origin
                         in (factory.source_map or {}).items()
                         if location.filename == module.__file__],
      }
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with tempfile.NamedTemporaryFile(
          "wb", dir=os.path.dirname(path), prefix=".tmp-", delete=False) as f:
        temporary = f.name
        pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
      os.replace(temporary, path)
      self.writes += 1
    except Exception as e:  # pylint: disable=broad-except
      failures.reraise_interrupt(e)
      # The run goes on without this entry; the next launch converts it.
      logging.info("AutoGraph cache entry %s not written (%s: %s).", path,
                   type(e).__name__, e)
      if temporary is not None:
        try:
          os.unlink(temporary)
        except OSError:
          pass
