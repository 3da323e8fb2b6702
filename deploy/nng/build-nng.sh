#!/usr/bin/env bash
# Builds the nng tensorport links: Debian 12's nng 1.5.2 source package
# (libnng-dev's version and Debian's own patches) plus our numbered series
# deploy/nng/0*.patch, in order, and TLS buffers of four records each way
# set by compile-time definitions (no patch).  deploy/nng/README.md says what
# each patch does and why, its upstream status, the contract tensorport
# relies on, and what moving to a newer nng would take.
#
# Installs a static, position-independent libnng with its headers and CMake
# package under PREFIX (default /opt/tensorport/nng), once per series (a
# stamp file names the hash of the patches and this script).
#
# `build-nng.sh --sanitize thread [PREFIX]` builds the same nng instrumented
# for ThreadSanitizer (default PREFIX /opt/tensorport/nng-tsan), which the
# TPORT_SANITIZE=thread build links (make test-tsan): TSan cannot see the
# atomics nng hands messages between threads with in code it did not
# compile.  TLS is built with the "none" engine: tensorport registers its
# own (OpenSSL).  Needs root for apt (deb-src) and dpkg-dev.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
sanitize=""
if [ "${1:-}" = "--sanitize" ]; then
  sanitize="${2:?--sanitize needs a sanitizer (thread)}"
  shift 2
  case "$sanitize" in
    thread) ;;
    *) echo "build-nng: --sanitize $sanitize: only thread is supported" >&2; exit 2 ;;
  esac
fi
PREFIX="${1:-/opt/tensorport/nng${sanitize:+-tsan}}"
patches=("$here"/0*.patch) # the glob sorts: 0001 first
# the contents only: sha256sum's own output names the files, and a stamp
# that hashed their paths made every checkout rebuild (and replace) the nng
# that the others link
patch_id="$(cat "${patches[@]}" "$0" | sha256sum | cut -c1-16)"
stamp="$PREFIX/.tensorport-nng-${sanitize:+$sanitize-}$patch_id"
if [ -f "$stamp" ]; then
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
work="$(mktemp -d)"
src_list=/etc/apt/sources.list.d/tensorport-nng-src.sources
cleanup() {
  $SUDO rm -f "$src_list"
  rm -rf "$work"
}
trap cleanup EXIT

echo "build-nng: fetching Debian's nng 1.5.2 source package"
# the same mirror as the machine's own Debian sources
uri="$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | awk '{print $2}' || true)"
uri="${uri:-http://deb.debian.org/debian}"
printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  "$uri" | $SUDO tee "$src_list" >/dev/null
$SUDO apt-get update -qq -o Dir::Etc::sourcelist="$src_list" -o Dir::Etc::sourceparts=- \
  -o APT::Get::List-Cleanup=0
(cd "$work" && apt-get source -qq nng=1.5.2-2 2>/dev/null)
cd "$work/nng-1.5.2"
for p in "${patches[@]}"; do
  patch -p1 -s < "$p"
done

# A TLS connection's send and receive buffers (tls_common.c; 16 KiB, one
# record, by default): with one record buffered, every record of a stream
# waited for a task-thread hand-off.  1.5.2's guard of the receive size is
# misspelt (#ifndef NNG_TLX_MAX_RECV_SIZE): defining that name too skips the
# file's own #define, so NNG_TLS_MAX_RECV_SIZE keeps ours.
tls_buf=$((64 * 1024))
cflags="-DNNG_TLS_MAX_SEND_SIZE=$tls_buf -DNNG_TLS_MAX_RECV_SIZE=$tls_buf -DNNG_TLX_MAX_RECV_SIZE=$tls_buf"
extra=()
if [ -n "$sanitize" ]; then
  # NNG_RACE_DETECTOR: nng's own switch that takes a lock around the
  # debugging checks nni_aio_begin makes without one (aio.c says race
  # detectors should)
  extra=("-DNNG_SANITIZER=$sanitize")
  cflags="$cflags -DNNG_RACE_DETECTOR -fno-omit-frame-pointer"
fi
echo "build-nng: building (static, PIC${sanitize:+, -fsanitize=$sanitize}) into $PREFIX"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=OFF "${extra[@]}" \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DNNG_TESTS=OFF -DNNG_TOOLS=OFF \
  -DNNG_ENABLE_NNGCAT=OFF -DNNG_ENABLE_TLS=ON -DNNG_TLS_ENGINE=none \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" >/dev/null
cmake --build build -j "$(nproc)" >/dev/null 2>&1
$SUDO rm -rf "$PREFIX"
$SUDO cmake --install build >/dev/null
$SUDO touch "$stamp"
echo "build-nng: done"
