"""ResNet input pipelines: ours against the reference `input_fn`, images/s.

    python benchmarks/input_pipelines.py [--smoke] [--busy=N] [--out=FILE]

On the same JPEG TFRecords (`_imagenet_records`) and batch size:

    ours       `experiments/imagenet/input_pipeline.build_dataset`
    reference  `official/legacy/image_classification/resnet/
               imagenet_preprocessing.input_fn`
    ours_autotune_on     ours with tf.data's autotuning on (by default it
               is off, and AUTOTUNE is one parallel call per core)
    ours_one_thread      ours with `private_threadpool_size=1`: no
               parallel decoding, what the parallel map and prefetch buy

Training (random crop and flip, endless): each pass opens a fresh iterator,
skips `warmup` batches (the shuffle buffer fills) and times the next
`batches`. Evaluation (central crop, one epoch): each pass times
`eval_epochs` evaluations, each a fresh iterator from its creation to its
end, as an evaluation pays it. Passes of the pipelines are interleaved, each
pass in an order rotated by one (A B C D, B C D A, ...); the figures are
medians. Nothing trains, so
the pipeline has both cores to itself; in training it shares them with the
model.
"""

import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position

from official.legacy.image_classification.resnet import imagenet_preprocessing

from benchmarks import _common
from benchmarks import _imagenet_records
from experiments.imagenet import input_pipeline
# pylint: enable=g-import-not-at-top,wrong-import-position

# Training passes of about 0.6 s (40 batches) and evaluation passes of about
# 1.8 s (3 epochs of 768 images): with one epoch (0.6 s) a pass ran at one of
# two speeds 15% apart, and the ratio of medians moved from 1.085 to 0.950
# between two runs of the same code.
SIZES = {"copies": 128, "batch_size": 32, "warmup": 4, "batches": 40,
         "eval_epochs": 3, "passes": 11}
SMOKE_SIZES = {"copies": 8, "batch_size": 16, "warmup": 3, "batches": 4,
               "eval_epochs": 1, "passes": 2}


def pipelines(files, batch_size: int) -> Dict[str, Dict[str, Callable]]:
  """`{split: {name: () -> tf.data.Dataset}}` for each pipeline compared."""

  def ours(is_training, autotune=None, threads=0):
    return lambda: input_pipeline.build_dataset(
        input_pipeline.ImageNetDataConfig(
            input_path=",".join(
                files["train" if is_training else "validation"]),
            is_training=is_training, global_batch_size=batch_size,
            drop_remainder=is_training, private_threadpool_size=threads,
            autotune=autotune))

  def reference(is_training):
    # The reference runner's calls: drop the remainder only in training.
    return lambda: imagenet_preprocessing.input_fn(
        is_training=is_training, data_dir=None, batch_size=batch_size,
        drop_remainder=is_training,
        filenames=files["train" if is_training else "validation"])

  return {split: {"ours": ours(training), "reference": reference(training),
                  "ours_autotune_on": ours(training, autotune=True),
                  "ours_one_thread": ours(training, threads=1)}
          for split, training in (("train", True), ("eval", False))}


def train_pass(build, batch_size: int, warmup: int, batches: int) -> float:
  """Images/s of `batches` batches after `warmup` ones, on a fresh iterator."""
  iterator = iter(build())
  for _ in range(warmup):
    next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return batches * batch_size / (time.perf_counter() - start)


def eval_pass(build, epochs: int) -> float:
  """Images/s of `epochs` whole epochs, each on a fresh iterator (creation
  included), as that many evaluations."""
  dataset = build()
  start = time.perf_counter()
  images = sum(int(images.shape[0]) for _ in range(epochs)
               for images, _ in dataset)
  return images / (time.perf_counter() - start)


def measure(sizes: Dict[str, int]) -> Dict[str, Any]:
  """Times every pipeline `passes` times, interleaved; returns medians."""
  with tempfile.TemporaryDirectory() as directory:
    files = _imagenet_records.write(directory, sizes["copies"])
    by_split = pipelines(files, sizes["batch_size"])
    runs = {split: {name: [] for name in named}
            for split, named in by_split.items()}
    for index in range(sizes["passes"]):
      for name in _common.rotated(list(by_split["train"]), index):
        runs["train"][name].append(train_pass(
            by_split["train"][name], sizes["batch_size"], sizes["warmup"],
            sizes["batches"]))
      for name in _common.rotated(list(by_split["eval"]), index):
        runs["eval"][name].append(eval_pass(by_split["eval"][name],
                                            sizes["eval_epochs"]))
  out = {"sizes": sizes, "records": {
      "train": sizes["copies"] * _imagenet_records.NUM_TRAIN_IMAGES,
      "eval": sizes["copies"] * _imagenet_records.NUM_VALIDATION_IMAGES}}
  for split, named in runs.items():
    medians = {name: _common.median(values) for name, values in named.items()}
    out[split] = {"images_per_second": medians, "runs": named,
                  "ours_over_reference": medians["ours"]
                                         / medians["reference"]}
    print(f"{split}: " + ", ".join(f"{name} {value:.1f} img/s"
                                   for name, value in medians.items())
          + f"; ours / reference {out[split]['ours_over_reference']:.3f}",
          flush=True)
  return out


def main(argv=None) -> Dict[str, Any]:
  """Runs the benchmark; see the module docstring."""
  return _common.sized_main(__doc__, measure, SIZES, SMOKE_SIZES, argv)


if __name__ == "__main__":
  main()
