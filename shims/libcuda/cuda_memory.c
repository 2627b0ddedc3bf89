/*
 * libcuda's memory: cuMemAlloc hands out unique addresses from a per-GPU window, backed by this
 * process's own memory reserved lazily (MAP_NORESERVE: only what is written costs anything), and
 * adds the size to this process's record (cuda_accounting.c). The allocation table (by address,
 * and sorted for "which allocation holds this pointer"), freed pages given back in batches,
 * pinned host memory, cuMemFree, a context's memory freed at its end, cuMemGetInfo.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Device addresses: a 1 TiB window per GPU index, in the range real UVA pointers use
   (0x7000_0000_0000 + index x 2^40 where that is free). A window is reserved at the GPU's first
   allocation as one private anonymous MAP_NORESERVE mapping: it costs address space, and memory
   only where a program writes (an "80 GB" device costs what is copied into it). Freeing gives
   the pages back (MADV_DONTNEED), so freed memory reads back as zeros. */
#define VA_BASE 0x700000000000ull
#define VA_WINDOW (1ull << 40)
#define ALIGN 512ull

struct alloc {
    CUdeviceptr ptr;  /* 0: empty, 1: deleted */
    uint64_t size;
    unsigned gi;
    unsigned kind;    /* MOKKA_MEM_DEVICE, _MANAGED (both accounted to GPU gi) or _HOST */
    CUcontext ctx;    /* destroying it frees the allocation */
};

static struct alloc *g_allocs;   /* open addressing, linear probing */
static size_t g_cap, g_used_slots, g_live;
/* The same allocations sorted by address, for "which allocation holds this pointer" (copies,
   pointer attributes): a bump allocator appends, so the usual insert and free are at the end. */
static struct mokka_range *g_ranges;
static size_t g_nranges, g_ranges_cap;
static uint64_t g_bump[MOKKA_MAX_GPUS];
static uint64_t g_window[MOKKA_MAX_GPUS]; /* each GPU's reserved address window; 0: not yet */
static unsigned g_nrelease;               /* freed ranges waiting to go back (release_later) */
static uint64_t g_release_bytes;

/* The child of a fork starts with no allocations. The parent's table is left behind, not freed:
   a thread may have been resizing it at fork time. */
static void mem_after_fork_child(void)
{
    memset(g_bump, 0, sizeof(g_bump));
    g_allocs = NULL;
    g_cap = g_used_slots = g_live = 0;
    g_ranges = NULL; /* left behind, like the table */
    g_nranges = g_ranges_cap = 0;
    g_nrelease = 0;
    g_release_bytes = 0;
}

__attribute__((constructor)) static void mem_register_fork(void) { pthread_atfork(NULL, NULL, mem_after_fork_child); }

