"""bench/plot.py: the transfer suite's rows as a picture (bench/run --plot).

    bench/run transfer > rows.jsonl
    bench/run --plot rows.jsonl docs/bench.png

Reads the JSON lines bench/run prints (from a file, so that drawing never
re-runs a benchmark) and draws throughput against tensor size, put and get
side by side, tensorport beside the baselines measured in the same run: raw
nng moving the same bytes (put_NMiB_tcp's baseline), the gRPC peer
(*_vs_grpc), and memcpy beside tensorport's same-host regions
(*_shm_NMiB_vs_memcpy).  Rows of other kinds (latency, tls, devices) are
left out; a file with none of these rows is an error.
"""
import json
import re
import sys

# (row name pattern, which number, the series it goes to); op and MiB come
# from the name, the transport ("tcp", "ipc") from the pattern's group
SERIES = (
    (r"(put|get)_(\d+)MiB_(tcp|ipc)$", "value", "tensorport {t}"),
    (r"(put|get)_(\d+)MiB_(tcp|ipc)$", "baseline", "raw nng {t}"),
    (r"(put|get)_(\d+)MiB_(tcp|ipc)_vs_grpc$", "baseline", "gRPC {t}"),
    (r"(put|get)_shm_(\d+)MiB_vs_memcpy$", "value", "tensorport shm region"),
    (r"(put|get)_shm_(\d+)MiB_vs_memcpy$", "baseline", "memcpy"),
)
# one look per series: tensorport solid, baselines dashed or dotted
STYLE = {
    "tensorport tcp": ("C0", "-", "o"), "tensorport ipc": ("C1", "-", "o"),
    "tensorport shm region": ("C2", "-", "o"), "raw nng tcp": ("C0", "--", "x"),
    "raw nng ipc": ("C1", "--", "x"), "gRPC tcp": ("C0", ":", "s"),
    "gRPC unix socket": ("C1", ":", "s"), "memcpy": ("C2", "--", "x"),
}


def read_rows(path):
    """{op: {series: {MiB: GB/s}}} from the JSON lines in path."""
    out = {"put": {}, "get": {}}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue  # a "skipped" note or a stray line is not a row
            try:
                row = json.loads(line)
            except ValueError as e:
                raise SystemExit("bench/run --plot: %s:%d: not JSON: %s" % (path, n, e))
            if row.get("unit") != "GB/s":
                continue
            for pattern, key, label in SERIES:
                m = re.match(pattern, str(row.get("bench", "")))
                if m and isinstance(row.get(key), (int, float)):
                    t = m.group(3) if m.lastindex >= 3 else ""
                    # the gRPC peer's "ipc" rows run over a unix socket
                    series = label.format(t=t).replace("gRPC ipc", "gRPC unix socket")
                    out[m.group(1)].setdefault(series, {})[int(m.group(2))] = row[key]
    return out


def plot(rows_path, png_path, title=None):
    import matplotlib
    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    data = read_rows(rows_path)
    if not any(data.values()):
        raise SystemExit("bench/run --plot: %s has no transfer rows (put_NMiB_tcp, "
                         "*_vs_grpc, put_shm_NMiB_vs_memcpy): run bench/run transfer" % rows_path)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, op in zip(axes, ("put", "get")):
        for series in sorted(data[op], key=lambda s: (not s.startswith("tensorport"), s)):
            points = sorted(data[op][series].items())
            color, dash, marker = STYLE.get(series, ("C7", "-.", "."))
            ax.plot([p[0] for p in points], [p[1] for p in points], color=color, linestyle=dash,
                    marker=marker, label=series)
        ax.set_xscale("log", base=2)
        sizes = sorted({mib for s in data[op].values() for mib in s})
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_yscale("log")  # sockets (~1 GB/s) and regions (~10) on one axis
        ax.set_xlabel("tensor size (MiB)")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        if data[op]:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("throughput (GB/s, log scale)")
    fig.suptitle(title or "bench/run transfer: tensorport and its baselines, same run")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def main(argv):
    if len(argv) not in (2, 3):
        raise SystemExit("usage: bench/run --plot ROWS.jsonl OUT.png [TITLE]")
    plot(argv[0], argv[1], argv[2] if len(argv) == 3 else None)
