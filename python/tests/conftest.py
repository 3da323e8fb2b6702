"""Fixtures: a tportd started for the session on an ipc:// socket in a temp dir.

The binaries come from $TPORTD and $TPORT_LIBRARY (ctest sets both from the
build tree), else from the checkout's build folder that tensorport loads
libtport from.  The package itself is imported from python/ of this checkout
unless TPORT_TEST_INSTALLED=1 (then from wherever it is installed).
"""
import os
import secrets
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
if os.environ.get("TPORT_TEST_INSTALLED") != "1":
    sys.path.insert(0, PYTHON_DIR)

import tensorport  # noqa: E402


def tportd_path():
    """tportd: $TPORTD, else bin/tportd beside the lib/ libtport was loaded from."""
    p = os.environ.get("TPORTD")
    if p:
        return p
    lib = tensorport.library_path()
    cand = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lib))), "bin", "tportd")
    if os.path.exists(cand):
        return cand
    pytest.exit("no tportd: set TPORTD (ctest does), or build the checkout (make)", 2)


class Server:
    """A tportd child process on an ipc:// socket; .url, .stop()."""

    def __init__(self, *args, devices="cpu,sim:2"):
        self.dir = tempfile.mkdtemp(prefix="tport-py-")
        self.url = "ipc://" + os.path.join(self.dir, "s.sock")
        self.log = open(os.path.join(self.dir, "tportd.log"), "w+")
        self.proc = subprocess.Popen(
            [tportd_path(), "--listen", self.url, "--devices", devices, "--http-listen", "off",
             "--shm-socket", os.path.join(self.dir, "shm.sock"), "--admin", "ops",
             "--log-level", "1", *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("tportd exited with %s: %s" % (self.proc.returncode,
                                                                 self.log.read()))
            if os.path.exists(os.path.join(self.dir, "s.sock")):
                try:
                    tensorport.Client(self.url, timeout=5, tenant="probe").close()
                    break
                except tensorport.Unauthenticated:
                    break  # it answers
                except tensorport.Error:
                    pass
            if time.time() > deadline:
                raise RuntimeError("tportd did not come up at %s" % self.url)
            time.sleep(0.05)

    def stop(self):
        """SIGTERM, then SIGKILL if it does not go."""
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def server():
    """The session's tportd: cpu and two simulated GPUs (sim:0, sim:1)."""
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def strict_server():
    """A tportd that authenticates (tenant 'alice', secret in .secret_file) and allows
    tensors of at most 1 MiB."""
    d = tempfile.mkdtemp(prefix="tport-py-auth-")
    secret = secrets.token_hex(32)
    auth = os.path.join(d, "tportd.auth")
    key = os.path.join(d, "alice.key")
    for path, text in ((auth, "alice %s\n" % secret), (key, secret + "\n")):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    s = Server("--auth-file", auth, "--max-tensor", str(1 << 20), devices="cpu")
    s.secret_file = key
    s.secret = secret
    yield s
    s.stop()


@pytest.fixture
def client(server):
    """A fresh Client of the session's server, closed after the test."""
    with tensorport.Client(server.url) as c:
        yield c


def torch_or_skip():
    """torch, or a skip naming the Debian package (the CI installs it)."""
    return pytest.importorskip("torch", reason="python3-torch is not installed "
                               "(deploy/install-deps.sh installs it)")
