/*
 * libcuda's contexts: the table of context handles, each thread's stack of current contexts,
 * the primary contexts (the runtime's, made lazily), cuCtxCreate/Destroy/Push/Pop and the
 * context queries. A context's first and last on a GPU go through the compute mode and the
 * process's record (cuda_accounting.c); its end frees its memory (cuda_memory.c), its
 * context-local storage (cuda_export.c) and its objects (cuda_runtime.c).
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- contexts -------------------------------------------------------------------------- */

/* Contexts live in a table the library owns, and a CUcontext is a number, never an address:
   tag (16 bits) | generation (32, odd while live) | slot (16). Slots 64.. are cuCtxCreate's:
   destroying one moves its slot to the next generation, so its old handle is refused even after
   the slot is reused, and a stale handle can never destroy, push or allocate into the newer
   context (malloc handed a destroyed context's address to the next one). Slots 0..63 are the
   primary contexts of ordinals 0..63, with one handle each for the life of the process, as the
   driver's: generation 1 while retained, 0 once the last reference is gone, and a later retain
   brings the same handle back (a thread that kept it current carries on, as with the driver). A
   random value or a pointer to anything fails the shape compare; nothing a caller hands in is
   dereferenced. A check is a mask compare and a load, so cuMemAlloc stays on its fast path. */
#define CTX_TAG 0x6d63ull
#define CTX_SLOTS 1024
/* A thread's stack of current contexts. The driver documents no depth for it (cuCtxPushCurrent's
   returns have no "stack full"; its stack grows with the memory it can get): here it holds every
   context the table can have live, each once, so cuCtxCreate meets the table's end (960 made,
   then OUT_OF_MEMORY) before the stack's; a push past 1024 (one context pushed over and over)
   is OUT_OF_MEMORY too, the driver's word for a request it cannot find memory for. 8 KiB of
   thread-local storage. */
#define CTX_STACK CTX_SLOTS
/* Tag, slot < 1024 and an odd generation, in one compare. */
#define CTX_SHAPE_MASK (0xFFFFull << 48 | 1ull << 16 | (0xFFFFull & ~(CTX_SLOTS - 1ull)))
#define CTX_SHAPE (CTX_TAG << 48 | 1ull << 16)

struct ctx_slot {
    uint32_t gen;  /* odd while live: stored last on create, first on destroy */
    CUdevice dev;
    unsigned flags;
};

static struct ctx_slot g_ctx[CTX_SLOTS];
static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER; /* creating and destroying slots >= 64;
                                                                 the primary slots are g_lock's */
static unsigned g_ctx_next = MOKKA_MAX_GPUS;                   /* where the search for a free slot starts */

_Static_assert(sizeof(CUcontext) == 8 && CTX_SLOTS > MOKKA_MAX_GPUS && (CTX_SLOTS & (CTX_SLOTS - 1)) == 0,
               "a 64-bit handle, room beyond the primary slots, a power of two");

static unsigned g_primary_refs[MOKKA_MAX_GPUS]; /* guarded by g_lock */
/* Made: the primary context exists on its GPU (compute mode passed, the process listed there). The
   runtime holds every device's primary context from init (cuda_export.c) but makes it only when
   it first makes it current, as the driver creates a context lazily. Guarded by g_lock. */
static unsigned char g_primary_made[MOKKA_MAX_GPUS];
static __thread int t_depth;
static __thread CUcontext t_stack[CTX_STACK];

static inline CUcontext ctx_handle(unsigned slot, uint32_t gen)
{
    return (CUcontext)(uintptr_t)(CTX_TAG << 48 | (uint64_t)gen << 16 | slot);
}

static inline unsigned ctx_slot_of(CUcontext c) { return (unsigned)((uintptr_t)c & 0xFFFF); }

/* 1: a live context, *out filled; 0: not a handle of ours; -1: one of ours, since destroyed.
   The fields are read between two loads of the generation, so a slot destroyed and reused
   meanwhile is reported destroyed, not answered with the newer context's device. */
