"""A `--registry` for tests/training/test_ranking.py: what a ranking run loaded, when.

Imported by the launcher after `registry_imports` (which registers the
ranking trainer), its action factory runs once the run has built its
trainer; it writes `ranking_probe.json` into `model_dir` and adds no action.
"""

import json
import os
import sys

import tfm_ext

# Whether registering the ranking trainer imported TensorFlow Recommenders.
LOADED_BY_REGISTRATION = "tensorflow_recommenders" in sys.modules


@tfm_ext.register_action("ranking_probe", phase="train")
def probe(context: tfm_ext.ActionContext):
  """Records the trainer's class and what loading it set; no action."""
  # pylint: disable=g-import-not-at-top
  from official.recommendation.ranking.train import RankingTrainer
  record = {
      "loaded_by_registration": LOADED_BY_REGISTRATION,
      "trainer_is_tfms_ranking_trainer": type(context.trainer)
                                         is RankingTrainer,
      "tf_use_legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
  }
  with open(os.path.join(context.model_dir, "ranking_probe.json"), "w") as f:
    json.dump(record, f)
  return None
