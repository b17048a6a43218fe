"""ResNet50's achieved FLOP/s against this machine's measured fp32 matmul peak.

    python benchmarks/flops.py [--smoke] [--training_loops=FILE] [--out=FILE]

The peak: float32 `tf.linalg.matmul` of n x n matrices (2 n^3 FLOPs) in a
`tf.function`, median of several calls per n after one warm-up call, the best
n's median taken. FLOPs per example: TFM's `train_utils.try_count_flops` on
the ResNet50 of `resnet50_imagenet_ctl` at batch 1 (TensorFlow's profiler,
which counts a multiply-add as 2 FLOPs), times 3 for a training step
(forward, plus a backward pass of about twice the forward's work; the
weight update and L2 add well under 1 %). With `--training_loops`, the JSON
of `training_loops.py`, each variant's median examples/s on ResNet50 is
turned into achieved FLOP/s and a fraction of the peak.
"""

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf

from official.core import train_utils

from benchmarks import _common
# pylint: enable=g-import-not-at-top,wrong-import-position

TRAINING_STEP_OVER_FORWARD = 3


def matmul_peak(sizes: Sequence[int], calls: int) -> Dict[str, Any]:
  """Median GFLOP/s of float32 matmuls of each size; `peak` the best."""
  product = tf.function(lambda a, b: tf.reduce_sum(tf.linalg.matmul(a, b)))
  by_size = {}
  for n in sizes:
    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])
    product(a, b).numpy()  # Traces and warms up.
    seconds = _common.timed(lambda: product(a, b).numpy(), calls)  # pylint: disable=cell-var-from-loop
    by_size[str(n)] = 2 * n**3 / _common.median(seconds) / 1e9
  return {"gflops_by_size": by_size, "peak_gflops": max(by_size.values())}


def resnet50_forward_flops() -> int:
  """FLOPs of one ResNet50 forward pass on one 224 x 224 image."""
  from experiments.imagenet import resnet50  # pylint: disable=g-import-not-at-top
  model = resnet50.build_resnet50(resnet50.ResNet50Config())
  return int(train_utils.try_count_flops(model))


def achieved(training_loops: Dict[str, Any], step_flops_per_example: float,
             peak_gflops: float) -> Dict[str, Dict[str, float]]:
  """Achieved GFLOP/s and fraction of the peak of each ResNet50 variant."""
  out = {}
  for name, variant in training_loops["resnet50"]["variants"].items():
    gflops = (variant["median"]["examples_per_second"]
              * step_flops_per_example / 1e9)
    out[name] = {"gflops": gflops, "fraction_of_peak": gflops / peak_gflops}
  return out


def measure(smoke: bool, training_loops: Optional[Dict[str, Any]]
            ) -> Dict[str, Any]:
  """The peak, ResNet50's FLOPs, and achieved FLOP/s if runs are given."""
  start = time.perf_counter()
  peak = matmul_peak((1024, 2048) if smoke else (1024, 2048, 4096),
                     3 if smoke else 7)
  forward = resnet50_forward_flops()
  out = {**peak, "resnet50_forward_flops_per_example": forward,
         "resnet50_training_step_flops_per_example":
             TRAINING_STEP_OVER_FORWARD * forward,
         "seconds": time.perf_counter() - start}
  print(f"fp32 matmul peak {peak['peak_gflops']:.1f} GFLOP/s "
        f"({peak['gflops_by_size']}); ResNet50 forward "
        f"{forward / 1e9:.2f} GFLOPs per example", flush=True)
  if training_loops:
    out["achieved"] = achieved(training_loops, TRAINING_STEP_OVER_FORWARD
                               * forward, peak["peak_gflops"])
    for name, figures in out["achieved"].items():
      print(f"  {name}: {figures['gflops']:.1f} GFLOP/s, "
            f"{figures['fraction_of_peak']:.1%} of peak", flush=True)
  return out


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark; see the module docstring."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true",
                      help="Small sizes: checks that it runs.")
  parser.add_argument("--training_loops",
                      help="JSON written by training_loops.py --out.")
  parser.add_argument("--out", help="Write the results as JSON here.")
  args = parser.parse_args(argv)
  training_loops = None
  if args.training_loops:
    with open(args.training_loops) as f:
      training_loops = json.load(f)["idle"]
  results = measure(args.smoke, training_loops)
  if args.out:
    _common.write_json(args.out, results)
  return results


if __name__ == "__main__":
  main()
