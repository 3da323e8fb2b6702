"""The install check: a fresh virtual environment made with --system-site-packages,
``pip install --no-build-isolation ./python`` in it (no package index, no compiler),
then the installed package imported from outside the checkout and a round trip.

It runs the README's command on the checkout's own python/ and checks that
the build left nothing there (the build backend, python/_build, works on a
copy), and that the installed package finds the libtport it was built beside
without TPORT_LIBRARY.  Skips only where a Debian package it needs is missing.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR

pytestmark = pytest.mark.install

ROUND_TRIP = r"""
import os, sys, numpy as np, tensorport as tp
assert os.path.realpath(tp.__file__).startswith(os.path.realpath(sys.prefix)), tp.__file__
assert "TPORT_LIBRARY" not in os.environ
with tp.Client(sys.argv[1]) as c:
    a = np.arange(24, dtype=np.uint8).reshape(1, 2, 3, 4)
    t = c.put(a, device="sim:0", dtype="float16", memory_format="channels_last")
    u = t.to(device="sim:1", dtype="float32")
    assert u.strides == (24, 1, 8, 2) and np.array_equal(c.get(u), a.astype(np.float32))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        assert torch.equal(c.get_torch(u), torch.from_numpy(a).float())
print("round trip ok", tp.__version__, tp.library_path())
"""


def _need(module, package):
    if importlib.util.find_spec(module) is None:
        pytest.skip("%s is not installed (deploy/install-deps.sh installs it)" % package)


def _tree(root):
    """Every path under root but caches (tests running beside this one write those)."""
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("__pycache__", ".pytest_cache")]
        for f in files + dirs:
            out.add(os.path.relpath(os.path.join(d, f), root))
    return out


def test_pip_install_into_a_fresh_venv(tmp_path, server):
    _need("ensurepip", "python3-venv")
    _need("setuptools", "python3-setuptools")
    _need("wheel", "python3-wheel")
    from tensorport import library_path

    lib = os.path.realpath(library_path())
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", TPORT_LIBRARY=lib)
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([py, "-m", "venv", "--system-site-packages", str(venv)], check=True,
                   env=env, timeout=120)
    before = _tree(PYTHON_DIR)
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation",
                        PYTHON_DIR], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Successfully installed tensorport-0.1.0" in p.stdout
    assert _tree(PYTHON_DIR) == before, "the install wrote into the checkout: %s" % sorted(
        _tree(PYTHON_DIR) ^ before)

    del env["TPORT_LIBRARY"]  # found from what the install recorded
    p = subprocess.run([str(venv / "bin" / "python"), "-c", ROUND_TRIP, server.url],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "round trip ok 0.1.0 " + lib in p.stdout
