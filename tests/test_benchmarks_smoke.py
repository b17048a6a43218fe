"""The benchmarks' arithmetic and report on made-up figures; nothing timed."""

import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import report
from benchmarks import training_loops
# pylint: enable=g-import-not-at-top,wrong-import-position

DIGITS = training_loops.Workload("digits_convnet", global_batch_size=10,
                                 train_steps=6, steps_per_loop=2,
                                 summary_interval=2, warmup_steps=4)


def test_figures_time_the_same_window_whatever_the_first_loop():
  # One step first (ours), or a whole loop (stock TFM), then 1 s a step.
  ours = training_loops.figures(DIGITS, [
      (1, 5.0, 100.0), (2, 7.0, 110.0), (4, 9.0, 120.0), (6, 11.0, 130.0)])
  stock = training_loops.figures(DIGITS, [
      (2, 6.0, 100.0), (4, 9.0, 120.0), (6, 11.0, 125.0)])
  assert ours["examples_per_second"] == stock["examples_per_second"] == 10.0
  assert ours["time_to_first_step_seconds"] == ours["startup_seconds"] == 5.0
  assert stock["first_loop_steps"] == 2
  assert stock["startup_seconds"] == 5.0  # 6 s less one steady step.
  assert ours["peak_rss_mib"] == 130.0  # At the last progress line.


def test_figures_refuse_a_run_without_a_loop_end_at_warmup_steps():
  with pytest.raises(ValueError, match="warmup_steps=4"):
    training_loops.figures(DIGITS, [(3, 1.0, 1.0), (6, 2.0, 1.0)])


def test_progress_marks_read_only_progress_lines():
  lines = [(0.5, "I1129 some log line", 50.0),
           (1.0, "step 1/6 | accuracy 0.1 | first step after 1.0s", 60.0),
           (2.0, "eval @ step 2 | accuracy 0.5", 70.0),
           (3.0, "step 6/6 | 10 ex/s", 80.0)]
  assert training_loops.progress_marks(lines) == [(1, 1.0, 60.0),
                                                  (6, 3.0, 80.0)]


def _variant(examples_per_second, first_step, first_loop):
  run = {"examples_per_second": examples_per_second,
         "time_to_first_step_seconds": first_step,
         "startup_seconds": first_step, "peak_rss_mib": 800.0,
         "process_peak_rss_mib": 900.0, "available_cores": 2.0,
         "first_loop_steps": first_loop}
  return {"runs": [run], "median": run}


