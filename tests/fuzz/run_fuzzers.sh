#!/usr/bin/env bash
# run_fuzzers.sh BUILD SECONDS [HARNESS...]: what `make fuzz` runs once the
# harnesses are built (TPORT_FUZZ=ON in BUILD).
#
# Each harness (default: frame npy server) runs for SECONDS on a scratch copy
# of its seed corpus (BUILD/fuzz/<harness>/corpus: new inputs never land in
# the checked-in tests/fuzz/corpus) plus its regressions, with its
# dictionary.  Any crash, leak, timeout, out-of-memory or sanitizer report
# stops that harness; its input is left in BUILD/fuzz/<harness>/findings/ and
# its path printed, and the script exits 1 after running the others.
# Minimize a finding with
#   BUILD/bin/fuzz_<harness> -minimize_crash=1 -runs=10000 FILE
# and keep it as tests/fuzz/regressions/<harness>/<what-it-is>.
set -uo pipefail

build=$(cd "${1:?usage: run_fuzzers.sh BUILD SECONDS [HARNESS...]}" && pwd)
seconds=${2:?usage: run_fuzzers.sh BUILD SECONDS [HARNESS...]}
shift 2
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(frame npy server)
src=$(cd "$(dirname "$0")" && pwd)

# stack traces for UBSan reports too; every report is fatal
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:print_suppressions=0}

failed=()
for h in "${harnesses[@]}"; do
  exe=$build/bin/fuzz_$h
  work=$build/fuzz/$h
  if [ ! -x "$exe" ]; then
    echo "run_fuzzers: $exe is missing (configure with -DTPORT_FUZZ=ON)" >&2
    exit 2
  fi
  rm -rf "$work/corpus"
  mkdir -p "$work/corpus" "$work/findings"
  rm -f "$work/findings/"*
  cp "$src/corpus/$h/"* "$work/corpus/"
  dict=()
  d=$h
  [ "$h" = server ] && d=frame # its inputs are mostly protobuf messages too
  [ -f "$src/$d.dict" ] && dict=(-dict="$src/$d.dict")
  echo "=== fuzz_$h: ${seconds} s (log: $work/fuzz.log)"
  # -timeout: one input may take 10 s at most (fuzz_server's own limit for
  # a reply is 5 s); -error_exitcode and -timeout_exitcode: nonzero on any
  # finding; the regressions are read but never written.
  (cd "$work" && "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -error_exitcode=77 -timeout_exitcode=78 -print_final_stats=1 \
    -artifact_prefix="$work/findings/" "${dict[@]}" \
    "$work/corpus" "$src/regressions/$h") >"$work/fuzz.log" 2>&1
  rc=$?
  grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|stat::number_of_executed_units|stat::average_exec_per_sec" \
    "$work/fuzz.log" | tail -4
  found=$(ls "$work/findings/" 2>/dev/null)
  if [ $rc -ne 0 ] || [ -n "$found" ]; then
    echo "!!! fuzz_$h: a finding (exit $rc); the report:"
    grep -E -A30 "^==[0-9]+==(ERROR|WARNING)|runtime error|FUZZ_CHECK failed|ALARM|out-of-memory|Test unit written" \
      "$work/fuzz.log" | head -60
    for f in $found; do
      echo "!!! fuzz_$h: input: $work/findings/$f"
    done
    failed+=("$h")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "run_fuzzers: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "run_fuzzers: no finding in ${harnesses[*]} (${seconds} s each)"
