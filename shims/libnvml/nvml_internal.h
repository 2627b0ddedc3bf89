/*
 * nvml_internal.h -- what the domain files of libnvidia-ml.so.1 share: the device-handle
 * layer, the prologue every device function starts with, and NVML's view of the shared state
 * (read through the one client, mokka_client.h). Each nvml_<domain>.c includes it first.
 *
 * libnvidia-ml.so.1 for a simulated node answers from the mokkafs shared state file (layout
 * and protocol in mokka_state.h). Functions not hand-written in an nvml_<domain>.c are
 * generated NOT_SUPPORTED stubs (nvml_stubs.c, by shims/gen_nvml.py, which reads every
 * nvml_<domain>.c to know which are hand-written); the export list is generated too.
 *
 * Host safety: no abort(), no unbounded waits; a missing, short or foreign state file is
 * NVML_ERROR_DRIVER_NOT_LOADED; errno is restored by every function that makes a syscall;
 * the mapping is kept across nvmlShutdown so a racing thread never touches unmapped memory,
 * and released by the library destructor (dlclose).
 *
 * The prologue (dev_check, DEV, DEV_STATIC) is inline here on purpose: a scalar getter costs a
 * few nanoseconds, and a call into another file would be a measurable part of it.
 */
#ifndef NVML_INTERNAL_H
#define NVML_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"
#include "mokka_client.h"
#include "mokka_view.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* Everything declared here is the library's own: nothing of it is exported (the export list,
   libnvidia-ml.map, names only NVML's functions). */
#pragma GCC visibility push(hidden)

/* ---- the shared state, as NVML sees it ----------------------------------------------- */

/* Set by nvmlInit while the refcount is above zero (nvml_core.c); read atomically. */
extern int g_initialized;

static inline int initialized(void) { return __atomic_load_n(&g_initialized, __ATOMIC_ACQUIRE); }
static inline const struct mokka_state *state(void) { return mokka_state(); }

static inline unsigned int gpu_count(const struct mokka_state *s) { return mokka_gpu_count(s); }

/* What this process may see of the node (mokka_view.h), decided by nvmlInit when the refcount
   leaves zero; only enumeration reads it (nvml_core.c's lookups, MIG device indexes). */
extern struct mokka_view g_view;

/* The node's GPU index of NVML index i, or -1. */
static inline int view_gpu(const struct mokka_state *s, unsigned int i) { return mokka_view_node(&g_view, i, gpu_count(s)); }

/* Is the MIG device record md of GPU record g visible to this process? */
static inline int view_mig(const struct mokka_gpu *g, const struct mokka_mig_device *md);

/* Copy n bytes at src (inside the mapping) consistently under the seqlock. */
static inline void snap(const struct mokka_state *s, const void *src, void *dst, size_t n) { mokka_read(s, src, dst, n); }

#define SNAP(s, field, out) MOKKA_SNAP((s), (field), (out))

/* The index of a GPU record of s (a record dev_check gave). */
static inline unsigned int gpu_index(const struct mokka_state *s, const struct mokka_gpu *g)
{
    return (unsigned int)(g - s->gpus);
}

/* ---- device handles ------------------------------------------------------------------ */

/* A device handle is the address of one element of a table the library owns, exactly; nothing
   else is. Its position says everything: which table is the kind, where in it the GPU (and the
   MIG device). handle_resolve only subtracts and compares: it never reads through the caller's
   pointer, so a stray pointer (or one a few bytes into a table) costs arithmetic, not a fault.
   The elements' bytes are never read; they exist so that each handle is a distinct address.

   Kinds:
   - GPU: g_gpu_handles[i] is GPU i of the state (nvmlDeviceGetHandleBy*, events, topology).
   - MIG: g_mig_handles[i][gi * MIG_CI_IDS + ci] is the MIG device (compute instance ci of GPU
     instance gi) of GPU i, by ids, so a handle is the same instance for as long as it exists.
     It is live while the state lists that device (mig_device_at); a handle of one that does not
     exist (destroyed, never made, or its GPU lost) is refused like any other garbage,
     INVALID_ARGUMENT. A function that does not take MIG handles answers a live one with
     NOT_SUPPORTED, as the driver does (utilization, for one). GPU and compute instance handles
     are nvml_mig.c's own, built the same way. */
