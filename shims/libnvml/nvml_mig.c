/*
 * libnvidia-ml: Multi-Instance GPU (docs/mig.md, docs/nvml.md). Mode, the board's profile
 * tables, GPU instances and compute instances, MIG device handles, all read from what the model
 * published (mokka_state.h, MIG); every change (SetMigMode, create, destroy) is a command of the
 * vocabulary sent to the daemon (mokka_control.h), which applies the driver's rules and answers
 * once the result is published: the new instance is in the state when the call returns, and its
 * id comes back in the reply (`ok gi=2/ci=0`).
 *
 * Handles. A GPU instance handle is &g_gi_handles[gpu][id] and a compute instance handle
 * &g_ci_handles[gpu][gi][ci], by id, never dereferenced (as device handles, nvml_internal.h): a
 * handle stays the same instance for as long as that instance exists, and is refused
 * (INVALID_ARGUMENT) once it does not. Boards without MIG answer NOT_SUPPORTED.
 *
 * A GPU's MIG section is read as one snapshot (mokka_read_mig, the one client's); the board's
 * tables through mokka_find_mig_profile. The GPU instance and compute instance families share
 * their placements, remaining capacity, list and by-id code (k_family below says how they differ).
 */
#include "nvml_internal.h"
#include "mokka_control.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

struct nvmlGpuInstance_st { uint32_t unread; };
struct nvmlComputeInstance_st { uint32_t unread; };

static struct nvmlGpuInstance_st g_gi_handles[MOKKA_MAX_GPUS][MIG_GI_IDS];
static struct nvmlComputeInstance_st g_ci_handles[MOKKA_MAX_GPUS][MIG_GI_IDS][MIG_CI_IDS];

/* ---- reading ------------------------------------------------------------------------- */

static const struct mokka_mig_gi *snap_gi(const struct mokka_mig_snapshot *m, unsigned int id)
{
    for (unsigned int k = 0; k < m->gi_count; k++)
        if (m->gi[k].id == id)
            return &m->gi[k];
    return NULL;
}

static const struct mokka_mig_device *snap_dev(const struct mokka_mig_snapshot *m, unsigned int gi, unsigned int ci)
{
    for (unsigned int k = 0; k < m->dev_count; k++)
        if (m->dev[k].gi_id == gi && m->dev[k].ci_id == ci)
            return &m->dev[k];
    return NULL;
}

/* The compute instance profile `id` of GPU instance profile p, or NULL. */
static const struct mokka_mig_ci_profile *find_ci_profile(const struct mokka_mig_profile *p, unsigned int id)
{
    for (unsigned int k = 0; k < p->ci_profile_count; k++)
        if (p->ci_profiles[k].id == id)
            return &p->ci_profiles[k];
    return NULL;
}

/* ---- handles ------------------------------------------------------------------------- */

static nvmlGpuInstance_t gi_handle(unsigned int gpu, unsigned int id) { return &g_gi_handles[gpu][id]; }

static nvmlComputeInstance_t ci_handle(unsigned int gpu, unsigned int gi, unsigned int ci)
{
    return &g_ci_handles[gpu][gi][ci];
}

/* A GPU or compute instance handle h, the address of element k of a table of per_gpu bytes per
   GPU and elements of elem bytes (the handle layer's rule: position is identity): its GPU,
   checked against the state, and k; then that GPU's MIG snapshot. */
