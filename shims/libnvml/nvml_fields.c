/*
 * libnvidia-ml: nvmlDeviceGetFieldValues, each field read from one consistent copy of the
 * GPU's record.
 */
#include "nvml_internal.h"

#include <errno.h>
#include <time.h>

/* ---- field values --------------------------------------------------------------------- */

/* Per-link rate in MBps, per direction, of an NVLink generation: what the driver reports for a
   link and `nvlink -s` prints in GB/s (the profiles' link_speed_gbps; the same table as our own
   nvidia-smi's). */
static unsigned nvlink_mbps(unsigned version)
{
    switch (version) {
    case 1: return 20000;
    case 2: return 25781;
    case 3: return 25000;
    case 4: return 26562;
    default: return 53125;
    }
}

/* NVML_FI_DEV_NVLINK_GET_VERSION's enum (nvmlNvlinkVersion_t) for an NVLink generation. */
static unsigned nvlink_version_enum(unsigned version)
{
    static const unsigned e[] = {NVML_NVLINK_VERSION_INVALID, NVML_NVLINK_VERSION_1_0, NVML_NVLINK_VERSION_2_0,
                                 NVML_NVLINK_VERSION_3_0, NVML_NVLINK_VERSION_4_0, NVML_NVLINK_VERSION_5_0};
    return version < sizeof(e) / sizeof(e[0]) ? e[version] : NVML_NVLINK_VERSION_INVALID;
}

/* The link a per-link speed field names (L0-L5 are 84-89, L6-L11 132-137), or -1. */
static int speed_field_link(unsigned id)
{
    if (id >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L0 && id <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L5)
        return (int)(id - NVML_FI_DEV_NVLINK_SPEED_MBPS_L0);
    if (id >= NVML_FI_DEV_NVLINK_SPEED_MBPS_L6 && id <= NVML_FI_DEV_NVLINK_SPEED_MBPS_L11)
        return (int)(id - NVML_FI_DEV_NVLINK_SPEED_MBPS_L6) + 6;
    return -1;
}

/* The NVLink fields of one link (scope = link for the GET_* fields): NOT_SUPPORTED past the
   GPU's links. An inactive link has no speed (0), as the driver reports it. */
static nvmlReturn_t nvlink_field(const struct mokka_gpu *c, unsigned id, unsigned link, unsigned long long *v)
{
    if (link >= c->nvlink_count || link >= MOKKA_MAX_NVLINKS)
        return NVML_ERROR_NOT_SUPPORTED;
    const struct mokka_nvlink *k = &c->nvlink[link];
    switch (id) {
    case NVML_FI_DEV_NVLINK_GET_STATE: *v = k->state ? NVML_NVLINK_STATE_ACTIVE : NVML_NVLINK_STATE_INACTIVE; break;
    case NVML_FI_DEV_NVLINK_GET_VERSION: *v = nvlink_version_enum(k->version); break;
    default: *v = k->state ? nvlink_mbps(k->version) : 0; break; /* the speed fields */
    }
    return NVML_SUCCESS;
}

/* The power fields (185-192) of one scope. The model has the GPU's power and limits only: the
   GPU scope answers them, the module and memory scopes are NOT_SUPPORTED (an H100's module
   readings are N/A in the captures; its memory average is a value the model does not have).
   The 1 s average is the model's power, which is a smooth function of time; which boards answer
   it is the model's rule (compute.py nvml_support: NVML documents the average for Ampere, except
   GA100, and later, and the A100 and T4 captures show it N/A). */
static nvmlReturn_t power_field(const struct mokka_gpu *c, unsigned id, unsigned scope, unsigned long long *v)
{
    if (scope != NVML_POWER_SCOPE_GPU)
        return NVML_ERROR_NOT_SUPPORTED;
    switch (id) {
    case NVML_FI_DEV_POWER_AVERAGE:
        if (!c->nvml_power_average)
            return NVML_ERROR_NOT_SUPPORTED;
        *v = c->power_usage;
        break;
    case NVML_FI_DEV_POWER_INSTANT: *v = c->power_usage; break;
    case NVML_FI_DEV_POWER_MIN_LIMIT: *v = c->power_min_limit; break;
    case NVML_FI_DEV_POWER_MAX_LIMIT: *v = c->power_max_limit; break;
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT: *v = c->power_default_limit; break;
    case NVML_FI_DEV_POWER_CURRENT_LIMIT: *v = c->power_enforced_limit; break;
    default: *v = c->power_limit; break; /* NVML_FI_DEV_POWER_REQUESTED_LIMIT */
    }
    return NVML_SUCCESS;
}

/* The per-link NVLink error counter fields: L0-L5 and L6-L11 of each counter, by
   nvmlNvLinkErrorCounter_t (replay, recovery, CRC flit, CRC data, as the state's errors[]). */
