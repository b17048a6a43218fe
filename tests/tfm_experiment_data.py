"""Tiny input data in the formats TFM's decoders read, and initial weights.

scikit-learn ships two JPEG photographs (`china.jpg`, `flower.jpg`) and the
8x8 digits; each writer below cuts small inputs from them and writes what
the decoder of a TFM experiment reads (tests/e2e/test_tfm_experiments.py):

  * classification: ImageNet's fields, written by `tests/imagenet_fixtures.py`;
  * `write_detection`: COCO-style tf.Examples (`tf_example_decoder.py`):
    boxes, classes, areas, crowd flags and 0/1 PNG instance masks, for
    RetinaNet and Mask R-CNN, and COCO's JSON of the validation images;
  * `write_segmentation`: an image and its PNG class map
    (`image/segmentation/class/encoded`, 255 where unlabelled);
  * `write_video`: tf.SequenceExamples (`video_input.py`): PNG frames
    (`image/encoded` in the sequence; `input_image_format: png`) and
    `clip/label/index` in the context;
  * `write_criteo`: the TSV rows of TFM's Criteo reader, for DLRM;
  * `write_sentence_prediction`, `write_tagging`: tokenized sentences as
    TFM's NLP readers decode them (`input_ids`, `input_mask`,
    `segment_ids`, `label_ids`), for a tiny BERT; no photo in them.

The images are square and mirror-symmetric left to right, so TFM's training
augmentations that cannot be switched off by config (a video's random flip;
a random crop of the whole frame) change no pixel: two runs that draw
different random numbers still see the same batches.

`python tests/tfm_experiment_data.py init_checkpoint ...` writes an
experiment's freshly built model (`write_initial_checkpoint`);
`... ranking_predictions ...` prints DLRM's at a checkpoint.
"""

import json
import os
from typing import List

import numpy as np
import tensorflow as tf

NUM_CLASSES = 4  # Detection and segmentation classes (0: background).


def _photos() -> List[np.ndarray]:
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  return list(datasets.load_sample_images().images)


