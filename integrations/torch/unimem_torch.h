/*
 * libunimem_torch.so: unimem as PyTorch's CUDA allocator.
 *
 * PyTorch loads the first two functions through
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "unimem_torch_alloc", "unimem_torch_free")
 * and unimem_torch.py calls the others through ctypes. Every function may be
 * called from any thread; the unimem context is created on first use and
 * lives until the process exits.
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
 * unimem_torch_last_error()). `device` is a torch CUDA ordinal. */
int unimem_torch_stats(int device, um_stats *out);
int unimem_torch_reset_peak(int device);
int unimem_torch_trim(int device);
/* Marks ptr (from unimem_torch_alloc) as used on `stream` (a cudaStream_t)
 * too, like PyTorch's Tensor.record_stream: no stream reuses it until the
 * work queued on `stream` before its free has completed. 0 or a status.
 * NULL and memory unimem does not manage are skipped (0), as PyTorch's
 * allocator skips tensors it did not allocate. */
int unimem_torch_record_stream(void *ptr, void *stream);
/* Gives every device's cached memory back to the driver (um_trim), as
 * torch.cuda.empty_cache() asks. 0 or the first failure's status. */
int unimem_torch_empty_cache(void);
/* Caps the device's reserved memory at `fraction` (0 < fraction <= 1) of
 * its total memory, as torch.cuda.set_per_process_memory_fraction asks. */
int unimem_torch_set_memory_fraction(double fraction, int device);
/* Where the library was built with PyTorch's C++ headers: makes PyTorch's
 * current allocator (the CUDAPluggableAllocator that loaded this library)
 * pass Tensor.record_stream, torch.cuda.empty_cache and
 * set_per_process_memory_fraction to the three calls above. 1 when done, 0
 * when the current allocator is not a pluggable one. Absent otherwise. */
int unimem_torch_connect(void);
/* sizeof(um_stats) as this library was built, so a ctypes mirror can check
 * that it matches. */
size_t unimem_torch_stats_size(void);
/* The most recent failure of any unimem_torch_* call in this process ("" if
 * none). Valid until the calling thread's next call of this function. */
const char *unimem_torch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* UNIMEM_TORCH_H */
