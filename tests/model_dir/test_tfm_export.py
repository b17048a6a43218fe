"""--mode=export's flags for TFM's experiments.

What TFM's exporter serves, ours serves: every experiment of
tests/e2e/test_tfm_experiments.py exports its trained checkpoint with
`--mode=export`, and each vision one with TFM's exporter too, and both
answer the same uint8 images (DLRM's answers as its model does). Here: the
flags that shape that export, refused when they are wrong, and the sizes it
takes when they are not given.
"""

import pytest

from official.vision import registry_imports  # pylint: disable=unused-import

from tfm_ext.config import params as params_lib
from tfm_ext.base.errors import UsageError
from tfm_ext.examples import digits_convnet  # pylint: disable=unused-import
from tfm_ext.model_dir import tfm_serving

from conftest import assert_clean_usage_error

VISION = "--registry=official.vision.registry_imports"


def test_bad_export_flags_are_refused_before_anything_is_read(
    tmp_path, launch_forked):
  for flag, fragments in (
      ("--input_type=jpeg", ("Unknown --input_type 'jpeg'", "image_bytes")),
      ("--input_image_size=224x224", ("--input_image_size='224x224'",
                                      "height,width")),
      ("--input_image_size=0,224", ("--input_image_size=0,224",)),
      ("--batch_size=0", ("--batch_size=0",))):
    run = launch_forked("--experiment=resnet_imagenet", "--mode=export",
                        VISION, flag, model_dir=tmp_path / "never")
    assert_clean_usage_error(run, *fragments)


def test_export_flags_a_task_cannot_take_are_refused():
  for experiment, options, message in (
      ("video_classification_kinetics400", {"input_type": "image_bytes"},
       "VideoClassificationModule does not take it; it takes image_tensor, "
       "tf_example"),
      ("video_classification_kinetics400", {"input_image_size": (224, 224)},
       "takes frames,height,width"),
      ("digits_convnet", {"input_type": "image_bytes"},
       "--input_type=image_bytes: these flags shape the export of TFM's "
       "vision tasks")):
    params = params_lib.build(params_lib.ConfigSources(experiment=experiment))
    with pytest.raises(UsageError, match=message):
      tfm_serving.vision_export(params, tfm_serving.ServingOptions(**options))


def test_sizes_default_to_what_evaluation_feeds_the_model():
  def size(experiment):
    params = params_lib.build(params_lib.ConfigSources(experiment=experiment))
    return tfm_serving.image_size(params.task, tfm_serving.ServingOptions())

  assert size("resnet_imagenet") == [224, 224]  # model.input_size
  assert size("retinanet_resnetfpn_coco") == [640, 640]
  assert size("seg_deeplabv3_pascal") == [512, 512]  # validation output_size
  # train_data.feature_shape: frames, height, width.
  assert size("video_classification_kinetics400") == [64, 224, 224]
