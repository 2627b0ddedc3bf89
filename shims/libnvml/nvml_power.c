/*
 * libnvidia-ml: how a GPU runs. Memory and BAR1, temperature and fans, power, clocks,
 * utilization, performance state and clock event reasons, and the modes (persistence, compute,
 * display; MIG's are nvml_mig.c's). On a MIG device handle, memory is its GPU instance's.
 */
#include "nvml_internal.h"

/* ---- memory --------------------------------------------------------------------------- */

U32_GETTER(nvmlDeviceGetMemoryBusWidth, mem_bus_width, DEV)

struct mem4 { uint64_t total, reserved, used, free; };

/* The GPU's memory, or for a MIG device (md) its GPU instance's: the slice, nothing reserved, used
   what the processes on it allocated. Inlined into each getter: as a call it cost a MIG device's
   getter 7 ns more than a GPU's (bench/bench_mig.py). */
static inline __attribute__((always_inline)) void read_mem(const struct mokka_state *s, const struct mokka_gpu *g,
                                                           const struct mokka_mig_device *md, struct mem4 *m)
{
    if (md) {
        const struct mokka_mig_gi *gi = mig_gi_of(g, md);
        MOKKA_CONSISTENT(s) {
            m->total = gi->memory_total;
            m->used = gi->memory_used;
        }
        m->reserved = 0;
        m->free = m->used < m->total ? m->total - m->used : 0;
        return;
    }
    MOKKA_CONSISTENT(s) {
        m->total = g->mem_total;
        m->reserved = g->mem_reserved;
        m->used = g->mem_used;
        m->free = g->mem_free;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEV_FLAGS(device, DEV_MIG_OK);
    ARG(memory);
    struct mem4 m;
    read_mem(s, g, mig_dev, &m);
    /* v1 counts the reserved memory as used, as the real library's v1 does from R510; before,
       the model publishes the total without it and nothing reserved (model/dynamics.py). */
    memory->total = m.total;
    memory->free = m.free;
    memory->used = m.used + m.reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEV_FLAGS(device, DEV_MIG_OK);
    VERSIONED_ARG(memory, nvmlMemory_v2);
    struct mem4 m;
    read_mem(s, g, mig_dev, &m);
    memory->total = m.total;
    memory->reserved = m.reserved;
    memory->free = m.free;
    memory->used = m.used;
    return NVML_SUCCESS;
}

/* On a MIG device, its GPU instance's aperture (the model's share of the GPU's), none of it mapped. */
nvmlReturn_t DECLDIR nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    DEV_FLAGS(device, DEV_MIG_OK);
    ARG(bar1Memory);
    uint64_t b[2];
    MOKKA_CONSISTENT(s) {
        if (mig_dev) {
            b[0] = mig_gi_of(g, mig_dev)->bar1_total;
            b[1] = 0;
        } else {
            b[0] = g->bar1_total;
            b[1] = g->bar1_used;
        }
    }
    bar1Memory->bar1Total = b[0];
    bar1Memory->bar1Used = b[1];
    bar1Memory->bar1Free = b[0] - b[1];
    return NVML_SUCCESS;
}

/* ---- temperature and cooling ---------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    DEV(device);
    ARG(temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    int32_t t;
    SNAP(s, g->temp_gpu, t);
    *temp = t < 0 ? 0 : (unsigned)t;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEV(device);
    VERSIONED_ARG(temperature, nvmlTemperature_v1);
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    int32_t t;
    SNAP(s, g->temp_gpu, t);
    temperature->temperature = t;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                                       unsigned int *temp)
{
    DEV(device);
    ARG(temp);
    if ((unsigned)thresholdType >= 8)
        return NVML_ERROR_INVALID_ARGUMENT;
    int32_t t;
    SNAP(s, g->temp_threshold[thresholdType], t);
    if (t < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *temp = (unsigned)t;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMarginTemperature(nvmlDevice_t device, nvmlMarginTemperature_t *marginTempInfo)
{
    DEV(device);
    VERSIONED_ARG(marginTempInfo, nvmlMarginTemperature_v1);
    int32_t t[2];
    SNAP(s, g->temp_tlimit, t[0]);
    SNAP(s, g->temp_gpu, t[1]);
    if (t[0] < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    marginTempInfo->marginTemperature = t[0] - t[1];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    DEV(device);
    ARG(numFans);
    uint32_t has;
    SNAP(s, g->has_fan, has);
    if (!has)
        return NVML_ERROR_NOT_SUPPORTED;
    *numFans = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed)
{
    DEV(device);
    ARG(speed);
    uint32_t v[2];
    MOKKA_CONSISTENT(s) {
        v[0] = g->has_fan;
        v[1] = g->fan_speed;
    }
    if (!v[0])
        return NVML_ERROR_NOT_SUPPORTED;
    if (fan != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *speed = v[1];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    return nvmlDeviceGetFanSpeed_v2(device, 0, speed);
}

/* ---- power ---------------------------------------------------------------------------- */