def _mirrored(pixels: np.ndarray) -> np.ndarray:
  """The left half of `pixels` and its mirror image: symmetric left to right."""
  half = pixels[:, :pixels.shape[1] // 2]
  return np.concatenate([half, half[:, ::-1]], axis=1)


def square_images(size: int, count: int) -> List[np.ndarray]:
  """`count` uint8 [size, size, 3] crops of the two photos, each mirrored."""
  images = []
  for i in range(count):
    photo = _photos()[i % 2]
    top, left = 30 * (i // 2), 40 * (i // 2)
    crop = photo[top:top + 360, left:left + 360]
    resized = tf.image.resize(crop, [size, size], antialias=True)
    images.append(_mirrored(np.round(resized.numpy()).astype(np.uint8)))
  return images


def _bytes(*values: bytes) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _ints(*values: int) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _floats(*values: float) -> tf.train.Feature:
  return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def _png(pixels: np.ndarray) -> bytes:
  return tf.io.encode_png(pixels).numpy()


def _jpeg(pixels: np.ndarray) -> bytes:
  return tf.io.encode_jpeg(pixels, quality=95).numpy()


def _write(path: str, examples: List[bytes]) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with tf.io.TFRecordWriter(path) as writer:
    for each in examples:
      writer.write(each)
  return path


# Objects as (class, ymin, xmin, ymax, xmax) in [0, 1], symmetric left to
# right as the images are: a box centred, or a mirrored pair.
_OBJECTS = [
    [(1, 0.2, 0.25, 0.8, 0.75)],
    [(2, 0.1, 0.1, 0.5, 0.4), (2, 0.1, 0.6, 0.5, 0.9),
     (3, 0.55, 0.3, 0.95, 0.7)],
    [(3, 0.3, 0.2, 0.7, 0.8)],
    [(1, 0.05, 0.05, 0.45, 0.45), (1, 0.05, 0.55, 0.45, 0.95)],
]


def detection_example(pixels: np.ndarray, objects, source_id: int) -> bytes:
  """A COCO-style tf.Example: boxes, classes, areas and PNG masks."""
  height, width, _ = pixels.shape
  masks, areas = [], []
  for _, ymin, xmin, ymax, xmax in objects:
    mask = np.zeros([height, width], np.uint8)
    mask[int(ymin * height):int(ymax * height),
         int(xmin * width):int(xmax * width)] = 1  # TFM reads 0/1 PNGs.
    masks.append(_png(mask[:, :, None]))
    areas.append(float((mask > 0).sum()))
  column = lambda i: [o[i] for o in objects]
  features = {
      "image/encoded": _bytes(_jpeg(pixels)),
      "image/source_id": _bytes(str(source_id).encode()),
      "image/height": _ints(height),
      "image/width": _ints(width),
      "image/object/class/label": _ints(*column(0)),
      "image/object/bbox/ymin": _floats(*column(1)),
      "image/object/bbox/xmin": _floats(*column(2)),
      "image/object/bbox/ymax": _floats(*column(3)),
      "image/object/bbox/xmax": _floats(*column(4)),
      "image/object/area": _floats(*areas),
      "image/object/is_crowd": _ints(*[0] * len(objects)),
      "image/object/mask": _bytes(*masks),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=features)).SerializeToString()


def coco_annotations(objects_by_id, size: int):
  """COCO's instances JSON of square images: boxes and polygon masks.

  TFM's COCO evaluator needs it: without an annotation file it builds the
  ground truth from the validation records, and with NumPy 2 that fails
  (`int()` of the one-element `num_detections` RetinaNet's parser writes).
  """
  images, annotations = [], []
  for image_id, objects in objects_by_id.items():
    images.append({"id": image_id, "height": size, "width": size})
    for cls, ymin, xmin, ymax, xmax in objects:
      top, left = int(ymin * size), int(xmin * size)
      bottom, right = int(ymax * size), int(xmax * size)
      annotations.append({
          "id": len(annotations) + 1, "image_id": image_id,
          "category_id": cls, "iscrowd": 0,
          "bbox": [left, top, right - left, bottom - top],
          "area": (right - left) * (bottom - top),
          "segmentation": [[left, top, right, top, right, bottom, left,
                            bottom]]})
  categories = [{"id": c, "name": f"class{c}"} for c in range(1, NUM_CLASSES)]
  return {"images": images, "annotations": annotations,
          "categories": categories}


def write_detection(directory: str, size: int = 128) -> str:
  """Writes `train.tfrecord` (4 images), `val.tfrecord` (2) and
  `val.json` (COCO's annotations of those 2); returns `directory`."""
  images = square_images(size, 6)
  objects = {i + 1: _OBJECTS[i % 4] for i in range(len(images))}
  examples = [detection_example(image, objects[i + 1], i + 1)
              for i, image in enumerate(images)]
  _write(os.path.join(directory, "train.tfrecord"), examples[:4])
  _write(os.path.join(directory, "val.tfrecord"), examples[4:])
  with open(os.path.join(directory, "val.json"), "w") as f:
    json.dump(coco_annotations({i: objects[i] for i in (5, 6)}, size), f)
  return directory


def segmentation_example(pixels: np.ndarray, objects) -> bytes:
  """An image and its class map: the objects' classes, 255 at their edges."""
  height, width, _ = pixels.shape
  labels = np.zeros([height, width, 1], np.uint8)
  for cls, ymin, xmin, ymax, xmax in objects:
    top, left = int(ymin * height), int(xmin * width)
    bottom, right = int(ymax * height), int(xmax * width)
    labels[top:bottom, left:right] = 255  # Unlabelled border...
    labels[top + 1:bottom - 1, left + 1:right - 1] = cls  # ...around it.
  features = {
      "image/encoded": _bytes(_jpeg(pixels)),
      "image/height": _ints(height),
      "image/width": _ints(width),
      "image/segmentation/class/encoded": _bytes(_png(labels)),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=features)).SerializeToString()


def write_segmentation(directory: str, size: int = 32) -> str:
  """Writes `train.tfrecord` (4 images) and `val.tfrecord` (2); returns it."""
  images = square_images(size, 6)
  examples = [segmentation_example(image, _OBJECTS[i % 4])
              for i, image in enumerate(images)]
  _write(os.path.join(directory, "train.tfrecord"), examples[:4])
  _write(os.path.join(directory, "val.tfrecord"), examples[4:])
  return directory


def video_example(frames: List[np.ndarray], label: int) -> bytes:
  """A tf.SequenceExample: PNG frames and the clip's label.

  PNG, not Kinetics' JPEG: JPEG's rounding would leave a mirrored frame
  a little asymmetric, and TFM's random flip (always on) would show.
  """
  return tf.train.SequenceExample(
      context=tf.train.Features(feature={"clip/label/index": _ints(label)}),
      feature_lists=tf.train.FeatureLists(feature_list={
          "image/encoded": tf.train.FeatureList(
              feature=[_bytes(_png(f)) for f in frames])}),
  ).SerializeToString()


