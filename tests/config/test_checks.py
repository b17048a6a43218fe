"""Config values are checked before anything is written: exit 2, one message.

Each hostile value below hung, ran forever, saved nothing or ended in a
traceback after params.yaml was written (some only after training); now
`driver.prepare` refuses it, naming the field, the value and what is
accepted, and leaves model_dir alone. The legitimate values TFM gives a
meaning to (validation_steps=-1, checkpoint_interval=0, ...) still pass.
"""

import re
import types

import pytest

from conftest import assert_clean_usage_error

from experiments import digits_convnet
from tfm_ext.config import checks
from tfm_ext.config import params as params_lib
from tfm_ext.base.errors import UsageError
from tfm_ext.run import driver
from tfm_ext.training import custom_trainer

EXP = "digits_convnet"  # steps_per_loop=50, best checkpoint by "accuracy".
SCHEDULE = "trainer.optimizer_config.learning_rate"
LR = f"{SCHEDULE}.cosine.initial_learning_rate"
WARMUP = "trainer.optimizer_config.warmup.linear"
STEPWISE = f"{SCHEDULE}.type=stepwise,{SCHEDULE}.stepwise"
INT64 = "a whole number TensorFlow holds (int64: at most 9223372036854775807)"


def build(override: str):
  return params_lib.build(params_lib.ConfigSources(
      experiment=EXP, params_override=override))


def prepare(override: str, model_dir, mode: str = "train_and_eval"):
  return driver.prepare(driver.RunRequest(
      experiment=EXP, mode=mode, model_dir=str(model_dir),
      params=build(override)))


