#!/usr/bin/env bash
# The container test (make test-container): builds tportd's image with Podman
# and runs it as it is deployed, then checks it from the host.
#  1. installs what it needs (Debian packages: podman, runc, catatonit,
#     podman-compose, mmdebstrap, yamllint, systemd's systemd-analyze) and
#     the host's tport if missing;
#  2. builds the image as `make image` does (deploy/build-image.sh: the base
#     image once, then deploy/Containerfile) and checks its configuration
#     (non-root user, EXPOSE, STOPSIGNAL, HEALTHCHECK, its libraries);
#  3. runs it the realistic way: its own network namespace, listening off
#     loopback, so TLS and an auth file (Podman secrets) and a client secret;
#     read-only root filesystem; ports published on the host's loopback;
#  4. waits for the image's HEALTHCHECK, puts and gets tensors with the host's
#     tport and compares bytes, refuses a wrong secret, scrapes /metrics and
#     checks the names and that the counters moved, reads the JSON logs;
#  5. SIGTERM (podman stop): exit status 0 within the grace period;
#  6. `podman kube play` of the DaemonSet's pod spec (a Deployment rendering:
#     Podman 4.3 plays Pods and Deployments) with its ConfigMap, the Secret's
#     files and the init container that copies them, and a put/get through it;
#  7. deploy/compose.yaml brought up with podman-compose: healthy, put/get,
#     /metrics, exit 0 on SIGTERM;
#  8. yamllint on the manifests and the compose file, systemd-analyze verify
#     (and security) on the unit.
# Nothing of the machine's is changed but the packages and Podman's images
# (tensorport-base, tensorport/tportd:test and :test-build are kept as the
# cache of the next run); containers, pods, secrets and files are removed on exit (KEEP=1
# keeps them).  Environment: BUILD (the host build, default build), IMAGE.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD="${BUILD:-build}"
IMAGE="${IMAGE:-localhost/tensorport/tportd:test}"
NAME=tport-ctest
T0=$SECONDS
step() { printf '\n== [%3ds] %s\n' $((SECONDS - T0)) "$*"; }
fail() {
  echo "test-container: FAIL: $*" >&2
  exit 1
}

# ------------------------------------------------------------ 1. set-up
step "packages"
pkgs=(podman runc catatonit podman-compose mmdebstrap yamllint systemd curl openssl python3 python3-numpy python3-yaml)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$(id -u)" -eq 0 ] || fail "runs rootful Podman: run as root"
# Debian's python3, whose numpy and yaml the packages above are (not a pyenv's)
PY=/usr/bin/python3

