"""unimem as PyTorch's CUDA allocator.

    import unimem_torch
    unimem_torch.install()          # before any CUDA tensor exists
    ...
    print(unimem_torch.memory_stats())

install() loads libunimem_torch.so into torch.cuda.memory.CUDAPluggableAllocator.
CUDA graph capture (torch.cuda.graph, make_graphed_callables,
torch.compile(mode="reduce-overhead"), torch.cuda.MemPool) is not supported
and raises "unimem: CUDA graph capture is not supported".
PyTorch's own statistics (torch.cuda.memory_stats, max_memory_reserved, ...)
are not available for a pluggable allocator; memory_stats() here gives the
same keys where they mean the same thing, from unimem's exact counters.
Only ctypes and torch are needed.
"""

import ctypes
import os
import warnings

__all__ = [
    "UmStats",
    "install",
    "is_installed",
    "connected",
    "library_path",
    "find_library",
    "memory_stats",
    "raw_stats",
    "reset_peak_memory_stats",
    "empty_cache",
]

LIBRARY_NAME = "libunimem_torch.so"


class UmStats(ctypes.Structure):
    """Mirror of um_stats in include/unimem.h, field for field."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("active_bytes", ctypes.c_size_t),
        ("requested_bytes", ctypes.c_size_t),
        ("reserved_bytes", ctypes.c_size_t),
        ("cached_bytes", ctypes.c_size_t),
        ("peak_active_bytes", ctypes.c_size_t),
        ("peak_reserved_bytes", ctypes.c_size_t),
        ("largest_free_bytes", ctypes.c_size_t),
        ("fragmentation", ctypes.c_double),
        ("active_blocks", ctypes.c_uint64),
        ("num_allocs", ctypes.c_uint64),
        ("num_frees", ctypes.c_uint64),
        ("num_backend_calls", ctypes.c_uint64),
        ("num_cache_hits", ctypes.c_uint64),
        ("num_ooms", ctypes.c_uint64),
    ]


_lib = None
_lib_path = None
_connected = False


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    yield os.path.join(here, LIBRARY_NAME)
    for build in ("build", "build-dev"):
        yield os.path.join(repo, build, "integrations", "torch", LIBRARY_NAME)


def find_library(path=None):
    """The library to load: `path`, else $UNIMEM_TORCH_LIB, else the first
    that exists of: next to this module, <repo>/build/integrations/torch/,
    <repo>/build-dev/integrations/torch/."""
    if path is None:
        path = os.environ.get("UNIMEM_TORCH_LIB") or None
        source = "UNIMEM_TORCH_LIB"
    else:
        source = "the path argument"
    if path is not None:
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"unimem_torch: {source} names {path}, which is not a file")
        return path
    tried = list(_candidates())
    for candidate in tried:
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"unimem_torch: {LIBRARY_NAME} not found; build it (cmake --build build) or pass its "
        "path to install() or in UNIMEM_TORCH_LIB. Tried: " + ", ".join(tried)
    )


def _load(path):
    """Loads the library for the stats calls and checks the struct mirror."""
    lib = ctypes.CDLL(path)
    lib.unimem_torch_stats.argtypes = [ctypes.c_int, ctypes.POINTER(UmStats)]
    lib.unimem_torch_stats.restype = ctypes.c_int
    lib.unimem_torch_reset_peak.argtypes = [ctypes.c_int]
    lib.unimem_torch_reset_peak.restype = ctypes.c_int
    lib.unimem_torch_trim.argtypes = [ctypes.c_int]
    lib.unimem_torch_trim.restype = ctypes.c_int
    lib.unimem_torch_last_error.argtypes = []
    lib.unimem_torch_last_error.restype = ctypes.c_char_p
    lib.unimem_torch_stats_size.argtypes = []
    lib.unimem_torch_stats_size.restype = ctypes.c_size_t
    can_throw = getattr(lib, "unimem_torch_can_throw", None)
    if can_throw is not None:
        can_throw.argtypes = []
        can_throw.restype = ctypes.c_int
    native = lib.unimem_torch_stats_size()
    if native != ctypes.sizeof(UmStats):
        raise RuntimeError(
            f"unimem_torch: um_stats is {native} bytes in {path} but {ctypes.sizeof(UmStats)} in "
            "UmStats: the ctypes mirror no longer matches include/unimem.h"
        )
    return lib


def _torch_headers_message(path):
    return (
        f"unimem_torch: {path} was built without PyTorch's C++ headers. A failed allocation then "
        "returns NULL, which PyTorch does not check: the tensor gets address 0 and its first "
        "kernel fails with an illegal memory access that breaks CUDA for the rest of the "
        "process. Tensor.record_stream, torch.cuda.empty_cache, "
        "set_per_process_memory_fraction and the refusal of CUDA graph capture are missing too. "
        "Rebuild it with PyTorch's headers: configure with the Python that has torch, e.g. "
        "cmake -S <unimem> -B build -DPython3_EXECUTABLE=$(which python3) "
        "-DUNIMEM_TORCH_DIR=$(python3 -c "
        "'import os, torch; print(os.path.dirname(torch.__file__))') "
        "&& cmake --build build (the configure step then prints 'unimem_torch: PyTorch OOM "
        "exceptions with ...'). To use this build anyway, pass allow_without_torch_headers=True "
        "to install()."
    )


def install(path=None, *, allow_without_torch_headers=False):
    """Makes unimem PyTorch's CUDA allocator for this process.

    Must run before CUDA is initialized (before the first CUDA tensor,
    torch.cuda.init(), ...): PyTorch cannot swap allocators after that.
    Calling it again with the same library does nothing. Returns the path of
    the library it loaded.

    A library built without PyTorch's C++ headers is refused (RuntimeError
    saying how to rebuild it): its failed allocations hand PyTorch a NULL
    pointer. allow_without_torch_headers=True installs it all the same."""
    global _lib, _lib_path
    import torch

    path = find_library(path)
    if _lib is not None:
        if os.path.realpath(path) == os.path.realpath(_lib_path):
            return _lib_path
        raise RuntimeError(
            f"unimem_torch: already installed from {_lib_path}; cannot switch to {path}"
        )
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "unimem_torch.install() must run before CUDA is initialized: PyTorch cannot change "
            "its allocator once a CUDA tensor exists or torch.cuda.init() has run. Call it at "
            "the start of the program."
        )
    lib = _load(path)
    # A library older than the capability query cannot say: it is treated
    # as one without the headers.
    can_throw = getattr(lib, "unimem_torch_can_throw", None)
    if (can_throw is None or can_throw() != 1) and not allow_without_torch_headers:
        raise RuntimeError(_torch_headers_message(path))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "unimem_torch_alloc", "unimem_torch_free"
    )
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as err:
        raise RuntimeError(
            "unimem_torch.install(): PyTorch refused to change its allocator (" + str(err) + "); "
            "it must run before any CUDA allocation"
        ) from err
    _lib, _lib_path = lib, path
    # Tensor.record_stream, torch.cuda.empty_cache,
    # set_per_process_memory_fraction and the refusal of CUDA graph capture
    # reach unimem only through PyTorch's C++ API, which the library has
    # where it was built against PyTorch.
    global _connected
    connect = getattr(lib, "unimem_torch_connect", None)
    if connect is not None:
        connect.argtypes = []
        connect.restype = ctypes.c_int
    _connected = connect is not None and connect() == 1
    if not _connected:
        warnings.warn(
            f"unimem_torch: {path} was built without PyTorch's CUDA C++ API: "
            "Tensor.record_stream() does nothing (synchronize a tensor's other streams before freeing it), "
            "torch.cuda.empty_cache() and set_per_process_memory_fraction() do not reach unimem "
            "(use unimem_torch.empty_cache() and UNIMEM_CONF=memory_limit=...), and CUDA graph "
            "capture is not refused although it is not supported: do not capture CUDA graphs",
            stacklevel=2,
        )
    return path


def is_installed():
    return _lib is not None


def connected():
    """True when Tensor.record_stream, torch.cuda.empty_cache and
    torch.cuda.set_per_process_memory_fraction reach unimem, and CUDA graph
    capture is refused."""
    return _connected


def library_path():
    """The library install() loaded, or None."""
    return _lib_path


def _device_index(device):
    import torch

    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"unimem_torch: {device} is not a CUDA device")
    return device.index if device.index is not None else torch.cuda.current_device()


def _require_lib():
    if _lib is None:
        raise RuntimeError("unimem_torch: call install() first")
    return _lib


def _check(rc, what):
    if rc != 0:
        # The library keeps the message per thread, and ctypes runs the call
        # and this read on the calling thread: another thread's failure in
        # between (ctypes releases the GIL) cannot replace it.
        message = _lib.unimem_torch_last_error().decode(errors="replace")
        raise RuntimeError(f"unimem_torch: {what} failed (status {rc}): {message}")


def raw_stats(device=None):
    """um_stats of the device as a dict with unimem's own field names."""
    lib = _require_lib()
    stats = UmStats()
    index = _device_index(device)
    _check(lib.unimem_torch_stats(index, ctypes.byref(stats)), f"stats of cuda:{index}")
    return {name: getattr(stats, name) for name, _ in UmStats._fields_}