# (override, mode, the first line's start, a fragment of what is accepted)
REFUSED = [
    ("trainer.steps_per_loop=0", "train", "trainer.steps_per_loop=0:",
     "positive whole number of steps"),
    ("trainer.steps_per_loop=-10", "train", "trainer.steps_per_loop=-10:",
     "positive"),
    ("trainer.train_steps=100.5", "train", "trainer.train_steps=100.5:",
     "whole number of steps"),
    ("trainer.train_steps=abc", "train", "trainer.train_steps='abc':",
     "whole number of steps"),
    ("trainer.train_steps=null", "train", "trainer.train_steps=null:",
     "whole number of steps"),
    ("trainer.train_steps=-5", "train", "trainer.train_steps=-5:",
     "0 or more"),
    # YAML's true is a bool, and Python's bool an int: not a step count.
    ("trainer.train_steps=true", "train", "trainer.train_steps=true:",
     "whole number of steps"),
    ("trainer.validation_interval=-1", "train_and_eval",
     "trainer.validation_interval=-1:", "0 to evaluate only after training"),
    ("trainer.checkpoint_interval=-1", "train",
     "trainer.checkpoint_interval=-1:", "0 for no checkpoints"),
    ("task.train_data.global_batch_size=0", "train",
     "task.train_data.global_batch_size=0:", "positive whole number"),
    ("task.train_data.global_batch_size=-1", "train",
     "task.train_data.global_batch_size=-1:", "positive whole number"),
    ("task.validation_data.global_batch_size=0", "train_and_eval",
     "task.validation_data.global_batch_size=0:", "positive whole number"),
    (f"{LR}=fast", "train", f"{LR}='fast':", "a number"),
    ("trainer.max_to_keep=0", "train", "trainer.max_to_keep=0:",
     "null to keep them all"),
    # An evaluator's checkpoint manager takes max_to_keep too.
    ("trainer.max_to_keep=0", "eval", "trainer.max_to_keep=0:", "positive"),
    ("trainer.best_checkpoint_top_k=0", "train_and_eval",
     "trainer.best_checkpoint_top_k=0:", "positive number of best"),
    ("trainer.best_checkpoint_metric_comp=bigger", "train_and_eval",
     "trainer.best_checkpoint_metric_comp='bigger':", "'higher' or 'lower'"),
    # model_dir itself, above it, elsewhere: the exporter would clear files
    # and rewrite a state file that are not its own.
    ("trainer.best_checkpoint_export_subdir=.", "train_and_eval",
     "trainer.best_checkpoint_export_subdir='.':", "inside --model_dir"),
    ("trainer.best_checkpoint_export_subdir=../best", "eval",
     "trainer.best_checkpoint_export_subdir='../best':", "without '.' or '..'"),
    ("trainer.best_checkpoint_export_subdir=/tmp/best", "train_and_eval",
     "trainer.best_checkpoint_export_subdir='/tmp/best':", "relative path"),
    ("trainer.summary_interval=0", "train", "trainer.summary_interval=0:",
     "multiple of trainer.steps_per_loop"),
    ("trainer.summary_interval=15", "train",
     "trainer.summary_interval=15 is not a multiple of "
     "trainer.steps_per_loop=50", "give a multiple of 50"),
    ("trainer.validation_steps=0", "train_and_eval",
     "trainer.validation_steps=0:", "-1 for the whole validation set"),
    ("trainer.validation_steps=null", "eval", "trainer.validation_steps=null:",
     "-1 for the whole validation set"),
    ("trainer.best_checkpoint_eval_metric=acuracy", "train_and_eval",
     "trainer.best_checkpoint_eval_metric='acuracy':",
     "Did you mean 'accuracy'?"),
    ("runtime.mixed_precision_dtype=mixed_bfloat16", "train",
     "runtime.mixed_precision_dtype='mixed_bfloat16':",
     "float16, bfloat16 or float32"),
    ("trainer.recovery_max_trials=null", "train",
     "trainer.recovery_max_trials=null:", "negative: no loss check"),
    ("trainer.loss_upper_bound=high", "train",
     "trainer.loss_upper_bound='high':", "a number"),
    # TFM's default recovery_max_trials=0 checks the loss: a bound is needed.
    ("trainer.loss_upper_bound=null", "train",
     "trainer.loss_upper_bound=null:", "a number"),
    # Types everywhere in trainer and runtime, from the annotations.
    ("trainer.train_tf_function=1", "train", "trainer.train_tf_function=1:",
     "true or false"),
    ("runtime.num_gpus=two", "train", "runtime.num_gpus='two':",
     "a whole number"),
    ("trainer.validation_summary_subdir=5", "eval",
     "trainer.validation_summary_subdir=5:", "a string"),
    ("runtime.seed=x", "train", "runtime.seed='x':", "a whole number"),
    # Python's ints have no bound; TensorFlow's steps are int64. It failed
    # with an OverflowError after params.yaml was written.
    (f"trainer.train_steps={10**20}", "train",
     f"trainer.train_steps={10**20}:", INT64),
    (f"trainer.checkpoint_interval={2**63}", "train",
     f"trainer.checkpoint_interval={2**63}:", INT64),
    (f"task.train_data.shuffle_buffer_size={10**19}", "train",
     f"task.train_data.shuffle_buffer_size={10**19}:", INT64),
    (f"{STEPWISE}.values=[0.1, 0.01],"
     f"{SCHEDULE}.stepwise.boundaries=[{10**20}]",
     "train", f"{SCHEDULE}.stepwise.boundaries=[{10**20}]:", INT64),
    # Every learning rate of whichever schedule and warmup is selected.
    (f"{LR}=-0.003", "train", f"{LR}=-0.003:", "0 or more"),
    (f"{LR}=.nan", "train", f"{LR}=nan:", "finite"),
    (f"{LR}=.inf", "train", f"{LR}=inf:", "finite"),
    (f"{SCHEDULE}.type=constant,{SCHEDULE}.constant.learning_rate=-1",
     "train", f"{SCHEDULE}.constant.learning_rate=-1:", "0 or more"),
    (f"{SCHEDULE}.type=exponential,{SCHEDULE}.exponential.initial_learning_"
     f"rate=-0.1,{SCHEDULE}.exponential.decay_steps=10", "train",
     f"{SCHEDULE}.exponential.initial_learning_rate=-0.1:", "0 or more"),
    (f"{SCHEDULE}.type=polynomial,{SCHEDULE}.polynomial.initial_learning_"
     f"rate=0.1,{SCHEDULE}.polynomial.decay_steps=10,"
     f"{SCHEDULE}.polynomial.end_learning_rate=-0.001", "train",
     f"{SCHEDULE}.polynomial.end_learning_rate=-0.001:", "0 or more"),
    (f"{STEPWISE}.boundaries=[100],{SCHEDULE}.stepwise.values=[0.1, -0.01]",
     "train",
     f"{SCHEDULE}.stepwise.values=[0.1, -0.01]:", "each a number, 0 or more"),
    (f"{SCHEDULE}.cosine.alpha=-0.5", "train", f"{SCHEDULE}.cosine.alpha=-0.5:",
     "fraction of initial_learning_rate"),
    (f"{WARMUP}.warmup_learning_rate=-0.1", "train",
     f"{WARMUP}.warmup_learning_rate=-0.1:", "0 or more"),
    (f"{SCHEDULE}.cosine.decay_steps=0", "train",
     f"{SCHEDULE}.cosine.decay_steps=0:", "positive whole number of steps"),
    (f"{WARMUP}.warmup_steps=-5", "train", f"{WARMUP}.warmup_steps=-5:",
     "0 or more"),
    (f"{STEPWISE}.values=[0.1, 0.01, 0.001],"
     f"{SCHEDULE}.stepwise.boundaries=[200, 100]",
     "train", f"{SCHEDULE}.stepwise.boundaries=[200, 100]:",
     "strictly ascending"),
    # TensorFlow's PiecewiseConstantDecay raises on it once training starts.
    (f"{STEPWISE}.boundaries=[100],{SCHEDULE}.stepwise.values=[0.1]", "train",
     f"{SCHEDULE}.stepwise has 1 boundaries and 1 values:",
     "one value more than boundaries"),
    # A dropout rate anywhere in the task; the model is built in every mode.
    ("task.model.dropout_rate=1.0", "train", "task.model.dropout_rate=1.0:",
     "from 0 to below 1"),
    ("task.model.dropout_rate=-0.1", "eval", "task.model.dropout_rate=-0.1:",
     "fraction of units dropped"),
    ("task.model.dropout_rate=half", "train", "task.model.dropout_rate='half':",
     "a number from 0 to below 1"),
    # A size of 0 aborted inside oneDNN (exit 134), the lease left behind.
    ("task.model.num_classes=0", "train", "task.model.num_classes=0:",
     "a positive whole number of classes"),
    ("task.model.num_classes=-3", "eval", "task.model.num_classes=-3:",
     "positive"),
    # Orbit's evaluation bypasses the coordinator: an AttributeError at the
    # first evaluation, after training (stock TFM fails on an assertion).
    *((("runtime.distribution_strategy=parameter_server", mode,
        "runtime.distribution_strategy=parameter_server trains only:",
        "--mode=continuous_eval on the same --model_dir")
       for mode in ("train_and_eval", "continuous_eval", "eval",
                    "train_and_post_eval"))),
]


