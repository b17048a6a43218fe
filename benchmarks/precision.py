"""bfloat16 against float32: what it costs in accuracy, what it saves in time.

    python benchmarks/precision.py [--seeds=5] [--resnet_steps=100] [--out=FILE]
    python benchmarks/precision.py --smoke      # tiny: does it run?

Each run is a fresh `launchers/train.py` process in deterministic mode
(`runtime.deterministic`, `runtime.seed`): for one seed, float32 and
bfloat16 (`runtime.mixed_precision_dtype`) start from the same weights and
read the same batches in the same order, so what differs is the precision.
The two run one after the other, which of them first alternating by seed:

    digits    `digits_convnet` trained and evaluated to its end (500 steps),
              once per seed: its final validation accuracy, and the run's
              CPU time (user and system, all threads) and wall time
    resnet50  `resnet50_imagenet_ctl` at global batch 2 on JPEG records
              of the bundled photographs and digits (`_imagenet_records`:
              8 images, each written many times, read in order), cropped
              as for evaluation (`is_training=false`: the training crops
              are random without a seed, which deterministic mode
              refuses), `resnet_steps` steps from the same initial
              weights, momentum SGD at a constant rate of 0.001: the mean
              training loss of every loop of 5 steps (from the train
              summaries), and the run's CPU and wall time

The accuracy of digits decides whether bfloat16 costs accuracy there (its
seeds give the noise); ResNet50's curve shows whether the loss follows
float32's over the same steps (it learns the 8 images: a curve that
moves). The CPU's bfloat16 instructions are in the record (`machine`):
without AVX512-BF16 or AMX TensorFlow emulates bfloat16 and it is slower.

The record, `results/<date>-precision[-<label>].json`, is rendered by
`run_all.py --render` into `RESULTS.md`'s "bfloat16 against float32".
"""

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import _common
# pylint: enable=g-import-not-at-top,wrong-import-position

TRAIN = os.path.join(_common.REPO, "launchers", "train.py")
DTYPES = ("float32", "bfloat16")
RESNET_LOOP = 5
LR = 0.001
SIZES = {"seeds": 5, "resnet_steps": 100}
SMOKE_SIZES = {"seeds": 1, "resnet_steps": 2 * RESNET_LOOP}


def _train(experiment: str, mode: str, model_dir: str, overrides: str
           ) -> Dict[str, Any]:
  done = _common.run_child([
      _common.python(), TRAIN, f"--experiment={experiment}", f"--mode={mode}",
      f"--model_dir={model_dir}", f"--params_override={overrides}"],
                           timeout=1800)
  return {"cpu_s": round(done["cpu_s"], 2), "wall_s": round(done["wall_s"], 2)}


def _precision(dtype: str, seed: int) -> str:
  return (f"runtime.deterministic=true,runtime.seed={seed},"
          f"runtime.mixed_precision_dtype={dtype}")


def digits(seed: int, dtype: str, directory: str) -> Dict[str, Any]:
  """One digits_convnet run to its end; its accuracy and times."""
  model_dir = os.path.join(directory, f"digits_{seed}_{dtype}")
  run = _train("digits_convnet", "train_and_eval", model_dir,
               _precision(dtype, seed))
  with open(os.path.join(model_dir, "run_summary.json")) as f:
    summary = json.load(f)
  shutil.rmtree(model_dir, ignore_errors=True)
  return dict(run, seed=seed, dtype=dtype,
              accuracy=round(float(summary["eval_metrics"]["accuracy"]), 5),
              step=summary["global_step"])