enum handle_kind { HANDLE_NONE = 0, HANDLE_GPU, HANDLE_MIG };

#define MIG_GI_IDS 16       /* GPU instance ids: 0..14 on a board of 8 memory slices (docs/mig.md) */
#define MIG_CI_IDS 8        /* compute instance ids in one GPU instance */
#define MIG_SLOTS (MIG_GI_IDS * MIG_CI_IDS) /* MIG device handles per GPU: one per id pair */
#define NO_MIG_INDEX 0xFFFFFFFFu

struct nvmlDevice_st { uint32_t unread; };

extern struct nvmlDevice_st g_gpu_handles[MOKKA_MAX_GPUS];
extern struct nvmlDevice_st g_mig_handles[MOKKA_MAX_GPUS][MIG_SLOTS];

/* Which kind of handle d is, and whose: GPU index (the parent's, for a MIG handle) and MIG
   index (NO_MIG_INDEX for a GPU handle). HANDLE_NONE for anything not in a table; the caller
   still checks the indexes against the state. */
static inline enum handle_kind handle_resolve(nvmlDevice_t d, unsigned int *gpu, unsigned int *mig)
{
    uintptr_t off = (uintptr_t)d - (uintptr_t)g_gpu_handles;
    if (__builtin_expect(off < sizeof(g_gpu_handles) && off % sizeof(g_gpu_handles[0]) == 0, 1)) {
        *gpu = (unsigned int)(off / sizeof(g_gpu_handles[0]));
        *mig = NO_MIG_INDEX;
        return HANDLE_GPU;
    }
    off = (uintptr_t)d - (uintptr_t)g_mig_handles;
    if (off < sizeof(g_mig_handles) && off % sizeof(g_mig_handles[0][0]) == 0) {
        *gpu = (unsigned int)(off / sizeof(g_mig_handles[0]));
        *mig = (unsigned int)(off % sizeof(g_mig_handles[0]) / sizeof(g_mig_handles[0][0]));
        return HANDLE_MIG;
    }
    return HANDLE_NONE;
}

/* The record (in the mapping) of MIG device slot `mig` of GPU `gpu`, or NULL when the state lists
   no such device now. A few compares over at most MOKKA_MAX_MIG_DEVICES records, by relaxed loads
   outside the seqlock (it is on every MIG handle's path): a record caught mid-publish can only
   look like another device, the same as a handle whose instance was just destroyed; what the
   caller then copies from the record, it copies under the seqlock. */
static inline const struct mokka_mig_device *mig_device_at(const struct mokka_state *s, unsigned int gpu,
                                                           unsigned int mig)
{
    const struct mokka_gpu *g = &s->gpus[gpu];
    uint32_t gi = mig / MIG_CI_IDS, ci = mig % MIG_CI_IDS;
    uint32_t n = __atomic_load_n(&g->mig_device_count, __ATOMIC_RELAXED);
    for (uint32_t k = 0; k < n && k < MOKKA_MAX_MIG_DEVICES; k++) {
        const struct mokka_mig_device *md = &g->mig_devices[k];
        if (__atomic_load_n(&md->gi_id, __ATOMIC_RELAXED) == gi && __atomic_load_n(&md->ci_id, __ATOMIC_RELAXED) == ci)
            return md;
    }
    return NULL;
}

static inline int mig_device_live(const struct mokka_state *s, unsigned int gpu, unsigned int mig)
{
    return mig_device_at(s, gpu, mig) != NULL;
}