work="$(mktemp -d /tmp/tport-ctest.XXXXXX)"
cleanup() {
  rc=$?
  if [ "${KEEP:-0}" = 1 ]; then
    echo "KEEP=1: left $NAME, pod $NAME-kube-pod-0, secrets $NAME-*, $work"
    exit $rc
  fi
  if [ $rc -ne 0 ] && podman container exists "$NAME" 2>/dev/null; then
    echo "--- logs of $NAME"; podman logs --tail 30 "$NAME" 2>&1 || true
  fi
  podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  for _ in 1 2 3; do podman pod rm -f -t 0 "$NAME-kube-pod-0" >/dev/null 2>&1 && break; sleep 2; done
  podman pod rm -f -t 0 "$NAME-shm" >/dev/null 2>&1 || true
  podman rm -f -t 0 "$NAME-compose_tportd_1" >/dev/null 2>&1 || true
  podman network rm -f "$NAME-compose_default" >/dev/null 2>&1 || true
  for s in auth crt key; do podman secret rm "$NAME-$s" >/dev/null 2>&1 || true; done
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT INT TERM

# Podman's health check timers need systemd, absent here: drop the noise
# (the test runs the checks itself); every other message goes through.
podman() { command podman "$@" 2> >(grep -v 'unable to get systemd connection' >&2); }

# Podman here: runc (crun fails: "cgroups in hybrid mode not supported"),
# cgroupfs, and containers' rlimits within the host's hard limits (a rootful
# container may not raise them; Podman's default nofile is above them).
hn="$(ulimit -Hn)"; [ "$hn" = unlimited ] && hn=1048576
hu="$(ulimit -Hu)"; [ "$hu" = unlimited ] && hu=4096
nofile=$((hn < 65536 ? hn : 65536))
nproc=$((hu < 4096 ? hu : 4096))
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$work/containers.conf"
ULIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

# the host's tport (the client) and tportd (for systemd-analyze verify)
TPORT="$ROOT/$BUILD/bin/tport"
if [ ! -x "$TPORT" ] || [ ! -x "$ROOT/$BUILD/bin/tportd" ]; then
  step "the host's tport and tportd ($BUILD/bin)"
  make -s deps
  [ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target tport-cli tportd >/dev/null
fi

# free ports on the host's loopback
read -r P_DATA P_HTTP P_KDATA P_KHTTP < <("$PY" - <<'EOF'
import socket
ss = [socket.socket() for _ in range(4)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
EOF
)

# ------------------------------------------------------------ 2. the image
step "podman build ($IMAGE): deploy/build-image.sh, as make image runs it"
tb=$SECONDS
PODMAN_BUILD_OPTS="${ULIMITS[*]}" ./deploy/build-image.sh "$IMAGE" || fail "deploy/build-image.sh"
echo "built in $((SECONDS - tb)) s; $(podman image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

podman image inspect "$IMAGE" >"$work/image.json"
"$PY" - "$work/image.json" <<'EOF' || fail "image configuration"
import json, sys
img = json.load(open(sys.argv[1]))[0]
cfg = img.get("Config") or {}
hc = img.get("Healthcheck") or img.get("HealthCheck") or cfg.get("Healthcheck") or {}
checks = {
    "USER 10001 (non-root)": cfg.get("User", "").split(":")[0] == "10001",
    "EXPOSE 7450/tcp 9450/tcp": {"7450/tcp", "9450/tcp"} <= set(cfg.get("ExposedPorts") or {}),
    "STOPSIGNAL SIGTERM": cfg.get("StopSignal") in ("SIGTERM", "15", "TERM"),
    "HEALTHCHECK on /healthz": "/healthz" in " ".join(hc.get("Test") or []),
    "TPORT_* defaults": any(e.startswith("TPORT_LISTEN=") for e in cfg.get("Env") or []),
}
for what, ok in checks.items():
    print(("ok   " if ok else "FAIL ") + what)
sys.exit(0 if all(checks.values()) else 1)
EOF
# every library of tportd and tport is in the image
podman run --rm --network none --no-healthcheck --entrypoint /bin/sh "$IMAGE" -c \
  'ldd /usr/local/bin/tportd /usr/local/bin/tport' >"$work/ldd.txt"
! grep -q "not found" "$work/ldd.txt" || { cat "$work/ldd.txt"; fail "a library is missing in the image"; }
echo "ok   libraries: $(awk '/=>/{print $1}' "$work/ldd.txt" | sort -u | tr '\n' ' ')"

# ------------------------------------------------------------ 3. run it
step "secrets: auth file, TLS certificate, client secret"
umask 077
openssl rand -hex 32 >"$work/alice.key"
openssl rand -hex 32 >"$work/operator.key"
openssl rand -hex 32 >"$work/wrong.key"
printf 'alice %s\noperator %s\n' "$(cat "$work/alice.key")" "$(cat "$work/operator.key")" >"$work/tportd.auth"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=tportd \
  -addext subjectAltName=DNS:tportd,DNS:tportd.tensorport.svc,IP:127.0.0.1 \
  -keyout "$work/tportd.key" -out "$work/tportd.crt" 2>/dev/null
umask 022
for s in auth crt key; do
  podman secret rm "$NAME-$s" >/dev/null 2>&1 || true
  podman secret create "$NAME-$s" "$work/tportd.$s" >/dev/null
done

step "podman run (read-only, user 10001, tls+tcp on 0.0.0.0 in its network namespace)"
GRACE_MS=5000
t_run=$SECONDS
podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
podman run -d --name "$NAME" "${ULIMITS[@]}" \
  --read-only --cap-drop ALL --security-opt no-new-privileges \
  --tmpfs /run/secrets:size=64k \
  -p "127.0.0.1:$P_DATA:7450" -p "127.0.0.1:$P_HTTP:9450" \
  --secret "$NAME-auth,type=mount,target=tportd.auth,uid=10001,gid=10001,mode=0400" \
  --secret "$NAME-crt,type=mount,target=tportd.crt,mode=0444" \
  --secret "$NAME-key,type=mount,target=tportd.key,uid=10001,gid=10001,mode=0400" \
  -e TPORT_DEVICES=cpu,sim:2 -e TPORT_ADMIN=operator -e TPORT_GRACE_MS=$GRACE_MS \
  --health-interval disable \
  "$IMAGE" >/dev/null
# (--tmpfs /run/secrets: Podman 4.3 mounts secrets before the /run tmpfs of
# --read-only, on the read-only root, and fails (containers/podman#15541).
# --health-interval disable: no systemd here for Podman's health timers; the
# test runs the image's HEALTHCHECK itself with `podman healthcheck run`.)

# ------------------------------------------------------------ 4. check it
step "health check (the image's HEALTHCHECK, run by podman)"
healthy=0
for _ in $(seq 1 60); do
  if [ "$(podman inspect -f '{{.State.Running}}' "$NAME")" != true ]; then
    podman logs "$NAME" 2>&1 | tail -20
    fail "tportd exited: $(podman inspect -f '{{.State.ExitCode}}' "$NAME")"
  fi
  if podman healthcheck run "$NAME" >/dev/null 2>&1; then healthy=1; break; fi
  sleep 1
done
[ $healthy = 1 ] || fail "not healthy within 60 s"
echo "ok   healthy $((SECONDS - t_run)) s after podman run"
for ep in healthz readyz; do
  code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_HTTP/$ep")"
  [ "$code" = 200 ] || fail "/$ep: HTTP $code"
  echo "ok   /$ep 200 from the host"
done
podman exec "$NAME" sh -c 'id -u; touch /probe 2>/dev/null && echo writable || echo read-only' >"$work/exec.txt"
[ "$(sed -n 1p "$work/exec.txt")" = 10001 ] || fail "tportd runs as uid $(sed -n 1p "$work/exec.txt")"
[ "$(sed -n 2p "$work/exec.txt")" = read-only ] || fail "the root filesystem is writable"
echo "ok   runs as uid 10001 on a read-only root filesystem"

step "put and get through the container (the host's tport, tls+tcp, alice's secret)"
tport() {
  timeout 60 "$TPORT" --url "tls+tcp://127.0.0.1:$1" --tls-ca "$work/tportd.crt" \
    --tls-server-name tportd --tenant "$2" --secret-file "$work/$3.key" "${@:4}"
}
"$PY" - "$work" <<'EOF'
import numpy as np, sys
rng = np.random.default_rng(7)
# 6 MiB: more than one 4 MiB chunk each way
np.save(sys.argv[1] + "/x.npy", rng.standard_normal((2, 3, 512, 512), dtype=np.float32))
EOF
tport "$P_DATA" alice alice put "$work/x.npy" --name x --device sim:0 >/dev/null
tport "$P_DATA" alice alice get x "$work/x_back.npy" >/dev/null
tport "$P_DATA" alice alice put "$work/x.npy" --name h --device sim:1 --dtype float16 \
  --memory-format channels_last >/dev/null
tport "$P_DATA" alice alice get h "$work/h_back.npy" >/dev/null
"$PY" - "$work" <<'EOF' || fail "bytes differ"
import numpy as np, sys
w = sys.argv[1]
x = np.load(w + "/x.npy")
back = np.load(w + "/x_back.npy")
assert back.dtype == x.dtype and back.shape == x.shape, (back.dtype, back.shape)
assert back.tobytes() == x.tobytes(), "x: the bytes that came back differ"
h = np.load(w + "/h_back.npy")
assert h.dtype == np.float16 and h.shape == x.shape, (h.dtype, h.shape)
assert h.tobytes() == x.astype(np.float16).tobytes(), "h: float16 differs from NumPy's"
print("ok   %d bytes back identical; float16 channels_last conversion bit-exact" % x.nbytes)
EOF
tport "$P_DATA" alice alice ls | grep -q '\bx\b' || fail "tport ls does not list x"
if tport "$P_DATA" alice wrong devices >/dev/null 2>&1; then fail "a wrong secret was accepted"; fi
echo "ok   a wrong secret is refused"
if timeout 20 "$TPORT" --url "tcp://127.0.0.1:$P_DATA" --tenant alice devices >/dev/null 2>&1; then
  fail "plain tcp was accepted"
fi
echo "ok   plain tcp:// is refused"

step "/metrics"
curl -fsS "http://127.0.0.1:$P_HTTP/metrics" >"$work/metrics.txt" || fail "GET /metrics"
"$PY" - "$work/metrics.txt" "$(stat -c %s "$work/x.npy")" <<'EOF' || fail "metrics"
import re, sys
text = open(sys.argv[1]).read()
nbytes = int(sys.argv[2])
line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)( \d+)?$')
samples, types, bad = [], {}, []
for ln in text.splitlines():
    if ln.startswith("# TYPE "):
        _, _, name, kind = ln.split(None, 3)
        types[name] = kind
    elif ln.startswith("#") or not ln.strip():
        continue
    else:
        m = line_re.match(ln)
        if not m:
            bad.append(ln)
            continue
        samples.append((m.group(1), m.group(2) or "", float(m.group(3))))
if bad:
    sys.exit("not exposition format: %r" % bad[:3])
names = {s[0] for s in samples}
def has(prefix):
    return any(n == prefix or n.startswith(prefix) for n in names)
want = ["tport_requests_total", "tport_request_duration_seconds_bucket",
        "tport_transfer_bytes_total", "tport_stage_duration_seconds_bucket",
        "tport_connections", "tport_uploads_in_progress", "tport_tensors",
        "tport_tensor_bytes", "tport_tenant_bytes", "tport_device_memory_bytes",
        "tport_staging_", "tport_kernel_cache_", "tport_build_info"]
missing = [w for w in want if not has(w)]
for w in want:
    print(("ok   " if w not in missing else "FAIL ") + w)
def total(name, cond=lambda labels: True):
    return sum(v for n, l, v in samples if n == name and cond(l))
moved = {
    "tport_transfer_bytes_total counted the bytes (>= 3 x 6 MiB)": total("tport_transfer_bytes_total") >= 3 * nbytes,
    "tport_requests_total counted the requests": total("tport_requests_total") >= 6,
    # --metrics-tenants hash (the default): alice's bytes under a keyed hash, never her name
    "tport_tenant_bytes > 0 under a hashed tenant label": total("tport_tenant_bytes", lambda l: re.fullmatch(r'\{tenant="[0-9a-f]{16}"\}', l) is not None) > 0,
    "no tenant's name in /metrics": 'alice' not in text and 'tenant="operator"' not in text,
    "tport_tensors >= 2": total("tport_tensors") >= 2,
    "histogram and counter TYPEs declared": types.get("tport_request_duration_seconds") == "histogram"
        and types.get("tport_requests_total") == "counter",
}
for what, ok in moved.items():
    print(("ok   " if ok else "FAIL ") + what)
sys.exit(1 if missing or not all(moved.values()) else 0)
EOF

step "logs (TPORT_LOG_FORMAT=json in the image)"
podman logs "$NAME" >"$work/logs.txt" 2>&1
"$PY" - "$work/logs.txt" <<'EOF' || fail "logs are not JSON lines"
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip()]
assert lines, "no log lines"
for l in lines:
    assert isinstance(json.loads(l), dict), l
print("ok   %d log lines, each a JSON object" % len(lines))
EOF

# ------------------------------------------------------------ 5. SIGTERM
step "SIGTERM (podman stop): exit 0 within the grace period"
ts=$(date +%s%N)
podman stop -t $((GRACE_MS / 1000 + 10)) "$NAME" >/dev/null
ms=$((($(date +%s%N) - ts) / 1000000))
code="$(podman inspect -f '{{.State.ExitCode}}' "$NAME")"
[ "$code" = 0 ] || { podman logs --tail 10 "$NAME"; fail "exit status $code after SIGTERM"; }
[ $ms -le $((GRACE_MS + 1500)) ] || fail "stopped after $ms ms: over grace $GRACE_MS ms + 1.5 s"
echo "ok   exit status 0, $ms ms after SIGTERM (grace $GRACE_MS ms)"

# ------------------------------------------------------------ 6. kube play
step "podman kube play: the DaemonSet's pod spec as a Deployment, with its ConfigMap"
# The Secret's three files, as a Secret volume shows them to the pod's user
# (Kubernetes: 0440 root:fsGroup; here 0444).  Podman 4.3.1 cannot mount a
# Secret volume (kube play panics in VolumeFromSecret on any), so the
# rendering mounts this folder in its place (hostPath).
mkdir -p "$work/secret-volume"
cp "$work/tportd.auth" "$work/tportd.crt" "$work/tportd.key" "$work/secret-volume/"
chmod 755 "$work" "$work/secret-volume"
chmod 444 "$work/secret-volume/"*
"$PY" - "$ROOT/deploy/k8s" "$work" "$IMAGE" "$NAME-kube" "$P_KDATA" "$P_KHTTP" <<'EOF'
# What differs from a node of a cluster, and only that: no GPU here (node
# selector, tolerations and the nvidia.com/gpu limit go), the image is the
# one just built, the host ports are free ones on loopback, the Secret
# volume is a hostPath (above), and the init container is kept (below).
import sys, yaml
k8s, w, image, name, pdata, phttp = sys.argv[1:]
ds = yaml.safe_load(open(k8s + "/daemonset.yaml"))
assert ds["kind"] == "DaemonSet"
tmpl = ds["spec"]["template"]
spec = tmpl["spec"]
spec.pop("nodeSelector", None)
spec.pop("tolerations", None)
for c in spec.get("initContainers", []) + spec["containers"]:
    c["image"] = image
    lim = c.get("resources", {}).get("limits", {})
    lim.pop("nvidia.com/gpu", None)
    for p in c.get("ports", []):
        if p["name"] == "data":
            p["hostPort"], p["hostIP"] = int(pdata), "127.0.0.1"
        if p["name"] == "http":
            p["hostPort"], p["hostIP"] = int(phttp), "127.0.0.1"
# Podman 4.3 removes a finished init container ("once") before it has seen
# it stop, sometimes, and gives up: keep it ("always")
keep_init = {"io.podman.annotations.init.container.type": "always"}
secret_volumes = [v for v in spec["volumes"] if "secret" in v]
assert len(secret_volumes) == 1, secret_volumes
for v in secret_volumes:
    del v["secret"]
    v["hostPath"] = {"path": w + "/secret-volume", "type": "Directory"}
dep = {"apiVersion": "apps/v1", "kind": "Deployment",
       "metadata": {"name": name, "labels": ds["metadata"]["labels"], "annotations": keep_init},
       "spec": {"replicas": 1, "selector": ds["spec"]["selector"], "template": tmpl}}
yaml.safe_dump(dep, open(w + "/kube.yaml", "w"), sort_keys=False)
EOF
cp "$ROOT/deploy/k8s/configmap.yaml" "$work/configmap.yaml"
podman kube play --replace --configmap "$work/configmap.yaml" "$work/kube.yaml" >"$work/play.log" 2>&1 || {
  cat "$work/play.log"
  fail "podman kube play"
}
ready=0
for _ in $(seq 1 60); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_KHTTP/readyz")" = 200 ] && { ready=1; break; }
  sleep 1
