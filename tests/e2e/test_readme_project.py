"""The README's "Your own experiment", built from its text and run as written.

The files are the README's `# my_project/...` code blocks, written into a
directory outside the repository; the commands are its `sh` block, run from
there with nothing of this repository on the path: `tfm-ext-train` as the
installed console script, the fork script with `python`. A change to the
README that breaks the recipe fails here.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

SECTION = "## Your own experiment"


def readme_section():
  with open(os.path.join(REPO, "README.md")) as f:
    text = f.read()
  start = text.index(SECTION)
  end = text.index("\n## ", start + len(SECTION))
  return text[start:end]


def code_blocks(section, language):
  return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def write_project(section, root):
  """Writes each block that starts `# my_project/<file>`; returns the names."""
  written = []
  for block in code_blocks(section, "python"):
    first = block.splitlines()[0]
    match = re.fullmatch(r"# (my_project/\S+\.py)", first)
    if match:
      path = os.path.join(root, match.group(1))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        f.write(block)
      written.append(match.group(1))
  assert "an empty `my_project/__init__.py`" in section
  open(os.path.join(root, "my_project", "__init__.py"), "w").close()
  return written


def test_the_readme_project_trains_by_the_console_script_and_its_fork(
    tmp_path, data_dir):
  section = readme_section()
  root = tmp_path / "project"
  assert write_project(section, str(root)) == [
      "my_project/wine.py", "my_project/registry_imports.py",
      "my_project/train.py"]
  # The recipe is shorter than the embedded example it replaces as a model.
  with open(root / "my_project" / "wine.py") as f:
    experiment_lines = len(f.read().splitlines())
  with open(os.path.join(REPO, "tfm_ext", "examples",
                         "digits_convnet.py")) as f:
    assert experiment_lines < len(f.read().splitlines()) / 2
  (commands,) = code_blocks(section, "sh")
  commands = commands.strip().splitlines()
  assert [c.split()[0] for c in commands] == ["tfm-ext-train", "python"]
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["TFM_EXT_DATA_DIR"] = data_dir
  model_dirs, runs = [], []
  for command in commands:
    args = command.split()
    model_dir = re.search(r"--model_dir=(\S+)", command).group(1)
    local = str(tmp_path / os.path.basename(model_dir))
    args = [a.replace(model_dir, local) for a in args]
    args[0] = (shutil.which("tfm-ext-train") if args[0] == "tfm-ext-train"
               else sys.executable)
    assert args[0], "tfm-ext-train is not installed (pip install -e .)"
    model_dirs.append(local)
    runs.append(subprocess.Popen(args, cwd=root, env=env, text=True,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE))
  for run, model_dir in zip(runs, model_dirs):
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stderr[-3000:]
    # The action's line after each evaluation, the trainer's scalar.
    assert stdout.count("mine: accuracy") == 2, stdout
    assert "weight_norm" in stdout
    with open(os.path.join(model_dir, "run_summary.json")) as f:
      summary = json.load(f)
    assert (summary["trainer"], summary["global_step"]) == ("mine", 200)
    assert summary["train_metrics"]["weight_norm"] > 0
    assert summary["eval_metrics"]["accuracy"] >= 0.9, summary