static size_t hash(CUdeviceptr p, size_t cap) { return (size_t)((p >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static int table_insert(struct alloc a)
{
    if ((g_used_slots + 1) * 2 > g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 1024;
        if (g_live * 4 < g_cap)
            cap = g_cap; /* mostly tombstones: rehash at the same size */
        struct alloc *t = calloc(cap, sizeof(*t));
        if (!t)
            return 0;
        for (size_t i = 0; i < g_cap; i++) {
            if (g_allocs[i].ptr > 1) {
                size_t h = hash(g_allocs[i].ptr, cap);
                while (t[h].ptr)
                    h = (h + 1) & (cap - 1);
                t[h] = g_allocs[i];
            }
        }
        free(g_allocs);
        g_allocs = t;
        g_cap = cap;
        g_used_slots = g_live;
    }
    if (g_nranges == g_ranges_cap) { /* room in the sorted index first: nothing to undo after */
        size_t cap = g_ranges_cap ? g_ranges_cap * 2 : 256;
        struct mokka_range *r = realloc(g_ranges, cap * sizeof(*r));
        if (!r)
            return 0;
        g_ranges = r;
        g_ranges_cap = cap;
    }
    size_t h = hash(a.ptr, g_cap);
    while (g_allocs[h].ptr > 1)
        h = (h + 1) & (g_cap - 1);
    if (g_allocs[h].ptr == 0)
        g_used_slots++;
    g_allocs[h] = a;
    g_live++;
    size_t at = g_nranges; /* sorted by address; a bump allocation goes last */
    while (at > 0 && g_ranges[at - 1].ptr > a.ptr)
        at--;
    memmove(&g_ranges[at + 1], &g_ranges[at], (g_nranges - at) * sizeof(*g_ranges));
    g_ranges[at] = (struct mokka_range){a.ptr, a.size, a.gi, a.kind, a.ctx};
    g_nranges++;
    return 1;
}

static struct alloc *table_find(CUdeviceptr p)
{
    if (!g_cap)
        return NULL;
    for (size_t h = hash(p, g_cap), n = 0; g_allocs[h].ptr && n < g_cap; h = (h + 1) & (g_cap - 1), n++)
        if (g_allocs[h].ptr == p)
            return &g_allocs[h];
    return NULL;
}

/* The index of the last range starting at or below p (g_nranges if none). */
static size_t range_at_or_below(uint64_t p)
{
    size_t lo = 0, hi = g_nranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_ranges[mid].ptr <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? lo - 1 : g_nranges;
}

static void range_remove(uint64_t p)
{
    size_t i = range_at_or_below(p);
    if (i < g_nranges && g_ranges[i].ptr == p) {
        memmove(&g_ranges[i], &g_ranges[i + 1], (g_nranges - i - 1) * sizeof(*g_ranges));
        g_nranges--;
    }
}

int mokka_mem_find(uint64_t p, uint64_t n, struct mokka_range *out)
{
    pthread_mutex_lock(&g_acct_lock);
    size_t i = range_at_or_below(p);
    int ok = i < g_nranges && p - g_ranges[i].ptr < g_ranges[i].size &&
             n <= g_ranges[i].size - (p - g_ranges[i].ptr);
    if (ok && out)
        *out = g_ranges[i];
    pthread_mutex_unlock(&g_acct_lock);
    return ok;
}

/* GPU index gi's window (g_acct_lock held); 0 if no address space is left. Where its usual
   place is taken, anywhere the kernel puts it. */
static uint64_t window_of(unsigned gi)
{
    if (g_window[gi])
        return g_window[gi];
    int saved = errno;
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *m = mmap((void *)(uintptr_t)(VA_BASE + gi * VA_WINDOW), VA_WINDOW, PROT_READ | PROT_WRITE,
                   flags | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED)
        m = mmap(NULL, VA_WINDOW, PROT_READ | PROT_WRITE, flags, -1, 0);
    errno = saved;
    if (m == MAP_FAILED)
        return 0;
    g_window[gi] = (uint64_t)(uintptr_t)m;
    return g_window[gi];
}

/* A fresh address range of `size` bytes on GPU index gi (g_acct_lock held); 0 if the window is
   full. Freeing the newest allocation hands its range back, so alloc/free loops reuse it. */
static CUdeviceptr va_take(unsigned gi, uint64_t size)
{
    uint64_t base = window_of(gi);
    if (!base)
        return 0;
    if (g_bump[gi] < base)
        g_bump[gi] = base;
    if (g_bump[gi] + size > base + VA_WINDOW) { /* wrapped: restart after the highest live range */
        uint64_t top = base;
        for (size_t i = 0; i < g_cap; i++)
            if (g_allocs[i].ptr > 1 && g_allocs[i].gi == gi && g_allocs[i].kind != MOKKA_MEM_HOST &&
                g_allocs[i].ptr + g_allocs[i].size > top)
                top = g_allocs[i].ptr + g_allocs[i].size;
        g_bump[gi] = top;
        if (top + size > base + VA_WINDOW)
            return 0;
    }
    CUdeviceptr p = g_bump[gi];
    g_bump[gi] += size;
    return p;
}

/* Freed device pages go back to the kernel (MADV_DONTNEED), but not one system call per free: a
   freed range waits in a short queue, and an allocation that takes it again (an alloc/free loop,
   a framework's pool) takes it off without a system call. The queue is released when it holds 32
   ranges or 64 MiB; a bigger range goes at once. So at most 64 MiB of freed memory stays resident.
   All under g_acct_lock. */
#define RELEASE_SLOTS 32
#define RELEASE_BYTES (64ull << 20)
static struct { uint64_t lo, hi; } g_release[RELEASE_SLOTS];

static void release_now(uint64_t lo, uint64_t hi)
{
    int saved = errno;
    madvise((void *)(uintptr_t)lo, hi - lo, MADV_DONTNEED);
    errno = saved;
}

static void release_drop(unsigned i, int now)
{
    if (now)
        release_now(g_release[i].lo, g_release[i].hi);
    g_release_bytes -= g_release[i].hi - g_release[i].lo;
    g_release[i] = g_release[--g_nrelease];
}

/* The whole pages of a freed range [p, p + size): a neighbour may share its ends. */
static void release_later(uint64_t p, uint64_t size)
{
    uint64_t lo = (p + 4095) & ~4095ull, hi = (p + size) & ~4095ull;
    if (hi <= lo)
        return;
    if (hi - lo >= RELEASE_BYTES) {
        release_now(lo, hi);
        return;
    }
    if (g_nrelease == RELEASE_SLOTS || g_release_bytes + (hi - lo) > RELEASE_BYTES)
        while (g_nrelease)
            release_drop(g_nrelease - 1, 1);
    g_release[g_nrelease].lo = lo;
    g_release[g_nrelease].hi = hi;
    g_nrelease++;
    g_release_bytes += hi - lo;
}

/* A new allocation [p, p + size): queued ranges inside it are simply in use again; one that only
   overlaps it is released now (the new allocation's contents are undefined, zeros will do). */
static void release_reused(uint64_t p, uint64_t size)
{
    for (unsigned i = g_nrelease; i-- > 0;)
        if (g_release[i].lo < p + size && p < g_release[i].hi)
            release_drop(i, !(p <= g_release[i].lo && g_release[i].hi <= p + size));
}

/* Pinned host memory (cuMemAllocHost, cuMemHostAlloc): pages of this process, not the GPU's,
   so not accounted; not locked either (RLIMIT_MEMLOCK would refuse most programs). */
static CUdeviceptr host_take(uint64_t size)
{
    int saved = errno;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    errno = saved;
    return m == MAP_FAILED ? 0 : (CUdeviceptr)(uintptr_t)m;
}

CUresult mokka_mem_alloc(CUdeviceptr *dptr, size_t bytesize, unsigned kind)
{
    ARG(dptr);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = mokka_current_ctx(&c, &ci);
    if (r != CUDA_SUCCESS)
        return r;
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (lost(ci.dev))
        return CUDA_ERROR_UNKNOWN;
    unsigned gi = g_visible[ci.dev];
    if (kind == MOKKA_MEM_HOST) {
        if (bytesize > (1ull << 46))
            return CUDA_ERROR_OUT_OF_MEMORY;
        uint64_t size = ((uint64_t)bytesize + 4095) & ~4095ull;
        CUdeviceptr p = host_take(size);
        if (!p)
            return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_mutex_lock(&g_acct_lock);
        int ok = table_insert((struct alloc){p, size, gi, kind, c});
        pthread_mutex_unlock(&g_acct_lock);
        if (!ok) {
            munmap((void *)(uintptr_t)p, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *dptr = p;
        return CUDA_SUCCESS;
    }
    uint64_t total, usable, pinned;
    mokka_memory_limits(gi, &total, &usable, &pinned);
    if (bytesize > usable)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t size = ((uint64_t)bytesize + ALIGN - 1) & ~(ALIGN - 1);
    pthread_mutex_lock(&g_acct_lock);
    mokka_sync_slot();
    /* What counts against us is what the daemon last folded (at most a tick old): two processes
       racing for the last bytes may both succeed, as they could not on a real GPU. */
    uint64_t before = g_mine[gi];
    uint64_t prior = mokka_others_used(gi, total);
    prior = before < total - prior ? prior + before : total;
    CUdeviceptr p = 0;
    if ((prior > pinned ? prior : pinned) + size <= usable) {
        p = va_take(gi, size);
        if (p && !table_insert((struct alloc){p, size, gi, kind, c})) {
            if (g_bump[gi] == p + size)
                g_bump[gi] = p;
            p = 0;
        }
    }
    if (p) {
        release_reused(p, size);
        __atomic_store_n(&g_mine[gi], before + size, __ATOMIC_RELAXED);
        mokka_publish_mem(gi);
    }
    pthread_mutex_unlock(&g_acct_lock);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return mokka_mem_alloc(dptr, bytesize, MOKKA_MEM_DEVICE);
}

/* Forget an allocation (g_acct_lock held): device memory's bytes leave our total, its pages go
   back to the kernel and its range may be reused; host memory is unmapped. */
static void forget(struct alloc *a)
{
    unsigned gi = a->gi;
    int saved = errno;
    if (a->kind == MOKKA_MEM_HOST) {
        munmap((void *)(uintptr_t)a->ptr, a->size);
    } else {
        __atomic_store_n(&g_mine[gi], g_mine[gi] - a->size, __ATOMIC_RELAXED);
        if (g_bump[gi] == a->ptr + a->size)
            g_bump[gi] = a->ptr;
        release_later(a->ptr, a->size);
    }
    errno = saved;
    range_remove(a->ptr);
    a->ptr = 1;
    g_live--;
}

/* Free p, an allocation of `kind` (MOKKA_MEM_DEVICE: device or managed memory, cuMemFree's;
   MOKKA_MEM_HOST: cuMemFreeHost's). Anything else, or a pointer inside one, is INVALID_VALUE. */
CUresult mokka_mem_free(CUdeviceptr dptr, unsigned kind)
{
    INIT();
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_acct_lock);
    struct alloc *a = table_find(dptr);
    if (!a || (kind == MOKKA_MEM_HOST) != (a->kind == MOKKA_MEM_HOST)) {
        pthread_mutex_unlock(&g_acct_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    unsigned gi = a->gi, host = a->kind == MOKKA_MEM_HOST;
    forget(a);
    if (!host) {
        mokka_sync_slot();
        mokka_publish_mem(gi);
    }
    pthread_mutex_unlock(&g_acct_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return mokka_mem_free(dptr, MOKKA_MEM_DEVICE); }

/* A context's end frees what was allocated in it, as the driver does. */
void mokka_free_context_memory(CUcontext c)
{
    pthread_mutex_lock(&g_acct_lock);
    uint64_t touched = 0;
    for (size_t i = 0; i < g_cap; i++)
        if (g_allocs[i].ptr > 1 && g_allocs[i].ctx == c) {
            if (g_allocs[i].kind != MOKKA_MEM_HOST)
                touched |= 1ull << g_allocs[i].gi;
            forget(&g_allocs[i]);
        }
    if (touched) {
        mokka_sync_slot();
        for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++)
            if (touched >> gi & 1)
                mokka_publish_mem(gi);
    }
    pthread_mutex_unlock(&g_acct_lock);
}

/* The 32-bit ABI of CUDA < 3.2: addresses and sizes that fit in 32 bits, which ours never do. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    (void)bytesize;
    ARG(dptr);
    INIT();
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    INIT();
    return dptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    ARG(free_bytes);
    ARG(total_bytes);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = mokka_current_ctx(&c, &ci);
    if (r != CUDA_SUCCESS)
        return r;
    if (lost(ci.dev))
        return CUDA_ERROR_UNKNOWN;
    unsigned gi = g_visible[ci.dev];
    uint64_t total, usable, pinned;
    mokka_memory_limits(gi, &total, &usable, &pinned);
    pthread_mutex_lock(&g_acct_lock);
    mokka_sync_slot();
    uint64_t used = mokka_others_used(gi, total), mine = LOAD(&g_mine[gi]);
    pthread_mutex_unlock(&g_acct_lock);
    used = mine < total - used ? used + mine : total;
    if (pinned > used)
        used = pinned;
    *free_bytes = used < usable ? usable - used : 0;
    *total_bytes = total;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    ARG(free_bytes);
    ARG(total_bytes);
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_bytes = f > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)f;
        *total_bytes = t > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)t;
    }
    return r;
}

/* For cuda_runtime.c (cuda_internal.h). */
int mokka_device_address(uint64_t p)
{
    for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++) {
        uint64_t base = __atomic_load_n(&g_window[gi], __ATOMIC_RELAXED);
        if (base && p - base < VA_WINDOW)
            return 1;
    }
    return 0;
}
