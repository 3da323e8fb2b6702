#!/usr/bin/python3
"""The tport tool end to end against a tportd it starts (ipc), with NumPy files.

usage: test_cli.py TPORTD TPORT
Checks exit codes (0 only on success), --json output, and the values of
every file written, for every NumPy dtype tensorport has and bfloat16.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

TPORTD, TPORT = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="tport-cli-")
url = "ipc://" + os.path.join(tmp, "s.sock")
failures = []


def tport(*args, ok=True):
    p = subprocess.run([TPORT, "--url", url, *args], capture_output=True, text=True, timeout=60)
    if ok and p.returncode != 0:
        failures.append("tport %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr))
    if not ok and p.returncode == 0:
        failures.append("tport %s: exit 0, expected failure" % " ".join(args))
    return p


def tjson(*args):
    p = tport("--json", *args)
    try:
        return json.loads(p.stdout)
    except ValueError:
        failures.append("tport %s: not JSON: %r" % (" ".join(args), p.stdout))
        return {}


def check(cond, what):
    if not cond:
        failures.append(what)


# the engine's variables take sizes as the flags do (proto/units.c)
server = subprocess.Popen([TPORTD, "--listen", url, "--devices", "cpu,sim:2", "--log-level", "1",
                           "--shm-socket", os.path.join(tmp, "shm.sock"), "--admin", "default"],
                          env=dict(os.environ, TPORT_STAGING_BYTES="64M",
                                   TPORT_READBACK_BYTES="0.25GiB", TPORT_PINNED_CACHE_BYTES="1G"))
try:
    for _ in range(200):
        probe = subprocess.run([TPORT, "--url", url, "stats"], capture_output=True)
        if probe.returncode == 0:
            break
        time.sleep(0.05)
    rng = np.random.default_rng(7)
    arrays = {
        "bool": rng.random((3, 4)) < 0.5,
        "uint8": rng.integers(0, 255, (2, 3, 4), dtype=np.uint8),
        "int8": rng.integers(-128, 127, (5,), dtype=np.int8),
        "int16": np.asfortranarray(rng.integers(-999, 999, (3, 5), dtype=np.int16)),
        "int32": rng.integers(-10**9, 10**9, (2, 2), dtype=np.int32).astype(">i4"),
        "int64": rng.integers(-10**18, 10**18, (4, 1, 3), dtype=np.int64),
        "float16": rng.standard_normal((2, 3)).astype(np.float16),
        "float32": rng.standard_normal((2, 3, 4, 5)).astype(np.float32),
        "float64": rng.standard_normal(()).astype(np.float64),
        "complex64": (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64),
        "complex128": (rng.standard_normal((2, 2)) + 1j).astype(np.complex128),
    }
    for name, a in arrays.items():
        src, out = os.path.join(tmp, name + ".npy"), os.path.join(tmp, name + ".out.npy")
        np.save(src, a)
        info = tjson("put", src, "--name", name, "--device", "sim:1" if a.size > 3 else "cpu")
        check(info.get("dtype") == name, "%s: put reports dtype %s" % (name, info.get("dtype")))
        check(info.get("sizes") == list(a.shape), "%s: sizes %s" % (name, info.get("sizes")))
        tport("get", name, out)
        b = np.load(out)
        check(b.dtype == a.dtype.newbyteorder("=") and np.array_equal(a, b),
              "%s: values differ after put/get" % name)
        check(b.flags["C_CONTIGUOUS"], "%s: get writes C order" % name)

    # --verify (and TPORT_VERIFY=1): CRC32C on every chunk, bytes unchanged
    big = rng.standard_normal((3, 700, 1000)).astype(np.float32)  # a few chunks
    np.save(os.path.join(tmp, "big.npy"), big)
    tport("--verify", "put", os.path.join(tmp, "big.npy"), "--name", "big")
    os.environ["TPORT_VERIFY"] = "1"
    tport("get", "big", os.path.join(tmp, "big.out.npy"))
    del os.environ["TPORT_VERIFY"]
    check(np.array_equal(np.load(os.path.join(tmp, "big.out.npy")), big), "--verify: values differ")
    check("--verify" in tport("--help").stdout, "--help names --verify")

    # same host: large tensors go through a shared-memory region (the
    # server counts them), unless --no-shm or TPORT_SHM=0
    moved = tjson("stats").get("shm_transfers", -1)
    tport("put", os.path.join(tmp, "big.npy"), "--name", "big2")
    tport("get", "big2", os.path.join(tmp, "big2.out.npy"))
    check(np.array_equal(np.load(os.path.join(tmp, "big2.out.npy")), big), "shm: values differ")
    check(tjson("stats").get("shm_transfers", -1) == moved + 2,
          "a local put and get go through a region: %s" % tjson("stats").get("shm_transfers"))
    tport("--no-shm", "put", os.path.join(tmp, "big.npy"), "--name", "big3")
    os.environ["TPORT_SHM"] = "0"
    tport("get", "big3", os.path.join(tmp, "big3.out.npy"))
    del os.environ["TPORT_SHM"]
    check(np.array_equal(np.load(os.path.join(tmp, "big3.out.npy")), big), "no-shm: values differ")
    check(tjson("stats").get("shm_transfers", -1) == moved + 2, "--no-shm and TPORT_SHM=0 keep to the socket")
    check("--no-shm" in tport("--help").stdout, "--help names --no-shm")

    # bfloat16 by the '<u2' convention, and conversions on the server
    tport("put", os.path.join(tmp, "float32.npy"), "--name", "bf", "--dtype", "bfloat16",
          "--memory-format", "channels_last", "--device", "sim:0")
    info = tjson("info", "bf")
    check(info.get("dtype") == "bfloat16" and info.get("memory_format") == "channels_last",
          "bf: %s" % info)
    tport("get", "bf", os.path.join(tmp, "bf.npy"))
    bits = np.load(os.path.join(tmp, "bf.npy"))
    check(bits.dtype == np.uint16, "bfloat16 is written as <u2")
    f = arrays["float32"]
    want = ((f.view(np.uint32) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    check(np.array_equal(bits, want), "bfloat16 bits round to nearest even")

    # to: aliasing as PyTorch, the exact mode, views, contiguous, copy
    v = tjson("view", "float32", "--sizes", "5,4,3,2", "--strides", "1,5,20,60", "--name", "t")
    check(v.get("memory_format") == "none", "a transposed view is contiguous in no format")
    r = tjson("to", "t", "--memory-format", "contiguous")
    check(r.get("alias") is True, "to(contiguous) of a transpose aliases (pytorch#62027)")
    r = tjson("to", "t", "--memory-format", "contiguous", "--exact-format", "--name", "tc")
    check(r.get("alias") is False and r.get("is_contiguous") is True, "exact mode copies: %s" % r)
    tport("get", "tc", os.path.join(tmp, "tc.npy"))
    check(np.array_equal(np.load(os.path.join(tmp, "tc.npy")), f.transpose(3, 2, 1, 0)),
          "the exact-mode copy holds the transposed values")
    r = tjson("to", "float32", "--dtype", "float64", "--device", "sim:0", "--name", "f64")
    check(r.get("device") == "sim:0" and r.get("dtype") == "float64", "to sim:0 float64: %s" % r)
    r = tjson("contiguous", "float32", "--memory-format", "channels_last", "--name", "cl")
    check(r.get("alias") is False and r.get("strides") == [60, 1, 15, 3], "contiguous(cl): %s" % r)
    tport("copy", "cl", "bf")
    tport("get", "cl", os.path.join(tmp, "cl.npy"))
    got = np.load(os.path.join(tmp, "cl.npy"))
    check(np.array_equal(got, (want.astype(np.uint32) << 16).view(np.float32)),
          "copy bfloat16 -> float32 channels_last")

    # listing, removal, devices, stats, errors and exit codes
    names = [t["name"] for t in tjson("ls")]
    check("bf" in names and "f64" in names, "ls lists the kept tensors: %s" % names)
    names = [t["name"] for t in tjson("ls", "f")]
    check(names == sorted(n for n in names if n.startswith("f")) and "f64" in names
          and "float32" in names and "bf" not in names, "ls PREFIX: the names under it: %s" % names)
    e = tport("ls", "a", "b", ok=False)
    check(e.returncode == 2 and "at most 1 argument" in e.stderr, "ls A B: %s" % e.stderr)
    tport("rm", "f64")
    check(tport("info", "f64", ok=False).returncode == 1, "info of a removed tensor exits 1")
    d = tjson("devices")
    check([x["device"] for x in d.get("devices", [])] == ["cpu", "sim:0", "sim:1"], "devices: %s" % d)
    check(d.get("cuda_unavailable_reason"), "devices says why cuda is off")
    # free memory: the operator's to see; hidden (not 0.0 GiB) from others
    check(all(isinstance(x.get("free_bytes"), int) for x in d.get("devices", [])),
          "the operator sees free memory: %s" % d)
    d = tjson("devices", "--tenant", "bob")
    check(d.get("devices") and all(x.get("free_bytes", 0) is None for x in d["devices"]),
          "free_bytes is null to a tenant that is not an operator: %s" % d)
    lines = tport("devices", "--tenant", "bob").stdout.splitlines()
    check(all("hidden free" in l and "GiB free" not in l for l in lines if "total" in l),
          "devices prints hidden free memory as hidden: %s" % lines)
    check(tjson("stats").get("tensors", 0) > 0, "stats counts tensors")
    e = tport("--json", "view", "float32", "--sizes", "9", "--strides", "1", "--offset", "500",
              ok=False)
    check(json.loads(e.stdout or "{}").get("error") == "OUT_OF_RANGE", "view past the storage: %s" % e.stdout)
    check(tport("to", "float32", "--memory-format", "channels_last_3d", ok=False).returncode == 1,
          "a rank error exits 1")
    check(tport("put", os.path.join(tmp, "missing.npy"), ok=False).returncode == 1, "missing file")
    # file errors: the code that fits errno, the OS's reason and the path
    for args, code, why, path in (
            (["get", "float32", "/no/such/dir/x.npy"], "NOT_FOUND", "No such file or directory",
             "/no/such/dir/x.npy"),
            (["put", os.path.join(tmp, "missing.npy")], "NOT_FOUND", "No such file or directory",
             "missing.npy"),
            (["put", tmp], "INVALID_ARGUMENT", "Is a directory", tmp),
            (["get", "float32", tmp], "INVALID_ARGUMENT", "Is a directory", tmp)):
        e = tport(*args, ok=False)
        check(e.returncode == 1 and code in e.stderr and why in e.stderr and path in e.stderr,
              "tport %s: exit %d: %s" % (" ".join(args), e.returncode, e.stderr))
    if os.geteuid() != 0:  # root reads any file
        locked = os.path.join(tmp, "locked.npy")
        np.save(locked, arrays["int8"])
        os.chmod(locked, 0)
        e = tport("put", locked, ok=False)
        check("PERMISSION_DENIED" in e.stderr and "Permission denied" in e.stderr,
              "an unreadable file: %s" % e.stderr)
    # usage errors exit 2, before any connection; failures exit 1
    check(tport("bogus", ok=False).returncode == 2, "unknown command exits 2")
    check(tport("get", ok=False).returncode == 2, "missing arguments exit 2")
    for bad, why in (("-5", "negative"), ("abc", "not a number"), ("1.0005", "whole")):
        e = tport("put", os.path.join(tmp, "big.npy"), "--ttl", bad, ok=False)
        check(e.returncode == 2 and why in e.stderr and "500ms" in e.stderr,
              "--ttl %s: exit %d: %s" % (bad, e.returncode, e.stderr))
    p = tjson("put", os.path.join(tmp, "big.npy"), "--name", "ttl10m", "--ttl", "10m")
    check(p.get("name") == "ttl10m", "--ttl 10m is taken: %s" % p)
    tport("rm", "ttl10m")
    check(tport("--url", "tcp://127.0.0.1:1", "ls", ok=False).returncode == 1,
          "no server: exit 1")
    # libtport's variables: one that does not parse is refused, named
    for var, value in (("TPORT_SHM", "yes"), ("TPORT_CUDA_IPC", "off"),
                       ("TPORT_COPY_THREADS", "all")):
        e = subprocess.run([TPORT, "--url", url, "ls"], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, **{var: value}))
        check(e.returncode == 1 and "INVALID_ARGUMENT" in e.stderr
              and "%s='%s'" % (var, value) in e.stderr,
              "%s=%s: exit %d: %s" % (var, value, e.returncode, e.stderr))

    # global flags after the command, as before it (--url, --json, --tenant,
    # --verify, --no-shm, --help here; the secret and TLS ones below)
    g = tport("ls", "--url", "tcp://127.0.0.1:1", ok=False)
    check(g.returncode == 1, "ls --url: the later --url wins: exit %d %s" % (g.returncode, g.stderr))
    g = tport("ls", "--json")
    check(g.stdout.startswith("["), "ls --json: %r" % g.stdout)
    tport("put", os.path.join(tmp, "int32.npy"), "--name", "bobs", "--tenant", "bob")
    check("bobs" in [t["name"] for t in tjson("ls", "--tenant", "bob")]
          and "bobs" not in [t["name"] for t in tjson("ls")], "--tenant after the command")
    tport("put", os.path.join(tmp, "big.npy"), "--name", "gv", "--verify")
    tport("get", "gv", os.path.join(tmp, "gv.npy"), "--verify")
    check(os.path.exists(os.path.join(tmp, "gv.npy"))
          and np.array_equal(np.load(os.path.join(tmp, "gv.npy")), big), "--verify after: values")
    moved = tjson("stats").get("shm_transfers", -1)
    tport("put", os.path.join(tmp, "big.npy"), "--name", "gns", "--no-shm")
    check(tjson("stats").get("shm_transfers", -1) == moved, "--no-shm after the command")
    g = tport("put", "--help")
    check(g.returncode == 0 and "--no-shm" in g.stdout, "put --help: %s" % g.stderr)
    # an unknown flag, anywhere, or one the command does not take: exit 2,
    # before any connection, with the flag named
    for args, named in ((["ls", "--bogus"], "'--bogus'"), (["--bogus", "ls"], "'--bogus'"),
                        (["ls", "--bogus=1"], "'--bogus=1'"), (["ls", "-x"], "'-x'"),
                        (["ls", "--url"], "'--url' needs a value"),
                        (["put", "x.npy", "--sizes", "3"], "put takes no --sizes"),
                        (["ls", "--name", "n"], "ls takes no --name")):
        e = tport(*args, ok=False)
        check(e.returncode == 2 and named in e.stderr,
              "tport %s: exit %d: %s" % (" ".join(args), e.returncode, e.stderr))
    # --replace swaps a name; without it an existing name is refused
    ones, twos = os.path.join(tmp, "ones.npy"), os.path.join(tmp, "twos.npy")
    np.save(ones, np.ones(1000, np.float32))
    np.save(twos, np.full(1000, 2, np.float32))
    tport("put", ones, "--name", "latest")
    e = tport("--json", "put", twos, "--name", "latest", ok=False)
    check(json.loads(e.stdout or "{}").get("error") == "ALREADY_EXISTS", "no --replace: %s" % e.stdout)
    tport("put", twos, "--name", "latest", "--replace")
    out = os.path.join(tmp, "latest.npy")
    tport("get", "latest", out)
    check(np.array_equal(np.load(out), np.full(1000, 2, np.float32)), "--replace swapped the name")
    # --wait: a consumer started before its producer gets what it publishes
    waiting = subprocess.Popen([TPORT, "--url", url, "get", "later", out, "--wait", "20s"],
                               stderr=subprocess.PIPE, text=True)
    for _ in range(400):
        if tjson("stats").get("waiting_for_names") == 1:
            break
        time.sleep(0.05)
    tport("put", ones, "--name", "later")
    check(waiting.wait(timeout=60) == 0 and np.array_equal(np.load(out), np.ones(1000, np.float32)),
          "get --wait woken by the put: %s" % waiting.stderr.read())
    e = tport("--json", "info", "never", "--wait", "300ms", ok=False)
    check(e.returncode == 1 and json.loads(e.stdout or "{}").get("error") == "DEADLINE_EXCEEDED",
          "info --wait that times out: exit %d %s" % (e.returncode, e.stdout))
    e = tport("get", "never", out, "--wait", "soon", ok=False)
    check(e.returncode == 2 and "--wait" in e.stderr, "--wait soon: exit %d %s" % (e.returncode, e.stderr))
finally:
    server.terminate()
    rc = server.wait(timeout=30)
    check(rc == 0, "tportd exits 0 on SIGTERM (got %s)" % rc)

# a server that authenticates: the tool proves its tenant with a secret file
secret = "a1" * 20
auth = os.path.join(tmp, "auth")
with open(auth, "w") as f:
    f.write("# tenant secret\ncarol %s\n" % secret)
os.chmod(auth, 0o600)
key = os.path.join(tmp, "carol.key")
with open(key, "w") as f:
    f.write(secret + "\n")
os.chmod(key, 0o600)
aurl = "ipc://" + os.path.join(tmp, "auth.sock")
server = subprocess.Popen([TPORTD, "--listen", aurl, "--auth-file", auth, "--log-level", "0"])
try:
    for _ in range(200):
        if os.path.exists(aurl[len("ipc://"):]):
            break
        time.sleep(0.05)
    time.sleep(0.1)
    x = os.path.join(tmp, "auth-x.npy")
    np.save(x, np.arange(12, dtype=np.int32).reshape(3, 4))
    base = [TPORT, "--url", aurl, "--tenant", "carol"]
    p = subprocess.run(base + ["--secret-file", key, "put", x, "--name", "ax"], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 0, "put with the secret: %s" % p.stderr)
    back = os.path.join(tmp, "auth-back.npy")
    p = subprocess.run(base + ["get", "ax", back], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TPORT_SECRET_FILE=key))
    check(p.returncode == 0 and np.array_equal(np.load(back), np.arange(12).reshape(3, 4)),
          "get with TPORT_SECRET_FILE: %s" % p.stderr)
    p = subprocess.run(base + ["ls"], capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "UNAUTHENTICATED" in p.stderr, "no secret: %s" % p.stderr)
    p = subprocess.run(base + ["ls", "--secret-file", key], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, "--secret-file after the command: %s" % p.stderr)
    os.chmod(key, 0o644)
    p = subprocess.run(base + ["--secret-file", key, "ls"], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 1 and "chmod 600" in p.stderr, "a secret file others can read: %s"
          % p.stderr)
finally:
    server.terminate()
    rc = server.wait(timeout=30)
    check(rc == 0, "tportd with --auth-file exits 0 on SIGTERM (got %s)" % rc)

# the same over tls+tcp:// (TLS 1.3, a self-signed certificate for 127.0.0.1)
crt, pkey = os.path.join(tmp, "server.pem"), os.path.join(tmp, "server.key")
subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-keyout", pkey,
                "-out", crt, "-subj", "/CN=tportd", "-addext", "subjectAltName=IP:127.0.0.1"],
               check=True, capture_output=True)
os.chmod(key, 0o600)
import random
turl = None
for _ in range(10):
    turl = "tls+tcp://127.0.0.1:%d" % random.randint(20000, 50000)
    server = subprocess.Popen([TPORTD, "--listen", turl, "--auth-file", auth, "--tls-cert", crt,
                               "--tls-key", pkey, "--log-level", "0"])
    time.sleep(0.3)
    if server.poll() is None:
        break
try:
    tbase = [TPORT, "--url", turl, "--tls-ca", crt, "--tenant", "carol", "--secret-file", key]
    p = subprocess.run(tbase + ["put", x, "--name", "tx"], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, "put over tls+tcp with the secret: %s" % p.stderr)
    back = os.path.join(tmp, "tls-back.npy")
    p = subprocess.run(tbase + ["get", "tx", back], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and np.array_equal(np.load(back), np.arange(12).reshape(3, 4)),
          "get over tls+tcp: %s" % p.stderr)
    p = subprocess.run([TPORT, "--url", turl, "--tenant", "carol", "--secret-file", key, "ls"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1, "a server certificate the tool does not trust: exit 1 (%s)" % p.stderr)
    # the TLS flags after the command: the CA makes the certificate trusted,
    # a name it does not carry and a certificate that is not there fail
    notls = [TPORT, "--url", turl, "--tenant", "carol", "--secret-file", key]
    p = subprocess.run(notls + ["ls", "--tls-ca", crt], capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "ls --tls-ca: %s" % p.stderr)
    p = subprocess.run(notls + ["ls", "--tls-ca", crt, "--tls-server-name", "elsewhere.example"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1, "ls --tls-server-name elsewhere: exit %d" % p.returncode)
    p = subprocess.run(notls + ["ls", "--tls-ca", crt, "--tls-cert", os.path.join(tmp, "nocert"),
                                "--tls-key", os.path.join(tmp, "nokey")],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "nocert" in p.stderr, "ls --tls-cert missing: %s" % p.stderr)
    # ... every time: nng freed the refused dialer's TLS configuration on its
    # reaper thread while the tool's exit ran OpenSSL's exit handlers, and
    # about 1 exit in 80 crashed (SIGSEGV); tport_close now waits for nng's
    # reaper (nng_reap_drain)
    odd = {}
    for _ in range(250):
        p = subprocess.run([TPORT, "--url", turl, "--tenant", "carol", "--secret-file", key, "ls"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 1:
            odd[p.returncode] = odd.get(p.returncode, 0) + 1
    check(not odd, "250 refused TLS handshakes: every exit 1 (other exits: %s)" % odd)
finally:
    server.terminate()
    rc = server.wait(timeout=30)
    check(rc == 0, "tportd on tls+tcp exits 0 on SIGTERM (got %s)" % rc)

# the wrong scheme: tcp:// to the metrics port (HTTP) or to a TLS listener,
# tls+tcp:// to a plain one; the error says what the other end speaks
for _ in range(10):
    base_port = random.randint(20000, 50000)
    plain, tls, http = ("127.0.0.1:%d" % (base_port + i) for i in range(3))
    server = subprocess.Popen([TPORTD, "--listen", "tcp://%s,tls+tcp://%s" % (plain, tls),
                               "--tls-cert", crt, "--tls-key", pkey, "--http-listen", http,
                               "--shm-socket", "off", "--log-level", "0"])
    time.sleep(0.3)
    if server.poll() is None:
        break
try:
    import urllib.request
    for _ in range(400):  # /readyz: the listeners are up (slow under sanitizers)
        try:
            if urllib.request.urlopen("http://%s/readyz" % http, timeout=1).status == 200:
                break
        except OSError:
            pass
        time.sleep(0.05)
    for u, said in (("tcp://" + http, "speaks HTTP: is this the metrics port? tensorport's "
                                      "default is tcp://127.0.0.1:7450"),
                    ("tcp://" + tls, "speaks TLS: use tls+tcp://" + tls),
                    ("tls+tcp://" + plain, "speaks tensorport without TLS: use tcp://" + plain)):
        p = subprocess.run([TPORT, "--url", u, "--tls-ca", crt, "ls"], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode == 1 and said in p.stderr, "%s: exit %d: %s" % (u, p.returncode, p.stderr))
    p = subprocess.run([TPORT, "--url", "tcp://" + plain, "ls"], capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 0, "the plain listener itself: %s" % p.stderr)
finally:
    server.terminate()
    server.wait(timeout=30)

# tportd's file flags: a file or folder that is not there is named, with
# the OS's reason; exit 1 (a failure, not a usage error) for the auth file
for flags, named in ((["--auth-file", "/no/such/auth"], "/no/such/auth"),
                     (["--listen", "tls+tcp://127.0.0.1:0", "--tls-cert", "/no/such/c.pem"],
                      "/no/such/c.pem"),
                     (["--shm-socket", "/no/such/dir/s.sock"], "/no/such/dir")):
    p = subprocess.run([TPORTD, "--listen", "ipc://" + os.path.join(tmp, "files.sock"),
                        "--http-listen", "off", *flags], capture_output=True, text=True, timeout=30)
    check(p.returncode != 0 and named in p.stderr and "No such file or directory" in p.stderr,
          "tportd %s: exit %d: %s" % (" ".join(flags), p.returncode, p.stderr))
    if flags[0] == "--auth-file":
        check(p.returncode == 1, "a missing --auth-file exits 1: %d" % p.returncode)

# tportd's variables: a value that does not parse is a usage error that
# names the variable, its flag's and the engine's own alike
for var, value in (("TPORT_QUOTA", "lots"), ("TPORT_TTL", "-5"), ("TPORT_LOG_LEVEL", "loud"),
                   ("TPORT_STAGING_BYTES", "lots"), ("TPORT_READBACK_BYTES", "1.5B"),
                   ("TPORT_PINNED_CACHE_BYTES", "-1")):
    p = subprocess.run([TPORTD, "--listen", "ipc://" + os.path.join(tmp, "env.sock"),
                        "--http-listen", "off", "--shm-socket", "off"], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, **{var: value}))
    check(p.returncode == 2 and var in p.stderr and "'%s'" % value in p.stderr,
          "tportd with %s=%s: exit %d: %s" % (var, value, p.returncode, p.stderr))

for f in failures:
    print("FAIL", f)
print("test_cli: %d failures" % len(failures))
sys.exit(1 if failures else 0)