static inline int ctx_lookup(CUcontext c, struct ctx_info *out)
{
    uint64_t h = (uint64_t)(uintptr_t)c;
    if ((h & CTX_SHAPE_MASK) != CTX_SHAPE)
        return 0;
    const struct ctx_slot *sl = &g_ctx[h & 0xFFFF];
    uint32_t gen = (uint32_t)(h >> 16);
    if (LOAD(&sl->gen) != gen)
        return -1;
    out->dev = __atomic_load_n(&sl->dev, __ATOMIC_RELAXED);
    out->flags = __atomic_load_n(&sl->flags, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&sl->gen, __ATOMIC_RELAXED) == gen ? 1 : -1;
}

/* The child of a fork has none of its parent's contexts (after_fork_child drops the references
   and the stack): every handle it inherited is dead there. */
static void ctx_after_fork_child(void)
{
    pthread_mutex_init(&g_ctx_lock, NULL);
    memset(g_primary_refs, 0, sizeof(g_primary_refs));
    memset(g_primary_made, 0, sizeof(g_primary_made));
    t_depth = 0;
    for (unsigned i = 0; i < CTX_SLOTS; i++)
        if (i < MOKKA_MAX_GPUS)
            g_ctx[i].gen = 0;
        else if (g_ctx[i].gen & 1)
            g_ctx[i].gen++;
}

__attribute__((constructor)) static void ctx_register_fork(void) { pthread_atfork(NULL, NULL, ctx_after_fork_child); }

