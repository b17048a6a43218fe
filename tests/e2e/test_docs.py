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
- a `text` block whose fence follows `<!-- output -->` is what the run
  block before it printed: each of its lines matches a line the block
  printed, on stdout or stderr, in the order of that stream; `...` or `…`
  stands for any text, `<word>` for a value (`<pid>`, `<step>`); lines
  printed and not shown are allowed, so it may show the lines that matter;
- every `/tmp/` in a `sh`, `python` or `yaml` block, a file's included,
  is the working directory's `tmp/`, so pages can name model_dirs as a
  reader would and leave nothing in the machine's `/tmp`.

The working directory holds links to this repository's `launchers/`,
`experiments/`, `registry_imports.py` and `benchmarks/`, so
`python launchers/train.py` works as from a clone; `tfm-ext-train` is the
installed console script; nothing of the repository is on PYTHONPATH.

The README and docs/getting-started.md, a new user's first path, run the
real console script and interpreter. The other pages' `tfm-ext-train ...`
and `python SCRIPT.py ...` are forked from one process that imported
TensorFlow, TFM and Orbit once a session (tests/fork_socket.py: about 4 s
of CPU less a command): a `tfm-ext-train` and a `python` first on PATH
pass the command, its stdin, stdout, stderr, environment and working
directory to it and stand for the child (its pid for `$!`, `kill` and
`wait`, its exit status); `python -c`, `-m` or `-` is the real interpreter.
"""

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time

import pytest
import yaml

from conftest import REPO, _launcher_imports, built_once
import fork_socket

DOCS = os.path.join(REPO, "docs")
LANGUAGES = ("sh", "python", "yaml", "text")
LINKED = ("launchers", "experiments", "registry_imports.py", "benchmarks")
FENCE = re.compile(
    r"(?:<!-- (?:not run: (?P<reason>[^\n]*?)|(?P<output>output)) -->\n)?"
    r"^```(?P<language>[^\n]*)\n(?P<body>.*?)^```$", re.S | re.M)
# In an output block: any text, and a value.
ELIDED = re.compile(r"\.\.\.|…|<[a-z][a-z_ ]*>")
PATH_LINE = re.compile(r"# ([\w./-]+\.\w+)")
# A new user's first path: the real console script and interpreter.
REAL_PROCESSES = ("README.md", "docs/getting-started.md")


def pages():
  """The README, then the manual's pages, relative to the repository."""
  return ["README.md"] + sorted(
      f"docs/{name}" for name in os.listdir(DOCS) if name.endswith(".md"))


def blocks(path):
  """(language, body, reason not run or None, whether output), in order."""
  with open(path) as f:
    text = f.read()
  assert not re.search(r"^[ \t]+```", text, re.M), (
      f"{path}: an indented fence (this test runs fences at the margin)")
  found = [(m["language"].strip(), m["body"], m["reason"], bool(m["output"]))
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


def _line_pattern(shown):
  """A shown output line as a regular expression of a printed line."""
  parts = ELIDED.split(shown.strip())
  wildcards = [".*" if m.group() in ("...", "…") else ".+"
               for m in ELIDED.finditer(shown.strip())]
  pattern = re.escape(parts[0])
  for wildcard, part in zip(wildcards, parts[1:]):
    pattern += wildcard + re.escape(part)
  return re.compile(pattern)


def unshown_lines(shown, stdout, stderr):
  """The lines of `shown` that the block did not print, in order.

  Each shown line is looked for in stdout, then in stderr, after the line
  of that stream the previous shown line of it matched.
  """
  streams = [[line.strip() for line in text.splitlines()]
             for text in (stdout, stderr)]
  at = [0, 0]
  missing = []
  for line in filter(str.strip, shown.splitlines()):
    pattern = _line_pattern(line)
    for index, printed in enumerate(streams):
      found = next((i for i in range(at[index], len(printed))
                    if pattern.fullmatch(printed[i])), None)
      if found is not None:
        at[index] = found + 1
        break
    else:
      missing.append(line)
  return missing


def _reader_env(data_dir):
  """A page's environment, but its PYTHONPATH (its working directory).

  The scripts of the Python running the tests (`tfm-ext-train`, `pip`, a
  venv's `python`) come first on PATH, as in its activated venv: the tests
  may be run as `VENV/bin/python -m pytest` without activating it.
  """
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "TFM_EXT_DATA_DIR")}
  env.update(TFM_EXT_DATA_DIR=data_dir, TF_CPP_MIN_LOG_LEVEL="2",
             PATH=os.pathsep.join([sysconfig.get_path("scripts"),
                                   env.get("PATH", os.defpath)]))
  return env


