"""Shared test helpers: run the launcher for real, in a process or in-process.

A process starts fresh (`launch`, `start`) or is forked from one that
imported the launcher once (`launch_forked`, `start_forked`, and
`forked_in` a GCS box or one of its hosts); `built_once` makes what
several tests share once a session; the long tests run first.
"""

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import pytest

# The session's GCS box (tests/gcs_box.py), for every test that takes it.
from gcs_box import gcs_box  # pylint: disable=unused-import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "launchers", "train.py")
DOWNSTREAM_TRAIN = os.path.join(REPO, "tests", "downstream", "train.py")
# The launcher with the test doubles (tests/doubles.py) registered, and the
# same on two logical CPU devices, where `mirrored` gets 2 replicas.
DOUBLES_TRAIN = os.path.join(REPO, "tests", "doubles_train.py")
TWO_CPUS_TRAIN = os.path.join(REPO, "tests", "doubles_train_two_cpus.py")

# A short digits_convnet run: 40 steps, evaluation every 20.
SMOKE = ("trainer.train_steps=40,trainer.steps_per_loop=10,"
         "trainer.summary_interval=10,trainer.checkpoint_interval=20,"
         "trainer.validation_interval=20")


def _starts_processes(item) -> bool:
  """Whether a test starts processes: a launch fixture or `subprocess`."""
  if {"launch", "start", "launch_forked", "start_forked", "run_forked",
      "forked_in"} & set(item.fixturenames):
    return True
  codes = [item.function.__code__] if hasattr(item, "function") else []
  while codes:  # The test's code and the functions defined in it.
    code = codes.pop()
    if "subprocess" in code.co_names:
      return True
    codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
  return False


NIGHTLY = os.environ.get("TFM_EXT_NIGHTLY") == "1"


def pytest_collection_modifyitems(items):
  """Runs the tests marked `slow` first, then those that start processes.

  Each group keeps the order collected. xdist gives a worker its next test
  as one ends (`--maxschedchunk=1`, setup.cfg), so the long tests start
  early and the last ones are short: no core idles at the end while one
  long test finishes. The tests marked `nightly` are skipped unless
  `TFM_EXT_NIGHTLY=1`: the suite must fit 15 minutes on 2 cores, and each
  of them repeats, at more cost, what a test that runs proves.
  """
  if not NIGHTLY:
    skip = pytest.mark.skip(reason="the nightly tier: TFM_EXT_NIGHTLY=1 "
                            "runs it (setup.cfg)")
    for item in items:
      if item.get_closest_marker("nightly") is not None:
        item.add_marker(skip)
  items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                               not _starts_processes(item)))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  """One cache of the bundled digits TFRecords for the whole session."""
  path = str(tmp_path_factory.mktemp("digits_cache"))
  os.environ["TFM_EXT_DATA_DIR"] = path
  return path


@pytest.fixture(scope="session", autouse=True)
def _autograph_cache(tmp_path_factory):
  """One AutoGraph cache (tfm_ext/training/autograph_cache.py) a session.

  Shared by every xdist worker and launch, as a user's machine shares its
  own: a launch converts only what no launch before it did. Not the
  user's cache, which a suite must not read or fill.
  """
  path = built_once(tmp_path_factory, "autograph_cache", lambda path: None)
  os.environ["TFM_EXT_AUTOGRAPH_CACHE"] = path
  return path


