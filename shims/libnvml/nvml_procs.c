/*
 * libnvidia-ml: the processes on a GPU, as the daemon published them from the CUDA shim's
 * process table. On a MIG device handle, those on that device; on its GPU, every one, each with
 * the GPU and compute instance it runs on.
 */
#include "nvml_internal.h"

/* ---- processes ------------------------------------------------------------------------ */

/* The compute processes the daemon published for this GPU (from the CUDA shim's process table,
   docs/cuda.md). Graphics and MPS lists are always empty: no process draws or runs under MPS.
   Count protocol (pynvml, go-nvml): with *infoCount too small, INSUFFICIENT_SIZE and the count
   needed; with no processes, SUCCESS and 0, even when infos is NULL. */
static unsigned int read_processes(const struct mokka_state *s, const struct mokka_gpu *g,
                                   const struct mokka_mig_device *md, struct mokka_gpu_process *out)
{
    uint32_t n, gi = 0, ci = 0;
    (void)mokka_state_checked(); /* monitors list processes each round: a good time to look */
    MOKKA_CONSISTENT(s) { /* count and list from one snapshot */
        n = __atomic_load_n(&g->process_count, __ATOMIC_RELAXED);
        if (n > MOKKA_MAX_GPU_PROCS)
            n = MOKKA_MAX_GPU_PROCS;
        memcpy(out, g->processes, n * sizeof(*out));
        if (md) {
            gi = md->gi_id;
            ci = md->ci_id;
        }
    }
    if (!md)
        return n;
    unsigned int kept = 0;
    for (unsigned int i = 0; i < n; i++)
        if (out[i].mig_gi == gi && out[i].mig_ci == ci)
            out[kept++] = out[i];
    return kept;
}

/* NVML's instance ids of a process: 0xFFFFFFFF on none (nvml.h). */
static unsigned int instance_id(uint16_t id) { return id == MOKKA_NO_MIG ? 0xFFFFFFFFu : id; }

#define PROCESS_LIST_GETTER(name, type, graphics_or_mps, fill)                                       \
    nvmlReturn_t DECLDIR name(nvmlDevice_t device, unsigned int *infoCount, type *infos)     \
    {                                                                                          \
        DEV_FLAGS(device, DEV_MIG_OK);                                                         \
        ARG(infoCount);                                                                        \
        struct mokka_gpu_process procs[MOKKA_MAX_GPU_PROCS];                                   \
        unsigned int n = (graphics_or_mps) ? 0 : read_processes(s, g, mig_dev, procs); \
        if (n > *infoCount) {                                                                  \
            *infoCount = n;                                                                    \
            return NVML_ERROR_INSUFFICIENT_SIZE;                                               \
        }                                                                                      \
        if (n && !infos)                                                                       \
            return NVML_ERROR_INVALID_ARGUMENT;                                                \
        for (unsigned int i = 0; i < n; i++) {                                                 \
            memset(&infos[i], 0, sizeof(infos[i]));                                            \
            infos[i].pid = procs[i].pid;                                                       \
            infos[i].usedGpuMemory = procs[i].used_memory;                                     \
            fill;                                                                              \
        }                                                                                      \
        *infoCount = n;                                                                        \
        return NVML_SUCCESS;                                                                   \
    }

#define INSTANCE_IDS (infos[i].gpuInstanceId = instance_id(procs[i].mig_gi), \
                infos[i].computeInstanceId = instance_id(procs[i].mig_ci))
PROCESS_LIST_GETTER(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 0, (void)0)
PROCESS_LIST_GETTER(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 0, INSTANCE_IDS)
PROCESS_LIST_GETTER(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, 0, INSTANCE_IDS)
PROCESS_LIST_GETTER(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 1, (void)0)
PROCESS_LIST_GETTER(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, 1, INSTANCE_IDS)
PROCESS_LIST_GETTER(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, 1, INSTANCE_IDS)
PROCESS_LIST_GETTER(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, 1, (void)0)
PROCESS_LIST_GETTER(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 1, INSTANCE_IDS)
PROCESS_LIST_GETTER(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, 1, INSTANCE_IDS)

nvmlReturn_t DECLDIR nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                     unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    (void)utilization;
    (void)lastSeenTimeStamp;
    DEV(device);
    ARG(processSamplesCount);
    *processSamplesCount = 0;
    return NVML_ERROR_NOT_FOUND; /* no samples newer than the timestamp, as the driver says */
}