done
if [ $ready != 1 ]; then
  podman pod ps; podman ps -a --pod
  for c in $(podman ps -a --pod --filter "pod=$NAME-kube-pod-0" --format '{{.Names}}'); do
    echo "--- $c"; podman logs --tail 20 "$c" 2>&1 || true
  done
  fail "the kube pod is not ready within 60 s"
fi
echo "ok   the pod's tportd is ready (/readyz 200)"
tport "$P_KDATA" alice alice put "$work/x.npy" --name k >/dev/null
tport "$P_KDATA" alice alice get k "$work/k_back.npy" >/dev/null
cmp -s <("$PY" -c 'import numpy as np,sys; sys.stdout.buffer.write(np.load(sys.argv[1]).tobytes())' "$work/x.npy") \
  <("$PY" -c 'import numpy as np,sys; sys.stdout.buffer.write(np.load(sys.argv[1]).tobytes())' "$work/k_back.npy") ||
  fail "kube pod: the bytes that came back differ"
echo "ok   put and get through the kube pod (secrets copied by its init container)"
kctr="$NAME-kube-pod-0-tportd"
podman inspect "$kctr" >"$work/kctr.json"
"$PY" - "$work/kctr.json" <<'EOF' || fail "the kube pod's container"
import json, sys
c = json.load(open(sys.argv[1]))[0]
env = c["Config"]["Env"]
checks = {
    "runs as 10001": c["Config"]["User"].split(":")[0] == "10001",
    "read-only root filesystem": c["HostConfig"]["ReadonlyRootfs"],
    "flags from the ConfigMap (TPORT_GRACE_MS=20000)": "TPORT_GRACE_MS=20000" in env,
    "all capabilities dropped": not c["EffectiveCaps"],
}
for what, ok in checks.items():
    print(("ok   " if ok else "FAIL ") + what)