def _results():
  variants = {"ours": _variant(95.0, 5.0, 1),
              "stock_tfm": _variant(90.0, 6.0, 2),
              "handwritten": _variant(100.0, 4.0, 1),
              "keras_fit": _variant(80.0, 6.0, 2),
              "keras_fit_tensorboard": _variant(76.0, 6.5, 2),
              "ours_steps_per_loop_200": _variant(98.0, 5.0, 1),
              "ours_xla": _variant(60.0, 7.0, 1),
              "ours_one_replica_mirror": _variant(96.9, 5.0, 1),
              "ours_tf_data_pool": _variant(90.0, 5.0, 1)}
  resnet_variants = {"ours": _variant(8.0, 10.0, 1),
                     "stock_tfm": _variant(8.0, 11.0, 2),
                     "handwritten": _variant(8.0, 9.0, 1),
                     "keras_fit": _variant(16.0, 12.0, 2),
                     "ours_xla": _variant(3.0, 12.0, 1)}
  per_step_variants = {"ours": _variant(50.0, 5.0, 1),
                       "stock_tfm": _variant(45.0, 6.0, 1),
                       "handwritten": _variant(80.0, 4.0, 1),
                       "keras_fit": _variant(40.0, 6.0, 1)}

  def loops(variants, workload=DIGITS):
    return {"config": dataclasses.asdict(workload), "params_override": "x=1",
            "repeats": 1, "variants": variants,
            "ours_over": training_loops.ratios(variants)}
  pipelines = {"images_per_second": {"ours": 100.0, "reference": 99.0,
                                     "ours_autotune_on": 97.0,
                                     "ours_one_thread": 50.0},
               "ours_over_reference": 100 / 99,
               "runs": {"ours": [100.0], "reference": [99.0],
                        "ours_autotune_on": [97.0], "ours_one_thread": [50.0]}}
  save = {"bytes": 2000, "save_seconds": 0.01, "first_save_seconds": 0.02,
          "saves": 1}
  return {
      "machine": {"cpu": "a CPU", "cores": 2, "memory_gib": 1.0,
                  "python": "3", "tensorflow": "2", "tf_models_official": "2",
                  "commit": "abc1234", "uncommitted_changes": False,
                  "date": "today"},
      "quick": True, "seconds": 60.0,
      "training_loops": {"digits_convnet": loops(variants),
                         "resnet50": loops(resnet_variants),
                         "digits_convnet_per_step": loops(
                             per_step_variants, dataclasses.replace(
                                 DIGITS, steps_per_loop=1, targets=False))},
      "input_pipelines": {"sizes": {"copies": 1, "batch_size": 2,
                                    "warmup": 1, "batches": 1, "eval_epochs": 1,
                                    "passes": 1},
                          "records": {"train": 8, "eval": 6},
                          "train": pipelines, "eval": pipelines},
      "flops": {"peak_gflops": 100.0, "gflops_by_size": {"1024": 100.0},
                "resnet50_forward_flops_per_example": 8e9,
                "resnet50_training_step_flops_per_example": 24e9},
      "checkpoint_cost": {
          "digits_convnet": {"with_iterator": {**save, "bytes": 3000},
                             "without_iterator": save,
                             "with_iterator_async_call": save,
                             "iterator_bytes": 1000,
                             "checkpoint_interval_steps": 100,
                             "interval_train_seconds": 1.0,
                             "save_over_interval": 0.01,
                             "shuffle_buffer_size": 2000},
          "resnet50_model": save,
          "resnet50_iterator": {
              "records": 16, "record_bytes": 16000, "batch_size": 2,
              "decoded_batch_bytes": 2 * 224 * 224 * 3 * 4,
              "default_policy_error": "SampleDistortedBoundingBoxV2 is "
                                      "stateful.",
              "by_shuffle_buffer": {"4": {"bytes": 5000, "save_seconds": 0.1},
                                    "16": {"bytes": 17000,
                                           "save_seconds": 0.2}}}},
      "loop_costs": {"summaries": {"orbit": 0.0012, "ours": 0.0003},
                     "global_step_read": {"orbit": 0.00014, "ours": 0.00004},
                     "read_train_logs": {"eager": 0.0045, "traced": 0.00045},
                     "empty_loop": {"ours": 0.0011},
                     "step": {"ours": 0.0050, "per_step_check": 0.0051}},
      "startup": {"variants": {
          name: {"median": {"import_seconds": seconds,
                            "full_collections": collections,
                            "collect_seconds": collect,
                            "frozen_objects": frozen, "peak_rss_mib": rss}}
          for name, seconds, collections, collect, frozen, rss in (
              ("launcher", 3.5, 0, 0.0002, 800000, 750.0),
              ("collector_on", 4.25, 7, 0.0001, 500000, 748.0),
              ("no_freeze", 3.6, 0, 0.33, 0, 749.0))}},
  }


def test_report_states_each_target_met_or_missed():
  text = report.render(_results())
  assert ("| digits_convnet: ours / handwritten examples/s >= 0.97 | 0.950 "
          "(each repeat 0.950 to 0.950; 0 of 1 >= 0.97) | **missed** |") in text
  assert ("| digits_convnet: ours / stock_tfm examples/s >= 1.0 | 1.056 "
          "(each repeat 1.056 to 1.056; 1 of 1 >= 1.0) | met |") in text
  assert ("| resnet50: ours / keras_fit examples/s >= 1.0 | 0.500 (each "
          "repeat 0.500 to 0.500; 0 of 1 >= 1.0) | **missed** |") in text
  assert ("| digits_convnet: ours / keras_fit_tensorboard examples/s >= 1.0 "
          "| 1.250 (each repeat 1.250 to 1.250; 1 of 1 >= 1.0) | met |") in text
  # ResNet's runs had no such variant: no row.
  assert "resnet50: ours / keras_fit_tensorboard" not in text
  assert "| digits_convnet: our time to first step <= stock TFM's |" in text
  assert ("| ResNet train input pipeline: ours / reference >= 1.0 | 1.010 "
          "(ours ahead in 1 of 1 passes) | met |") in text
  assert "commit | abc1234 |" in text
  assert "Not run on a GPU yet" in text