class _ForkServer:
  """A tests/fork_socket.py process; its clients are in `bin`."""

  def __init__(self, modules_json, env, directory):
    self.socket = os.path.join(directory, "socket")
    assert len(self.socket) < 100, f"{self.socket}: too long for a socket"
    self.log = os.path.join(directory, "fork_socket.stderr")
    self.bin = os.path.join(directory, "bin")
    os.mkdir(self.bin)
    with open(self.log, "w") as log:
      self.proc = subprocess.Popen(
          [sys.executable, fork_socket.__file__, self.socket, modules_json],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
          bufsize=0, env=env, cwd=directory, start_new_session=True)
    try:
      self._expect("ready", timeout=300)
    except AssertionError:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait()
      raise
    fork_socket.write_shims(self.bin, self.socket)

  def _expect(self, word, timeout):
    said, expected = b"", f"{fork_socket.PREFIX}{word}\n".encode()
    deadline = time.monotonic() + timeout
    while not said.endswith(expected):
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
        raise AssertionError(f"fork_socket.py did not say {word} within "
                             f"{timeout} s (its log: {self.log})")
      more = os.read(self.proc.stdout.fileno(), 4096)
      if not more:
        with open(self.log) as f:
          raise AssertionError(f"fork_socket.py exited {self.proc.wait()}: "
                               f"{f.read()[-3000:]}")
      said += more

  def wait_idle(self, timeout=60):
    """Returns once the children of a block's killed commands ended."""
    self.proc.stdin.write(b"idle\n")
    self._expect("idle", timeout)

  def close(self):
    """Ends the server, what still runs with it, and its socket."""
    self.proc.stdin.close()
    try:
      self.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait()
      raise
    assert self.proc.returncode == 0, f"fork_socket.py: see {self.log}"
    assert not os.path.exists(self.socket)


@pytest.fixture(scope="session")
def fork_server(data_dir, tmp_path_factory):
  """A `_ForkServer` for every page but REAL_PROCESSES, once a session."""
  modules = built_once(tmp_path_factory, "launcher_imports",
                       _launcher_imports)
  # TensorFlow imported as a launcher imports it (tfm_ext/base/startup.py).
  server = _ForkServer(os.path.join(modules, "modules.json"),
                       dict(_reader_env(data_dir), TF_USE_LEGACY_KERAS="1"),
                       str(tmp_path_factory.mktemp("fork_socket")))
  yield server
  server.close()


@pytest.mark.slow
@pytest.mark.parametrize("page", pages())
def test_every_code_block_of_the_page_runs(page, tmp_path, data_dir,
                                           request):
  cwd = tmp_path / "reader"
  (cwd / "tmp").mkdir(parents=True)
  for name in LINKED:
    os.symlink(os.path.join(REPO, name), cwd / name)
  env = dict(_reader_env(data_dir), PYTHONPATH=str(cwd))
  assert shutil.which("tfm-ext-train", path=env["PATH"]), (
      "tfm-ext-train is not installed (pip install -e .)")
  forks = None
  if page not in REAL_PROCESSES:
    forks = request.getfixturevalue("fork_server")
    env["PATH"] = forks.bin + os.pathsep + env["PATH"]
  not_run = []
  ran = None  # The last block run: (where, its result).
  for number, (language, body, reason, output) in enumerate(
      blocks(os.path.join(REPO, page)), 1):
    where = f"{page}, code block {number} ({language or 'no language'})"
    assert language in LANGUAGES, f"{where}: name one of {LANGUAGES}"
    if reason is not None:
      assert reason.strip(), f"{where}: 'not run' needs its reason"
      not_run.append(f"{where}: {reason}")
      ran = None
      continue
    if output:
      assert language == "text" and ran, (
          f"{where}: an output block is a text block after a block run")
      ran_where, result = ran
      printed = [text.replace(f"{cwd}/tmp/", "/tmp/")
                 for text in (result.stdout, result.stderr)]
      missing = unshown_lines(body, *printed)
      assert not missing, (
          f"{where} shows what {ran_where} did not print:\n"
          + "\n".join(missing) + f"\n--- stdout\n{printed[0][-3000:]}"
          f"\n--- stderr\n{printed[1][-3000:]}")
      continue
    if language == "text":
      continue
    path = PATH_LINE.fullmatch(body.splitlines()[0]) if body else None
    if path and language in ("python", "yaml"):
      target = cwd / path.group(1)
      assert not os.path.isabs(path.group(1)) and ".." not in path.group(1)
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_text(body.replace("/tmp/", f"{cwd}/tmp/"))
      continue
    if language == "yaml":
      yaml.safe_load(body)
      continue
    body = body.replace("/tmp/", f"{cwd}/tmp/")
    if language == "python":
      result = _run([sys.executable, "-"], cwd, env, stdin=body)
    else:
      result = _run(["bash", "-euo", "pipefail", "-c", body], cwd, env)
    if forks:  # What the block left running ended with it.
      forks.wait_idle()
    assert result.returncode == 0, (
        f"{where} exited {result.returncode}:\n{body}\n--- stdout\n"
        f"{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}")
    ran = (where, result)
  print("\n".join(not_run))


def test_an_output_block_matches_lines_printed_in_order_with_elisions():
  printed = "step 1/20 | accuracy 0.1 | first step after 3.2s\nnoise\n" \
            "done | train | step 20 | 9.1s\n"
  error = "error: /tmp/job is in use (pid 12, host h)\n"
  assert not unshown_lines(
      "step 1/20 | accuracy ... | first step after …s\n"
      "error: /tmp/job is in use (pid <pid>, host <host>)\n"
      "done | train | step 20 | ...", printed, error)
  # Out of order within a stream, a value that differs, a line not printed.
  assert unshown_lines("done | train | step 20 | ...\nstep 1/20 | ...",
                       printed, error) == ["step 1/20 | ..."]
  assert unshown_lines("done | train | step 30 | ...", printed, error)
  assert unshown_lines("error: ... (pid <pid>, host )", printed, error)


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
