"""Runs launcher commands as children forked from one process that imported it.

    python tests/forked_launcher.py SCRIPT MODULE...

imports each MODULE (what SCRIPT imports: TensorFlow, TFM, the launcher,
the registrations), prints one `forked_launcher: {...}` line, then reads one
JSON request a line on stdin, `{"argv": [...], "env": {...}, "stdout":
path, "stderr": path, "timeout": seconds}`. For each it forks a child that
runs SCRIPT as `python SCRIPT ARGV...` would, its stdout and stderr going to
those files, waits for it, and answers `forked_launcher: {"returncode":
N}` (negative: killed by that signal, as `subprocess` says). Each command
is its own process, with its own exit status, output and files; only the
import, about 5 s of CPU a launch, is done once (`launch_forked` in
conftest.py). For commands that end before training starts: the child
inherits the imports, not a fresh interpreter's start-up.
"""

import atexit
import importlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

PREFIX = "forked_launcher: "


def _answer(record):
  sys.__stdout__.write(PREFIX + json.dumps(record) + "\n")
  sys.__stdout__.flush()


def _child(script, request):
  """Runs `script` as `__main__` with the request's argv; never returns."""
  for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)
  os.environ.update(request.get("env") or {})
  sys.argv = [script, *request["argv"]]
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


def _wait(pid, timeout):
  deadline = time.monotonic() + timeout
  while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      return os.waitstatus_to_exitcode(status)
    if time.monotonic() > deadline:
      os.kill(pid, signal.SIGKILL)
      return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    time.sleep(0.01)


def main(script, modules):
  # As `python SCRIPT` sets them while SCRIPT imports (the launcher names
  # its key flags after sys.argv[0]): the script's folder first on the path.
  sys.argv = [script]
  sys.path[0] = os.path.dirname(os.path.abspath(script))
  for module in modules:
    importlib.import_module(module)
  _answer({"ready": os.getpid()})
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _child(script, request)
    _answer({"returncode": _wait(pid, request.get("timeout", 300))})


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
