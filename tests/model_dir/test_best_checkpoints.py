"""The top-k best-checkpoint exporter: ranking, records, crash repair."""

import json
import os
import threading

import pytest
import tensorflow as tf

from tfm_ext.base import signalled
from tfm_ext.model_dir import best_checkpoints


@pytest.fixture
def checkpoint():
  return tf.train.Checkpoint(v=tf.Variable(0.0))


def make(tmp_path, comp="higher", k=2, metric="accuracy"):
  return best_checkpoints.TopKCheckpointExporter(
      str(tmp_path / "best"), metric_name=metric, metric_comp=comp, k=k)


def export(exporter, checkpoint, step, value, key="accuracy"):
  checkpoint.v.assign(float(step))
  return exporter.maybe_export_checkpoint(
      checkpoint, {key: tf.constant(value), "loss": 1.0 / step}, step)


def manifest(tmp_path):
  with open(tmp_path / "best" / best_checkpoints.MANIFEST) as f:
    return json.load(f)


def test_keeps_top_k_best_first_and_deletes_evicted(tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  for step, value in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.9)]:
    export(exporter, checkpoint, step, value)
  kept = manifest(tmp_path)["checkpoints"]
  assert [e["global_step"] for e in kept] == [40, 20]
  assert kept[0]["metrics"] == {"accuracy": pytest.approx(0.9),
                                "loss": pytest.approx(1 / 40)}
  files = sorted(os.listdir(tmp_path / "best"))
  assert not [f for f in files if f.startswith("best_ckpt-10.")
              or f.startswith("best_ckpt-30.")]
  # The best is what TF and TFM tooling find, with its value restored.
  best = tf.train.latest_checkpoint(str(tmp_path / "best"))
  assert best.endswith("best_ckpt-40")
  assert tf.train.load_checkpoint(best).get_tensor(
      "v/.ATTRIBUTES/VARIABLE_VALUE") == 40.0
  with open(tmp_path / "best" / "info.json") as f:
    info = json.load(f)
  assert info["best_ckpt_global_step"] == 40.0
  assert info["accuracy"] == pytest.approx(0.9)
  assert exporter.best_ckpt_logs["accuracy"] == pytest.approx(0.9)


def test_lower_is_better(tmp_path, checkpoint):
  exporter = make(tmp_path, comp="lower", k=1, metric="loss")
  for step in (10, 20, 30):
    export(exporter, checkpoint, step, 0.5)
  assert [e["global_step"] for e in exporter.kept] == [30]  # loss = 1/step.


def test_nan_and_inf_are_never_best(tmp_path, checkpoint):
  exporter = make(tmp_path, k=3)
  assert not export(exporter, checkpoint, 10, float("nan"))
  assert not export(exporter, checkpoint, 20, float("inf"))
  assert export(exporter, checkpoint, 30, 0.1)
  assert [e["global_step"] for e in exporter.kept] == [30]


def test_tie_keeps_the_older_checkpoint(tmp_path, checkpoint):
  exporter = make(tmp_path, k=1)
  assert export(exporter, checkpoint, 10, 0.8)
  assert not export(exporter, checkpoint, 20, 0.8)
  assert [e["global_step"] for e in exporter.kept] == [10]


def test_nested_metric_names_use_tfm_separator(tmp_path, checkpoint):
  exporter = make(tmp_path, k=1, metric="coco|AP")
  checkpoint.v.assign(1.0)
  exporter.maybe_export_checkpoint(
      checkpoint, {"coco": {"AP": 0.4, "AR": 0.5}}, 10)
  exporter.maybe_export_checkpoint(
      checkpoint, {"coco": {"AP": 0.3, "AR": 0.9}}, 20)
  assert exporter.kept[0]["global_step"] == 10
  assert exporter.best_ckpt_logs["coco"]["AP"] == pytest.approx(0.4)


def test_missing_metric_is_a_clear_error(tmp_path, checkpoint):
  exporter = make(tmp_path, metric="acc")
  with pytest.raises(ValueError, match="'acc' is not in the eval logs.*"
                     "accuracy"):
    export(exporter, checkpoint, 10, 0.5)


