"""The cluster of `TF_CONFIG`: parsed and checked before anything starts.

TensorFlow reads `TF_CONFIG` only where a strategy is built, and takes it
on trust: malformed JSON or a task index beyond its job is a traceback
from deep inside TensorFlow, a task type the strategy has no place for
(`ps` under `multi_worker_mirrored`) a `ValueError` of its internals, and
a cluster that can never form (one address named twice, this task's own
entry missing) a wait without end. `read` checks it with the config,
before the strategy is built and before anything is written, and refuses
each fault with one `UsageError` paragraph (exit 2) naming the field and
what is accepted:

    TF_CONFIG task.index=2 is out of range: cluster.worker lists 2 tasks
    (indexes 0 to 1). ...

What is accepted follows TensorFlow's own rules
(`tensorflow/python/distribute/multi_worker_util._validate_cluster_spec`,
`collective_all_reduce_strategy`, `parameter_server_strategy_v2`):

* `TF_CONFIG` is a JSON object; `cluster` maps a job (`chief`, `worker`,
  `ps`, `evaluator`) to a non-empty list of `host:port` addresses, the
  port a number from 1 to 65535; at most one `chief` and one `evaluator`
  task; no address twice (two tasks cannot listen on one port);
* `task.type` is one of the jobs of `cluster` (an `evaluator` may stand
  outside it, as TensorFlow allows) and `task.index` a whole number within
  its job;
* `multi_worker_mirrored` takes `chief`, `worker` and `evaluator` tasks
  (TensorFlow counts its workers among the first two; it has no place for
  a `ps`); `parameter_server` takes `chief`, `worker`, `ps` and
  `evaluator`, with at least one `worker` and one `ps`.

Other strategies do not read `TF_CONFIG`; its syntax is still checked, as
the run reads it to know its chief (`tfm_ext.run.strategies`).
"""

import dataclasses
import json
import os
from typing import Dict, List, Mapping, Optional, Tuple

from tfm_ext.base.errors import UsageError

JOBS = ("chief", "worker", "ps", "evaluator")
# The task types each strategy built from TF_CONFIG can place.
STRATEGY_JOBS = {
    "multi_worker_mirrored": ("chief", "worker", "evaluator"),
    "parameter_server": JOBS,
}
_FORM = ('TF_CONFIG is JSON such as {"cluster": {"worker": '
         '["host1:2222", "host2:2222"]}, "task": {"type": "worker", '
         '"index": 0}}')


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A checked `TF_CONFIG`: its jobs' addresses and this task."""
  jobs: Dict[str, List[str]]
  task_type: str
  task_index: int

  @property
  def address(self) -> str:
    """This task's own address ('' for an evaluator outside the cluster)."""
    tasks = self.jobs.get(self.task_type, [])
    return tasks[self.task_index] if self.task_index < len(tasks) else ""

  def others(self, jobs=JOBS) -> List[str]:
    """The addresses of the tasks of `jobs` other than this one."""
    return [address for job in jobs for address in self.jobs.get(job, [])
            if address != self.address]

  def is_chief(self) -> bool:
    """The `chief` task, or worker 0 of a cluster without one."""
    if "chief" in self.jobs:
      return self.task_type == "chief"
    return self.task_type == "worker" and self.task_index == 0

  def describe(self) -> str:
    tasks = "; ".join(f"{job} {', '.join(addresses)}"
                      for job, addresses in sorted(self.jobs.items()))
    return f"this is {self.task_type} {self.task_index}; {tasks}"


def read(strategy: str = "",
         environ: Mapping[str, str] = os.environ) -> Optional[Cluster]:
  """The cluster `TF_CONFIG` names for `strategy`, or None for no cluster.

  Unset, empty, or without a `cluster` (or with an empty one): no cluster.
  `strategy` is `runtime.distribution_strategy`: '' checks what every
  strategy needs, not which task types it takes.

  Raises:
    UsageError: a fault of the module docstring, naming the field.
  """
  text = environ.get("TF_CONFIG") or ""
  if not text.strip():
    return None
  try:
    config = json.loads(text)
  except ValueError as e:
    raise _refused(f"TF_CONFIG is not valid JSON ({e}). {_FORM}.") from None
  if not isinstance(config, dict):
    raise _refused(f"TF_CONFIG is a JSON {type(config).__name__}, not an "
                   f"object. {_FORM}.")
  jobs = _jobs(config.get("cluster"))
  if not jobs:
    return None
  task_type, task_index = _task(config.get("task"), jobs)
  cluster = Cluster(jobs=jobs, task_type=task_type, task_index=task_index)
  _check_for(strategy, cluster)
  return cluster


