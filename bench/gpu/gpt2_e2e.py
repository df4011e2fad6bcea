#!/usr/bin/env python3
"""GPT-2 small training, end to end, on PyTorch's allocator and on unimem.

    gpt2_e2e.py [--compare] [--out FILE]       both allocators, one process each
    gpt2_e2e.py --allocator torch|unimem --out FILE   one allocator (a child run)

GPT2LMHeadModel(GPT2Config()) with random init (torch.manual_seed(0)), batch
8 x 1024 random tokens (fixed seed), bf16 autocast, AdamW(lr=1e-4), 20 steps,
deterministic algorithms. Each allocator runs in its own process because the
allocator must be chosen before CUDA starts. The comparison reports the loss
difference (zero expected: same kernels, same data), the median step time
of steps 5..20, and peak reserved and live bytes as each allocator counts them
and as the driver sees them (total - free, sampled after every step).

It always exits 0 when both runs complete, whatever the numbers; 1 when a run
failed.
"""

import os

# cuBLAS reads this when PyTorch creates its handles; deterministic GEMMs
# need it, so it is set before torch is imported.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from host_speed import fits_at_same_speed  # noqa: E402  (this folder)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DEFAULT_LIB = "build-dev/integrations/torch/libunimem_torch.so"
ALLOCATORS = ("torch", "unimem")
MiB = 1024 * 1024


def resolve_lib(path):
    """A relative --lib is looked up from the working directory, then from
    the repository root (so the default works from anywhere)."""
    if os.path.isabs(path) or os.path.exists(path):
        return os.path.abspath(path)
    return os.path.join(REPO, path)


# --------------------------------------------------------------- one run


def host_probe():
    """Seconds a fixed loop of Python takes now (about a millisecond)."""
    start = time.perf_counter()
    x = 0
    for i in range(20000):
        x += i * i
    return time.perf_counter() - start


class Trainer:
    """GPT-2 small with its batch and optimizer, one training step at a time
    (train() below; gpt2_lockstep.py runs the steps of several processes in
    turns)."""

    def __init__(self, torch, args, warn_only):
        from transformers import GPT2Config, GPT2LMHeadModel

        self.torch = torch
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        torch.manual_seed(0)
        config = GPT2Config()
        # Built on the CPU so the initial weights come from the CPU generator,
        # the same in every process whatever the allocator.
        self.model = GPT2LMHeadModel(config).to("cuda")
        self.model.train()
        tokens = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=tokens).to("cuda")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.attn = getattr(self.model.config, "_attn_implementation", None)

    def step(self):
        """One step from a synchronized device to a synchronized device: its
        wall time, the time until its last kernel was queued, and its loss."""
        torch = self.torch
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        queued = time.perf_counter() - start
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return seconds, queued, loss.item()

    def close(self):
        del self.model, self.optimizer, self.ids


def train(torch, args, warn_only, memory, step_stats=None):
    """step_stats: None, or a function giving the allocator's counters, taken
    after every step (backend calls and allocations per step)."""
    trainer = Trainer(torch, args, warn_only)
    losses, times, counters = [], [], []
    # Where each step's time goes on the host, to tell a host-bound step
    # from a device-bound one: its bounds on CLOCK_MONOTONIC (to line up
    # with bench/cpu_probe.c's samples), the time until the last kernel of
    # the step was queued, and the main thread's CPU time. (The process's
    # CPU time is left out: synchronize() spins, so it only follows the
    # step's wall time.)
    # host_s: a fixed piece of Python run just before the step, timed: the
    # main thread's speed at that moment on its own core (the step is
    # mostly the host queueing kernels, and this machine's host speed
    # drifts by 15% over seconds).
    timing = {"start_mono_ns": [], "end_mono_ns": [], "queued_s": [], "thread_cpu_s": [],
              "host_s": []}
    free, total = torch.cuda.mem_get_info()
    driver_peak = total - free
    for step in range(args.steps):
        torch.cuda.synchronize()
        timing["host_s"].append(host_probe())
        start_mono = time.monotonic_ns()
        start_thread = time.thread_time()
        seconds, queued, loss = trainer.step()
        times.append(seconds)
        timing["start_mono_ns"].append(start_mono)
        timing["end_mono_ns"].append(time.monotonic_ns())
        timing["queued_s"].append(queued)
        timing["thread_cpu_s"].append(time.thread_time() - start_thread)
        losses.append(loss)
        free, total = torch.cuda.mem_get_info()
        driver_peak = max(driver_peak, total - free)
        extra = ""
        if step_stats:
            counters.append(step_stats())
            if len(counters) > 1:
                extra = ", " + ", ".join(f"{k} +{v - counters[-2][k]}" for k, v in counters[-1].items())
        print(
            f"[{args.allocator}] step {step + 1}/{args.steps} loss {losses[-1]:.6f} "
            f"{times[-1] * 1000:.1f} ms, driver used {(total - free) / MiB:.0f} MiB{extra}",
            flush=True,
        )
    memory.update(driver_used_peak_bytes=driver_peak, driver_total_bytes=total)
    memory["step_timing"] = timing
    if counters:
        memory["step_counters"] = counters
    attn = trainer.attn
    trainer.close()
    return losses, times, attn


