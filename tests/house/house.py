#!/usr/bin/python3
"""house.py BUILD_DIR [--draw] [--check]: the drawing of the house, from what
the linker sees.

Every object file of the product's targets (not the tests' or the
benchmarks') is read with `nm`: a file *uses* another when it refers to a
global symbol the other defines.  Calls through a table of functions (the
backends) or a pointer are not seen, which is the point: those are the
seams.  From that graph:

  --draw   prints the floors (each folder and the folders it uses) and, per
           folder, which of its files use which.
  --check  fails (exit 1) when
           - a folder uses one it may not (the layering of DESIGN.md:
             client never reaches the engine or the server, the engine never
             the transport, the server or the client, and so on);
           - files of server/ or client/ use each other in a circle (a
             strongly connected component of more than one file; the
             engine's circles are shown, not failed: its backends and their
             table are one concept spread over files);
           - a file outside engine/ includes one of the engine's private
             headers (every header under engine/ but the public ones listed
             below), the tests and benchmarks excepted;
           - a product source file is longer than FILE_LINES_MAX lines or a
             function in it longer than FUNCTION_LINES_MAX, unless LONG_OK
             names it with the reason.

Both when neither is given.
"""
import os
import re
import subprocess
import sys
from collections import defaultdict

# targets whose objects are the product; (target, folder of its CMakeFiles)
PRODUCT_TARGETS = ("tport_kernels", "tport_meta", "tport_proto", "tport_engine",
                   "tport_transport", "tport_server", "tportd", "tport", "tport-cli")

# which folders each folder may use (DESIGN.md's layout table); gen/ is the
# generated half of proto/
MAY_USE = {
    "proto": {"proto"},
    "kernels": {"kernels"},
    "engine": {"engine", "kernels", "proto"},
    "transport": {"transport", "proto"},
    "server": {"server", "engine", "kernels", "proto", "transport"},
    "client": {"client", "proto", "transport"},
}

# the engine's face: what code outside engine/ may include
ENGINE_PUBLIC_HEADERS = {"engine/include/engine.h", "engine/include/engine_stats.h",
                         "engine/include/readback.h"}
# folders whose files may not use each other in a circle
CIRCLE_FREE_FOLDERS = ("server", "client")
INCLUDE_CHECKED_FOLDERS = ("server", "client", "transport", "proto", "kernels", "python")


def source_of(obj, build):
    """build/.../CMakeFiles/<target>.dir/<path>.c.o -> (target, path)"""
    rel = os.path.relpath(obj, build)
    m = re.search(r"CMakeFiles/([^/]+)\.dir/(.+)\.o$", rel)
    if not m:
        return None, None
    target, path = m.group(1), m.group(2)
    sub = rel.split("CMakeFiles/")[0].rstrip("/")
    if sub and not path.startswith(sub + "/"):
        path = sub + "/" + path  # transport/CMakeFiles/tport_transport.dir/x.c.o
    return target, path


def folder_of(path):
    top = path.split("/")[0]
    return "proto" if top == "gen" else top


