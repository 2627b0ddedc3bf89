/*
 * libnvidia-ml: how GPUs connect. NVLink (state, version, capabilities, far end, error
 * counters), topology levels and CPU and memory affinity, and the fabric.
 */
#include "nvml_internal.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>

/* ---- NVLink --------------------------------------------------------------------------- */

#define LINK(link)                                                   \
    uint32_t nlinks_;                                                \
    SNAP(s, g->nvlink_count, nlinks_);                               \
    if (nlinks_ == 0)                                                \
        return NVML_ERROR_NOT_SUPPORTED;                             \
    if ((link) >= nlinks_)                                           \
        return NVML_ERROR_INVALID_ARGUMENT;                          \
    const struct mokka_nvlink *nl = &g->nvlink[(link)]

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    DEV(device);
    ARG(isActive);
    LINK(link);
    uint32_t v;
    SNAP(s, nl->state, v);
    *isActive = ENABLE_STATE(v);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    DEV(device);
    ARG(version);
    LINK(link);
    uint32_t v;
    SNAP(s, nl->version, v);
    /* The driver answers with nvmlNvlinkVersion_t, not the generation the profile holds: an A100
       says 5 (3.1), an H100 6 (4.0), a Blackwell 7 (5.0) (open-mpi/hwloc#658, Syllo/nvtop#469). */
    static const unsigned by_generation[] = {NVML_NVLINK_VERSION_INVALID, NVML_NVLINK_VERSION_1_0,
                                             NVML_NVLINK_VERSION_2_0, NVML_NVLINK_VERSION_3_1,
                                             NVML_NVLINK_VERSION_4_0, NVML_NVLINK_VERSION_5_0};
    *version = v < sizeof(by_generation) / sizeof(by_generation[0]) ? by_generation[v] : NVML_NVLINK_VERSION_INVALID;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                   nvmlNvLinkCapability_t capability, unsigned int *capResult)
{
    DEV(device);
    ARG(capResult);
    LINK(link);
    (void)nl;
    switch (capability) {
    case NVML_NVLINK_CAP_P2P_SUPPORTED:
    case NVML_NVLINK_CAP_P2P_ATOMICS:
    case NVML_NVLINK_CAP_SYSMEM_ACCESS:
    case NVML_NVLINK_CAP_SYSMEM_ATOMICS:
    case NVML_NVLINK_CAP_SLI_BRIDGE:
    case NVML_NVLINK_CAP_VALID:
        *capResult = capability == NVML_NVLINK_CAP_SLI_BRIDGE ? 0 : 1;
        return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    DEV(device);
    ARG(pci);
    /* A link the board lacks (an A100's 12-17) has no far end: NOT_SUPPORTED, the one error
       NVIDIA's nvidia-smi topo -m steps over while it walks all NVML_NVLINK_MAX_LINKS links. */
    uint32_t count;
    SNAP(s, g->nvlink_count, count);
    if (link >= count && link < NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_NOT_SUPPORTED;
    LINK(link);
    struct mokka_nvlink c;
    snap(s, nl, &c, sizeof(c));
    if (!c.remote_has_pci)
        return NVML_ERROR_NOT_SUPPORTED; /* a switch the host does not enumerate: nothing to name */
    memset(pci, 0, sizeof(*pci));
    pci->domain = c.remote_domain;
    pci->bus = c.remote_bus;
    pci->device = c.remote_device;
    pci->pciDeviceId = c.remote_pci_device_id;
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", c.remote_domain, c.remote_bus, c.remote_device);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", c.remote_domain & 0xFFFF,
             c.remote_bus & 0xFF, c.remote_device & 0xFF);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                         nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    DEV(device);
    ARG(pNvLinkDeviceType);
    LINK(link);
    uint32_t v;
    SNAP(s, nl->remote_type, v);
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                     nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue)
{
    DEV(device);
    ARG(counterValue);
    LINK(link);
    if (counter == NVML_NVLINK_ERROR_DL_ECC_DATA) {
        *counterValue = 0;
        return NVML_SUCCESS;
    }
    if ((unsigned)counter >= MOKKA_NVLINK_COUNTERS)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t v;
    SNAP(s, nl->errors[counter], v);
    *counterValue = v;
    return NVML_SUCCESS;
}

/* ---- topology and affinity ------------------------------------------------------------ */

/* The model computes the level of every pair from the PCI tree (mokkafs/model/topology.py). */
static nvmlGpuTopologyLevel_t level_between(const struct mokka_state *s, unsigned a, unsigned b)
{
    uint8_t v;
    SNAP(s, s->gpus[a].topo_level[b], v);
    return (nvmlGpuTopologyLevel_t)v;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                         nvmlGpuTopologyLevel_t *pathInfo)
{
    DEV(device1);
    const struct mokka_state *s2;
    const struct mokka_gpu *g2;
    nvmlReturn_t r = dev_check(device2, 0, &s2, &g2, NULL);
    if (r != NVML_SUCCESS)
        return r;
    ARG(pathInfo);
    *pathInfo = level_between(s, gpu_index(s, g), gpu_index(s2, g2));
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level,
                                                      unsigned int *count, nvmlDevice_t *deviceArray)
{
    DEV(device);
    ARG(count);
    unsigned self = gpu_index(s, g), n = 0, room = *count;
    int vi;
    for (unsigned v = 0; (vi = view_gpu(s, v)) >= 0; v++) { /* only the GPUs this process sees */
        unsigned i = (unsigned)vi;
        if (i == self || level_between(s, self, i) > level)
            continue;
        if (deviceArray && n < room)
            deviceArray[n] = gpu_handle(i);
        n++;
    }
    *count = n;
    if (deviceArray == NULL && room == 0)
        return NVML_SUCCESS;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* The simulated node's CPU mask of this GPU, as sysfs local_cpus shows it (published by the
   model); both scopes are that mask, since each simulated NUMA node is one socket. */
nvmlReturn_t DECLDIR nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                         unsigned long *cpuSet, nvmlAffinityScope_t scope)
{
    (void)scope;
    DEV(device);
    ARG(cpuSet);
    if (cpuSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t mask[MOKKA_CPU_WORDS];
    SNAP(s, g->cpu_affinity, mask);
    const unsigned bits = sizeof(unsigned long) * 8;
    memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
    for (unsigned c = 0; c < MOKKA_CPU_WORDS * 64 && c / bits < cpuSetSize; c++)
        if (mask[c / 64] >> (c % 64) & 1)
            cpuSet[c / bits] |= 1UL << (c % bits);
    return NVML_SUCCESS;
}

static int g_affinity_noted; /* the one note per process that the host lacks simulated CPUs */

/* nvml.h: pins the calling thread to the GPU's ideal CPUs. The CPUs are the simulated node's;
   the thread runs on the host's, so it is pinned to the part of the mask the host has (the
   kernel drops CPUs that do not exist or are not ours), or to every CPU it may use where that
   part is empty. Where the pinned set is not the mask, one line on stderr says so, once per
   process (docs/nvml.md). */
nvmlReturn_t DECLDIR nvmlDeviceSetCpuAffinity(nvmlDevice_t device)
{
    DEV(device);
    uint64_t mask[MOKKA_CPU_WORDS];
    SNAP(s, g->cpu_affinity, mask);
    int saved = errno;
    cpu_set_t want, all, got;
    CPU_ZERO(&want);
    CPU_ZERO(&all);
    for (unsigned c = 0; c < MOKKA_CPU_WORDS * 64 && c < CPU_SETSIZE; c++) {
        CPU_SET(c, &all);
        if (mask[c / 64] >> (c % 64) & 1)
            CPU_SET(c, &want);
    }
    int fallback = sched_setaffinity(0, sizeof(want), &want) != 0;
    if (fallback && sched_setaffinity(0, sizeof(all), &all) != 0) {
        errno = saved;
        return NVML_ERROR_UNKNOWN;
    }
    if (sched_getaffinity(0, sizeof(got), &got) == 0 && !CPU_EQUAL(&got, &want) &&
        !__atomic_exchange_n(&g_affinity_noted, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "mokka: nvmlDeviceSetCpuAffinity: %s; pinned to %d host CPUs\n",
                fallback ? "this host has none of the simulated GPU's CPUs"
                         : "this host has only part of the simulated GPU's CPUs",
                CPU_COUNT(&got));
    errno = saved;
    return NVML_SUCCESS;
}

/* nvml.h: clears the calling thread's affinity: every CPU the kernel lets it use. */
nvmlReturn_t DECLDIR nvmlDeviceClearCpuAffinity(nvmlDevice_t device)
{
    DEV(device);
    (void)g;
    int saved = errno;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (unsigned c = 0; c < CPU_SETSIZE; c++)
        CPU_SET(c, &all);
    int r = sched_setaffinity(0, sizeof(all), &all);
    errno = saved;
    return r == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    return nvmlDeviceGetCpuAffinityWithinScope(device, cpuSetSize, cpuSet, NVML_AFFINITY_SCOPE_NODE);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize, unsigned long *nodeSet,
                                                 nvmlAffinityScope_t scope)
{
    (void)scope;
    DEV(device);
    ARG(nodeSet);
    if (nodeSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int32_t node;
    SNAP(s, g->numa_node, node);
    memset(nodeSet, 0, nodeSetSize * sizeof(unsigned long));
    if (node >= 0 && (unsigned)node < nodeSetSize * sizeof(unsigned long) * 8)
        nodeSet[node / (sizeof(unsigned long) * 8)] |= 1UL << (node % (sizeof(unsigned long) * 8));
    return NVML_SUCCESS;
}

/* ---- fabric --------------------------------------------------------------------------- */

struct fabric { uint32_t has, clique, state, health_mask, health_summary; uint8_t uuid[16]; };

static nvmlReturn_t read_fabric(const struct mokka_state *s, const struct mokka_gpu *g, struct fabric *f)
{
    SNAP(s, g->has_fabric, f->has);
    if (!f->has)
        return NVML_ERROR_NOT_SUPPORTED;
    SNAP(s, g->fabric_clique_id, f->clique);
    SNAP(s, g->fabric_state, f->state);
    SNAP(s, g->fabric_cluster_uuid, f->uuid);
    SNAP(s, g->fabric_health_mask, f->health_mask);
    SNAP(s, g->fabric_health_summary, f->health_summary);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    DEV(device);
    ARG(gpuFabricInfo);
    struct fabric f;
    nvmlReturn_t r = read_fabric(s, g, &f);
    if (r != NVML_SUCCESS)
        return r;
    memset(gpuFabricInfo, 0, sizeof(*gpuFabricInfo));
    memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof(f.uuid));
    gpuFabricInfo->status = NVML_SUCCESS;
    gpuFabricInfo->cliqueId = f.clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    DEV(device);
    ARG(gpuFabricInfo);
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct fabric f;
    nvmlReturn_t r = read_fabric(s, g, &f);
    if (r != NVML_SUCCESS)
        return r;
    /* v2 is a prefix of v3: fill only what the caller's version has room for. */
    nvmlGpuFabricInfo_v3_t out;
    memset(&out, 0, sizeof(out));
    out.version = version;
    memcpy(out.clusterUuid, f.uuid, sizeof(f.uuid));
    out.status = NVML_SUCCESS;
    out.cliqueId = f.clique;
    out.state = (nvmlGpuFabricState_t)f.state;
    out.healthMask = f.health_mask;
    out.healthSummary = (unsigned char)f.health_summary;
    memcpy(gpuFabricInfo, &out, version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof(out));
    return NVML_SUCCESS;
}
