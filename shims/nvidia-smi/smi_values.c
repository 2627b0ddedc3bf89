/* nvidia-smi: one value of a GPU, as every mode prints it. Which getter answers which fact is
   fields.yaml's (value() is generated from it into smi_values_gen.c); here are the getters that
   are more than one NVML call of a shape (smi_values.h), the tool's words for enumerations, and a
   value with its unit as -q and -q -x print it. */
#include "smi_values.h"

#include <stdarg.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

enum vr from(nvmlReturn_t r)
{
    return r == NVML_SUCCESS ? V_OK : r == NVML_ERROR_DEPRECATED ? V_DEPRECATED : V_NA;
}

enum vr put(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return V_OK;
}
#define PUT(...) put(out, n, __VA_ARGS__)

/* ---- the tool's words ----------------------------------------------------------------- */

const char *enabled_word(unsigned long long v) { return v ? "Enabled" : "Disabled"; }
const char *yes_no_word(unsigned long long v) { return v ? "Yes" : "No"; }
const char *supported_word(unsigned long long v) { return v ? "Supported" : "N/A"; }

const char *arch_name(unsigned long long a)
{
    switch (a) {
    case NVML_DEVICE_ARCH_KEPLER: return "Kepler";
    case NVML_DEVICE_ARCH_MAXWELL: return "Maxwell";
    case NVML_DEVICE_ARCH_PASCAL: return "Pascal";
    case NVML_DEVICE_ARCH_VOLTA: return "Volta";
    case NVML_DEVICE_ARCH_TURING: return "Turing";
    case NVML_DEVICE_ARCH_AMPERE: return "Ampere";
    case NVML_DEVICE_ARCH_ADA: return "Ada Lovelace";
    case NVML_DEVICE_ARCH_HOPPER: return "Hopper";
    case 10: return "Blackwell";
    default: return "N/A";
    }
}

const char *brand_name(unsigned long long b)
{
    switch (b) {
    case NVML_BRAND_QUADRO: return "Quadro";
    case NVML_BRAND_TESLA: return "Tesla";
    case NVML_BRAND_NVS: return "NVS";
    case NVML_BRAND_GRID: return "Grid";
    case NVML_BRAND_GEFORCE: return "GeForce";
    case NVML_BRAND_TITAN: return "Titan";
    case NVML_BRAND_NVIDIA_RTX: return "NVIDIA RTX";
    case NVML_BRAND_NVIDIA: return "NVIDIA";
    default: return "Unknown";
    }
}

const char *compute_mode_name(unsigned long long m)
{
    switch (m) {
    case NVML_COMPUTEMODE_DEFAULT: return "Default";
    case NVML_COMPUTEMODE_EXCLUSIVE_THREAD: return "Exclusive_Thread";
    case NVML_COMPUTEMODE_PROHIBITED: return "Prohibited";
    case NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: return "Exclusive_Process";
    default: return "Unknown";
    }
}

const char *virtualization_word(unsigned long long m)
{
    static const char *const MODES[] = {"None", "Pass-Through", "VGPU", "Host VGPU", "Host VSGA"};
    return m < sizeof(MODES) / sizeof(MODES[0]) ? MODES[m] : NULL;
}

const char *recovery_action_word(unsigned long long a)
{
    static const char *const ACTIONS[] = {"None", "Reset", "Reboot", "Drain P2P", "Drain and Reset"};
    return a < sizeof(ACTIONS) / sizeof(ACTIONS[0]) ? ACTIONS[a] : NULL;
}

/* ---- what MEMBER reads: the outputs of one NVML getter ----------------------------------------------------------- */

/* fill_f: the struct NVML getter f fills; `init` sets its version where NVML wants one. */
#define FILL(type, f, init)                                                                       \
    type fill_##f(const struct dev *d, nvmlReturn_t *r)                                           \
    {                                                                                             \
        type s;                                                                                   \
        memset(&s, 0, sizeof(s));                                                                 \
        init;                                                                                     \
        *r = NV(f, d->h, &s);                                                                     \
        return s;                                                                                 \
    }