U32_GETTER(nvmlDeviceGetPowerUsage, power_usage, DEV)
U32_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit, DEV)
U32_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, power_default_limit, DEV)
U32_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_enforced_limit, DEV)

PAIR_GETTER(nvmlDeviceGetPowerManagementLimitConstraints, unsigned int, power_min_limit, power_max_limit)

nvmlReturn_t DECLDIR nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    DEV(device);
    ARG(mode);
    *mode = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    DEV(device);
    ARG(energy);
    uint64_t v;
    SNAP(s, g->energy_mj, v);
    *energy = v;
    return NVML_SUCCESS;
}

/* ---- clocks, utilization, performance ------------------------------------------------- */

static nvmlReturn_t clock_of(const struct mokka_state *s, const uint32_t *table, nvmlClockType_t type, unsigned *mhz)
{
    if (!mhz)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((unsigned)type >= 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t v;
    SNAP(s, table[type], v);
    *mhz = v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    DEV(device);
    return clock_of(s, g->clock_cur, type, clock);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    DEV(device);
    return clock_of(s, g->clock_max, type, clock);
}

nvmlReturn_t DECLDIR nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType, unsigned int *clockMHz)
{
    DEV(device);
    return clock_of(s, g->clock_app, clockType, clockMHz);
}

nvmlReturn_t DECLDIR nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                           unsigned int *clockMHz)
{
    DEV(device);
    return clock_of(s, g->clock_default_app, clockType, clockMHz);
}

/* The board's supported clocks, as the model listed them (mokka_state.h supported_clocks):
   memory clocks highest first, and the graphics clocks each allows, highest first. A board that
   lists none answers NOT_SUPPORTED; a count too small, INSUFFICIENT_SIZE with the count needed. */
static nvmlReturn_t copy_clocks(const uint32_t *list, uint32_t have, unsigned int *count, unsigned int *clocksMHz)
{
    ARG(count);
    unsigned int room = *count;
    *count = have;
    if (room < have)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    ARG(clocksMHz || !have);
    for (uint32_t k = 0; k < have; k++)
        clocksMHz[k] = list[k];
    return NVML_SUCCESS;
}

/* The node's supported-clocks table, one consistent copy: its row count, 0 when the board lists
 * none (or the count is out of range: NOT_SUPPORTED either way). */
