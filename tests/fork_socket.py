"""Runs `tfm-ext-train ...` and `python SCRIPT.py ...`, typed in a shell,
as children forked from one process that imported what the launcher imports.

tests/forked_launcher.py does this for the tests' own launches; this is the
same for a shell's commands (the docs test's pages), through a unix socket:

    python tests/fork_socket.py SOCKET MODULES_JSON

imports the modules MODULES_JSON lists (conftest.py's `_launcher_imports`),
listens on SOCKET (SOCK_SEQPACKET) and prints `fork_socket: ready`. Each
connection sends one message: a JSON request {"script", "argv", "env",
"cwd", "ignored"} with the caller's stdin, stdout and stderr attached
(SCM_RIGHTS). The server forks a child that takes those as its 0, 1 and 2,
all of `env` as its environment, `cwd`, the caller's ignored signals, and
runs SCRIPT as `python SCRIPT ARGV...` would (`forked_launcher.run_script`,
`PYTHONPATH` read from `env`); it answers {"pid": N}, then {"returncode": N}
when the child ends (negative: the signal that ended it). A connection
that closes first (its client was killed) gets its child killed with
SIGKILL. On stdin, a line `idle` is answered `fork_socket: idle` once no
child runs; the end of stdin kills what still runs, removes SOCKET and
ends the server. One thread: children are reaped by polling `waitpid`.

The clients are the `tfm-ext-train` and `python` that `write_shims` puts in
a folder for PATH (`client`): cheap (no TensorFlow import), they pass on
SIGTERM, SIGINT and SIGHUP, and exit as their child did, so `$!`,
`kill`, `wait` and `$?` in a shell see them as that process.
"""

import json
import os
import select
import signal
import socket
import sys

PREFIX = "fork_socket: "
# The signals a shell may leave ignored for a command (SIGINT and SIGQUIT
# of a background job): the child takes the caller's choice, else a fresh
# interpreter's default.
FRESH = {signal.SIGINT: signal.default_int_handler,
         signal.SIGQUIT: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL,
         signal.SIGHUP: signal.SIG_DFL}
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_REQUEST_BYTES = 1 << 20  # A request is its environment, a few kB.
# Seconds for a client to connect and have its child's pid; for the server
# to have a request (sent at once) or send a reply.
_CLIENT_TIMEOUT = 60
_SERVER_TIMEOUT = 10


def write_shims(directory, socket_path):
  """Writes `tfm-ext-train` and `python` to `directory`: clients of the
  server on `socket_path`, run by this interpreter."""
  import sysconfig  # pylint: disable=g-import-not-at-top
  console_script = os.path.join(sysconfig.get_path("scripts"),
                                "tfm-ext-train")
  assert os.path.isfile(console_script), (
      f"{console_script}: tfm-ext-train is not installed (pip install -e .)")
  here = os.path.dirname(os.path.abspath(__file__))
  for name, script in (("tfm-ext-train", console_script), ("python", None)):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
      # -I -S: no site and no environment to read, a quick start.
      f.write(f"#!{sys.executable} -IS\n"
              f"import sys\nsys.path.insert(0, {here!r})\n"
              "import fork_socket\n"
              f"fork_socket.client({socket_path!r}, {script!r}, "
              f"{sys.executable!r})\n")
    os.chmod(path, 0o755)


def client(socket_path, script, python):
  """Runs `script` with this process's arguments in a forked child, as
  this process; never returns.

  With `script` None (the `python` shim) the first argument is the script
  if it names a `.py` file; anything else (`-c`, `-m`, `-`, nothing) is
  run by the real interpreter `python`, which replaces this process.
  """
  argv = sys.argv[1:]
  if script is None:
    if not (argv and argv[0].endswith(".py") and os.path.isfile(argv[0])):
      os.execv(python, [python, *argv])
    script, argv = argv[0], argv[1:]
  child, pending = [], []

  def forward(sig, unused_frame):
    if not child:
      pending.append(sig)
      return
    try:
      os.kill(child[0], sig)
    except ProcessLookupError:  # Ended: its status is on its way.
      pass

  ignored = [s for s in FRESH if signal.getsignal(s) == signal.SIG_IGN]
  for sig in FORWARDED:
    if sig not in ignored:
      signal.signal(sig, forward)
  request = dict(script=script, argv=argv, env=dict(os.environ),
                 cwd=os.getcwd(), ignored=ignored)
  server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  server.settimeout(_CLIENT_TIMEOUT)
  try:
    server.connect(socket_path)
    socket.send_fds(server, [json.dumps(request).encode()], [0, 1, 2])
    child.append(json.loads(server.recv(4096))["pid"])
    for sig in pending:
      forward(sig, None)
    # As long as the child runs: killing this process ends it.
    server.settimeout(None)
    returncode = json.loads(server.recv(4096))["returncode"]
  except (OSError, ValueError, KeyError) as e:
    print(f"{sys.argv[0]}: the fork server {socket_path} failed: {e!r}",
          file=sys.stderr)
    os._exit(1)  # pylint: disable=protected-access
  if returncode < 0:  # Ended by a signal: so is this process, for its shell.
    if -returncode in FORWARDED:
      signal.signal(-returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -returncode)
    returncode = 128 - returncode
  os._exit(returncode)  # pylint: disable=protected-access


