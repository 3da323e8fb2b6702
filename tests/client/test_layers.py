#!/usr/bin/env python3
"""No circle among libtport's files.

client/client_internal.h lists libtport's files in layers: a file calls
only what the layers below its own declare, so that no file calls back up
into one that calls it (path.c chooses how a put or a get travels; the
socket, region, IPC and staging files are leaves under it).  This test
reads who defines and who uses each global symbol in the object files
(nm), draws the calls between the files of one folder, and fails on a
circle, printing it and the symbols that close it.

usage: test_layers.py FOLDER 'obj1;obj2;...'   (CMake's $<TARGET_OBJECTS>)
"""
import collections
import subprocess
import sys


def symbols(obj):
    """The global symbols obj defines and those it uses."""
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[1] in "TDBR":
            defined.add(f[2])
        elif len(f) == 2 and f[0] == "U":
            used.add(f[1])
    return defined, used


def calls(objs):
    """file -> {file it calls: the symbols}, between the given objects."""
    where, uses = {}, {}
    for o in objs:
        defined, used = symbols(o)
        for s in defined:
            where[s] = o
        uses[o] = used
    edges = collections.defaultdict(lambda: collections.defaultdict(list))
    for o, used in uses.items():
        for s in sorted(used):
            if s in where and where[s] != o:
                edges[o][where[s]].append(s)
    return edges


def circle(edges, nodes):
    """One circle of calls (a list of files, the first repeated last), or None."""
    state = {}

    def visit(u, path):
        state[u] = "open"
        path.append(u)
        for v in sorted(edges.get(u, {})):
            if state.get(v) == "open":
                return path[path.index(v):] + [v]
            if v not in state:
                found = visit(v, path)
                if found:
                    return found
        path.pop()
        state[u] = "done"
        return None

    for n in sorted(nodes):
        if n not in state:
            found = visit(n, [])
            if found:
                return found
    return None


def name(obj):
    base = obj.rsplit("/", 1)[-1]
    return base[:-2] if base.endswith(".o") else base


def main():
    folder, objs = sys.argv[1], [o for o in sys.argv[2].split(";") if o]
    # CMake puts a target's objects under <target>.dir/<folder of the source>/
    mine = [o for o in objs if ".dir/%s/" % folder in o]
    if len(mine) < 2:
        sys.exit("no object files of %s/ among %d given" % (folder, len(objs)))
    edges = calls(mine)
    for u in sorted(edges, key=name):
        for v in sorted(edges[u], key=name):
            print("%s -> %s: %s" % (name(u), name(v), " ".join(edges[u][v])))
    found = circle(edges, mine)
    if found:
        print("FAIL: a circle in %s/:" % folder)
        for u, v in zip(found, found[1:]):
            print("  %s -> %s (%s)" % (name(u), name(v), " ".join(edges[u][v])))
        sys.exit(1)
    print("%d files of %s/, no circle" % (len(mine), folder))


if __name__ == "__main__":
    main()
