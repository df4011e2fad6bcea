"""Kernel speed on memory from PyTorch's allocator and from unimem's.

    tlbprobe.py torch|unimem[-LABEL] [LIB]

Times (CUDA events, median of 20) kernels whose speed may depend on how
their memory is mapped: random gathers over 256 MiB and 4 GiB, a 1 GiB copy,
a bf16 GEMM and element-wise passes over 64 activation-sized tensors. Run it
once per allocator, alternating, in one job; with unimem, UNIMEM_CONF picks
the backend (cuda_vmm=0: cuMemAlloc segments instead of 2 MiB pages) and
LABEL names the variant in the output line. Prints one JSON line.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
which = sys.argv[1]
import torch  # noqa: E402

if which.startswith("unimem"):
    sys.path.insert(0, os.path.join(REPO, "integrations", "torch"))
    import unimem_torch

    unimem_torch.install(sys.argv[2] if len(sys.argv) > 2 else
                         os.path.join(REPO, "build-dev/integrations/torch/libunimem_torch.so"))
torch.cuda.init()


def t(fn, n=20):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2]


g = torch.Generator(device="cuda").manual_seed(0)
res = {}
big = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
big.fill_(1.0)
idx = torch.randint(0, big.numel(), (1 << 24,), device="cuda", generator=g)
res["gather_4g_16M_ms"] = t(lambda: big[idx])
idx2 = torch.randint(0, 1 << 26, (1 << 24,), device="cuda", generator=g)  # 256 MiB span
res["gather_256m_16M_ms"] = t(lambda: big[idx2])
a = torch.empty(1 << 28, dtype=torch.float32, device="cuda"); b = torch.empty_like(a)
res["copy_1g_ms"] = t(lambda: b.copy_(a))
m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
res["gemm_8192_bf16_ms"] = t(lambda: m @ m)
# many mid-size tensors, like activations
xs = [torch.randn(8 * 1024 * 768, device="cuda", dtype=torch.bfloat16) for _ in range(64)]
res["elementwise_64x12M_ms"] = t(lambda: [x.mul_(1.0001) for x in xs], 10)
print(which, json.dumps({k: round(v, 4) for k, v in res.items()}), flush=True)
