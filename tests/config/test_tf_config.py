"""TF_CONFIG is checked with the config, before anything starts or waits.

Each fault is refused through the real launcher: exit 2, one `error:`
paragraph naming the field and what is accepted, no traceback, nothing
written, and no wait (a cluster that cannot form is never waited for).
"""

import json
import time

import pytest

from conftest import assert_clean_usage_error

A, B = "127.0.0.1:2222", "127.0.0.1:2223"
MWMS = "runtime.distribution_strategy=multi_worker_mirrored"
PS = "runtime.distribution_strategy=parameter_server"


def _worker(index=0, cluster=None, **task):
  return json.dumps({"cluster": cluster or {"worker": [A, B]},
                     "task": {"type": "worker", "index": index, **task}})


# (TF_CONFIG, strategy, what the one error line holds)
FAULTS = {
    "malformed_json": ('{"cluster": {"worker": ["127.0.0.1:2222"]', MWMS,
                       ["TF_CONFIG is not valid JSON", '"cluster"']),
    "not_an_object": ('["127.0.0.1:2222"]', MWMS,
                      ["TF_CONFIG is a JSON list, not an object"]),
    "index_out_of_range": (_worker(2), MWMS, [
        "TF_CONFIG task.index=2 is out of range", "cluster.worker lists 2 "
        "tasks (indexes 0 to 1)"]),
    "negative_index": (_worker(-1), MWMS, ["TF_CONFIG task.index=-1",
                                           "a whole number from 0"]),
    "ps_under_multi_worker_mirrored": (json.dumps({
        "cluster": {"worker": [A], "ps": [B]},
        "task": {"type": "ps", "index": 0}}), MWMS, [
            "TF_CONFIG task.type=ps has no place under "
            "runtime.distribution_strategy=multi_worker_mirrored",
            "chief, worker, evaluator"]),
    "ps_job_under_multi_worker_mirrored": (_worker(0, {
        "worker": [A], "ps": [B]}), MWMS, [
            "TF_CONFIG cluster.ps", "has no place for a ps job"]),
    "parameter_server_without_ps": (json.dumps({
        "cluster": {"chief": [A], "worker": [B]},
        "task": {"type": "chief", "index": 0}}), PS, [
            "TF_CONFIG cluster.ps is missing", "at least one ps"]),
    "duplicate_address": (_worker(0, {"worker": [A, A]}), MWMS, [
        "TF_CONFIG cluster.worker[1]='127.0.0.1:2222' is also "
        "cluster.worker[0]", "its own host:port"]),
    "duplicate_across_jobs": (_worker(0, {"chief": [B], "worker": [A, B]}),
                              MWMS, ["cluster.worker[1]", "cluster.chief[0]"]),
    "own_entry_missing": (json.dumps({"cluster": {"worker": [A, B]},
                                      "task": {"type": "chief", "index": 0}}),
                          MWMS, ['TF_CONFIG task.type="chief" is not a job',
                                 "give one of worker"]),
    # Faults nobody listed.
    "task_type_missing": (json.dumps({"cluster": {"worker": [A, B]},
                                      "task": {"index": 0}}), MWMS,
                          ["TF_CONFIG task.type is missing"]),
    "port_not_a_number": (_worker(0, {"worker": [A, "127.0.0.1:http"]}),
                          MWMS, ['TF_CONFIG cluster.worker[1]="127.0.0.1:http" '
                                 "is not an address", "from 1 to 65535"]),
    "empty_job_list": (_worker(0, {"worker": []}), MWMS, [
        "TF_CONFIG cluster.worker=[]", "non-empty list"]),
    "unknown_job": (_worker(0, {"worker": [A], "trainer": [B]}), MWMS, [
        "TF_CONFIG cluster.trainer: no such job",
        "chief, worker, ps, evaluator"]),
    "two_chiefs": (json.dumps({"cluster": {"chief": [A, B]},
                               "task": {"type": "chief", "index": 0}}), MWMS,
                   ["TF_CONFIG cluster.chief lists 2 tasks",
                    "at most one chief"]),
    "index_a_float": (_worker(0.5), MWMS, ["TF_CONFIG task.index=0.5"]),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_tf_config_that_cannot_form_a_cluster_is_refused_up_front(
    launch_forked, tmp_path, fault):
  tf_config, strategy, fragments = FAULTS[fault]
  started = time.monotonic()
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      f"--params_override={strategy}",
                      model_dir=tmp_path / "m", env={"TF_CONFIG": tf_config},
                      timeout=120)
  took = time.monotonic() - started
  assert_clean_usage_error(run, *fragments)
  assert "waiting for" not in run.stderr, run  # Nothing waited on.
  assert took < 60, took


def test_a_valid_tf_config_is_read_as_tensorflow_reads_it():
  from tfm_ext.config import cluster  # pylint: disable=g-import-not-at-top
  read = cluster.read("multi_worker_mirrored",
                      {"TF_CONFIG": _worker("1")})  # TF takes "1" too.
  assert (read.task_type, read.task_index, read.address) == ("worker", 1, B)
  assert read.others(("chief", "worker")) == [A]
  assert not read.is_chief()
  assert cluster.read("mirrored", {"TF_CONFIG": ""}) is None
  assert cluster.read("mirrored", {"TF_CONFIG": '{"cluster": {}}'}) is None
  # An evaluator may stand outside the cluster, as TensorFlow allows.
  evaluator = cluster.read("multi_worker_mirrored", {"TF_CONFIG": json.dumps(
      {"cluster": {"worker": [A]}, "task": {"type": "evaluator"}})})
  assert (evaluator.address, evaluator.is_chief()) == ("", False)
