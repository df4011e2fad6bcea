#!/usr/bin/env python3
"""Lines up the host's speed (bench/cpu_probe.c's samples) with what ran
beside it: GPT-2's steps (gpt2_e2e.py --allocator ... JSON with
step_timing) and named intervals (lines `NAME START_NS END_NS` on
CLOCK_MONOTONIC, written around other commands).

    host_speed.py PROBE.txt [--intervals FILE] [GPT2.json ...]

For GPT-2 it prints, per run, the median step and the probe's median over
the run's steps; then every step from the fifth on of all runs together,
split at the middle of the step times' range into a fast and a slow group,
with each group's host speed, and the correlation of the step time with
the core's speed (ALU), memory latency (MEM) and the time to queue the
step (queued). A plateau that follows the host shows up as a difference
between the groups' ALU or MEM and a correlation near 1.
"""
import argparse
import json
import os
import statistics
import sys


def load_probe(path):
    samples = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4:
                continue
            try:
                samples.append((int(parts[0]), float(parts[1]), float(parts[2]), int(parts[3])))
            except ValueError:
                continue
    if not samples:
        sys.exit(f"host_speed: {path} holds no probe samples")
    return samples


def window(samples, start_ns, end_ns):
    """The probe samples whose window ended within [start_ns, end_ns]; the
    nearest one when none did (a window is about 5 ms, a step about 70)."""
    inside = [s for s in samples if start_ns <= s[0] <= end_ns]
    if inside:
        return inside
    return [min(samples, key=lambda s: abs(s[0] - end_ns))]


def speed(samples, start_ns, end_ns):
    w = window(samples, start_ns, end_ns)
    return (statistics.median(s[1] for s in w), statistics.median(s[2] for s in w),
            w[-1][3] - w[0][3] if w[0][3] >= 0 else -1)


def pearson(xs, ys):
    if len(xs) < 3:
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def gpt2(samples, paths):
    steps = []
    print("run                          steps  median ms  queued ms  ALU ns  MEM ns")
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as err:
            print(f"{os.path.basename(path)}: no result ({err})")
            continue
        t = r.get("step_timing")
        if not t:
            print(f"{os.path.basename(path)}: no step_timing (an older gpt2_e2e.py)")
            continue
        rows = []
        # From the sixth step: unimem's fifth is the one its plan starts in.
        for i in range(5, len(r["step_times_s"])):
            alu, mem, steal = speed(samples, t["start_mono_ns"][i], t["end_mono_ns"][i])
            rows.append({"run": os.path.basename(path), "allocator": r["allocator"],
                         "ms": r["step_times_s"][i] * 1e3, "queued_ms": t["queued_s"][i] * 1e3,
                         "thread_cpu_ms": t["thread_cpu_s"][i] * 1e3, "alu": alu, "mem": mem,
                         "steal": steal,
                         "host_us": t["host_s"][i] * 1e6 if "host_s" in t else float("nan")})
        steps += rows
        print(f"{os.path.basename(path):28} {len(rows):5} {statistics.median(x['ms'] for x in rows):10.1f} "
              f"{statistics.median(x['queued_ms'] for x in rows):10.1f} "
              f"{statistics.median(x['alu'] for x in rows):7.4f} {statistics.median(x['mem'] for x in rows):7.1f}")
    if len(steps) < 3:
        return
    ms = [s["ms"] for s in steps]
    cut = (min(ms) + max(ms)) / 2
    print(f"\nall steps 6..N of the runs above: {len(steps)}; split at {cut:.1f} ms")
    print("group  steps  torch  unimem  step ms  queued ms  thread cpu ms  ALU ns  MEM ns  steal ticks")
    for name, group in (("fast", [s for s in steps if s["ms"] < cut]),
                        ("slow", [s for s in steps if s["ms"] >= cut])):
        if not group:
            print(f"{name:6} {0:5}")
            continue
        med = lambda k: statistics.median(s[k] for s in group)  # noqa: E731
        print(f"{name:6} {len(group):5} {sum(s['allocator'] == 'torch' for s in group):6} "
              f"{sum(s['allocator'] == 'unimem' for s in group):7} {med('ms'):8.1f} {med('queued_ms'):10.1f} "
              f"{med('thread_cpu_ms'):14.1f} {med('alu'):7.4f} {med('mem'):7.1f} "
              f"{sum(max(s['steal'], 0) for s in group):12}")
    for key in ("host_us", "alu", "mem", "queued_ms", "thread_cpu_ms"):
        print(f"correlation of the step time with {key}: {pearson(ms, [s[key] for s in steps]):+.3f}")
    for key in ("host_us", "alu"):
        compare_at_same_speed(steps, key)