def unranked(tmp_path):
  """The checkpoints in `best/unranked/`, by prefix."""
  folder = tmp_path / "best" / best_checkpoints.UNRANKED
  return {name.split(".")[0] for name in os.listdir(folder)
          if name.endswith(".index")} if folder.exists() else set()


def test_state_survives_a_new_exporter(tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  export(exporter, checkpoint, 10, 0.5)
  export(exporter, checkpoint, 20, 0.7)
  again = make(tmp_path, k=2)
  assert [e["global_step"] for e in again.kept] == [20, 10]
  assert not export(again, checkpoint, 30, 0.4)


def test_crash_before_manifest_leaves_orphan_that_repair_removes(
    tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  export(exporter, checkpoint, 10, 0.5)
  # A crash after the checkpoint files were written, before the manifest:
  checkpoint.write(str(tmp_path / "best" / "best_ckpt-20"))
  (tmp_path / "best" / "best_checkpoints.json.tmp").write_text("{")
  repaired = make(tmp_path, k=2)
  assert [e["global_step"] for e in repaired.kept] == [10]
  names = os.listdir(tmp_path / "best")
  assert not [n for n in names if "best_ckpt-20" in n or n.endswith(".tmp")]


def test_entry_whose_files_vanished_is_dropped(tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  export(exporter, checkpoint, 10, 0.5)
  export(exporter, checkpoint, 20, 0.7)
  for name in os.listdir(tmp_path / "best"):
    if name.startswith("best_ckpt-20."):
      os.remove(tmp_path / "best" / name)
  repaired = make(tmp_path, k=2)
  assert [e["global_step"] for e in repaired.kept] == [10]
  assert manifest(tmp_path)["checkpoints"][0]["global_step"] == 10
  assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("-10")


def test_adopts_a_directory_written_by_tfm_exporter(tmp_path, checkpoint):
  from official.core import train_utils  # pylint: disable=g-import-not-at-top
  tfm = train_utils.BestCheckpointExporter(str(tmp_path / "best"), "accuracy",
                                           "higher")
  tfm.maybe_export_checkpoint(checkpoint, {"accuracy": 0.6}, 15)
  ours = make(tmp_path, k=2)
  assert [e["global_step"] for e in ours.kept] == [15]
  assert tf.train.latest_checkpoint(str(tmp_path / "best"))  # Not deleted.
  export(ours, checkpoint, 30, 0.7)
  assert [e["global_step"] for e in ours.kept] == [30, 15]


def test_ties_among_the_kept_rank_the_older_first_and_evict_the_newer(
    tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  assert export(exporter, checkpoint, 10, 0.8)
  assert export(exporter, checkpoint, 20, 0.8)
  # Best first, and among equals the older first: it is "the best".
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [
      10, 20]
  assert exporter.best_ckpt_path.endswith("best_ckpt-10")
  assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("-10")
  # A reloaded manifest ranks the tie the same way.
  assert [e["global_step"] for e in make(tmp_path, k=2).kept] == [10, 20]
  # A better checkpoint pushes out the newer of the two equals.
  assert export(exporter, checkpoint, 30, 0.9)
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [
      30, 10]
  names = os.listdir(tmp_path / "best")
  assert "best_ckpt-10.index" in names
  assert not [n for n in names if n.startswith("best_ckpt-20.")]


def test_a_reloaded_manifest_drops_a_nan_entry(tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  export(exporter, checkpoint, 10, 0.5)
  export(exporter, checkpoint, 20, 0.7)
  # A manifest whose best entry is NaN (hand-edited, or by an older
  # version), its checkpoint files present: JSON as Python writes it allows
  # NaN. Repair alone would keep the entry: its files exist.
  written = manifest(tmp_path)
  assert written["checkpoints"][0]["global_step"] == 20
  written["checkpoints"][0]["metrics"]["accuracy"] = float("nan")
  written["checkpoints"][0]["value"] = float("nan")
  (tmp_path / "best" / best_checkpoints.MANIFEST).write_text(
      json.dumps(written))
  assert "NaN" in (tmp_path / "best" / best_checkpoints.MANIFEST).read_text()

  reloaded = make(tmp_path, k=2)
  assert [e["global_step"] for e in reloaded.kept] == [10]
  assert reloaded.best_ckpt_logs["accuracy"] == pytest.approx(0.5)
  assert reloaded.best_ckpt_path.endswith("best_ckpt-10")
  # The manifest on disk is rewritten without it; its files are kept, out
  # of the ranking.
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [10]
  assert not [n for n in os.listdir(tmp_path / "best")
              if n.startswith("best_ckpt-20.")]
  assert unranked(tmp_path) == {"best_ckpt-20"}
  # A finite value below the dropped NaN still gets in.
  assert export(reloaded, checkpoint, 30, 0.6)
  assert [e["global_step"] for e in reloaded.kept] == [30, 10]


def test_a_value_between_the_worst_and_the_best_kept_gets_in(
    tmp_path, checkpoint):
  exporter = make(tmp_path, k=2)
  assert export(exporter, checkpoint, 10, 0.5)
  assert export(exporter, checkpoint, 20, 0.9)
  # Not the best, but better than the worst of a full top-2: it replaces it.
  assert export(exporter, checkpoint, 30, 0.7)
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [
      20, 30]
  assert not [n for n in os.listdir(tmp_path / "best")
              if n.startswith("best_ckpt-10.")]


def test_an_interrupted_exports_orphan_is_removed_not_kept_unranked(
    tmp_path, checkpoint):
  # unranked/ is for what a damaged manifest ranked; this one is intact.
  exporter = make(tmp_path, k=2)
  export(exporter, checkpoint, 10, 0.5)
  checkpoint.write(str(tmp_path / "best" / "best_ckpt-20"))
  make(tmp_path, k=2)
  left = [name for _, _, names in os.walk(tmp_path / "best")
          for name in names]
  assert not [n for n in left if n.startswith("best_ckpt-20")], left
  assert not (tmp_path / "best" / best_checkpoints.UNRANKED).exists()


def test_a_reevaluated_checkpoint_is_kept_once(tmp_path, checkpoint):
  exporter = make(tmp_path, k=3)
  assert export(exporter, checkpoint, 10, 0.5)
  assert not export(exporter, checkpoint, 10, 0.5)  # Evaluated again.
  assert not export(exporter, checkpoint, 10, 0.6)
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [10]


def test_a_nan_best_that_tfms_exporter_recorded_is_not_adopted(
    tmp_path, checkpoint):
  from official.core import train_utils  # pylint: disable=g-import-not-at-top
  tfm = train_utils.BestCheckpointExporter(str(tmp_path / "best"), "accuracy",
                                           "higher")
  tfm.maybe_export_checkpoint(checkpoint, {"accuracy": float("nan")}, 15)
  tfms = os.path.basename(tf.train.latest_checkpoint(str(tmp_path / "best")))
  ours = make(tmp_path, k=2)
  assert ours.kept == [] and ours.best_ckpt_logs is None
  assert export(ours, checkpoint, 30, 0.1)
  assert [e["global_step"] for e in ours.kept] == [30]
  # TFM's checkpoint is not ranked, but it is the user's: kept, moved.
  assert unranked(tmp_path) == {tfms}


def test_a_changed_metric_keeps_the_checkpoints_it_cannot_rank(
    tmp_path, checkpoint, caplog):
  exporter = make(tmp_path, k=2)
  export(exporter, checkpoint, 10, 0.5)
  export(exporter, checkpoint, 20, 0.7)
  # The next run ranks by a metric the recorded evaluations do not have.
  by_auc = make(tmp_path, k=2, metric="auc")
  assert by_auc.kept == [] and by_auc.best_ckpt_path is None
  assert unranked(tmp_path) == {"best_ckpt-10", "best_ckpt-20"}
  assert "has no 'auc'" in caplog.text
  restored = tf.train.Checkpoint(v=tf.Variable(0.0))
  restored.read(str(tmp_path / "best" / best_checkpoints.UNRANKED /
                    "best_ckpt-20")).assert_consumed()
  assert restored.v.numpy() == 20.0
  assert export(by_auc, checkpoint, 30, 0.9, key="auc")
  assert [e["global_step"] for e in by_auc.kept] == [30]



def test_a_smaller_k_moves_the_checkpoints_beyond_it_to_unranked(
    tmp_path, checkpoint, caplog):
  exporter = make(tmp_path, k=3)
  for step, value in ((10, 0.5), (20, 0.7), (30, 0.6)):
    assert export(exporter, checkpoint, step, value)
  # `best_checkpoint_top_k=1` for the next run (an evaluator's override, or
  # a typo): the two it no longer ranks are kept, out of the ranking.
  smaller = make(tmp_path, k=1)
  assert [e["global_step"] for e in smaller.kept] == [20]
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [20]
  assert unranked(tmp_path) == {"best_ckpt-10", "best_ckpt-30"}
  assert "best_ckpt-30 is beyond best_checkpoint_top_k=1" in caplog.text


def test_exporters_beside_each_other_rank_against_each_others_records(
    tmp_path, checkpoint):
  # Two evaluators on one model_dir, each with its own exporter, k=1.
  first, second = make(tmp_path, k=1), make(tmp_path, k=1)
  assert export(first, checkpoint, 100, 0.6)
  assert export(second, checkpoint, 200, 0.7)
  # Better than what the first one kept, worse than the second one's.
  assert not export(first, checkpoint, 300, 0.65)
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [
      200]
  assert first.best_ckpt_path.endswith("best_ckpt-200")
  assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("-200")
  names = os.listdir(tmp_path / "best")
  assert "best_ckpt-200.index" in names
  assert not [n for n in names
              if n.startswith(("best_ckpt-100.", "best_ckpt-300."))], names
  # The next evaluator to start keeps the best too.
  assert [e["global_step"] for e in make(tmp_path, k=1).kept] == [200]


@pytest.fixture(params=["", "after a stop signal"])
def signal_came(request):
  """Whether a stop signal came (the run's flag set) as they export."""
  if request.param:
    signalled.set()
  yield request.param
  signalled.clear()


def test_two_exporters_of_one_step_at_once_write_it_once(tmp_path,
                                                         signal_came):
  # The trainer and an evaluator beside it evaluated the same step and
  # export it at the same moment (the chaos run found their writes of
  # `best_ckpt-<step>` colliding in TensorFlow's `_temp` staging). After a
  # signal a bid still waits for the larger one to withdraw: had it given
  # up, neither would have written the step.
  exporters = [make(tmp_path, k=2), make(tmp_path, k=2)]
  checkpoints = [tf.train.Checkpoint(v=tf.Variable(tf.zeros([1 << 19])))
                 for _ in exporters]
  for round_ in range(1, 13):
    step, barrier, kept = 10 * round_, threading.Barrier(2), {}

    def run(i, step=step, barrier=barrier, kept=kept):
      checkpoints[i].v.assign(tf.fill([1 << 19], float(step)))
      barrier.wait()
      kept[i] = exporters[i].maybe_export_checkpoint(
          checkpoints[i], {"accuracy": step / 1000.0}, step)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    assert sorted(kept.values()) == [False, True], (step, kept)
  assert [e["global_step"] for e in manifest(tmp_path)["checkpoints"]] == [
      120, 110]
  restored = tf.train.Checkpoint(v=tf.Variable(tf.zeros([1 << 19])))
  restored.read(str(tmp_path / "best" / "best_ckpt-120")).assert_consumed()
  assert float(restored.v[-1]) == 120.0
  left = os.listdir(tmp_path / "best")
  assert not [n for n in left if "_temp" in n or ".tmp" in n], left
  assert not os.listdir(tmp_path / "best" / best_checkpoints.BIDS)