static CUcontext current(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

/* The thread's current context. One destroyed while current here (by another thread, or a
   primary context released for the last time) is CONTEXT_IS_DESTROYED, as cuda.h says. */
CUresult mokka_current_ctx(CUcontext *out, struct ctx_info *info)
{
    INIT();
    CUcontext c = current();
    int k = c ? ctx_lookup(c, info) : 0;
    if (k <= 0)
        return k < 0 ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* A context handed in as an argument: anything but a live one is INVALID_CONTEXT. */
static inline int ctx_ok(CUcontext c)
{
    struct ctx_info ci;
    return ctx_lookup(c, &ci) > 0;
}

/* Make primary context `dev` on its GPU (g_lock held): the compute mode rules, the process is
   listed there. */
static CUresult primary_make(CUdevice dev)
{
    if (g_primary_made[dev])
        return CUDA_SUCCESS;
    if (lost(dev))
        return CUDA_ERROR_UNKNOWN;
    unsigned gi = g_visible[dev];
    /* under g_lock (then g_acct_lock, the one order): a racing last release is whole */
    CUresult r = compute_mode(gi) == CU_COMPUTEMODE_PROHIBITED ? CUDA_ERROR_DEVICE_UNAVAILABLE : mokka_context_ref(gi, +1);
    if (r == CUDA_SUCCESS)
        g_primary_made[dev] = 1;
    return r;
}

/* One reference more on primary context `dev`; with make, the context is made too. */
static CUresult primary_retain(CUcontext *pctx, CUdevice dev, int make)
{
    ARG(pctx);
    DEVICE(dev); /* a lost GPU's handle, but no context on it (primary_make) */
    pthread_mutex_lock(&g_lock);
    struct ctx_slot *sl = &g_ctx[dev];
    if (make) {
        CUresult r = primary_make(dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&g_lock);
            return r;
        }
    }
    if (g_primary_refs[dev] == 0) { /* the first retain brings the one handle (back) to life */
        __atomic_store_n(&sl->dev, dev, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->gen, 1, __ATOMIC_RELEASE);
    }
    g_primary_refs[dev]++;
    CUcontext c = ctx_handle((unsigned)dev, sl->gen);
    pthread_mutex_unlock(&g_lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { return primary_retain(pctx, dev, 1); }

/* What the runtime's CUDART_INTERFACE slot 2 answers (cuda_export.c): retained, not yet made. */
CUresult mokka_primary_handle(CUcontext *pctx, CUdevice dev) { return primary_retain(pctx, dev, 0); }

/* A context about to be current: a primary one the runtime holds unmade is made now. */
static CUresult ctx_materialize(CUcontext c)
{
    unsigned slot = ctx_slot_of(c);
    if (slot >= MOKKA_MAX_GPUS || LOAD(&g_primary_made[slot]))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    CUresult r = g_primary_refs[slot] ? primary_make((CUdevice)slot) : CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&g_lock);
    return r;
}

static CUresult primary_release(CUdevice dev)
{
    DEVICE(dev);
    pthread_mutex_lock(&g_lock);
    if (g_primary_refs[dev] == 0) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    int last = --g_primary_refs[dev] == 0;
    if (last) {
        /* The last release destroys the primary context and what it holds. Still under g_lock,
           so a retain racing it cannot allocate into the context before its memory is freed.
           Inactive, its handle is refused until the next retain. */
        __atomic_store_n(&g_ctx[dev].gen, 0, __ATOMIC_RELEASE);
        mokka_free_context_memory(ctx_handle((unsigned)dev, 1));
        if (g_primary_made[dev])
            mokka_context_ref(g_visible[dev], -1);
        g_primary_made[dev] = 0;
    }
    pthread_mutex_unlock(&g_lock);
    if (last) { /* the runtime's per-context state goes with it (cuda_export.c), and its handles */
        mokka_cls_context_ended(ctx_handle((unsigned)dev, 1));
        mokka_objects_context_ended(ctx_handle((unsigned)dev, 1));
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
    DEVICE(dev);
    __atomic_store_n(&g_ctx[dev].flags, flags, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return primary_set_flags(dev, flags); }
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) { return primary_set_flags(dev, flags); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    ARG(flags);
    ARG(active);
    DEVICE(dev);
    *flags = __atomic_load_n(&g_ctx[dev].flags, __ATOMIC_RELAXED);
    *active = LOAD(&g_primary_made[dev]) && LOAD(&g_primary_refs[dev]) > 0;
    return CUDA_SUCCESS;
}

static CUresult primary_reset(CUdevice dev)
{
    DEVICE(dev);
    pthread_mutex_lock(&g_lock);
    mokka_free_context_memory(ctx_handle((unsigned)dev, 1));
    pthread_mutex_unlock(&g_lock);
    mokka_cls_context_ended(ctx_handle((unsigned)dev, 1)); /* cudaDeviceReset's clean-up */
    mokka_objects_context_ended(ctx_handle((unsigned)dev, 1));
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return primary_reset(dev); }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_reset(dev); }

static CUresult push(CUcontext c)
{
    if (t_depth >= CTX_STACK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t_stack[t_depth++] = c;
    return CUDA_SUCCESS;
}

/* A free slot beyond the primary ones, made live for `dev`; 0 when all are taken. */
static CUcontext ctx_take(CUdevice dev, unsigned flags)
{
    CUcontext c = NULL;
    pthread_mutex_lock(&g_ctx_lock);
    for (unsigned n = 0; n < CTX_SLOTS - MOKKA_MAX_GPUS && !c; n++) {
        unsigned i = g_ctx_next;
        g_ctx_next = i + 1 < CTX_SLOTS ? i + 1 : MOKKA_MAX_GPUS;
        struct ctx_slot *sl = &g_ctx[i];
        if (sl->gen & 1)
            continue;
        __atomic_store_n(&sl->dev, dev, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->flags, flags, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->gen, sl->gen + 1, __ATOMIC_RELEASE);
        c = ctx_handle(i, sl->gen);
    }
    pthread_mutex_unlock(&g_ctx_lock);
    return c;
}

/* End a live non-primary context; 0 if `c` is not one (already destroyed: a racing destroy of
   the same handle wins once). */
static int ctx_end(CUcontext c, struct ctx_info *ci)
{
    pthread_mutex_lock(&g_ctx_lock);
    int ok = ctx_lookup(c, ci) > 0 && ctx_slot_of(c) >= MOKKA_MAX_GPUS;
    if (ok)
        __atomic_store_n(&g_ctx[ctx_slot_of(c)].gen, g_ctx[ctx_slot_of(c)].gen + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_ctx_lock);
    return ok;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ARG(pctx);
    LIVE_DEVICE(dev);
    unsigned gi = g_visible[dev];
    if (compute_mode(gi) == CU_COMPUTEMODE_PROHIBITED)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    CUresult r = mokka_context_ref(gi, +1); /* EXCLUSIVE_PROCESS: refused while another process has one */
    if (r != CUDA_SUCCESS)
        return r;
    CUcontext c = ctx_take(dev, flags);
    if (!c) {
        mokka_context_ref(gi, -1);
        return CUDA_ERROR_OUT_OF_MEMORY; /* 960 made: the table is full (a real GPU runs out sooner) */
    }
    r = push(c);
    if (r != CUDA_SUCCESS) {
        struct ctx_info ci;
        ctx_end(c, &ci);
        mokka_context_ref(gi, -1);
        return r;
    }
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev); }
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev); }
CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    return ctx_create(pctx, flags, dev);
}
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    (void)ctxCreateParams;
    return ctx_create(pctx, flags, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    INIT();
    struct ctx_info ci;
    if (ctx_lookup(ctx, &ci) > 0 && ctx_slot_of(ctx) >= MOKKA_MAX_GPUS)
        mokka_cls_context_ended(ctx); /* while it still lives: its destructors may use it */
    if (!ctx_end(ctx, &ci)) /* not ours, destroyed already, or a primary context */
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = t_depth - 1; i >= 0; i--) /* off this thread's stack */
        if (t_stack[i] == ctx) {
            memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - 1 - i) * sizeof(CUcontext));
            t_depth--;
        }
    unsigned gi = g_visible[ci.dev];
    mokka_free_context_memory(ctx);
    mokka_objects_context_ended(ctx);
    mokka_context_ref(gi, -1);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) { return ctx_destroy(ctx); }