def test_report_derives_the_iterator_growth_per_buffered_record():
  text = report.render(_results())
  # (17000 - 5000) bytes over 12 more records: 1.0 KB each.
  assert "grows by 1.0 KB per buffered record" in text
  assert "off: XLA is slower here" in text
  assert ("| `runtime.enable_xla` off on the CPU: ResNet50 | XLA on: 3.0 ex/s "
          "vs 8.0 (0.38x), first step +2.0 s |") in text


def test_report_shows_the_loop_costs_behind_the_loop_defaults():
  text = report.render(_results())
  assert ("| 5.0 ms a step vs 5.1 ms with a check in the step that keeps the "
          "first bad step (+2.0%) | no op in the step |") in text
  assert ("writing one loop's 5 values: 0.30 ms vs 1.2 ms with Orbit's "
          "`SummaryManager`; a step read 0.04 ms vs 0.14 ms") in text
  assert "| 0.45 ms vs 4.5 ms eagerly |" in text
  rows = [line.split(" | ")[0] for line in text.splitlines()
          if line.startswith("| ")]
  # Host costs follow the loop defaults; ResNet's XLA row follows digits'.
  assert rows.index("| a loop's outputs written as one summary op per "
                    "directory (`ScalarSummaryManager`), a mirrored global "
                    "step read through its local copy "
                    "(`driver.host_readable`)") == (
                        rows.index("| progress, hooks, metrics read the "
                                   "device once per loop") + 1)
  assert rows.index("| `runtime.enable_xla` off on the CPU: ResNet50") == (
      rows.index("| `runtime.enable_xla` off on the CPU") + 1)


def test_report_shows_what_the_collector_off_at_import_saves():
  text = report.render(_results())
  assert ("| imports 3.50 s vs 4.25 s with the collector on (7 full "
          "collections); a full collection after them 0.20 ms vs 330.0 ms "
          "unfrozen (0 vs 800000 objects frozen); peak RSS +2 MiB "
          "(`startup.py`) | 0.75 s off every launch's time to first step |"
          ) in text


def test_report_compares_host_work_a_loop_but_sets_no_target_on_it():
  text = report.render(_results())
  # Ours: 1/50 - 1/95 s a step of 10 examples; Keras 1/40 - 1/80, ...
  assert ("each loop costs about 94.7 ms of host work (Keras `Model.fit` "
          "125.0 ms; hand-written `tf.function` loop 25.0 ms; stock TFM "
          "(`train_lib.run_experiment`, `base_trainer.Trainer`) 111.1 ms)"
          ) in text
  assert "### digits_convnet_per_step" in text
  assert "digits_convnet_per_step: ours /" not in text


def test_report_flags_a_default_its_own_figure_does_not_justify():
  text = report.render(_results())
  assert ("| 95 ex/s vs 97 with TFM's one-replica `MirroredStrategy` (0.980x) "
          "| **not justified by this figure**: the one-replica mirror is "
          "2.0% faster here |") in text


def test_report_separates_the_input_pool_from_the_loop_overhead():
  text = report.render(_results())
  # The private pool's gain (95 vs 90) and the loop against the hand-written
  # one without it (90 / 100).
  assert ("| 95 ex/s vs 90 with tf.data's own pool of one thread per core "
          "(1.056x) | the model's ops use every core") in text
  assert ("| digits_convnet: ours with tf.data's own pool / handwritten "
          "examples/s >= 0.97 (the loop's overhead alone) | 0.900 (each "
          "repeat 0.900 to 0.900; 0 of 1 >= 0.97) | **missed** |") in text


def test_report_names_runs_far_below_their_median_and_calls_it_noisy():
  results = _results()
  text = report.render(results)
  assert "The machine was quiet." in text
  ours = results["training_loops"]["digits_convnet"]["variants"]["ours"]
  ours["runs"] = [dict(ours["median"], examples_per_second=e)
                  for e in (95.0, 96.0, 85.0)]  # 85 < 0.9 * 95.
  text = report.render(results)
  assert ("1 of 20 training runs were more than 10% below their variant's "
          "median (digits_convnet ours (repeat 3)): the machine slowed down "
          "during them") in text
  assert "The machine was quiet." not in text