def write_video(directory: str, size: int = 32, frames: int = 4,
                num_classes: int = NUM_CLASSES) -> str:
  """Writes `train.tfrecord` (4 clips) and `val.tfrecord` (2); returns it.

  A clip is `frames` crops sliding down one photo, exactly as many as a
  training clip takes, so TFM's random start within a clip is always 0.
  """
  clips = []
  for i in range(6):
    photo = _photos()[i % 2]
    crops = [photo[40 * t + 20 * i:40 * t + 20 * i + 300, 50:350]
             for t in range(frames)]
    clips.append([_mirrored(np.round(tf.image.resize(
        c, [size, size], antialias=True).numpy()).astype(np.uint8))
                  for c in crops])
  examples = [video_example(c, i % num_classes) for i, c in enumerate(clips)]
  _write(os.path.join(directory, "train.tfrecord"), examples[:4])
  _write(os.path.join(directory, "val.tfrecord"), examples[4:])
  return directory


def write_criteo(directory: str, vocab_sizes=(40, 30, 20)) -> str:
  """Writes `train.tsv` (32 rows) and `val.tsv` (16) as TFM's Criteo reader
  takes them: a 0/1 label, 13 dense and `len(vocab_sizes)` categorical ids.

  The rows are scikit-learn's digits: the label is whether the digit is
  even, the dense features 13 of its pixels, the ids its other pixels'
  sums modulo each table's size.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  os.makedirs(directory, exist_ok=True)
  rows = []
  for pixels, target in zip(digits.data[:48].astype(int), digits.target):
    ids = [int(pixels[13 + 8 * i:21 + 8 * i].sum()) % size
           for i, size in enumerate(vocab_sizes)]
    rows.append("\t".join(map(str, [int(target % 2 == 0), *pixels[:13],
                                    *ids])))
  for name, part in (("train.tsv", rows[:32]), ("val.tsv", rows[32:])):
    with open(os.path.join(directory, name), "w") as f:
      f.write("\n".join(part) + "\n")
  return directory


# BERT's inputs of the NLP experiments (tests/e2e/tfm_configs/bert_*.yaml).
SEQ_LENGTH = 16
VOCAB_SIZE = 100
NUM_TAGS = 3


def token_rows(count: int, seed: int = 0):
  """`count` tokenized sentences: int64 word ids [count, SEQ_LENGTH] (of 1
  to VOCAB_SIZE - 1, then 0 padding), and the 0/1 mask of real tokens.

  Lengths run from 4 to SEQ_LENGTH, so every batch pads.
  """
  rng = np.random.RandomState(seed)
  ids = np.zeros([count, SEQ_LENGTH], np.int64)
  for row in range(count):
    length = 4 + (row * 5) % (SEQ_LENGTH - 3)
    ids[row, :length] = rng.randint(1, VOCAB_SIZE, size=length)
  return ids, (ids > 0).astype(np.int64)


def _bert_example(ids: np.ndarray, mask: np.ndarray, labels) -> bytes:
  """The tf.Example TFM's sentence prediction and tagging readers decode."""
  features = {"input_ids": _ints(*ids), "input_mask": _ints(*mask),
              "segment_ids": _ints(*np.zeros_like(ids)),
              "label_ids": _ints(*np.atleast_1d(labels))}
  return tf.train.Example(features=tf.train.Features(
      feature=features)).SerializeToString()


def _write_bert(directory: str, labels_of) -> str:
  ids, mask = token_rows(6)
  examples = [_bert_example(i, m, labels_of(i, m)) for i, m in zip(ids, mask)]
  _write(os.path.join(directory, "train.tfrecord"), examples[:4])
  _write(os.path.join(directory, "val.tfrecord"), examples[4:])
  return directory


def write_sentence_prediction(directory: str) -> str:
  """Writes `train.tfrecord` (4 sentences) and `val.tfrecord` (2): their
  class is whether their word ids sum to an even number. Returns it."""
  return _write_bert(directory, lambda ids, _: int(ids.sum() % 2 == 0))


def write_tagging(directory: str) -> str:
  """Writes `train.tfrecord` (4 sentences) and `val.tfrecord` (2): a token's
  tag is its id modulo NUM_TAGS, -1 (no tag, TFM's padding) on padding."""
  return _write_bert(directory,
                     lambda ids, mask: np.where(mask > 0, ids % NUM_TAGS, -1))


def uint8_images(size: int, count: int = 2) -> np.ndarray:
  """A batch of photo crops to serve: uint8 [count, size, size, 3]."""
  return np.stack(square_images(size, count))