FILL(nvmlPciInfo_t, nvmlDeviceGetPciInfo_v3, (void)0)
FILL(nvmlMemory_v2_t, nvmlDeviceGetMemoryInfo_v2, s.version = nvmlMemory_v2)
FILL(nvmlBAR1Memory_t, nvmlDeviceGetBAR1MemoryInfo, (void)0)
FILL(nvmlUtilization_t, nvmlDeviceGetUtilizationRates, (void)0)
FILL(nvmlMarginTemperature_t, nvmlDeviceGetMarginTemperature, s.version = nvmlMarginTemperature_v1)
FILL(nvmlPdi_t, nvmlDeviceGetPdi, s.version = nvmlPdi_v1)
FILL(nvmlC2cModeInfo_v1_t, nvmlDeviceGetC2cModeInfoV, (void)0)
FILL(nvmlMemory_t, nvmlDeviceGetConfComputeProtectedMemoryUsage, (void)0)
FILL(nvmlFBCStats_t, nvmlDeviceGetFBCStats, (void)0)
FILL(nvmlEccSramErrorStatus_t, nvmlDeviceGetSramEccErrorStatus, s.version = nvmlEccSramErrorStatus_v1)
FILL(nvmlRepairStatus_t, nvmlDeviceGetRepairStatus, s.version = nvmlRepairStatus_v1)
FILL(nvmlRowRemapperHistogramValues_t, nvmlDeviceGetRowRemapperHistogram, (void)0)
FILL(nvmlDeviceCapabilities_t, nvmlDeviceGetCapabilities, s.version = nvmlDeviceCapabilities_v1)
FILL(nvmlRemappedRowsInfo_v2_t, nvmlDeviceGetRemappedRows_v2, (void)0)
FILL(nvmlUnrepairableMemoryStatus_v1_t, nvmlDeviceGetUnrepairableMemoryFlag_v1, (void)0)

/* The PCI class codes; the tool asks for them after the PCI info, so a GPU without PCI info has none. */
nvmlPciInfoExt_t fill_nvmlDeviceGetPciInfoExt(const struct dev *d, nvmlReturn_t *r)
{
    nvmlPciInfoExt_t ext = {.version = nvmlPciInfoExt_v1};
    fill_nvmlDeviceGetPciInfo_v3(d, r);
    if (*r == NVML_SUCCESS)
        *r = NV(nvmlDeviceGetPciInfoExt, d->h, &ext);
    return ext;
}

struct ecc_mode fill_nvmlDeviceGetEccMode(const struct dev *d, nvmlReturn_t *r)
{
    struct ecc_mode m = {NVML_FEATURE_DISABLED, NVML_FEATURE_DISABLED};
    *r = NV(nvmlDeviceGetEccMode, d->h, &m.current, &m.pending);
    return m;
}

struct remapped_rows fill_nvmlDeviceGetRemappedRows(const struct dev *d, nvmlReturn_t *r)
{
    struct remapped_rows m = {0, 0, 0, 0};
    *r = NV(nvmlDeviceGetRemappedRows, d->h, &m.correctable, &m.uncorrectable, &m.pending, &m.failure);
    return m;
}

struct encoder_stats fill_nvmlDeviceGetEncoderStats(const struct dev *d, nvmlReturn_t *r)
{
    struct encoder_stats s = {0, 0, 0};
    *r = NV(nvmlDeviceGetEncoderStats, d->h, &s.sessions, &s.fps, &s.latency);
    return s;
}

/* One unsigned field value (nvmlDeviceGetFieldValues), or its error. */
nvmlReturn_t field_u64(const struct dev *d, unsigned id, unsigned long long *v)
{
    nvmlFieldValue_t fv;
    memset(&fv, 0, sizeof(fv));
    fv.fieldId = id;
    nvmlReturn_t r = NV(nvmlDeviceGetFieldValues, d->h, 1, &fv);
    if (r == NVML_SUCCESS)
        r = fv.nvmlReturn;
    if (r == NVML_SUCCESS)
        *v = fv.valueType == NVML_VALUE_TYPE_UNSIGNED_INT ? fv.value.uiVal : fv.value.ullVal;
    return r;
}

/* ---- getters of more than one call or output ------------------------------------------ */

void timestamp(char *out, size_t n, int csv)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    if (csv) {
        char b[32];
        strftime(b, sizeof(b), "%Y/%m/%d %H:%M:%S", &tm);
        snprintf(out, n, "%s.%03ld", b, (long)(tv.tv_usec / 1000));
    } else {
        strftime(out, n, "%a %b %e %H:%M:%S %Y", &tm);
    }
}

enum vr csv_timestamp(const struct dev *d, char *out, size_t n)
{
    (void)d;
    timestamp(out, n, 1);
    return V_OK;
}

