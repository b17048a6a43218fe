"""What is registered: experiments, tasks, trainers, models and actions.

`tfm-ext-train --list` prints it, a line each with the first line of its
docstring.
"""

from official.core import task_factory

from tfm_ext import actions
from tfm_ext.config import experiments
from tfm_ext.training import models
from tfm_ext.training import trainers


def _first_line(obj) -> str:
  doc = (getattr(obj, "__doc__", None) or "").strip()
  return doc.splitlines()[0] if doc else ""


def registered() -> str:
  """What is registered (experiments, tasks, trainers, models, actions)."""
  experiments.load_defaults()
  tasks = {cls.__name__: cls
           for cls in task_factory._REGISTERED_TASK_CLS.values()}  # pylint: disable=protected-access
  sections = [("experiments", experiments.registered()),
              ("tasks", tasks),
              # Without loading a lazily registered one (its dependency).
              ("trainers", trainers.TRAINERS.entries()),
              ("models", {n: models.MODELS.get(n)
                          for n in models.MODELS.names()}),
              ("actions", {f"{n} ({phase})": actions.ACTIONS[phase].get(n)
                           for phase in actions.PHASES
                           for n in actions.ACTIONS[phase].names()})]
  lines = []
  for title, entries in sections:
    width = max(map(len, entries), default=0)
    lines.append(f"{title}:")
    lines += [f"  {name:<{width}}  {_first_line(obj)}".rstrip()
              for name, obj in sorted(entries.items())] or ["  (none)"]
  return "\n".join(lines) + "\n"
