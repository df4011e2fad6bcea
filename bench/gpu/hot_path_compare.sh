#!/usr/bin/env bash
# The allocator's hot path from an older tree and from this one, on the same
# machine in one job, alternating old and new so that the machine's drift
# hits both: `unimem bench alloc` (sim device, glibc in the same run) and
# bench/gpu/alloc_compare (cudaMalloc, cudaMallocAsync, PyTorch, unimem).
# Usage: bench/gpu/hot_path_compare.sh OLD_TREE [STEP...]
#   STEP: build test bench lives compare (default: all but lives);
#   COMPARE_ROUNDS=N repeats compare, COMPARE_PIN=CORE pins its single-thread
#   scenarios to one core, LIVES_ROUNDS=N repeats lives
#   lives: each scenario at 10 and at 10,000 live blocks only (--json), old
#   and new alternating, for the "no slower with 10,000 than with 10" target
# OLD_TREE is an unpacked `git archive` of the older commit (with this
# tree's tools/cmd_bench.c copied in when the old one lacks a scenario
# timed here: the command uses the public API only). Results go to
# $OUT/results.tgz (stdout gets the summary lines).
set -u
OLD=$1
shift
STEPS=${*:-build test bench compare}
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
FINAL=${OUT:-out}
OUT=$FINAL/r
mkdir -p "$OUT"
trap 'tar czf "$FINAL/results.tgz" -C "$FINAL" r && rm -rf "$OUT"' EXIT
{ date -u; nproc; git rev-parse HEAD 2>/dev/null; lscpu | grep -E "Model name|L2|L3"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; } > "$OUT/machine.txt" 2>&1
if has build; then
  for t in . "$OLD"; do
    { cmake -S "$t" -B "$t/build-dev" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
      cmake --build "$t/build-dev" -j "$(nproc)"; } > "$OUT/build_$(basename "$t").txt" 2>&1 ||
      { tail -30 "$OUT/build_$(basename "$t").txt"; exit 1; }
  done
  echo "builds ok"
fi
if has test; then
  build-dev/tests/test_cuda > "$OUT/test_cuda.txt" 2>&1; echo "test_cuda rc=$?"; tail -3 "$OUT/test_cuda.txt"
  (cd build-dev && ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1; echo "ctest rc=$?"; tail -4 "$OUT/ctest.txt"
fi
if has bench; then
  for round in 1 2; do
    for which in old new; do
      um=build-dev/unimem
      [ $which = old ] && um=$OLD/build-dev/unimem
      f=$OUT/bench_${which}_$round.txt
      timeout 200 $um bench alloc --device sim:320G > "$f" 2>&1
      echo "$which round $round rc=$?"
      grep -E "^(trace-sizes|small|large|threads) " "$f"
      # The large sizes' ring of 10,000 holds up to 432 GiB.
      timeout 100 $um bench alloc --device sim:480G --scenario large --live 10000 \
        > "${f%.txt}_large480.txt" 2>&1 && grep -E "^large " "${f%.txt}_large480.txt"
    done
  done
fi
if has lives; then
  for round in $(seq 1 "${LIVES_ROUNDS:-2}"); do
    for which in old new; do
      um=build-dev/unimem
      [ $which = old ] && um=$OLD/build-dev/unimem
      for sc in trace-pattern small large trace-sizes; do
        for live in 10 10000; do
          dev=sim:320G
          # The large sizes' ring of 10,000 holds up to 432 GiB.
          [ $sc = large ] && [ $live = 10000 ] && dev=sim:480G
          timeout 60 $um bench alloc --json --device $dev --scenario $sc --live $live \
            --max-seconds 1 >> "$OUT/lives_${which}_$round.json" 2>&1
        done
      done
      echo "lives $which round $round:"
      sed -E 's/.*"scenario":"([a-z-]+)","live_blocks":([0-9]+).*"unimem_ns_per_pair":([0-9.]+),"malloc_ns_per_pair":([0-9.]+).*/  \1 \2 \3 \4/' \
        "$OUT/lives_${which}_$round.json"
    done
  done
fi
if has compare; then
  for which in old new; do
    tree=.
    [ $which = old ] && tree=$OLD
    bench/gpu/build_compare.sh "$tree/build-dev" "$tree/build-dev/alloc_compare" \
      > "$OUT/compare_build_$which.txt" 2>&1 || tail -20 "$OUT/compare_build_$which.txt"
  done
  # COMPARE_ROUNDS=N alternates old and new N times (default 1).
  for round in $(seq 1 "${COMPARE_ROUNDS:-1}"); do
    for which in old new; do
      tree=.
      [ $which = old ] && tree=$OLD
      f=$OUT/alloc_compare_${which}_$round
      timeout 240 "$tree/build-dev/alloc_compare" --json "$f.json" ${COMPARE_PIN:+--pin $COMPARE_PIN} \
        > "$f.txt" 2>&1
      echo "alloc_compare $which round $round rc=$?"; cat "$f.txt"
    done
  done
fi