static uint32_t supported_clocks(const struct mokka_state *s, struct mokka_supported_clocks table[MOKKA_MAX_MEM_CLOCKS])
{
    uint32_t n = 0;
    MOKKA_CONSISTENT(s) {
        n = s->supported_clock_count;
        memcpy(table, s->supported_clocks, sizeof(struct mokka_supported_clocks) * MOKKA_MAX_MEM_CLOCKS);
    }
    return n <= MOKKA_MAX_MEM_CLOCKS ? n : 0;
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count, unsigned int *clocksMHz)
{
    DEV(device);
    (void)g;
    struct mokka_supported_clocks table[MOKKA_MAX_MEM_CLOCKS];
    uint32_t n = supported_clocks(s, table);
    if (n == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    uint32_t mems[MOKKA_MAX_MEM_CLOCKS];
    for (uint32_t k = 0; k < n; k++)
        mems[k] = table[k].memory_mhz;
    return copy_clocks(mems, n, count, clocksMHz);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int memoryClockMHz,
                                                          unsigned int *count, unsigned int *clocksMHz)
{
    DEV(device);
    (void)g;
    ARG(count);
    struct mokka_supported_clocks table[MOKKA_MAX_MEM_CLOCKS];
    uint32_t n = supported_clocks(s, table);
    if (n == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    for (uint32_t k = 0; k < n; k++)
        if (table[k].memory_mhz == memoryClockMHz)
            return copy_clocks(table[k].graphics_mhz,
                               table[k].graphics_count < MOKKA_MAX_GRAPHICS_CLOCKS ? table[k].graphics_count
                                                                                   : MOKKA_MAX_GRAPHICS_CLOCKS,
                               count, clocksMHz);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                        unsigned int *clockMHz)
{
    DEV(device);
    return clock_of(s, g->clock_max, clockType, clockMHz);
}

nvmlReturn_t DECLDIR nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType, nvmlClockId_t clockId,
                                        unsigned int *clockMHz)
{
    DEV(device);
    switch (clockId) {
    case NVML_CLOCK_ID_CURRENT: return clock_of(s, g->clock_cur, clockType, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET: return clock_of(s, g->clock_app, clockType, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT: return clock_of(s, g->clock_default_app, clockType, clockMHz);
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX: return clock_of(s, g->clock_max, clockType, clockMHz);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEV(device);
    ARG(utilization);
    uint32_t v[3];
    MOKKA_CONSISTENT(s) {
        v[0] = g->util_gpu;
        v[1] = g->util_mem;
        v[2] = g->mig_mode;
    }
    if (v[2])
        return NVML_ERROR_NOT_SUPPORTED; /* a MIG-enabled GPU has no whole-GPU utilization, as on real boards */
    utilization->gpu = v[0];
    utilization->memory = v[1];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                     unsigned int *samplingPeriodUs)
{
    DEV(device);
    ARG(utilization);
    ARG(samplingPeriodUs);
    SNAP(s, g->util_enc, *utilization);
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                     unsigned int *samplingPeriodUs)
{
    DEV(device);
    ARG(utilization);
    ARG(samplingPeriodUs);
    SNAP(s, g->util_dec, *utilization);
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

FIELD_GETTER(nvmlDeviceGetPerformanceState, nvmlPstates_t, pstate, DEV, (nvmlPstates_t)v)

nvmlReturn_t DECLDIR nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    return nvmlDeviceGetPerformanceState(device, pState);
}

#define ALL_CLOCK_REASONS 0x1FFULL

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    DEV(device);
    ARG(reasons);
    uint64_t v;
    SNAP(s, g->throttle_mask, v);
    *reasons = v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    DEV(device);
    ARG(reasons);
    *reasons = ALL_CLOCK_REASONS;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

/* ---- modes ---------------------------------------------------------------------------- */

FIELD_GETTER(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, persistence_mode, DEV, ENABLE_STATE(v))

FIELD_GETTER(nvmlDeviceGetComputeMode, nvmlComputeMode_t, compute_mode, DEV, (nvmlComputeMode_t)v)

nvmlReturn_t DECLDIR nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    DEV(device);
    ARG(display);
    *display = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
    DEV(device);
    ARG(isActive);
    *isActive = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* How the GPU reaches system-allocated memory: the board's (profile addressing_mode, from each
   capture), HMM on x86 hosts, ATS on Grace. */
nvmlReturn_t DECLDIR nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode)
{
    DEV(device);
    VERSIONED_ARG(mode, nvmlDeviceAddressingMode_v1);
    uint32_t v;
    SNAP(s, g->addressing_mode, v);
    mode->value = v;
    return NVML_SUCCESS;
}

/* The JPEG and optical-flow engines, the encoder's sessions and frame capture: a simulated
   node runs CUDA work only (docs/cuda.md), so they are idle, as on the captured boards: 0 %,
   no sessions. A GPU in MIG mode has no whole-GPU JPEG or OFA utilization (a real H100 and H200
   in MIG mode print N/A for both; --help-query-gpu says so), as for GetUtilizationRates. */
static nvmlReturn_t idle_engine(nvmlDevice_t device, unsigned int *utilization, unsigned int *samplingPeriodUs)
{
    DEV(device);
    ARG(utilization);
    ARG(samplingPeriodUs);
    uint32_t mig;
    SNAP(s, g->mig_mode, mig);
    if (mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *utilization = 0;
    *samplingPeriodUs = 167000;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetJpgUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                 unsigned int *samplingPeriodUs)
{
    return idle_engine(device, utilization, samplingPeriodUs);
}

nvmlReturn_t DECLDIR nvmlDeviceGetOfaUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                 unsigned int *samplingPeriodUs)
{
    return idle_engine(device, utilization, samplingPeriodUs);
}

nvmlReturn_t DECLDIR nvmlDeviceGetEncoderStats(nvmlDevice_t device, unsigned int *sessionCount, unsigned int *averageFps,
                                               unsigned int *averageLatency)
{
    DEV(device);
    (void)g;
    ARG(sessionCount);
    ARG(averageFps);
    ARG(averageLatency);
    *sessionCount = *averageFps = *averageLatency = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetFBCStats(nvmlDevice_t device, nvmlFBCStats_t *fbcStats)
{
    DEV(device);
    (void)g;
    ARG(fbcStats);
    memset(fbcStats, 0, sizeof(*fbcStats));
    return NVML_SUCCESS;
}

/* Confidential computing is off on a simulated node: no protected memory (every capture shows
   0 MiB), all of it unprotected. */
nvmlReturn_t DECLDIR nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, nvmlConfComputeMemSizeInfo_t *memInfo)
{
    DEV(device);
    ARG(memInfo);
    uint64_t total;
    SNAP(s, g->mem_total, total);
    memInfo->protectedMemSizeKib = 0;
    memInfo->unprotectedMemSizeKib = total >> 10;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetConfComputeProtectedMemoryUsage(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEV(device);
    (void)g;
    ARG(memory);
    memset(memory, 0, sizeof(*memory));
    return NVML_SUCCESS;
}
