#!/usr/bin/python3
"""bench_pydict.py --tportd PATH [--reps N]: Python's put_dict/get_dict of a
ResNet-50 state dict vs one put/get of the same bytes as one tensor.

Rows (issue 21), each a ratio of medians measured interleaved in one run
(dict then one tensor, one tensor then dict, ...), over tcp:// and ipc:// to a tportd this
program starts (cpu only, shm off, so both go over the socket):

    py_put_dict_resnet50_{tcp,ipc}_vs_single_put
    py_get_dict_resnet50_{tcp,ipc}_vs_single_get

A ratio is the single tensor's median time over the dict's: >= 0.8 is the
target (the batch costs at most a quarter more than one transfer).
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import numpy as np  # noqa: E402

import tensorport as tp  # noqa: E402


def resnet50_shapes():
    """torchvision's resnet50 parameter shapes, as bench_pipeline.c makes them."""
    shapes = []

    def conv_bn(out, inp, k):
        shapes.extend([(out, inp, k, k), (out,), (out,)])

    conv_bn(64, 3, 7)
    inp = 64
    for layer, blocks in enumerate((3, 4, 6, 3)):
        planes = 64 << layer
        for b in range(blocks):
            conv_bn(planes, inp, 1)
            conv_bn(planes, planes, 3)
            conv_bn(planes * 4, planes, 1)
            if b == 0:
                conv_bn(planes * 4, inp, 1)
            inp = planes * 4
    return shapes + [(1000, 2048), (1000,)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tportd, url, tmp):
    p = subprocess.Popen([tportd, "--listen", url, "--devices", "cpu", "--http-listen", "off",
                          "--shm-socket", "off", "--log-level", "1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            tp.Client(url, timeout=5).close()
            return p
        except tp.Error:
            if time.time() > deadline or p.poll() is not None:
                p.kill()
                sys.exit("bench_pydict: tportd did not start on %s" % url)
            time.sleep(0.05)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(url, reps):
    shapes = resnet50_shapes()
    rng = np.random.default_rng(1)
    sd = {"p%03d" % i: rng.standard_normal(s, dtype=np.float32) for i, s in enumerate(shapes)}
    flat = np.concatenate([v.ravel() for v in sd.values()])
    times = {"put_dict": [], "put": [], "get_dict": [], "get": []}
    with tp.Client(url, shm=False) as c:
        for rep in range(reps + 1):  # the first round warms up
            got = {}
            # the order swapped every round (as bench_pipeline.c does): what
            # one leaves behind (freed memory, a warm cache) helps the other
            if rep % 2:
                d = timed(lambda: got.update(t=c.put_dict(sd, prefix="b/")))
                one = timed(lambda: got.update(one=c.put(flat)))
                gd = timed(lambda: got.update(back=c.get_dict("b/")))
                g = timed(lambda: got.update(flat=c.get(got["one"])))
            else:
                one = timed(lambda: got.update(one=c.put(flat)))
                d = timed(lambda: got.update(t=c.put_dict(sd, prefix="b/")))
                g = timed(lambda: got.update(flat=c.get(got["one"])))
                gd = timed(lambda: got.update(back=c.get_dict("b/")))
            assert np.array_equal(got["back"]["p160"], sd["p160"])
            assert np.array_equal(got["flat"], flat)
            for t in got["t"].values():
                c.free(t)
            c.free(got["one"])
            if rep:
                for k, v in (("put_dict", d), ("put", one), ("get_dict", gd), ("get", g)):
                    times[k].append(v)
    return {k: statistics.median(v) for k, v in times.items()}, flat.nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tportd", required=True)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tport-bench-pydict-")
    for tr, url in (("tcp", "tcp://127.0.0.1:%d" % free_port()),
                    ("ipc", "ipc://" + os.path.join(tmp, "s.sock"))):
        p = start(a.tportd, url, tmp)
        try:
            med, nbytes = measure(url, a.reps)
        finally:
            p.terminate()
            p.wait(10)
        for op, base in (("put", "put"), ("get", "get")):
            d, one = med[op + "_dict"], med[base]
            print("py_%s_dict_resnet50_%s_vs_single_%s  dict %.4f s (%.2f GB/s)  one %.4f s "
                  "(%.2f GB/s)  ratio %.2f" % (op, tr, base, d, nbytes / d / 1e9, one,
                                               nbytes / one / 1e9, one / d), flush=True)


if __name__ == "__main__":
    main()
