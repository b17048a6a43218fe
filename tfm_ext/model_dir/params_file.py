"""The `params.yaml` of a training run, readable by stock TFM and by us.

A training run writes its operative config as two files in `model_dir`:

* `params.yaml`: every field the experiment's own config classes declare,
  so stock TFM parses it strictly (`official.vision.train
  --config_file=model_dir/params.yaml`, a fork that registers our
  experiments);
* `tfm_ext_params.yaml`: the fields tfm_ext adds to TFM's configs where
  they lack them (`tfm_ext.config.added_fields`: `trainer.name`,
  `runtime.deterministic`...), which stock TFM would refuse as unknown keys.

`read` merges them back. A `params.yaml` that stock TFM wrote has no such
file: its added fields read as their defaults, so we resume its `model_dir`
as we would our own. One that an earlier tfm_ext wrote with the added
fields inline reads as it is. Both files are written whole through
`tf.io.gfile` (`files.write_text`), and read as data: `Loader`, YAML's
safe loader, which also reads the user's `--config_file` and
`--params_override` (`tfm_ext.config.params`). A file that is not such data
(binary, empty, a Python tag, an alias bomb, a key given twice) reads as
`files.Damaged`, naming it. A local file that is not a regular file (a
pipe, `--config_file=<(...)`) is read as a stream, once a process.
"""

import dataclasses
import os
import re
import stat
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
import yaml

from official.core import config_definitions

from tfm_ext.model_dir import files

PARAMS = "params.yaml"
ADDED = "tfm_ext_params.yaml"
SECTIONS = ("trainer", "runtime")


class NotConfig(ValueError):
  """YAML text that is not a mapping of config fields.

  The message is a predicate ("is empty", "is not valid YAML: ..."), to
  follow the name of the file or flag it came from.
  """


class Loader(yaml.SafeLoader):
  """YAML's safe loader, plus what TFM's loader reads, minus alias bombs.

  It constructs no Python object: TFM dumps tuple fields (`crop_area_range`)
  with `!!python/tuple`, which is read as a list, as `dump` writes tuples
  (TFM's configs take either); any other Python tag is refused. As in TFM,
  `1e-3` is a float. A document whose aliases (`*name`) would repeat more
  than `MAX_REPEATED_NODES` nodes, or that nests deeper than `MAX_DEPTH`,
  is refused before it is built, as is one that gives a key twice in a
  mapping, at any depth, where YAML would keep the last silently (a merge,
  `<<: *name`, may still be overridden).
  """

  MAX_REPEATED_NODES = 100_000
  # PyYAML composes nested nodes recursively (a config nests a few levels).
  MAX_DEPTH = 100

  def compose_node(self, parent, index):
    self._depth = getattr(self, "_depth", 0) + 1
    try:
      if self._depth > self.MAX_DEPTH:
        raise NotConfig(f"nests more than {self.MAX_DEPTH} levels deep")
      return super().compose_node(parent, index)
    finally:
      self._depth -= 1

  def construct_document(self, node):
    _check_aliases(node, self.MAX_REPEATED_NODES)
    _check_unique_keys(node)
    return super().construct_document(node)


class _Dumper(yaml.SafeDumper):
  """Safe YAML with tuples as lists, as TFM's configs hold both."""


_Dumper.add_representer(tuple, _Dumper.represent_list)
Loader.add_constructor(
    "tag:yaml.org,2002:python/tuple",
    lambda loader, node: loader.construct_sequence(node))
