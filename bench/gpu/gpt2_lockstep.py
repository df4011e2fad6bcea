#!/usr/bin/env python3
"""GPT-2 small's step time on PyTorch's allocator and on unimem, the
processes taking their steps in turns.

    gpt2_lockstep.py [--steps N] [--no-control] [--out FILE] [--lib LIB]

Why: the GPU machine's host changes speed by 10-20% over seconds, and a
GPT-2 step is mostly the host queueing kernels, so two runs one after the
other (gpt2_e2e.py) differ by more than the 2% the comparison must tell.
Here three processes live at once, each with its own model, batch and
optimizer (gpt2_e2e.Trainer: the same seeds, so the same losses): PyTorch's
allocator, PyTorch's allocator again (the control), and unimem. They take
one step each per round, one at a time (each step starts and ends with the
device idle), in an order that goes through every permutation, so each
round's steps meet the same host. A step's ratio to the first process's
step of the same round cancels the host's drift; the geometric mean and
the median of those ratios over the rounds, each with a 95% interval from
a block bootstrap (blocks of consecutive rounds, since the host's states
last several rounds), are what the script reports. Keep the processes to
the same few CPUs (--cpus): they take turns, and on the GPU machine one
CPU can be slower than the rest for minutes, which would otherwise weigh
on whichever process the scheduler left there. The control's interval shows what
the method reads when nothing differs.

Peak memory is each process's own count (the driver's figure would be the
three processes' sum here; gpt2_e2e.py reports it).

Exits 0 when every process completed, whatever the numbers; 1 otherwise.
"""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import select  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gpt2_e2e  # noqa: E402  (this folder)

MiB = 1024 * 1024
BOOTSTRAP_SEED = 20261205
BOOTSTRAP_RESAMPLES = 2000


# ------------------------------------------------------------ one process