sys.exit(0 if all(checks.values()) else 1)
EOF
# the probes as the kubelet makes them (Podman would run curl in the image)
for ep in healthz readyz; do
  code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_KHTTP/$ep")"
  [ "$code" = 200 ] || fail "kube pod: /$ep: HTTP $code"
done
echo "ok   the probes' /healthz and /readyz answer 200"
ts=$(date +%s%N)
podman pod stop -t 30 "$NAME-kube-pod-0" >/dev/null
ms=$((($(date +%s%N) - ts) / 1000000))
code="$(podman inspect -f '{{.State.ExitCode}}' "$kctr")"
[ "$code" = 0 ] || fail "the kube pod's tportd: exit status $code after SIGTERM"
[ $ms -le 21500 ] || fail "the kube pod stopped after $ms ms: over its grace"
echo "ok   the kube pod's tportd exits 0, $ms ms after SIGTERM"
# (a removal here sometimes meets "device or resource busy" on the shm
# mount: try again; it is not what is tested)
for _ in 1 2 3; do podman pod rm -f "$NAME-kube-pod-0" >/dev/null 2>&1 && break; sleep 2; done

# ------------------------------------------------------------ 6b. shm pod
step "podman kube play: deploy/k8s/shm-pod.example.yaml (a client beside tportd, shared memory)"
# What differs from a cluster: the image is the one just built, and the
# emptyDir volumes are folders made here as a cluster makes them with
# fsGroup 10001 (group 10001, setgid, group-writable): Podman 4.3 makes an
# emptyDir root's.
mkdir -p "$work/shm-run" "$work/shm-work"
chown 10001:10001 "$work/shm-run" "$work/shm-work"
chmod 2770 "$work/shm-run" "$work/shm-work"
"$PY" - "$ROOT/deploy/k8s/shm-pod.example.yaml" "$work" "$IMAGE" "$NAME-shm" <<'EOF'
import sys, yaml
src, w, image, name = sys.argv[1:]
pod = yaml.safe_load(open(src))
assert pod["kind"] == "Pod"
pod["metadata"]["name"] = name
pod["metadata"].pop("namespace", None)
for c in pod["spec"]["containers"]:
    c["image"] = image
