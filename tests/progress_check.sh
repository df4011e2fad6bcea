#!/bin/sh
# Issue 8: every command that can run longer than a second draws a progress
# bar on a terminal and prints none when piped. Each command runs twice:
# under script(1), which gives it a terminal, where stderr must hold a bar
# with the command's label; and with stderr in a file, which must hold no
# bar and no carriage return. Both runs must succeed.
# Sim devices only, so that it runs alike with and without a GPU.
# Usage: progress_check.sh UNIMEM DATA_DIR   (exits 77, skipped, without script)
set -u
U=$1
DATA=$2
if ! command -v script > /dev/null 2>&1; then
  echo "skipped: no script(1) to give the commands a terminal (util-linux)"
  exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
BAR='\[[#.]\{40\}\] \{1,3\}[0-9]\{1,3\}%'
CR=$(printf '\r')
status=0
# check LABEL ARGS...: LABEL must be in the terminal run's bar.
check() {
  label=$1
  shift
  if ! script -qec "$U $* > /dev/null" /dev/null < /dev/null > "$T/tty.txt" 2>&1; then
    echo "FAIL: on a terminal, unimem $* failed:"; tail -5 "$T/tty.txt"; status=1; return
  fi
  if ! tr '\r' '\n' < "$T/tty.txt" | grep -q "$label.*$BAR"; then
    echo "FAIL: on a terminal, unimem $* drew no bar labelled '$label':"
    tr '\r' '\n' < "$T/tty.txt" | tail -5; status=1; return
  fi
  if ! "$U" "$@" > /dev/null 2> "$T/pipe.txt"; then
    echo "FAIL: piped, unimem $* failed:"; tail -5 "$T/pipe.txt"; status=1; return
  fi
  if grep -q "$BAR" "$T/pipe.txt" || grep -q "$CR" "$T/pipe.txt"; then
    echo "FAIL: piped, unimem $* drew progress on stderr:"; od -c "$T/pipe.txt" | head -5
    status=1; return
  fi
  echo "ok: unimem $* ('$label' on a terminal, nothing piped)"
}
check "replay: pool" replay "$DATA/pattern.trace" --device sim:4G
check "replaying trace" timeline "$DATA/pattern.trace" -o "$T/page.html" --device sim:4G
check "small, 100 live" bench alloc --device sim:1G --scenario small --live 100 --pairs 2000
check "copies of 1.00 MiB" bench copy --quick --device sim:1G --repeats 1
check "stream 1.5x cost" bench oversub --quick --limit 64M --device sim:4G
check "cost, runtime engine" sim --machine h200x8 --workload cholesky --n 65536 --tile 8192 \
  --engine runtime --policy cost
check "tasks [0-9]*/216" demo gemm --quick --device sim:3x1G
exit $status
