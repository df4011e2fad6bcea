#!/usr/bin/env bash
# Issue 8 and 9 on the GPU machine, in two parts (each under the device's
# 10-minute limit per command; build outputs stay between the calls):
#   part 1: build this tree and OLD_TREE; what recording costs in
#           `unimem bench alloc` (recording off and on, alternating);
#           recording off against OLD_TREE (a tree without the recorder);
#           the slowest single replay events (bench/slowest_event.c) of
#           both trees on a sim device and on the GPU.
#   part 2: compute-sanitizer memcheck and racecheck on the GPU tests, and
#           the whole ctest suite with the GPU present.
# Usage: bench/gpu/record_run.sh OLD_TREE 1|2   (results under $OUT)
set -u
OLD=$1
PART=$2
OUT=${OUT:-out}
mkdir -p "$OUT"
{ date -u; nproc; git rev-parse HEAD 2>/dev/null; lscpu | grep -E "Model name|L2|L3"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; } > "$OUT/machine_$PART.txt" 2>&1
if [ "$PART" = 1 ]; then
  for t in . "$OLD"; do
    { cmake -S "$t" -B "$t/build-dev" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
      cmake --build "$t/build-dev" -j "$(nproc)"; } > "$OUT/build_$(basename "$t").txt" 2>&1 ||
      { tail -30 "$OUT/build_$(basename "$t").txt"; exit 1; }
    cc -O2 -I"$t/include" bench/slowest_event.c -o "$t/build-dev/slowest_event" \
      "$t/build-dev/libunimem.a" -lz -lpthread -ldl -lm || exit 1
  done
  echo "builds ok"
  um=build-dev/unimem
  for round in 1 2; do
    for sc in small threads; do
      timeout 100 $um bench alloc --quick --scenario $sc > "$OUT/rec_off_${sc}_$round.txt" 2>&1
      grep -E "^$sc " "$OUT/rec_off_${sc}_$round.txt" | sed "s/^/off r$round /"
      rm -f /tmp/rec.json
      /usr/bin/time -f "%e s wall" env UNIMEM_CONF=trace_file=/tmp/rec.json \
        timeout 200 $um bench alloc --quick --scenario $sc > "$OUT/rec_on_${sc}_$round.txt" 2>&1
      grep -E "^$sc | s wall" "$OUT/rec_on_${sc}_$round.txt" | sed "s/^/on  r$round /"
      echo "trace bytes: $(stat -c %s /tmp/rec.json 2>/dev/null)" | tee -a "$OUT/rec_on_${sc}_$round.txt"
      rm -f /tmp/rec.json
    done
  done
  for round in 1 2; do
    for which in old new; do
      u=build-dev/unimem
      [ $which = old ] && u=$OLD/build-dev/unimem
      timeout 100 $u bench alloc --scenario small > "$OUT/off_${which}_$round.txt" 2>&1
      grep -E "^small " "$OUT/off_${which}_$round.txt" | sed "s/^/$which r$round /"
    done
  done
  for which in old new; do
    t=.
    [ $which = old ] && t=$OLD
    for tr in gpt2_train resnet50_train pipeline_two_streams; do
      for dev in sim:141G cuda; do
        timeout 120 "$t/build-dev/slowest_event" data/$tr.trace.gz "devices=$dev" 2>&1 |
          sed "s/^/$which $dev /" | tee -a "$OUT/slowest.txt"
      done
    done
  done
fi
if [ "$PART" = 2 ]; then
  { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build-dev -j "$(nproc)"; } > "$OUT/build_2.txt" 2>&1 || { tail -20 "$OUT/build_2.txt"; exit 1; }
  grep -o -w -m1 "constant_tsc\|nonstop_tsc" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  UNIMEM_CONF=trace_file=/dev/shm/rec.json,log_level=info build-dev/unimem info 2>&1 | grep trace_file
  for round in 1 2; do
    for where in none /dev/shm/rec.json /tmp/rec.json; do
      conf=""
      [ $where != none ] && conf="trace_file=$where"
      UNIMEM_CONF=$conf timeout 100 build-dev/unimem bench alloc --quick --scenario threads \
        2>&1 | grep -E "^threads " | sed "s|^|$where r$round |"
      rm -f $where
    done
  done
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  echo "compute-sanitizer: ${CS:-none}"
  if [ -n "$CS" ]; then
    for tool in memcheck racecheck; do
      timeout 240 "$CS" --tool $tool --error-exitcode 9 build-dev/tests/test_cuda \
        > "$OUT/cs_$tool.txt" 2>&1
      echo "compute-sanitizer $tool test_cuda rc=$?"
      tail -4 "$OUT/cs_$tool.txt"
    done
  fi
  (cd build-dev && timeout 330 ctest -j 8 --output-on-failure) > "$OUT/ctest.txt" 2>&1
  echo "ctest rc=$?"
  tail -8 "$OUT/ctest.txt"
fi