host = {"run-tportd": w + "/shm-run", "work": w + "/shm-work"}
for v in pod["spec"]["volumes"]:
    assert "emptyDir" in v, v
    del v["emptyDir"]
    v["hostPath"] = {"path": host[v["name"]], "type": "Directory"}
yaml.safe_dump(pod, open(w + "/shm-pod.yaml", "w"), sort_keys=False)
EOF
podman kube play --replace "$work/shm-pod.yaml" >"$work/shm-play.log" 2>&1 || {
  cat "$work/shm-play.log"
  fail "podman kube play (shm pod)"
}
sctr="$NAME-shm-client"
slogs() { for c in "$NAME-shm-tportd" "$sctr"; do echo "--- $c"; podman logs --tail 20 "$c" 2>&1 || true; done; }
finished=0
for _ in $(seq 1 60); do
  [ "$(podman inspect -f '{{.State.Status}}' "$sctr" 2>/dev/null)" = exited ] && { finished=1; break; }
  sleep 1
done
[ $finished = 1 ] || { slogs; fail "the shm pod's client did not finish within 60 s"; }
[ "$(podman inspect -f '{{.State.ExitCode}}' "$sctr")" = 0 ] || { slogs; fail "the shm pod's client failed"; }
podman logs "$sctr" 2>&1 | grep -q "bytes identical" || { slogs; fail "the shm pod's client said nothing"; }
podman exec "$NAME-shm-tportd" busybox wget -q -O - http://127.0.0.1:9450/metrics >"$work/shm-metrics.txt" ||
  fail "the shm pod's /metrics"