static const struct { unsigned first_l0, first_l6, counter; } g_link_error_fields[] = {
    {NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_REPLAY},
    {NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_RECOVERY},
    {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_CRC_FLIT},
    {NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0, NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L6, NVML_NVLINK_ERROR_DL_CRC_DATA},
};

/* One link's error counter, as nvmlDeviceGetNvLinkErrorCounter answers it: NOT_SUPPORTED past
   the GPU's links. */
static nvmlReturn_t link_error(const struct mokka_gpu *c, unsigned link, unsigned counter, unsigned long long *v)
{
    if (link >= c->nvlink_count || link >= MOKKA_MAX_NVLINKS)
        return NVML_ERROR_NOT_SUPPORTED;
    *v = c->nvlink[link].errors[counter];
    return NVML_SUCCESS;
}

/* The thresholds relative to T.Limit (193-196, signed degrees; Ada and later, the boards whose
   profile has a T.Limit): T.Limit minus the absolute threshold, as the captures print them
   (H100: -8, -2, 0, 0). The memory's maximum is its own reference: every capture that reports
   it reads 0. */
static nvmlReturn_t tlimit_field(const struct mokka_gpu *c, unsigned id, int *v)
{
    if (c->temp_tlimit < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    int t;
    switch (id) {
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: t = c->temp_threshold[NVML_TEMPERATURE_THRESHOLD_SHUTDOWN]; break;
    case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: t = c->temp_threshold[NVML_TEMPERATURE_THRESHOLD_SLOWDOWN]; break;
    case NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: t = c->temp_threshold[NVML_TEMPERATURE_THRESHOLD_GPU_MAX]; break;
    default: /* NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT */
        if (c->temp_threshold[NVML_TEMPERATURE_THRESHOLD_MEM_MAX] < 0)
            return NVML_ERROR_NOT_SUPPORTED;
        *v = 0;
        return NVML_SUCCESS;
    }
    if (t < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *v = c->temp_tlimit - t;
    return NVML_SUCCESS;
}

static nvmlReturn_t counter_field(const struct mokka_gpu *cp, unsigned id, unsigned scope, unsigned long long *v);

/* One field of GPU g into *out (its value and valueType); the answer is the field's nvmlReturn. */
static nvmlReturn_t field_value(const struct mokka_state *s, const struct mokka_gpu *g, unsigned id,
                                unsigned scope, nvmlFieldValue_t *out)
{
    struct mokka_gpu c;
    mokka_read_gpu(s, (unsigned)(g - s->gpus), &c);
    nvmlReturn_t r;
    switch (id) {
    case NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT:
    case NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT:
        out->valueType = NVML_VALUE_TYPE_SIGNED_INT;
        return tlimit_field(&c, id, &out->value.siVal);
    case NVML_FI_DEV_GPU_TEMP: /* degrees as a double; the state keeps whole degrees */
        out->valueType = NVML_VALUE_TYPE_DOUBLE;
        out->value.dVal = c.temp_gpu;
        return NVML_SUCCESS;
    default:
        out->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        out->value.ullVal = 0;
        r = counter_field(&c, id, scope, &out->value.ullVal);
        return r;
    }
}

/* The unsigned fields, from one copy of the GPU's record. */
static nvmlReturn_t counter_field(const struct mokka_gpu *cp, unsigned id, unsigned scope, unsigned long long *v)
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
    const struct mokka_gpu c = *cp;
    for (size_t i = 0; i < sizeof(g_link_error_fields) / sizeof(g_link_error_fields[0]); i++) {
        unsigned l0 = g_link_error_fields[i].first_l0, l6 = g_link_error_fields[i].first_l6;
        if (id >= l0 && id < l0 + 6)
            return link_error(&c, id - l0, g_link_error_fields[i].counter, v);
        if (id >= l6 && id < l6 + 6)
            return link_error(&c, id - l6 + 6, g_link_error_fields[i].counter, v);
    }
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
    int speed_link = speed_field_link(id);
    if (speed_link >= 0)
        return nvlink_field(&c, id, (unsigned)speed_link, v);
    unsigned long long nvl_total = 0;
    switch (id) {
    case NVML_FI_DEV_NVLINK_GET_SPEED:
    case NVML_FI_DEV_NVLINK_GET_STATE:
    case NVML_FI_DEV_NVLINK_GET_VERSION: return nvlink_field(&c, id, scope, v);
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: {
        /* the speed every active link shares; none active: nothing to report */
        for (unsigned l = 0; l < c.nvlink_count && l < MOKKA_MAX_NVLINKS; l++)
            if (c.nvlink[l].state)
                return nvlink_field(&c, id, l, v);
        return NVML_ERROR_NOT_SUPPORTED;
    }
    case NVML_FI_DEV_ECC_CURRENT: *v = c.ecc_enabled; return NVML_SUCCESS;
    case NVML_FI_DEV_ECC_PENDING: *v = c.ecc_pending; return NVML_SUCCESS; /* nvmlDeviceGetEccMode's pending */
    /* the DL counters of the link in scopeId (CRC: the flit CRC, as nvidia-smi nvlink -e's) */
    case NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: return link_error(&c, scope, NVML_NVLINK_ERROR_DL_REPLAY, v);
    case NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: return link_error(&c, scope, NVML_NVLINK_ERROR_DL_RECOVERY, v);
    case NVML_FI_DEV_NVLINK_ERROR_DL_CRC: return link_error(&c, scope, NVML_NVLINK_ERROR_DL_CRC_FLIT, v);
    case NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT: {
        if (!c.nvlink_count)
            return NVML_ERROR_NOT_SUPPORTED;
        unsigned n = 0;
        for (unsigned l = 0; l < c.nvlink_count && l < MOKKA_MAX_NVLINKS; l++)
            n += c.nvlink[l].state && c.nvlink[l].remote_type == NVML_NVLINK_DEVICE_TYPE_SWITCH;
        *v = n;
        return NVML_SUCCESS;
    }
    /* what the driver recommends after a fault: the model's recovery action (docs/faults.md) */
    case NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: *v = c.recovery_action; return NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_SBE: *v = c.retired_sbe; return c.has_row_remapper ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_DBE: *v = c.retired_dbe; return c.has_row_remapper ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    case NVML_FI_DEV_RETIRED_PENDING: *v = c.retired_pending; return c.has_row_remapper ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
    case NVML_FI_DEV_REMAPPED_COR: *v = c.remapped_corr; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_REMAPPED_UNC: *v = c.remapped_unc; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_REMAPPED_PENDING: *v = c.remap_pending; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    /* remappings no longer in effect: the model never deactivates one */
    case NVML_FI_DEV_REMAPPED_ROWS_COR_INACTIVE:
    case NVML_FI_DEV_REMAPPED_ROWS_UNC_INACTIVE: *v = 0; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_REMAPPED_FAILURE: *v = c.remap_failure; return c.has_row_remapper ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    case NVML_FI_DEV_MEMORY_TEMP:
        if (c.temp_mem < 0)
            return NVML_ERROR_NOT_SUPPORTED;
        *v = (unsigned long long)c.temp_mem;
        return NVML_SUCCESS;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY: *v = c.energy_mj; return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_AVERAGE:
    case NVML_FI_DEV_POWER_INSTANT:
    case NVML_FI_DEV_POWER_MIN_LIMIT:
    case NVML_FI_DEV_POWER_MAX_LIMIT:
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT:
    case NVML_FI_DEV_POWER_CURRENT_LIMIT:
    case NVML_FI_DEV_POWER_REQUESTED_LIMIT: return power_field(&c, id, scope, v);
    /* the time each clocks event reason held the clocks (ns; every captured board, T4
       included): the model's counters (model/dynamics.py EVENT_COUNTERS) */
    case NVML_FI_DEV_PERF_POLICY_POWER:
    case NVML_FI_DEV_PERF_POLICY_SYNC_BOOST:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN:
    case NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: {
        unsigned k = id == NVML_FI_DEV_PERF_POLICY_POWER ? 0 : id == NVML_FI_DEV_PERF_POLICY_SYNC_BOOST ? 1
                     : 2 + (id - NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN);
        *v = c.event_ns[k];
        return NVML_SUCCESS;
    }
    /* the EDPp multiplier, percent (Hopper and later): no EDPp override is set, 100 % as the
       590 capture shows */
    case NVML_FI_DEV_EDPP_MULTIPLIER:
        if (!c.nvml_edpp_multiplier)
            return NVML_ERROR_NOT_SUPPORTED;
        *v = 100;
        return NVML_SUCCESS;
    /* the replay counter never wraps in a simulated node's life */
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER: *v = 0; return NVML_SUCCESS;
    /* nvidia-smi -q's "GPU Reset Status": a reset required after an Xid that needs one (the
       model's needs_reset); the driver never recommends draining for a simulated fault */
    case NVML_FI_DEV_RESET_STATUS: *v = c.needs_reset ? 1 : 0; return NVML_SUCCESS;
    case NVML_FI_DEV_DRAIN_AND_RESET_STATUS: *v = 0; return NVML_SUCCESS;
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
        values[i].nvmlReturn = field_value(s, g, values[i].fieldId, values[i].scopeId, &values[i]);
        values[i].timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        values[i].latencyUsec = 0;
    }
    return NVML_SUCCESS;
}
