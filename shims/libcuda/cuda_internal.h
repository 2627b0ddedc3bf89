/*
 * What libcuda's source files share with one another (never exported: every name here is hidden,
 * and libcuda.map keeps every name local but the CUDA API). The driver is split by domain:
 * cuda_device.c discovery, CUDA_VISIBLE_DEVICES/MIG, init, errors, cuGetProcAddress and device
 * attributes; cuda_accounting.c this process's record with the daemon and compute modes;
 * cuda_context.c contexts and primary contexts; cuda_memory.c the allocation table, its address
 * windows and cuMemAlloc/cuMemFree/cuMemGetInfo; cuda_export.c the runtime's private tables;
 * cuda_runtime.c copies, streams, events, modules and launches.
 */
#ifndef MOKKA_CUDA_INTERNAL_H
#define MOKKA_CUDA_INTERNAL_H

#include "cuda_shim.h"
#include "mokka_client.h"

#include <pthread.h>

#pragma GCC visibility push(hidden)

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ARG(p)                                                       \
    do {                                                             \
        if (!(p))                                                    \
            return CUDA_ERROR_INVALID_VALUE;                         \
    } while (0)

/* ---- cuda_device.c: the devices cuInit found ---------------------------------------------- */

extern pthread_mutex_t g_lock;             /* cuInit, the primary contexts */
extern int g_initialized;                  /* cuInit succeeded */
extern int g_count;                        /* visible devices */
extern unsigned g_visible[MOKKA_MAX_GPUS]; /* CUdevice ordinal -> GPU index in the state */

/* The mapping to read: the client moves to the daemon's new file when it retires this one. */
static inline const struct mokka_state *state(void) { return mokka_state(); }

/* A consistent copy of n bytes at src, inside the mapping. src may lie in a mapping the client
   has just left: the daemon never writes a file again once it retired it, so that copy is
   stable whichever mapping's seqlock is checked. */
static inline void snap(const void *src, void *dst, size_t n) { mokka_read(state(), src, dst, n); }
#define SNAP(field, out) snap(&(field), &(out), sizeof(out))

static inline const struct mokka_gpu *gpu_of(CUdevice dev) { return &state()->gpus[g_visible[dev]]; }

static inline int lost(CUdevice dev) { return (int)__atomic_load_n(&gpu_of(dev)->lost, __ATOMIC_RELAXED); }

#define INIT()                                                       \
    do {                                                             \
        if (!LOAD(&g_initialized))                                   \
            return CUDA_ERROR_NOT_INITIALIZED;                       \
    } while (0)

/* A writer that died mid-publish left the records half-written: as libnvml's prologue does
   (nvml_internal.h, dev_check), a call that reads a device answers an error the API allows,
   CUDA_ERROR_UNKNOWN, after the one bounded wait (mokka_settled), never a torn value. */
#define SETTLED()                                                    \
    do {                                                             \
        const struct mokka_state *s_ = state();                      \
        if (__builtin_expect(s_ && !mokka_settled(s_), 0))           \
            return CUDA_ERROR_UNKNOWN;                               \
    } while (0)

#define DEVICE(dev)                                                  \
    do {                                                             \
        INIT();                                                      \
        if ((dev) < 0 || (dev) >= g_count)                           \
            return CUDA_ERROR_INVALID_DEVICE;                        \
        SETTLED();                                                   \
    } while (0)

/* A GPU that fell off the bus answers what the driver probed (name, UUID, PCI, attributes) but
   fails everything that would touch it, with the error applications report after Xid 79. */
#define LIVE_DEVICE(dev)                                             \
    do {                                                             \
        DEVICE(dev);                                                 \
        if (lost(dev))                                               \
            return CUDA_ERROR_UNKNOWN;                               \
    } while (0)

/* A MIG device as cuInit probed it (cuda_device.c, "CUDA_VISIBLE_DEVICES and MIG"). */
struct mig_view {
    uint32_t on;          /* the ordinal is a MIG device */
    uint32_t gi, ci;      /* its GPU and compute instance ids */
    uint32_t sm;
    uint64_t mem_total;   /* bytes: its GPU instance's memory */
    char name[96];
    char uuid[48];
};
extern struct mig_view g_mig_of[MOKKA_MAX_GPUS]; /* by GPU index; written in cuInit only */

/* ---- cuda_accounting.c: this process's record and compute modes ---------------------------- */

