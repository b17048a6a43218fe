"""The installed package: one top-level `tfm_ext`, its console command, the default.

Builds this repository's wheel and installs it into a fresh virtual
environment that sees the machine's TensorFlow and TFM but not this
checkout, then trains the embedded default from another directory.
"""

import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO
from conftest import built_once


def _build_and_install(folder):
  root = pathlib.Path(folder)
  wheels = root / "wheels"
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                  "--no-build-isolation", "-q", "-w", str(wheels), REPO],
                 check=True, capture_output=True, timeout=300)
  wheel, = wheels.glob("tfm_ext-*.whl")
  venv = root / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--system-site-packages",
                  str(venv)], check=True, timeout=120)
  subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install",
                  "--no-deps", "-q", str(wheel)], check=True,
                 capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """`(bin directory of a venv with the wheel installed, the wheel's path)`.

  Built and installed once a session.
  """
  root = pathlib.Path(built_once(tmp_path_factory, "package",
                                 _build_and_install))
  wheel, = (root / "wheels").glob("tfm_ext-*.whl")
  return root / "venv" / "bin", wheel


def test_the_wheel_holds_one_top_level_package(installed):
  _, wheel = installed
  names = zipfile.ZipFile(wheel).namelist()
  tops = {name.split("/")[0] for name in names
          if not name.split("/")[0].endswith((".dist-info", ".data"))}
  assert tops == {"tfm_ext"}, tops
  assert "tfm_ext/examples/digits_convnet.py" in names
  entry_points = next(n for n in names if n.endswith("entry_points.txt"))
  assert "tfm-ext-train = tfm_ext.run.cli:main" in zipfile.ZipFile(wheel).read(
      entry_points).decode()


def test_the_venv_imports_the_installed_package_not_the_checkout(installed,
                                                                tmp_path):
  bin_dir, _ = installed
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  where = subprocess.run(
      [str(bin_dir / "python"), "-c", "import tfm_ext; print(tfm_ext.__file__)"],
      capture_output=True, text=True, check=True, env=env, cwd=tmp_path)
  assert where.stdout.startswith(str(bin_dir.parent)), where.stdout


@pytest.mark.parametrize("command", [["tfm-ext-train"],
                                     ["python", "-m", "tfm_ext"]])
def test_the_default_trains_from_a_plain_install_outside_the_checkout(
    installed, tmp_path, data_dir, command):
  bin_dir, _ = installed
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(TFM_EXT_DATA_DIR=data_dir, PATH=f"{bin_dir}:{env['PATH']}")
  proc = subprocess.run(
      [str(bin_dir / command[0]), *command[1:],
       "--experiment=digits_convnet", "--mode=train",
       f"--model_dir={tmp_path / 'digits'}",
       "--params_override=trainer.train_steps=10,trainer.steps_per_loop=5"],
      capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  assert "done | train | step 10" in proc.stdout
  # The library, not this checkout, ran: nothing of REPO on the path.
  assert REPO not in proc.stderr
  # Quiet start-up: no TensorFlow C++ INFO line on the console.
  assert " I tensorflow/" not in proc.stderr, proc.stderr[-3000:]


def test_registry_imports_a_downstream_repos_registrations(installed,
                                                           tmp_path, data_dir):
  bin_dir, _ = installed
  (tmp_path / "my_project").mkdir()
  (tmp_path / "my_project" / "__init__.py").write_text("")
  (tmp_path / "my_project" / "registry_imports.py").write_text(
      "import tfm_ext\n"
      "@tfm_ext.register_trainer('mine')\n"
      "class Mine(tfm_ext.CustomTrainer):\n"
      "  '''My own trainer.'''\n")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  # Run from the project's directory, not on PYTHONPATH: the console script
  # finds it there as `python -m` would.
  env.update(TFM_EXT_DATA_DIR=data_dir)
  proc = subprocess.run(
      [str(bin_dir / "tfm-ext-train"), "--registry=my_project.registry_imports",
       "--list"], capture_output=True, text=True, timeout=300, env=env,
      cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "mine" in proc.stdout and "My own trainer." in proc.stdout
  missing = subprocess.run(
      [str(bin_dir / "tfm-ext-train"), "--registry=no_such.module", "--list"],
      capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
  assert missing.returncode == 2
  assert "--registry=no_such.module cannot be imported" in missing.stderr
  assert (f"Python looked for 'no_such' in the current directory ({tmp_path}, "
          "on its path)") in missing.stderr
  # The package is there, a module of it is misspelled: named, with the
  # closest of its modules.
  misspelled = subprocess.run(
      [str(bin_dir / "tfm-ext-train"), "--registry=my_project.registry_import",
       "--list"], capture_output=True, text=True, timeout=300, env=env,
      cwd=tmp_path)
  assert misspelled.returncode == 2
  assert (f"The package my_project was found ({tmp_path / 'my_project'}), "
          "and it has no module 'registry_import': did you mean "
          "--registry=my_project.registry_imports?") in misspelled.stderr, (
              misspelled.stderr)