@pytest.mark.parametrize("override, mode, first, accepted", REFUSED,
                         ids=[f"{r[0]}-{r[1]}" for r in REFUSED])
def test_hostile_value_is_refused_naming_field_and_value(
    tmp_path, override, mode, first, accepted):
  model_dir = tmp_path / "m"
  with pytest.raises(UsageError) as raised:
    prepare(override, model_dir, mode)
  line = str(raised.value).splitlines()[0]
  assert line.startswith(first), line
  assert accepted in line, line
  assert not model_dir.exists()


# Values TFM gives a meaning to, and values a mode does not read.
ACCEPTED = [
    ("trainer.validation_steps=-1", "train_and_eval"),  # The whole set.
    ("trainer.validation_interval=0", "train_and_eval"),  # After training.
    ("trainer.summary_interval=null", "train"),  # None inside loops.
    ("trainer.summary_interval=100", "train"),  # 2 loops of 50.
    ("trainer.max_to_keep=null", "train"),  # Keep them all.
    ("trainer.train_steps=0", "train"),  # Saves the initial checkpoint.
    ("trainer.recovery_max_trials=-1,trainer.loss_upper_bound=null",
     "train"),  # No loss check, so no bound.
    ("runtime.mixed_precision_dtype=bfloat16", "train"),
    ("trainer.loss_upper_bound=100", "train"),  # An int where a float is.
    # One value for a list, as TFM's ViT configs give
    # include_in_weight_decay a regex.
    ("trainer.optimizer_config.optimizer.type=adamw,"
     "trainer.optimizer_config.optimizer.adamw.include_in_weight_decay="
     "kernel", "train"),
    ("runtime.mixed_precision_dtype=float32", "train"),
    # No exporter: its comparison and k are not read.
    ("trainer.best_checkpoint_eval_metric='',"
     "trainer.best_checkpoint_metric_comp=bigger,"
     "trainer.best_checkpoint_top_k=0", "train_and_eval"),
    ("trainer.best_checkpoint_eval_metric=validation_loss,"
     "trainer.best_checkpoint_metric_comp=lower", "train_and_eval"),
    ("trainer.best_checkpoint_export_subdir=exports/best/",
     "train_and_eval"),
    # Training alone never evaluates.
    ("trainer.validation_steps=0,trainer.validation_interval=-1,"
     "trainer.best_checkpoint_eval_metric=acuracy", "train"),
    # A learning rate of 0 trains nothing, as asked; no dropout at all.
    (f"{LR}=0,{WARMUP}.warmup_learning_rate=0.0", "train"),
    ("task.model.dropout_rate=0", "train"),
    (f"{STEPWISE}.boundaries=[100],{SCHEDULE}.stepwise.values=[0.1, 0.01]",
     "train"),
    (f"trainer.train_steps={2**63 - 1}", "train"),
    # A schedule that is not selected is not read.
    (f"{SCHEDULE}.constant.learning_rate=-1", "train"),
]


