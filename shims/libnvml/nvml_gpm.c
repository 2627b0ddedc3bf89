/*
 * libnvidia-ml: GPU performance monitoring (GPM), Hopper and later.
 *
 * A real GPM sample is a snapshot of hardware counters, and a metric is the change of counters
 * between two samples over the time between them. The shared state has the model's utilization
 * (and PCIe throughput) at the latest publish, not counters, so a sample here holds that
 * snapshot and its time, and a metric is the mean of the two snapshots: exact while the load is
 * steady between the samples (the model's load changes in steps, by command), and between the
 * two values across a step. What each metric is made of is the table in docs/nvml.md (GPM).
 */
#include "nvml_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* ---- samples -------------------------------------------------------------------------- */

/* Samples live in a table the library owns and a handle is a number, as event sets are
   (nvml_events.c): tag (16 bits) | generation (32) | slot (16). Nothing a caller hands back is
   dereferenced; a freed sample, a random value or a pointer to anything is INVALID_ARGUMENT. */
#define SAMPLE_TAG 0x6770ull /* the top 16 bits of every sample handle */
#define SAMPLE_CHUNK 64
#define SAMPLE_CHUNKS 64     /* at most 4096 live samples per process */

struct gpm_sample {
    uint32_t gen;            /* odd while handed out, even while free */
    uint32_t filled;         /* nvmlGpmSampleGet wrote it */
    uint32_t gpu;            /* whose */
    uint64_t time_ns;        /* CLOCK_MONOTONIC at the read */
    uint32_t util_gpu, util_mem;  /* percent */
    uint32_t pcie_tx_kbps, pcie_rx_kbps;
};

static pthread_mutex_t g_samples_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpm_sample *g_sample_chunks[SAMPLE_CHUNKS]; /* guarded by g_samples_lock */

_Static_assert(sizeof(nvmlGpmSample_t) == 8, "handles carry 64 bits");

static void samples_prepare(void) { pthread_mutex_lock(&g_samples_lock); }
static void samples_release(void) { pthread_mutex_unlock(&g_samples_lock); }
__attribute__((constructor)) static void samples_atfork(void)
{
    pthread_atfork(samples_prepare, samples_release, samples_release);
}

/* The sample a handle names, or NULL (g_samples_lock held). */
static struct gpm_sample *sample_of(nvmlGpmSample_t h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    unsigned slot = (unsigned)(v & 0xFFFF);
    uint32_t gen = (uint32_t)(v >> 16);
    if (v >> 48 != SAMPLE_TAG || slot >= SAMPLE_CHUNK * SAMPLE_CHUNKS || !(gen & 1))
        return NULL;
    struct gpm_sample *chunk = g_sample_chunks[slot / SAMPLE_CHUNK];
    if (!chunk || chunk[slot % SAMPLE_CHUNK].gen != gen)
        return NULL;
    return &chunk[slot % SAMPLE_CHUNK];
}

/* GPM needs the performance monitor of Hopper and later (the header's "Hopper or newer"): the
   model's rule (compute.py nvml_support), published. */
static int gpm_supported(const struct mokka_state *s, const struct mokka_gpu *g)
{
    uint32_t supported;
    SNAP(s, g->nvml_gpm, supported);
    return supported != 0;
}

nvmlReturn_t DECLDIR nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    DEV(device);
    VERSIONED_ARG(gpmSupport, NVML_GPM_SUPPORT_VERSION);
    gpmSupport->isSupportedDevice = (unsigned)gpm_supported(s, g);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    ARG(gpmSample);
    int saved = errno;
    nvmlReturn_t r = NVML_ERROR_MEMORY; /* every slot taken, or no memory for a new chunk */
    pthread_mutex_lock(&g_samples_lock);
    for (unsigned c = 0; c < SAMPLE_CHUNKS && r != NVML_SUCCESS; c++) {
        if (!g_sample_chunks[c] && !(g_sample_chunks[c] = calloc(SAMPLE_CHUNK, sizeof(struct gpm_sample))))
            break;
        for (unsigned i = 0; i < SAMPLE_CHUNK; i++) {
            struct gpm_sample *sm = &g_sample_chunks[c][i];
            if (sm->gen & 1)
                continue;
            uint32_t gen = sm->gen + 1;
            memset(sm, 0, sizeof(*sm));
            sm->gen = gen;
            *gpmSample = (nvmlGpmSample_t)(uintptr_t)(SAMPLE_TAG << 48 | (uint64_t)gen << 16 | (c * SAMPLE_CHUNK + i));
            r = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_samples_lock);
    errno = saved;
    return r;
}

