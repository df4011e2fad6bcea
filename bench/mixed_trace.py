#!/usr/bin/env python3
"""A synthetic allocation trace (../shared/traces format) of random mixed sizes.

LIVE blocks are allocated, then each of STEPS steps frees a live block chosen
at random and allocates one of a new size in its place: a program with no
step to plan and sizes of every scale, the case that fragments a pool most.
The sizes follow bench/mixed_sizes.h's bands (70% 256 B-32 KiB, 25% 32 KiB-
4 MiB, 5% 4-64 MiB, log-uniform in each); SCALE multiplies the bounds of the
two upper bands (SCALE 4: up to 16 and 256 MiB). `unimem replay --min-limit`
of it shows what a pool setting costs at the memory limit.

Usage: bench/mixed_trace.py OUT [SEED [LIVE [STEPS [SCALE]]]]
  bench/mixed_trace.py /tmp/mixed.trace 1 2000 40000     # the defaults
  build/unimem replay /tmp/mixed.trace --min-limit
"""
import math
import random
import sys


def main(argv):
    if len(argv) < 2 or len(argv) > 6:
        sys.exit(__doc__.strip())
    try:
        seed = int(argv[2]) if len(argv) > 2 else 1
        live = int(argv[3]) if len(argv) > 3 else 2000
        steps = int(argv[4]) if len(argv) > 4 else 40000
        scale = float(argv[5]) if len(argv) > 5 else 1.0
    except ValueError as e:
        sys.exit("mixed_trace.py: SEED, LIVE and STEPS must be integers, SCALE a number (%s)" % e)
    if live < 1 or steps < 0 or not 1.0 <= scale <= 64.0:
        sys.exit("mixed_trace.py: LIVE must be at least 1, STEPS at least 0, SCALE in 1-64")
    rng = random.Random(seed)

    def log_uniform(lo, hi):
        n = int(math.exp(math.log(lo) + rng.random() * (math.log(hi) - math.log(lo))))
        return min(hi, max(lo, n))

    def size():
        band = rng.random()
        if band < 0.70:
            return log_uniform(256, 32 << 10)
        if band < 0.95:
            return log_uniform(32 << 10, int((4 << 20) * scale))
        return log_uniform(int((4 << 20) * scale), int((64 << 20) * scale))

    with open(argv[1], "w") as out:
        out.write("# workload mixed_random seed %d live %d steps %d scale %g\n"
                  % (seed, live, steps, scale))
        out.write("# a <id> <size> <stream> | f <id>\n")
        ids = list(range(live))
        for i in ids:
            out.write("a %d %d 0\n" % (i, size()))
        next_id = live
        for _ in range(steps):
            victim = rng.randrange(live)
            out.write("f %d\n" % ids[victim])
            ids[victim] = next_id
            out.write("a %d %d 0\n" % (next_id, size()))
            next_id += 1


if __name__ == "__main__":
    main(sys.argv)