@pytest.mark.parametrize("override, mode", ACCEPTED,
                         ids=[f"{r[0]}-{r[1]}" for r in ACCEPTED])
def test_legitimate_value_passes(tmp_path, override, mode):
  plan = prepare(override, tmp_path / "m", mode)
  assert plan.mode.trains


def test_an_evaluator_does_not_check_what_only_training_reads():
  params = build("trainer.steps_per_loop=0,trainer.summary_interval=7,"
                 "task.train_data.global_batch_size=0,"
                 f"trainer.validation_interval=-1,{LR}=-1,"
                 f"{SCHEDULE}.cosine.decay_steps=0")
  checks.check_values(params, trains=False, evaluates=True)


def test_no_checkpoints_passes_with_a_warning(tmp_path, caplog):
  # TFM's switch for "save none"; the reference ResNet launcher uses it.
  prepare("trainer.checkpoint_interval=0", tmp_path / "m", "train")
  assert any("saves no checkpoint" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["nosuchtask", "ImageClassificationTask"])
def test_a_task_name_that_is_not_the_runs_task_is_refused(name):
  # A YAML's `task: {name: ...}` reads as choosing a task; in TFM the
  # config type does, and task.name is a label of multi-task runs.
  with pytest.raises(UsageError) as e:
    checks.check_values(build(f"task.name={name}"), trains=True,
                        evaluates=True)
  assert str(e.value).startswith(
      f"task.name={name!r} chooses no task: the experiment's task config "
      "(DigitsTaskConfig) chooses it, DigitsTask; TFM reads task.name only "
      "in multi-task runs. Remove task.name (or give DigitsTask's name), or "
      "choose the --experiment of the task you mean (registered tasks: ")
  assert "DigitsTask" in str(e.value).split("registered tasks: ")[1]


@pytest.mark.parametrize("name", ["", "DigitsTask", "digits_task", "digits"])
def test_the_runs_own_task_name_is_a_label(name):
  checks.check_values(build(f"task.name={name}" if name else ""),
                      trains=True, evaluates=True)


@pytest.mark.parametrize("field", [
    "trainer.best_checkpoint_eval_metric", "trainer.early_stopping.metric",
    "trainer.reduce_lr_on_plateau.metric"])