/* Guards the record, our totals and the allocation table (cuda_memory.c). */
extern pthread_mutex_t g_acct_lock;
extern uint64_t g_mine[MOKKA_MAX_GPUS]; /* bytes this process has allocated, by GPU index */
void mokka_sync_slot(void);             /* is the daemon still there? our record retaken if not */
void mokka_publish_mem(unsigned gi);    /* mirror our total on GPU index gi into the record */
/* Bytes that count against us on GPU index gi, as the daemon last told our record (at most cap). */
uint64_t mokka_others_used(unsigned gi, uint64_t cap);
/* Usable memory on GPU index gi and what the pin (if any) says is used. */
void mokka_memory_limits(unsigned gi, uint64_t *total, uint64_t *usable, uint64_t *pinned);
/* One context more (delta +1) or fewer (-1) on GPU index gi: compute modes, the daemon told. */
CUresult mokka_context_ref(unsigned gi, int delta);
/* GPU index gi's compute mode (NVML's numbers, which are CUDA's). */
static inline uint32_t compute_mode(unsigned gi)
{
    return __atomic_load_n(&state()->gpus[gi].compute_mode, __ATOMIC_RELAXED);
}

/* ---- cuda_context.c ------------------------------------------------------------------------ */

struct ctx_info {
    CUdevice dev;
    unsigned flags;
};
/* The thread's current context and what it is. */
CUresult mokka_current_ctx(CUcontext *out, struct ctx_info *info);

/* ---- cuda_memory.c ------------------------------------------------------------------------- */

/* A context's end frees what was allocated in it. */
void mokka_free_context_memory(CUcontext c);

/* ---- for cuda_export.c and cuda_runtime.c -------------------------------------------------- */

/* cuda_context.c and cuda_device.c */
int mokka_ctx_device(CUcontext c, CUdevice *dev); /* 1: a live context of ours, *dev filled */
unsigned mokka_gpu_index(CUdevice dev);            /* the GPU index in the state of an ordinal */
CUresult mokka_current_device(CUdevice *dev);      /* the current context's device */
/* A device's primary context handle, one for the life of the process, retained or not. */
CUresult mokka_primary_handle(CUcontext *pctx, CUdevice dev);

/* One live allocation, as the allocation table holds it. */
enum { MOKKA_MEM_DEVICE = 0, MOKKA_MEM_MANAGED = 1, MOKKA_MEM_HOST = 2 };
struct mokka_range {
    uint64_t ptr, size;
    unsigned gi, kind;
    CUcontext ctx;
};
/* The live allocation holding [p, p + n) (n = 0: holding p); 0 if none. */
int mokka_mem_find(uint64_t p, uint64_t n, struct mokka_range *out);
/* Allocate in the current context: device or managed memory (accounted to its GPU) or host
   memory (not accounted). */
CUresult mokka_mem_alloc(CUdeviceptr *out, size_t bytes, unsigned kind);
CUresult mokka_mem_free(CUdeviceptr p, unsigned kind);
/* Does p lie in a GPU's address window (allocated or not)? */
int mokka_device_address(uint64_t p);

/* cuda_export.c: the context-local storage of a context that has ended is dropped, its
   destructors called (outside every lock of the driver). */
void mokka_cls_context_ended(CUcontext c);
/* cuda_runtime.c: a context's streams, events, modules and functions end with it. */
void mokka_objects_context_ended(CUcontext c);

typedef struct CUstream_st *CUstream;
/* cuda_runtime.c: a stream argument is NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2) or
   a live stream (else CUDA_ERROR_INVALID_HANDLE). */
CUresult mokka_stream_ok(CUstream s);
/* cuda_runtime.c: the current context, or NULL. */
CUcontext mokka_current_or_null(void);

/* Another ABI name of the same function: _ptds/_ptsz (per-thread default stream) variants, which
   on this driver behave as the plain ones (nothing is ever queued). shims/gen_cuda.py reads these
   lines as definitions. */
#define MOKKA_ALIAS(name, target) extern __typeof__(target) name __attribute__((alias(#target)))

/* MOKKA_CUDA_TRACE=1: one line on stderr per private table asked for and per slot we do not
   implement that is called. */
int mokka_trace_on(void);

#pragma GCC visibility pop

#endif /* MOKKA_CUDA_INTERNAL_H */
