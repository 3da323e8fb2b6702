"""The tensorport package's PEP 517 build backend: setuptools', run on a copy.

`pip install ./python` builds in the source tree, and setuptools writes
build/ and tensorport.egg-info/ there: a checkout would be left with files
it does not track, and a read-only one (a container's bind mount, a shared
NFS tree) could not be installed from at all.  Every hook here copies the
package's sources into a temporary folder and runs setuptools' hook there;
only the wheel or sdist comes back, where pip asked for it.

It also records, in tensorport/_install.py of the copy, the libtport this
package was built beside, so that the installed package finds it without
TPORT_LIBRARY: $TPORT_LIBRARY at build time when set, else the checkout's
build tree (../build*/lib/libtport.so, the one the package would load from
the checkout).  TPORT_LIBRARY at run time still comes first.

(An editable install is setuptools' own, in place: it must point at the
sources.)
"""
import glob
import os
import shutil
import tempfile
from contextlib import contextmanager

from setuptools import build_meta as _setuptools

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)  # python/
_IGNORED = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests",
                                  ".pytest_cache")


def _built_library():
    """The libtport to record: an absolute, resolved path, or None."""
    env = os.environ.get("TPORT_LIBRARY")
    if env:
        return os.path.realpath(env) if os.path.exists(env) else None
    root = os.path.dirname(SOURCE)
    dirs = sorted(glob.glob(os.path.join(root, "build*", "lib")),
                  key=lambda d: (os.path.basename(os.path.dirname(d)) != "build", d))
    for d in dirs:
        for name in ("libtport.so", "libtport.so.0"):
            p = os.path.join(d, name)
            if os.path.exists(p):
                return os.path.realpath(p)
    return None


@contextmanager
def _in_a_copy():
    with tempfile.TemporaryDirectory(prefix="tensorport-build-") as tmp:
        copy = os.path.join(tmp, "python")
        shutil.copytree(SOURCE, copy, ignore=_IGNORED)
        lib = _built_library()
        with open(os.path.join(copy, "tensorport", "_install.py"), "w") as f:
            f.write('"""Written when this package was built (python/_build): the libtport\n'
                    'it was built beside, tried after $TPORT_LIBRARY."""\n')
            f.write("LIBRARY = %r\n" % lib)
        cwd = os.getcwd()
        os.chdir(copy)
        try:
            yield
        finally:
            os.chdir(cwd)


def _out(directory):
    return os.path.abspath(directory)


def get_requires_for_build_wheel(config_settings=None):
    with _in_a_copy():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _in_a_copy():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    out = _out(metadata_directory)
    with _in_a_copy():
        return _setuptools.prepare_metadata_for_build_wheel(out, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    out = _out(wheel_directory)
    meta = _out(metadata_directory) if metadata_directory else None
    with _in_a_copy():
        return _setuptools.build_wheel(out, config_settings, meta)


def build_sdist(sdist_directory, config_settings=None):
    out = _out(sdist_directory)
    with _in_a_copy():
        return _setuptools.build_sdist(out, config_settings)


# editable installs: setuptools' own hooks, in place
get_requires_for_build_editable = getattr(_setuptools, "get_requires_for_build_editable", None)
prepare_metadata_for_build_editable = getattr(_setuptools, "prepare_metadata_for_build_editable",
                                              None)
build_editable = getattr(_setuptools, "build_editable", None)
for _name in ("get_requires_for_build_editable", "prepare_metadata_for_build_editable",
              "build_editable"):
    if globals()[_name] is None:
        del globals()[_name]