def test_a_metric_name_is_checked_whole(field):
  # Only the part before '|' was checked: early stopping on
  # 'accuracy|top1' was accepted and never acted.
  params = build(f"{field}='accuracy|top1'")
  with pytest.raises(UsageError) as raised:
    checks.check_best_checkpoint_metric(
        params, custom_trainer.CustomTrainer, evaluates=True, trains=True)
  said = str(raised.value)
  assert said.startswith(f"{field}='accuracy|top1': ") and (
      "'accuracy' logs one number: it has no '|top1' below it") in said, said


def test_a_nested_log_is_named_by_its_keys(monkeypatch):
  """A metric whose result is a mapping (a COCO-style one) logs its leaves,
  `name|key`: those pass, its bare name and other keys do not."""
  import tf_keras  # pylint: disable=g-import-not-at-top

  class Coco(tf_keras.metrics.Metric):

    def update_state(self, *args, **kwargs):
      pass

    def result(self):
      return {"AP": 0.0, "AP50": 0.0}

  built = digits_convnet.DigitsTask.build_metrics
  monkeypatch.setattr(
      digits_convnet.DigitsTask, "build_metrics",
      lambda self, training=True: built(self, training) + [Coco(name="coco")])
  for name in ("coco|AP", "coco|AP50", "accuracy"):
    checks.check_best_checkpoint_metric(
        build(f"trainer.early_stopping.metric='{name}'"),
        custom_trainer.CustomTrainer, evaluates=True, trains=True)
  for name in ("coco", "coco|AR", "coco|AP|x"):
    with pytest.raises(UsageError, match="do not log it"):
      checks.check_best_checkpoint_metric(
          build(f"trainer.early_stopping.metric='{name}'"),
          custom_trainer.CustomTrainer, evaluates=True, trains=True)


PLATEAU = "trainer.reduce_lr_on_plateau"


@pytest.mark.parametrize("override, rate", [
    (f"{PLATEAU}.min_lr=0.003", f"{LR}=0.003"),  # digits' own rate.
    (f"{PLATEAU}.min_lr=0.5", f"{LR}=0.003"),
    # A stepwise schedule's largest value.
    (f"{STEPWISE}.boundaries=[100],{SCHEDULE}.stepwise.values=[0.1,0.2],"
     f"{PLATEAU}.min_lr=0.2", f"{SCHEDULE}.stepwise.values=0.2"),
])
def test_a_min_lr_at_or_above_the_rate_is_refused(tmp_path, override, rate):
  # It was taken: five "factor 1 -> 0.5" lines, a factor of 0.03, and the
  # rate never changed.
  with pytest.raises(UsageError) as raised:
    prepare(f"{PLATEAU}.metric=accuracy,{override}", tmp_path / "m")
  said = str(raised.value)
  assert said.startswith(f"{PLATEAU}.min_lr=") and (
      f"at or above the learning rate ({rate}") in said, said
  assert not (tmp_path / "m").exists()


def test_a_min_lr_below_the_rate_passes(tmp_path):
  prepare(f"{PLATEAU}.metric=accuracy,{PLATEAU}.min_lr=0.001",
          tmp_path / "m")
  # Not read where the plateau is off.
  prepare(f"{PLATEAU}.min_lr=0.5", tmp_path / "n")


def test_metric_names_that_cannot_be_known_are_not_refused(monkeypatch):
  params = build("trainer.best_checkpoint_eval_metric=extra")

  class OwnEvalEnd(custom_trainer.CustomTrainer):

    def eval_end(self, aggregated_logs=None):
      return dict(super().eval_end(aggregated_logs), extra=1.0)

  checks.check_best_checkpoint_metric(params, OwnEvalEnd,
                                             evaluates=True)
  with pytest.raises(UsageError):  # The stock eval_end does not log it...
    checks.check_best_checkpoint_metric(
        params, custom_trainer.CustomTrainer, evaluates=True)
  # ... but a task that reduces aggregated logs may.
  monkeypatch.setattr(digits_convnet.DigitsTask, "reduce_aggregated_logs",
                      lambda self, logs, global_step=None: {"extra": 1.0})
  checks.check_best_checkpoint_metric(
      params, custom_trainer.CustomTrainer, evaluates=True)


