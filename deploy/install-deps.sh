#!/usr/bin/env bash
# Installs tensorport's build and test dependencies from Debian's packages.
# Idempotent: packages already present are skipped, and apt is only touched
# when something is missing.  Run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libnng-dev                       # transport (REQ/REP, tcp/ipc/inproc)
  libprotobuf-c-dev protobuf-c-compiler
  libssl-dev                       # TLS engine, HMAC, RAND_bytes
  uthash-dev                       # hash tables of the registry (header-only)
  libisal-dev                      # ISA-L: CRC32C of chunks (--verify)
  libmicrohttpd-dev                # tportd's HTTP endpoint: /metrics, /healthz, /readyz
  dpkg-dev patch                   # deploy/nng/build-nng.sh: nng's Debian source, our fix
  libcriterion-dev                 # test framework
  libdlpack-dev                    # DLPack in/out for libtport
  python3 python3-torch python3-numpy   # differential tests and benchmark baselines
  python3-pytest python3-venv python3-setuptools python3-wheel python3-tqdm
                                   # python/: the tensorport package, its tests, its venv install
  python3-prometheus-client        # tests/deploy/check_metrics.py: /metrics as Prometheus parses it
  python3-matplotlib               # bench/run --plot: the transfer rows as docs/bench.png
  clang libclang-rt-14-dev llvm    # make fuzz: libFuzzer + ASan/UBSan runtimes, llvm-symbolizer
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
                                   # bench/peers/grpc: the gRPC C++ peer of bench/run transfer
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# nng 1.5.2 with our fix for nanomsg/nng#1636 (once; a stamp says it is done)
"$(dirname "$0")/nng/build-nng.sh"
