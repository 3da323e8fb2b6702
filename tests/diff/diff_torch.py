#!/usr/bin/env python3
"""Differential test: tensorport's engine against PyTorch (1.13, Debian's, or 2.x).

Generates random views of random storages and random to / copy_ /
contiguous calls, runs them through tport-diff-driver (the engine, on cpu and
on simulated GPUs) and through torch on the CPU, and checks that both agree
on: success or failure (with PyTorch's error message), values (bit for bit; NaN matches NaN), strides and
dtype of the result, and whether the result aliased the input.  A device move
in the engine is compared with torch's result of the same call without it.

usage: diff_torch.py DRIVER [--cases N] [--seed S] [--gpu cuda]

With --gpu cuda the cases' devices are CUDA devices ("sim:k" becomes
"cuda:k mod count"); without a CUDA device the test exits 77 (skipped).

complex -> bool is `real != 0 or imag != 0` (NaN is true), as in PyTorch 2.x
and NumPy; PyTorch 1.13 looked at the real part alone.  Current PyTorch is the
reference, so under torch < 2 this script computes complex -> bool itself
(complex_nonzero) instead of asking torch; torch >= 2 is asked, and must agree
with complex_nonzero (checked at start).
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import warnings

try:
    import torch
except ImportError:
    # Criterion/ctest treats exit code 77 as "skipped" only when told to; say why loudly.
    print("diff_torch: python3-torch is not installed (deploy/install-deps.sh installs it)")
    sys.exit(1)

warnings.filterwarnings("ignore")
torch.set_num_threads(1)

# torch < 2 gets complex -> bool wrong (the real part alone): see complex_nonzero
TORCH_OLD_COMPLEX_BOOL = int(torch.__version__.split(".")[0]) < 2

DTYPES = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "complex64": torch.complex64, "complex128": torch.complex128,
}
FORMATS = {
    "contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d, "preserve": torch.preserve_format,
}
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 2.5, -2.5, 127.9, 200.7, -129.5, 255.0, 256.0, 65504.0,
           65520.0, 1e10, 3e9, -3e9, 1e20, float("nan"), float("inf"), float("-inf"), 1e-8, 0.1]


def random_values(rng, dtype, n, zr):
    if dtype == torch.bool:
        return torch.tensor([rng.random() < 0.5 for _ in range(n)], dtype=torch.bool)
    if not dtype.is_floating_point and not dtype.is_complex:
        info = torch.iinfo(dtype)
        return torch.tensor([rng.randint(info.min, info.max) for _ in range(n)], dtype=dtype)

    def one():
        r = rng.random()
        if r < 0.2:
            return rng.choice(SPECIAL)
        if r < 0.5:
            return float(rng.randint(-300, 300))
        return rng.gauss(0, 1) * 10 ** rng.randint(-3, 6)

    if dtype.is_complex:
        re = torch.tensor([one() for _ in range(n)], dtype=torch.float64)
        im = torch.tensor([one() for _ in range(n)], dtype=torch.float64)
        # about one element in eight purely imaginary (+-0 real part), so that
        # complex -> bool meets 0+yj often; drawn from a generator of its own
        # (zr) so that the cases of a seed stay those they were before
        for i in range(n):
            if zr.random() < 0.125:
                re[i] = -0.0 if zr.random() < 0.5 else 0.0
        return torch.complex(re, im).to(dtype)
    return torch.tensor([one() for _ in range(n)], dtype=torch.float64).to(dtype)


def span_of(sizes, strides):
    """Elements a view reaches beyond its offset (0 when it is empty)."""
    span = 1
    for sz, st in zip(sizes, strides):
        if sz == 0:
            return 0
        span += (sz - 1) * st
    return span


def dense_strides(rng, sizes, order):
    """Dense strides walking dims in `order` (innermost first), with random gaps."""
    strides = [0] * len(sizes)
    s = 1
    for d in order:
        strides[d] = s * (2 if rng.random() < 0.2 else 1)
        s = strides[d] * max(sizes[d], 1)
    return strides


def random_view(rng, max_rank=5):
    """sizes, strides, offset, storage numel of a random view."""
    nd = rng.choice([0, 1, 2, 3, 4, 4, 4, 5, 5])
    nd = min(nd, max_rank)
    sizes = [rng.choice([0, 1, 1, 2, 3, 4, 5]) if rng.random() < 0.1 else rng.randint(1, 5)
             for _ in range(nd)]
    kind = rng.random()
    if kind < 0.5:
        # dense in a random dim order, maybe with gaps: contiguous, channels_last,
        # transposes, N1HW-style ambiguities
        order = list(range(nd))
        rng.shuffle(order)
        if rng.random() < 0.3 and nd in (4, 5):
            order = [1] + list(range(nd - 1, 1, -1)) + [0]  # channels_last(3d)
        strides = dense_strides(rng, sizes, order)
        for d in range(nd):
            if sizes[d] == 1 and rng.random() < 0.3:
                strides[d] = rng.randint(0, 9)  # odd size-1 strides
    elif kind < 0.8:
        strides = [rng.randint(0, 7) for _ in range(nd)]  # overlaps and broadcasts
    else:
        strides = [0 if rng.random() < 0.4 else rng.randint(1, 30) for _ in range(nd)]
    off = rng.randint(0, 3)
    n = off + span_of(sizes, strides) + rng.randint(0, 2)
    return sizes, strides, off, max(n, 1)


def fmt_dims(v):
    return ",".join(str(x) for x in v) if v else "-"


def make_cases(rng, count, zr):
    cases, blobs, at = [], [], 0
    names = list(DTYPES)
    for k in range(count):
        sdt = rng.choice(names)
        sizes, strides, off, n = random_view(rng)
        vals = random_values(rng, DTYPES[sdt], n, zr)
        raw = vals.view(torch.uint8).numpy().tobytes() if n else b""
        c = {"id": k, "sdt": sdt, "n": n, "doff": at, "sizes": sizes, "strides": strides,
             "off": off, "conj": int(DTYPES[sdt].is_complex and rng.random() < 0.3),
             "sdev": rng.choice(["cpu", "cpu", "sim:0"]), "nb": int(rng.random() < 0.5)}
        blobs.append(raw)
        at += len(raw)
        r = rng.random()
        if r < 0.55:
            c["op"] = "to"
            c["dtype"] = rng.choice(names) if rng.random() < 0.6 else "-"
            c["fmt"] = rng.choice(list(FORMATS)) if rng.random() < 0.6 else "-"
            c["copy"] = int(rng.random() < 0.2)
            c["dev"] = rng.choice(["-", "-", "cpu", "sim:0", "sim:1"])
        elif r < 0.7:
            c["op"] = "contiguous"
            # preserve on contiguous and non-contiguous inputs alike: PyTorch
            # returns a contiguous input itself and refuses any other
            c["fmt"] = rng.choice(["contiguous", "contiguous", "channels_last", "channels_last_3d",
                                   "preserve"])
        else:
            c["op"] = "copy"
            c["ddt"] = rng.choice(names)
            # dst: same shape as src mostly; sometimes src is broadcast or mismatched
            dsizes = list(sizes)
            if rng.random() < 0.2:
                dsizes = [rng.randint(1, 3)] + dsizes
            if rng.random() < 0.05 and dsizes:
                dsizes[-1] += 1
            order = list(range(len(dsizes)))
            rng.shuffle(order)
            dstrides = dense_strides(rng, dsizes, order)
            if rng.random() < 0.05 and dsizes:
                dstrides[0] = 0
            doffs = rng.randint(0, 2)
            c.update(dsizes=dsizes, dstrides=dstrides, doffs=doffs,
                     dn=max(doffs + span_of(dsizes, dstrides), 1),
                     ddev=rng.choice(["cpu", "cpu", "sim:0", "sim:1"]))
        cases.append(c)
    return cases, b"".join(blobs)


def case_line(c):
    parts = []
    for key, v in c.items():
        parts.append("%s=%s" % (key, fmt_dims(v) if isinstance(v, list) else v))
    return " ".join(parts)


def complex_nonzero(v):
    """x != 0 for a complex tensor (a conj view included): either part nonzero,
    NaN true.  The parts are compared as reals, which every torch does alike."""
    parts = torch.view_as_real(v.resolve_conj())
    return (parts != 0).any(-1)


def check_complex_rule():
    """complex_nonzero on the brief's example; torch >= 2 must agree with it."""
    z = torch.tensor([1j, 0, 1, -0.0, -2j, complex(float("nan"), 0), complex(0, float("nan"))],
                     dtype=torch.complex64)
    want = [True, False, True, False, True, True, True]
    got = complex_nonzero(z).tolist()
    if got != want or complex_nonzero(z.conj()).tolist() != want:
        return "complex_nonzero gives %s, not %s" % (got, want)
    if not TORCH_OLD_COMPLEX_BOOL and z.to(torch.bool).tolist() != want:
        return "torch %s gives %s for complex -> bool, not %s" % (
            torch.__version__, z.to(torch.bool).tolist(), want)
    return None