# The experiments whose `init_checkpoint_modules: all` reads
# `model.checkpoint_items` (a backbone, a decoder, a head...); TFM's other
# tasks read `model=`.
_CHECKPOINT_ITEMS = ("retinanet_resnetfpn_coco", "seg_deeplabv3_pascal",
                     "dlrm_criteo")


def experiment_params(experiment: str, config_file: str, override: str):
  """The registered experiment's config, its YAML and `--params_override`
  applied as TFM's scripts apply them."""
  # pylint: disable=g-import-not-at-top
  from official.core import exp_factory
  from official.modeling import hyperparams
  # pylint: enable=g-import-not-at-top
  params = exp_factory.get_exp_config(experiment)
  for each in (config_file, override):
    params = hyperparams.override_params_dict(params, each, is_strict=True)
  return params


def _built_model(experiment: str, config_file: str, override: str):
  """The experiment's model as its task builds it, its variables made."""
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  params = experiment_params(experiment, config_file, override)
  if experiment != "dlrm_criteo":
    return task_factory.get_task(params.task).build_model()
  # Stock's ranking train.py builds it so.
  from official.recommendation.ranking import task  # pylint: disable=g-import-not-at-top
  model = task.RankingTask(params.task,
                           trainer_config=params.trainer).build_model()
  # Its layers make their variables on the first call.
  model(_criteo_features(np.zeros(
      [2, 1 + params.task.model.num_dense_features +
       len(params.task.model.vocab_sizes)], np.float32)))
  return model


def _criteo_features(rows: np.ndarray):
  """DLRM's inputs of Criteo rows: label, 13 dense features, the ids."""
  return {"dense_features": tf.constant(rows[:, 1:14]),
          "sparse_features": {str(i): tf.constant(rows[:, 14 + i], tf.int64)
                              for i in range(rows.shape[1] - 14)}}


def criteo_rows(path: str, count: int = 2) -> np.ndarray:
  """The first `count` rows of a Criteo TSV (`write_criteo`), as floats."""
  with open(path) as f:
    return np.array([line.split("\t") for line in
                     f.read().splitlines()[:count]], dtype=np.float32)


def write_initial_checkpoint(experiment: str, config_file: str,
                             override: str, path: str) -> str:
  """Writes a freshly built model of the experiment as its task restores it.

  TFM's train.py takes no seed: both runs compared start from this
  checkpoint through `task.init_checkpoint`, which each task reads with
  `init_checkpoint_modules: all` as it is laid out here. Returns the
  checkpoint's path.
  """
  if experiment.startswith("bert/"):
    # TFM's NLP tasks restore the encoder alone (`encoder=`), so the
    # YAMLs start their heads at zero; the encoder is drawn as BERT's.
    model = _built_model(experiment, config_file, override + (
        ",task.model.encoder.bert.initializer_range=0.02"))
    items = {"encoder": model.checkpoint_items["encoder"]}
  else:
    model = _built_model(experiment, config_file, override)
    items = (model.checkpoint_items if experiment in _CHECKPOINT_ITEMS
             and hasattr(model, "checkpoint_items") else {"model": model})
  return tf.train.Checkpoint(**items).write(path)


def ranking_predictions(config_file: str, override: str, checkpoint: str,
                        rows_path: str) -> List[float]:
  """DLRM's predictions for `criteo_rows(rows_path)`, its weights those of
  a training checkpoint (`model=`): what its export must serve."""
  model = _built_model("dlrm_criteo", config_file, override)
  tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
  features = _criteo_features(criteo_rows(rows_path))
  return model(features, training=False).numpy().tolist()


def _main(argv):
  """`init_checkpoint EXPERIMENT CONFIG_FILE OVERRIDE PATH`, or
  `ranking_predictions CONFIG_FILE OVERRIDE CHECKPOINT ROWS` (JSON), for
  a process of the experiment's own."""
  command, *args = argv
  if command not in ("init_checkpoint", "ranking_predictions"):
    raise SystemExit(f"unknown command {command!r}")
  # pylint: disable=g-import-not-at-top,unused-import
  if command == "init_checkpoint" and args[0] != "dlrm_criteo":
    import official.vision.registry_imports
  else:
    from official.recommendation.ranking.configs import config
  # pylint: enable=g-import-not-at-top,unused-import
  if command == "init_checkpoint":
    print(write_initial_checkpoint(*args))
  else:
    print(json.dumps(ranking_predictions(*args)))


if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top
  _main(sys.argv[1:])
