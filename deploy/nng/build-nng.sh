#!/usr/bin/env bash
# Builds the nng tensorport links with: Debian 12's own nng 1.5.2 source
# package (the version and patches of libnng-dev), plus closed-pipe-io.patch,
# our fixes for connections that close under load:
# - nanomsg/nng#1636 (fixed upstream in 1.6.0): a tcp, ipc or tls pipe closed
#   while a message is between two reads or writes leaves an operation that
#   never completes, and nng's single reaper thread then waits for it for
#   ever -- no closed connection is cleaned up again and nng_close never
#   returns.  A server on a network cannot live with that.
# - a REP reply handed to a pipe that is closing is dropped without being
#   freed (rep0_pipe_fini now frees what its send aio still holds).
# - a TLS connection that failed (a refused handshake, a reset) stays open
#   to new reads and writes, which then never complete: a tls+tcp dialer
#   refused between sending its SP header and reading the server's hung in
#   nng_dialer_start for ever (about 1 dial in 100 with TLS 1.3 client
#   certificates).  tls_common.c now marks the connection closed, and a
#   negotiation that ends that way is a failed dial (NNG_ECONNSHUT), not a
#   closed dialer, so a background dialer tries again.
# And msg-alloc-no-zero.patch, for speed: a new message body is not zeroed
# (every sender writes what it sends and transports receive whole messages;
# zeroing each megabyte chunk was 12% of tportd's time in a put).
# (poller-delivers-reads, msg-body-cache and msg-lent-tail: the README's
# paragraph on the patched nng says what they do.)  And tls-buffers.patch: a TLS
# connection buffers four 16K records each way instead of one (128 KiB per
# connection instead of 32): with one, every record of a stream waited for
# a task-thread hand-off, and TLS moved a fifth of what plain TCP did.
# And reap-drain.patch: nng_reap_drain() waits for nng's reaper thread to
# finish destroying what was closed (nng_close returns before a TLS
# dialer's or listener's configuration is freed there): libtport and tportd
# call it after closing, so that no SSL_CTX_free runs while OpenSSL's exit
# handlers tear OpenSSL down (`tport` crashed in about 1 exit in 80 after a
# refused TLS handshake).
#
# Installs a static, position-independent libnng with its headers and CMake
# package under PREFIX (default /opt/tensorport/nng), once per patch version
# (a stamp file says which).
#
# `build-nng.sh --sanitize thread [PREFIX]` builds the same nng instrumented
# for ThreadSanitizer (default PREFIX /opt/tensorport/nng-tsan), which the
# TPORT_SANITIZE=thread build links (make test-tsan).  ThreadSanitizer sees
# the synchronization of code it did not compile only through the pthread
# calls it intercepts, never through C11 atomics: nng hands a message from
# one thread to another by its atomic reference count (nni_msg_free), so an
# uninstrumented nng makes TSan report the free of a message another thread
# copied a moment before as a race when it is not one.  TLS is built with the "none" engine: tensorport
# registers its own (OpenSSL) engine.  Needs root for apt (deb-src) and dpkg-dev.
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
patches=("$here/closed-pipe-io.patch" "$here/msg-alloc-no-zero.patch" "$here/poller-delivers-reads.patch"
         "$here/msg-body-cache.patch" "$here/msg-lent-tail.patch" "$here/tls-buffers.patch"
         "$here/reap-drain.patch")
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

extra=()
if [ -n "$sanitize" ]; then
  # NNG_RACE_DETECTOR: nng's own switch that takes a lock around the
  # debugging checks nni_aio_begin makes without one (aio.c says race
  # detectors should)
  extra=("-DNNG_SANITIZER=$sanitize" "-DCMAKE_C_FLAGS=-DNNG_RACE_DETECTOR -fno-omit-frame-pointer")
fi
echo "build-nng: building (static, PIC${sanitize:+, -fsanitize=$sanitize}) into $PREFIX"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=OFF "${extra[@]}" \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DNNG_TESTS=OFF -DNNG_TOOLS=OFF \
  -DNNG_ENABLE_NNGCAT=OFF -DNNG_ENABLE_TLS=ON -DNNG_TLS_ENGINE=none \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" >/dev/null
cmake --build build -j "$(nproc)" >/dev/null 2>&1
$SUDO rm -rf "$PREFIX"
$SUDO cmake --install build >/dev/null
$SUDO touch "$stamp"
echo "build-nng: done"