def tiny_manager(model_dir, max_to_keep, records_unwatched=False):
  """A trainer's manager of a tiny checkpoint, and `save(step)`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfm_ext.model_dir import checkpointing  # pylint: disable=g-import-not-at-top
  step = tf.Variable(0, dtype=tf.int64)
  trainer = types.SimpleNamespace(
      checkpoint=tf.train.Checkpoint(step=step, w=tf.Variable([1.0])),
      global_step=step)
  manager = checkpointing.build_manager(
      trainer, model_dir, types.SimpleNamespace(checkpoint_interval=1),
      evaluates_only=False, init_fn=None, max_to_keep=max_to_keep,
      before_save=lambda: None, records_unwatched=records_unwatched)

  def save(at):
    step.assign(at)
    assert manager.save(checkpoint_number=at) is not None
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{at}")

  return manager, save


def checkpoint_steps(model_dir):
  """The steps of the checkpoints in `model_dir`, and the same listed."""
  from tfm_ext.model_dir import checkpoint_state  # pylint: disable=g-import-not-at-top
  steps = [checkpoint_state.step_of(p)
           for p in checkpoint_state.checkpoint_files(model_dir)]
  listed = [checkpoint_state.step_of(p)
            for p in checkpoint_state.read_state(model_dir)[0]]
  assert listed == steps  # The state file lists what is kept, no more.
  return steps


def numeric_tensors(checkpoint_path):
  """Every numeric tensor of a checkpoint (the iterator's state is not)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(checkpoint_path)
  return {name: reader.get_tensor(name)
          for name, dtype in reader.get_variable_to_dtype_map().items()
          if dtype not in (tf.string, tf.variant)}


class Result:
  """A finished launcher process and its `model_dir`."""

  def __init__(self, proc: subprocess.CompletedProcess, model_dir: str):
    self.returncode = proc.returncode
    self.stdout = proc.stdout
    self.stderr = proc.stderr
    self.model_dir = model_dir

  def summary(self, name="run_summary.json"):
    """A record the run wrote: training's, or `eval_summary.json`."""
    with open(os.path.join(self.model_dir, name)) as f:
      return json.load(f)

  def __repr__(self):
    return (f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n"
            f"--- stderr\n{self.stderr[-6000:]}")


def _launcher_env(data_dir):
  """What a launcher's environment adds to the tests'."""
  # TF_USE_LEGACY_KERAS as a launcher sets it before importing TensorFlow
  # (tfm_ext/base/startup.py): the fork servers import TensorFlow first.
  return dict(TFM_EXT_DATA_DIR=data_dir, TF_CPP_MIN_LOG_LEVEL="2",
              PYTHONPATH=REPO, PYTHONUNBUFFERED="1", TF_USE_LEGACY_KERAS="1")


def _env(data_dir, env=None):
  return {**os.environ, **_launcher_env(data_dir), **(env or {})}


def _command(args, model_dir, script, data_dir, env):
  return ([sys.executable, script, f"--model_dir={model_dir}", *args],
          _env(data_dir, env))


@pytest.fixture
def launch(data_dir):
  """Runs a launcher script in a subprocess; returns a `Result`."""

  def run(*args, model_dir, script=TRAIN, timeout=300, env=None):
    cmd, full_env = _command(args, model_dir, script, data_dir, env)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)
    return Result(proc, str(model_dir))

  return run


FORKED_LAUNCHER = os.path.join(REPO, "tests", "forked_launcher.py")