def reset_memory(torch, unimem_torch):
    gc.collect()
    torch.cuda.synchronize()
    if unimem_torch:
        unimem_torch.empty_cache()
        unimem_torch.reset_peak_memory_stats()
    else:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def step_stats(unimem_torch):
    """unimem's counters after a step: backend calls (a page mapped or
    unmapped, an event recorded or polled...) and allocations."""
    if not unimem_torch:
        return None

    def take():
        s = unimem_torch.raw_stats()
        return {"backend_calls": s["num_backend_calls"], "allocs": s["num_allocs"]}

    return take


def run_one(args):
    started = time.perf_counter()
    import torch

    unimem_torch = None
    if args.allocator == "unimem":
        sys.path.insert(0, os.path.join(REPO, "integrations", "torch"))
        import unimem_torch

        lib = resolve_lib(args.lib)
        if not os.path.isfile(lib):
            print(f"gpt2_e2e: {lib} does not exist; build it or pass --lib", file=sys.stderr)
            return 2
        unimem_torch.install(lib)
    import transformers

    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    memory = {"driver_used_before_bytes": total - free}
    mode = "strict"
    try:
        losses, times, attn = train(torch, args, False, memory, step_stats(unimem_torch))
    except RuntimeError as err:
        if "deterministic" not in str(err):
            raise
        mode = "warn_only"
        print(
            f"gpt2_e2e: a kernel has no deterministic implementation ({str(err).splitlines()[0]}); "
            "running again with use_deterministic_algorithms(True, warn_only=True)",
            flush=True,
        )
    if mode == "warn_only":
        # Outside the except clause, so the failed attempt's frames (and its
        # model) are gone before the memory is reset.
        reset_memory(torch, unimem_torch)
        losses, times, attn = train(torch, args, True, memory, step_stats(unimem_torch))

    torch.cuda.synchronize()
    result = {
        "allocator": args.allocator,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device": torch.cuda.get_device_name(),
        "deterministic": mode,
        "attn_implementation": attn,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "losses": losses,
        "step_times_s": times,
        "median_step_time_s": statistics.median(times[4:]) if len(times) > 4 else None,
    }
    result.update(memory)
    if unimem_torch:
        stats = unimem_torch.raw_stats()
        result["peak_reserved_bytes"] = stats["peak_reserved_bytes"]
        result["peak_live_bytes"] = stats["peak_active_bytes"]
        result["unimem_stats"] = stats
        result["library"] = unimem_torch.library_path()
    else:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["peak_live_bytes"] = torch.cuda.max_memory_allocated()
        stats = torch.cuda.memory_stats()
        result["torch_memory_stats"] = {
            key: stats.get(key)
            for key in (
                "allocated_bytes.all.peak",
                "reserved_bytes.all.peak",
                "requested_bytes.all.peak",
                "num_alloc_retries",
                "num_ooms",
                "num_device_alloc",
                "num_device_free",
            )
        }
    result["wall_s"] = time.perf_counter() - started
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


# ------------------------------------------------------------ comparison


def ratio(a, b):
    return a / b if a is not None and b else None


def compare(results):
    t, u = results["torch"], results["unimem"]
    if "losses" not in t or "losses" not in u:
        return {"error": "a run failed; nothing to compare"}
    diffs = [abs(a - b) for a, b in zip(t["losses"], u["losses"])]
    same_length = len(t["losses"]) == len(u["losses"])
    return {
        "losses_max_abs_diff": max(diffs) if diffs and same_length else None,
        "losses_identical": bool(same_length and diffs and max(diffs) == 0.0),
        "deterministic_modes": [t["deterministic"], u["deterministic"]],
        "step_time_ratio_unimem_over_torch": ratio(u["median_step_time_s"], t["median_step_time_s"]),
        "fastest_step_ratio_unimem_over_torch": ratio(u.get("fastest_step_time_s"), t.get("fastest_step_time_s")),
        "p10_step_ratio_unimem_over_torch": ratio(u.get("p10_step_time_s"), t.get("p10_step_time_s")),
        "reserved_over_live": {
            name: ratio(r["peak_reserved_bytes"], r["peak_live_bytes"]) for name, r in results.items()
        },
        "peak_reserved_ratio_unimem_over_torch": ratio(u["peak_reserved_bytes"], t["peak_reserved_bytes"]),
        "peak_live_ratio_unimem_over_torch": ratio(u["peak_live_bytes"], t["peak_live_bytes"]),
        "driver_used_peak_ratio_unimem_over_torch": ratio(
            u["driver_used_peak_bytes"], t["driver_used_peak_bytes"]
        ),
        "driver_used_growth_ratio_unimem_over_torch": ratio(
            u["driver_used_peak_bytes"] - u["driver_used_before_bytes"],
            t["driver_used_peak_bytes"] - t["driver_used_before_bytes"],
        ),
    }