def loss_curve(model_dir: str) -> List[List[float]]:
  """`[[step, training_loss], ...]` from a run's train summaries."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  points = {}
  for path in sorted(glob.glob(os.path.join(model_dir, "train",
                                            "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "training_loss":
          points[event.step] = float(tf.make_ndarray(value.tensor))
  return [[step, round(points[step], 6)] for step in sorted(points)]


def resnet50(seed: int, dtype: str, steps: int, records: str,
             directory: str) -> Dict[str, Any]:
  """`steps` of ResNet50 at global batch 2; its loss curve and times."""
  model_dir = os.path.join(directory, f"resnet50_{seed}_{dtype}")
  data = (f"task.train_data.input_path={records}/train-*,"
          "task.train_data.is_training=false,"
          "task.train_data.global_batch_size=2,"
          f"task.validation_data.input_path={records}/validation-*,")
  run = _train("resnet50_imagenet_ctl", "train", model_dir, data + ",".join((
      # The recipe's schedule warms up over 5 epochs of ImageNet: at batch
      # 2 its rate stays near 0 for millions of steps, and nothing moves.
      "trainer.optimizer_config.optimizer.type=sgd",
      "trainer.optimizer_config.optimizer.sgd.momentum=0.9",
      "trainer.optimizer_config.learning_rate.type=constant",
      f"trainer.optimizer_config.learning_rate.constant.learning_rate={LR}",
      f"trainer.train_steps={steps}", f"trainer.steps_per_loop={RESNET_LOOP}",
      f"trainer.summary_interval={RESNET_LOOP}",
      f"trainer.checkpoint_interval={steps}", _precision(dtype, seed))))
  curve = loss_curve(model_dir)
  shutil.rmtree(model_dir, ignore_errors=True)
  return dict(run, seed=seed, dtype=dtype, loss=curve)


def measure(sizes: Dict[str, Any]) -> Dict[str, Any]:
  """Digits over `seeds` seeds, then ResNet50's curves over one."""
  # Here, not at the top: `run_all` imports this module to render, where
  # the tests' image fixtures may be absent.
  from benchmarks import _imagenet_records  # pylint: disable=g-import-not-at-top
  directory = tempfile.mkdtemp(prefix="bench_precision_")
  out: Dict[str, Any] = {"sizes": sizes, "digits": [], "resnet50": []}
  try:
    for seed in range(sizes["seeds"]):
      for dtype in _common.rotated(DTYPES, seed):
        row = digits(seed, dtype, directory)
        out["digits"].append(row)
        print(f"digits seed {seed} {dtype}: accuracy {row['accuracy']:.4f}, "
              f"{row['cpu_s']:.1f} s CPU", flush=True)
    # Read once, in order, without repeating: enough copies for the steps.
    copies = -(-sizes["resnet_steps"] * 2 // _imagenet_records.NUM_TRAIN_IMAGES)
    files = _imagenet_records.write(os.path.join(directory, "records"),
                                    copies)
    records = os.path.dirname(files["train"][0])
    for dtype in DTYPES:
      row = resnet50(0, dtype, sizes["resnet_steps"], records, directory)
      out["resnet50"].append(row)
      print(f"resnet50 {dtype}: loss {row['loss'][0][1]:.4f} at step "
            f"{row['loss'][0][0]} -> {row['loss'][-1][1]:.4f} at step "
            f"{row['loss'][-1][0]}, {row['cpu_s']:.1f} s CPU", flush=True)
  finally:
    shutil.rmtree(directory, ignore_errors=True)
  return out


def summary(record: Dict[str, Any]) -> Dict[str, Any]:
  """The figures `RESULTS.md` shows of a record's `precision`.

  `digits`: per dtype, the accuracies' spread, and the spread of the
  per-seed differences (bfloat16 minus float32) and CPU ratios (float32's
  CPU time over bfloat16's: above 1, bfloat16 is cheaper). `resnet50`: the
  curves' first and last losses and the largest gap between them.
  """
  by = {(row["seed"], row["dtype"]): row for row in record["digits"]}
  seeds = sorted({seed for seed, _ in by})
  paired = [s for s in seeds if all((s, d) in by for d in DTYPES)]
  out: Dict[str, Any] = {"digits": {
      dtype: _common.spread([by[s, dtype]["accuracy"] for s in paired])
      for dtype in DTYPES} if paired else {}}
  if paired:
    out["digits"]["difference"] = _common.spread(
        [by[s, "bfloat16"]["accuracy"] - by[s, "float32"]["accuracy"]
         for s in paired])
    out["digits"]["cpu_ratio"] = _common.spread(
        [by[s, "float32"]["cpu_s"] / by[s, "bfloat16"]["cpu_s"]
         for s in paired])
  curves = {row["dtype"]: row for row in record["resnet50"]}
  if all(d in curves for d in DTYPES):
    f32, bf16 = (dict(map(tuple, curves[d]["loss"])) for d in DTYPES)
    steps = sorted(set(f32) & set(bf16))
    out["resnet50"] = {
        "steps": steps[-1] if steps else 0,
        "first": {d: curves[d]["loss"][0][1] for d in DTYPES},
        "last": {d: curves[d]["loss"][-1][1] for d in DTYPES},
        "largest_gap": max((abs(f32[s] - bf16[s]) for s in steps),
                           default=None),
        "cpu_ratio": curves["float32"]["cpu_s"] / curves["bfloat16"]["cpu_s"],
    }
  return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Measures, prints the summary, writes the record."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=SIZES["seeds"])
  parser.add_argument("--resnet_steps", type=int,
                      default=SIZES["resnet_steps"])
  parser.add_argument("--smoke", action="store_true",
                      help="One seed, two ResNet loops, a scratch file.")
  parser.add_argument("--label", default="")
  parser.add_argument("--out", help="The record's path (default: "
                      "results/<date>-precision[-<label>].json).")
  args = parser.parse_args(argv)
  sizes = SMOKE_SIZES if args.smoke else {"seeds": args.seeds,
                                          "resnet_steps": args.resnet_steps}
  started = time.time()
  record = {"machine": _common.machine(), "label": args.label,
            "precision": measure(sizes)}
  record["minutes"] = round((time.time() - started) / 60, 1)
  print(json.dumps(summary(record["precision"]), indent=1))
  out = args.out or (os.path.join(tempfile.mkdtemp(prefix="bench_smoke_"),
                                  "precision.json") if args.smoke else
                     _common.script(os.path.join("results", time.strftime(
                         "%Y-%m-%d-%H%M", time.gmtime()) + "-precision" + (
                             f"-{args.label}" if args.label else "") + ".json")))
  _common.write_json(out, record)
  print("wrote", out)
  return record


if __name__ == "__main__":
  main()
