"""The `params.yaml` of a training run, readable by stock TFM and by us.

A training run writes its operative config as two files in `model_dir`:

* `params.yaml`: every field the experiment's own config classes declare,
  so stock TFM parses it strictly (`official.vision.train
  --config_file=model_dir/params.yaml`, a fork that registers our
  experiments);
* `tfm_ext_params.yaml`: the fields tfm_ext adds to TFM's configs where
  they lack them (`added_defaults`: `trainer.name`,
  `runtime.deterministic`...), which stock TFM would refuse as unknown keys.

`read` merges them back. A `params.yaml` that stock TFM wrote has no such
file: its added fields read as their defaults, so we resume its `model_dir`
as we would our own. One that an earlier tfm_ext wrote with the added
fields inline reads as it is. Both files are written whole through
`tf.io.gfile` (`_files.write_text`), and read as data (YAML's safe loader).
"""

import dataclasses
import os
from typing import Any, Dict, Optional

import tensorflow as tf
import yaml

from official.core import config_definitions

from tfm_ext import _files
from tfm_ext import trainers

PARAMS = "params.yaml"
ADDED = "tfm_ext_params.yaml"
SECTIONS = ("trainer", "runtime")


# Fields tfm_ext adds to TFM's `RuntimeConfig`: `tfm_ext.determinism`'s,
# whether `mirrored` on one CPU device keeps a one-replica mirror
# (`tfm_ext.strategies.build_strategy`), and whether the train step compiles
# with XLA on a CPU (`tfm_ext.devices.xla_scope`).
RUNTIME_FIELDS = {"deterministic": False, "seed": 0,
                  "mirror_one_device": False, "xla_on_cpu": False}


def added_defaults() -> Dict[str, Dict[str, Any]]:
  """`{section: {field: default}}` of every field tfm_ext adds to TFM's."""
  return {"trainer": trainers.added_fields(), "runtime": RUNTIME_FIELDS}


class _Dumper(yaml.SafeDumper):
  """Safe YAML with tuples as lists, as TFM's configs hold both."""


_Dumper.add_representer(tuple, _Dumper.represent_list)


class Loader(yaml.SafeLoader):
  """YAML's safe loader, plus the `!!python/tuple` that TFM writes.

  TFM dumps tuple fields (`crop_area_range`) with that tag, which the safe
  loader refuses; it is read as a list, as `dump` writes tuples (TFM's
  configs take either). Any other Python tag is refused.
  """


Loader.add_constructor(
    "tag:yaml.org,2002:python/tuple",
    lambda loader, node: loader.construct_sequence(node))


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
  _files.write_text(os.path.join(model_dir, PARAMS), dump(tree))
  _files.write_text(os.path.join(model_dir, ADDED), dump(added))


def read(path: str, defaults: Optional[Dict[str, Dict[str, Any]]] = None
         ) -> Dict[str, Any]:
  """The config in the `params.yaml` at `path`, our added fields merged in.

  Args:
    path: a `params.yaml`; `tfm_ext_params.yaml` beside it, if any, is merged.
    defaults: `{section: {field: default}}` for added fields neither file
      has (a `params.yaml` stock TFM wrote).

  Raises:
    yaml.YAMLError: a file is not YAML, or holds more than data.
    ValueError: a file holds YAML that is not a mapping.
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
  tree = yaml.load(_files.read_text(path), Loader=Loader) or {}
  if not isinstance(tree, dict):
    raise ValueError(f"{path} holds {type(tree).__name__}, not a mapping of "
                     "config fields")
  return tree