"$PY" - "$work/shm-metrics.txt" "$work/shm-run" <<'EOF' || { slogs; fail "the shm pod"; }
import os, re, stat, sys
text = open(sys.argv[1]).read()
n = sum(float(v) for v in re.findall(r"^tport_shm_transfers_total(?:\{[^}]*\})? (\S+)$", text, re.M))
modes = {f: stat.S_IMODE(os.stat(os.path.join(sys.argv[2], f)).st_mode)
         for f in ("tportd.sock", "shm.sock")}
checks = {
    "the put and the get went through shared memory (tport_shm_transfers_total %d)" % n: n >= 2,
    "sockets mode 660 (%s)" % {f: oct(m) for f, m in modes.items()}:
        all(m == 0o660 for m in modes.values()),
}
for what, ok in checks.items():
    print(("ok   " if ok else "FAIL ") + what)
sys.exit(0 if all(checks.values()) else 1)
EOF
echo "ok   the shm pod's client (uid 10002, group 10001) put and got 1 MiB through tportd's sockets"
for _ in 1 2 3; do podman pod rm -f -t 5 "$NAME-shm" >/dev/null 2>&1 && break; sleep 2; done

# ------------------------------------------------------------ 7. compose
step "compose: deploy/compose.yaml with podman-compose"
# the secrets as the file says: auth file and key owned by uid 10001, mode 600
mkdir -p "$work/compose-secrets"
cp "$work/tportd.auth" "$work/tportd.crt" "$work/tportd.key" "$work/compose-secrets/"
chmod 644 "$work/compose-secrets/tportd.crt"
chmod 600 "$work/compose-secrets/tportd.auth" "$work/compose-secrets/tportd.key"
chown 10001:10001 "$work/compose-secrets/tportd.auth" "$work/compose-secrets/tportd.key"
compose() {
  TPORT_IMAGE="$IMAGE" TPORT_DATA_PORT="127.0.0.1:$P_DATA" TPORT_HTTP_PORT="$P_HTTP" \
    TPORT_SECRETS="$work/compose-secrets" podman-compose -f "$ROOT/deploy/compose.yaml" -p "$NAME-compose" "$@"
}
compose up -d >"$work/compose.log" 2>&1 || { cat "$work/compose.log"; fail "podman-compose up"; }
cctr="$NAME-compose_tportd_1"
ready=0
for _ in $(seq 1 30); do
  podman healthcheck run "$cctr" >/dev/null 2>&1 && { ready=1; break; }
  sleep 1
