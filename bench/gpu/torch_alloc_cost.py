#!/usr/bin/env python3
"""What one CUDA tensor's allocation and free cost PyTorch's host, per allocator.

    torch_alloc_cost.py [--timed-lib LIB] [--null-lib NULL] [--rounds R] [--pairs N] [--out FILE]

GPT-2's training step is mostly the host queueing work (gpt2_e2e.py's
queued_s), so what the allocator costs the host per tensor is in its step
time. This measures it without a model: `torch.empty(n, device="cuda")` and
its release, timed in Python, N times per case, for

  torch   PyTorch's own caching allocator;
  unimem  unimem through torch.cuda.memory.CUDAPluggableAllocator, from
          bench/gpu/umt_timed.c (libunimem_torch.so's code with its own
          time counted), so the report also gives the ns that unimem's two
          functions took of each pair, measured in the same process;
  null    the same pluggable path with bench/gpu/null_plug.c behind it (an
          exact-size LIFO cache over cudaMalloc, as cheap as an allocator
          gets): null against torch is what the pluggable path costs.

Cases: single sizes (warm pairs), and "ring": 1,000 live tensors of the
GPT-2 trace's sizes (from its third step), each step replacing the oldest.
Every case warms up before it is timed (the ring for WARM_RING steps, whose
time is reported on its own: it includes unimem's learning phase, where the
pool keeps memory tight by moving pages). unimem's backend calls in each
timed case are counted. Each allocator runs in its own process (PyTorch
fixes its allocator before CUDA starts), in rounds whose order rotates; the
host's speed swings by 2x between processes on the GPU machine, so the
report gives the median and the fastest round of each.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
from ring_trace import gpt2_sizes  # noqa: E402  (bench/: the ring's sizes)

ALLOCATORS = ("torch", "unimem", "null")
SIZES = (512, 65536, 4 << 20)
RING = 1000
WARM_RING = 60000           # past unimem's learning phase (about 40,000 here)


def resolve(path):
    if os.path.isabs(path) or os.path.exists(path):
        return os.path.abspath(path)
    return os.path.join(REPO, path)


class UnimemClock:
    """umt_timed.so's counters: unimem's own ns per pair over a stretch."""

    def __init__(self, lib):
        self.lib = ctypes.CDLL(lib)
        self.lib.timed_read.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        self.buf = (ctypes.c_uint64 * 5)()

    def read(self):
        self.lib.timed_read(self.buf)
        return list(self.buf), time.perf_counter()

    @staticmethod
    def ns_per_pair(start, end):
        (a, at), (b, bt) = start, end
        ticks_per_s = (b[4] - a[4]) / (bt - at)
        pairs = max(1, b[1] - a[1])
        return ((b[0] - a[0]) + (b[2] - a[2])) / ticks_per_s / pairs * 1e9


def run_one(args):
    import torch

    clock = None
    stats = None
    if args.allocator == "unimem":
        lib = resolve(args.timed_lib)
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(lib, "timed_alloc", "timed_free"))
        clock = UnimemClock(lib)
        sys.path.insert(0, os.path.join(REPO, "integrations", "torch"))
        from unimem_torch import UmStats

        clock.lib.unimem_torch_stats.argtypes = [ctypes.c_int, ctypes.POINTER(UmStats)]

        def stats():
            s = UmStats()
            if clock.lib.unimem_torch_stats(torch.cuda.current_device(), ctypes.byref(s)) != 0:
                raise RuntimeError("torch_alloc_cost: unimem_torch_stats failed")
            return s.num_backend_calls
    elif args.allocator == "null":
        lib = resolve(args.null_lib)
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(lib, "null_plug_alloc", "null_plug_free"))
    torch.cuda.init()
    dev = torch.device("cuda")
    u8 = torch.uint8
    result = {}

    def calls():
        return stats() if stats else 0

    def timed(name, fn, n, warm):
        fn(warm)
        torch.cuda.synchronize()
        c0, k0 = calls(), clock.read() if clock else None
        t0 = time.perf_counter()
        fn(n)
        t1 = time.perf_counter()
        c1, k1 = calls(), clock.read() if clock else None
        torch.cuda.synchronize()
        result[name] = (t1 - t0) / n * 1e9
        if clock:
            result[name + ": in unimem"] = UnimemClock.ns_per_pair(k0, k1)
            result[name + ": backend calls"] = c1 - c0

    for size in SIZES:
        def pairs(n, size=size):
            for _ in range(n):
                x = torch.empty(size, dtype=u8, device=dev)
                del x
        timed(f"pair {size}", pairs, args.pairs, args.pairs // 10)

    sizes = gpt2_sizes(RING + WARM_RING + args.pairs)
    state = {"i": 0}
    start = time.perf_counter()
    ring = [torch.empty(s, dtype=u8, device=dev) for s in sizes[:RING]]

    def ring_steps(n):
        i = state["i"]
        for _ in range(n):
            ring[i % RING] = None
            ring[i % RING] = torch.empty(sizes[RING + i], dtype=u8, device=dev)
            i += 1
        state["i"] = i

    ring_steps(WARM_RING)
    torch.cuda.synchronize()
    result["ring warm-up (s)"] = time.perf_counter() - start
    timed("ring", ring_steps, args.pairs, 0)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


def run_compare(args):
    runs = {a: [] for a in ALLOCATORS}
    for r in range(args.rounds):
        order = ALLOCATORS[r % 3:] + ALLOCATORS[:r % 3]
        for a in order:
            fd, path = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            cmd = [sys.executable, os.path.abspath(__file__), "--allocator", a, "--timed-lib",
                   args.timed_lib, "--null-lib", args.null_lib, "--pairs", str(args.pairs),
                   "--out", path]
            rc = subprocess.call(cmd)
            if rc == 0:
                with open(path) as f:
                    runs[a].append(json.load(f))
            else:
                print(f"torch_alloc_cost: the {a} run failed (exit {rc})", file=sys.stderr)
            os.unlink(path)
    if not all(runs.values()):
        return 1
    cases = [c for c in runs["torch"][0] if c != "ring warm-up (s)"]
    med = {a: {c: statistics.median(r[c] for r in runs[a]) for c in runs[a][0]}
           for a in ALLOCATORS}
    low = {a: {c: min(r[c] for r in runs[a]) for c in runs[a][0]} for a in ALLOCATORS}
    print(f"\nns per tensor (allocation + free): median (fastest) of {args.rounds} rounds of "
          f"{args.pairs}")
    print(f"{'case':12} {'torch':>15} {'null':>15} {'unimem':>15} {'in unimem':>10} "
          f"{'backend calls':>14}")
    for c in cases:
        cell = {a: f"{med[a][c]:.0f} ({low[a][c]:.0f})" for a in ALLOCATORS}
        print(f"{c:12} {cell['torch']:>15} {cell['null']:>15} {cell['unimem']:>15} "
              f"{med['unimem'][c + ': in unimem']:10.0f} "
              f"{med['unimem'][c + ': backend calls']:14.0f}")
    w = "ring warm-up (s)"
    print(f"ring: fill and {WARM_RING} steps before the timing, s: torch {med['torch'][w]:.2f}, "
          f"null {med['null'][w]:.2f}, unimem {med['unimem'][w]:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rounds": runs, "median": med, "fastest": low}, f, indent=1)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--allocator", choices=ALLOCATORS, help="one allocator (a child run)")
    p.add_argument("--timed-lib", default="build-dev/umt_timed.so")
    p.add_argument("--null-lib", default="build-dev/null_plug.so")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", type=int, default=100000)
    p.add_argument("--out")
    args = p.parse_args()
    if args.pairs < 10 or args.rounds < 1:
        p.error("--pairs must be at least 10 and --rounds at least 1")
    if args.allocator:
        if not args.out:
            p.error("--allocator needs --out")
        return run_one(args)
    return run_compare(args)


if __name__ == "__main__":
    sys.exit(main())
