#!/usr/bin/env python3
"""A synthetic allocation trace (../shared/traces format) of a training loop
with gradient accumulation: K micro-steps a step, each a forward that keeps
one activation per layer and a backward that frees them, the gradients
made in the first micro-step and kept until the optimizer, and Adam's
state made at the first optimizer step. The micro-steps repeat inside a
step, so a step planner can take them for the period and be proven wrong
at the optimizer; bench/step_calls.c shows what that costs step by step.

Prints the large allocations (over 32 KiB) before the second step and in
each step after the first, which are step_calls' FIRST and PERIOD.
Usage: bench/accum_trace.py K STEPS OUT [LAYERS [SEED]]
  bench/accum_trace.py 4 30 /tmp/accum4.trace
"""
import random
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    k, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    layers = int(sys.argv[4]) if len(sys.argv) > 4 else 12
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 5)
    if k < 1 or steps < 2 or layers < 1:
        sys.exit("accum_trace: K and LAYERS must be at least 1, STEPS at least 2")
    act = [rng.randrange(8, 64) << 20 for _ in range(layers)]
    tmp = [rng.randrange(1, 16) << 20 for _ in range(layers)]
    par = [rng.randrange(4, 40) << 20 for _ in range(layers)]
    lines, large = [], [0]
    next_id = [0]

    def alloc(size):
        next_id[0] += 1
        lines.append("a %d %d 0" % (next_id[0], size))
        large[0] += size > 32 * 1024
        return next_id[0]

    for size in par:
        alloc(size)  # the parameters, live throughout
    adam = False
    starts = []
    for _ in range(steps):
        starts.append(large[0])
        grads = None
        for _ in range(k):
            acts = []
            for l in range(layers):
                acts.append(alloc(act[l]))
                lines.append("f %d" % alloc(tmp[l]))
            made = []
            for l in reversed(range(layers)):
                lines.append("f %d" % alloc(tmp[l]))
                if grads is None:
                    made.append(alloc(par[l]))
                lines.append("f %d" % acts[l])
            grads = grads if grads is not None else made
        if not adam:
            for size in par:
                alloc(size)
                alloc(size)
            adam = True
        for size in par:
            lines.append("f %d" % alloc(size))
        lines.extend("f %d" % g for g in grads)
    with open(out, "w") as f:
        f.write("# bench/accum_trace.py %s\n" % " ".join(sys.argv[1:]))
        f.write("\n".join(lines) + "\n")
    print("FIRST %d PERIOD %d" % (starts[1], starts[2] - starts[1]))


if __name__ == "__main__":
    main()
