#!/usr/bin/env python3
"""PyTorch on unimem: install the allocator in this (fresh) process, then
check values, stream-ordered reuse, statistics, the OOM error, the memory
fraction, record_stream's skips, the refusal of CUDA graph capture and, on
two GPUs or more, that a process opens only the GPUs it uses.

Usage: test_torch.py --lib build/integrations/torch/libunimem_torch.so
Exits 77 (skipped) when torch is not installed or has no usable GPU.

test_torch.py --stub-torch --lib ... runs without PyTorch, with a stand-in
torch module (on the stand-in CUDA driver in CI): install() refuses a
library built without PyTorch's headers unless told otherwise, and the
statistics calls report errors and unused GPUs as they should.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import threading
import types
import warnings

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
MODULE_DIR = os.path.join(REPO, "integrations", "torch")
sys.path.insert(0, MODULE_DIR)

failures = []
passes = 0


def check(condition, what):
    global passes
    if condition:
        passes += 1
        print(f"ok   {what}")
    else:
        failures.append(what)
        print(f"FAIL {what}")


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def run_child(code, lib):
    """Runs Python `code` in a child process with this module's folder and
    the library as its arguments; returns its exit status and output."""
    proc = subprocess.run(
        [sys.executable, "-c", code, MODULE_DIR, lib], capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def install_after_cuda_init_is_refused(lib):
    """In a child process: install() after CUDA started must fail clearly."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import torch, unimem_torch\n"
        "torch.zeros(1, device='cuda')\n"
        "try:\n"
        "    unimem_torch.install(sys.argv[2])\n"
        "except RuntimeError as err:\n"
        "    print('refused:', err); sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    rc, output = run_child(code, lib)
    check(
        rc == 0 and "before CUDA is initialized" in output,
        f"install() after CUDA init raises a clear RuntimeError (rc {rc}: "
        f"{output.strip()[-300:]!r})",
    )


