// The one C++ piece of libunimem_torch.so, built only when PyTorch's headers
// are found: PyTorch's CUDAPluggableAllocator does not check the pointer its
// alloc function returns, so a failed allocation must be reported as the
// C++ exception PyTorch translates at the Python boundary. c10's
// OutOfMemoryError becomes torch.OutOfMemoryError; c10::Error RuntimeError.
// The exception unwinds through unimem_torch_alloc, which is compiled with
// -fexceptions and holds no lock or resource when it calls this.
#include <c10/util/Exception.h>

#include <string>

// Hidden: only unimem_torch.c calls it, resolved when the library is linked.
extern "C" __attribute__((visibility("hidden"))) void unimem_torch_throw(int out_of_memory,
                                                                        const char *message)
{
    const std::string text(message ? message : "unimem_torch: allocation failed");
    if (out_of_memory)
        C10_THROW_ERROR(OutOfMemoryError, text);
    C10_THROW_ERROR(Error, text);
}
