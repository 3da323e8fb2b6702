#!/usr/bin/python3
"""Runs the pytest suite for ctest: exit 77 (ctest's SKIP_RETURN_CODE) with a line
naming the Debian package when one the run needs is missing, else pytest's status.

usage: run_ctest.py [--need MODULE=DEBIAN_PACKAGE ...] [pytest arguments]
(TPORTD and TPORT_LIBRARY name the build's tportd and libtport; ctest sets them)
"""
import importlib.util
import os
import sys

args = sys.argv[1:]
need = [("pytest", "python3-pytest"), ("numpy", "python3-numpy")]
while len(args) >= 2 and args[0] == "--need":
    need.append(tuple(args[1].split("=", 1)))
    args = args[2:]
for module, package in need:
    if importlib.util.find_spec(module) is None:
        print("SKIP: %s is not installed (deploy/install-deps.sh installs it)" % package)
        sys.exit(77)

import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-p", "no:cacheprovider", "--rootdir", os.path.dirname(here), here] + args))
