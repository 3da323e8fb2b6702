#!/usr/bin/python3
"""bench/run --plot: a fixed sample of a transfer run's JSON lines drawn to a
temp PNG; the file is a PNG of the figure's size, every series the sample
holds is read (and nothing else), and a file without transfer rows is
refused.

usage: test_plot.py   (from anywhere; the repository is this file's ../..)
"""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN = os.path.join(ROOT, "bench", "run")
SAMPLE = os.path.join(HERE, "rows_sample.jsonl")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


tmp = tempfile.mkdtemp(prefix="tport-plot-")
png = os.path.join(tmp, "bench.png")
p = subprocess.run([sys.executable, RUN, "--plot", SAMPLE, png], capture_output=True, text=True,
                   timeout=300)
check(p.returncode == 0, "bench/run --plot: exit %d: %s" % (p.returncode, p.stderr))
if os.path.exists(png):
    with open(png, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG: %r" % head)
    w, h = struct.unpack(">II", head[16:24])
    check((w, h) == (1100, 450), "the figure is 11 x 4.5 in at 100 dpi: %dx%d" % (w, h))
    size = os.path.getsize(png)
    check(20_000 < size < 2_000_000, "a PNG of %d bytes: blank or runaway" % size)
else:
    failures.append("no PNG written")

# what was read: the transfer rows only, each in its series
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plot  # noqa: E402

rows = plot.read_rows(SAMPLE)
check(sorted(rows["put"]) == ["gRPC tcp", "gRPC unix socket", "memcpy", "raw nng ipc",
                              "raw nng tcp", "tensorport ipc", "tensorport shm region",
                              "tensorport tcp"], "put series: %s" % sorted(rows["put"]))
check(rows["put"]["tensorport tcp"] == {1: 0.62, 16: 2.2, 256: 3.0},
      "tensorport tcp (the raw-nng rows' values, not the gRPC rows'): %s"
      % rows["put"]["tensorport tcp"])
check(rows["put"]["gRPC tcp"] == {1: 0.17, 16: 1.24, 256: 1.6}, "gRPC tcp: %s"
      % rows["put"]["gRPC tcp"])
check(rows["get"]["memcpy"] == {256: 8.4}, "get memcpy: %s" % rows["get"]["memcpy"])

# a file without transfer rows (a tls-only run, say) is refused, named
empty = os.path.join(tmp, "rtt.jsonl")
with open(empty, "w") as f:
    f.write('{"bench": "info_rtt_p50_tcp", "value": 95.0, "unit": "us", "baseline": 60.0}\n')
p = subprocess.run([sys.executable, RUN, "--plot", empty, os.path.join(tmp, "x.png")],
                   capture_output=True, text=True, timeout=300)
check(p.returncode != 0 and "no transfer rows" in p.stderr and not os.path.exists(
    os.path.join(tmp, "x.png")), "no rows: exit %d: %s" % (p.returncode, p.stderr))
p = subprocess.run([sys.executable, RUN, "--plot", SAMPLE], capture_output=True, text=True,
                   timeout=300)
check(p.returncode != 0 and "usage" in p.stderr, "--plot without OUT: %s" % p.stderr)

for f in failures:
    print("FAIL", f)
print("test_plot: %d failures" % len(failures))
sys.exit(1 if failures else 0)