def read_objects(build):
    defines = {}                 # symbol -> path
    uses = defaultdict(set)      # path -> symbols it needs
    seen = set()
    for root, _dirs, files in os.walk(build):
        if "/tests" in root[len(build):] or "/_deps" in root:
            continue
        for f in files:
            if not f.endswith(".o"):
                continue
            obj = os.path.join(root, f)
            target, path = source_of(obj, build)
            if target not in PRODUCT_TARGETS or path is None:
                continue
            path = re.sub(r"\.(c|cu|cpp)$", r".\1", path)
            out = subprocess.run(["nm", "-g", "--defined-only", obj], capture_output=True,
                                 text=True, check=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 3:
                    defines.setdefault(parts[2], path)
            out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True,
                                 check=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if parts:
                    uses[path].add(parts[-1])
            seen.add(path)
    edges = defaultdict(set)
    for path, syms in uses.items():
        for s in syms:
            d = defines.get(s)
            if d and d != path:
                edges[path].add(d)
    return seen, edges


def circles(nodes, edges):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in nodes:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


# "no source file over ~600 lines, no function over ~100" (issue 22): a
# file a few lines over 600 is not worth a split, one at 630 is
FILE_LINES_MAX = 630
FUNCTION_LINES_MAX = 100
PRODUCT_FOLDERS = ("client", "server", "engine", "transport", "proto", "kernels")
# "path" or "path:function" -> why it may be long
LONG_OK = {}


def long_code(source_dir):
    """Files over FILE_LINES_MAX lines and functions over FUNCTION_LINES_MAX
    (a function: a line at column 0 naming it, its body from a "{" to a "}"
    at column 0, the house style)."""
    found = []
    head = re.compile(r"^[A-Za-z_].*?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
    for folder in PRODUCT_FOLDERS:
        for root, _d, files in os.walk(os.path.join(source_dir, folder)):
            for f in sorted(files):
                if not f.endswith((".c", ".cu", ".h", ".cuh")):
                    continue
                p = os.path.join(root, f)
                rel = os.path.relpath(p, source_dir)
                with open(p, errors="replace") as fh:
                    lines = fh.read().splitlines()
                if len(lines) > FILE_LINES_MAX and rel not in LONG_OK:
                    found.append(f"{rel} has {len(lines)} lines (at most {FILE_LINES_MAX})")
                name, start, body = None, 0, None
                for i, line in enumerate(lines, 1):
                    m = head.match(line)
                    if m and not line.startswith(("static const", "typedef", "#")):
                        name, start = m.group(1), i
                    if line.startswith("{") and name:
                        body = start
                    elif line.startswith("}") and body:
                        n = i - body
                        key = f"{rel}:{name}"
                        if n > FUNCTION_LINES_MAX and key not in LONG_OK:
                            found.append(f"{key} is {n} lines (at most {FUNCTION_LINES_MAX})")
                        name, body = None, None
    return found


def private_includes(source_dir):
    """(file, header) for every include of an engine-private header from
    outside engine/ (tests/ and bench/ may reach inside)."""
    bad = []
    engine_headers = set()
    for root, _d, files in os.walk(os.path.join(source_dir, "engine")):
        for f in files:
            if f.endswith(".h"):
                engine_headers.add(os.path.relpath(os.path.join(root, f), source_dir))
    private = engine_headers - ENGINE_PUBLIC_HEADERS
    by_name = defaultdict(set)
    for h in private:
        by_name[os.path.basename(h)].add(h)
    inc = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
    for folder in INCLUDE_CHECKED_FOLDERS:
        for root, _d, files in os.walk(os.path.join(source_dir, folder)):
            for f in files:
                if not f.endswith((".c", ".h", ".cu", ".cpp")):
                    continue
                p = os.path.join(root, f)
                with open(p, errors="replace") as fh:
                    for line in fh:
                        m = inc.match(line)
                        if not m:
                            continue
                        name = m.group(1)
                        hit = {h for h in private if h.endswith("/" + name) or h == name}
                        hit |= by_name.get(os.path.basename(name), set()) if "/" not in name else set()
                        # a file of the same name in the includer's folder wins
                        local = os.path.join(os.path.dirname(p), name)
                        if hit and not os.path.exists(local):
                            bad.append((os.path.relpath(p, source_dir), sorted(hit)[0]))
    return bad


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    build = os.path.abspath(argv[1])
    flags = set(argv[2:]) or {"--draw", "--check"}
    source_dir = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    files, edges = read_objects(build)
    if not files:
        print(f"house: no product objects under {build} (build it first)", file=sys.stderr)
        return 2

    folder_edges = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            folder_edges[folder_of(a)].add(folder_of(b))
    by_folder = defaultdict(set)
    for f in files:
        by_folder[folder_of(f)].add(f)

    if "--draw" in flags:
        print(f"house: {len(files)} files in {len(by_folder)} folders")
        for folder in sorted(by_folder):
            others = sorted(folder_edges[folder] - {folder})
            print(f"\n[{folder}] ({len(by_folder[folder])} files) uses: {', '.join(others) or '-'}")
            for f in sorted(by_folder[folder]):
                inner = sorted(t for t in edges.get(f, ()) if folder_of(t) == folder)
                outer = sorted({folder_of(t) for t in edges.get(f, ())} - {folder})
                line = f"  {f}"
                if inner:
                    line += " -> " + ", ".join(os.path.basename(t) for t in inner)
                if outer:
                    line += "  (" + ", ".join(outer) + ")"
                print(line)

    failures = []
    for folder, used in sorted(folder_edges.items()):
        allowed = MAY_USE.get(folder)
        if allowed is None:
            continue
        for u in sorted(used - allowed):
            who = sorted(f"{a} -> {b}" for a in by_folder[folder] for b in edges.get(a, ())
                         if folder_of(b) == u)
            failures.append(f"{folder}/ may not use {u}/: " + "; ".join(who[:6]))
    notes = []
    for folder in sorted(by_folder):
        for comp in circles(by_folder[folder], edges):
            line = f"a circle in {folder}/: " + " <-> ".join(comp)
            (failures if folder in CIRCLE_FREE_FOLDERS else notes).append(line)
    for f, h in private_includes(source_dir):
        failures.append(f"{f} includes the engine's private {h}")
    failures += long_code(source_dir)

    if "--draw" in flags:
        for line in notes:
            print("house: (noted) " + line)
    if "--check" in flags:
        for line in failures:
            print("house: " + line)
        print(f"house: {'FAILED' if failures else 'ok'} ({len(files)} files, "
              f"{sum(len(v) for v in edges.values())} uses)")
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
