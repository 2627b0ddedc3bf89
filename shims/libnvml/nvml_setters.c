/*
 * NVML's setters: each checks what NVML itself checks (initialised, a valid handle, arguments
 * NVML can judge without the board), then sends the matching command of the vocabulary to the
 * daemon (mokka_control.h), which validates it against the board, applies it, publishes it and
 * only then answers: when a setter returns, every process reads the new value. Whether the
 * caller may change the node is the daemon's to say, by the kernel's word on who the caller is
 * (docs/setters.md).
 *
 * The handle is checked through nvmlDeviceGetIndex, NVML's own answer to "is this a device of
 * an initialised library", and nvmlDeviceIsMigDeviceHandle (a MIG device handle gets
 * NOT_SUPPORTED, as the driver refuses these setters on one); of nvml_internal.h it needs only
 * handle_resolve, for the node's index the daemon's commands name (NVML's index is this
 * process's, mokka_view.h).
 */
#include "nvml_internal.h"
#include "mokka_control.h"

#include <stdio.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* The daemon's word, as NVML's (MIG's create and destroy, nvml_mig.c, use it too). */
__attribute__((visibility("hidden"))) nvmlReturn_t control_status(int status)
{
    return (nvmlReturn_t)mokka_ctl_nvml_error((enum mokka_ctl_status)status);
}

/* "gpu=<index> <verb> <args>", sent; NVML's error for the outcome. */
static nvmlReturn_t set(unsigned int index, const char *verb, const char *args)
{
    char line[MOKKA_CONTROL_MAX];
    snprintf(line, sizeof(line), "gpu=%u %s %s", index, verb, args);
    return control_status(mokka_control(line, NULL, 0));
}

/* A setting that takes two numbers (a clock range or an applications-clocks pair). */
static nvmlReturn_t set_pair(unsigned int index, const char *verb, unsigned int a, unsigned int b)
{
    char pair[32];
    snprintf(pair, sizeof(pair), "%u %u", a, b);
    return set(index, verb, pair);
}

/* The first check of every setter, as NVML's: a device of an initialised library (then the
   arguments). `index` is then the node's GPU index, which the daemon's commands name (NVML's
   index is this process's: mokka_view.h). */
#define DEVICE_INDEX(device, index)                                  \
    unsigned int index;                                              \
    do {                                                             \
        unsigned int mig_;                                           \
        nvmlReturn_t r_ = nvmlDeviceGetIndex((device), &index);      \
        if (r_ != NVML_SUCCESS)                                      \
            return r_;                                               \
        if (nvmlDeviceIsMigDeviceHandle((device), &mig_) == NVML_SUCCESS && mig_) \
            return NVML_ERROR_NOT_SUPPORTED;                         \
        handle_resolve((device), &index, &mig_); /* the node's index */ \
    } while (0)

nvmlReturn_t DECLDIR nvmlDeviceSetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
    DEVICE_INDEX(device, index);
    if (mode != NVML_FEATURE_DISABLED && mode != NVML_FEATURE_ENABLED)
        return NVML_ERROR_INVALID_ARGUMENT;
    return set(index, "persistence", mode == NVML_FEATURE_ENABLED ? "1" : "0");
}

nvmlReturn_t DECLDIR nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode)
{
    static const char *const names[] = {
        [NVML_COMPUTEMODE_DEFAULT] = "default",
        [NVML_COMPUTEMODE_EXCLUSIVE_THREAD] = "exclusive_thread", /* the daemon: NOT_SUPPORTED */
        [NVML_COMPUTEMODE_PROHIBITED] = "prohibited",
        [NVML_COMPUTEMODE_EXCLUSIVE_PROCESS] = "exclusive_process",
    };
    DEVICE_INDEX(device, index);
    if ((unsigned)mode >= sizeof(names) / sizeof(names[0]))
        return NVML_ERROR_INVALID_ARGUMENT;
    return set(index, "compute_mode", names[mode]);
}

static nvmlReturn_t set_power_limit(unsigned int index, unsigned int milliwatts)
{
    char watts[32];
    snprintf(watts, sizeof(watts), "%u.%03u", milliwatts / 1000, milliwatts % 1000);
    return set(index, "power_limit", watts);
}

nvmlReturn_t DECLDIR nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    DEVICE_INDEX(device, index);
    return set_power_limit(index, limit);
}

