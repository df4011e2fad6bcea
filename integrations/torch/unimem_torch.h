/*
 * libunimem_torch.so: unimem as PyTorch's CUDA allocator.
 *
 * PyTorch loads the first two functions through
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "unimem_torch_alloc", "unimem_torch_free")
 * and unimem_torch.py calls the others through ctypes. Every function may be
 * called from any thread. Unless UNIMEM_CONF names devices, each torch
 * device cuda:N gets a unimem context of its own (devices=cuda:N and the
 * rest of UNIMEM_CONF), opened at its first allocation or memory fraction,
 * so that a process retains CUDA contexts only on the GPUs it uses; where
 * UNIMEM_CONF names devices, one context holds them all. Contexts live
 * until the process exits.
 */
#ifndef UNIMEM_TORCH_H
#define UNIMEM_TORCH_H

#include <stddef.h>

#include "unimem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates size bytes on CUDA device `device` (a torch ordinal), usable at
 * once on `stream` (a cudaStream_t; NULL is the legacy default stream).
 * On failure: throws torch.OutOfMemoryError (or RuntimeError for other
 * failures) when the library was built with PyTorch's headers, else
 * returns NULL. */
void *unimem_torch_alloc(size_t size, int device, void *stream);
/* Frees a block from unimem_torch_alloc; it becomes reusable once the work
 * queued on its allocation stream so far has completed. */
void unimem_torch_free(void *ptr, size_t size, int device, void *stream);

/* 0 on success, else the um_status of the failure (the message is in
 * unimem_torch_last_error()). `device` is a torch CUDA ordinal. A GPU that
 * has served no allocation yet has zero statistics (its context is not
 * opened for them). */
int unimem_torch_stats(int device, um_stats *out);
int unimem_torch_reset_peak(int device);
int unimem_torch_trim(int device);
/* Marks ptr (from unimem_torch_alloc) as used on `stream` (a cudaStream_t)
 * too, like PyTorch's Tensor.record_stream: no stream reuses it until the
 * work queued on `stream` before its free has completed. 0 or a status.
 * Pointers that are not the start of a live unimem block (NULL, memory of
 * another allocator, a pointer inside a block, a freed block) are skipped
 * (0), as PyTorch's allocator skips DataPtrs it did not allocate.
 * stream_device is the torch ordinal the stream belongs to, or -1 to ask
 * the driver (the block's own device where it cannot tell, and for the
 * default stream handles, which name no device); a stream of another GPU
 * than the block's is refused (UM_ERR_WRONG_DEVICE). */
int unimem_torch_record_stream(void *ptr, void *stream, int stream_device);
/* Gives every device's cached memory back to the driver (um_trim), as
 * torch.cuda.empty_cache() asks. 0 or the first failure's status. */
int unimem_torch_empty_cache(void);
/* Caps the device's reserved memory at `fraction` (0 <= fraction <= 1) of
 * its total memory, as torch.cuda.set_per_process_memory_fraction asks (0
 * allows no allocation). Below what unimem holds reserved it first returns
 * the cache; if live tensors still hold more, it fails with UM_ERR_BUSY and
 * a message naming both sizes, and the previous limit stays. */
int unimem_torch_set_memory_fraction(double fraction, int device);
/* Called when PyTorch begins allocating to a private pool (CUDA graph
 * capture, torch.cuda.MemPool): always refuses with UM_ERR_UNSUPPORTED and
 * the message "unimem: CUDA graph capture is not supported ...", which the
 * hook raises before the capture begins. */
int unimem_torch_begin_graph_capture(int device);
/* 1 when a failed allocation throws PyTorch's exception (the library was
 * built with PyTorch's headers), 0 when it returns NULL, which PyTorch
 * does not check: unimem_torch.install() refuses such a build unless told
 * otherwise. */
int unimem_torch_can_throw(void);
/* Where the library was built with PyTorch's C++ headers: makes PyTorch's
 * current allocator (the CUDAPluggableAllocator that loaded this library)
 * pass Tensor.record_stream, torch.cuda.empty_cache,
 * set_per_process_memory_fraction and the start of a CUDA graph capture to
 * the calls above. 1 when done, 0 when the current allocator is not a
 * pluggable one. Absent otherwise. */
int unimem_torch_connect(void);
/* sizeof(um_stats) as this library was built, so a ctypes mirror can check
 * that it matches. */
size_t unimem_torch_stats_size(void);
/* The calling thread's most recent failure of a unimem_torch_* call (""
 * if none), per thread as um_last_error(), so that no other thread's
 * failure overwrites it before the caller reads it. Valid until the
 * thread's next failing call. */
const char *unimem_torch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* UNIMEM_TORCH_H */
