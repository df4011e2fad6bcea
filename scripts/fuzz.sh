#!/bin/sh
# scripts/fuzz.sh SECONDS [HARNESS...]
#
# Runs the libFuzzer harnesses of tests/fuzz (options, trace, api, timeline, sim; all of
# them when none is named) for SECONDS each, one after the other, from a
# copy of their seed corpus (tests/fuzz/corpus/NAME, never modified).
# Configures and builds build-fuzz (clang, -DUM_FUZZ=ON, AddressSanitizer
# and UndefinedBehaviorSanitizer, coverage in the library) when needed.
#
# Prints, per harness: executions, executions per second, coverage (cov,
# ft) and corpus size from libFuzzer's final statistics, and every finding
# (crash, leak, timeout, out-of-memory) with the path of the input kept for
# it. Exits 1 if anything was found, 77 when clang or its libFuzzer
# runtime is missing, 2 on a usage or build error.
#
# Environment: BUILD_FUZZ (build folder, default build-fuzz), JOBS (build
# jobs, default 2), CC (default clang), FUZZ_KEEP_CORPUS=1 (start from the
# corpus a previous run left in the work folder, plus the seeds), FUZZ_ARGS
# (more libFuzzer flags). Work folders: $BUILD_FUZZ/fuzz-work/NAME/{corpus,
# artifacts,log.txt}.
set -u

usage() {
    echo "usage: scripts/fuzz.sh SECONDS [options|trace|api|timeline|sim ...]" >&2
    exit 2
}