def memory_stats(device=None):
    """Like torch.cuda.memory_stats(): PyTorch's keys where unimem counts the
    same thing, then every um_stats field under its own name.

    allocated/active bytes are the rounded sizes of live blocks (as in
    PyTorch); requested bytes are what the program asked for; reserved bytes
    are the physical pages unimem holds."""
    raw = raw_stats(device)
    stats = {
        "allocated_bytes.all.current": raw["active_bytes"],
        "allocated_bytes.all.peak": raw["peak_active_bytes"],
        "active_bytes.all.current": raw["active_bytes"],
        "active_bytes.all.peak": raw["peak_active_bytes"],
        "requested_bytes.all.current": raw["requested_bytes"],
        "reserved_bytes.all.current": raw["reserved_bytes"],
        "reserved_bytes.all.peak": raw["peak_reserved_bytes"],
        "allocation.all.current": raw["active_blocks"],
        "allocation.all.allocated": raw["num_allocs"],
        "allocation.all.freed": raw["num_frees"],
        "active.all.current": raw["active_blocks"],
        "num_ooms": raw["num_ooms"],
    }
    stats.update(raw)
    return stats


def reset_peak_memory_stats(device=None):
    """Peaks restart from the current values (torch.cuda.reset_peak_memory_stats)."""
    lib = _require_lib()
    index = _device_index(device)
    _check(lib.unimem_torch_reset_peak(index), f"reset_peak of cuda:{index}")


def empty_cache(device=None):
    """Returns the device's cached pages to the driver (torch.cuda.empty_cache,
    which does nothing for a pluggable allocator)."""
    lib = _require_lib()
    index = _device_index(device)
    _check(lib.unimem_torch_trim(index), f"trim of cuda:{index}")
