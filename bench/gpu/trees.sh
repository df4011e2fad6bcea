# Sourced by the scripts that run this tree against an older one
# (load_watch.sh, record_compare.sh): builds the unimem command (target
# unimem_cli) of each TREE in TREE/build-dev, logging to DIR/build_NAME.txt;
# on a failure prints the log's tail and returns 1.
build_cli_trees() { # DIR TREE...
  local dir=$1 t log
  shift
  for t in "$@"; do
    log="$dir/build_$(basename "$t").txt"
    { cmake -S "$t" -B "$t/build-dev" -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
      cmake --build "$t/build-dev" -j "$(nproc)" --target unimem_cli; } > "$log" 2>&1 ||
      { tail -30 "$log"; return 1; }
  done
}