done
[ $ready = 1 ] || { podman logs "$cctr" 2>&1 | tail; fail "the compose service is not healthy within 30 s"; }
tport "$P_DATA" alice alice put "$work/x.npy" --name c >/dev/null
tport "$P_DATA" alice alice get c "$work/c_back.npy" >/dev/null
cmp -s <("$PY" -c 'import numpy as np,sys; sys.stdout.buffer.write(np.load(sys.argv[1]).tobytes())' "$work/x.npy") \
  <("$PY" -c 'import numpy as np,sys; sys.stdout.buffer.write(np.load(sys.argv[1]).tobytes())' "$work/c_back.npy") ||
  fail "compose: the bytes that came back differ"
curl -fsS -o "$work/compose-metrics.txt" "http://127.0.0.1:$P_HTTP/metrics" || fail "compose: /metrics"
grep -q '^tport_build_info' "$work/compose-metrics.txt" || fail "compose: no tport_build_info in /metrics"
[ "$(podman inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$cctr")" = true ] || fail "compose: writable root"
podman inspect "$cctr" >"$work/cctr.json"
"$PY" - "$work/cctr.json" <<'EOF' || fail "compose: limits"
import json, sys
h = json.load(open(sys.argv[1]))[0]["HostConfig"]
def ulimit(name):
    u = [u for u in h.get("Ulimits") or [] if u["Name"] in ("RLIMIT_" + name.upper(), name)]
    return (u[0]["Soft"], u[0]["Hard"]) if u else None
