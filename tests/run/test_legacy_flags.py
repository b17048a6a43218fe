"""Every flag of the reference CTL runner, short names too, parses here.

The reference's flag list is read from the installed tf-models-official at
run time: a fresh interpreter imports `resnet_ctl_imagenet_main`, calls
`common.define_keras_flags()` as its `__main__` does, and reports each flag
that a module of `official` defined, with a sample value other than the
default and what the reference's own parser makes of it.
"""

import json
import os
import subprocess
import sys
import textwrap

from absl import flags
import pytest
import yaml

from conftest import REPO
from conftest import built_once
from experiments.imagenet import reference_flags
from experiments.imagenet import reference_runner
from imagenet_fixtures import imagenet_dir  # pylint: disable=unused-import
from tfm_ext.base.errors import UsageError

MAIN = os.path.join(REPO, "launchers", "resnet_ctl_imagenet_main.py")
# The seed's examples; the list read from the wheel must hold them.
SEED_SHORT_NAMES = {"batch_size": "bs", "data_dir": "dd", "model_dir": "md",
                    "train_epochs": "te", "epochs_between_evals": "ebe"}

LIST_REFERENCE_FLAGS = textwrap.dedent("""
    import json
    from absl import flags
    from official.legacy.image_classification.resnet import common
    from official.legacy.image_classification.resnet import (
        resnet_ctl_imagenet_main)  # Defines two flags on import.

    common.define_keras_flags()  # What the reference's __main__ calls.

    def sample(flag):
      kind, default = flag.flag_type(), flag.default
      if kind == "bool":
        return "false" if default else "true"
      if kind.endswith("enum"):
        return next(v for v in flag.parser.enum_values if v != default)
      if kind == "int":
        return str((default or 0) + 3)
      if kind == "float":
        return str((default or 0) + 0.5)
      return "x" if default != "x" else "y"

    found = {}
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
      if not module.startswith("official."):
        continue  # TensorFlow's own flags, defined on import.
      for flag in module_flags:
        value = sample(flag)
        found[flag.name] = {
            "short_name": flag.short_name, "type": flag.flag_type(),
            "default": flag.default, "sample": value,
            "parsed": flag.parser.parse(value)}
    print(json.dumps(found))
""")


