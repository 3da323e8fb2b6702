"""The install check: a fresh virtual environment made with --system-site-packages,
``pip install --no-build-isolation ./python`` in it (no package index, no compiler),
then the installed package imported from outside the checkout and a round trip.

It runs the README's command on a copy of python/ (so the build leaves nothing
in the checkout).  Skips only where a Debian package it needs is missing.
"""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR

pytestmark = pytest.mark.install

ROUND_TRIP = r"""
import os, sys, numpy as np, tensorport as tp
assert os.path.realpath(tp.__file__).startswith(os.path.realpath(sys.prefix)), tp.__file__
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


def test_pip_install_into_a_fresh_venv(tmp_path, server):
    _need("ensurepip", "python3-venv")
    _need("setuptools", "python3-setuptools")
    _need("wheel", "python3-wheel")
    src = tmp_path / "src"
    shutil.copytree(PYTHON_DIR, src / "python", ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__", "dist"))
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([py, "-m", "venv", "--system-site-packages", str(venv)], check=True,
                   env=env, timeout=120)
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "./python"],
                       cwd=src, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Successfully installed tensorport-0.1.0" in p.stdout
    from tensorport import library_path

    env["TPORT_LIBRARY"] = os.path.abspath(library_path())
    p = subprocess.run([str(venv / "bin" / "python"), "-c", ROUND_TRIP, server.url],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "round trip ok 0.1.0" in p.stdout
