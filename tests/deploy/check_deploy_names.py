#!/usr/bin/python3
"""check_deploy_names.py TPORTD TPORT: every TPORT_* variable that deploy/'s
manifests set is one the programs read.

A misspelt or retired variable in a ConfigMap, a compose file or a unit is
silently ignored by tportd (an unknown variable is not an error: the
environment holds many), so a deployment would run on a default it meant to
change.  The names tportd reads are those its --help prints ([TPORT_X]);
the client's, those tport --help prints ($TPORT_X).  Not checked: the
build's CMake options (-DTPORT_X, or a name CMakeLists.txt declares with
option() or as a cache variable) and compose's own interpolation variables
(${TPORT_X}), which compose.yaml lists in its "Variables:" line.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FILES = ["deploy/compose.yaml", "deploy/Containerfile"]
FOLDERS = ["deploy/k8s", "deploy/systemd"]


def names_in_help(program, pattern):
    out = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(pattern, out.stdout + out.stderr))


def main():
    tportd, tport = sys.argv[1:3]
    server = names_in_help(tportd, r"\[(TPORT_[A-Z0-9_]+)\]")
    client = names_in_help(tport, r"\$(TPORT_[A-Z0-9_]+)")
    if len(server) < 20 or len(client) < 5:
        print("check_deploy_names: --help lists %d server and %d client variables: "
              "did the help text change?" % (len(server), len(client)))
        return 1
    paths = [os.path.join(ROOT, f) for f in FILES]
    for d in FOLDERS:
        for f in sorted(os.listdir(os.path.join(ROOT, d))):
            paths.append(os.path.join(ROOT, d, f))
    cmake = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    options = set(re.findall(r"option\((TPORT_[A-Z0-9_]+)", cmake))
    options |= set(re.findall(r"set\((TPORT_[A-Z0-9_]+)[^)]*CACHE", cmake))
    bad = []
    checked = 0
    for p in paths:
        text = open(p).read()
        compose_vars = set()
        m = re.search(r"^# Variables: (.*)$", text, re.M)
        if m:
            compose_vars = set(re.findall(r"TPORT_[A-Z0-9_]+", m.group(1)))
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in re.finditer(r"(-D|\$\{)?(TPORT_[A-Z0-9_]+)", line):
                prefix, name = m.group(1), m.group(2)
                if prefix == "-D" or name in options:
                    continue
                if prefix == "${" and name in compose_vars:
                    continue
                if line.lstrip().startswith("# Variables:"):
                    continue
                checked += 1
                if name not in server and name not in client:
                    bad.append("%s:%d: %s is read by neither tportd nor tport"
                               % (os.path.relpath(p, ROOT), lineno, name))
    for b in bad:
        print("check_deploy_names: " + b)
    print("check_deploy_names: %s (%d uses in %d files; %d server and %d client variables)"
          % ("FAILED" if bad else "ok", checked, len(paths), len(server), len(client)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
