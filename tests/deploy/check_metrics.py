#!/usr/bin/python3
"""check_metrics.py TPORTD TPORT: /metrics read as Prometheus reads it, and
the Grafana dashboard's queries against it.

Starts a tportd (cpu and two simulated GPUs, an ipc:// listener with shared
memory, /metrics on a free loopback port), moves a tensor through it with
the tport tool (a put and a get through shared memory, a get on the
socket), scrapes /metrics and parses it with python3-prometheus-client's
parser (the reference implementation's), then checks:
  - Prometheus's naming conventions: tport_ prefix, snake case, counters
    end in _total, a unit suffix (_bytes, _seconds) at the end of the name
    (before _total), never a unit in the middle; gauges and counters are
    not histograms' names;
  - every family has HELP, TYPE and at least one sample (no empty family);
  - no label value that is the sum of the others (state="total": summing
    a family must not double-count);
  - histograms have buckets up to le="+Inf", _count and _sum;
  - every metric the dashboard (deploy/grafana/tensorport.json) queries is
    exported, every label it filters or groups on is one that metric has.
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "tensorport.json")
UNITS = ("bytes", "seconds")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(tportd, tport):
    d = tempfile.mkdtemp(prefix="tport-metrics-")
    port = free_port()
    url = "ipc://" + os.path.join(d, "s.sock")
    env = dict(os.environ, TPORT_LOCAL_SECRET=os.path.join(d, "local-secret"))
    log = open(os.path.join(d, "tportd.log"), "w+")
    proc = subprocess.Popen([tportd, "--listen", url, "--devices", "cpu,sim:2",
                             "--http-listen", "127.0.0.1:%d" % port,
                             "--shm-socket", os.path.join(d, "shm.sock"), "--log-level", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(d, "s.sock")):
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                raise SystemExit("check_metrics: tportd did not start: " + log.read())
            time.sleep(0.05)
        import numpy as np

        np.save(os.path.join(d, "x.npy"), np.arange(1 << 18, dtype=np.float32))
        run = lambda *a, **kw: subprocess.run([tport, "--url", url, "--tenant", "alice", *a],
                                              check=True, capture_output=True, env=env,
                                              timeout=60, **kw)
        run("put", os.path.join(d, "x.npy"), "--name", "x", "--device", "sim:1")
        run("get", "x", os.path.join(d, "y.npy"))
        run("--no-shm", "get", "x", os.path.join(d, "z.npy"))
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            return r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_exposition(text):
    from prometheus_client.parser import text_string_to_metric_families

    bad = []
    families = {}
    samples = {}  # sample name -> set of label names
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    for fam in text_string_to_metric_families(text):
        families[fam.name] = fam
        for s in fam.samples:
            samples.setdefault(s.name, set()).update(s.labels)
    declared = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, kind in declared.items():
        base = name[:-6] if kind == "counter" and name.endswith("_total") else name
        fam = families.get(base) or families.get(name)
        if not re.fullmatch(r"tport_[a-z0-9]+(_[a-z0-9]+)*", name):
            bad.append("%s: not tport_ and snake case" % name)
        if name not in helps:
            bad.append("%s: no HELP" % name)
        if fam is None or not fam.samples:
            bad.append("%s: HELP and TYPE but no sample" % name)
            continue
        if kind == "counter" and not name.endswith("_total"):
            bad.append("%s: a counter's name ends in _total" % name)
        if kind != "counter" and name.endswith("_total"):
            bad.append("%s: a %s's name must not end in _total" % (name, kind))
        stem = name[:-6] if name.endswith("_total") else name
        for unit in UNITS:
            if ("_" + unit + "_") in stem + "_" and not stem.endswith("_" + unit):
                bad.append("%s: the unit (%s) goes at the end of the name" % (name, unit))
        for s in fam.samples:
            for k, v in s.labels.items():
                if v == "total" and kind == "gauge":
                    bad.append("%s{%s=\"total\"}: a label value that sums the others "
                               "(summing the family double-counts)" % (name, k))
                    break
        if kind == "histogram":
            names = {s.name for s in fam.samples}
            inf = any(s.name == name + "_bucket" and s.labels.get("le") == "+Inf"
                      for s in fam.samples)
            if not inf or name + "_count" not in names or name + "_sum" not in names:
                bad.append("%s: a histogram needs le=\"+Inf\", _count and _sum" % name)
    return sorted(set(bad)), samples


def check_dashboard(samples):
    bad = []
    dash = json.load(open(DASHBOARD))
    exprs = []

    def walk(o):
        if isinstance(o, dict):
            if isinstance(o.get("expr"), str):
                exprs.append(o["expr"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(dash)
    if not exprs:
        return ["the dashboard has no query"], 0
    for e in exprs:
        for m in re.finditer(r"(tport_[a-z0-9_]+)(\{([^}]*)\})?", e):
            name, sel = m.group(1), m.group(3) or ""
            if name not in samples:
                bad.append("dashboard: %s is not exported (in %s)" % (name, e))
                continue
            labels = set(re.findall(r"([a-z_]+)\s*(?:=|!=|=~|!~)", sel))
            by = re.findall(r"by \(([^)]*)\)[^()]*\(?[^()]*" + re.escape(name), e)
            for group in by:
                labels |= {x.strip() for x in group.split(",") if x.strip() and x.strip() != "le"}
            for lab in sorted(labels - samples[name]):
                bad.append("dashboard: %s has no label %s (in %s)" % (name, lab, e))
    return bad, len(exprs)


def main():
    text = scrape(sys.argv[1], sys.argv[2])
    bad, samples = check_exposition(text)
    dbad, n = check_dashboard(samples)
    for b in bad + dbad:
        print("check_metrics: " + b)
    print("check_metrics: %s (%d sample names, %d dashboard queries)"
          % ("FAILED" if bad or dbad else "ok", len(samples), n))
    return 1 if bad or dbad else 0


if __name__ == "__main__":
    sys.exit(main())
