"""The manual builds with no broken link, and every code block in it runs.

The pages are the README and docs/*.md. A page's blocks run in page order in a fresh working directory, as a reader
following the page would run them (docs/index.md, "How the pages are
tested", says so to the reader):

- each fence names its language: `sh`, `python`, `yaml`, or `text` (output,
  pseudocode and trees: not code, not run); anything else fails here;
- a `python` or `yaml` block whose first line is `# <relative path>` is
  written to that file; any other `python` block runs as `python -`, any
  other `yaml` block must parse;
- a `sh` block runs under `bash -euo pipefail` and must exit 0;
- a block whose fence follows `<!-- not run: <reason> -->` is not run (a
  TPU, a real bucket, the test command itself); the reason is required;
- every `/tmp/` in a `sh` or `python` block is the working directory's
  `tmp/`, so pages can name model_dirs as a reader would.

The working directory holds links to this repository's `launchers/`,
`experiments/`, `registry_imports.py` and `benchmarks/`, so
`python launchers/train.py` works as from a clone; `tfm-ext-train` is the
installed console script; nothing of the repository is on PYTHONPATH.
"""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

DOCS = os.path.join(REPO, "docs")
LANGUAGES = ("sh", "python", "yaml", "text")
LINKED = ("launchers", "experiments", "registry_imports.py", "benchmarks")
FENCE = re.compile(
    r"(?:<!-- not run: (?P<reason>[^\n]*?) -->\n)?"
    r"^```(?P<language>[^\n]*)\n(?P<body>.*?)^```$", re.S | re.M)
PATH_LINE = re.compile(r"# ([\w./-]+\.\w+)")


def pages():
  """The README, then the manual's pages, relative to the repository."""
  return ["README.md"] + sorted(
      f"docs/{name}" for name in os.listdir(DOCS) if name.endswith(".md"))


def blocks(path):
  """(language, body, reason not run or None), in page order."""
  with open(path) as f:
    text = f.read()
  assert not re.search(r"^[ \t]+```", text, re.M), (
      f"{path}: an indented fence (this test runs fences at the margin)")
  found = [(m["language"].strip(), m["body"], m["reason"])
           for m in FENCE.finditer(text)]
  assert text.count("\n```") == 2 * len(found), (
      f"{path}: a fence this test cannot pair")
  return found


def _run(command, cwd, env, stdin=None, timeout=600):
  """Runs a block in a session of its own; what it left running (a
  trainer it started with `&`) ends with it, however it ended."""
  proc = subprocess.Popen(command, cwd=cwd, env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, start_new_session=True)
  try:
    stdout, stderr = proc.communicate(stdin, timeout=timeout)
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()
  return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("page", pages())
def test_every_code_block_of_the_page_runs(page, tmp_path, data_dir):
  cwd = tmp_path / "reader"
  (cwd / "tmp").mkdir(parents=True)
  for name in LINKED:
    os.symlink(os.path.join(REPO, name), cwd / name)
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "TFM_EXT_DATA_DIR")}
  env.update(TFM_EXT_DATA_DIR=data_dir, PYTHONPATH=str(cwd),
             TF_CPP_MIN_LOG_LEVEL="2")
  assert shutil.which("tfm-ext-train"), (
      "tfm-ext-train is not installed (pip install -e .)")
  not_run = []
  for number, (language, body, reason) in enumerate(
      blocks(os.path.join(REPO, page)), 1):
    where = f"{page}, code block {number} ({language or 'no language'})"
    assert language in LANGUAGES, f"{where}: name one of {LANGUAGES}"
    if reason is not None:
      assert reason.strip(), f"{where}: 'not run' needs its reason"
      not_run.append(f"{where}: {reason}")
      continue
    if language == "text":
      continue
    path = PATH_LINE.fullmatch(body.splitlines()[0]) if body else None
    if path and language in ("python", "yaml"):
      target = cwd / path.group(1)
      assert not os.path.isabs(path.group(1)) and ".." not in path.group(1)
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(body)
      continue
    if language == "yaml":
      yaml.safe_load(body)
      continue
    body = body.replace("/tmp/", f"{cwd}/tmp/")
    if language == "python":
      result = _run([sys.executable, "-"], cwd, env, stdin=body)
    else:
      result = _run(["bash", "-euo", "pipefail", "-c", body], cwd, env)
    assert result.returncode == 0, (
        f"{where} exited {result.returncode}:\n{body}\n--- stdout\n"
        f"{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}")
  print("\n".join(not_run))


def test_the_manual_builds_with_no_broken_link_or_anchor(tmp_path):
  # mkdocs --strict fails on a link to a missing page or heading
  # (validation in mkdocs.yml).
  result = _run([sys.executable, "-m", "mkdocs", "build", "--strict",
                 "--site-dir", str(tmp_path / "site")], REPO,
                dict(os.environ))
  assert result.returncode == 0, result.stderr


def test_the_readme_links_only_to_pages_and_headings_that_exist():
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", readme)
  assert links, "the README maps the manual"
  for page, anchor in links:
    path = os.path.join(REPO, page)
    assert os.path.isfile(path), f"README links to {page}: no such file"
    if anchor and page.endswith(".md"):
      with open(path) as f:
        headings = [_slug(h) for h in re.findall(r"^#+ (.+)$", f.read(),
                                                 re.M)]
      assert anchor in headings, f"README links to {page}#{anchor}"


def _slug(heading):
  """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
  text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
  return re.sub(r"[-\s]+", "-", text)
