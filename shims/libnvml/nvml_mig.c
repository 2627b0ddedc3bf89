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

/* One GPU's MIG section, from one publish. */
struct mig_snap {
    uint32_t capable, mode, pending, gi_count, dev_count;
    uint32_t remaining[MOKKA_MAX_MIG_PROFILES];
    struct mokka_mig_gi gi[MOKKA_MAX_GPU_INSTANCES];
    struct mokka_mig_device dev[MOKKA_MAX_MIG_DEVICES];
};

static void read_mig(const struct mokka_state *s, const struct mokka_gpu *g, struct mig_snap *m)
{
    MOKKA_CONSISTENT(s) {
        m->capable = g->mig_capable;
        m->mode = g->mig_mode;
        m->pending = g->mig_pending;
        m->gi_count = g->mig_gi_count;
        m->dev_count = g->mig_device_count;
        memcpy(m->remaining, g->mig_gi_remaining, sizeof(m->remaining));
        memcpy(m->gi, g->mig_gi, sizeof(m->gi));
        memcpy(m->dev, g->mig_devices, sizeof(m->dev));
    }
    if (m->gi_count > MOKKA_MAX_GPU_INSTANCES)
        m->gi_count = MOKKA_MAX_GPU_INSTANCES;
    if (m->dev_count > MOKKA_MAX_MIG_DEVICES)
        m->dev_count = MOKKA_MAX_MIG_DEVICES;
}

static const struct mokka_mig_gi *snap_gi(const struct mig_snap *m, unsigned int id)
{
    for (unsigned int k = 0; k < m->gi_count; k++)
        if (m->gi[k].id == id)
            return &m->gi[k];
    return NULL;
}

static const struct mokka_mig_device *snap_dev(const struct mig_snap *m, unsigned int gi, unsigned int ci)
{
    for (unsigned int k = 0; k < m->dev_count; k++)
        if (m->dev[k].gi_id == gi && m->dev[k].ci_id == ci)
            return &m->dev[k];
    return NULL;
}

/* The board's GPU instance profile whose NVML_GPU_INSTANCE_PROFILE_* (by_index) or reported id
   is `key`: its position in the table, or -1. The tables never change while a daemon runs. */
static int find_profile(const struct mokka_state *s, unsigned int key, int by_index, struct mokka_mig_profile *out)
{
    uint32_t n;
    SNAP(s, s->mig_profile_count, n);
    if (n > MOKKA_MAX_MIG_PROFILES)
        n = MOKKA_MAX_MIG_PROFILES;
    for (uint32_t k = 0; k < n; k++) {
        snap(s, &s->mig_profiles[k], out, sizeof(*out));
        if ((by_index ? out->index : out->id) == key)
            return (int)k;
    }
    return -1;
}

/* The compute instance profile `id` of GPU instance profile p, or NULL. */
static const struct mokka_mig_ci_profile *find_ci_profile(const struct mokka_mig_profile *p, unsigned int id)
{
    unsigned int n = p->ci_profile_count > MOKKA_MAX_CI_PROFILES ? MOKKA_MAX_CI_PROFILES : p->ci_profile_count;
    for (unsigned int k = 0; k < n; k++)
        if (p->ci_profiles[k].id == id)
            return &p->ci_profiles[k];
    return NULL;
}

static unsigned int ci_profile_slot(const struct mokka_mig_profile *p, const struct mokka_mig_ci_profile *c)
{
    return (unsigned int)(c - p->ci_profiles);
}

/* ---- handles ------------------------------------------------------------------------- */

static nvmlGpuInstance_t gi_handle(unsigned int gpu, unsigned int id) { return &g_gi_handles[gpu][id]; }

static nvmlComputeInstance_t ci_handle(unsigned int gpu, unsigned int gi, unsigned int ci)
{
    return &g_ci_handles[gpu][gi][ci];
}

/* GPU instance handle h: its GPU and id, checked against the state. On success *sp, *gp, *m
   (the GPU's MIG section) and *gi (the instance's record, in *m). */