nvmlReturn_t DECLDIR nvmlDeviceSetPowerManagementLimit_v2(nvmlDevice_t device, nvmlPowerValue_v2_t *powerValue)
{
    DEVICE_INDEX(device, index);
    if (!powerValue)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (powerValue->version != nvmlPowerValue_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (powerValue->powerScope >= NVML_POWER_SCOPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* The model has one limit per GPU; a module's or memory's own limit is not simulated. */
    if (powerValue->powerScope != NVML_POWER_SCOPE_GPU)
        return NVML_ERROR_NOT_SUPPORTED;
    return set_power_limit(index, powerValue->powerValueMw);
}

nvmlReturn_t DECLDIR nvmlDeviceSetGpuLockedClocks(nvmlDevice_t device, unsigned int minGpuClockMHz,
                                                  unsigned int maxGpuClockMHz)
{
    DEVICE_INDEX(device, index);
    int min_symbolic = minGpuClockMHz >= NVML_CLOCK_LIMIT_ID_RANGE_START;
    int max_symbolic = maxGpuClockMHz >= NVML_CLOCK_LIMIT_ID_RANGE_START;
    if (min_symbolic != max_symbolic) /* nvml.h: mixed numeric and symbolic */
        return NVML_ERROR_INVALID_ARGUMENT;
    if (min_symbolic) {
        if (minGpuClockMHz == NVML_CLOCK_LIMIT_ID_UNLIMITED && maxGpuClockMHz == NVML_CLOCK_LIMIT_ID_UNLIMITED)
            return set(index, "locked_clocks", "default"); /* nvml.h: == nvmlDeviceResetGpuLockedClocks */
        if (minGpuClockMHz > NVML_CLOCK_LIMIT_ID_UNLIMITED || maxGpuClockMHz > NVML_CLOCK_LIMIT_ID_UNLIMITED)
            return NVML_ERROR_INVALID_ARGUMENT;
        return NVML_ERROR_NOT_SUPPORTED; /* the TDP clock: the profiles do not say what it is */
    }
    return set_pair(index, "locked_clocks", minGpuClockMHz, maxGpuClockMHz);
}

nvmlReturn_t DECLDIR nvmlDeviceResetGpuLockedClocks(nvmlDevice_t device)
{
    DEVICE_INDEX(device, index);
    return set(index, "locked_clocks", "default");
}

nvmlReturn_t DECLDIR nvmlDeviceSetApplicationsClocks(nvmlDevice_t device, unsigned int memClockMHz,
                                                     unsigned int graphicsClockMHz)
{
    DEVICE_INDEX(device, index);
    /* the daemon: a supported pair, or INVALID_ARGUMENT */
    return set_pair(index, "applications_clocks", memClockMHz, graphicsClockMHz);
}

nvmlReturn_t DECLDIR nvmlDeviceResetApplicationsClocks(nvmlDevice_t device)
{
    DEVICE_INDEX(device, index);
    return set(index, "applications_clocks", "default");
}

nvmlReturn_t DECLDIR nvmlDeviceSetMemoryLockedClocks(nvmlDevice_t device, unsigned int minMemClockMHz,
                                                     unsigned int maxMemClockMHz)
{
    DEVICE_INDEX(device, index);
    return set_pair(index, "locked_memory_clocks", minMemClockMHz, maxMemClockMHz);
}

nvmlReturn_t DECLDIR nvmlDeviceResetMemoryLockedClocks(nvmlDevice_t device)
{
    DEVICE_INDEX(device, index);
    return set(index, "locked_memory_clocks", "default");
}

/* The pending mode; nvmlDeviceGetEccMode shows it as pending until the GPU is reset. */
nvmlReturn_t DECLDIR nvmlDeviceSetEccMode(nvmlDevice_t device, nvmlEnableState_t ecc)
{
    DEVICE_INDEX(device, index);
    if (ecc != NVML_FEATURE_DISABLED && ecc != NVML_FEATURE_ENABLED)
        return NVML_ERROR_INVALID_ARGUMENT;
    return set(index, "ecc_mode", ecc == NVML_FEATURE_ENABLED ? "1" : "0");
}

nvmlReturn_t DECLDIR nvmlDeviceClearEccErrorCounts(nvmlDevice_t device, nvmlEccCounterType_t counterType)
{
    DEVICE_INDEX(device, index);
    if (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC)
        return NVML_ERROR_INVALID_ARGUMENT;
    return set(index, "clear_ecc", counterType == NVML_VOLATILE_ECC ? "volatile" : "aggregate");
}

nvmlReturn_t DECLDIR nvmlDeviceSetAccountingMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
    DEVICE_INDEX(device, index);
    if (mode != NVML_FEATURE_DISABLED && mode != NVML_FEATURE_ENABLED)
        return NVML_ERROR_INVALID_ARGUMENT;
    return set(index, "accounting", mode == NVML_FEATURE_ENABLED ? "1" : "0");
}

nvmlReturn_t DECLDIR nvmlDeviceClearAccountingPids(nvmlDevice_t device)
{
    DEVICE_INDEX(device, index);
    return set(index, "clear_accounting", "1");
}

/* The daemon knows how many links the board has (a link beyond them: INVALID_ARGUMENT). */
nvmlReturn_t DECLDIR nvmlDeviceResetNvLinkErrorCounters(nvmlDevice_t device, unsigned int link)
{
    DEVICE_INDEX(device, index);
    if (link >= 18)
        return NVML_ERROR_INVALID_ARGUMENT;
    char args[32];
    snprintf(args, sizeof(args), "%u reset_errors", link);
    return set(index, "nvlink", args);
}