class _ForkingLauncher:
  """A `tests/forked_launcher.py` process: it imported `modules` once.

  Here, or in `jobs` (a box or a host of tests/gcs_box.py): its children
  are then in the box's namespaces, with the environment it gives a job.
  """

  def __init__(self, modules, data_dir, out_dir, jobs=None):
    self.out_dir = out_dir
    self.runs = 0
    self.log = os.path.join(out_dir, "forked_launcher.stderr")
    argv = [sys.executable, FORKED_LAUNCHER]
    env = _env(data_dir)
    if jobs is not None:
      argv, env = (jobs.command(argv, cwd=REPO),
                   jobs.environ(_launcher_env(data_dir)))
    with open(self.log, "w") as log:
      self.proc = subprocess.Popen(
          argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
          text=True, env=env, cwd=REPO)
    self.request_line(modules)  # Imported: ready.

  def _answer(self):
    prefix = "forked_launcher: "
    for line in self.proc.stdout:
      if line.startswith(prefix):
        return json.loads(line[len(prefix):])
    with open(self.log) as f:
      raise AssertionError(f"forked_launcher.py exited {self.proc.wait()}: "
                           f"{f.read()[-3000:]}")

  def request_line(self, request):
    self.proc.stdin.write(json.dumps(request) + "\n")
    self.proc.stdin.flush()
    return self._answer()

  def request(self, **request):
    return self.request_line(request)

  def outputs(self):
    """Paths for the next child's stdout and stderr."""
    self.runs += 1
    return (os.path.join(self.out_dir, f"{self.runs}.stdout"),
            os.path.join(self.out_dir, f"{self.runs}.stderr"))

  def run(self, script, argv, env, timeout,
          cwd=None) -> subprocess.CompletedProcess:
    out, err = self.outputs()
    pid = self.request(op="fork", script=script, argv=argv, env=env or {},
                       stdout=out, stderr=err, cwd=cwd)["pid"]
    code = self.request(op="wait", pid=pid, timeout=timeout)["returncode"]
    with open(out) as o, open(err) as e:
      return subprocess.CompletedProcess(argv, code, o.read(), e.read())

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


class _ForkedProcess:
  """What the tests use of `subprocess.Popen`, for a forked launcher child.

  Its stdout is a FIFO, read as a pipe is, unless `stdout` names a file
  (then `stderr` does too); the launcher process reaps it only when
  asked, so its pid stays the child's until `poll` or `wait` sees it end.
  """

  def __init__(self, launcher, script, argv, env, stdout=None, stderr=None,
               cwd=None):
    self._launcher = launcher
    self.args = [script, *argv]
    self.returncode = None
    if stdout is None:
      out, self._stderr = launcher.outputs()
      os.mkfifo(out)
    else:  # Made here, as `Popen` takes them open: readable at once.
      out, self._stderr = str(stdout), str(stderr)
      for path in (out, self._stderr):
        open(path, "w").close()
    self.pid = launcher.request(op="fork", script=script, argv=argv,
                                env=env or {}, stdout=out,
                                stderr=self._stderr, cwd=cwd)["pid"]
    # Once the child has opened the FIFO too.
    self.stdout = open(out) if stdout is None else None

  def send_signal(self, sig):
    if self.returncode is None:
      os.kill(self.pid, sig)

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def poll(self):
    if self.returncode is None:
      self.returncode = self._launcher.request(
          op="poll", pid=self.pid)["returncode"]
    return self.returncode

  def wait(self, timeout=None):
    """The return code; the child is killed after `timeout` seconds."""
    if self.returncode is None:
      self.returncode = self._launcher.request(
          op="wait", pid=self.pid, timeout=timeout)["returncode"]
    return self.returncode

  def communicate(self, timeout=None):
    if self.stdout is None:  # Its output is in files.
      self.wait(timeout)
      return None, None
    out = []
    reader = threading.Thread(target=lambda: out.append(self.stdout.read()))
    reader.start()  # Reads while the child runs, as a pipe must be.
    self.wait(timeout)
    reader.join()
    self.stdout.close()
    with open(self._stderr) as f:
      return out[0], f.read()


def _launcher_imports(path):
  """Writes `modules.json`: what the launcher imports from outside REPO."""
  listed = subprocess.run(
      [sys.executable, "-c", "import json, os, sys, tfm_ext.run.launcher\n"
       "print(json.dumps([name for name, module in list(sys.modules.items())"
       " if not os.path.abspath(getattr(module, '__file__', None) or '/')"
       f".startswith({REPO + os.sep!r}) and name != '__main__']))"],
      capture_output=True, text=True, check=True, env=_env(""), cwd=path)
  with open(os.path.join(path, "modules.json"), "w") as f:
    f.write(listed.stdout)


