#!/usr/bin/env bash
# The first Cholesky of a job ran up to 1.5x slower than later ones: CUDA
# loads a library's kernel from its file when the kernel is first launched,
# and after boot the file is not yet in the page cache. This runs `unimem
# demo cholesky` (n 32768, tile 4096, --gpu-only, limit 8 GiB) from two
# builds in turn, each run after the page cache was dropped (as after
# boot; needs root, else the runs only alternate) and each once more with
# the cache warm, printing the makespans.
# Usage: bench/gpu/load_watch.sh OLD_TREE [ROUNDS]   (builds both trees' CLI in build-dev)
set -u
OLD=${1:?usage: load_watch.sh OLD_TREE [ROUNDS]}
ROUNDS=${2:-3}
FINAL=${OUT:-out}
mkdir -p "$FINAL"
. "$(dirname "$0")/trees.sh"
build_cli_trees "$FINAL" . "$OLD" || exit 1
drop() { sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo dropped || echo kept; }
run() { # TREE LABEL
  "$1/build-dev/unimem" demo cholesky --device cuda:0 --limit 8G --n 32768 --tile 4096 --gpu-only \
    --no-verify --json 2> "$FINAL/$2.err" | tee "$FINAL/$2.json" | grep -o '"makespan_s":[0-9.]*' | head -1 | cut -d: -f2
}
printf "%-5s %-4s %-8s %12s\n" round tree cache makespan_s | tee "$FINAL/load_watch.txt"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in $order; do
    if [ "$w" = old ]; then t=$OLD; else t=.; fi
    c=$(drop)
    printf "%-5s %-4s %-8s %12s\n" "$r" "$w" "$c" "$(run "$t" "${w}_${r}_cold")" | tee -a "$FINAL/load_watch.txt"
    printf "%-5s %-4s %-8s %12s\n" "$r" "$w" warm "$(run "$t" "${w}_${r}_warm")" | tee -a "$FINAL/load_watch.txt"
  done
done
