"""--mode=export's module and flags for TFM's NLP tasks.

The trained exports of bert/tagging and bert/sentence_prediction, each
against stock's `export_savedmodel.py` on the same checkpoint, are in
tests/e2e/test_tfm_experiments.py. Here, on the tiny BERT of its YAML
built in this process: the module stock's table picks, and the flags
refused before any checkpoint is read.
"""

import os
import re

import pytest

from official.common import registry_imports  # pylint: disable=unused-import

from tfm_ext.base.errors import UsageError
from tfm_ext.config import params as params_lib
from tfm_ext.examples import digits_convnet  # pylint: disable=unused-import
from tfm_ext.model_dir import nlp_serving
from tfm_ext.model_dir import tfm_serving

from conftest import REPO
from conftest import assert_clean_usage_error

TAGGING = os.path.join(REPO, "tests", "e2e", "tfm_configs",
                       "bert_tagging.yaml")


@pytest.fixture(scope="module")
def tagging():
  return params_lib.build(params_lib.ConfigSources(
      experiment="bert/tagging", config_files=[TAGGING]))


def test_an_nlp_task_is_served_by_the_module_of_stocks_table(tagging):
  export = nlp_serving.nlp_export(tagging, tfm_serving.ServingOptions())
  assert type(export.module).__name__ == "Tagging"
  assert export.function_key == "serve"
  # Left out of --serving_params: what the task's evaluation reads.
  assert export.module.params.parse_sequence_length == 16
  given = nlp_serving.nlp_export(tagging, tfm_serving.ServingOptions(
      function_keys="serve_examples",
      serving_params="parse_sequence_length=8,use_v2_feature_names=false"))
  assert given.function_key == "serve_examples"
  assert given.module.params.parse_sequence_length == 8
  assert not given.module.params.use_v2_feature_names


def test_export_flags_an_nlp_task_cannot_take_are_refused(tagging):
  for options, message in (
      ({"function_keys": "serve_text"},
       "--function_keys=serve_text: Invalid function key"),
      ({"serving_params": "vocab_file=x"},
       "TFM's Tagging takes no vocab_file; its serving params are "
       "parse_sequence_length, use_v2_feature_names"),
      ({"serving_params": "{a: [1"}, "--serving_params='{a: [1': not YAML"),
      ({"serving_params": "text_fields=[sentence],vocab_file=/no/vocab.txt"},
       "TFM's Tagging takes no text_fields, vocab_file"),
      ({"input_type": "image_bytes"},
       "--input_type=image_bytes: these flags shape the export of TFM's "
       "vision tasks; TaggingConfig is one of its NLP tasks")):
    with pytest.raises(UsageError, match=re.escape(message)):
      nlp_serving.nlp_export(tagging, tfm_serving.ServingOptions(**options))


def test_a_module_that_cannot_be_built_from_its_params_is_refused():
  params = params_lib.build(params_lib.ConfigSources(
      experiment="bert/sentence_prediction", config_files=[
          TAGGING.replace("tagging", "sentence_prediction")]))
  # Its text signatures tokenize with a vocabulary that is not there.
  with pytest.raises(UsageError, match=re.escape(
      "--serving_params='text_fields=[sentence],vocab_file=/no/vocab.txt': "
      "TFM's SentencePrediction cannot be built from it: NotFoundError")):
    nlp_serving.nlp_export(params, tfm_serving.ServingOptions(
        serving_params="text_fields=[sentence],vocab_file=/no/vocab.txt"))


def test_nlp_export_flags_for_another_task_are_refused():
  params = params_lib.build(params_lib.ConfigSources(
      experiment="digits_convnet"))
  assert nlp_serving.nlp_export(params, tfm_serving.ServingOptions()) is None
  with pytest.raises(UsageError, match=re.escape(
      "--function_keys=serve: these flags shape the export of TFM's NLP "
      "tasks; DigitsTaskConfig is not one")):
    nlp_serving.nlp_export(params, tfm_serving.ServingOptions(
        function_keys="serve"))


def test_nlp_export_flags_for_another_mode_are_refused(tmp_path,
                                                       launch_forked):
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      "--function_keys=serve_examples",
                      "--serving_params=parse_sequence_length=8",
                      model_dir=tmp_path / "never")
  assert_clean_usage_error(
      run, "--function_keys=serve_examples "
      "--serving_params=parse_sequence_length=8: for --mode=export, not "
      "--mode=train.")
