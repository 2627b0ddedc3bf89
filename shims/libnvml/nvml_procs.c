/*
 * libnvidia-ml: the processes on a GPU, as the daemon published them from the CUDA shim's
 * process table. On a MIG device handle, those on that device; on its GPU, every one, each with
 * the GPU and compute instance it runs on.
 */
#include "nvml_internal.h"

#include <errno.h>
#include <time.h>

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

/* One sample per compute process, taken now, while the GPU is busy (the header: a sample per
   process "that had some non-zero utilization during the last sample period"); none at idle or
   at or before lastSeenTimeStamp: NOT_FOUND. The model has no per-process split, so each
   process gets the GPU's SM and memory utilization, the rule its accounting records follow too
   (docs/nvml.md); encoder and decoder are the GPU's. Count protocol (pynvml): utilization NULL
   gives INSUFFICIENT_SIZE and the count, as does a buffer too small. */
nvmlReturn_t DECLDIR nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                     unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    DEV(device);
    ARG(processSamplesCount);
    struct mokka_gpu_process procs[MOKKA_MAX_GPU_PROCS];
    unsigned int n = read_processes(s, g, NULL, procs);
    uint32_t util[4];
    MOKKA_CONSISTENT(s) {
        util[0] = g->util_gpu;
        util[1] = g->util_mem;
        util[2] = g->util_enc;
        util[3] = g->util_dec;
    }
    struct timespec ts;
    int saved = errno;
    clock_gettime(CLOCK_REALTIME, &ts);
    errno = saved;
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
    if (!(util[0] | util[1] | util[2] | util[3]) || now <= lastSeenTimeStamp)
        n = 0;
    if (!n) {
        *processSamplesCount = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        utilization[i] = (nvmlProcessUtilizationSample_t){.pid = procs[i].pid, .timeStamp = now, .smUtil = util[0],
                                                          .memUtil = util[1], .encUtil = util[2], .decUtil = util[3]};
    }
    *processSamplesCount = n;
    return NVML_SUCCESS;
}

/* ---- accounting ----------------------------------------------------------------------- */

/* nvml.h: the pids and stats answer NOT_SUPPORTED while accounting mode is disabled (the buffer's
   size is there all the same: real -q shows "Accounting Mode Buffer Size : 4000" beside Disabled). */
static nvmlReturn_t accounting_on(const struct mokka_state *s, const struct mokka_gpu *g)
{
    uint32_t on;
    SNAP(s, g->accounting_mode, on);
    return on ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

FIELD_GETTER(nvmlDeviceGetAccountingMode, nvmlEnableState_t, accounting_mode, DEV, ENABLE_STATE(v))

nvmlReturn_t DECLDIR nvmlDeviceGetAccountingBufferSize(nvmlDevice_t device, unsigned int *bufferSize)
{
    DEV(device);
    ARG(bufferSize);
    *bufferSize = MOKKA_ACCOUNTING_RECORDS;
    return NVML_SUCCESS;
}

/* The pids of the records, running and exited, oldest first. Count protocol as for processes:
   *count too small is INSUFFICIENT_SIZE with the count needed. */
nvmlReturn_t DECLDIR nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count, unsigned int *pids)
{
    DEV(device);
    ARG(count);
    nvmlReturn_t r = accounting_on(s, g);
    if (r != NVML_SUCCESS)
        return r;
    const struct mokka_accounting *a = &s->accounting[gpu_index(s, g)];
    uint32_t got[MOKKA_ACCOUNTING_RECORDS]; /* 16 KB of stack: no static TLS in a library loaded late */
    uint32_t n;
    MOKKA_CONSISTENT(s) {
        n = __atomic_load_n(&a->count, __ATOMIC_RELAXED);
        if (n > MOKKA_ACCOUNTING_RECORDS)
            n = MOKKA_ACCOUNTING_RECORDS;
        for (uint32_t k = 0; k < n; k++)
            got[k] = a->records[k].pid;
    }
    unsigned room = *count;
    *count = n;
    if (room < n)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    if (n && !pids)
        return NVML_ERROR_INVALID_ARGUMENT;
    memcpy(pids, got, n * sizeof(*pids));
    return NVML_SUCCESS;
}

/* The newest record of `pid` (a pid the kernel reused has a newer one). */
nvmlReturn_t DECLDIR nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid, nvmlAccountingStats_t *stats)
{
    DEV(device);
    ARG(stats);
    nvmlReturn_t r = accounting_on(s, g);
    if (r != NVML_SUCCESS)
        return r;
    const struct mokka_accounting *a = &s->accounting[gpu_index(s, g)];
    struct mokka_accounting_record rec;
    int found;
    MOKKA_CONSISTENT(s) {
        uint32_t n = __atomic_load_n(&a->count, __ATOMIC_RELAXED);
        if (n > MOKKA_ACCOUNTING_RECORDS)
            n = MOKKA_ACCOUNTING_RECORDS;
        found = 0;
        for (uint32_t k = n; k-- > 0;) {
            if (a->records[k].pid == pid) {
                memcpy(&rec, &a->records[k], sizeof(rec));
                found = 1;
                break;
            }
        }
    }
    if (!found)
        return NVML_ERROR_NOT_FOUND;
    memset(stats, 0, sizeof(*stats));
    stats->gpuUtilization = rec.gpu_utilization;
    stats->memoryUtilization = rec.memory_utilization;
    stats->maxMemoryUsage = rec.max_memory_usage;
    stats->time = rec.time_ms;
    stats->startTime = rec.start_time_us;
    stats->isRunning = rec.is_running;
    return NVML_SUCCESS;
}
