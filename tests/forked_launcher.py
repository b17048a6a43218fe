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
import traceback

PREFIX = "forked_launcher: "


def _answer(record):
  sys.__stdout__.write(PREFIX + json.dumps(record) + "\n")
  sys.__stdout__.flush()


def _child(request):
  """Runs the request's script as `__main__` with its argv; never returns."""
  for fd, path in ((0, os.devnull), (1, request["stdout"]),
                   (2, request["stderr"])):
    target = (os.open(path, os.O_RDONLY) if fd == 0 else
              os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    os.dup2(target, fd)
    os.close(target)
  os.environ.update(request.get("env") or {})
  tempfile.tempdir = None  # The import's, cached: the child's TMPDIR wins.
  if request.get("cwd"):
    os.chdir(request["cwd"])
  script = request["script"]
  sys.argv = [script, *request["argv"]]
  sys.path[0] = os.path.dirname(os.path.abspath(script))  # As python SCRIPT.
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
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


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
  for module in json.loads(sys.stdin.readline()):
    try:
      importlib.import_module(module)
    except ImportError:  # A name another module put in sys.modules.
      pass
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
