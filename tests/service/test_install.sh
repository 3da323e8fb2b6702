#!/usr/bin/env bash
# test_install.sh BUILD [SANITIZERS]: libtport as a new user gets it.
#
# Installs the build to a fresh prefix (what `make install PREFIX=...` does),
# then compiles a small program against that tree and runs it against the
# installed tportd (a put and a get): with pkg-config (shared, and static
# with --static), and with CMake's find_package (tport::tport and
# tport::tport_static).  The tree is then moved elsewhere and used again:
# nothing in it may remember where it was installed, or the build's own
# prefix.  SANITIZERS: the build's TPORT_SANITIZE, for the program's flags.
set -euo pipefail

build="$(cd "$1" && pwd)"
san="${2:-}"
tmp="$(mktemp -d /tmp/tport-install-XXXXXX)"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }

flags=()
if [ -n "$san" ]; then flags=("-fsanitize=$san" -fno-omit-frame-pointer); fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"

prefix="$tmp/first"
cmake --install "$build" --prefix "$prefix" >/dev/null

# the shared library exports its API and nothing else: not the (patched,
# static) nng, contract and transport code compiled into it, which would
# otherwise take the place of an application's own nng or same-named code
so="$(find "$prefix" -name 'libtport.so.*.*' | head -1)"
[ -n "$so" ] || fail "no libtport.so installed"
others="$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^tport_' | head -5 || true)"
[ -z "$others" ] || fail "libtport.so exports more than tport_*: $(echo $others)"
# grep without -q reads all of nm's output: -q exits at the first match, and
# nm's SIGPIPE then fails the pipeline under pipefail (a false failure)
nm -D --defined-only "$so" | grep ' tport_connect$' >/dev/null || fail "libtport.so does not export tport_connect"

cat >"$tmp/app.c" <<'EOF'
/* a new user's first program: put a tensor, get it back */
#include <stdio.h>
#include <string.h>
#include <tport.h>

int main(int argc, char **argv)
{
  tport_client *c;
  tport_err err;
  if (argc < 2 || tport_connect(argv[1], NULL, &c, &err)) {
    fprintf(stderr, "connect: %s\n", argc < 2 ? "no URL" : err.msg);
    return 1;
  }
  float v[2][3] = {{1, 2, 3}, {4, 5, 6}}, back[2][3];
  tport_tensor_info t;
  int rc = tport_put(c, TPORT_FLOAT32, 2, (int64_t[]){2, 3}, NULL, v, sizeof v, NULL, &t, &err);
  if (!rc)
    rc = tport_get(c, &t.ref, back, sizeof back, NULL, NULL, NULL, &err);
  tport_close(c);
  if (rc || memcmp(v, back, sizeof v)) {
    fprintf(stderr, "put/get: %s\n", rc ? err.msg : "different bytes");
    return 1;
  }
  printf("%s\n", tport_status_name(rc));
  return 0;
}
EOF

start_server() { # $1: the prefix whose tportd runs
  url="ipc://$tmp/tportd.sock"
  rm -f "$tmp/tportd.sock"
  "$1/bin/tportd" --listen "$url" --http-listen off --log-level 1 &
  server=$!
  for _ in $(seq 200); do
    [ -S "$tmp/tportd.sock" ] && return 0
    sleep 0.05
  done
  fail "the installed tportd did not start"
}

stop_server() {
  kill "$server"
  wait "$server" || fail "tportd exited $?"
  server=""
}

run() { # $1: a program; it must print OK
  out="$("$1" "$url")" || fail "$1 failed"
  [ "$out" = "OK" ] || fail "$1 printed '$out'"
}

not_linked_to_libtport() {
  if readelf -d "$1" | grep 'NEEDED.*libtport' >/dev/null; then fail "$1 needs libtport.so"; fi
}

check_tree() { # $1: an installed tree (maybe moved from where it was installed)
  local p="$1" pc
  pc="$(find "$p" -name tport.pc)"
  [ -n "$pc" ] || fail "no tport.pc under $p"
  if grep -rIl -e "$build" -e "/usr/local" -e "$prefix" "$(dirname "$pc")" "$p"/lib*/cmake/tport; then
    fail "the files above name a place the tree may not be"
  fi
  export PKG_CONFIG_PATH
  PKG_CONFIG_PATH="$(dirname "$pc")"
  [ "$(realpath "$(pkg-config --variable=prefix tport)")" = "$(realpath "$p")" ] ||
    fail "pkg-config's prefix is $(pkg-config --variable=prefix tport), not $p"
  local inc libdir
  inc="$(pkg-config --cflags-only-I tport | sed 's/^-I//; s/ *$//')"
  [ -f "$inc/tport.h" ] || fail "pkg-config --cflags points at $inc, which has no tport.h"
  libdir="$(pkg-config --variable=libdir tport)"

  # pkg-config, shared: cc app.c $(pkg-config --cflags --libs tport)
  # shellcheck disable=SC2046
  cc "${flags[@]}" -o "$tmp/app_pc" "$tmp/app.c" $(pkg-config --cflags --libs tport) \
    -Wl,-rpath,"$libdir" || fail "cc with pkg-config --cflags --libs tport"
  run "$tmp/app_pc"
  # pkg-config, static: everything libtport.a needs comes with --static
  # shellcheck disable=SC2046
  cc "${flags[@]}" -o "$tmp/app_pc_static" "$tmp/app.c" $(pkg-config --cflags tport) \
    $(pkg-config --static --libs tport | sed 's/-ltport\b/-l:libtport.a/') ||
    fail "cc with pkg-config --static --libs tport"
  not_linked_to_libtport "$tmp/app_pc_static"
  run "$tmp/app_pc_static"

  # CMake: find_package(tport) and both targets
  rm -rf "$tmp/consumer"
  mkdir -p "$tmp/consumer"
  cat >"$tmp/consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(tport_consumer C)
find_package(tport 0.1 CONFIG REQUIRED)
add_executable(app_shared ../app.c)
target_link_libraries(app_shared PRIVATE tport::tport)
add_executable(app_static ../app.c)
target_link_libraries(app_static PRIVATE tport::tport_static)
EOF
  cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$p" \
    -DCMAKE_C_FLAGS="${flags[*]}" -DCMAKE_EXE_LINKER_FLAGS="${flags[*]}" >"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log"; fail "find_package(tport)"; }
  cmake --build "$tmp/consumer/build" >"$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log"; fail "building against tport::tport and tport::tport_static"; }
  not_linked_to_libtport "$tmp/consumer/build/app_static"
  run "$tmp/consumer/build/app_shared"
  run "$tmp/consumer/build/app_static"
}

start_server "$prefix"
check_tree "$prefix"
stop_server
# the same tree moved (a DESTDIR staging, a copied image): still whole
mv "$prefix" "$tmp/moved"
start_server "$tmp/moved"
check_tree "$tmp/moved"
stop_server
echo "test_install: OK (pkg-config shared and static, find_package shared and static, moved tree)"
