/*
 * libnvidia-ml: nvmlDeviceGetFieldValues, each field read from one consistent copy of the
 * GPU's record.
 */
#include "nvml_internal.h"

#include <errno.h>
#include <time.h>

/* ---- field values --------------------------------------------------------------------- */

static nvmlReturn_t field_value(const struct mokka_state *s, const struct mokka_gpu *g, unsigned id,
                                unsigned long long *v)
{
    static const struct { unsigned id; int type, counter, loc; } ecc_fields[] = {
        {NVML_FI_DEV_ECC_SBE_VOL_TOTAL, 0, 0, -1}, {NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 1, 0, -1},
        {NVML_FI_DEV_ECC_SBE_AGG_TOTAL, 0, 1, -1}, {NVML_FI_DEV_ECC_DBE_AGG_TOTAL, 1, 1, -1},
        {NVML_FI_DEV_ECC_SBE_VOL_L1, 0, 0, 0}, {NVML_FI_DEV_ECC_DBE_VOL_L1, 1, 0, 0},
        {NVML_FI_DEV_ECC_SBE_VOL_L2, 0, 0, 1}, {NVML_FI_DEV_ECC_DBE_VOL_L2, 1, 0, 1},
        {NVML_FI_DEV_ECC_SBE_VOL_DEV, 0, 0, 2}, {NVML_FI_DEV_ECC_DBE_VOL_DEV, 1, 0, 2},
        {NVML_FI_DEV_ECC_SBE_VOL_REG, 0, 0, 3}, {NVML_FI_DEV_ECC_DBE_VOL_REG, 1, 0, 3},
        {NVML_FI_DEV_ECC_SBE_VOL_TEX, 0, 0, 4}, {NVML_FI_DEV_ECC_DBE_VOL_TEX, 1, 0, 4},
        {NVML_FI_DEV_ECC_DBE_VOL_CBU, 1, 0, 6},
        {NVML_FI_DEV_ECC_SBE_AGG_L1, 0, 1, 0}, {NVML_FI_DEV_ECC_DBE_AGG_L1, 1, 1, 0},
        {NVML_FI_DEV_ECC_SBE_AGG_L2, 0, 1, 1}, {NVML_FI_DEV_ECC_DBE_AGG_L2, 1, 1, 1},
        {NVML_FI_DEV_ECC_SBE_AGG_DEV, 0, 1, 2}, {NVML_FI_DEV_ECC_DBE_AGG_DEV, 1, 1, 2},
        {NVML_FI_DEV_ECC_SBE_AGG_REG, 0, 1, 3}, {NVML_FI_DEV_ECC_DBE_AGG_REG, 1, 1, 3},
        {NVML_FI_DEV_ECC_SBE_AGG_TEX, 0, 1, 4}, {NVML_FI_DEV_ECC_DBE_AGG_TEX, 1, 1, 4},
        {NVML_FI_DEV_ECC_DBE_AGG_CBU, 1, 1, 6},
    };
    struct mokka_gpu c;
    mokka_read_gpu(s, (unsigned)(g - s->gpus), &c);
    for (size_t i = 0; i < sizeof(ecc_fields) / sizeof(ecc_fields[0]); i++) {
        if (ecc_fields[i].id != id)
            continue;
        if (!c.ecc_enabled)
            return NVML_ERROR_NOT_SUPPORTED;
        const uint64_t *row = c.ecc[ecc_fields[i].counter][ecc_fields[i].type];
        unsigned long long sum = 0;
        if (ecc_fields[i].loc >= 0)
            sum = row[ecc_fields[i].loc];
        else
            for (int l = 0; l < MOKKA_ECC_LOCATIONS; l++)
                sum += row[l];
        *v = sum;
        return NVML_SUCCESS;
    }
    unsigned long long nvl_total = 0;
    switch (id) {
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING: *v = c.ecc_enabled; return NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_SBE: *v = c.retired_sbe; return c.has_row_remapper ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_DBE: *v = c.retired_dbe; return c.has_row_remapper ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_PENDING: *v = c.retired_pending; return c.has_row_remapper ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    case NVML_FI_DEV_REMAPPED_COR: *v = c.remapped_corr; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_REMAPPED_UNC: *v = c.remapped_unc; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_REMAPPED_PENDING: *v = c.remap_pending; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_REMAPPED_FAILURE: *v = c.remap_failure; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_MEMORY_TEMP:
        if (c.temp_mem < 0)
            return NVML_ERROR_NOT_SUPPORTED;
        *v = (unsigned long long)c.temp_mem;
        return NVML_SUCCESS;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY: *v = c.energy_mj; return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_INSTANT: *v = c.power_usage; return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: *v = c.pcie_replay; return NVML_SUCCESS;
    case NVML_FI_DEV_NVLINK_LINK_COUNT: *v = c.nvlink_count; return c.nvlink_count ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
    case NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: {
        int k = id == NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL     ? 0
                : id == NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL ? 1
                : id == NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL ? 2
                                                                      : 3;
        if (!c.nvlink_count)
            return NVML_ERROR_NOT_SUPPORTED;
        for (unsigned l = 0; l < c.nvlink_count && l < MOKKA_MAX_NVLINKS; l++)
            nvl_total += c.nvlink[l].errors[k];
        *v = nvl_total;
        return NVML_SUCCESS;
    }
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    DEV(device);
    if (valuesCount < 0 || (valuesCount > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts;
    int saved = errno;
    clock_gettime(CLOCK_REALTIME, &ts);
    errno = saved;
    for (int i = 0; i < valuesCount; i++) {
        unsigned long long v = 0;
        values[i].nvmlReturn = field_value(s, g, values[i].fieldId, &v);
        values[i].timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        values[i].latencyUsec = 0;
        values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        values[i].value.ullVal = v;
    }
    return NVML_SUCCESS;
}
