/* Prototype: what a recorded event costs the recording thread under
 * different buffer designs. Modes:
 *   plain   no recording (baseline)
 *   ring    records into one 512 KiB buffer reused by this thread (bound)
 *   writer  512 KiB chunks handed to a writer thread that write()s them to an
 *           unlinked file, chunks recycled (the committed design)
 *   mmap    records stored straight into a MAP_SHARED mapping of an unlinked
 *           file, grown SEG bytes at a time (MAP_POPULATE)
 *   anon    fresh anonymous segments (MAP_POPULATE), handed to the writer
 * clock: tsc or fake (a counter). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

typedef struct { uint64_t t, a0, a1; uint32_t dur; uint8_t k; int8_t d, s; uint8_t f; } rec;
static size_t CHUNK = 16384;
typedef struct chunk { struct chunk *next; uint32_t n; rec r[]; } chunk;
#define CHUNK_BYTES (sizeof(chunk) + CHUNK * sizeof(rec))

static int mode, fakeclk;
static long pf; /* records ahead to prefetch for writing (PF), 0 none */
static uint64_t fake;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static chunk *queue, *spare;
static int stop, fd;
static rec *cur, *end;
static chunk *cc;
static size_t seg_bytes = 2u << 20, file_off;
static uint64_t slow_ns;

static uint64_t now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1000000000ull + ts.tv_nsec; }

static void *writer(void *a) {
    (void)a;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!queue && !stop) pthread_cond_wait(&cv, &mu);
        chunk *c = queue; if (!c) break; queue = c->next;
        pthread_mutex_unlock(&mu);
        if (write(fd, c->r, c->n * sizeof(rec)) < 0) abort();
        pthread_mutex_lock(&mu);
        if (mode == 4) { pthread_mutex_unlock(&mu); munmap(c, CHUNK_BYTES); pthread_mutex_lock(&mu); }
        else { c->next = spare; spare = c; }
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static __attribute__((noinline)) rec *slow(void) {
    uint64_t t0 = now();
    if (mode == 1) { if (!cc) cc = malloc(CHUNK_BYTES); cur = cc->r; end = cur + CHUNK; }
    else if (mode == 2 || mode == 4) {
        pthread_mutex_lock(&mu);
        if (cc) { cc->n = CHUNK; cc->next = NULL; chunk **pp = &queue; while (*pp) pp = &(*pp)->next; *pp = cc; pthread_cond_signal(&cv); }
        if (mode == 2 && spare) { cc = spare; spare = cc->next; }
        else { pthread_mutex_unlock(&mu);
               cc = mode == 2 ? malloc(CHUNK_BYTES) : mmap(NULL, CHUNK_BYTES, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE, -1, 0);
               pthread_mutex_lock(&mu); }
        pthread_mutex_unlock(&mu);
        cur = cc->r; end = cur + CHUNK;
    } else if (mode == 3) {
        if (ftruncate(fd, file_off + seg_bytes)) abort();
        void *p = mmap(NULL, seg_bytes, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_POPULATE, fd, file_off);
        if (p == MAP_FAILED) abort();
        file_off += seg_bytes;
        cur = p; end = cur + seg_bytes / sizeof(rec);
    }
    slow_ns += now() - t0;
    return cur++;
}

static inline rec *slot(void) {
    rec *r = cur < end ? cur++ : slow();
    if (pf) __builtin_prefetch(r + pf, 1, 3);
    return r;
}
static inline void record(uint8_t k, uint64_t a0, uint64_t a1) {
    uint64_t t = fakeclk ? ++fake : __rdtsc();
    rec *r = slot();
    *r = (rec){t, a0, a1, 0, k, 1, -1, 0};
}

/* A stand-in allocator: a ring of 100 live blocks, a LIFO free list. */
#define LIVE 100
static void *blocks[LIVE];
static void *freelist[4096]; static int nfree;
static __attribute__((noinline)) void *xalloc(size_t s) { (void)s; return freelist[--nfree]; }
static __attribute__((noinline)) void xfree(void *p) { freelist[nfree++] = p; }

int main(int argc, char **argv) {
    const char *m = argc > 1 ? argv[1] : "plain";
    fakeclk = argc > 2 && !strcmp(argv[2], "fake");
    long pairs = argc > 3 ? atol(argv[3]) : 20000000;
    if (getenv("PF")) pf = atol(getenv("PF"));
    if (getenv("CHUNK_KB")) CHUNK = (size_t)atol(getenv("CHUNK_KB")) * 1024 / sizeof(rec);
    static const char *names[] = {"plain", "ring", "writer", "mmap", "anon"};
    for (mode = 0; mode < 5 && strcmp(m, names[mode]); mode++) ;
    if (mode == 5) return 2;
    const char *dir = getenv("TMPDIR"); char path[4096];
    snprintf(path, sizeof path, "%s/recproto-XXXXXX", dir ? dir : "/tmp");
    fd = mkstemp(path); unlink(path);
    pthread_t w; if (mode == 2 || mode == 4) pthread_create(&w, NULL, writer, NULL);
    static char arena[4096][64];
    for (int i = 0; i < 4096; i++) freelist[nfree++] = arena[i];
    for (int i = 0; i < LIVE; i++) blocks[i] = xalloc(64);
    uint64_t t0 = now();
    for (long i = 0; i < pairs; i++) {
        int j = i % LIVE;
        void *p = blocks[j];
        if (mode) { uint64_t t = fakeclk ? ++fake : __rdtsc(); xfree(p); rec *r = slot(); *r = (rec){t, 0, (uint64_t)p, 0, 6, 1, -1, 0}; }
        else xfree(p);
        p = xalloc(64);
        if (mode) record(5, 64, (uint64_t)p);
        blocks[j] = p;
    }
    uint64_t t1 = now();
    if (mode == 2 || mode == 4) { pthread_mutex_lock(&mu); stop = 1; pthread_cond_signal(&cv); pthread_mutex_unlock(&mu); pthread_join(w, NULL); }
    printf("%s %s pf %ld chunk %zu KiB: %.2f ns a pair (slow path %.2f ns a pair)\n", m, fakeclk ? "fake" : "tsc", pf, CHUNK * sizeof(rec) / 1024, (double)(t1 - t0) / pairs, (double)slow_ns / pairs);
    return 0;
}
