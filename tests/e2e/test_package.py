"""The installed package: one top-level `tfm_ext`, its console command, the default.

Builds this repository's wheel and installs it into a fresh virtual
environment that sees the packages of the Python running the tests (its
TensorFlow and TFM, from a venv of its own or the system's) but not this
checkout, then trains the embedded default from another directory.
"""

import os
import pathlib
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO
from conftest import built_once


def _site_dirs():
  """The site directories of the Python running the tests.

  A venv's own (and its base's with `--system-site-packages`), or the
  system's, and the user's where that is on: not the base Python's alone,
  which is what `--system-site-packages` would give a venv made from a venv.
  """
  dirs = site.getsitepackages()
  if site.ENABLE_USER_SITE:
    dirs.append(site.getusersitepackages())
  return [d for d in dirs if os.path.isdir(d)]


def _see_outer_packages(venv):
  """Makes `venv` see `_site_dirs()` after its own site-packages.

  Through a `.pth` file that calls `site.addsitedir`, so the `.pth` files
  of those directories run too, as they do for the tests' Python.
  """
  python = str(venv / "bin" / "python")
  own = subprocess.run(
      [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
      capture_output=True, text=True, check=True).stdout.strip()
  with open(os.path.join(own, "tests_outer_site.pth"), "w") as f:
    f.writelines(f"import site; site.addsitedir({d!r})\n"
                 for d in _site_dirs())


def _run(argv):
  """Runs a build step; a failure shows its output (pip's reason)."""
  done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"


def _build_and_install(folder):
  root = pathlib.Path(folder)
  # Built from a copy: the checkout may be read-only (another user's), and
  # setuptools leaves `build/` in the tree it builds, whose stale files
  # would end up in a later wheel.
  source = root / "source"
  shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
      ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
  wheels = root / "wheels"
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
        "--no-build-isolation", "-q", "-w", str(wheels), str(source)])
  wheel, = wheels.glob("tfm_ext-*.whl")
  venv = root / "venv"
  _run([sys.executable, "-m", "venv", str(venv)])
  _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps",
        "-q", str(wheel)])
  # After the install: pip in the venv sees no other tfm_ext.
  _see_outer_packages(venv)


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


def test_the_venv_sees_the_packages_of_the_python_running_the_tests(
    installed, tmp_path):
  # Each of its site directories, a venv's own too (where the tests run
  # from a venv: the base Python's alone would miss what it installed),
  # after the venv's own, so that the wheel's tfm_ext is the one imported.
  bin_dir, _ = installed
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  path = subprocess.run(
      [str(bin_dir / "python"), "-c",
       "import sys; print(*sys.path, sep='\\n')"],
      capture_output=True, text=True, check=True, env=env,
      cwd=tmp_path).stdout.splitlines()
  own = [i for i, p in enumerate(path) if p.startswith(str(bin_dir.parent))]
  outer = [path.index(d) for d in _site_dirs() if d in path]
  assert own and len(outer) == len(_site_dirs()), (path, _site_dirs())
  assert max(own) < min(outer), path


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