/* The handle of the MIG device (GPU instance gi, compute instance ci) of GPU i. */
static inline nvmlDevice_t mig_handle(unsigned int i, unsigned int gi, unsigned int ci)
{
    return &g_mig_handles[i][gi * MIG_CI_IDS + ci];
}

/* The GPU instance record of MIG device record md (in its GPU's record g). */
static inline const struct mokka_mig_gi *mig_gi_of(const struct mokka_gpu *g, const struct mokka_mig_device *md)
{
    uint32_t slot = __atomic_load_n(&md->gi_slot, __ATOMIC_RELAXED);
    return &g->mig_gi[slot < MOKKA_MAX_GPU_INSTANCES ? slot : 0];
}

static inline int view_mig(const struct mokka_gpu *g, const struct mokka_mig_device *md)
{
    if (g_view.whole || g_view.mig_all)
        return 1;
    return mokka_view_mig(&g_view, __atomic_load_n(&mig_gi_of(g, md)->minor, __ATOMIC_RELAXED),
                          __atomic_load_n(&md->minor, __ATOMIC_RELAXED));
}

/* The handle of GPU i (i < MOKKA_MAX_GPUS). */
static inline nvmlDevice_t gpu_handle(unsigned int i) { return &g_gpu_handles[i]; }

/* ---- the prologue ------------------------------------------------------------------- */

enum {
    DEV_LOST_OK = 1, /* answers for a GPU that fell off the bus (identity the driver probed) */
    DEV_MIG_OK = 2,  /* takes MIG device handles too (g is then the parent GPU's record) */
};

/* A handle that is not a GPU's: a live MIG device's (its record in *md), for a function that
   takes them, or refused. Garbage and a MIG device that does not exist are INVALID_ARGUMENT; a
   live MIG device where the function does not take one is NOT_SUPPORTED, as the driver answers. */
