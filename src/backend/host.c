/*
 * host: the backend of device 0, host RAM managed like a GPU's memory (one
 * memfd, VMM-style reserve/create/map; see vmm_memfd.h). The host runs no
 * asynchronous work, so its streams never hold queued work and every event
 * is complete as soon as it is recorded. Owns nothing beyond what
 * vmm_memfd owns for it.
 */
#include "vmm_memfd.h"

#include <string.h>
#include <unistd.h>

um_status um__host_backend_create(size_t capacity, size_t granularity, um__backend **out)
{
    if (capacity == 0) {
        /* The default is all of physical RAM: the memfd is sparse, so the
         * capacity is a limit, not a commitment. */
        long pages = sysconf(_SC_PHYS_PAGES);
        long page_size = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || page_size <= 0)
            return um__fail(UM_ERR_BACKEND,
                            "host: cannot size physical RAM (sysconf gave %ld pages of %ld "
                            "bytes); set host_capacity",
                            pages, page_size);
        capacity = (size_t)pages * (size_t)page_size;
    }
    return um__memfd_backend_create(UM_DEVICE_HOST, "host", capacity, granularity, out);
}