class _Server:
  """The listening socket and the children forked for its connections."""

  def __init__(self, socket_path):
    self.path = socket_path
    self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.listener.bind(socket_path)
    self.listener.listen(64)
    self.children = {}  # pid -> its client's connection, None once gone.

  def fork(self):
    """Accepts a connection and forks its child."""
    conn, _ = self.listener.accept()
    conn.settimeout(_SERVER_TIMEOUT)
    fds = []
    try:
      message, fds, flags, _ = socket.recv_fds(conn, _REQUEST_BYTES, 3)
      if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 3:
        raise ValueError(f"a truncated request: {flags}, {len(fds)} fds")
      request = json.loads(message)
    except (OSError, ValueError) as e:
      print(f"{PREFIX}refused a connection: {e!r}", file=sys.stderr)
      conn.close()
      for fd in fds:
        os.close(fd)
      return
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      self._child(request, fds, conn)
    for fd in fds:  # The child's only: a reader sees the end of its output.
      os.close(fd)
    self.children[pid] = conn
    try:
      conn.send(json.dumps({"pid": pid}).encode())
    except OSError:
      self.client_left(conn)

  def _child(self, request, fds, conn):
    """Becomes the caller's command; never returns."""
    try:
      for sock in (self.listener, conn, *self.children.values()):
        if sock is not None:
          sock.close()
      for target, fd in enumerate(fds):
        os.dup2(fd, target)
      for fd in fds:
        os.close(fd)
      for sig, handler in FRESH.items():
        signal.signal(sig, signal.SIG_IGN if sig in request["ignored"]
                      else handler)
      env, cwd = request["env"], request["cwd"]
      # As the interpreter builds it: PYTHONPATH's entries made absolute
      # (an empty one is the working directory), then this process's own
      # (started without PYTHONPATH), each once.
      pythonpath = [os.path.join(cwd, entry) if entry else cwd
                    for entry in env.get("PYTHONPATH", "").split(os.pathsep)
                    ] if env.get("PYTHONPATH") else []
      path = list(dict.fromkeys([*map(os.path.normpath, pythonpath),
                                 *sys.path[1:]]))
    except BaseException:  # pylint: disable=broad-except
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      os._exit(1)  # pylint: disable=protected-access
    import forked_launcher  # pylint: disable=g-import-not-at-top
    forked_launcher.run_script(request["script"], request["argv"], env, cwd,
                               path)

  def client_left(self, conn):
    """A client killed before its child ended: so is its child."""
    for pid, each in self.children.items():
      if each is conn:
        self.children[pid] = None
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
    conn.close()

  def reap(self):
    """Tells each ended child's client its return code."""
    for pid, conn in list(self.children.items()):
      done, status = os.waitpid(pid, os.WNOHANG)
      if not done:
        continue
      del self.children[pid]
      if conn is not None:
        try:
          conn.send(json.dumps(
              {"returncode": os.waitstatus_to_exitcode(status)}).encode())
        except OSError:  # Gone meanwhile.
          pass
        conn.close()

  def serve(self):
    """Forks for connections until stdin ends."""
    idle_asked = False
    while True:
      clients = [c for c in self.children.values() if c is not None]
      ready, _, _ = select.select([0, self.listener, *clients], [], [],
                                  0.02 if self.children else 1.0)
      for each in ready:
        if each == 0:
          line = os.read(0, 4096)
          if not line:
            return
          idle_asked = idle_asked or b"idle" in line
        elif each is self.listener:
          self.fork()
        else:  # A client only ever closes its connection.
          self.client_left(each)
      self.reap()
      if idle_asked and not self.children:
        _say("idle")
        idle_asked = False

  def close(self, timeout=30):
    """Kills the children left and removes the socket."""
    for pid in self.children:
      os.kill(pid, signal.SIGKILL)
    for _ in range(int(timeout / 0.02)):
      if not self.children:
        break
      self.reap()
      select.select([], [], [], 0.02)
    self.listener.close()
    os.unlink(self.path)


def _say(line):
  sys.stdout.write(PREFIX + line + "\n")
  sys.stdout.flush()


def main(socket_path, modules_json):
  # The children's sys.path is PYTHONPATH's entries then this process's.
  assert not os.environ.get("PYTHONPATH"), "start fork_socket.py without it"
  import forked_launcher  # pylint: disable=g-import-not-at-top
  with open(modules_json) as f:
    forked_launcher.import_all(json.load(f))
  server = _Server(socket_path)
  try:
    _say("ready")
    server.serve()
  finally:
    server.close()


if __name__ == "__main__":
  main(*sys.argv[1:])