def fit(xs, ys):
    """Least squares y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return my - b * mx, b


def fits_at_same_speed(points):
    """points: {allocator: (speeds, step times)}. Each allocator's
    straight-line fit of step time on speed, as (intercept, slope), and the
    pooled median speed x0 where the fits are read."""
    x0 = statistics.median(x for xs, _ in points.values() for x in xs)
    return {a: fit(xs, ys) for a, (xs, ys) in points.items()}, x0


def compare_at_same_speed(steps, key):
    """unimem's step time over PyTorch's where the host ran at the same
    speed by `key`: each allocator's straight-line fit of step time on the
    speed, read at the pooled median speed; and the ratio of the medians
    within each fifth of the speeds (pooled quintiles), where both have
    steps."""
    by = {a: [s for s in steps if s["allocator"] == a and s[key] == s[key]] for a in ("torch", "unimem")}
    if any(len(v) < 3 for v in by.values()):
        return
    pooled = sorted(s[key] for v in by.values() for s in v)
    lines, x0 = fits_at_same_speed({a: ([s[key] for s in v], [s["ms"] for s in v]) for a, v in by.items()})
    at = {}
    for a, (c, b) in lines.items():
        at[a] = c + b * x0
        print(f"{key}: {a} step ms = {c:.2f} + {b:.4f} x {key}; at the median {key} {x0:.4f}: {at[a]:.2f} ms")
    edges = [pooled[len(pooled) * k // 5] for k in range(1, 5)]
    bins = []
    for k in range(5):
        lo = edges[k - 1] if k else float("-inf")
        hi = edges[k] if k < 4 else float("inf")
        med = {}
        for a, v in by.items():
            inside = [s["ms"] for s in v if lo <= s[key] < hi]
            med[a] = (statistics.median(inside), len(inside)) if inside else None
        if med["torch"] and med["unimem"]:
            bins.append(med["unimem"][0] / med["torch"][0])
            print(f"  {key} fifth {k + 1}: torch {med['torch'][0]:.1f} ms ({med['torch'][1]} steps), "
                  f"unimem {med['unimem'][0]:.1f} ms ({med['unimem'][1]} steps): {bins[-1]:.3f}")
    print(f"{key}: unimem / torch at the same host speed: fit {at['unimem'] / at['torch']:.3f}; "
          f"fifths {' '.join('%.3f' % x for x in bins)} (median {statistics.median(bins):.3f})"
          if bins else f"{key}: no fifth with steps of both")


def intervals(samples, path):
    print("\ninterval                      seconds  ALU ns  MEM ns  steal ticks")
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue
            name, start, end = parts[0], int(parts[1]), int(parts[2])
            alu, mem, steal = speed(samples, start, end)
            print(f"{name:28} {(end - start) / 1e9:8.1f} {alu:7.4f} {mem:7.1f} {steal:12}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe")
    parser.add_argument("--intervals")
    parser.add_argument("runs", nargs="*")
    args = parser.parse_intermixed_args()
    samples = load_probe(args.probe)
    alus = [s[1] for s in samples]
    mems = [s[2] for s in samples]
    print(f"probe: {len(samples)} windows over {(samples[-1][0] - samples[0][0]) / 1e9:.1f} s; "
          f"ALU ns per step p10/median/p90 {sorted(alus)[len(alus) // 10]:.4f} / {statistics.median(alus):.4f} / "
          f"{sorted(alus)[len(alus) * 9 // 10]:.4f}; MEM ns per load {sorted(mems)[len(mems) // 10]:.1f} / "
          f"{statistics.median(mems):.1f} / {sorted(mems)[len(mems) * 9 // 10]:.1f}")
    if args.runs:
        gpt2(samples, args.runs)
    if args.intervals:
        intervals(samples, args.intervals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