def graph_capture_is_refused(lib):
    """In a child process: CUDA graph capture raises a clear error before
    the capture begins, and eager work goes on. A child, since PyTorch's
    capture_begin puts the CUDA random generators into capture mode before
    it asks the allocator for a private pool, and the refusal leaves them
    there: random numbers fail in that process from then on."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import torch, unimem_torch\n"
        "unimem_torch.install(sys.argv[2])\n"
        "graph = torch.cuda.CUDAGraph(); side = torch.cuda.Stream(); error = None\n"
        "with torch.cuda.stream(side):\n"
        "    try:\n"
        "        graph.capture_begin(); graph.capture_end()\n"
        "    except RuntimeError as err:\n"
        "        error = str(err)\n"
        "    capturing = torch.cuda.is_current_stream_capturing()\n"
        "    eager = torch.ones(10, device='cuda').sum().item()\n"
        "print('error:', error); print('capturing:', capturing, 'eager:', eager)\n"
    )
    rc, output = run_child(code, lib)
    check(
        rc == 0 and "error: unimem: CUDA graph capture is not supported" in output,
        f"CUDA graph capture raises a clear error (rc {rc}: {output.strip()[-300:]!r})",
    )
    check("capturing: False eager: 10.0" in output, "no capture is left open; eager work goes on")


def stub_main(lib):
    """install() and the statistics calls with a stand-in torch module."""
    calls = []

    def make_allocator(path, alloc_name, free_name):
        calls.append(("CUDAPluggableAllocator", path, alloc_name, free_name))
        return "allocator"

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: False,
        current_device=lambda: 0,
        memory=types.SimpleNamespace(
            CUDAPluggableAllocator=make_allocator,
            change_current_allocator=lambda allocator: calls.append(("change", allocator)),
        ),
    )
    sys.modules["torch"] = torch
    import unimem_torch

    native = ctypes.CDLL(lib)
    native.unimem_torch_last_error.restype = ctypes.c_char_p
    can_throw = native.unimem_torch_can_throw()
    check(can_throw in (0, 1), f"unimem_torch_can_throw() answers 0 or 1 ({can_throw})")
    if can_throw == 0:
        refusal = None
        try:
            unimem_torch.install(lib)
        except RuntimeError as err:
            refusal = str(err)
        check(
            refusal is not None
            and "without PyTorch's C++ headers" in refusal
            and "UNIMEM_TORCH_DIR" in refusal
            and "allow_without_torch_headers=True" in refusal,
            f"install() refuses a build without PyTorch's headers and says how to rebuild "
            f"({refusal!r})",
        )
        check(not calls and not unimem_torch.is_installed(), "the refusal installs nothing")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            unimem_torch.install(lib, allow_without_torch_headers=True)
        check(
            unimem_torch.is_installed()
            and ("CUDAPluggableAllocator", lib, "unimem_torch_alloc", "unimem_torch_free") in calls
            and ("change", "allocator") in calls,
            f"allow_without_torch_headers=True installs it ({calls})",
        )
        check(
            any("CUDA graph" in str(w.message) for w in caught),
            "installing it warns that record_stream and CUDA graphs are not handled",
        )
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no real PyTorch allocator to connect to
            unimem_torch.install(lib)
        check(unimem_torch.is_installed(), "install() takes a build with PyTorch's headers")

    # No allocation yet: the GPU's statistics are zeros, its context unopened.
    stats = unimem_torch.memory_stats(0)
    check(
        stats["reserved_bytes.all.current"] == 0 and stats["num_allocs"] == 0,
        "an unused GPU's statistics are zeros",
    )
    error = None
    try:
        unimem_torch.raw_stats(7)
    except RuntimeError as err:
        error = str(err)
    check(error is not None and "cuda:7" in error, f"stats of a missing GPU raise ({error!r})")

    # Each thread reads its own failure's message.
    out = ctypes.byref(unimem_torch.UmStats())
    native.unimem_torch_stats.argtypes = [ctypes.c_int, ctypes.c_void_p]
    check(native.unimem_torch_stats(7, out) != 0, "stats of cuda:7 fail")
    other = threading.Thread(target=lambda: native.unimem_torch_stats(9, out))
    other.start()
    other.join()
    mine = native.unimem_torch_last_error().decode()
    check("cuda:7" in mine and "cuda:9" not in mine, f"the thread reads its own error ({mine!r})")

    print(f"{passes} passed, {len(failures)} failed")
    return 1 if failures else 0


def device0_context_active(lib, use_unimem):
    """In a child that uses cuda:1 alone: whether GPU 0's primary context is
    active (cuDevicePrimaryCtxGetState), or an error text."""
    code = (
        "import ctypes, sys; sys.path.insert(0, sys.argv[1]); import torch\n"
        "if sys.argv[3] == '1':\n"
        "    import unimem_torch; unimem_torch.install(sys.argv[2])\n"
        "torch.cuda.set_device(1)\n"
        "x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize()\n"
        "cuda = ctypes.CDLL('libcuda.so.1')\n"
        "dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()\n"
        "assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0\n"
        "assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0\n"
        "print('active', active.value)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, MODULE_DIR, lib, "1" if use_unimem else "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("active "):
            return int(line.split()[1])
    return (proc.stdout + proc.stderr).strip()[-300:]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lib", required=True, help="path of libunimem_torch.so")
    parser.add_argument(
        "--stub-torch", action="store_true", help="check install() with a stand-in torch module"
    )
    args = parser.parse_args()
    if args.stub_torch:
        return stub_main(os.path.abspath(args.lib))

    try:
        import torch
    except ImportError as err:
        skip(f"PyTorch is not installed for {sys.executable} ({err})")
    if not torch.cuda.is_available():
        skip(f"torch {torch.__version__}: torch.cuda.is_available() is False (no GPU or driver)")
    if not os.path.isfile(args.lib):
        print(f"FAIL: the library {args.lib} does not exist")
        return 1

    import unimem_torch

    install_after_cuda_init_is_refused(args.lib)
    graph_capture_is_refused(args.lib)

    check(not torch.cuda.is_initialized(), "CUDA is not initialized before install()")
    unimem_torch.install(args.lib)
    check(unimem_torch.is_installed(), "install() succeeded")
    torch.backends.cuda.matmul.allow_tf32 = False

    s1 = torch.cuda.Stream()
    s2 = torch.cuda.Stream()

    # Warm up what PyTorch keeps for the life of the process (cuBLAS
    # workspaces per stream), so the baseline below is the steady state.
    for stream in (torch.cuda.current_stream(), s1, s2):
        with torch.cuda.stream(stream):
            for dtype in (torch.float32, torch.float64):
                a = torch.ones(64, 64, dtype=dtype, device="cuda")
                (a @ a).sum().item()
            torch.arange(10, device="cuda").sum().item()
    torch.cuda.synchronize()
    del a

    base = unimem_torch.memory_stats()
    check(base["num_allocs"] > 0, f"unimem served the warm-up ({base['num_allocs']} allocations)")

    # Tensors of several sizes (small slab sizes to hundreds of MiB) on two
    # streams, all live at once.
    counts = [1, 7, 1000, 4096, 4097, 1 << 17, 3_000_001, 1 << 25]
    tensors, sums = [], []
    for i, n in enumerate(counts):
        with torch.cuda.stream(s1 if i % 2 == 0 else s2):
            t = torch.arange(n, dtype=torch.int64, device="cuda")
            tensors.append(t)
            sums.append(t.sum())
    torch.cuda.synchronize()
    for n, total in zip(counts, sums):
        check(total.item() == n * (n - 1) // 2, f"arange({n}) sums to {n * (n - 1) // 2}")
    live = tensors + sums
    live_bytes = sum(t.untyped_storage().nbytes() for t in live)
    spans = sorted((t.data_ptr(), t.data_ptr() + max(t.untyped_storage().nbytes(), 1)) for t in live)
    check(all(p % 256 == 0 for p, _ in spans), "every block is 256-byte aligned")
    check(
        all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), "live blocks do not overlap"
    )

    stats = unimem_torch.memory_stats()
    check(
        stats["requested_bytes"] - base["requested_bytes"] == live_bytes,
        f"requested bytes grew by exactly the live tensors' {live_bytes} "
        f"(grew {stats['requested_bytes'] - base['requested_bytes']})",
    )
    check(
        stats["allocated_bytes.all.current"] - base["allocated_bytes.all.current"] >= live_bytes,
        "allocated bytes cover the live tensors",
    )
    check(
        stats["allocated_bytes.all.peak"] >= base["allocated_bytes.all.current"] + live_bytes,
        "the allocated peak is at least what was live",
    )
    check(
        stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"],
        "reserved bytes cover allocated bytes",
    )
    check(
        stats["active_blocks"] - base["active_blocks"] == len(live),
        f"{len(live)} more live blocks (got {stats['active_blocks'] - base['active_blocks']})",
    )

    # A matmul against a CPU reference.
    gen = torch.Generator().manual_seed(0)
    a_cpu = torch.randn(512, 384, dtype=torch.float64, generator=gen)
    b_cpu = torch.randn(384, 256, dtype=torch.float64, generator=gen)
    with torch.cuda.stream(s2):
        c = a_cpu.cuda() @ b_cpu.cuda()
    s2.synchronize()
    check(torch.allclose(c.cpu(), a_cpu @ b_cpu, rtol=1e-10, atol=1e-10), "float64 matmul matches the CPU")
    del c

    # A block freed on a busy stream must not be handed to another stream
    # before that work has run: s1 sleeps, then fills x; x is freed at once
    # and s2 allocates and fills y meanwhile. Reuse too early shows as 1s in y
    # or 7s in x's sum.
    n = 1 << 22
    with torch.cuda.stream(s1):
        x = torch.empty(n, dtype=torch.float32, device="cuda")
        torch.cuda._sleep(200_000_000)
        x.fill_(1.0)
        x_sum = x.sum()
        del x
    with torch.cuda.stream(s2):
        y = torch.full((n,), 7.0, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    check(x_sum.item() == n, f"work on the freeing stream saw its own data (sum {x_sum.item()} == {n})")
    check(bool((y == 7.0).all()), "the other stream's block was not overwritten")
    del y, x_sum

    # Tensor.record_stream: x is made on s1 and read by a long kernel on s2,
    # marked for s2 and freed while s2 still reads it; s1 then writes 9s
    # into a new tensor of the same size. Handed back at once (as without
    # the mark), x's block would take the 9s before s2's sum reads it.
    check(
        unimem_torch.connected(),
        "the library passes record_stream, empty_cache and the memory fraction to unimem "
        "(built against PyTorch's C++ API)",
    )
    with torch.cuda.stream(s1):
        x = torch.ones(n, dtype=torch.float32, device="cuda")
    s2.wait_stream(s1)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(200_000_000)
        x_sum = x.sum()
    x.record_stream(s2)
    x_ptr = x.data_ptr()
    del x
    with torch.cuda.stream(s1):
        z = torch.full((n,), 9.0, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    check(x_sum.item() == n, f"record_stream: the marked stream read its data (sum {x_sum.item()} == {n})")
    check(z.data_ptr() != x_ptr, "record_stream: the block was not reused while the marked stream ran")
    del z, x_sum

    # record_stream of a storage that starts inside a unimem block (a DLPack
    # view of a slice) is skipped, as PyTorch's allocator skips DataPtrs it
    # did not allocate, not raised.
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    view = torch.utils.dlpack.from_dlpack(x[1024:])
    inner = view.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    error = None
    try:
        view.record_stream(s2)
    except RuntimeError as err:
        error = str(err)
    check(error is None, f"record_stream on a view starting inside a block is skipped "
          f"(storage starts inside: {inner}; error {error!r})")
    del view, x

    # Autograd frees and allocates on its own thread.
    w = torch.randn(300, 300, device="cuda", requires_grad=True)
    (w * w).sum().backward()
    check(torch.allclose(w.grad, 2 * w.detach()), "autograd's gradient is right")
    del w

    # Allocation from another Python thread, on its own stream.
    result = {}

    def worker():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            t = torch.arange(1 << 20, dtype=torch.int64, device="cuda")
            result["sum"] = t.sum().item()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    check(result.get("sum") == (1 << 20) * ((1 << 20) - 1) // 2, "a second thread allocates and computes")

    empty = torch.empty(0, device="cuda")
    check(empty.numel() == 0, "an empty tensor can be made")
    del empty

    del tensors, sums, live, t, total
    torch.cuda.synchronize()
    after = unimem_torch.memory_stats()
    check(
        after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"],
        f"allocated bytes are back to the baseline {base['allocated_bytes.all.current']} "
        f"(now {after['allocated_bytes.all.current']})",
    )
    check(
        after["requested_bytes"] == base["requested_bytes"],
        f"requested bytes are back to the baseline {base['requested_bytes']} (now {after['requested_bytes']})",
    )
    check(after["num_frees"] > base["num_frees"], "frees were counted")
    check(
        after["allocated_bytes.all.peak"] >= base["allocated_bytes.all.current"] + live_bytes,
        "the peak remembers the tensors",
    )

    unimem_torch.reset_peak_memory_stats()
    reset = unimem_torch.memory_stats()
    check(
        reset["allocated_bytes.all.peak"] == reset["allocated_bytes.all.current"],
        "reset_peak_memory_stats() restarts the peak from the current value",
    )
    torch.cuda.empty_cache()  # reaches unimem through the connected allocator
    trimmed = unimem_torch.memory_stats()
    check(
        reset["reserved_bytes.all.current"] > reset["allocated_bytes.all.current"]
        and trimmed["reserved_bytes.all.current"] < reset["reserved_bytes.all.current"]
        and trimmed["reserved_bytes.all.current"] >= trimmed["allocated_bytes.all.current"],
        f"torch.cuda.empty_cache() gives cached memory back ({reset['reserved_bytes.all.current']} -> "
        f"{trimmed['reserved_bytes.all.current']} reserved bytes, "
        f"{trimmed['allocated_bytes.all.current']} live)",
    )

    # Too large for the device: PyTorch's OOM error, and the pool still works.
    total_bytes = torch.cuda.mem_get_info()[1]
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    error = None
    try:
        huge = torch.empty(4 * total_bytes, dtype=torch.uint8, device="cuda")
        detail = f"no error; data_ptr {huge.data_ptr():#x} (library built without PyTorch's headers?)"
        del huge
    except oom_type as err:
        error = err
        detail = str(err).splitlines()[0]
    except RuntimeError as err:
        detail = f"{type(err).__name__} instead: {str(err).splitlines()[0]}"
    check(error is not None and "unimem" in str(error), f"a too-large tensor raises {oom_type.__name__}: {detail}")
    oom_stats = unimem_torch.memory_stats()
    check(oom_stats["num_ooms"] > trimmed["num_ooms"], f"the OOM was counted ({oom_stats['num_ooms']})")
    check(torch.ones(1000, device="cuda").sum().item() == 1000, "allocation works after an OOM")

    # torch.cuda.set_per_process_memory_fraction caps unimem's memory.
    over_quarter = total_bytes // 4 + (256 << 20)
    torch.cuda.set_per_process_memory_fraction(0.25)
    try:
        t = torch.empty(over_quarter, dtype=torch.uint8, device="cuda")
        capped = False
        del t
    except oom_type:
        capped = True
    torch.cuda.set_per_process_memory_fraction(1.0)
    t = torch.empty(over_quarter, dtype=torch.uint8, device="cuda")
    check(capped and t.numel() == over_quarter,
          "set_per_process_memory_fraction(0.25) refuses a third of the GPU, 1.0 allows it")
    del t

    # Below what live tensors hold (cuBLAS workspaces, `hold`), a fraction
    # is refused with both sizes, 0 included (accepted as in PyTorch, and
    # allowing nothing: tests/gpu/test_torch_shim.c checks that part), and
    # the previous limit stays.
    hold = torch.empty(total_bytes // 8, dtype=torch.uint8, device="cuda")
    for fraction in (0.01, 0.0):
        error = None
        try:
            torch.cuda.set_per_process_memory_fraction(fraction)
        except RuntimeError as err:
            error = str(err)
        check(
            error is not None and "reserved under live tensors" in error,
            f"set_per_process_memory_fraction({fraction}) below live memory raises, naming the "
            f"sizes ({error!r})",
        )
    more = torch.empty(total_bytes // 8, dtype=torch.uint8, device="cuda")
    check(more.numel() == total_bytes // 8, "the previous limit stays after a refused fraction")
    del hold, more
    torch.cuda.set_per_process_memory_fraction(1.0)

    if torch.cuda.device_count() >= 2:
        # This process used cuda:0 alone: cuda:1 has served nothing and its
        # statistics are zeros.
        other = unimem_torch.memory_stats(1)
        check(other["num_allocs"] == 0, "an unused GPU's statistics are zeros")
        # A stream of another GPU cannot order a block: refused, not ignored.
        x = torch.ones(1000, device="cuda:0")
        error = None
        try:
            x.record_stream(torch.cuda.Stream(device=1))
        except RuntimeError as err:
            error = str(err)
        check(error is not None and "with a stream of cuda:1" in error,
              f"record_stream with another GPU's stream raises ({error!r})")
        del x
        # A process that uses cuda:1 alone leaves GPU 0's context as
        # PyTorch's own allocator does (unimem used to open every GPU).
        with_unimem = device0_context_active(args.lib, True)
        without = device0_context_active(args.lib, False)
        check(
            isinstance(with_unimem, int) and with_unimem == without,
            f"using cuda:1 alone, GPU 0's context is as without unimem "
            f"(active with unimem: {with_unimem!r}, without: {without!r})",
        )

    print(f"{passes} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