def torch_result(c, blob):
    """(ok, alias, tensor-or-error) for case c in torch on the CPU, where
    "sim:0" and "sim:1" stand for two GPUs."""
    dt = DTYPES[c["sdt"]]
    raw = bytearray(blob[c["doff"]:c["doff"] + c["n"] * torch.empty(0, dtype=dt).element_size()])
    base = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(c["n"], dtype=dt)
    try:
        v = base.as_strided(c["sizes"], c["strides"], c["off"])
        if c["conj"]:
            v = v.conj()
        if c["op"] == "to":
            # a device change never aliases: PyTorch then runs _to_copy, which
            # copy=True reaches on the CPU with the same dtype and format
            moved = c["dev"] != "-" and c["dev"] != c["sdev"]
            kw = {"copy": bool(c["copy"]) or moved, "non_blocking": bool(c["nb"])}
            if c["dtype"] != "-":
                kw["dtype"] = DTYPES[c["dtype"]]
            if c["fmt"] != "-":
                kw["memory_format"] = FORMATS[c["fmt"]]
            r = v.to(**kw)
            if TORCH_OLD_COMPLEX_BOOL and v.is_complex() and r.dtype == torch.bool:
                r.copy_(complex_nonzero(v))  # torch's strides, the values of 2.x
            return True, r is v, r
        if c["op"] == "contiguous":
            r = v.contiguous(memory_format=FORMATS[c["fmt"]])
            return True, r is v, r
        ddt = DTYPES[c["ddt"]]
        dbase = torch.zeros(c["dn"], dtype=ddt)
        d = dbase.as_strided(c["dsizes"], c["dstrides"], c["doffs"])
        d.copy_(v, non_blocking=bool(c["nb"]))
        if TORCH_OLD_COMPLEX_BOOL and v.is_complex() and ddt == torch.bool:
            d.copy_(complex_nonzero(v))  # torch's checks passed above; 2.x's values
        return True, False, dbase
    except RuntimeError as e:
        return False, False, str(e).split("\n")[0]