[ $# -ge 1 ] || usage
SECONDS_EACH=$1
shift
case $SECONDS_EACH in
'' | *[!0-9]*) usage ;;
esac
[ "$SECONDS_EACH" -ge 1 ] || usage

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_FUZZ:-build-fuzz}
case $BUILD in
/*) ;;
*) BUILD=$ROOT/$BUILD ;;
esac
JOBS=${JOBS:-2}
CC=${CC:-clang}

ALL="options trace api timeline sim"
HARNESSES=${*:-$ALL}
for h in $HARNESSES; do
    case " $ALL " in
    *" $h "*) ;;
    *) echo "fuzz.sh: no harness '$h' (there are: $ALL)" >&2; exit 2 ;;
    esac
done

# ----------------------------------------------------------- the toolchain
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "fuzz.sh: skipped: '$CC' not found; libFuzzer needs clang" \
         "(Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 77
fi
case $("$CC" --version 2>/dev/null | head -n 1) in
*clang*) ;;
*) echo "fuzz.sh: skipped: '$CC' is not clang; libFuzzer needs clang (set CC=clang)" >&2
   exit 77 ;;
esac
probe=$(mktemp -d "${TMPDIR:-/tmp}/fuzzprobe.XXXXXX") || exit 2
cat >"$probe/p.c" <<'EOF'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return n && d[0] == 'x'; }
EOF
if ! "$CC" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >"$probe/log" 2>&1 ||
   ! "$probe/p" -runs=1 >>"$probe/log" 2>&1; then
    echo "fuzz.sh: skipped: $CC cannot build a libFuzzer program with -fsanitize=fuzzer,address" \
         "(the runtime is missing; Debian: apt-get install libclang-rt-14-dev):" >&2
    sed 's/^/  /' "$probe/log" | tail -n 5 >&2
    rm -rf "$probe"
    exit 77
fi
rm -rf "$probe"

# ------------------------------------------------------------------ build
configured=no
if [ -f "$BUILD/CMakeCache.txt" ] &&
   grep -q '^UM_FUZZ:BOOL=ON' "$BUILD/CMakeCache.txt" &&
   grep -q '^UM_SANITIZE:STRING=address' "$BUILD/CMakeCache.txt" &&
   grep -q '^CMAKE_C_COMPILER:[A-Z]*=.*clang' "$BUILD/CMakeCache.txt"; then
    configured=yes
fi
if [ $configured = no ]; then
    # A folder made with another compiler cannot be switched in place.
    if [ -f "$BUILD/CMakeCache.txt" ] &&
       ! grep -q '^CMAKE_C_COMPILER:[A-Z]*=.*clang' "$BUILD/CMakeCache.txt"; then
        rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
    fi
    echo "fuzz.sh: configuring $BUILD"
    if ! CC=$CC cmake -S "$ROOT" -B "$BUILD" -DUM_FUZZ=ON -DUM_SANITIZE=address \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link \
            >"$BUILD.configure.log" 2>&1; then
        tail -n 30 "$BUILD.configure.log" >&2
        echo "fuzz.sh: configuring $BUILD failed (log: $BUILD.configure.log)" >&2
        exit 2
    fi
    rm -f "$BUILD.configure.log"
fi
targets=""
for h in $HARNESSES; do targets="$targets fuzz_$h"; done
echo "fuzz.sh: building$targets in $BUILD"
# shellcheck disable=SC2086
if ! cmake --build "$BUILD" --target $targets -j "$JOBS" >"$BUILD/fuzz-build.log" 2>&1; then
    grep -E 'error|Error' "$BUILD/fuzz-build.log" | head -n 30 >&2
    echo "fuzz.sh: the build failed (log: $BUILD/fuzz-build.log)" >&2
    exit 2
fi

# -------------------------------------------------------------------- run
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1"
found=0
summary=""
for h in $HARNESSES; do
    work=$BUILD/fuzz-work/$h
    corpus=$work/corpus
    artifacts=$work/artifacts
    log=$work/log.txt
    if [ "${FUZZ_KEEP_CORPUS:-0}" != 1 ]; then
        rm -rf "$corpus"
    fi
    mkdir -p "$corpus" "$artifacts"
    cp "$ROOT/tests/fuzz/corpus/$h/"* "$corpus/" 2>/dev/null
    # Findings of earlier runs stay where they are; only new ones count.
    before=$(ls "$artifacts" 2>/dev/null)
    case $h in
    trace) max_len=16384 ;;
    *) max_len=4096 ;;
    esac
    echo "fuzz.sh: fuzz_$h for ${SECONDS_EACH}s (corpus $corpus, log $log)"
    # The outer timeout catches a harness that hangs past libFuzzer's own
    # limits; -timeout is per input.
    # shellcheck disable=SC2086
    timeout -k 10 $((SECONDS_EACH + 120)) "$BUILD/tests/fuzz/fuzz_$h" \
        -max_total_time="$SECONDS_EACH" -print_final_stats=1 -max_len=$max_len \
        -timeout=30 -rss_limit_mb=2560 -artifact_prefix="$artifacts/" \
        ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    last=$(grep -E '^#[0-9]+' "$log" | grep 'cov: ' | tail -n 1)
    cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    nfiles=$(find "$corpus" -type f | wc -l | tr -d ' ')
    bytes=$(cat "$corpus"/* 2>/dev/null | wc -c | tr -d ' ')
    line=$(printf 'fuzz_%-8s execs %s, %s exec/s, cov %s, ft %s, corpus %s files / %s bytes' \
        "$h" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$nfiles" "$bytes")
    # What this run added to the artifacts folder.
    new=""
    for path in "$artifacts"/*; do
        [ -e "$path" ] || continue
        f=${path##*/}
        case "
$before
" in
        *"
$f
"*) ;;
        *) case $f in crash-* | leak-* | timeout-* | oom-*) new="$new $f" ;; esac ;;
        esac
    done
    if [ -n "$new" ] || { [ $rc -ne 0 ] && [ $rc -ne 124 ]; }; then
        found=1
        line="$line: FINDING (exit $rc)"
        for f in $new; do
            line="$line
    $(echo "$f" | cut -d- -f1): $artifacts/$f"
        done
        [ -n "$new" ] || line="$line
    no input was kept; see $log"
        grep -E 'ERROR: |FUZZ_CHECK|SUMMARY: ' "$log" | head -n 5 | sed 's/^/    /' >&2
    elif [ $rc -eq 124 ]; then
        found=1
        line="$line: FINDING: the run did not end within ${SECONDS_EACH}s + 120s (hang); see $log"
    fi
    echo "$line"
    summary="$summary
$line"
done
echo "fuzz.sh: summary (${SECONDS_EACH}s each):$summary"
exit $found