static nvmlReturn_t gi_check(nvmlGpuInstance_t h, const struct mokka_state **sp, unsigned int *gpu,
                             struct mig_snap *m, const struct mokka_mig_gi **gi)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t off = (uintptr_t)h - (uintptr_t)g_gi_handles;
    if (off >= sizeof(g_gi_handles) || off % sizeof(g_gi_handles[0][0]))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_state *s = state();
    *gpu = (unsigned int)(off / sizeof(g_gi_handles[0]));
    unsigned int id = (unsigned int)(off % sizeof(g_gi_handles[0]) / sizeof(g_gi_handles[0][0]));
    if (!s || *gpu >= gpu_count(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_gpu *g = &s->gpus[*gpu];
    if (__atomic_load_n(&g->lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    read_mig(s, g, m);
    if (!(*gi = snap_gi(m, id)))
        return NVML_ERROR_INVALID_ARGUMENT; /* destroyed, reset, or never made */
    *sp = s;
    return NVML_SUCCESS;
}

#define GI(h)                                                                  \
    const struct mokka_state *s;                                               \
    unsigned int gpu;                                                          \
    struct mig_snap m;                                                         \
    const struct mokka_mig_gi *gi;                                             \
    do {                                                                       \
        nvmlReturn_t r_ = gi_check((h), &s, &gpu, &m, &gi);                    \
        if (r_ != NVML_SUCCESS)                                                \
            return r_;                                                         \
    } while (0)

static nvmlReturn_t ci_check(nvmlComputeInstance_t h, unsigned int *gpu, struct mig_snap *m,
                             const struct mokka_mig_device **dev)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t off = (uintptr_t)h - (uintptr_t)g_ci_handles;
    if (off >= sizeof(g_ci_handles) || off % sizeof(g_ci_handles[0][0][0]))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_state *s = state();
    size_t k = off / sizeof(g_ci_handles[0][0][0]);
    *gpu = (unsigned int)(k / (MIG_GI_IDS * MIG_CI_IDS));
    unsigned int gi = (unsigned int)(k / MIG_CI_IDS % MIG_GI_IDS), ci = (unsigned int)(k % MIG_CI_IDS);
    if (!s || *gpu >= gpu_count(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_gpu *g = &s->gpus[*gpu];
    if (__atomic_load_n(&g->lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    read_mig(s, g, m);
    if (!(*dev = snap_dev(m, gi, ci)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define CI(h)                                                                  \
    unsigned int gpu;                                                          \
    struct mig_snap m;                                                         \
    const struct mokka_mig_device *dev;                                        \
    do {                                                                       \
        nvmlReturn_t r_ = ci_check((h), &gpu, &m, &dev);                       \
        if (r_ != NVML_SUCCESS)                                                \
            return r_;                                                         \
    } while (0)

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

static void gi_info_fields(const struct mokka_mig_profile *p, unsigned int *id, unsigned int *slices,
                           unsigned int *instances, unsigned int *sms, unsigned int *ce, unsigned int *dec,
                           unsigned int *enc, unsigned int *jpeg, unsigned int *ofa, unsigned long long *mib)
{
    *id = p->id;
    *slices = p->slice_count;
    *instances = p->instance_count;
    *sms = p->multiprocessor_count;
    *ce = p->copy_engine_count;
    *dec = p->decoder_count;
    *enc = p->encoder_count;
    *jpeg = p->jpeg_count;
    *ofa = p->ofa_count;
    *mib = p->memory_mib;
}

#define FILL_GI_INFO(info, p)                                                                          \
    gi_info_fields(&(p), &(info)->id, &(info)->sliceCount, &(info)->instanceCount,                     \
                   &(info)->multiprocessorCount, &(info)->copyEngineCount, &(info)->decoderCount,      \
                   &(info)->encoderCount, &(info)->jpegCount, &(info)->ofaCount, &(info)->memorySizeMB)

/* The profile by NVML_GPU_INSTANCE_PROFILE_* (by_index) or reported id, for the info queries:
   an index past NVML's list is INVALID_ARGUMENT, one the board lacks NOT_SUPPORTED (how
   callers enumerate profiles); an unknown id is INVALID_ARGUMENT. */
static nvmlReturn_t profile_for_info(const struct mokka_state *s, const struct mokka_gpu *g, unsigned int key,
                                     int by_index, struct mokka_mig_profile *p)
{
    if (by_index && key >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = mig_enabled(s, g);
    if (r != NVML_SUCCESS)
        return r;
    if (find_profile(s, key, by_index, p) < 0)
        return by_index ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_t *info)
{
    DEV(device);
    ARG(info);
    struct mokka_mig_profile p;
    nvmlReturn_t r = profile_for_info(s, g, profile, 1, &p);
    if (r != NVML_SUCCESS)
        return r;
    memset(info, 0, sizeof(*info));
    FILL_GI_INFO(info, p);
    info->isP2pSupported = p.p2p;
    return NVML_SUCCESS;
}

/* v2 and v3 (nvml.h: v3 drops isP2pSupported for a capabilities mask). */
static nvmlReturn_t profile_info_v(const struct mokka_state *s, const struct mokka_gpu *g, unsigned int key,
                                   int by_index, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    ARG(info);
    if (info->version != nvmlGpuInstanceProfileInfo_v2 && info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct mokka_mig_profile p;
    nvmlReturn_t r = profile_for_info(s, g, key, by_index, &p);
    if (r != NVML_SUCCESS)
        return r;
    p.name[sizeof(p.name) - 1] = '\0';
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        unsigned int version = info->version;
        memset(info, 0, sizeof(*info));
        info->version = version;
        FILL_GI_INFO(info, p);
        info->isP2pSupported = p.p2p;
        MIG_NAME(info->name, p.name);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof(*v3));
        v3->version = nvmlGpuInstanceProfileInfo_v3;
        FILL_GI_INFO(v3, p);
        MIG_NAME(v3->name, p.name);
        v3->capabilities = p.p2p ? NVML_GPU_INSTANCE_PROFILE_CAPS_P2P : 0;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                          nvmlGpuInstanceProfileInfo_v2_t *info)
{
    DEV(device);
    return profile_info_v(s, g, profile, 1, info);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    DEV(device);
    return profile_info_v(s, g, profileId, 0, info);
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
    struct mokka_mig_profile p;
    if (!capable || find_profile(s, profileId, 0, &p) < 0)
        return capable ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = p.placement_count > MOKKA_MAX_MIG_PLACEMENTS ? MOKKA_MAX_MIG_PLACEMENTS : p.placement_count;
    if (placements) {
        if (*count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned int k = 0; k < n; k++) {
            placements[k].start = p.placements[k];
            placements[k].size = p.placement_size;
        }
    }
    *count = n;
    return NVML_SUCCESS;
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
    nvmlReturn_t r = mig_enabled(s, g);
    if (r != NVML_SUCCESS)
        return r;
    struct mokka_mig_profile p;
    int k = find_profile(s, profileId, 0, &p);
    if (k < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t n;
    SNAP(s, g->mig_gi_remaining[k], n);
    *count = n;
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
        if (find_profile(s, profileId, 0, &p) < 0 || placement->size != p.placement_size ||
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

/* The caller's buffer holds the profile's instanceCount (nvml.h); there are never more. */
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                               nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    DEV(device);
    ARG(gpuInstances);
    ARG(count);
    struct mokka_mig_profile p;
    nvmlReturn_t r = profile_for_info(s, g, profileId, 0, &p);
    if (r != NVML_SUCCESS)
        return r;
    struct mig_snap m;
    read_mig(s, g, &m);
    unsigned int n = 0;
    for (unsigned int k = 0; k < m.gi_count && n < p.instance_count; k++)
        if (m.gi[k].profile_id == profileId)
            gpuInstances[n++] = gi_handle(gpu_index(s, g), m.gi[k].id);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance)
{
    DEV(device);
    ARG(gpuInstance);
    nvmlReturn_t r = mig_enabled(s, g);
    if (r != NVML_SUCCESS)
        return r;
    if (id >= MIG_GI_IDS)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct mig_snap m;
    read_mig(s, g, &m);
    if (!snap_gi(&m, id))
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = gi_handle(gpu_index(s, g), id);
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

/* The GPU instance's own profile and its compute profile `profile`. */
static nvmlReturn_t ci_profile_of(const struct mokka_state *s, const struct mokka_mig_gi *gi, unsigned int profile,
                                  struct mokka_mig_profile *p, const struct mokka_mig_ci_profile **c)
{
    if (find_profile(s, gi->profile, 1, p) < 0)
        return NVML_ERROR_UNKNOWN; /* a published instance of a profile the table lacks: never */
    *c = find_ci_profile(p, profile);
    return *c ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

#define FILL_CI_INFO(info, p, c)                                                \
    do {                                                                        \
        (info)->id = (c)->id;                                                   \
        (info)->sliceCount = (c)->slice_count;                                  \
        (info)->instanceCount = (c)->instance_count;                            \
        (info)->multiprocessorCount = (c)->multiprocessor_count;                \
        (info)->sharedCopyEngineCount = (p).copy_engine_count;                  \
        (info)->sharedDecoderCount = (p).decoder_count;                         \
        (info)->sharedEncoderCount = (p).encoder_count;                         \
        (info)->sharedJpegCount = (p).jpeg_count;                               \
        (info)->sharedOfaCount = (p).ofa_count;                                 \
    } while (0)

static nvmlReturn_t ci_profile_check(const struct mokka_state *s, const struct mokka_mig_gi *gi, unsigned int profile,
                                     unsigned int engProfile, struct mokka_mig_profile *p,
                                     const struct mokka_mig_ci_profile **c)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || engProfile >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return ci_profile_of(s, gi, profile, p, c);
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                  unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_t *info)
{
    GI(gpuInstance);
    (void)gpu;
    ARG(info);
    struct mokka_mig_profile p;
    const struct mokka_mig_ci_profile *c;
    nvmlReturn_t r = ci_profile_check(s, gi, profile, engProfile, &p, &c);
    if (r != NVML_SUCCESS)
        return r;
    memset(info, 0, sizeof(*info));
    FILL_CI_INFO(info, p, c);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                   unsigned int engProfile,
                                                                   nvmlComputeInstanceProfileInfo_v2_t *info)
{
    GI(gpuInstance);
    (void)gpu;
    ARG(info);
    if (info->version != nvmlComputeInstanceProfileInfo_v2 && info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct mokka_mig_profile p;
    const struct mokka_mig_ci_profile *c;
    nvmlReturn_t r = ci_profile_check(s, gi, profile, engProfile, &p, &c);
    if (r != NVML_SUCCESS)
        return r;
    char name[sizeof(c->name)];
    memcpy(name, c->name, sizeof(name));
    name[sizeof(name) - 1] = '\0';
    if (info->version == nvmlComputeInstanceProfileInfo_v2) {
        memset(info, 0, sizeof(*info));
        info->version = nvmlComputeInstanceProfileInfo_v2;
        FILL_CI_INFO(info, p, c);
        MIG_NAME(info->name, name);
    } else {
        nvmlComputeInstanceProfileInfo_v3_t *v3 = (nvmlComputeInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof(*v3));
        v3->version = nvmlComputeInstanceProfileInfo_v3;
        FILL_CI_INFO(v3, p, c);
        MIG_NAME(v3->name, name);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                        unsigned int profileId, unsigned int *count)
{
    GI(gpuInstance);
    (void)gpu;
    ARG(count);
    struct mokka_mig_profile p;
    const struct mokka_mig_ci_profile *c;
    nvmlReturn_t r = ci_profile_of(s, gi, profileId, &p, &c);
    if (r != NVML_SUCCESS)
        return r;
    *count = gi->ci_remaining[ci_profile_slot(&p, c)];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t gpuInstance,
                                                                         unsigned int profileId,
                                                                         nvmlComputeInstancePlacement_t *placements,
                                                                         unsigned int *count)
{
    GI(gpuInstance);
    (void)gpu;
    ARG(count);
    struct mokka_mig_profile p;
    const struct mokka_mig_ci_profile *c;
    nvmlReturn_t r = ci_profile_of(s, gi, profileId, &p, &c);
    if (r != NVML_SUCCESS)
        return r;
    unsigned int n = c->placement_count > MOKKA_MAX_MIG_PLACEMENTS ? MOKKA_MAX_MIG_PLACEMENTS : c->placement_count;
    if (placements) {
        if (*count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned int k = 0; k < n; k++) {
            placements[k].start = c->placements[k];
            placements[k].size = c->slice_count;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

/* ---- compute instances ---------------------------------------------------------------- */

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                              const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance)
{
    GI(gpuInstance);
    ARG(computeInstance);
    struct mokka_mig_profile p;
    const struct mokka_mig_ci_profile *c;
    nvmlReturn_t r = ci_profile_of(s, gi, profileId, &p, &c);
    if (r != NVML_SUCCESS)
        return r;
    char reply[MOKKA_CONTROL_MAX];
    if (placement) {
        if (placement->size != c->slice_count || placement->start >= MOKKA_MAX_MIG_PLACEMENTS)
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
    struct mokka_mig_profile p;
    const struct mokka_mig_ci_profile *c;
    nvmlReturn_t r = ci_profile_of(s, gi, profileId, &p, &c);
    if (r != NVML_SUCCESS)
        return r;
    unsigned int n = 0;
    for (unsigned int k = 0; k < m.dev_count && n < c->instance_count; k++)
        if (m.dev[k].gi_id == gi->id && m.dev[k].profile == profileId)
            computeInstances[n++] = ci_handle(gpu, gi->id, m.dev[k].ci_id);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                           nvmlComputeInstance_t *computeInstance)
{
    GI(gpuInstance);
    (void)s;
    ARG(computeInstance);
    if (id >= MIG_CI_IDS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!snap_dev(&m, gi->id, id))
        return NVML_ERROR_NOT_FOUND;
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
    struct mig_snap m;
    read_mig(s, g, &m);
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
