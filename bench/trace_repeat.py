#!/usr/bin/env python3
"""Makes a longer allocation trace from a training trace of ../shared/traces
format by repeating one of its steady steps, so that a replay runs as many
steps as a real training job (the recorded traces hold four or five).

The step to repeat is given by its first large allocation (more than
32 KiB, the pool's large path while its planner learns), counted from 0,
and its length in large allocations; it must have the same shape as the
step before it (its blocks freed in the next step are found there). The
output is the trace up to the end of that step, then COPIES more of it
with fresh ids, each after a "# step" comment.

Usage: bench/trace_repeat.py TRACE FIRST_LARGE PERIOD_LARGE COPIES OUT
  bench/trace_repeat.py data/gpt2_train.trace.gz 3097 998 16 /tmp/gpt2_20.trace
"""
import gzip
import sys

LARGE = 32 * 1024


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    path, first, period, copies, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        ev = [line.split() for line in f if line.strip() and not line.startswith("#")]
    large = [i for i, e in enumerate(ev) if e[0] == "a" and int(e[2]) > LARGE]
    if first < period or first + period >= len(large):
        sys.exit(f"trace_repeat: the step at large allocation {first} ({period} long) and the one "
                 f"before it must lie in the trace's {len(large)} large allocations")
    s, e = large[first], large[first + period]
    win, prev = ev[s:e], ev[s - (e - s):s]
    if any(a[0] != b[0] or (a[0] == "a" and a[2:] != b[2:]) for a, b in zip(prev, win)):
        sys.exit("trace_repeat: the step differs from the one before it; choose a steady step")
    at_prev = {prev[j][1]: j for j in range(len(prev)) if prev[j][0] == "a"}
    at_win = {win[j][1]: j for j in range(len(win)) if win[j][0] == "a"}
    next_id = max(int(x[1]) for x in ev) + 1
    with open(out, "w") as f:
        f.write("# %s, steps repeated by bench/trace_repeat.py\n" % path)
        for x in ev[:e]:
            f.write(" ".join(x) + "\n")
        ids_prev = {j: win[j][1] for j in at_win.values()}
        for _ in range(copies):
            f.write("# step\n")
            ids = {}
            for j, x in enumerate(win):
                if x[0] == "a":
                    ids[j] = str(next_id)
                    next_id += 1
                    f.write("a %s %s\n" % (ids[j], " ".join(x[2:])))
                elif x[1] in at_win and at_win[x[1]] < j:
                    f.write("f %s\n" % ids[at_win[x[1]]])
                elif x[1] in at_prev:
                    f.write("f %s\n" % ids_prev[at_prev[x[1]]])
                else:
                    sys.exit(f"trace_repeat: the step frees block {x[1]}, made before the step "
                             "before it; it cannot repeat")
            ids_prev = ids


if __name__ == "__main__":
    main()