@pytest.fixture(scope="session")
def _forking(data_dir, tmp_path_factory):
  """The `_ForkingLauncher` here (in `jobs`, if given), made once.

  Each imports what the launcher imports but this repository's code, listed
  once a session for every xdist worker; any launcher script forks from it.
  """
  launchers = {}

  def launcher(jobs=None):
    if id(jobs) not in launchers:
      listed = built_once(tmp_path_factory, "launcher_imports",
                          _launcher_imports)
      with open(os.path.join(listed, "modules.json")) as f:
        modules = json.load(f)
      launchers[id(jobs)] = _ForkingLauncher(
          modules, data_dir, str(tmp_path_factory.mktemp("forked")), jobs)
    return launchers[id(jobs)]

  yield launcher
  for each in launchers.values():
    each.close()


@pytest.fixture(scope="session")
def launch_forked(_forking):
  """`launch`, for a run that is not about the interpreter's start-up.

  Each command is a real process with its own exit status, stdout, stderr,
  signals and files, forked from one that imported the launcher's
  third-party modules once per session and xdist worker
  (tests/forked_launcher.py): about 4 s of CPU less a launch. The child
  imports this repository's code itself, with its own environment. A fresh
  interpreter's start-up (quiet imports, signals while TensorFlow loads, the
  collector, time to the first step) stays with `launch` and `start`.
  """

  def run(*args, model_dir, script=TRAIN, timeout=300, env=None):
    proc = _forking().run(script, [f"--model_dir={model_dir}", *args], env,
                          timeout)
    return Result(proc, str(model_dir))

  return run


@pytest.fixture(scope="session")
def run_forked(_forking):
  """Runs `python SCRIPT ARGV...`, forked as `launch_forked` is, to its end.

  For scripts that take no --model_dir (the exporters); the output is
  captured as text, as `subprocess.run` does.
  """

  def run(script, *argv, timeout=300, env=None,
          cwd=REPO) -> subprocess.CompletedProcess:
    return _forking().run(script, list(argv), env, timeout, cwd)

  return run


def built_once(tmp_path_factory, name, build) -> str:
  """A folder that `build(path)` fills once a session, for every xdist worker.

  For what several tests only read or copy (a trained `model_dir`, a
  virtual environment): the workers share their base temporary folder's
  parent, and the first to ask builds while the others wait on a lock.
  """
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  path, done = root / name, root / f"{name}.built"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(path, ignore_errors=True)
      path.mkdir()
      build(str(path))
      done.touch()
  return str(path)