def test_the_models_own_metrics_count(monkeypatch):
  # base_trainer evaluates `model.metrics` too (a compiled model's, say).
  params = build("trainer.best_checkpoint_eval_metric=auc")
  monkeypatch.setattr(
      digits_convnet.DigitsTask, "build_model",
      lambda self: types.SimpleNamespace(
          metrics=[types.SimpleNamespace(name="auc")]))
  checks.check_best_checkpoint_metric(
      params, custom_trainer.CustomTrainer, evaluates=True)


def test_launcher_exits_2_before_writing_anything(launch_forked, tmp_path):
  # The old code wrote params.yaml, then failed with a traceback.
  run = launch_forked(f"--experiment={EXP}", "--mode=train",
                      "--params_override=trainer.train_steps=abc",
                      model_dir=tmp_path / "m", timeout=120)
  assert_clean_usage_error(run, "trainer.train_steps='abc': give a whole "
                           "number of steps")


def resnet(override=""):
  import official.vision.registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  return params_lib.build(params_lib.ConfigSources(
      experiment="resnet_imagenet", params_override=override))


def test_tfms_own_experiment_passes_the_rules():
  checks.check_values(resnet(), trains=True, evaluates=True)


@pytest.mark.parametrize("field, value", [
    ("task.model.dropout_rate", "1.0"),
    ("task.model.backbone.resnet.stochastic_depth_drop_rate", "-0.2"),
    ("trainer.optimizer_config.learning_rate.stepwise.values",
     "[0.1, 0.01, -0.001, 0.0001]"),
    ("trainer.optimizer_config.warmup.linear.warmup_learning_rate", "-1"),
])
def test_the_rules_cover_every_such_field_of_tfms_own_experiment(field,
                                                                 value):
  with pytest.raises(UsageError, match=f"^{field}="):
    checks.check_values(resnet(f"{field}={value}"), trains=True,
                        evaluates=True)


def test_tfm_vision_shapes_of_zero_are_refused_and_their_defaults_pass():
  for override, first in (
      ("task.model.input_size=[0,224,3]", "task.model.input_size=[0, 224, 3]:"),
      ("task.validation_data.output_size=[-1,64]",
       "task.validation_data.output_size=[-1, 64]:")):
    params = params_lib.build(params_lib.ConfigSources(
        experiment="seg_deeplabv3_pascal", params_override=override))
    with pytest.raises(UsageError, match=re.escape(first)):
      checks.check_values(params, trains=True, evaluates=True)
  # TFM's own defaults, -1 ("unset") in data configs included, pass.
  for experiment in ("seg_deeplabv3_pascal", "video_classification_kinetics400",
                     "retinanet_resnetfpn_coco", "resnet_imagenet"):
    checks.check_values(params_lib.build(params_lib.ConfigSources(
        experiment=experiment)), trains=True, evaluates=True)


def test_a_decay_that_ends_before_training_is_warned_of_naming_it(caplog):
  # digits_convnet's cosine decays over 500 steps, its default train_steps.
  checks.check_values(build("trainer.train_steps=1000"), trains=True,
                      evaluates=True)
  said = [r.getMessage() for r in caplog.records if "decay_steps" in
          r.getMessage()]
  assert said == [
      "trainer.optimizer_config.learning_rate.cosine.decay_steps=500 ends "
      "before trainer.train_steps=1000: from step 500 on, the learning rate "
      "stays at the schedule's end (trainer.optimizer_config.learning_rate."
      "cosine.alpha=0.0). Set trainer.optimizer_config.learning_rate.cosine."
      "decay_steps to trainer.train_steps if the decay should span the "
      "run."], said
  caplog.clear()
  for override in ("", "trainer.train_steps=1000,trainer.optimizer_config."
                   "learning_rate.cosine.decay_steps=1000"):
    checks.check_values(build(override), trains=True, evaluates=True)
  assert not any("decay_steps" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("override", [
    "trainer.reduce_lr_on_plateau.factor=2",
    "trainer.early_stopping.patience=0",
    "trainer.reduce_lr_on_plateau.min_delta=-1"])
def test_a_plateau_value_is_refused_before_a_metric_turns_it_on(override):
  with pytest.raises(UsageError, match=override.split("=")[0]):
    checks.check_values(build(override), trains=True, evaluates=True)