/* MIG mode as the model published it (N/A on a board without MIG). */
enum vr mig_mode(const struct dev *d, char *out, size_t n, int pending)
{
    struct mokka_mig_snapshot mv;
    if (mig_read(d->index, &mv) != 0 || !mv.capable)
        return V_NA;
    return PUT("%s", (pending ? mv.pending : mv.mode) ? "Enabled" : "Disabled");
}

enum vr addressing_mode(const struct dev *d, char *out, size_t n)
{
    static const char *const MODES[] = {"None", "HMM", "ATS"};
    nvmlDeviceAddressingMode_t am = {.version = nvmlDeviceAddressingMode_v1};
    nvmlReturn_t r = NV(nvmlDeviceGetAddressingMode, d->h, &am);
    if (r != NVML_SUCCESS)
        return from(r);
    return am.value < 3 ? PUT("%s", MODES[am.value]) : V_NA;
}

/* nvmlDeviceValidateInforom: "valid" when it succeeds (the 590 and 595 captures). */
enum vr inforom_valid(const struct dev *d, char *out, size_t n)
{
    nvmlReturn_t r = NV(nvmlDeviceValidateInforom, d->h);
    return r == NVML_SUCCESS ? PUT("valid") : from(r);
}

/* -q's Voltage/Graphics: the board's graphics voltage as the daemon publishes it (NVML has no
   getter; the real tool asks the driver's private table), in millivolts with three decimals. */
enum vr voltage(const struct dev *d, char *out, size_t n)
{
    unsigned node;
    const struct mokka_state *s = state_of(d->index, &node);
    uint32_t uv = 0;
    if (!s)
        return V_NA;
    MOKKA_SNAP(s, s->gpus[node].voltage_uv, uv);
    return uv ? PUT("%u.%03u", uv / 1000, uv % 1000) : V_NA;
}

/* nvmlDeviceGetGspFirmwareMode: whether the GSP firmware runs (current) and runs by default. */
enum vr gsp_mode(const struct dev *d, char *out, size_t n, int by_default)
{
    unsigned enabled = 0, dflt = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetGspFirmwareMode, d->h, &enabled, &dflt);
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%s", (by_default ? dflt : enabled) ? "Enabled" : "Disabled");
}

enum vr compute_cap(const struct dev *d, char *out, size_t n)
{
    int ma = 0, mi = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetCudaComputeCapability, d->h, &ma, &mi);
    return r == NVML_SUCCESS ? PUT("%d.%d", ma, mi) : from(r);
}

enum vr pstate(const struct dev *d, char *out, size_t n)
{
    nvmlPstates_t p = NVML_PSTATE_UNKNOWN;
    nvmlReturn_t r = NV(nvmlDeviceGetPerformanceState, d->h, &p);
    if (r != NVML_SUCCESS)
        return from(r);
    return p == NVML_PSTATE_UNKNOWN ? V_NA : PUT("P%u", (unsigned)p);
}

/* One clocks event reason: Active while its bit is in the current reasons. */
enum vr reason(const struct dev *d, char *out, size_t n, unsigned long long bit)
{
    unsigned long long m = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetCurrentClocksEventReasons, d->h, &m);
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%s", (m & bit) ? "Active" : "Not Active");
}

/* The count of pages retired for `cause` (a call without a buffer answers INSUFFICIENT_SIZE with
   the count). */
enum vr retired(const struct dev *d, char *out, size_t n, nvmlPageRetirementCause_t cause)
{
    unsigned count = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetRetiredPages, d->h, cause, &count, NULL);
    if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE)
        return from(r);
    return PUT("%u", count);
}

/* A threshold relative to T.Limit (fields 193-196, signed degrees), as boards from Ada on report
   them (H100: -8, -2, 0, 0 C); NOT_SUPPORTED where the board has no T.Limit. */
enum vr temp_tlimit(const struct dev *d, char *out, size_t n, unsigned field)
{
    nvmlFieldValue_t fv;
    memset(&fv, 0, sizeof(fv));
    fv.fieldId = field;
    nvmlReturn_t r = NV(nvmlDeviceGetFieldValues, d->h, 1, &fv);
    if (r == NVML_SUCCESS)
        r = fv.nvmlReturn;
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%d C", fv.valueType == NVML_VALUE_TYPE_SIGNED_INT ? fv.value.siVal : (int)fv.value.uiVal);
}