def reply(out, obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def is_determinism_error(err):
    return "deterministic" in str(err)


def current_cpu():
    """The CPU the calling thread last ran on (field 39 of its stat line)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def parse_cpus(text):
    """`0-3,8` -> {0, 1, 2, 3, 8}."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def child(args):
    """Builds the model, says `ready`, then runs one step per `step` line
    read from --ctl-in, answering each on --ctl-out; `end` writes the
    results to --out and exits."""
    if args.cpus:
        # Before torch starts any thread, so that every thread keeps to them.
        os.sched_setaffinity(0, args.cpus)
    ctl_in = os.fdopen(args.ctl_in, "r")
    ctl_out = os.fdopen(args.ctl_out, "w")
    # The control channel is separate, so anything printed goes to stderr's
    # log without breaking the protocol.
    sys.stdout = sys.stderr
    import torch

    unimem_torch = None
    if args.child == "unimem":
        sys.path.insert(0, os.path.join(gpt2_e2e.REPO, "integrations", "torch"))
        import unimem_torch

        unimem_torch.install(gpt2_e2e.resolve_lib(args.lib))
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.cuda.init()
    mode = "strict"
    trainer = gpt2_e2e.Trainer(torch, args, False)
    reply(ctl_out, {"ready": True})
    losses, times, cpus = [], [], []
    for line in ctl_in:
        command = line.strip()
        if command == "step":
            try:
                seconds, _, loss = trainer.step()
            except RuntimeError as err:
                # As in gpt2_e2e.py: a kernel without a deterministic
                # implementation shows on the first step; every process
                # then runs warn_only from a fresh model.
                if losses or mode != "strict" or not is_determinism_error(err):
                    raise
                mode = "warn_only"
                trainer.close()
                del trainer
                gpt2_e2e.reset_memory(torch, unimem_torch)
                trainer = gpt2_e2e.Trainer(torch, args, True)
                seconds, _, loss = trainer.step()
            losses.append(loss)
            times.append(seconds)
            cpus.append(current_cpu())
            reply(ctl_out, {"s": seconds, "loss": loss})
        elif command == "end":
            break
        else:
            raise SystemExit(f"gpt2_lockstep: unknown command {command!r}")
    result = {
        "allocator": args.child,
        "deterministic": mode,
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "attn_implementation": trainer.attn,
        "losses": losses,
        "step_times_s": times,
        "step_end_cpu": cpus,
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
    }
    if unimem_torch:
        stats = unimem_torch.raw_stats()
        result["peak_reserved_bytes"] = stats["peak_reserved_bytes"]
        result["peak_live_bytes"] = stats["peak_active_bytes"]
    else:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["peak_live_bytes"] = torch.cuda.max_memory_allocated()
    with open(args.out, "w") as f:
        json.dump(result, f)
    reply(ctl_out, {"bye": True})
    return 0


# ------------------------------------------------------------ coordinator


class Process:
    """One child process and its control pipes."""

    def __init__(self, label, allocator, args, log_dir):
        self.label, self.allocator = label, allocator
        self.out = os.path.join(log_dir, f"gpt2_lockstep_{label}.json")
        self.log_path = os.path.join(log_dir, f"gpt2_lockstep_{label}.log")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        command = [
            sys.executable, os.path.abspath(__file__), "--child", allocator,
            "--ctl-in", str(to_child_r), "--ctl-out", str(from_child_w), "--out", self.out,
            "--lib", gpt2_e2e.resolve_lib(args.lib), "--batch", str(args.batch), "--seq", str(args.seq),
        ]
        if args.cpus:
            command += ["--cpus", ",".join(map(str, sorted(args.cpus)))]
        env = dict(os.environ)
        if allocator == "unimem" and args.unimem_conf is not None:
            env["UNIMEM_CONF"] = args.unimem_conf
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(command, pass_fds=(to_child_r, from_child_w), env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""

    def send(self, command):
        os.write(self.to_child, (command + "\n").encode())

    def receive(self, timeout):
        """The child's next answer, or an error naming what went wrong."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.label}: no answer within {timeout:.0f} s (log: {self.log_path})")
            ready, _, _ = select.select([self.from_child], [], [], left)
            if not ready:
                continue
            data = os.read(self.from_child, 65536)
            if not data:
                raise RuntimeError(f"{self.label}: exited (code {self.proc.wait()}); its log is {self.log_path}")
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def block_bootstrap_interval(logs, statistic, block, seed=BOOTSTRAP_SEED, resamples=BOOTSTRAP_RESAMPLES):
    """95% interval of statistic(logs) (logs in round order), by a
    moving-block bootstrap: resampled series are made of runs of `block`
    consecutive rounds, which keeps the rounds' correlation."""
    n = len(logs)
    block = max(1, min(block, n))
    starts = n - block + 1
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        series = []
        while len(series) < n:
            s = rng.randrange(starts)
            series.extend(logs[s:s + block])
        values.append(statistic(series[:n]))
    values.sort()
    return values[int(0.025 * resamples)], values[min(resamples - 1, int(0.975 * resamples))]


def summarize(reference_logs, other_logs, reference_losses, other_losses, block):
    """other's steps over the reference's, round by round, given the steps'
    log times from the first compared round on."""
    logs = [o - r for r, o in zip(reference_logs, other_logs)]
    if len(logs) < 2:
        return {"error": "too few rounds to compare"}
    # A series at least five blocks long, or the resampled series would all
    # be nearly the same.
    block = max(1, min(block, len(logs) // 5))
    # Two statistics of the log ratios: the mean (the geometric mean of the
    # ratios) and the median, which a round where one process alone met the
    # host's slow state (a step takes 10-20% longer then) moves least.
    geo_low, geo_high = block_bootstrap_interval(logs, statistics.fmean, block)
    med_low, med_high = block_bootstrap_interval(logs, statistics.median, block)
    diffs = [abs(a - b) for a, b in zip(reference_losses, other_losses)]
    return {
        "rounds_compared": len(logs),
        "bootstrap_block": block,
        "geometric_mean_ratio": math.exp(statistics.fmean(logs)),
        "geometric_mean_interval_95": [math.exp(geo_low), math.exp(geo_high)],
        "median_ratio": math.exp(statistics.median(logs)),
        "median_ratio_interval_95": [math.exp(med_low), math.exp(med_high)],
        "losses_identical": reference_losses == other_losses,
        "losses_max_abs_diff": max(diffs) if diffs else None,
    }


def compare_all(results, skip, block):
    """Every comparison the report prints: the control and unimem over the
    first PyTorch process, unimem over the control, and unimem over both
    PyTorch processes (each round's reference the geometric mean of their
    two steps). Two processes with the same allocator differ by up to 2% on
    the GPU machine, for as long as they live, so unimem is read against
    both."""
    logs = {label: [math.log(t) for t in r["step_times_s"][skip:]] for label, r in results.items()}
    losses = {label: r["losses"] for label, r in results.items()}
    pairs = [(label, "torch") for label in ("torch_control", "unimem")]
    if "torch_control" in results:
        pairs.append(("unimem", "torch_control"))
    comparisons = {}
    for other, reference in pairs:
        if other in results:
            comparisons[f"{other} / {reference}"] = summarize(
                logs[reference], logs[other], losses[reference], losses[other], block)
    if "torch_control" in results and "unimem" in results:
        both = [(a + b) / 2 for a, b in zip(logs["torch"], logs["torch_control"])]
        comparisons["unimem / both PyTorch processes"] = summarize(
            both, logs["unimem"], losses["torch"], losses["unimem"], block)
    return comparisons


def print_report(report):
    results, comparisons, skip = report["results"], report["comparisons"], report["skip"]
    print(f"\nrounds {skip + 1}..{report['steps']}; 95% intervals by block bootstrap "
          f"(blocks of {report['bootstrap']['block']} rounds, seed {report['bootstrap']['seed']})")
    print(f"{'process':14} {'median step ms':>14} {'losses':>10} {'peak live MiB':>13} {'reserved/live':>13}")
    for label, r in results.items():
        rol = r["peak_reserved_bytes"] / r["peak_live_bytes"] if r.get("peak_live_bytes") else float("nan")
        print(f"{label:14} {statistics.median(r['step_times_s'][skip:]) * 1e3:14.2f} "
              f"{r['deterministic']:>10} {r['peak_live_bytes'] / MiB:13.1f} {rol:13.4f}")
    print(f"\n{'steps of / steps of':38} {'geo-mean ratio':>14} {'95% interval':>18} {'median ratio':>12} "
          f"{'95% interval':>18} {'losses':>10}")
    for name, c in comparisons.items():
        if "error" in c:
            print(f"{name:38} {c['error']}")
            continue
        print(f"{name:38} {c['geometric_mean_ratio']:14.4f} "
              f"{'[%.4f, %.4f]' % tuple(c['geometric_mean_interval_95']):>18} {c['median_ratio']:12.4f} "
              f"{'[%.4f, %.4f]' % tuple(c['median_ratio_interval_95']):>18} "
              f"{'identical' if c['losses_identical'] else 'DIFFER':>10}")
    for name, c in comparisons.items():
        if name.startswith("unimem") and "error" not in c:
            top = max(c["geometric_mean_interval_95"][1], c["median_ratio_interval_95"][1])
            print(f"{name}: at most 1.02 by both intervals' tops: {'yes' if top <= 1.02 else 'not shown'}")


def run(args):
    started = time.perf_counter()
    labels = [("torch", "torch")]
    if not args.no_control:
        labels.append(("torch_control", "torch"))
    labels.append(("unimem", "unimem"))
    if args.unimem_first:
        # The processes start (and open the GPU) in this order.
        labels.reverse()
    lib = gpt2_e2e.resolve_lib(args.lib)
    if not os.path.isfile(lib):
        print(f"gpt2_lockstep: {lib} does not exist; build it or pass --lib", file=sys.stderr)
        return 2
    log_dir = args.log_dir or os.path.dirname(os.path.abspath(args.out or "gpt2_lockstep.json"))
    os.makedirs(log_dir, exist_ok=True)
    procs = [Process(label, allocator, args, log_dir) for label, allocator in labels]
    orders = list(itertools.permutations(range(len(procs))))
    failed = None
    try:
        for p in procs:
            p.receive(args.setup_timeout)
        print(f"gpt2_lockstep: {len(procs)} processes ready after {time.perf_counter() - started:.1f} s; "
              f"{args.steps} rounds", flush=True)
        for step in range(args.steps):
            for i in orders[step % len(orders)]:
                procs[i].send("step")
                answer = procs[i].receive(args.step_timeout)
                if "s" not in answer:
                    raise RuntimeError(f"{procs[i].label}: unexpected answer {answer!r}")
            if (step + 1) % 50 == 0:
                print(f"gpt2_lockstep: round {step + 1}/{args.steps}", flush=True)
        for p in procs:
            p.send("end")
            p.receive(args.step_timeout)
    except RuntimeError as err:
        failed = str(err)
        print(f"gpt2_lockstep: {failed}", file=sys.stderr)
    finally:
        for p in procs:
            p.close()
    if failed:
        for p in procs:
            print(f"--- {p.label} log (last lines) ---", file=sys.stderr)
            with open(p.log_path) as f:
                sys.stderr.write("".join(f.readlines()[-20:]))
        return 1

    results = {}
    for p in procs:
        with open(p.out) as f:
            results[p.label] = json.load(f)
    report = {
        "command": sys.argv,
        "steps": args.steps,
        "skip": args.skip,
        "bootstrap": {"block": args.block, "resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED},
        "results": results,
        "comparisons": compare_all(results, args.skip, args.block),
        "total_wall_s": time.perf_counter() - started,
    }
    print_report(report)
    print(f"total wall time {report['total_wall_s']:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"gpt2_lockstep: wrote {args.out}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="rounds: steps per process (default 300)")
    parser.add_argument("--skip", type=int, default=10,
                        help="first rounds left out of the ratios (warm-up; unimem's plan starts in step 5)")
    parser.add_argument("--block", type=int, default=10, help="bootstrap block, in rounds (default 10)")
    parser.add_argument("--no-control", action="store_true", help="leave out the second PyTorch process")
    parser.add_argument("--out", help="JSON report (each process's log lies beside it)")
    parser.add_argument("--log-dir", help="where the processes' logs and results go (default: --out's folder)")
    parser.add_argument("--lib", default=gpt2_e2e.DEFAULT_LIB, help=f"libunimem_torch.so (default {gpt2_e2e.DEFAULT_LIB})")
    parser.add_argument("--unimem-conf", default=None, help="UNIMEM_CONF for the unimem process (default: inherited)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--unimem-first", action="store_true",
                        help="start unimem's process first (by default PyTorch's are started before it)")
    parser.add_argument("--cpus", type=parse_cpus, default=None,
                        help="CPUs every process is kept to, as 0-3,8 (default: inherited); they take turns, "
                        "so sharing them costs nothing")
    parser.add_argument("--setup-timeout", type=float, default=240.0, help="seconds for the processes to get ready")
    parser.add_argument("--step-timeout", type=float, default=60.0, help="seconds one step may take")
    # A child process (started by the coordinator).
    parser.add_argument("--child", choices=gpt2_e2e.ALLOCATORS, help=argparse.SUPPRESS)
    parser.add_argument("--ctl-in", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ctl-out", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--report", metavar="FILE",
                        help="print the comparisons of a saved --out FILE again (with --skip and --block if given)")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            report = json.load(f)
        report["skip"] = args.skip
        report["bootstrap"]["block"] = args.block
        report["comparisons"] = compare_all(report["results"], args.skip, args.block)
        print_report(report)
        return 0
    if args.child:
        if args.ctl_in is None or args.ctl_out is None or not args.out:
            parser.error("--child needs --ctl-in, --ctl-out and --out")
        return child(args)
    if args.steps < args.skip + 2 or args.skip < 0 or args.block < 1:
        parser.error("--steps must exceed --skip by at least 2, --skip >= 0 and --block >= 1")
    if args.batch < 1 or not 1 <= args.seq <= 1024:
        parser.error("--batch >= 1 and --seq 1..1024 (GPT-2's context)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