def _list_reference_flags(folder):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", LIST_REFERENCE_FLAGS],
                        capture_output=True, text=True, env=env, timeout=120,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(folder, "flags.json"), "w") as f:
    f.write(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The reference runner's flags, by name, from the installed wheel.

  Listed once a session.
  """
  folder = built_once(tmp_path_factory, "reference_flags",
                      _list_reference_flags)
  with open(os.path.join(folder, "flags.json")) as f:
    found = json.load(f)
  # A listing that found nothing would let every check below pass.
  for name, short_name in SEED_SHORT_NAMES.items():
    assert found[name]["short_name"] == short_name, found.get(name)
  assert {"report_accuracy_metrics", "tf_gpu_thread_mode",
          "per_gpu_thread_count", "batchnorm_spatial_persistent",
          "enable_get_next_as_optional", "run_eagerly", "use_tf_function",
          "single_l2_loss_op"} <= set(found)
  return found


def ours(args=()):
  """Our launcher's flags in a private FlagValues, `args` parsed."""
  flag_values = flags.FlagValues()
  reference_flags.define_flags(flag_values)
  flag_values(["main", *args])
  return flag_values


def test_launcher_declares_exactly_the_reference_flags_and_short_names(
    reference):
  declared = ours()
  assert sorted(declared) == sorted(
      [*reference, *(f["short_name"] for f in reference.values()
                     if f["short_name"])])
  differences = [
      (name, field, ref[field], mine)
      for name, ref in reference.items()
      for field, mine in (("short_name", declared[name].short_name),
                          ("type", declared[name].flag_type()),
                          ("default", declared[name].default))
      if mine != ref[field]]
  assert not differences, differences


def test_every_reference_flag_and_short_name_parses_as_the_reference_parses(
    reference):
  spellings = [(name, name, ref) for name, ref in reference.items()]
  spellings += [(ref["short_name"], name, ref)
                for name, ref in reference.items() if ref["short_name"]]
  wrong = []
  for spelled, name, ref in spellings:
    try:
      value = ours([f"--{spelled}={ref['sample']}"])[name].value
    except flags.Error as e:
      wrong.append((spelled, str(e)))
      continue
    if value != ref["parsed"]:
      wrong.append((spelled, ref["sample"], value, ref["parsed"]))
  assert not wrong, wrong
  print(f"{len(reference)} reference flags, "
        f"{len(spellings) - len(reference)} short names parse")


def test_flags_the_reference_never_reads_warn_once_each_when_changed():
  fv = ours(["--num_gpus=0", "--report_accuracy_metrics=false", "--run_eagerly",
             "--worker_hosts=a:1,b:2", "--bds=test_benchmark"])
  notes = reference_runner.translate(fv, gpus_visible=0).notes
  assert notes == [
      "--run_eagerly=true is ignored: the reference CTL runner never reads "
      "it; --use_tf_function=false runs steps eagerly.",
      "--report_accuracy_metrics=false is ignored: the reference CTL runner "
      "never reads it; training and evaluation accuracy are always reported.",
      "--worker_hosts=a:1,b:2 is ignored: the reference CTL runner never "
      "reads it; multi-worker jobs read TF_CONFIG."]
  # The default, even spelled out (--bds above), says nothing.
  assert reference_runner.translate(ours(["--num_gpus=0"]), 0).notes == []


def test_gpu_only_flags_say_they_do_nothing_on_a_cpu():
  fv = ours(["--num_gpus=0", "--gt_mode=gpu_private", "--pgtc=4",
             "--nobatchnorm_spatial_persistent"])
  notes = reference_runner.translate(fv, gpus_visible=0).notes
  assert notes == [
      f"--{name}={value} has no effect: no GPU is visible (on a GPU it sets "
      f"{env}, as in the reference)." for name, value, env in (
          ("tf_gpu_thread_mode", "gpu_private", "TF_GPU_THREAD_MODE"),
          ("per_gpu_thread_count", "4", "TF_GPU_THREAD_COUNT"),
          ("batchnorm_spatial_persistent", "false",
           "TF_USE_CUDNN_BATCHNORM_SPATIAL_PERSISTENT"))]
  # With a GPU they act (below); only a count without a mode says nothing.
  notes = reference_runner.translate(ours(["--pgtc=4"]), gpus_visible=1).notes
  assert notes == ["--per_gpu_thread_count=4 has no effect without "
                   "--tf_gpu_thread_mode, as in the reference."]


def test_gpu_only_flags_set_the_reference_environment_with_a_gpu(monkeypatch):
  names = ("TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT",
           reference_flags.CUDNN_BATCHNORM_ENV)
  for name in names:  # Restored after the test, present or not before.
    monkeypatch.setenv(name, "before")
    monkeypatch.delenv(name)
  reference_flags.configure_gpus(ours(["--gt_mode=gpu_private", "--pgtc=3",
                                       "--nobatchnorm_spatial_persistent"]))
  assert [os.environ.get(n) for n in names] == ["gpu_private", "3", None]
  monkeypatch.delenv("TF_GPU_THREAD_MODE")
  monkeypatch.delenv("TF_GPU_THREAD_COUNT")
  reference_flags.configure_gpus(ours())  # Defaults: persistent batch norm.
  assert [os.environ.get(n) for n in names] == [None, None, "1"]


def test_fp16_graph_rewrite_trains_in_float32_and_needs_fp16():
  fv = ours(["--num_gpus=0", "--dt=fp16",
            "--fp16_implementation=graph_rewrite"])
  translation = reference_runner.translate(fv, gpus_visible=0)
  override = yaml.safe_load(translation.sources.params_override)
  assert override["runtime"]["mixed_precision_dtype"] == "float32"
  assert override["task"]["train_data"]["dtype"] == "float32"
  assert any("graph_rewrite trains in float32" in n for n in translation.notes)
  with pytest.raises(UsageError, match="unless --dtype=fp16"):
    reference_runner.translate(
        ours(["--num_gpus=0", "--fp16_implementation=graph_rewrite"]), 0)


def test_short_names_drive_a_real_run(launch_forked, imagenet_dir,
                                      tmp_path):
  # `launch_forked` passes --model_dir first; --md, later, must win. Eager
  # steps and no evaluation keep ResNet50 on this CPU to a few seconds.
  run = launch_forked(
      f"--md={tmp_path / 'm'}", f"--dd={imagenet_dir}", "--bs=2", "--ng=0",
      "--te=3", "--ebe=2", "--train_steps=2", "--skip_eval",
      "--use_tf_function=false", "--use_tf_while_loop=false",
      "--report_accuracy_metrics=false", "--gt_mode=gpu_private",
      model_dir=tmp_path / "not_used", script=MAIN)
  assert run.returncode == 0, run
  assert not (tmp_path / "not_used").exists()
  with open(tmp_path / "m" / "run_summary.json") as f:
    assert json.load(f)["global_step"] == 2
  with open(tmp_path / "m" / "params.yaml") as f:
    params = yaml.safe_load(f)
  assert params["task"]["train_data"]["global_batch_size"] == 2
  assert params["task"]["train_data"]["input_path"].startswith(imagenet_dir)
  assert params["runtime"]["num_gpus"] == 0
  assert params["trainer"]["validation_interval"] == 2 * 2  # --ebe epochs.
  for fragment in ("ignoring --train_epochs=3",
                   "--report_accuracy_metrics=false is ignored",
                   "--tf_gpu_thread_mode=gpu_private has no effect"):
    assert fragment in run.stderr, run
