/* A pluggable allocator for PyTorch that does as little as it can, to
 * measure what torch.cuda.memory.CUDAPluggableAllocator itself costs per
 * tensor (bench/gpu/torch_alloc_cost.py): freed blocks wait in an
 * exact-size LIFO cache over cudaMalloc, behind one mutex. It ignores
 * streams (a block freed on one stream may go to another at once), so it
 * is only for single-stream measurements, never for real work.
 *
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include bench/gpu/null_plug.c \
 *      -L/usr/local/cuda/lib64 -lcudart -lpthread -o build-dev/null_plug.so
 */
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define BUCKETS 4096 /* distinct sizes; beyond that, blocks go back to cudaFree */
#define DEPTH 256    /* cached blocks per size */

typedef struct bucket {
    size_t size; /* 0: unused */
    int n;
    void *blocks[DEPTH];
} bucket;

static bucket table[BUCKETS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The bucket of size, claiming an empty one when create is set; NULL when
 * there is none. Under the lock. */
static bucket *bucket_of(size_t size, int create)
{
    size_t h = (size * 0x9e3779b97f4a7c15ull) >> 52; /* 12 bits: BUCKETS */
    for (size_t i = 0; i < BUCKETS; i++) {
        bucket *b = &table[(h + i) % BUCKETS];
        if (b->size == size)
            return b;
        if (b->size == 0) {
            if (!create)
                return NULL;
            b->size = size;
            return b;
        }
    }
    return NULL;
}

void *null_plug_alloc(size_t size, int device, void *stream)
{
    (void)device;
    (void)stream;
    if (size == 0)
        size = 1;
    pthread_mutex_lock(&lock);
    bucket *b = bucket_of(size, 0);
    void *p = b && b->n ? b->blocks[--b->n] : NULL;
    pthread_mutex_unlock(&lock);
    if (!p && cudaMalloc(&p, size) != cudaSuccess)
        return NULL;
    return p;
}

void null_plug_free(void *ptr, size_t size, int device, void *stream)
{
    (void)device;
    (void)stream;
    if (!ptr)
        return;
    if (size == 0)
        size = 1;
    pthread_mutex_lock(&lock);
    bucket *b = bucket_of(size, 1);
    int kept = b && b->n < DEPTH;
    if (kept)
        b->blocks[b->n++] = ptr;
    pthread_mutex_unlock(&lock);
    if (!kept)
        cudaFree(ptr);
}