static nvmlReturn_t instance_handle(const void *h, const void *table, size_t table_size, size_t per_gpu, size_t elem,
                                    const struct mokka_state **sp, unsigned int *gpu, unsigned int *k,
                                    struct mokka_mig_snapshot *m)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t off = (uintptr_t)h - (uintptr_t)table;
    if (off >= table_size || off % elem)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_state *s = state();
    *gpu = (unsigned int)(off / per_gpu);
    *k = (unsigned int)(off % per_gpu / elem);
    if (!s || *gpu >= gpu_count(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (__atomic_load_n(&s->gpus[*gpu].lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    mokka_read_mig(s, *gpu, m, 0);
    *sp = s;
    return NVML_SUCCESS;
}

/* GPU instance handle h: on success *sp, *gpu, *m (the GPU's MIG section) and *gi (the
   instance's record, in *m). */
static nvmlReturn_t gi_check(nvmlGpuInstance_t h, const struct mokka_state **sp, unsigned int *gpu,
                             struct mokka_mig_snapshot *m, const struct mokka_mig_gi **gi)
{
    unsigned int id;
    nvmlReturn_t r = instance_handle(h, g_gi_handles, sizeof(g_gi_handles), sizeof(g_gi_handles[0]),
                                     sizeof(g_gi_handles[0][0]), sp, gpu, &id, m);
    if (r != NVML_SUCCESS)
        return r;
    return (*gi = snap_gi(m, id)) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT; /* destroyed, reset, or never made */
}

#define GI(h)                                                                  \
    const struct mokka_state *s;                                               \
    unsigned int gpu;                                                          \
    struct mokka_mig_snapshot m;                                               \
    const struct mokka_mig_gi *gi;                                             \
    do {                                                                       \
        nvmlReturn_t r_ = gi_check((h), &s, &gpu, &m, &gi);                    \
        if (r_ != NVML_SUCCESS)                                                \
            return r_;                                                         \
    } while (0)

static nvmlReturn_t ci_check(nvmlComputeInstance_t h, unsigned int *gpu, struct mokka_mig_snapshot *m,
                             const struct mokka_mig_device **dev)
{
    const struct mokka_state *s;
    unsigned int k;
    nvmlReturn_t r = instance_handle(h, g_ci_handles, sizeof(g_ci_handles), sizeof(g_ci_handles[0]),
                                     sizeof(g_ci_handles[0][0][0]), &s, gpu, &k, m);
    if (r != NVML_SUCCESS)
        return r;
    return (*dev = snap_dev(m, k / MIG_CI_IDS, k % MIG_CI_IDS)) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

#define CI(h)                                                                  \
    unsigned int gpu;                                                          \
    struct mokka_mig_snapshot m;                                               \
    const struct mokka_mig_device *dev;                                        \
    do {                                                                       \
        nvmlReturn_t r_ = ci_check((h), &gpu, &m, &dev);                       \
        if (r_ != NVML_SUCCESS)                                                \
            return r_;                                                         \
    } while (0)

/* ---- the two families ------------------------------------------------------------------ */

/* GPU instances live in a GPU, compute instances in a GPU instance. Their profile placements,
   remaining capacity, list and by-id calls are the same code over a scope (where the family's
   instances live) and a family_profile (one profile in the terms those calls use); what differs
   between the families is the table below. */
enum family { GPU_INSTANCES, COMPUTE_INSTANCES };

static const struct family_rules {
    unsigned int ids;             /* instance ids (the extent of the family's handle table) */
    nvmlReturn_t unknown_profile; /* a profile id the board (or the GPU instance) lacks */
} k_family[] = {
    [GPU_INSTANCES] = {MIG_GI_IDS, NVML_ERROR_INVALID_ARGUMENT},
    [COMPUTE_INSTANCES] = {MIG_CI_IDS, NVML_ERROR_NOT_SUPPORTED},
};

struct scope {
    enum family family;
    unsigned int gpu;
    const struct mokka_mig_gi *gi;       /* COMPUTE_INSTANCES: the GPU instance (in m) */
    const struct mokka_mig_snapshot *m;  /* the GPU's MIG section */
};

struct family_profile {
    unsigned int id;                     /* the id reported, which the instances carry */
    unsigned int instance_count;         /* on an empty GPU (GPU instance) */
    unsigned int remaining;              /* instances of it that still fit, each where the driver would put it */
    unsigned int placement_size, placement_count;
    const uint32_t *placements;          /* starts, into the caller's profile copy */
};

/* Entry k of the scope's instance records: its profile id and instance id; 0 when it is not
   one of the scope's (a compute instance of another GPU instance). */
static int instance_at(const struct scope *sc, unsigned int k, unsigned int *profile_id, unsigned int *id)
{
    if (sc->family == GPU_INSTANCES) {
        *profile_id = sc->m->gi[k].profile_id;
        *id = sc->m->gi[k].id;
        return 1;
    }
    const struct mokka_mig_device *d = &sc->m->dev[k];
    *profile_id = d->profile;
    *id = d->ci_id;
    return d->gi_id == sc->gi->id;
}

static unsigned int instance_records(const struct scope *sc)
{
    return sc->family == GPU_INSTANCES ? sc->m->gi_count : sc->m->dev_count;
}

/* The ids of the scope's instances of profile f, at most its instanceCount (the caller's
   buffer holds that many, nvml.h; there are never more). */
static unsigned int list_instances(const struct scope *sc, const struct family_profile *f, unsigned int ids[])
{
    unsigned int n = 0, profile_id, id;
    for (unsigned int k = 0; k < instance_records(sc) && n < f->instance_count; k++)
        if (instance_at(sc, k, &profile_id, &id) && profile_id == f->id)
            ids[n++] = id;
    return n;
}

/* Is there an instance `id` in the scope? An id past the family's is INVALID_ARGUMENT. */
static nvmlReturn_t find_instance(const struct scope *sc, unsigned int id)
{
    if (id >= k_family[sc->family].ids)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int profile_id, have;
    for (unsigned int k = 0; k < instance_records(sc); k++)
        if (instance_at(sc, k, &profile_id, &have) && have == id)
            return NVML_SUCCESS;
    return NVML_ERROR_NOT_FOUND;
}

/* Both placement types are {start, size} (nvml.h); one writer fills either. */
_Static_assert(sizeof(nvmlGpuInstancePlacement_t) == 2 * sizeof(unsigned int) &&
                   offsetof(nvmlGpuInstancePlacement_t, start) == 0 && offsetof(nvmlGpuInstancePlacement_t, size) == sizeof(unsigned int),
               "nvmlGpuInstancePlacement_t is {start, size}");
_Static_assert(sizeof(nvmlComputeInstancePlacement_t) == 2 * sizeof(unsigned int) &&
                   offsetof(nvmlComputeInstancePlacement_t, start) == 0 && offsetof(nvmlComputeInstancePlacement_t, size) == sizeof(unsigned int),
               "nvmlComputeInstancePlacement_t is {start, size}");

/* Every placement of profile f, whether it is free or not. NULL placements: the count; a
   buffer too small: INSUFFICIENT_SIZE and the count needed. */
static nvmlReturn_t list_placements(const struct family_profile *f, void *placements, unsigned int *count)
{
    unsigned int n = f->placement_count;
    if (placements) {
        if (*count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned int k = 0; k < n; k++) {
            unsigned int pair[2] = {f->placements[k], f->placement_size};
            memcpy((char *)placements + k * sizeof(pair), pair, sizeof(pair));
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

/* A versioned profile info struct of either family: zeroed but for its version, which must be
   v2 or v3 (nvml.h). 2 or 3; 0 for another version. */
static int versioned_info(void *info, unsigned int v2, size_t v2_size, unsigned int v3, size_t v3_size)
{
    unsigned int version;
    memcpy(&version, info, sizeof(version));
    if (version != v2 && version != v3)
        return 0;
    memset(info, 0, version == v2 ? v2_size : v3_size);
    memcpy(info, &version, sizeof(version));
    return version == v2 ? 2 : 3;
}

#define VERSIONED_INFO(info, family)                                                                   \
    versioned_info((info), family##_v2, sizeof(family##_v2_t), family##_v3, sizeof(family##_v3_t))

/* ---- commands ------------------------------------------------------------------------ */

/* Send one `gpu=N mig ...` line; NVML's error for the daemon's answer, its message in `reply`. */
static nvmlReturn_t command(char *reply, size_t reply_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static nvmlReturn_t command(char *reply, size_t reply_size, const char *fmt, ...)
{
    char line[MOKKA_CONTROL_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    return control_status(mokka_control(line, reply, reply_size));
}

/* The ids in a create's reply, "gi=2/ci=0" or "gi=9": the first one. */
static int parse_created(const char *reply, unsigned int *gi, unsigned int *ci)
{
    char *end;
    if (strncmp(reply, "gi=", 3) != 0)
        return -1;
    unsigned long g = strtoul(reply + 3, &end, 10);
    if (end == reply + 3 || g >= MIG_GI_IDS)
        return -1;
    *gi = (unsigned int)g;
    if (ci) {
        if (strncmp(end, "/ci=", 4) != 0)
            return -1;
        const char *p = end + 4;
        unsigned long c = strtoul(p, &end, 10);
        if (end == p || c >= MIG_CI_IDS)
            return -1;
        *ci = (unsigned int)c;
    }
    return 0;
}

/* ---- mode ---------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEV(device);
    ARG(currentMode);
    ARG(pendingMode);
    uint32_t v[3];
    MOKKA_CONSISTENT(s) {
        v[0] = g->mig_capable;
        v[1] = g->mig_mode;
        v[2] = g->mig_pending;
    }
    if (!v[0])
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = v[1] ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = v[2] ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

/* The change takes effect at once on an idle GPU; with a process on it, it waits for a reset and
   activationStatus says IN_USE (docs/mig.md, Rules). */
nvmlReturn_t DECLDIR nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activationStatus)
{
    DEV(device);
    ARG(activationStatus);
    if (mode != NVML_DEVICE_MIG_DISABLE && mode != NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t capable;
    SNAP(s, g->mig_capable, capable);
    if (!capable)
        return NVML_ERROR_NOT_SUPPORTED;
    char reply[MOKKA_CONTROL_MAX];
    nvmlReturn_t r = command(reply, sizeof(reply), "gpu=%u mig %s", gpu_index(s, g),
                             mode == NVML_DEVICE_MIG_ENABLE ? "enable" : "disable");
    if (r != NVML_SUCCESS)
        return r;
    *activationStatus = strstr(reply, "pending in_use") ? NVML_ERROR_IN_USE : NVML_SUCCESS;
    return NVML_SUCCESS;
}

/* The most MIG devices the GPU can hold (one per compute slice); 0 while MIG is off. */
nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    DEV(device);
    ARG(count);
    uint32_t mode, slices;
    MOKKA_CONSISTENT(s) {
        mode = g->mig_mode;
        slices = s->mig_compute_slices;
    }
    *count = mode ? slices : 0;
    return NVML_SUCCESS;
}

/* ---- GPU instance profiles --------------------------------------------------------------- */

/* A MIG-capable GPU with MIG on: what the profile and instance queries need first. */
static nvmlReturn_t mig_enabled(const struct mokka_state *s, const struct mokka_gpu *g)
{
    uint32_t v[2];
    MOKKA_CONSISTENT(s) {
        v[0] = g->mig_capable;
        v[1] = g->mig_mode;
    }
    return v[0] && v[1] ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

#define MIG_NAME(out, name) snprintf((out), sizeof(out), "MIG %s", (name))

/* Any version of nvmlGpuInstanceProfileInfo: the fields they share. */
#define FILL_GI_INFO(info, p)                                                   \
    do {                                                                        \
        (info)->id = (p)->id;                                                   \
        (info)->sliceCount = (p)->slice_count;                                  \
        (info)->instanceCount = (p)->instance_count;                            \
        (info)->multiprocessorCount = (p)->multiprocessor_count;                \
        (info)->copyEngineCount = (p)->copy_engine_count;                       \
        (info)->decoderCount = (p)->decoder_count;                              \
        (info)->encoderCount = (p)->encoder_count;                              \
        (info)->jpegCount = (p)->jpeg_count;                                    \
        (info)->ofaCount = (p)->ofa_count;                                      \
        (info)->memorySizeMB = (p)->memory_mib;                                 \
    } while (0)

/* The board's profile by NVML_GPU_INSTANCE_PROFILE_* (by_index) or reported id, in the family's
   terms: 0, or -1 when the board has no such profile. */
static int gi_family(const struct mokka_state *s, const struct mokka_gpu *g, unsigned int key, int by_index,
                     struct mokka_mig_profile *p, struct family_profile *f)
{
    int k = mokka_find_mig_profile(s, key, by_index, p);
    if (k < 0)
        return -1;
    uint32_t remaining;
    SNAP(s, g->mig_gi_remaining[k], remaining);
    *f = (struct family_profile){p->id, p->instance_count, remaining, p->placement_size, p->placement_count,
                                 p->placements};
    return 0;
}

/* The same, for the queries: an index past NVML's list is INVALID_ARGUMENT, one the board lacks
   NOT_SUPPORTED (how callers enumerate profiles); an unknown id is the family's unknown profile.
   `need_mig_on`: the query needs MIG on (the versioned info, capacity, list), else only a board
   with MIG (v1 info: docs/mig.md, "Profile info with MIG off"). */
static nvmlReturn_t gi_family_checked(const struct mokka_state *s, const struct mokka_gpu *g, unsigned int key,
                                      int by_index, int need_mig_on, struct mokka_mig_profile *p,
                                      struct family_profile *f)
{
    if (by_index && key >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t capable;
    SNAP(s, g->mig_capable, capable);
    nvmlReturn_t r = need_mig_on ? mig_enabled(s, g) : capable ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    if (r != NVML_SUCCESS)
        return r;
    if (gi_family(s, g, key, by_index, p, f) < 0)
        return by_index ? NVML_ERROR_NOT_SUPPORTED : k_family[GPU_INSTANCES].unknown_profile;
    return NVML_SUCCESS;
}

#define GI_FAMILY_IF(key, by_index, need_mig_on)                                        \
    struct mokka_mig_profile p;                                                         \
    struct family_profile f;                                                            \
    do {                                                                                \
        nvmlReturn_t r_ = gi_family_checked(s, g, (key), (by_index), (need_mig_on), &p, &f); \
        if (r_ != NVML_SUCCESS)                                                         \
            return r_;                                                                  \
    } while (0)
#define GI_FAMILY(key, by_index) GI_FAMILY_IF(key, by_index, 1)

/* The profile's info into any version of the struct (1: nvmlGpuInstanceProfileInfo_t; v3 drops
   isP2pSupported for a capabilities mask). */
static void fill_gi_info(const struct mokka_mig_profile *p, void *info, int version)
{
    if (version == 1) {
        nvmlGpuInstanceProfileInfo_t *v1 = info;
        FILL_GI_INFO(v1, p);
        v1->isP2pSupported = p->p2p;
    } else if (version == 2) {
        nvmlGpuInstanceProfileInfo_v2_t *v2 = info;
        FILL_GI_INFO(v2, p);
        v2->isP2pSupported = p->p2p;
        MIG_NAME(v2->name, p->name);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = info;
        FILL_GI_INFO(v3, p);
        MIG_NAME(v3->name, p->name);
        v3->capabilities = p->p2p ? NVML_GPU_INSTANCE_PROFILE_CAPS_P2P : 0;
    }
}

/* v1 answers on a MIG-capable board whatever its mode, as the driver does (nvml.h: NOT_SUPPORTED
   "if device doesn't support MIG"; the DRA driver's dynamic MIG and go-nvlib enumerate profiles
   through it on MIG-disabled GPUs: docs/mig.md). The versioned calls below need MIG on (nvml.h:
   "doesn't have MIG mode enabled"). */
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_t *info)
{
    DEV(device);
    ARG(info);
    GI_FAMILY_IF(profile, 1, 0);
    memset(info, 0, sizeof(*info));
    fill_gi_info(&p, info, 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_profile_info_v(const struct mokka_state *s, const struct mokka_gpu *g, unsigned int key,
                                      int by_index, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    ARG(info);
    if (info->version != nvmlGpuInstanceProfileInfo_v2 && info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    GI_FAMILY(key, by_index);
    fill_gi_info(&p, info, VERSIONED_INFO(info, nvmlGpuInstanceProfileInfo));
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                          nvmlGpuInstanceProfileInfo_v2_t *info)
{
    DEV(device);
    return gi_profile_info_v(s, g, profile, 1, info);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    DEV(device);
    return gi_profile_info_v(s, g, profileId, 0, info);
}

/* Every placement of the profile, whether MIG is on or not (nvml.h). NULL placements: the count. */
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                   nvmlGpuInstancePlacement_t *placements,
                                                                   unsigned int *count)
{
    DEV(device);
    ARG(count);
    uint32_t capable;
    SNAP(s, g->mig_capable, capable);
    if (!capable)
        return NVML_ERROR_NOT_SUPPORTED;
    struct mokka_mig_profile p;
    struct family_profile f;
    if (gi_family(s, g, profileId, 0, &p, &f) < 0)
        return k_family[GPU_INSTANCES].unknown_profile;
    return list_placements(&f, placements, count);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t device, unsigned int profileId,
                                                                nvmlGpuInstancePlacement_t *placements,
                                                                unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                               unsigned int *count)
{
    DEV(device);
    ARG(count);
    GI_FAMILY(profileId, 0);
    *count = f.remaining;
    return NVML_SUCCESS;
}

/* ---- GPU instances ------------------------------------------------------------------------ */

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *gpuInstance)
{
    DEV(device);
    ARG(gpuInstance);
    uint32_t capable;
    SNAP(s, g->mig_capable, capable);
    if (!capable)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int index = gpu_index(s, g);
    char reply[MOKKA_CONTROL_MAX];
    nvmlReturn_t r;
    if (placement) {
        /* A placement is one of the profile's, start and size (nvmlDeviceGetGpuInstancePossiblePlacements). */
        struct mokka_mig_profile p;
        if (mokka_find_mig_profile(s, profileId, 0, &p) < 0 || placement->size != p.placement_size ||
            placement->start >= MOKKA_MAX_MIG_PLACEMENTS)
            return mig_enabled(s, g) == NVML_SUCCESS ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
        r = command(reply, sizeof(reply), "gpu=%u mig create_gi %u:%u", index, profileId, placement->start);
    } else {
        if (profileId > 0xFF)
            return NVML_ERROR_INVALID_ARGUMENT;
        r = command(reply, sizeof(reply), "gpu=%u mig create_gi %u", index, profileId);
    }
    if (r != NVML_SUCCESS)
        return r;
    unsigned int id;
    if (parse_created(reply, &id, NULL) != 0)
        return NVML_ERROR_UNKNOWN;
    *gpuInstance = gi_handle(index, id);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                 nvmlGpuInstance_t *gpuInstance)
{
    return create_gi(device, profileId, NULL, gpuInstance);
}

nvmlReturn_t DECLDIR nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                              const nvmlGpuInstancePlacement_t *placement,
                                                              nvmlGpuInstance_t *gpuInstance)
{
    if (!placement)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    return create_gi(device, profileId, placement, gpuInstance);
}

/* IN_USE while it has compute instances or a process runs on it (the daemon checks). */
nvmlReturn_t DECLDIR nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    GI(gpuInstance);
    (void)s;
    nvmlReturn_t r = command(NULL, 0, "gpu=%u mig destroy_gi %u", gpu, gi->id);
    return r == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : r; /* gone meanwhile */
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                               nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    DEV(device);
    ARG(gpuInstances);
    ARG(count);
    GI_FAMILY(profileId, 0);
    struct mokka_mig_snapshot m;
    mokka_read_mig(s, gpu_index(s, g), &m, 0);
    struct scope sc = {GPU_INSTANCES, gpu_index(s, g), NULL, &m};
    unsigned int ids[MOKKA_MAX_GPU_INSTANCES];
    *count = list_instances(&sc, &f, ids);
    for (unsigned int k = 0; k < *count; k++)
        gpuInstances[k] = gi_handle(sc.gpu, ids[k]);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    DEV(device);
    ARG(gpuInstance);
    nvmlReturn_t r = mig_enabled(s, g);
    if (r != NVML_SUCCESS)
        return r;
    struct mokka_mig_snapshot m;
    mokka_read_mig(s, gpu_index(s, g), &m, 0);
    struct scope sc = {GPU_INSTANCES, gpu_index(s, g), NULL, &m};
    if ((r = find_instance(&sc, id)) != NVML_SUCCESS)
        return r;
    *gpuInstance = gi_handle(sc.gpu, id);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    GI(gpuInstance);
    (void)s;
    ARG(info);
    memset(info, 0, sizeof(*info));
    info->device = gpu_handle(gpu);
    info->id = gi->id;
    info->profileId = gi->profile_id;
    info->placement.start = gi->start;
    info->placement.size = gi->size;
    return NVML_SUCCESS;
}

/* ---- compute instance profiles ---------------------------------------------------------- */

/* GPU instance gi's scope and its compute profile `profile` (*p: the GPU instance's own profile). */
static nvmlReturn_t ci_family(const struct mokka_state *s, unsigned int gpu, const struct mokka_mig_snapshot *m,
                              const struct mokka_mig_gi *gi, unsigned int profile, struct mokka_mig_profile *p,
                              const struct mokka_mig_ci_profile **c, struct scope *sc, struct family_profile *f)
{
    if (mokka_find_mig_profile(s, gi->profile, 1, p) < 0)
        return NVML_ERROR_UNKNOWN; /* a published instance of a profile the table lacks: never */
    if (!(*c = find_ci_profile(p, profile)))
        return k_family[COMPUTE_INSTANCES].unknown_profile;
    unsigned int slot = (unsigned int)(*c - p->ci_profiles);
    *sc = (struct scope){COMPUTE_INSTANCES, gpu, gi, m};
    *f = (struct family_profile){(*c)->id, (*c)->instance_count, gi->ci_remaining[slot], (*c)->span,
                                 (*c)->placement_count, (*c)->placements};
    return NVML_SUCCESS;
}

#define CI_FAMILY(profile)                                                      \
    struct mokka_mig_profile p;                                                 \
    const struct mokka_mig_ci_profile *c;                                       \
    struct scope sc;                                                            \
    struct family_profile f;                                                    \
    do {                                                                        \
        nvmlReturn_t r_ = ci_family(s, gpu, &m, gi, (profile), &p, &c, &sc, &f); \
        if (r_ != NVML_SUCCESS)                                                 \
            return r_;                                                          \
    } while (0)

/* Any version of nvmlComputeInstanceProfileInfo: engines are the GPU instance's, shared. */
#define FILL_CI_INFO(info, p, c)                                                \
    do {                                                                        \
        (info)->id = (c)->id;                                                   \
        (info)->sliceCount = (c)->slice_count;                                  \
        (info)->instanceCount = (c)->instance_count;                            \
        (info)->multiprocessorCount = (c)->multiprocessor_count;                \
        (info)->sharedCopyEngineCount = (p)->copy_engine_count;                 \
        (info)->sharedDecoderCount = (p)->decoder_count;                        \
        (info)->sharedEncoderCount = (p)->encoder_count;                        \
        (info)->sharedJpegCount = (p)->jpeg_count;                              \
        (info)->sharedOfaCount = (p)->ofa_count;                                \
    } while (0)

static void fill_ci_info(const struct mokka_mig_profile *p, const struct mokka_mig_ci_profile *c, void *info,
                         int version)
{
    if (version == 1) {
        nvmlComputeInstanceProfileInfo_t *v1 = info;
        FILL_CI_INFO(v1, p, c);
    } else if (version == 2) {
        nvmlComputeInstanceProfileInfo_v2_t *v2 = info;
        FILL_CI_INFO(v2, p, c);
        MIG_NAME(v2->name, c->name);
    } else {
        nvmlComputeInstanceProfileInfo_v3_t *v3 = info;
        FILL_CI_INFO(v3, p, c);
        MIG_NAME(v3->name, c->name);
    }
}

static nvmlReturn_t ci_profile_range(unsigned int profile, unsigned int engProfile)
{
    return profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT
               ? NVML_ERROR_INVALID_ARGUMENT
               : NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_t *info)
{
    GI(gpuInstance);
    ARG(info);
    nvmlReturn_t r = ci_profile_range(profile, engProfile);
    if (r != NVML_SUCCESS)
        return r;
    CI_FAMILY(profile);
    memset(info, 0, sizeof(*info));
    fill_ci_info(&p, c, info, 1);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                   unsigned int engProfile,
                                                                   nvmlComputeInstanceProfileInfo_v2_t *info)
{
    GI(gpuInstance);
    ARG(info);
    if (info->version != nvmlComputeInstanceProfileInfo_v2 && info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = ci_profile_range(profile, engProfile);
    if (r != NVML_SUCCESS)
        return r;
    CI_FAMILY(profile);
    fill_ci_info(&p, c, info, VERSIONED_INFO(info, nvmlComputeInstanceProfileInfo));
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                        unsigned int profileId, unsigned int *count)
{
    GI(gpuInstance);
    ARG(count);
    CI_FAMILY(profileId);
    *count = f.remaining;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t gpuInstance,
                                                                         unsigned int profileId,
                                                                         nvmlComputeInstancePlacement_t *placements,
                                                                         unsigned int *count)
{
    GI(gpuInstance);
    ARG(count);
    CI_FAMILY(profileId);
    return list_placements(&f, placements, count);
}

/* ---- compute instances ---------------------------------------------------------------- */

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                              const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance)
{
    GI(gpuInstance);
    ARG(computeInstance);
    CI_FAMILY(profileId);
    char reply[MOKKA_CONTROL_MAX];
    nvmlReturn_t r;
    if (placement) {
        if (placement->size != c->span || placement->start >= MOKKA_MAX_MIG_PLACEMENTS)
            return NVML_ERROR_INVALID_ARGUMENT;
        r = command(reply, sizeof(reply), "gpu=%u mig create_ci %u %u:%u", gpu, gi->id, profileId, placement->start);
    } else {
        r = command(reply, sizeof(reply), "gpu=%u mig create_ci %u %u", gpu, gi->id, profileId);
    }
    if (r != NVML_SUCCESS)
        return r == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : r;
    unsigned int g_id, c_id;
    if (parse_created(reply, &g_id, &c_id) != 0)
        return NVML_ERROR_UNKNOWN;
    *computeInstance = ci_handle(gpu, g_id, c_id);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                          nvmlComputeInstance_t *computeInstance)
{
    return create_ci(gpuInstance, profileId, NULL, computeInstance);
}

nvmlReturn_t DECLDIR nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId,
                                                                       const nvmlComputeInstancePlacement_t *placement,
                                                                       nvmlComputeInstance_t *computeInstance)
{
    if (!placement)
        return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    return create_ci(gpuInstance, profileId, placement, computeInstance);
}

nvmlReturn_t DECLDIR nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    CI(computeInstance);
    nvmlReturn_t r = command(NULL, 0, "gpu=%u mig destroy_ci %u %u", gpu, dev->gi_id, dev->ci_id);
    return r == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : r;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                        nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    GI(gpuInstance);
    ARG(computeInstances);
    ARG(count);
    CI_FAMILY(profileId);
    unsigned int ids[MOKKA_MAX_MIG_DEVICES];
    *count = list_instances(&sc, &f, ids);
    for (unsigned int k = 0; k < *count; k++)
        computeInstances[k] = ci_handle(gpu, gi->id, ids[k]);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                           nvmlComputeInstance_t *computeInstance)
{
    GI(gpuInstance);
    (void)s;
    ARG(computeInstance);
    struct scope sc = {COMPUTE_INSTANCES, gpu, gi, &m};
    nvmlReturn_t r = find_instance(&sc, id);
    if (r != NVML_SUCCESS)
        return r;
    *computeInstance = ci_handle(gpu, gi->id, id);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    CI(computeInstance);
    ARG(info);
    memset(info, 0, sizeof(*info));
    info->device = gpu_handle(gpu);
    info->gpuInstance = gi_handle(gpu, dev->gi_id);
    info->id = dev->ci_id;
    info->profileId = dev->profile;
    info->placement.start = dev->start;
    info->placement.size = dev->size;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* ---- MIG device handles ------------------------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice)
{
    DEV(device);
    ARG(migDevice);
    nvmlReturn_t r = mig_enabled(s, g);
    if (r != NVML_SUCCESS)
        return r;
    uint32_t slices;
    SNAP(s, s->mig_compute_slices, slices);
    if (index >= slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mokka_mig_snapshot m;
    mokka_read_mig(s, gpu_index(s, g), &m, 0);
    mokka_view_filter_mig(&g_view, &m); /* the index counts the MIG devices this process sees */
    if (index >= m.dev_count)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = mig_handle(gpu_index(s, g), m.dev[index].gi_id, m.dev[index].ci_id);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    DEV_FLAGS(migDevice, DEV_MIG_OK);
    ARG(device);
    if (!mig_dev)
        return NVML_ERROR_INVALID_ARGUMENT; /* a GPU handle has no parent */
    *device = gpu_handle(gpu_index(s, g));
    return NVML_SUCCESS;
}

/* On a MIG device handle; a GPU's is NOT_SUPPORTED. */
#define INSTANCE_ID_GETTER(fn, field)                                           \
    nvmlReturn_t DECLDIR fn(nvmlDevice_t device, unsigned int *id)              \
    {                                                                           \
        DEV_FLAGS(device, DEV_MIG_OK);                                          \
        (void)g;                                                                \
        ARG(id);                                                                \
        if (!mig_dev)                                                           \
            return NVML_ERROR_NOT_SUPPORTED;                                    \
        uint32_t v;                                                             \
        SNAP(s, mig_dev->field, v);                                             \
        *id = v;                                                                \
        return NVML_SUCCESS;                                                    \
    }

INSTANCE_ID_GETTER(nvmlDeviceGetGpuInstanceId, gi_id)
INSTANCE_ID_GETTER(nvmlDeviceGetComputeInstanceId, ci_id)
