"""Runs launcher commands as children forked from one process that imported
what the launcher imports, all but this repository's code.

    python tests/forked_launcher.py

reads one line on stdin, a JSON list of modules (the third-party modules
the launcher imports: TensorFlow, TFM, Orbit, absl...; conftest.py lists
them once a session), imports them, prints one `forked_launcher: {...}`
line, then answers one JSON request a line with one such line:

    {"op": "fork", "script": path, "argv": [...], "env": {...},
     "stdout": path, "stderr": path, "cwd": path or absent} -> {"pid": N}
    {"op": "wait", "pid": N, "timeout": seconds or null}
                                          -> {"returncode": N}
    {"op": "poll", "pid": N}              -> {"returncode": N or null}

A forked child runs SCRIPT as `python SCRIPT ARGV...` would, with stdout
and stderr going to those paths (a file, or a FIFO its reader opened):
its environment is this process's updated with `env` (`tempfile` reads
`TMPDIR` again, as a fresh interpreter would), it works in `cwd` if given,
SCRIPT's folder is first on its path, and SCRIPT imports this repository's
modules itself (tfm_ext, the registrations: a tenth of a second), so what
they read at import (sys.argv[0], `TFM_EXT_*` timings) is the child's. Its
return code reads as `subprocess` gives it (negative: the signal that ended
it; `wait` kills it with SIGKILL after `timeout`). Each command is its own
process, with its own exit status, output, signals and files; only the
third-party import, about 4 s of CPU a launch, is done once, for any script
(`launch_forked`, `start_forked` and `forked_in` in conftest.py).
TensorFlow's runtime starts in the child: this process only imports.
tests/fork_socket.py forks its children with `import_all` and `run_script`
too, for commands typed in a shell.
"""

import atexit
import importlib
import json
import os
import runpy
import signal
import sys
import tempfile
import time

PREFIX = "forked_launcher: "


def _answer(record):
  sys.__stdout__.write(PREFIX + json.dumps(record) + "\n")
  sys.__stdout__.flush()


def import_all(modules):
  """Imports `modules`, the launcher's third-party imports, once for every
  child to come."""
  for module in modules:
    try:
      importlib.import_module(module)
    except ImportError:  # A name another module put in sys.modules.
      pass


def run_script(script, argv, environ, cwd=None, path=None):
  """Runs SCRIPT as `python SCRIPT ARGV...` would, in this forked child;
  never returns.

  `environ` is all of the child's environment; `path` what follows SCRIPT's
  folder on `sys.path` (this process's, if None). The exit status is the
  interpreter's: SystemExit's code, 1 for an uncaught exception.
  """
  os.environ.clear()
  os.environ.update(environ)
  tempfile.tempdir = None  # The import's, cached: the child's TMPDIR wins.
  if cwd:
    os.chdir(cwd)
  sys.argv = [script, *argv]
  script = os.path.abspath(script)  # `__file__`, as python SCRIPT gives it.
  sys.path[:] = [os.path.dirname(script),
                 *(sys.path[1:] if path is None else path)]
  importlib.invalidate_caches()  # Modules written since this process began.
  code = 0
  try:
    runpy.run_path(script, run_name="__main__")
  except SystemExit as e:  # What the interpreter makes of it at exit.
    if e.code is None or isinstance(e.code, int):
      code = e.code or 0
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException as e:  # pylint: disable=broad-except
    frames = e.__traceback__  # From SCRIPT's, as the interpreter shows them.
    while frames and frames.tb_frame.f_code.co_filename != script:
      frames = frames.tb_next
    sys.excepthook(type(e), e.with_traceback(frames), frames)
    code = 1
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def _child(request):
  """Runs the request's script with its outputs in files; never returns."""
  for fd, path in ((0, os.devnull), (1, request["stdout"]),
                   (2, request["stderr"])):
    target = (os.open(path, os.O_RDONLY) if fd == 0 else
              os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    os.dup2(target, fd)
    os.close(target)
  run_script(request["script"], request["argv"],
             {**os.environ, **(request.get("env") or {})}, request.get("cwd"))


class _Children:
  """The forked children, reaped only when asked: a pid stays theirs."""

  def __init__(self):
    self.returncodes = {}

  def forked(self, pid):
    """A new child: a reaped one's return code under a reused pid is gone
    (a long session forks tens of thousands of processes)."""
    self.returncodes.pop(pid, None)

  def poll(self, pid):
    if pid not in self.returncodes:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        self.returncodes[pid] = os.waitstatus_to_exitcode(status)
    return self.returncodes.get(pid)

  def wait(self, pid, timeout):
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll(pid) is None:
      if deadline is not None and time.monotonic() > deadline:
        os.kill(pid, signal.SIGKILL)
        deadline = None
      time.sleep(0.01)
    return self.returncodes[pid]


def main():
  import_all(json.loads(sys.stdin.readline()))
  children = _Children()
  _answer({"ready": os.getpid()})
  for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "fork":
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        _child(request)
      children.forked(pid)
      _answer({"pid": pid})
    elif request["op"] == "wait":
      _answer({"returncode": children.wait(request["pid"],
                                           request.get("timeout"))})
    else:
      _answer({"returncode": children.poll(request["pid"])})


if __name__ == "__main__":
  main()
