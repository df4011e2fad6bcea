#!/usr/bin/env python3
"""A synthetic allocation trace (../shared/traces format): a FIFO of tensors.

RING blocks stay live; each step frees the oldest and allocates the next,
whose size is the next of GPT-2's recorded allocations from its third step
on (cycled, capped at 256 MiB). The sizes repeat with GPT-2's step, so a
step planner finds a period, but every block lives across any point where
a plan could start: what a ring buffer of activations, a KV cache of
fixed-length entries or a prefetch queue does. `unimem replay` of it shows
what the pool does with a period it should not plan.

Usage: bench/ring_trace.py OUT [STEPS [RING [SOURCE]]]
  bench/ring_trace.py /tmp/ring.trace                 # 160,000 steps, ring of 1,000
  build/unimem replay /tmp/ring.trace
"""
import gzip
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "data", "gpt2_train.trace.gz")
SKIP_ALLOCATIONS = 3000  # GPT-2's first two steps: the model's and Adam's state
MAX_BYTES = 256 << 20


def gpt2_sizes(count, source=DEFAULT_SOURCE):
    """The sizes of `count` allocations of a training trace (bytes), from its
    third step on (the first two allocate the model's and the optimizer's
    long-lived state), cycled, each capped at MAX_BYTES. Also used by
    bench/gpu/torch_alloc_cost.py, so that its ring is this one."""
    with gzip.open(source, "rt") as f:
        sizes = [int(line.split()[2]) for line in f if line.startswith("a ")]
    sizes = sizes[SKIP_ALLOCATIONS:]
    if not sizes:
        sys.exit(f"ring_trace: {source} has no allocations after its first {SKIP_ALLOCATIONS}")
    return [min(sizes[i % len(sizes)], MAX_BYTES) for i in range(count)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 160000
    ring = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    source = sys.argv[4] if len(sys.argv) > 4 else DEFAULT_SOURCE
    if steps < 1 or ring < 1:
        sys.exit("ring_trace: STEPS and RING must be at least 1")
    sizes = gpt2_sizes(ring + steps, source)
    with open(out, "w") as f:
        f.write(f"# workload ring of {ring} (sizes of {os.path.basename(source)}); synthetic\n")
        f.write("# a <id> <size> <stream> | f <id>\n")
        for i in range(ring):
            f.write(f"a {i} {sizes[i]} 0\n")
        for i in range(steps):
            f.write(f"f {i}\na {ring + i} {sizes[ring + i]} 0\n")
    print(f"ring_trace: {ring + steps} allocations, {steps} frees in {out}")


if __name__ == "__main__":
    main()