nvmlReturn_t DECLDIR nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    pthread_mutex_lock(&g_samples_lock);
    struct gpm_sample *sm = sample_of(gpmSample);
    if (sm)
        sm->gen++;
    pthread_mutex_unlock(&g_samples_lock);
    return sm ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t DECLDIR nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    DEV(device);
    if (!gpm_supported(s, g))
        return NVML_ERROR_NOT_SUPPORTED;
    struct gpm_sample snapshot = {.filled = 1, .gpu = gpu_index(s, g)};
    MOKKA_CONSISTENT(s) {
        snapshot.util_gpu = g->util_gpu;
        snapshot.util_mem = g->util_mem;
        snapshot.pcie_tx_kbps = g->pcie_tx_kbps;
        snapshot.pcie_rx_kbps = g->pcie_rx_kbps;
    }
    struct timespec ts;
    int saved = errno;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    errno = saved;
    snapshot.time_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    pthread_mutex_lock(&g_samples_lock);
    struct gpm_sample *sm = sample_of(gpmSample);
    if (sm) {
        snapshot.gen = sm->gen;
        *sm = snapshot;
    }
    pthread_mutex_unlock(&g_samples_lock);
    return sm ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* ---- metrics -------------------------------------------------------------------------- */

/* What a utilization metric is of the GPU's utilization (percent of the model's util_gpu). The
   model has one number for how busy the GPU is and no instruction mix, so the SM metrics follow
   it in a fixed proportion, that of the model's stand-in workload, a dense FP16 tensor-core
   training step: every SM busy while a kernel runs, half the warps resident, most of the time
   in HMMA, some FP32 and integer work for the epilogues and addressing, no FP64 or
   integer/double tensor math. A stated assumption, not a measurement. */
static const struct { unsigned id; unsigned percent_of_util; } g_util_share[] = {
    {NVML_GPM_METRIC_GRAPHICS_UTIL, 100},   {NVML_GPM_METRIC_SM_UTIL, 100},
    {NVML_GPM_METRIC_SM_OCCUPANCY, 50},     {NVML_GPM_METRIC_INTEGER_UTIL, 10},
    {NVML_GPM_METRIC_ANY_TENSOR_UTIL, 60},  {NVML_GPM_METRIC_HMMA_TENSOR_UTIL, 60},
    {NVML_GPM_METRIC_DFMA_TENSOR_UTIL, 0},  {NVML_GPM_METRIC_DMMA_TENSOR_UTIL, 0},
    {NVML_GPM_METRIC_IMMA_TENSOR_UTIL, 0},  {NVML_GPM_METRIC_FP64_UTIL, 0},
    {NVML_GPM_METRIC_FP32_UTIL, 20},        {NVML_GPM_METRIC_FP16_UTIL, 10},
};

static double mean(uint32_t a, uint32_t b) { return ((double)a + (double)b) / 2.0; }

static nvmlReturn_t metric_value(const struct gpm_sample *a, const struct gpm_sample *b, unsigned id, double *v)
{
    if (id == 0 || id >= NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof(g_util_share) / sizeof(g_util_share[0]); i++)
        if (g_util_share[i].id == id) {
            *v = mean(a->util_gpu, b->util_gpu) * g_util_share[i].percent_of_util / 100.0;
            return NVML_SUCCESS;
        }
    switch (id) {
    case NVML_GPM_METRIC_DRAM_BW_UTIL: *v = mean(a->util_mem, b->util_mem); return NVML_SUCCESS;
    /* nvmlDeviceGetPcieThroughput's KB/s, in MiB/s */
    case NVML_GPM_METRIC_PCIE_TX_PER_SEC: *v = mean(a->pcie_tx_kbps, b->pcie_tx_kbps) * 1000.0 / 1048576.0; return NVML_SUCCESS;
    case NVML_GPM_METRIC_PCIE_RX_PER_SEC: *v = mean(a->pcie_rx_kbps, b->pcie_rx_kbps) * 1000.0 / 1048576.0; return NVML_SUCCESS;
    default: break;
    }
    /* NVLink traffic (the model carries none: no workload in it talks to a peer), engines it has
       no per-engine numbers for (NVDEC, NVJPG, NVOFA), C2C, caches, context switches, and the
       cumulative counters since boot, which would need counters the state does not carry. */
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t DECLDIR nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    VERSIONED_ARG(metricsGet, NVML_GPM_METRICS_GET_VERSION);
    if (metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct gpm_sample a = {0}, b = {0};
    int ok = 0;
    pthread_mutex_lock(&g_samples_lock);
    struct gpm_sample *pa = sample_of(metricsGet->sample1), *pb = sample_of(metricsGet->sample2);
    if (pa && pb) {
        a = *pa;
        b = *pb;
        ok = 1;
    }
    pthread_mutex_unlock(&g_samples_lock);
    /* two samples, both read, of one GPU, the second later than the first */
    if (!ok || !a.filled || !b.filled || a.gpu != b.gpu || b.time_ns <= a.time_ns)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < metricsGet->numMetrics; i++) {
        nvmlGpmMetric_t *m = &metricsGet->metrics[i];
        double v = 0.0;
        m->nvmlReturn = metric_value(&a, &b, m->metricId, &v);
        m->value = m->nvmlReturn == NVML_SUCCESS ? v : 0.0;
        m->metricInfo.shortName = m->metricInfo.longName = m->metricInfo.unit = NULL;
    }
    return NVML_SUCCESS;
}