checks = {
    "memory limit 8g": h.get("Memory") == 8 << 30,
    "4 CPUs": h.get("NanoCpus") == 4_000_000_000
              or (h.get("CpuQuota"), h.get("CpuPeriod")) == (400000, 100000),
    # podman-compose 1.0.3 does not pass pids_limit (Docker's compose does);
    # there the nproc limit bounds the threads of tportd's user
    "pids limit 4096, or nproc 4096": h.get("PidsLimit") == 4096 or ulimit("nproc") == (4096, 4096),
    "nofile 20000": ulimit("nofile") == (20000, 20000),
}
for what, ok in checks.items():
    print(("ok   " if ok else "FAIL ") + "compose: " + what)
sys.exit(0 if all(checks.values()) else 1)
EOF
podman stop -t 15 "$cctr" >/dev/null
code="$(podman inspect -f '{{.State.ExitCode}}' "$cctr")"
[ "$code" = 0 ] || fail "compose: exit status $code after SIGTERM"
echo "ok   healthy, put/get bytes identical, /metrics, read-only, exit 0 on SIGTERM"
compose down >/dev/null 2>&1 || true

# ------------------------------------------------------------ 8. lint
step "yamllint, systemd-analyze"
yamllint -s -d '{extends: default, rules: {document-start: disable, line-length: {max: 110}}}' \
  deploy/compose.yaml deploy/k8s/
echo "ok   yamllint deploy/compose.yaml deploy/k8s/"
# verify wants ExecStart's program to exist: the host build's, in a copy
sed "s|^ExecStart=/usr/local/bin/tportd|ExecStart=$ROOT/$BUILD/bin/tportd|" \
  deploy/systemd/tportd.service >"$work/tportd.service"
systemd-analyze verify "$work/tportd.service"
echo "ok   systemd-analyze verify deploy/systemd/tportd.service"
systemd-analyze security --offline=yes --threshold=30 "$work/tportd.service" | tail -1
cp deploy/systemd/tensorport.sysusers "$work/tensorport.conf"
systemd-sysusers --dry-run "$work/tensorport.conf" >/dev/null 2>&1 || fail "systemd-sysusers: tensorport.sysusers"
echo "ok   systemd-sysusers --dry-run deploy/systemd/tensorport.sysusers"

step "passed in $((SECONDS - T0)) s"