def paired_ratios(runs):
    """unimem over PyTorch within each round (two runs back to back, so
    the machine's slower swings cancel), and their median."""
    pairs = [
        ratio(u.get("median_step_time_s"), t.get("median_step_time_s"))
        for t, u in zip(runs["torch"], runs["unimem"])
        if "error" not in t and "error" not in u
    ]
    pairs = [x for x in pairs if x is not None]
    return {
        "round_ratios_unimem_over_torch": pairs,
        "median_round_ratio_unimem_over_torch": statistics.median(pairs) if pairs else None,
    }


def same_host_speed_ratio(runs):
    """unimem's step time over PyTorch's where the host ran at the same
    speed: the step is mostly the host queueing kernels, and this
    machine's host speed drifts by 15-20% over seconds, so each
    allocator's steps (from the sixth: unimem's plan starts in the fifth)
    are fitted with a straight line against the Python loop timed before
    each (host_s), and the two lines are read at the pooled median. None
    without enough steps."""
    points = {}
    for a in ALLOCATORS:
        xs, ys = [], []
        for r in runs[a]:
            host = (r.get("step_timing") or {}).get("host_s") or []
            steps = r.get("step_times_s") or []
            for i in range(5, min(len(host), len(steps))):
                xs.append(host[i])
                ys.append(steps[i])
        if len(xs) < 3:
            return None
        points[a] = (xs, ys)
    lines, x0 = fits_at_same_speed(points)
    at = {a: c + b * x0 for a, (c, b) in lines.items()}
    return ratio(at["unimem"], at["torch"])


def fmt(value, scale=1.0, digits=1):
    return "-" if value is None else f"{value / scale:.{digits}f}"


def print_report(results, comparison):
    rows = [
        ("median step, steps 5-N, all rounds (ms)", "median_step_time_s", 1e-3, 2),
        ("peak live (MiB)", "peak_live_bytes", MiB, 1),
        ("peak reserved (MiB)", "peak_reserved_bytes", MiB, 1),
        ("driver used before (MiB)", "driver_used_before_bytes", MiB, 1),
        ("driver used peak (MiB)", "driver_used_peak_bytes", MiB, 1),
    ]
    print(f"\n{'':32} {'torch':>14} {'unimem':>14}")
    for label, key, scale, digits in rows:
        cells = [fmt(results[a].get(key), scale, digits) for a in ALLOCATORS]
        print(f"{label:32} {cells[0]:>14} {cells[1]:>14}")
    cells = [fmt(comparison.get("reserved_over_live", {}).get(a), 1, 4) for a in ALLOCATORS]
    print(f"{'reserved / live':32} {cells[0]:>14} {cells[1]:>14}")
    for a in ALLOCATORS:
        r = results[a]
        if "losses" in r:
            print(f"{a} losses ({r['deterministic']}): " + " ".join(f"{x:.6f}" for x in r["losses"]))
        else:
            print(f"{a}: FAILED: {r.get('error')}")
    if "error" not in comparison:
        print(
            f"losses max |diff| {comparison['losses_max_abs_diff']!r} "
            f"({'identical' if comparison['losses_identical'] else 'NOT identical'}); "
            f"step time unimem/torch {fmt(comparison['step_time_ratio_unimem_over_torch'], 1, 4)}; "
            f"peak reserved unimem/torch {fmt(comparison['peak_reserved_ratio_unimem_over_torch'], 1, 4)}; "
            f"driver peak unimem/torch {fmt(comparison['driver_used_peak_ratio_unimem_over_torch'], 1, 4)}"
        )
        pairs = comparison.get("round_ratios_unimem_over_torch") or []
        print(
            "step time unimem/torch by round: " + " ".join(f"{x:.4f}" for x in pairs) +
            f"; median {fmt(comparison.get('median_round_ratio_unimem_over_torch'), 1, 4)}; "
            f"fastest step {fmt(comparison.get('fastest_step_ratio_unimem_over_torch'), 1, 4)}, "
            f"10th percentile {fmt(comparison.get('p10_step_ratio_unimem_over_torch'), 1, 4)}; "
            f"at the same host speed {fmt(comparison.get('same_host_speed_ratio_unimem_over_torch'), 1, 4)}"
        )


