/*
 * libnvidia-ml: memory errors. ECC mode and counters, retired pages (Turing) and remapped rows
 * (Ampere and later).
 */
#include "nvml_internal.h"

/* ---- ECC, retired pages, remapped rows ------------------------------------------------ */

/* A MIG device's mode is its GPU's (its counters are NOT_SUPPORTED: the model counts per GPU). */
nvmlReturn_t DECLDIR nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    DEV_FLAGS(device, DEV_MIG_OK);
    ARG(current);
    ARG(pending);
    uint32_t v[2];
    MOKKA_CONSISTENT(s) {
        v[0] = g->ecc_enabled;
        v[1] = g->ecc_pending; /* set by nvmlDeviceSetEccMode, in effect after a reset */
    }
    *current = ENABLE_STATE(v[0]);
    *pending = ENABLE_STATE(v[1]);
    return NVML_SUCCESS;
}

static nvmlReturn_t ecc_check(const struct mokka_state *s, const struct mokka_gpu *g, nvmlMemoryErrorType_t et,
                              nvmlEccCounterType_t ct)
{
    uint32_t on;
    SNAP(s, g->ecc_enabled, on);
    if (!on)
        return NVML_ERROR_NOT_SUPPORTED;
    if ((unsigned)et > 1 || (unsigned)ct > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                 nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    DEV(device);
    ARG(eccCounts);
    nvmlReturn_t r = ecc_check(s, g, errorType, counterType);
    if (r != NVML_SUCCESS)
        return r;
    uint64_t v[MOKKA_ECC_LOCATIONS], sum = 0;
    snap(s, g->ecc[counterType][errorType], v, sizeof(v));
    for (int i = 0; i < MOKKA_ECC_LOCATIONS; i++)
        sum += v[i];
    *eccCounts = sum;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetDetailedEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                    nvmlEccCounterType_t counterType, nvmlEccErrorCounts_t *eccCounts)
{
    DEV(device);
    ARG(eccCounts);
    nvmlReturn_t r = ecc_check(s, g, errorType, counterType);
    if (r != NVML_SUCCESS)
        return r;
    uint64_t v[MOKKA_ECC_LOCATIONS];
    snap(s, g->ecc[counterType][errorType], v, sizeof(v));
    eccCounts->l1Cache = v[NVML_MEMORY_LOCATION_L1_CACHE];
    eccCounts->l2Cache = v[NVML_MEMORY_LOCATION_L2_CACHE];
    eccCounts->deviceMemory = v[NVML_MEMORY_LOCATION_DEVICE_MEMORY];
    eccCounts->registerFile = v[NVML_MEMORY_LOCATION_REGISTER_FILE];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                     nvmlEccCounterType_t counterType,
                                                     nvmlMemoryLocation_t locationType, unsigned long long *count)
{
    DEV_FLAGS(device, DEV_MIG_OK);
    ARG(count);
    /* A MIG device answers its SRAM counters (NVIDIA's nvidia-smi asks the volatile uncorrected
       one for the MIG devices table's "Vol Unc ECC" and -q's MIG Device blocks). The model keeps
       no per-instance counts: an instance shows its GPU's. Other locations are the GPU's alone. */
    if (mig_dev && locationType != NVML_MEMORY_LOCATION_SRAM)
        return NVML_ERROR_NOT_SUPPORTED;
    nvmlReturn_t r = ecc_check(s, g, errorType, counterType);
    if (r != NVML_SUCCESS)
        return r;
    if ((unsigned)locationType >= MOKKA_ECC_LOCATIONS)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t v;
    SNAP(s, g->ecc[counterType][errorType][locationType], v);
    *count = v;
    return NVML_SUCCESS;
}

static nvmlReturn_t retired(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                            unsigned long long *addresses, unsigned long long *timestamps)
{
    DEV(device);
    ARG(pageCount);
    uint32_t remapper, n;
    SNAP(s, g->has_row_remapper, remapper);
    if (remapper)
        return NVML_ERROR_NOT_SUPPORTED; /* Ampere and later remap rows instead */
    if (cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        SNAP(s, g->retired_sbe, n);
    else if (cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        SNAP(s, g->retired_dbe, n);
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned room = *pageCount;
    *pageCount = n;
    if (room < n)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++) {
        /* Synthetic, stable page addresses: one per retirement, per cause. */
        if (addresses)
            addresses[i] = 0x100000ULL * (cause + 1) + 0x1000ULL * i;
        if (timestamps)
            timestamps[i] = 0;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                               unsigned int *pageCount, unsigned long long *addresses)
{
    return retired(device, cause, pageCount, addresses, NULL);
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                                  unsigned int *pageCount, unsigned long long *addresses,
                                                  unsigned long long *timestamps)
{
    return retired(device, cause, pageCount, addresses, timestamps);
}

nvmlReturn_t DECLDIR nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
    DEV(device);
    ARG(isPending);
    uint32_t remapper, v;
    SNAP(s, g->has_row_remapper, remapper);
    if (remapper)
        return NVML_ERROR_NOT_SUPPORTED;
    SNAP(s, g->retired_pending, v);
    *isPending = ENABLE_STATE(v);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                               unsigned int *isPending, unsigned int *failureOccurred)
{
    DEV(device);
    ARG(corrRows);
    ARG(uncRows);
    ARG(isPending);
    ARG(failureOccurred);
    uint32_t remapper, v[4];
    SNAP(s, g->has_row_remapper, remapper);
    if (!remapper)
        return NVML_ERROR_NOT_SUPPORTED;
    MOKKA_CONSISTENT(s) {
        v[0] = g->remapped_corr;
        v[1] = g->remapped_unc;
        v[2] = g->remap_pending;
        v[3] = g->remap_failure;
    }
    *corrRows = v[0];
    *uncRows = v[1];
    *isPending = v[2];
    *failureOccurred = v[3];
    return NVML_SUCCESS;
}

/* SRAM ECC status (Ampere and later), from the model's counters at NVML's SRAM location: the
   corrected and uncorrected counts, volatile and aggregate; the model does not tell parity from
   SEC-DED errors, so every uncorrected SRAM error is counted SEC-DED (what HBM-era SRAM uses).
   The buckets split the aggregate uncorrected count by unit: L2 is the L2 cache's, SM the SM's
   own memories (L1, register file, texture, shared memory); the model has no PCIe, microcontroller
   or other SRAM counters, so those are 0. The field-diagnostic threshold is never exceeded. A
   healthy board answers zeros, as real ones do. */
nvmlReturn_t DECLDIR nvmlDeviceGetSramEccErrorStatus(nvmlDevice_t device, nvmlEccSramErrorStatus_t *status)
{
    DEV(device);
    VERSIONED_ARG(status, nvmlEccSramErrorStatus_v1);
    uint32_t supported, on;
    uint64_t ecc[2][2][MOKKA_ECC_LOCATIONS];
    MOKKA_CONSISTENT(s) {
        supported = g->nvml_sram_ecc_status;
        on = g->ecc_enabled;
        memcpy(ecc, g->ecc, sizeof(ecc));
    }
    if (!supported || !on)
        return NVML_ERROR_NOT_SUPPORTED;
    enum { VOL = NVML_VOLATILE_ECC, AGG = NVML_AGGREGATE_ECC, COR = NVML_MEMORY_ERROR_TYPE_CORRECTED,
           UNC = NVML_MEMORY_ERROR_TYPE_UNCORRECTED };
    const uint64_t *agg_unc = ecc[AGG][UNC];
    memset((char *)status + sizeof(status->version), 0, sizeof(*status) - sizeof(status->version));
    status->volatileCor = ecc[VOL][COR][NVML_MEMORY_LOCATION_SRAM];
    status->volatileUncSecDed = ecc[VOL][UNC][NVML_MEMORY_LOCATION_SRAM];
    status->aggregateCor = ecc[AGG][COR][NVML_MEMORY_LOCATION_SRAM];
    status->aggregateUncSecDed = agg_unc[NVML_MEMORY_LOCATION_SRAM];
    status->aggregateUncBucketL2 = agg_unc[NVML_MEMORY_LOCATION_L2_CACHE];
    status->aggregateUncBucketSm = agg_unc[NVML_MEMORY_LOCATION_L1_CACHE] +
                                   agg_unc[NVML_MEMORY_LOCATION_REGISTER_FILE] +
                                   agg_unc[NVML_MEMORY_LOCATION_TEXTURE_MEMORY] +
                                   agg_unc[NVML_MEMORY_LOCATION_TEXTURE_SHM];
    return NVML_SUCCESS;
}

/* How many DRAM banks still have their spare rows (the profile's bank count, from each board's
   capture): every remapped row uses a spare row of its own bank, so a bank with one leaves the
   "max" bucket for "high"; the model does not remap enough rows into one bank to empty it. */
nvmlReturn_t DECLDIR nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t device, nvmlRowRemapperHistogramValues_t *values)
{
    DEV(device);
    ARG(values);
    uint32_t remapper, banks, rows;
    MOKKA_CONSISTENT(s) {
        remapper = g->has_row_remapper;
        banks = g->row_remap_banks;
        rows = g->remapped_corr + g->remapped_unc;
    }
    if (!remapper || !banks)
        return NVML_ERROR_NOT_SUPPORTED;
    uint32_t used = rows < banks ? rows : banks;
    memset(values, 0, sizeof(*values));
    values->max = banks - used;
    values->high = used;
    return NVML_SUCCESS;
}

/* Pending channel and TPC repairs (Ada and later, as the captures have them): the model has no
   repair flow, and a healthy board has none pending. */
nvmlReturn_t DECLDIR nvmlDeviceGetRepairStatus(nvmlDevice_t device, nvmlRepairStatus_t *repairStatus)
{
    DEV(device);
    VERSIONED_ARG(repairStatus, nvmlRepairStatus_v1);
    uint32_t supported;
    SNAP(s, g->nvml_repair_status, supported);
    if (!supported)
        return NVML_ERROR_NOT_SUPPORTED;
    repairStatus->bChannelRepairPending = 0;
    repairStatus->bTpcRepairPending = 0;
    return NVML_SUCCESS;
}

/* The remapped rows with those no longer in effect (595's "Inactive" lines): the model never
   deactivates a remapping, so none is inactive. */
nvmlReturn_t DECLDIR nvmlDeviceGetRemappedRows_v2(nvmlDevice_t device, nvmlRemappedRowsInfo_v2_t *info)
{
    ARG(info);
    unsigned corr, unc, pending, failure;
    nvmlReturn_t r = nvmlDeviceGetRemappedRows(device, &corr, &unc, &pending, &failure);
    if (r != NVML_SUCCESS)
        return r;
    info->corrActiveRemaps = corr;
    info->corrInactiveRemaps = 0;
    info->uncActiveRemaps = unc;
    info->uncInactiveRemaps = 0;
    info->bPending = pending;
    info->bFailureOccurred = failure;
    return NVML_SUCCESS;
}

/* Memory the board cannot repair (Hopper and later): the model has none. */
nvmlReturn_t DECLDIR nvmlDeviceGetUnrepairableMemoryFlag_v1(nvmlDevice_t device,
                                                          nvmlUnrepairableMemoryStatus_v1_t *unrepairableMemoryStatus)
{
    DEV(device);
    ARG(unrepairableMemoryStatus);
    uint32_t supported;
    SNAP(s, g->nvml_unrepairable_flag, supported);
    if (!supported)
        return NVML_ERROR_NOT_SUPPORTED;
    unrepairableMemoryStatus->bUnrepairableMemory = 0;
    return NVML_SUCCESS;
}
