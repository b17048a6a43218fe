"""The house's floors: no import runs up them, no two modules import each other.

Read from the source (`ast`): every `import` of a `tfm_ext` module, at the
top of a module or inside a function, is an edge.
"""

import ast
import collections
import os

from conftest import REPO

# Lowest first (`tfm_ext.base`'s docstring).
FLOORS = ("base", "model_dir", "training", "config", "actions", "examples",
          "run")
PACKAGE = os.path.join(REPO, "tfm_ext")


def _module(path):
  name = os.path.relpath(path, REPO)[:-len(".py")].replace(os.sep, ".")
  return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _imports():
  """`(importer, imported, at_top)` for every import of a tfm_ext module."""
  edges = []
  for folder, _, names in os.walk(PACKAGE):
    for name in names:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
      top = {id(node) for node in tree.body}
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
          targets = [f"{node.module}.{a.name}" for a in node.names]
          targets = [t if os.path.exists(os.path.join(
              REPO, *t.split(".")) + ".py") else node.module for t in targets]
        elif isinstance(node, ast.Import):
          targets = [a.name for a in node.names]
        else:
          continue
        edges += [(_module(path), t, id(node) in top) for t in targets
                  if t.startswith("tfm_ext.")]
  return edges


def _floor(module):
  """The floor of `module`; None for the package's door (`tfm_ext`, which
  may import any floor) and what is on none."""
  parts = module.split(".")
  return FLOORS.index(parts[1]) if parts[1:2] and parts[1] in FLOORS else None


def test_no_import_runs_up_the_house():
  up = [f"{a} -> {b}" for a, b, _ in _imports()
        if _floor(a) is not None and _floor(b) is not None
        and _floor(b) > _floor(a)]
  assert not up, up
  # Every package of the house is a floor of it.
  assert sorted(FLOORS) == sorted(
      name for name in os.listdir(PACKAGE) if os.path.isfile(
          os.path.join(PACKAGE, name, "__init__.py")))


def test_no_two_modules_import_each_other_at_their_top():
  graph = collections.defaultdict(set)
  for importer, imported, at_top in _imports():
    if at_top and importer != imported:
      graph[importer].add(imported)
  circles, done, path = [], set(), []

  def visit(module):
    if module in path:
      circles.append(path[path.index(module):] + [module])
      return
    if module in done:
      return
    path.append(module)
    for imported in sorted(graph[module]):
      visit(imported)
    path.pop()
    done.add(module)

  for module in sorted(graph):
    visit(module)
  assert not circles, circles