enum vr power_limit_range(const struct dev *d, char *out, size_t n, int max)
{
    unsigned lo = 0, hi = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetPowerManagementLimitConstraints, d->h, &lo, &hi);
    if (r != NVML_SUCCESS)
        return from(r);
    unsigned mw = max ? hi : lo;
    return PUT("%u.%02u", mw / 1000, (mw % 1000) / 10);
}

enum vr fabric(const struct dev *d, char *out, size_t n, enum fabric_part part)
{
    static const char *const STATES[] = {"Not Supported", "Not Started", "In Progress", "Completed"};
    nvmlGpuFabricInfo_t f;
    memset(&f, 0, sizeof(f));
    nvmlReturn_t r = NV(nvmlDeviceGetGpuFabricInfo, d->h, &f);
    if (r != NVML_SUCCESS)
        return from(r);
    const unsigned char *c = f.clusterUuid;
    switch (part) {
    case FABRIC_STATE: return PUT("%s", f.state < 4 ? STATES[f.state] : "N/A");
    case FABRIC_STATUS: return PUT("%s", f.status == NVML_SUCCESS ? "Success" : nvml_error(f.status));
    case FABRIC_CLIQUE_ID: return PUT("%u", f.cliqueId);
    default:
        return PUT("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", c[0], c[1], c[2], c[3],
                   c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15]);
    }
}

/* The fabric's health, from the health mask of nvmlGpuFabricInfo_v3 (N/A without one). */
enum vr fabric_health(const struct dev *d, char *out, size_t n, enum fabric_health_part part)
{
    nvmlGpuFabricInfoV_t f;
    memset(&f, 0, sizeof(f));
    f.version = nvmlGpuFabricInfo_v3;
    if (NV(nvmlDeviceGetGpuFabricInfoV, d->h, &f) != NVML_SUCCESS)
        return V_NA;
    if (part == HEALTH_SUMMARY) {
        static const char *const SUMMARY[] = {NULL, "Healthy", "Unhealthy", "Limited Capacity"};
        return f.healthSummary >= 1 && f.healthSummary <= 3 ? PUT("%s", SUMMARY[f.healthSummary]) : V_NA;
    }
    if (part == HEALTH_INCORRECT_CONFIGURATION) /* only "correct" is modelled */
        return NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _INCORRECT_CONFIGURATION) ==
                       NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE ? PUT("None") : V_NA;
    unsigned v = part == HEALTH_BANDWIDTH ? NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _DEGRADED_BW)
               : part == HEALTH_ROUTE_RECOVERY ? NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _ROUTE_RECOVERY)
               : part == HEALTH_ROUTE_UNHEALTHY ? NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _ROUTE_UNHEALTHY)
               : NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _ACCESS_TIMEOUT_RECOVERY);
    if (v != 1 && v != 2) /* 0: not supported */
        return V_NA;
    if (part == HEALTH_BANDWIDTH)
        return PUT("%s", v == 1 ? "Degraded" : "Full");
    return PUT("%s", v == 1 ? "True" : "False");
}

/* ---- a value with its unit (-q, -q -x) -------------------------------------------------- */

/* The unit of each fact: fields.yaml's, else the one the branch's --query-gpu header prints. */
static const char *g_unit[K_COUNT];

void init_units(void)
{
    for (int k = 0; k < K_COUNT; k++)
        g_unit[k] = FACTS[k].unit;
    for (const struct qfield *f = g_fields; f->name; f++)
        if (f->key >= 0 && f->key < K_COUNT && (!g_unit[f->key] || !*g_unit[f->key]))
            g_unit[f->key] = f->unit;
}

void value_text(const struct dev *d, int key, const char *suffix, char *out, size_t n)
{
    char v[256];
    enum vr r = key < 0 ? V_NA : value(d, key, v, sizeof(v));
    if (r == V_DEPRECATED) {
        snprintf(out, n, "Requested functionality has been deprecated");
    } else if (r != V_OK) {
        snprintf(out, n, "N/A");
    } else {
        const char *unit = key < K_COUNT && g_unit[key] && *g_unit[key] ? g_unit[key] : NULL;
        const char *gap = unit && !FACTS[key].unit_joined ? " " : "";
        snprintf(out, n, "%s%s%s%s", v, gap, unit ? unit : "", suffix ? suffix : "");
    }
}