def bits(t):
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(BITS[t.element_size()]) if t.dtype != torch.bool else t.view(torch.uint8)


def same_values(want, got):
    if want.numel() == 0:
        return True
    wb, gb = bits(want).flatten(), bits(got).flatten()
    diff = wb != gb
    if not bool(diff.any()):
        return True
    if want.is_floating_point() or want.is_complex():
        w = want.resolve_conj().contiguous()
        g = got.contiguous()
        if w.is_complex():
            w, g = torch.view_as_real(w), torch.view_as_real(g)
        w, g = w.to(torch.float64).flatten(), g.to(torch.float64).flatten()
        both_nan = torch.isnan(w) & torch.isnan(g)
        return bool((~diff | both_nan).all())
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver")
    ap.add_argument("--cases", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--gpu", choices=["cuda"], default=None)
    a = ap.parse_args()
    bad_rule = check_complex_rule()
    if bad_rule:
        print("diff_torch: %s" % bad_rule)
        return 1
    rng = random.Random(a.seed)
    cases, blob = make_cases(rng, a.cases, random.Random("imaginary %d" % a.seed))
    if a.gpu:
        p = subprocess.run([a.driver, "--count-devices", a.gpu], capture_output=True, text=True)
        if p.returncode == 77:
            # TPORT_REQUIRE_GPU=1: a GPU run that would skip fails instead
            if os.environ.get("TPORT_REQUIRE_GPU", "0") not in ("", "0"):
                print("diff_torch: TPORT_REQUIRE_GPU is set and %s" % p.stderr.strip())
                return 1
            print("diff_torch: skipped: %s" % p.stderr.strip())
            return 77
        count = int(p.stdout)
        for c in cases:
            for key in ("sdev", "dev", "ddev"):
                if str(c.get(key, "")).startswith("sim:"):
                    c[key] = "%s:%d" % (a.gpu, int(c[key][4:]) % count)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, n) for n in ("cases.txt", "data.bin", "out.txt", "out.bin")]
        with open(paths[0], "w") as f:
            f.write("\n".join(case_line(c) for c in cases) + "\n")
        with open(paths[1], "wb") as f:
            f.write(blob)
        subprocess.run([a.driver] + paths, check=True)
        out = {}
        with open(paths[2]) as f:
            for line in f:
                fields = line.rstrip("\n").split(" ", 2)
                out[int(fields[0][3:])] = line.rstrip("\n")
        with open(paths[3], "rb") as f:
            obin = f.read()

    failures, stats = [], {"ok": 0, "err": 0, "alias": 0, "device": 0}
    preserve = {True: 0, False: 0}  # contiguous(preserve) cases, by torch's outcome
    for c in cases:
        line = out.get(c["id"])
        ok, alias, r = torch_result(c, blob)
        if c["op"] == "contiguous" and c["fmt"] == "preserve":
            preserve[ok] += 1
        desc = case_line(c)
        if line is None:
            failures.append("%s: no answer from the driver" % desc)
            continue
        got_ok = " ok " in line
        if ok != got_ok:
            failures.append("%s:\n  torch: %s\n  tport: %s" % (desc, r if not ok else "ok", line))
            continue
        if not ok:
            stats["err"] += 1
            msg = line.split(" msg=", 1)[1] if " msg=" in line else ""
            if msg != r:
                failures.append("%s: messages differ\n  torch: %s\n  tport: %s" % (desc, r, msg))
            continue
        stats["ok"] += 1
        kv = dict(p.split("=", 1) for p in line.split(" ") if "=" in p)
        moved = c["op"] == "to" and c["dev"] != "-" and c["dev"] != c["sdev"]
        stats["device"] += int(moved or c["sdev"] != "cpu" or c.get("ddev", "cpu") != "cpu")
        want_alias = alias and not moved
        stats["alias"] += int(want_alias)
        if int(kv["alias"]) != int(want_alias):
            failures.append("%s: alias torch=%s tport=%s" % (desc, want_alias, kv["alias"]))
        strides = [int(x) for x in kv["strides"].split(",")] if kv["strides"] != "-" else []
        if c["op"] != "copy" and strides != list(r.stride()):
            failures.append("%s: strides torch=%s tport=%s" % (desc, list(r.stride()), strides))
        want_dt = [k for k, v in DTYPES.items() if v == r.dtype][0]
        if kv["dtype"] != want_dt:
            failures.append("%s: dtype torch=%s tport=%s" % (desc, want_dt, kv["dtype"]))
            continue
        at, nb = int(kv["at"]), int(kv["nbytes"])
        raw = bytearray(obin[at:at + nb])
        got = (torch.frombuffer(raw, dtype=r.dtype) if nb else torch.empty(0, dtype=r.dtype))
        got = got.reshape(r.shape)
        if not same_values(r, got):
            failures.append("%s: values differ\n  torch: %s\n  tport: %s" % (desc, r, got))

    print("diff_torch: %d cases (%d succeeded, %d errors in both, %d aliased, %d on sim devices; "
          "contiguous(preserve): %d returned, %d refused), %d mismatches"
          % (len(cases), stats["ok"], stats["err"], stats["alias"], stats["device"],
             preserve[True], preserve[False], len(failures)))
    if not (preserve[True] and preserve[False]):
        failures.append("contiguous(preserve) must be drawn on contiguous and other inputs alike")
    for f in failures[:20]:
        print("MISMATCH", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