def merge_rounds(runs):
    """One allocator's runs: the first run's figures, with the step time
    taken as the median of every run's steps 5..N together (the GPU
    machine's step time varies run to run, so runs alternate allocators)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    merged = dict(ok[0])
    steps = sorted(t for r in ok for t in r["step_times_s"][4:])
    merged["median_step_time_s"] = statistics.median(steps) if steps else None
    # This machine's GPU runs on a fast or a slow plateau (about 71 and 83
    # ms a step) and switches within a run, whichever the allocator: the
    # fastest steps compare the two where both ran fast.
    merged["fastest_step_time_s"] = steps[0] if steps else None
    merged["p10_step_time_s"] = steps[len(steps) // 10] if steps else None
    merged["round_median_step_times_s"] = [r["median_step_time_s"] for r in ok]
    merged["rounds"] = len(ok)
    merged["losses_same_every_round"] = all(r["losses"] == ok[0]["losses"] for r in ok)
    for key in ("peak_reserved_bytes", "peak_live_bytes", "driver_used_peak_bytes"):
        if all(r.get(key) is not None for r in ok):
            merged[key] = max(r[key] for r in ok)
    return merged


def run_child(args, allocator):
    # A control run puts PyTorch's allocator in unimem's slot too: the
    # ratio it reports is what the comparison reads when nothing differs.
    if args.control:
        allocator = "torch"
    fd, path = tempfile.mkstemp(prefix=f"gpt2_e2e_{allocator}_", suffix=".json")
    os.close(fd)
    os.unlink(path)
    command = [
        sys.executable, os.path.abspath(__file__), "--allocator", allocator, "--out", path,
        "--lib", resolve_lib(args.lib), "--steps", str(args.steps), "--batch", str(args.batch),
        "--seq", str(args.seq),
    ]
    env = dict(os.environ)
    if allocator == "unimem" and args.unimem_conf is not None:
        env["UNIMEM_CONF"] = args.unimem_conf
    print(f"gpt2_e2e: running {allocator}: {' '.join(command)}", flush=True)
    run_started = time.perf_counter()
    try:
        rc = subprocess.run(command, timeout=args.timeout, env=env).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc == 0 and os.path.exists(path):
        with open(path) as f:
            result = json.load(f)
        os.unlink(path)
    else:
        result = {"error": f"the {allocator} run failed (exit {rc}); its output is above"}
    result["process_wall_s"] = time.perf_counter() - run_started
    return result


def run_compare(args):
    started = time.perf_counter()
    runs = {a: [] for a in ALLOCATORS}
    # ABBA order: a drift of the machine's speed over the job (it moves
    # PyTorch's median by 15% between invocations minutes apart) then
    # weighs on both allocators alike instead of on whichever runs second.
    for r in range(args.rounds):
        for allocator in ALLOCATORS if r % 2 == 0 else ALLOCATORS[::-1]:
            runs[allocator].append(run_child(args, allocator))
    results = {a: merge_rounds(runs[a]) for a in ALLOCATORS}
    if args.unimem_conf is not None:
        results["unimem"]["unimem_conf"] = args.unimem_conf
    if args.control:
        print("gpt2_e2e: control run: both columns ran PyTorch's allocator")

    comparison = compare(results)
    comparison.update(paired_ratios(runs))
    comparison["same_host_speed_ratio_unimem_over_torch"] = same_host_speed_ratio(runs)
    report = {"results": results, "comparison": comparison,
              "total_wall_s": time.perf_counter() - started}
    print_report(results, comparison)
    print(f"total wall time {report['total_wall_s']:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"gpt2_e2e: wrote {args.out}")
    failed = any("error" in r for r in results.values())
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--compare", action="store_true", help="run both allocators (the default)")
    mode.add_argument("--allocator", choices=ALLOCATORS, help="run one allocator in this process")
    parser.add_argument("--out", help="JSON results file (required with --allocator)")
    parser.add_argument("--lib", default=DEFAULT_LIB, help=f"libunimem_torch.so (default {DEFAULT_LIB})")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs per allocator in --compare, in ABBA order (default 2)")
    parser.add_argument("--unimem-conf", default=None,
                        help="UNIMEM_CONF for the unimem runs of --compare (default: inherited)")
    parser.add_argument("--control", action="store_true",
                        help="in --compare, run PyTorch's allocator in unimem's slot too (an A/A run)")
    parser.add_argument("--timeout", type=float, default=110.0,
                        help="seconds each run may take in --compare (default 110: both within 4 minutes)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.steps < 5 or args.batch < 1 or args.seq < 1 or args.seq > 1024:
        parser.error("--steps must be >= 5 (steps 5..N are timed), --batch >= 1 and --seq 1..1024 (GPT-2's context)")
    if args.allocator:
        if not args.out:
            parser.error("--allocator needs --out FILE")
        return run_one(args)
    return run_compare(args)


if __name__ == "__main__":
    sys.exit(main())