CUresult cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(ctx); }

static CUresult ctx_push(CUcontext ctx)
{
    INIT();
    if (!ctx_ok(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = ctx_materialize(ctx);
    return r != CUDA_SUCCESS ? r : push(ctx);
}

CUresult cuCtxPushCurrent(CUcontext ctx) { return ctx_push(ctx); }
CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return ctx_push(ctx); }

static CUresult ctx_pop(CUcontext *pctx)
{
    INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) { return ctx_pop(pctx); }
CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { return ctx_pop(pctx); }

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    INIT();
    if (!ctx) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_ok(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = ctx_materialize(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (t_depth == 0)
        return push(ctx);
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    ARG(pctx);
    INIT();
    *pctx = current();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    ARG(device);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = mokka_current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS)
        *device = ci.dev;
    return r;
}

CUresult cuCtxSynchronize(void)
{
    CUcontext c;
    struct ctx_info ci;
    CUresult r = mokka_current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS && lost(ci.dev))
        return CUDA_ERROR_UNKNOWN;
    return r;
}

CUresult cuCtxGetFlags(unsigned int *flags)
{
    ARG(flags);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = mokka_current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS)
        *flags = ci.flags;
    return r;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    ARG(version);
    INIT();
    CUresult r = CUDA_SUCCESS;
    if (!ctx)
        r = mokka_current_ctx(&ctx, &(struct ctx_info){0, 0});
    else if (!ctx_ok(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS)
        *version = 3020; /* the context ABI every context since CUDA 3.2 reports */
    return r;
}

/* ---- for the other source files (cuda_internal.h) ---------------------------------------- */

int mokka_ctx_device(CUcontext c, CUdevice *dev)
{
    struct ctx_info ci;
    if (ctx_lookup(c, &ci) <= 0)
        return 0;
    *dev = ci.dev;
    return 1;
}

CUresult mokka_current_device(CUdevice *dev)
{
    CUcontext c;
    struct ctx_info ci;
    CUresult r = mokka_current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS)
        *dev = ci.dev;
    return r;
}