# TFM's loader (`params_dict._LOADER`) reads a float written without a
# point, `1e-3`, which YAML 1.1 reads as a string; the dumper quotes such
# strings so that they read back as strings.
for _resolving in (Loader, _Dumper):
  _resolving.add_implicit_resolver(
      "tag:yaml.org,2002:float",
      re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load(text: str) -> Any:
  """`text` as YAML data (`Loader`); raises `NotConfig` if it is not."""
  try:
    return yaml.load(text, Loader=Loader)
  except yaml.constructor.ConstructorError as e:
    raise NotConfig("holds more than data, which is not read: "
                    f"{_problem(e)}") from e
  except yaml.YAMLError as e:
    raise NotConfig(f"is not valid YAML: {_problem(e)}") from e


def load_mapping(text: str) -> Dict[str, Any]:
  """`text` as a YAML mapping of config fields; raises `NotConfig`."""
  tree = load(text)
  if tree is None:
    raise NotConfig("is empty")
  if not isinstance(tree, dict):
    raise NotConfig(f"holds a {type(tree).__name__}, not a mapping of config "
                    "fields")
  return tree


def read_mapping(path: str) -> Dict[str, Any]:
  """The YAML mapping of config fields in the file `path`; see `load`.

  Raises:
    NotConfig: the file is not UTF-8 text, or not such a mapping, or a
      directory, or cannot be read.
    tf.errors.NotFoundError: there is no such file.
  """
  if tf.io.gfile.isdir(path):
    raise NotConfig("is a directory, not a YAML file")
  try:
    data = _read_bytes(path)
  except tf.errors.NotFoundError:
    raise
  except (tf.errors.OpError, OSError) as e:
    reason = e.message if isinstance(e, tf.errors.OpError) else e.strerror
    raise NotConfig(f"cannot be read: {reason}") from e
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise NotConfig(f"is not UTF-8 text ({e.reason} at byte {e.start})") from e
  return load_mapping(text)


# A stream's path -> what it held: it can be read only once, and a config
# may be built twice in a process (an evaluator following its trainer).
_streams: Dict[str, bytes] = {}


def _read_bytes(path: str) -> bytes:
  """What the file `path` holds; a local stream read to its end, once.

  TensorFlow reads a local file up to the size `stat` gives, which is 0
  for a pipe (`<(...)`, `/dev/stdin`), a FIFO or a character device.
  """
  local = files.local_path(path)
  try:
    regular = local is None or stat.S_ISREG(os.stat(local).st_mode)
  except OSError:
    regular = True  # Missing: TensorFlow says so, as for any path.
  if regular:
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  if local not in _streams:
    with open(local, "rb") as f:
      _streams[local] = f.read()
  return _streams[local]


def _problem(error: yaml.YAMLError) -> str:
  """A YAML error on one line: what is wrong, and where."""
  mark = getattr(error, "problem_mark", None)
  problem = getattr(error, "problem", None) or str(error)
  if mark is None:
    return problem
  return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def _check_aliases(root: yaml.Node, limit: int) -> None:
  """Refuses a document that aliases make `limit` nodes bigger, or cyclic.

  PyYAML builds an alias as a reference to one object, so a small document
  can stand for an exponentially large tree, which a config's `as_dict` or
  an error message would spell out (a "billion laughs"). Each node is
  counted once, without recursion.
  """
  sizes = {}
  path = set()  # The nodes being counted: a child among them is a cycle.
  stack = [(root, False)]
  while stack:
    node, children_counted = stack.pop()
    key = id(node)
    children = _children(node)
    if children_counted:
      path.discard(key)
      sizes[key] = 1 + sum(sizes[id(child)] for child in children)
      continue
    if key in sizes:
      continue
    if key in path:
      raise NotConfig("has an alias (*name) inside its own anchor (&name)")
    path.add(key)
    stack.append((node, True))
    stack.extend((child, False) for child in children)
  written, expanded = len(sizes), sizes[id(root)]
  if expanded - written > limit:
    raise NotConfig(
        f"repeats more than {limit} YAML nodes through its aliases (*name): "
        f"{written} written stand for {expanded}")


def _check_unique_keys(root: yaml.Node) -> None:
  """Refuses a mapping, at any depth, that gives a key twice.

  Names the first duplicate in the document by its dotted field, with
  both values (or lines, for mappings); a merge key (`<<`) is not a key.
  """
  duplicates = []
  seen = set()
  stack: List[Tuple[yaml.Node, str]] = [(root, "")]
  while stack:
    node, field = stack.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
      stack.extend((child, f"{field}[{i}]")
                   for i, child in enumerate(node.value))
      continue
    if not isinstance(node, yaml.MappingNode):
      continue
    first = {}
    for key, value in node.value:
      if key.tag == "tag:yaml.org,2002:merge":
        stack.append((value, field))
        continue
      name = key.value if isinstance(key, yaml.ScalarNode) else None
      dotted = f"{field}.{name}" if field else str(name)
      if name is not None:
        if (key.tag, name) in first:
          duplicates.append((dotted, first[(key.tag, name)], (key, value)))
        else:
          first[(key.tag, name)] = (key, value)
      stack.append((value, dotted))
  if duplicates:
    # The first in the document: its second occurrence comes earliest.
    raise NotConfig(_duplicate(*min(
        duplicates, key=lambda d: d[2][0].start_mark.index)))


def _duplicate(field: str, first: Tuple[yaml.Node, yaml.Node],
               second: Tuple[yaml.Node, yaml.Node]) -> str:
  """What `NotConfig` says of `field`, given twice: first and second."""
  lines = [key.start_mark.line + 1 for key, _ in (first, second)]
  where = ([f" (line {line})" for line in lines] if lines[0] != lines[1]
           else ["", ""])  # One line: `a.b=1,a.b=2`, a flow mapping.
  values = [value for _, value in (first, second)]
  if all(isinstance(value, yaml.ScalarNode) for value in values):
    said = " and ".join(f"{value.value or repr('')}{at}"
                        for value, at in zip(values, where))
    said = f": {said}"
  else:
    said = (f" (lines {lines[0]} and {lines[1]})"
            if lines[0] != lines[1] else "")
  return (f"gives {field} twice{said}; give it once (YAML would keep the "
          "last silently)")


def _children(node: yaml.Node) -> List[yaml.Node]:
  if isinstance(node, yaml.SequenceNode):
    return node.value
  if isinstance(node, yaml.MappingNode):
    return [child for pair in node.value for child in pair]
  return []


def added_fields(params: config_definitions.ExperimentConfig
                 ) -> Dict[str, Dict[str, Any]]:
  """`{section: {field: value}}` of fields the config's classes don't declare."""
  added = {}
  for section in SECTIONS:
    config = getattr(params, section)
    declared = {f.name for f in dataclasses.fields(type(config))}
    values = config.as_dict()
    fields = {k: v for k, v in values.items() if k not in declared}
    if fields:
      added[section] = fields
  return added


def write(params: config_definitions.ExperimentConfig, model_dir: str) -> None:
  """Writes `params.yaml` (stock TFM's fields) and our added fields beside it."""
  tf.io.gfile.makedirs(model_dir)
  tree = params.as_dict()
  added = added_fields(params)
  for section, fields in added.items():
    for name in fields:
      del tree[section][name]
  files.write_text(os.path.join(model_dir, PARAMS), dump(tree))
  files.write_text(os.path.join(model_dir, ADDED), dump(added))


def read(path: str, defaults: Optional[Dict[str, Dict[str, Any]]] = None
         ) -> Dict[str, Any]:
  """The config in the `params.yaml` at `path`, our added fields merged in.

  Args:
    path: a `params.yaml`; `tfm_ext_params.yaml` beside it, if any, is merged.
    defaults: `{section: {field: default}}` for added fields neither file
      has (a `params.yaml` stock TFM wrote).

  Raises:
    files.Damaged: a file is not a YAML mapping of config fields (see
      `load`), or its `trainer` or `runtime` is not a mapping; the message
      names the file.
  """
  tree = _load(path)
  added = os.path.join(os.path.dirname(path), ADDED)
  extra = _load(added) if tf.io.gfile.exists(added) else {}
  for section, fields in (defaults or {}).items():
    tree.setdefault(section, {})
    for name, value in fields.items():
      tree[section].setdefault(name, value)
  for section, fields in extra.items():
    tree.setdefault(section, {}).update(fields)
  return tree


def dump(tree: Dict[str, Any]) -> str:
  """`tree` as YAML that the safe loader reads back."""
  return yaml.dump(tree, Dumper=_Dumper, default_flow_style=False)


def _load(path: str) -> Dict[str, Any]:
  try:
    tree = read_mapping(path)
  except NotConfig as e:
    raise files.Damaged(f"{path} {e}") from e
  for section in SECTIONS:
    if not isinstance(tree.get(section, {}), dict):
      raise files.Damaged(f"{path} is damaged: its {section} is a "
                           f"{type(tree[section]).__name__}, not a mapping")
  return tree