static inline nvmlReturn_t non_gpu_handle_check(const struct mokka_state *s, enum handle_kind kind,
                                                unsigned int gpu, unsigned int mig, unsigned int flags,
                                                const struct mokka_mig_device **md)
{
    if (kind != HANDLE_MIG || !s || gpu >= gpu_count(s) || !(*md = mig_device_at(s, gpu, mig)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return (flags & DEV_MIG_OK) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* Initialised, a live handle of a kind the function takes, and (unless DEV_LOST_OK) not lost.
   On success *sp is the state and *gp the GPU's record (the parent's, for a MIG handle), and *mdp
   (when given) the MIG device's record, or NULL for a GPU handle. */
static inline nvmlReturn_t dev_check(nvmlDevice_t d, unsigned int flags, const struct mokka_state **sp,
                                     const struct mokka_gpu **gp, const struct mokka_mig_device **mdp)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    const struct mokka_state *s = state();
    unsigned int gpu, mig;
    const struct mokka_mig_device *md = NULL;
    enum handle_kind kind = handle_resolve(d, &gpu, &mig);
    if (__builtin_expect(kind != HANDLE_GPU, 0)) {
        nvmlReturn_t r = non_gpu_handle_check(s, kind, gpu, mig, flags, &md);
        if (r != NVML_SUCCESS)
            return r;
    } else if (!s || gpu >= gpu_count(s)) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    /* A writer that died mid-publish left the records half-written: every getter may answer
       UNKNOWN ("an internal driver error occurred"), none may answer a torn value. */
    if (__builtin_expect(!mokka_settled(s), 0))
        return NVML_ERROR_UNKNOWN;
    const struct mokka_gpu *g = &s->gpus[gpu];
    if (!(flags & DEV_LOST_OK) && __atomic_load_n(&g->lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    *sp = s;
    *gp = g;
    if (mdp)
        *mdp = md;
    return NVML_SUCCESS;
}

/* The prologue: s, g and, for a function that takes MIG handles (DEV_MIG_OK), mig_dev: the MIG
   device's record, NULL for a GPU handle. */
#define DEV_FLAGS(d, flags)                                          \
    const struct mokka_state *s;                                     \
    const struct mokka_gpu *g;                                       \
    const struct mokka_mig_device *mig_dev;                          \
    do {                                                             \
        nvmlReturn_t r_ = dev_check((d), (flags), &s, &g, &mig_dev); \
        if (r_ != NVML_SUCCESS)                                      \
            return r_;                                               \
    } while (0)

/* A GPU handle of a GPU on the bus: what most functions need. */
#define DEV(d) DEV_FLAGS((d), 0)

/* Identity survives a fall off the bus: the driver keeps what it probed, and health checkers
   (the device plugin) need the UUID of the GPU an Xid 79 event names. */
#define DEV_STATIC(d) DEV_FLAGS((d), DEV_LOST_OK)

#define ARG(p)                                                       \
    do {                                                             \
        if (!(p))                                                    \
            return NVML_ERROR_INVALID_ARGUMENT;                      \
    } while (0)

/* A versioned struct: present, and of the one version the function fills. */
#define VERSIONED_ARG(p, want)                                       \
    do {                                                             \
        ARG(p);                                                      \
        if ((p)->version != (want))                                  \
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;             \
    } while (0)

/* fn(device, type *out): one uint32 field of the GPU record, as `convert` (an expression of v)
   turns it into the out type; check is DEV or DEV_STATIC. */
#define FIELD_GETTER(fn, type, field, check, convert)                             \
    nvmlReturn_t DECLDIR fn(nvmlDevice_t device, type *out)                       \
    {                                                                             \
        check(device);                                                            \
        ARG(out);                                                                 \
        uint32_t v;                                                               \
        SNAP(s, g->field, v);                                                     \
        *out = (convert);                                                         \
        return NVML_SUCCESS;                                                      \
    }

#define U32_GETTER(fn, field, check) FIELD_GETTER(fn, unsigned int, field, check, v)

/* fn(device, type *first, type *second): two uint32 fields of one publish (DEV). */
#define PAIR_GETTER(fn, type, first, second)                                      \
    nvmlReturn_t DECLDIR fn(nvmlDevice_t device, type *out1, type *out2)          \
    {                                                                             \
        DEV(device);                                                              \
        ARG(out1);                                                                \
        ARG(out2);                                                                \
        uint32_t v[2];                                                            \
        MOKKA_CONSISTENT(s) {                                                     \
            v[0] = g->first;                                                      \
            v[1] = g->second;                                                     \
        }                                                                         \
        *out1 = (type)v[0];                                                       \
        *out2 = (type)v[1];                                                       \
        return NVML_SUCCESS;                                                      \
    }

/* The daemon's answer to a command (mokka_control.h) as NVML's error (nvml_setters.c). */
nvmlReturn_t control_status(int status);

/* A flag of the state as NVML's enable state. */
#define ENABLE_STATE(v) ((v) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)

/* ---- strings (nvml_core.c) ----------------------------------------------------------- */

/* A char array field of the state into the caller's buffer of `length`: INVALID_ARGUMENT for
   no buffer, INSUFFICIENT_SIZE when the string and its NUL do not fit. */
nvmlReturn_t copy_string(const struct mokka_state *s, const char *field, size_t field_len, char *out,
                         unsigned int length);

#define STRING(field, out, length) copy_string(s, (field), sizeof(field), (out), (length))

/* A process's name as nvmlSystemGetProcessName gives it (argv[0] from /proc/<pid>/cmdline,
   cropped to length); the one reader of the export table's process lists too. */
nvmlReturn_t nvml_process_name(unsigned int pid, char *name, unsigned int length);

/* Is the char array field (of size len) exactly the string want? */
int field_equals(const struct mokka_state *s, const char *field, size_t len, const char *want);

#pragma GCC visibility pop

#endif /* NVML_INTERNAL_H */