def _jobs(value) -> Dict[str, List[str]]:
  """`cluster`'s jobs, each address checked; no address twice."""
  if value is None:
    return {}
  if not isinstance(value, dict):
    raise _refused(f"TF_CONFIG cluster is a JSON {type(value).__name__}: "
                   f"give an object of jobs. {_FORM}.")
  jobs, seen = {}, {}
  for job, addresses in value.items():
    if job not in JOBS:
      raise _refused(f"TF_CONFIG cluster.{job}: no such job; a cluster's "
                     f"jobs are {', '.join(JOBS)}.")
    if not isinstance(addresses, list) or not addresses:
      raise _refused(f"TF_CONFIG cluster.{job}={json.dumps(addresses)}: "
                     "give a non-empty list of host:port addresses, one a "
                     "task.")
    for index, address in enumerate(addresses):
      field = f"TF_CONFIG cluster.{job}[{index}]"
      key = _host_port(field, address)
      if key in seen:
        raise _refused(
            f"{field}={address!r} is also {seen[key]}: two tasks cannot "
            "listen on one address, and the cluster would wait for ever "
            "for the one that cannot start. Give each task its own "
            "host:port.")
      seen[key] = f"cluster.{job}[{index}]"
    jobs[job] = list(addresses)
  for job in ("chief", "evaluator"):
    if len(jobs.get(job, [])) > 1:
      raise _refused(f"TF_CONFIG cluster.{job} lists {len(jobs[job])} tasks: "
                     f"a cluster has at most one {job}.")
  return jobs


def _host_port(field: str, address) -> Tuple[str, int]:
  """(host, port) of `address`, refused unless it is `host:port`."""
  if isinstance(address, str):
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and 0 < int(port) < 65536:
      return host.strip("[]").lower(), int(port)
  raise _refused(f"{field}={json.dumps(address)} is not an address: give "
                 "host:port, the port a number from 1 to 65535 (e.g. "
                 "\"10.0.0.2:2222\").")


def _task(value, jobs: Dict[str, List[str]]) -> Tuple[str, int]:
  """`task`'s type and index, this task's entry in `jobs`."""
  if not isinstance(value, dict) or "type" not in value:
    raise _refused(
        "TF_CONFIG task.type is missing: a cluster's every task says which "
        f"it is, one of {', '.join(sorted(jobs))} ({_FORM}).")
  task_type, index = value["type"], value.get("index", 0)
  if task_type not in jobs and task_type != "evaluator":
    raise _refused(
        f"TF_CONFIG task.type={json.dumps(task_type)} is not a job of the "
        f"cluster, so this task has no address in it: give one of "
        f"{', '.join(sorted(jobs))}.")
  if isinstance(index, str) and index.isdigit():
    index = int(index)  # As TensorFlow reads it.
  if isinstance(index, bool) or not isinstance(index, int) or index < 0:
    raise _refused(f"TF_CONFIG task.index={json.dumps(index)}: give a whole "
                   "number from 0, this task's place in its job.")
  tasks = len(jobs.get(task_type, []))
  if task_type in jobs and index >= tasks:
    raise _refused(
        f"TF_CONFIG task.index={index} is out of range: cluster.{task_type} "
        f"lists {tasks} task{'s' if tasks > 1 else ''} (indexes 0 to "
        f"{tasks - 1}).")
  return task_type, index


def _check_for(strategy: str, cluster: Cluster) -> None:
  """Refuses the jobs `strategy` has no place for, or lacks."""
  accepted = STRATEGY_JOBS.get(strategy)
  if accepted is None:
    return
  where = f"runtime.distribution_strategy={strategy}"
  if cluster.task_type not in accepted:
    raise _refused(
        f"TF_CONFIG task.type={cluster.task_type} has no place under "
        f"{where}: it takes {', '.join(accepted)} tasks.")
  extra = sorted(set(cluster.jobs) - set(accepted))
  if extra:
    raise _refused(
        f"TF_CONFIG cluster.{extra[0]}: {where} has no place for a "
        f"{extra[0]} job: its cluster's jobs are {', '.join(accepted)}.")
  if strategy == "parameter_server":
    for job in ("worker", "ps"):
      if job not in cluster.jobs:
        raise _refused(f"TF_CONFIG cluster.{job} is missing: {where} needs "
                       f"at least one {job} task.")


def _refused(message: str) -> UsageError:
  return UsageError(message)
