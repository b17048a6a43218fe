"""What `tfm_ext`'s docstring calls stable, pinned.

A change here is a change of the stable API: the old name or path keeps
working, with a `DeprecationWarning` naming the new one, for a release
(`tfm_ext/_moved.py`), and this file says which.
"""

import configparser
import os
import subprocess
import sys

import tfm_ext
from conftest import REPO

STABLE_NAMES = [
    "ActionContext", "CustomTrainer", "MODELS", "Preempted", "Registry",
    "RegistryError", "RunAction", "RunFailed", "ServingInputs", "TRAINERS",
    "TrainerConfig", "UsageError", "build_model", "get_trainer", "launch",
    "load", "register_action", "register_model", "register_trainer",
    "run_experiment"]

# Old path -> (where it moved, in which release); the old paths go in 0.3.0.
MOVED = {"tfm_ext.launcher": ("tfm_ext.run.launcher", "0.2.0"),
         "tfm_ext.ranking": ("tfm_ext.training.ranking", "0.2.0"),
         "tfm_ext.errors": ("tfm_ext.base.errors", "0.2.1"),
         "tfm_ext.run._startup": ("tfm_ext.base.startup", "0.2.1")}


def _python(code):
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300, cwd=REPO,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                             "PYTHONPATH": REPO})


def test_the_stable_names_are_exported_and_resolve():
  assert tfm_ext.__all__ == STABLE_NAMES
  for name in STABLE_NAMES:
    assert getattr(tfm_ext, name) is not None, name


def test_the_console_command_and_the_forks_entry_point():
  setup = configparser.ConfigParser()
  setup.read(os.path.join(REPO, "setup.cfg"))
  scripts = setup["options.entry_points"]["console_scripts"].split()
  assert scripts == ["tfm-ext-train", "=", "tfm_ext.run.cli:main"]
  with open(os.path.join(REPO, "tfm_ext", "__main__.py")) as f:
    assert "cli.main()" in f.read()
  # A fork runs app.run(tfm_ext.run.launcher.main) after its registrations.
  run = _python("import tfm_ext.run.launcher as l; print(callable(l.main))")
  assert run.stdout.strip() == "True", run.stderr


def test_a_moved_module_still_imports_with_a_warning_naming_its_new_path():
  checks = "; ".join(
      f"import {old}, {new}; assert sys.modules[{old!r}] is {new}"
      for old, (new, _) in MOVED.items())
  run = _python(f"import sys; {checks}; print('same modules')")
  assert run.returncode == 0 and "same modules" in run.stdout, run.stderr
  for old, (new, since) in MOVED.items():
    # Shown at the importing line of __main__, as a fork's script has it.
    assert (f"DeprecationWarning: {old} moved to {new} in tfm_ext {since}; "
            f"import {new} (the old path goes in 0.3.0).") in run.stderr, (
                run.stderr)


def test_the_old_fork_recipe_trains(launch_forked, tmp_path):
  # The fork of the README before 0.2.0: import tfm_ext.launcher, then
  # the registrations, then app.run(tfm_ext.launcher.main).
  fork = tmp_path / "my_train.py"
  fork.write_text("from absl import app\n"
                  "import tfm_ext.launcher\n"
                  "import registry_imports\n"
                  "if __name__ == '__main__':\n"
                  "  app.run(tfm_ext.launcher.main)\n")
  run = launch_forked("--experiment=digits_convnet", "--mode=train",
                      "--params_override=trainer.train_steps=2",
                      model_dir=tmp_path / "m", script=str(fork))
  assert run.returncode == 0, run.stderr
  assert "done | train | step 2" in run.stdout, run.stdout


def test_python_m_of_the_old_ranking_path_prints_its_smoke_overrides():
  run = subprocess.run([sys.executable, "-m", "tfm_ext.ranking"],
                       capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert run.returncode == 0, run.stderr
  from tfm_ext.training import ranking  # pylint: disable=g-import-not-at-top
  assert run.stdout.strip() == ranking.SMOKE