class Running:
  """A launcher process in the background, its stdout read line by line."""

  def __init__(self, proc, model_dir):
    self.model_dir = str(model_dir)
    self.proc = proc
    self.lines = []

  def wait_for_line(self, predicate, timeout=120):
    """Reads stdout until a line satisfies `predicate`; returns that line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      line = self.proc.stdout.readline()
      if not line:
        raise AssertionError(f"process ended first: {self.finish()}")
      self.lines.append(line)
      if predicate(line):
        return line
    raise AssertionError(f"no such line within {timeout}s: {self.lines[-5:]}")

  def finish(self, timeout=180) -> Result:
    out, err = self.proc.communicate(timeout=timeout)
    stdout = "".join(self.lines) + (out or "")
    return Result(subprocess.CompletedProcess(self.proc.args,
                                              self.proc.returncode,
                                              stdout, err), self.model_dir)


def _stop(running):
  for r in running:
    if r.proc.poll() is None:
      r.proc.kill()
      r.proc.communicate()


@pytest.fixture
def start(data_dir):
  """Starts a launcher script in the background; returns a `Running`."""
  running = []

  def run(*args, model_dir, script=TRAIN, env=None):
    cmd, full_env = _command(args, model_dir, script, data_dir, env)
    running.append(Running(subprocess.Popen(
        cmd, env=full_env, cwd=REPO, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE), model_dir))
    return running[-1]

  yield run
  _stop(running)


@pytest.fixture
def start_forked(_forking):
  """`start`, forked as `launch_forked` is: for runs not about start-up."""
  running = []

  def run(*args, model_dir, script=TRAIN, env=None):
    running.append(Running(_ForkedProcess(
        _forking(), script, [f"--model_dir={model_dir}", *args], env),
                           model_dir))
    return running[-1]

  yield run
  _stop(running)


class _ForkedIn:
  """Launcher jobs in a box or a host (tests/gcs_box.py), forked as
  `launch_forked` is: for runs not about start-up. `argv` follows the
  script's path; the launcher process is the box's job (`--guard`ed once),
  and each child gets `env` on top of what the box gives a job."""

  def __init__(self, forking):
    self._forking = forking
    self._started = []

  def start(self, jobs, argv, *, stdout, stderr, env=None, cwd=None,
            script=TRAIN):
    """A `_ForkedProcess` whose stdout and stderr go to those files."""
    self._started.append(_ForkedProcess(
        self._forking(jobs), script, list(argv), env, stdout=stdout,
        stderr=stderr, cwd=cwd))
    return self._started[-1]

  def run(self, jobs, argv, *, env=None, cwd=None, timeout=300,
          script=TRAIN) -> subprocess.CompletedProcess:
    """Runs to its end; its output captured as text."""
    return self._forking(jobs).run(script, list(argv), env, timeout, cwd)

  def stop(self):
    for proc in self._started:
      proc.kill()
      proc.wait()


@pytest.fixture
def forked_in(_forking):
  """A `_ForkedIn`: its children still running at the test's end are killed."""
  jobs = _ForkedIn(_forking)
  yield jobs
  jobs.stop()


# This repository's experiments/ and registry_imports.py (not installed with
# the library), and the downstream example.
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "downstream"))


@pytest.fixture
def run_in_process(data_dir):
  """Runs the driver in this process; returns `(RunSummary, params)`.

  For tests that inspect live objects (a trainer's recorded hook calls).
  """
  import registry_imports  # pylint: disable=g-import-not-at-top,unused-import
  import downstream_registry  # pylint: disable=g-import-not-at-top,unused-import
  import doubles  # pylint: disable=g-import-not-at-top,unused-import
  from tfm_ext.run import driver  # pylint: disable=g-import-not-at-top
  from tfm_ext.config import params as params_lib  # pylint: disable=g-import-not-at-top

  def run(experiment, mode, model_dir, override="", trainer=""):
    params = params_lib.build(params_lib.ConfigSources(
        experiment=experiment, params_override=override, trainer=trainer))
    plan = driver.prepare(driver.RunRequest(
        experiment=experiment, mode=mode, model_dir=str(model_dir),
        params=params))
    return driver.execute(plan), params

  return run


def free_ports(n):
  """`n` ports of 127.0.0.1 that nothing listens on now."""
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def assert_clean_usage_error(run, *fragments):
  """A launcher run refused with exit 2: one `error:` line holding each of
  `fragments`, no traceback, and its model_dir not written."""
  assert run.returncode == 2, run
  assert "Traceback" not in run.stderr, run
  error = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
  assert len(error) == 1, run
  for fragment in fragments:
    assert fragment in error[0], run
  assert not os.path.exists(run.model_dir), "model_dir was written"


@pytest.fixture(scope="session")
def two_checkpoints(launch_forked, tmp_path_factory):
  """A finished training's model_dir: ckpt-10, ckpt-20, none evaluated.

  Built once a session; tests copy it.
  """
  def train(model_dir):
    run = launch_forked("--experiment=digits_convnet", "--mode=train",
                        "--params_override=trainer.train_steps=20,"
                        "trainer.steps_per_loop=10,"
                        "trainer.checkpoint_interval=10,trainer.max_to_keep=10,"
                        "trainer.validation_interval=1000",
                        model_dir=model_dir)
    assert run.returncode == 0, run

  return built_once(tmp_path_factory, "two_checkpoints", train)
