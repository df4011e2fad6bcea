#!/usr/bin/env bash
# Issue 8's recording cost with the pool recording its own calls, A/B in
# one job (prepared in the forty-fourth session, not yet run on a GPU):
# head (this tree), exp2 (bench/gpu/ab/exp2.patch: the pool's alloc and
# free inlined into recording ones that the recorder uses instead of its
# wrapper, and the free's clock read inlined) and exp3 (exp3.patch: the
# same with the small-block fast paths forced inline too). The patches
# are against commit fc76afc's src/ (git apply, or patch -p1). Each round
# runs `unimem bench alloc --scenario record --quick` of the three in a
# rotating order, pinned to two CPUs (CPUS, default 8,9). Usage:
# ROUNDS=8 OUT=out bench/gpu/record_inline_ab.sh
set -u
OUT=${OUT:-out}; ROUNDS=${ROUNDS:-8}; CPUS=${CPUS:-8,9}
mkdir -p "$OUT"
src=$(pwd)
for v in head exp2 exp3; do
  rm -rf "/tmp/ab_$v"; mkdir -p "/tmp/ab_$v"
  tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -C "/tmp/ab_$v" -xf -
done
for v in exp2 exp3; do (cd "/tmp/ab_$v" && patch -s -p1 < "bench/gpu/ab/$v.patch") || exit 1; done
for v in head exp2 exp3; do
  { cmake -S "/tmp/ab_$v" -B "/tmp/ab_$v/b" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
    cmake --build "/tmp/ab_$v/b" -j "$(nproc)" --target unimem_cli; } > "$OUT/build_$v.txt" 2>&1 ||
    { tail -20 "$OUT/build_$v.txt"; exit 1; }
done
echo "built $(date -u)"
order=(head exp2 exp3)
for r in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2; do
    v=${order[$(( (r + k) % 3 ))]}
    line=$(TMPDIR=/dev/shm taskset -c "$CPUS" "/tmp/ab_$v/b/unimem" bench alloc --scenario record --quick 2>&1 | sed -n 2,3p | tr '\n' ' ')
    echo "$r $v $line" | tee -a "$OUT/ab.txt" | grep -o "^[0-9]* [a-z0-9]* \|[0-9.]* ns plain\|[0-9.]* ns, median" | tr '\n' ' '; echo
  done
done
