#!/usr/bin/env python3
"""A synthetic allocation trace (../shared/traces format) on many streams.

Each of STREAMS streams (ids 1..STREAMS) makes two allocations of 512 B,
4 KiB, 64 KiB or 3 MiB; after each stream's pair, random live blocks are
freed until 50 are left. Every stream is used once, as a program that
makes a stream per request would: `unimem replay` of it shows what the
pool pays for streams it has seen but that have nothing left to retire.

Usage: bench/streams_trace.py OUT [STREAMS [SEED]]
  bench/streams_trace.py /tmp/streams100k.trace      # 100,000 streams, seed 1
  build/unimem replay /tmp/streams100k.trace
"""
import random
import sys


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) > 1 else 2
    streams = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    sizes = [512, 4096, 65536, 3 << 20]
    with open(sys.argv[1], "w") as f:
        f.write("# synthetic; %d streams, each used once\n" % streams)
        f.write("# a <id> <size> <stream> | f <id>\n")
        next_id, live = 0, []
        for s in range(1, streams + 1):
            for _ in range(2):
                f.write("a %d %d %d\n" % (next_id, rng.choice(sizes), s))
                live.append(next_id)
                next_id += 1
            while len(live) > 50:
                f.write("f %d\n" % live.pop(rng.randrange(len(live))))
        for i in live:
            f.write("f %d\n" % i)
    return 0


if __name__ == "__main__":
    sys.exit(main())
