#!/bin/sh
# A task trace recorded from `unimem demo gemm` (option task_trace) and
# simulated gives what the simulator's own GEMM graph of the same order and
# tile gives: the same tasks, accesses and order, so the same makespan and
# bytes, on one GPU and on eight. --n or --tile with a trace is refused.
# Usage: sim_trace_check.sh UNIMEM
set -u
U=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
UNIMEM_CONF=task_trace=$T/tasks.txt "$U" demo gemm --quick --device sim:3x1G > "$T/demo.txt" 2>&1 ||
  { echo "demo failed:"; cat "$T/demo.txt"; exit 1; }
fields() { grep -o '"\(tasks\|makespan_s\|bytes_moved\|copies\)":[0-9.]*' | tr '\n' ' '; }
status=0
for m in h200x1 h200x8; do
  a=$("$U" sim --machine $m --workload "trace:$T/tasks.txt" --policy cost --json | fields)
  b=$("$U" sim --machine $m --workload gemm --n 1536 --tile 256 --policy cost --json | fields)
  echo "$m trace: $a"
  echo "$m gemm:  $b"
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "$m: the trace and the graph differ"
    status=1
  fi
done
# Sizes given with a trace would be silently ignored: they are refused.
if "$U" sim --machine h200x1 --workload "trace:$T/tasks.txt" --n 1536 > "$T/sized.txt" 2>&1 ||
  ! grep -q -- "--n does not apply to --workload trace:FILE" "$T/sized.txt"; then
  echo "--n with a trace was not refused as it should be:"; cat "$T/sized.txt"
  status=1
fi
[ $status = 0 ] && echo "the recorded trace simulates as the graph"
exit $status
