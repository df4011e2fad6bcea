#!/usr/bin/env python3
"""The random workload of `unimem bench oversub`, modelled apart from the tool.

Prints the misses of Belady's MIN and of the window rule (evict a buffer
with no use announced in the next WINDOW accesses, least recently used
first, else the one announced farthest ahead) on the tool's own access
sequence (its LCG), for the full run and --quick, and the window rule's
mean over random sequences. The ctests bench_oversub_window_min and
bench_oversub_slots check the tool's bytes against the --quick figures
printed here (the default and --slots 16).
Usage: bench/oversub_window_model.py [--sequences N] [--slots N]
(--slots as the tool's: N buffers fit in the device, 2N are used.)
"""
import random
import sys

WINDOW = 32
SLOTS = 32
BUFFERS = 64


def tool_sequence(length):
    """The sequence cmd_bench_oversub.c draws: seq[t] = (rng >> 33) % n."""
    rng, out = 0x6F76657273756221, []
    for _ in range(length):
        rng = (rng * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((rng >> 33) % BUFFERS)
    return out


def misses(seq, window):
    """Misses with SLOTS slots when next uses are known `window` ahead."""
    nxt, last = [0] * len(seq), {}
    for t in range(len(seq) - 1, -1, -1):
        nxt[t] = last.get(seq[t], float("inf"))
        last[seq[t]] = t
    resident, used_at, count = {}, {}, 0
    for t, b in enumerate(seq):
        if b not in resident:
            count += 1
            if len(resident) == SLOTS:
                unknown = [x for x in resident if resident[x] - t > window]
                if unknown:
                    victim = min(unknown, key=lambda x: used_at[x])
                else:
                    victim = max(resident, key=lambda x: resident[x])
                del resident[victim]
        resident[b], used_at[b] = nxt[t], t
    return count


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    global SLOTS, BUFFERS
    n = arg("--sequences", 200)
    SLOTS = arg("--slots", SLOTS)
    BUFFERS = 2 * SLOTS
    for name, length in (("full", BUFFERS * 6), ("quick", BUFFERS * 3)):
        seq = tool_sequence(length)
        m, w = misses(seq, float("inf")), misses(seq, WINDOW)
        print(f"{name}: {length} accesses, MIN {m} misses, window rule {w} ({w / m:.3f}x MIN)")
    rng = random.Random(1)
    ratios = []
    for _ in range(n):
        seq = [rng.randrange(BUFFERS) for _ in range(BUFFERS * 6)]
        ratios.append(misses(seq, WINDOW) / misses(seq, float("inf")))
    print(f"{n} random sequences of {BUFFERS * 6}: window rule {sum(ratios) / n:.3f}x MIN "
          f"on average, {min(ratios):.3f}x at the lowest")


if __name__ == "__main__":
    main()
