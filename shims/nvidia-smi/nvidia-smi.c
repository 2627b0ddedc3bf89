/*
 * nvidia-smi for a simulated node: the real tool's modes and output formats, answered by
 * calling libnvidia-ml.so.1 through dlopen/dlsym the way the real tool does, so it runs in
 * containers without Python and exercises our NVML. Links nothing but libc.
 *
 * Layouts come from real captures (tests/fixtures/captures): help texts, the --query-gpu
 * field table and the -q / -q -x element skeletons are generated into smi_gen.h by
 * gen_smi.py; this file fills them with values. A getter that NVML does not support prints
 * what the real tool prints for an unsupported field ([N/A] in CSV, N/A in -q and XML).
 *
 * Host safety: no abort(), no unbounded loops; every buffer write is bounded.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"
#include "mokka_client.h"
#include "mokka_control.h"
#include "smi_gen.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* Cells are fixed-width: a value longer than its cell is cut, as intended. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* ---- NVML, resolved at run time ------------------------------------------------------- */

#define NVML_FUNCS(X)                                                                         \
    X(nvmlInit_v2) X(nvmlShutdown) X(nvmlErrorString) X(nvmlSystemGetDriverVersion)          \
    X(nvmlSystemGetNVMLVersion) X(nvmlSystemGetCudaDriverVersion_v2) X(nvmlDeviceGetCount_v2) \
    X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetName) X(nvmlDeviceGetUUID)               \
    X(nvmlDeviceGetSerial) X(nvmlDeviceGetBoardPartNumber) X(nvmlDeviceGetVbiosVersion)      \
    X(nvmlDeviceGetInforomImageVersion) X(nvmlDeviceGetInforomVersion)                       \
    X(nvmlDeviceGetMultiGpuBoard) X(nvmlDeviceGetBoardId) X(nvmlDeviceGetMinorNumber)        \
    X(nvmlDeviceGetBrand) X(nvmlDeviceGetArchitecture) X(nvmlDeviceGetCudaComputeCapability) \
    X(nvmlDeviceGetPciInfo_v3) X(nvmlDeviceGetMaxPcieLinkGeneration)                         \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkGeneration)          \
    X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetCurrPcieLinkWidth)                       \
    X(nvmlDeviceGetPcieReplayCounter) X(nvmlDeviceGetPcieThroughput) X(nvmlDeviceGetFanSpeed) \
    X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetCurrentClocksEventReasons)               \
    X(nvmlDeviceGetSupportedClocksEventReasons) X(nvmlDeviceGetMemoryInfo_v2)                \
    X(nvmlDeviceGetBAR1MemoryInfo) X(nvmlDeviceGetComputeMode) X(nvmlDeviceGetUtilizationRates) \
    X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization) X(nvmlDeviceGetEccMode) \
    X(nvmlDeviceGetMemoryErrorCounter) X(nvmlDeviceGetTotalEccErrors)                        \
    X(nvmlDeviceGetRetiredPages) X(nvmlDeviceGetRetiredPagesPendingStatus)                   \
    X(nvmlDeviceGetRemappedRows) X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureThreshold) \
    X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetPowerManagementLimit)                          \
    X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetPowerManagementDefaultLimit)           \
    X(nvmlDeviceGetPowerManagementLimitConstraints) X(nvmlDeviceGetClockInfo)                \
    X(nvmlDeviceGetMaxClockInfo) X(nvmlDeviceGetApplicationsClock)                           \
    X(nvmlDeviceGetDefaultApplicationsClock) X(nvmlDeviceGetMaxCustomerBoostClock)           \
    X(nvmlDeviceGetMigMode) X(nvmlDeviceGetPersistenceMode) X(nvmlDeviceGetDisplayMode)      \
    X(nvmlDeviceGetDisplayActive) X(nvmlDeviceGetGpuFabricInfo)                              \
    X(nvmlDeviceGetGpuFabricInfoV)                                                           \
    X(nvmlDeviceGetComputeRunningProcesses_v3) X(nvmlDeviceGetGraphicsRunningProcesses_v3)   \
    X(nvmlSystemGetProcessName) X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetNvLinkVersion)    \
    X(nvmlDeviceGetNvLinkCapability) X(nvmlDeviceGetNvLinkErrorCounter)                      \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2) X(nvmlDeviceGetTopologyCommonAncestor)            \
    X(nvmlDeviceGetCpuAffinity) X(nvmlDeviceGetMemoryAffinity) X(nvmlDeviceGetModuleId) X(nvmlDeviceGetPowerManagementMode)      \
    X(nvmlDeviceGetGspFirmwareVersion) X(nvmlDeviceGetPowerState) X(nvmlDeviceGetMarginTemperature)  \
    X(nvmlDeviceGetFieldValues) X(nvmlDeviceGetPciInfoExt) X(nvmlDeviceGetNvLinkRemoteDeviceType) \
    X(nvmlDeviceSetPersistenceMode) X(nvmlDeviceSetComputeMode) X(nvmlDeviceSetPowerManagementLimit) \
    X(nvmlDeviceSetGpuLockedClocks) X(nvmlDeviceResetGpuLockedClocks)                        \
    X(nvmlDeviceSetApplicationsClocks) X(nvmlDeviceResetApplicationsClocks)                  \
    X(nvmlDeviceSetMemoryLockedClocks) X(nvmlDeviceResetMemoryLockedClocks)                  \
    X(nvmlDeviceSetEccMode) X(nvmlDeviceClearEccErrorCounts) X(nvmlDeviceSetAccountingMode)  \
    X(nvmlDeviceClearAccountingPids) X(nvmlDeviceGetAccountingPids) X(nvmlDeviceGetAccountingMode)       \
    X(nvmlDeviceGetAccountingBufferSize)                          \
    X(nvmlDeviceGetAccountingStats) X(nvmlDeviceSetDefaultAutoBoostedClocksEnabled)          \
    X(nvmlDeviceSetGpuOperationMode) X(nvmlDeviceGetAddressingMode)                          \
    NVML_FUNCS_CAPTURED(X)

/* The getters of the values the captures have beyond --query-gpu's basics (captured_value). */
#define NVML_FUNCS_CAPTURED(X)                                                                \
    X(nvmlDeviceGetPdi) X(nvmlDeviceGetC2cModeInfoV) X(nvmlDeviceGetVirtualizationMode)      \
    X(nvmlDeviceGetJpgUtilization) X(nvmlDeviceGetOfaUtilization) X(nvmlDeviceGetEncoderStats) \
    X(nvmlDeviceGetFBCStats) X(nvmlDeviceGetConfComputeProtectedMemoryUsage)                 \
    X(nvmlDeviceGetSramEccErrorStatus) X(nvmlDeviceGetRowRemapperHistogram)                  \
    X(nvmlDeviceGetMigDeviceHandleByIndex)                                                   \
    X(nvmlDeviceGetRepairStatus) X(nvmlDeviceGetCapabilities) X(nvmlDeviceGetRemappedRows_v2)  \
    X(nvmlDeviceGetUnrepairableMemoryFlag_v1)

#define DECLARE(f) static __typeof__(f) *p_##f;
NVML_FUNCS(DECLARE)
#undef DECLARE

/* A symbol the library lacks answers like an unsupported getter. */
#define NV(f, ...) (p_##f ? p_##f(__VA_ARGS__) : NVML_ERROR_FUNCTION_NOT_FOUND)

static void *g_lib;
static int g_branch = 590;          /* driver major: picks layouts that changed between branches */
/* Before 570: the layouts recorded from NVIDIA's own nvidia-smi of the nearest older Debian-shipped
   branch (smi_gen.h's BRANCHES; the oldest for older drivers). From 570: the 590/595 captures. */
static const struct branch *g_rec;
static const struct qfield *g_fields = QUERY_GPU_FIELDS;
static int g_colon = 55;            /* -q's colon column */
static char g_driver[96] = "N/A";
static char g_cuda[16] = "N/A";
static unsigned g_count;

enum { EXIT_OK = 0, EXIT_INVALID = 2, EXIT_NOT_FOUND = 6, EXIT_NO_DRIVER = 9, EXIT_NO_LIB = 12,
       EXIT_LOST = 15, EXIT_OTHER = 255 };

static const char MSG_INVALID[] = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n";
static const char MSG_NO_DEVICES[] = "No devices were found\n";

static int load_nvml(void)
{
    /* The real tool dlopens the soname (and the unversioned name as a fallback). */
    g_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!g_lib)
        g_lib = dlopen("libnvidia-ml.so", RTLD_NOW | RTLD_LOCAL);
    if (!g_lib)
        return -1;
#define RESOLVE(f) p_##f = (__typeof__(p_##f))dlsym(g_lib, #f);
    NVML_FUNCS(RESOLVE)
#undef RESOLVE
    /* What we read from the state ourselves comes from the node that library reads. */
    mokka_set_anchor(p_nvmlInit_v2 ? (const void *)p_nvmlInit_v2 : NULL);
    return 0;
}

static const char *nvml_error(nvmlReturn_t r)
{
    const char *s = p_nvmlErrorString ? p_nvmlErrorString(r) : NULL;
    return s ? s : "Unknown Error";
}

/* ---- devices -------------------------------------------------------------------------- */

struct dev {
    unsigned index;
    nvmlDevice_t h;
    nvmlReturn_t err;           /* SUCCESS, or why there is no handle (GPU_IS_LOST, ...) */
};

static struct dev g_devs[MOKKA_MAX_GPUS];
static unsigned g_ndevs;        /* selected by -i, in index order */

/* The shared state the daemon publishes, for what NVML has no call for (a lost GPU's bus id,
   which the real tool learns from the kernel; the GPU part number, which it reads from the
   board). NULL if there is none, or GPU `index` is not in it. */
static const struct mokka_state *state_of(unsigned index)
{
    const struct mokka_state *s = mokka_state();
    if (!s && mokka_open() == MOKKA_OK)
        s = mokka_state();
    return s && index < mokka_gpu_count(s) ? s : NULL;
}

/* One identity string of GPU `index` from the state; 0 if the state has none. */
static int state_string(unsigned index, size_t offset, size_t len, char *out, size_t n)
{
    const struct mokka_state *s = state_of(index);
    char buf[96];
    if (!s)
        return 0;
    mokka_read_string(s, (const char *)&s->gpus[index] + offset, len, buf, sizeof(buf));
    if (!buf[0])
        return 0;
    snprintf(out, n, "%s", buf);
    return 1;
}

#define STATE_STRING(index, field, out, n)                                                         \
    state_string((index), offsetof(struct mokka_gpu, field), sizeof(((struct mokka_gpu *)0)->field), (out), (n))

/* ---- MIG, as the shared state publishes it (docs/mig.md) -------------------------------- */

/* One GPU's MIG facts: the one client's snapshot (mokka_read_mig), with the GPU's processes for
   the GI/CI columns. Our NVML's MIG calls are not what this tool reads: like the lost GPU's bus
   id, the layout comes from the state the model computed, so every name, id, UUID and share is
   the model's own (nothing re-derived here). */

/* The board's tables (node-wide), filled by mig_read. */
static struct mokka_mig_profile g_mig_profiles[MOKKA_MAX_MIG_PROFILES];
static unsigned g_mig_profile_count;

static int mig_read(unsigned index, struct mokka_mig_snapshot *v)
{
    memset(v, 0, sizeof(*v));
    const struct mokka_state *s = state_of(index);
    if (!s)
        return -1;
    mokka_read_mig(s, index, v, MOKKA_MIG_WITH_PROCESSES);
    g_mig_profile_count = mokka_mig_profile_count(s);
    for (unsigned k = 0; k < g_mig_profile_count; k++)
        mokka_read_mig_profile(s, k, &g_mig_profiles[k]);
    return 0;
}

/* Is MIG the current mode of GPU `index`? (What turns utilization into N/A, as on real boards.) */
static int mig_enabled(unsigned index)
{
    const struct mokka_state *s = state_of(index);
    uint32_t capable = 0, mode = 0;
    if (!s)
        return 0;
    MOKKA_CONSISTENT(s) {
        capable = s->gpus[index].mig_capable;
        mode = s->gpus[index].mig_mode;
    }
    return capable && mode;
}

/* The board's GPU instance profile of NVML index `index`, or NULL. */
static const struct mokka_mig_profile *mig_profile(unsigned index)
{
    for (unsigned k = 0; k < g_mig_profile_count; k++)
        if (g_mig_profiles[k].index == index)
            return &g_mig_profiles[k];
    return NULL;
}

/* The GPU instance and compute instance a process runs on (0 when none). */
static int mig_of_pid(const struct mokka_mig_snapshot *v, unsigned pid, unsigned *gi, unsigned *ci)
{
    for (unsigned k = 0; k < v->proc_count; k++)
        if (v->procs[k].pid == pid && v->procs[k].mig_gi != MOKKA_NO_MIG) {
            *gi = v->procs[k].mig_gi;
            *ci = v->procs[k].mig_ci;
            return 1;
        }
    return 0;
}

static void lost_bus_id(unsigned index, char *out, size_t n)
{
    if (!STATE_STRING(index, bus_id_legacy, out, n))
        snprintf(out, n, "%u", index);
}

/* "Unable to determine the device handle for GPU0000:18:00.0: GPU is lost.  Reboot the system
   to recover this GPU" -- the driver's own wording for each failing handle. */
static void print_handle_error(const struct dev *d)
{
    char bus[32];
    lost_bus_id(d->index, bus, sizeof(bus));
    if (d->err == NVML_ERROR_GPU_IS_LOST)
        printf("Unable to determine the device handle for GPU%s: GPU is lost.  Reboot the system to recover this GPU\n", bus);
    else
        printf("Unable to determine the device handle for GPU%s: %s\n", bus, nvml_error(d->err));
}


/* -i: indices, UUIDs or bus ids, comma-separated. 0 on success, else an exit code. */
static int select_devices(const char *ids)
{
    unsigned all = g_count > MOKKA_MAX_GPUS ? MOKKA_MAX_GPUS : g_count;
    struct dev every[MOKKA_MAX_GPUS];
    for (unsigned i = 0; i < all; i++) {
        every[i].index = i;
        every[i].h = NULL;
        every[i].err = NV(nvmlDeviceGetHandleByIndex_v2, i, &every[i].h);
    }
    g_ndevs = 0;
    if (!ids) {
        memcpy(g_devs, every, sizeof(every[0]) * all);
        g_ndevs = all;
        return 0;
    }
    int picked[MOKKA_MAX_GPUS] = {0};
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", ids);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        int found = -1;
        struct mokka_bus_id bus;
        int is_bus = mokka_parse_bus_id(tok, &bus) == 0;
        if (*tok && strspn(tok, "0123456789") == strlen(tok)) {
            unsigned long v = strtoul(tok, NULL, 10);
            if (strlen(tok) < 6 && v < all)
                found = (int)v;
        } else if (*tok) {
            for (unsigned i = 0; i < all && found < 0; i++) {
                char s[96];
                if (every[i].err == NVML_SUCCESS) {
                    if (NV(nvmlDeviceGetUUID, every[i].h, s, sizeof(s)) == NVML_SUCCESS && strcasecmp(s, tok) == 0)
                        found = (int)i;
                    nvmlPciInfo_t pci;
                    if (found < 0 && is_bus && NV(nvmlDeviceGetPciInfo_v3, every[i].h, &pci) == NVML_SUCCESS &&
                        pci.domain == bus.domain && pci.bus == bus.bus && pci.device == bus.device && !bus.function)
                        found = (int)i;
                } else if (is_bus && state_of(i) && mokka_bus_id_is(state_of(i), i, &bus)) {
                    found = (int)i; /* a lost GPU: its bus id as the driver probed it */
                }
            }
        }
        if (found < 0)
            return EXIT_NOT_FOUND;
        picked[found] = 1;
    }
    for (unsigned i = 0; i < all; i++)
        if (picked[i])
            g_devs[g_ndevs++] = every[i];
    return 0;
}

/* ---- values --------------------------------------------------------------------------- */

enum vr { V_OK, V_NA, V_DEPRECATED };

static enum vr from(nvmlReturn_t r)
{
    return r == NVML_SUCCESS ? V_OK : r == NVML_ERROR_DEPRECATED ? V_DEPRECATED : V_NA;
}

static const char *arch_name(unsigned a)
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

static const char *brand_name(unsigned b)
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

static const char *compute_mode_name(unsigned m)
{
    switch (m) {
    case NVML_COMPUTEMODE_DEFAULT: return "Default";
    case NVML_COMPUTEMODE_EXCLUSIVE_THREAD: return "Exclusive_Thread";
    case NVML_COMPUTEMODE_PROHIBITED: return "Prohibited";
    case NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: return "Exclusive_Process";
    default: return "Unknown";
    }
}

__attribute__((format(printf, 3, 4))) static enum vr put(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, n, fmt, ap);
    va_end(ap);
    return V_OK;
}
#define PUT(...) put(out, n, __VA_ARGS__)

/* v is read after the call that fills it (a by-value argument could be read before). */
static enum vr u32v(nvmlReturn_t r, const unsigned *v, char *out, size_t n)
{
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%u", *v);
}

static enum vr reason(nvmlDevice_t h, unsigned long long bit, char *out, size_t n)
{
    unsigned long long m = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetCurrentClocksEventReasons, h, &m);
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%s", (m & bit) ? "Active" : "Not Active");
}

static enum vr memv(const struct dev *d, int which, char *out, size_t n)
{
    nvmlMemory_v2_t m = {.version = nvmlMemory_v2};
    nvmlReturn_t r = NV(nvmlDeviceGetMemoryInfo_v2, d->h, &m);
    if (r != NVML_SUCCESS)
        return from(r);
    unsigned long long v = which == 0 ? m.total : which == 1 ? m.reserved : which == 2 ? m.used : m.free;
    return PUT("%llu", v >> 20);
}

static enum vr watts(nvmlReturn_t r, const unsigned *mw, char *out, size_t n)
{
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%u.%02u", *mw / 1000, (*mw % 1000) / 10);
}

static enum vr clockv(nvmlReturn_t r, const unsigned *mhz, char *out, size_t n) { return u32v(r, mhz, out, n); }

static enum vr ecc_count(const struct dev *d, nvmlMemoryErrorType_t t, nvmlEccCounterType_t c,
                         nvmlMemoryLocation_t loc, char *out, size_t n)
{
    unsigned long long v = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetMemoryErrorCounter, d->h, t, c, loc, &v);
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%llu", v);
}

static enum vr ecc_total(const struct dev *d, nvmlMemoryErrorType_t t, nvmlEccCounterType_t c, char *out, size_t n)
{
    unsigned long long v = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetTotalEccErrors, d->h, t, c, &v);
    if (r != NVML_SUCCESS)
        return from(r);
    return PUT("%llu", v);
}

static enum vr temp_threshold(const struct dev *d, nvmlTemperatureThresholds_t t, int with_unit, char *out, size_t n)
{
    unsigned v = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetTemperatureThreshold, d->h, t, &v);
    if (r != NVML_SUCCESS)
        return from(r);
    return with_unit ? PUT("%d C", (int)v) : PUT("%d", (int)v);
}

/* A threshold relative to T.Limit (fields 193-196, signed degrees), as boards from Ada on report
   them (H100: -8, -2, 0, 0 C); NOT_SUPPORTED where the board has no T.Limit. */
static enum vr temp_tlimit(const struct dev *d, unsigned field, char *out, size_t n)
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

static enum vr retired(const struct dev *d, nvmlPageRetirementCause_t cause, char *out, size_t n)
{
    unsigned count = 0;
    nvmlReturn_t r = NV(nvmlDeviceGetRetiredPages, d->h, cause, &count, NULL);
    if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE)
        return from(r);
    return PUT("%u", count);
}

static void timestamp(char *out, size_t n, int csv)
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

/* One unsigned field value (nvmlDeviceGetFieldValues), or its error. */
static nvmlReturn_t field_u64(const struct dev *d, unsigned id, unsigned long long *v)
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

static enum vr yes_no(nvmlReturn_t r, unsigned v, char *out, size_t n)
{
    return r == NVML_SUCCESS ? PUT("%s", v ? "Yes" : "No") : from(r);
}

/* The values the captures print beyond --query-gpu's basics (the N/A count,
   tests/test_smi_na.py), each from its NVML getter. */
static enum vr captured_value(const struct dev *d, int key, char *out, size_t n)
{
    nvmlDevice_t h = d->h;
    nvmlReturn_t r;
    unsigned u = 0, u2 = 0, u3 = 0;
    unsigned long long v = 0;
    switch (key) {
    case K_x_pdi: {
        nvmlPdi_t pdi = {.version = nvmlPdi_v1};
        r = NV(nvmlDeviceGetPdi, h, &pdi);
        return r == NVML_SUCCESS ? PUT("0x%016llx", pdi.value) : from(r);
    }
    case K_c2c_mode: {
        nvmlC2cModeInfo_v1_t c = {0};
        r = NV(nvmlDeviceGetC2cModeInfoV, h, &c);
        return r == NVML_SUCCESS ? PUT("%s", c.isC2cEnabled ? "Enabled" : "Disabled") : from(r);
    }
    case K_x_virtualization_mode: {
        static const char *const MODES[] = {"None", "Pass-Through", "VGPU", "Host VGPU", "Host VSGA"};
        nvmlGpuVirtualizationMode_t m = NVML_GPU_VIRTUALIZATION_MODE_NONE;
        r = NV(nvmlDeviceGetVirtualizationMode, h, &m);
        if (r != NVML_SUCCESS)
            return from(r);
        return (unsigned)m < sizeof(MODES) / sizeof(MODES[0]) ? PUT("%s", MODES[m]) : V_NA;
    }
    /* fields 226 and 227, which the tool stopped printing in 570 ("GPU Recovery Action" took
       their place, as the 570 capture shows) */
    case K_x_reset_required: case K_x_drain_and_reset:
        if (g_branch >= 570)
            return V_DEPRECATED;
        r = field_u64(d, key == K_x_reset_required ? NVML_FI_DEV_RESET_STATUS : NVML_FI_DEV_DRAIN_AND_RESET_STATUS, &v);
        return yes_no(r, (unsigned)v, out, n);
    case K_gpu_recovery_action: {
        static const char *const ACTIONS[] = {"None", "Reset", "Reboot", "Drain P2P", "Drain and Reset"};
        r = field_u64(d, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, &v);
        if (r != NVML_SUCCESS)
            return from(r);
        return v < sizeof(ACTIONS) / sizeof(ACTIONS[0]) ? PUT("%s", ACTIONS[v]) : V_NA;
    }
    case K_x_pcie_replay_rollover:
        r = field_u64(d, NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER, &v);
        return r == NVML_SUCCESS ? PUT("%llu", v) : from(r);
    case K_clocks_event_reasons_counters_sw_power_cap: case K_clocks_event_reasons_counters_sync_boost:
    case K_clocks_event_reasons_counters_sw_thermal_slowdown: case K_clocks_event_reasons_counters_hw_thermal_slowdown:
    case K_clocks_event_reasons_counters_hw_power_brake_slowdown: {
        unsigned id = key == K_clocks_event_reasons_counters_sw_power_cap ? NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
                    : key == K_clocks_event_reasons_counters_sync_boost ? NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
                    : key == K_clocks_event_reasons_counters_sw_thermal_slowdown
                        ? NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
                    : key == K_clocks_event_reasons_counters_hw_thermal_slowdown
                        ? NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
                        : NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN;
        r = field_u64(d, id, &v);
        return r == NVML_SUCCESS ? PUT("%llu", v / 1000) : from(r); /* ns, printed in us */
    }
    case K_edpp_multiplier:
        r = field_u64(d, NVML_FI_DEV_EDPP_MULTIPLIER, &v);
        return r == NVML_SUCCESS ? PUT("%llu.00", v) : from(r);
    case K_protected_memory_total: case K_protected_memory_used: case K_protected_memory_free: {
        nvmlMemory_t m;
        r = NV(nvmlDeviceGetConfComputeProtectedMemoryUsage, h, &m);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%llu", (key == K_protected_memory_total ? m.total : key == K_protected_memory_used ? m.used : m.free) >> 20);
    }
    case K_utilization_jpeg:
        return u32v(NV(nvmlDeviceGetJpgUtilization, h, &u, &u2), &u, out, n);
    case K_utilization_ofa:
        return u32v(NV(nvmlDeviceGetOfaUtilization, h, &u, &u2), &u, out, n);
    case K_encoder_stats_sessionCount: case K_encoder_stats_averageFps: case K_encoder_stats_averageLatency:
        r = NV(nvmlDeviceGetEncoderStats, h, &u, &u2, &u3);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%u", key == K_encoder_stats_sessionCount ? u : key == K_encoder_stats_averageFps ? u2 : u3);
    case K_x_fbc_sessions: case K_x_fbc_fps: case K_x_fbc_latency: {
        nvmlFBCStats_t f;
        r = NV(nvmlDeviceGetFBCStats, h, &f);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%u", key == K_x_fbc_sessions ? f.sessionsCount : key == K_x_fbc_fps ? f.averageFPS : f.averageLatency);
    }
    case K_ecc_errors_uncorrected_volatile_sram_parity: case K_ecc_errors_uncorrected_volatile_sram_secded:
    case K_ecc_errors_uncorrected_aggregate_sram_parity: case K_ecc_errors_uncorrected_aggregate_sram_secded:
    case K_ecc_errors_uncorrected_aggregate_sram_thresholdExceeded: case K_ecc_errors_uncorrected_aggregate_sram_l2:
    case K_ecc_errors_uncorrected_aggregate_sram_sm: case K_ecc_errors_uncorrected_aggregate_sram_mcu:
    case K_ecc_errors_uncorrected_aggregate_sram_pcie: case K_ecc_errors_uncorrected_aggregate_sram_other: {
        nvmlEccSramErrorStatus_t e;
        memset(&e, 0, sizeof(e));
        e.version = nvmlEccSramErrorStatus_v1;
        r = NV(nvmlDeviceGetSramEccErrorStatus, h, &e);
        if (r != NVML_SUCCESS)
            return from(r);
        if (key == K_ecc_errors_uncorrected_aggregate_sram_thresholdExceeded)
            return PUT("%s", e.bThresholdExceeded ? "Yes" : "No");
        v = key == K_ecc_errors_uncorrected_volatile_sram_parity ? e.volatileUncParity
          : key == K_ecc_errors_uncorrected_volatile_sram_secded ? e.volatileUncSecDed
          : key == K_ecc_errors_uncorrected_aggregate_sram_parity ? e.aggregateUncParity
          : key == K_ecc_errors_uncorrected_aggregate_sram_secded ? e.aggregateUncSecDed
          : key == K_ecc_errors_uncorrected_aggregate_sram_l2 ? e.aggregateUncBucketL2
          : key == K_ecc_errors_uncorrected_aggregate_sram_sm ? e.aggregateUncBucketSm
          : key == K_ecc_errors_uncorrected_aggregate_sram_mcu ? e.aggregateUncBucketMcu
          : key == K_ecc_errors_uncorrected_aggregate_sram_pcie ? e.aggregateUncBucketPcie
                                                                 : e.aggregateUncBucketOther;
        return PUT("%llu", v);
    }
    case K_x_repair_channel: case K_x_repair_tpc: {
        nvmlRepairStatus_t rs = {.version = nvmlRepairStatus_v1};
        r = NV(nvmlDeviceGetRepairStatus, h, &rs);
        return yes_no(r, key == K_x_repair_channel ? rs.bChannelRepairPending : rs.bTpcRepairPending, out, n);
    }
    case K_remapped_rows_histogram_max: case K_remapped_rows_histogram_high: case K_remapped_rows_histogram_partial:
    case K_remapped_rows_histogram_low: case K_remapped_rows_histogram_none: {
        nvmlRowRemapperHistogramValues_t hv;
        r = NV(nvmlDeviceGetRowRemapperHistogram, h, &hv);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%u", key == K_remapped_rows_histogram_max ? hv.max : key == K_remapped_rows_histogram_high ? hv.high
                         : key == K_remapped_rows_histogram_partial ? hv.partial
                         : key == K_remapped_rows_histogram_low ? hv.low : hv.none);
    }
    case K_x_egm: {
        nvmlDeviceCapabilities_t c = {.version = nvmlDeviceCapabilities_v1};
        r = NV(nvmlDeviceGetCapabilities, h, &c);
        return r == NVML_SUCCESS ? PUT("%s", c.capMask & NVML_DEV_CAP_EGM ? "enabled" : "disabled") : from(r);
    }
    case K_x_remap_corr_inactive: case K_x_remap_unc_inactive: {
        nvmlRemappedRowsInfo_v2_t ri;
        r = NV(nvmlDeviceGetRemappedRows_v2, h, &ri);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%u", key == K_x_remap_corr_inactive ? ri.corrInactiveRemaps : ri.uncInactiveRemaps);
    }
    case K_x_unrepairable: {
        nvmlUnrepairableMemoryStatus_v1_t um;
        r = NV(nvmlDeviceGetUnrepairableMemoryFlag_v1, h, &um);
        return yes_no(r, um.bUnrepairableMemory, out, n);
    }
    /* the module's performance state: printed deprecated by every branch captured (570 on) */
    case K_x_module_power_state:
        return g_branch >= 570 ? V_DEPRECATED : V_NA;
    default:
        return V_NA;
    }
}

/* One value, without its unit. V_NA / V_DEPRECATED leave `out` unspecified. */
static enum vr value(const struct dev *d, int key, char *out, size_t n)
{
    nvmlDevice_t h = d->h;
    unsigned u = 0, u2 = 0;
    nvmlReturn_t r;
    nvmlPciInfo_t pci;
    nvmlEnableState_t e1, e2;
    /* Getters the driver retired: the tool prints the deprecation, by branch (captures). */
    if ((key == K_display_mode && g_branch >= 580) || (key == K_power_management && g_branch >= 590) ||
        (g_branch >= 590 && (key == K_clocks_applications_graphics || key == K_clocks_applications_memory ||
                             key == K_clocks_default_applications_graphics ||
                             key == K_clocks_default_applications_memory)))
        return V_DEPRECATED;
    /* "On MIG-enabled GPUs, querying the utilization of encoder, decoder, jpeg, ofa, gpu, and
       memory is not currently supported." (--help-query-gpu) */
    if ((key == K_utilization_gpu || key == K_utilization_memory || key == K_utilization_encoder ||
         key == K_utilization_decoder) && mig_enabled(d->index))
        return V_NA;
    switch (key) {
    case K_timestamp: timestamp(out, n, 1); return V_OK;
    case K_driver_version: return PUT("%s", g_driver);
    case K_x_cuda_version: return PUT("%s", g_cuda);
    case K_count: return PUT("%u", g_count);
    case K_index: return PUT("%u", d->index);
    case K_name: return from(NV(nvmlDeviceGetName, h, out, (unsigned)n));
    case K_serial: return from(NV(nvmlDeviceGetSerial, h, out, (unsigned)n));
    case K_uuid: return from(NV(nvmlDeviceGetUUID, h, out, (unsigned)n));
    case K_vbios_version: return from(NV(nvmlDeviceGetVbiosVersion, h, out, (unsigned)n));
    case K_x_board_part_number: return from(NV(nvmlDeviceGetBoardPartNumber, h, out, (unsigned)n));
    case K_x_gpu_part_number: return STATE_STRING(d->index, gpu_part_number, out, n) ? V_OK : V_NA;
    case K_inforom_img: return from(NV(nvmlDeviceGetInforomImageVersion, h, out, (unsigned)n));
    case K_inforom_oem: return from(NV(nvmlDeviceGetInforomVersion, h, NVML_INFOROM_OEM, out, (unsigned)n));
    case K_inforom_ecc: return from(NV(nvmlDeviceGetInforomVersion, h, NVML_INFOROM_ECC, out, (unsigned)n));
    case K_inforom_pwr: return from(NV(nvmlDeviceGetInforomVersion, h, NVML_INFOROM_POWER, out, (unsigned)n));
    case K_x_gsp_firmware_version: return from(NV(nvmlDeviceGetGspFirmwareVersion, h, out));
    case K_pci_bus_id: case K_pci_domain: case K_pci_bus: case K_pci_device: case K_pci_device_id:
    case K_pci_sub_device_id: case K_pci_baseClass: case K_pci_subClass:
        r = NV(nvmlDeviceGetPciInfo_v3, h, &pci);
        if (r != NVML_SUCCESS)
            return from(r);
        switch (key) {
        case K_pci_bus_id: return PUT("%s", pci.busId);
        case K_pci_domain: return PUT("0x%04X", pci.domain);
        case K_pci_bus: return PUT("0x%02X", pci.bus);
        case K_pci_device: return PUT("0x%02X", pci.device);
        case K_pci_device_id: return PUT("0x%08X", pci.pciDeviceId);
        case K_pci_sub_device_id: return PUT("0x%08X", pci.pciSubSystemId);
        default: {
            nvmlPciInfoExt_t ext = {.version = nvmlPciInfoExt_v1};
            r = NV(nvmlDeviceGetPciInfoExt, h, &ext);
            if (r != NVML_SUCCESS)
                return from(r);
            return PUT("0x%X", key == K_pci_baseClass ? ext.baseClass : ext.subClass);
        }
        }
    case K_pcie_link_gen_current: case K_pcie_link_gen_gpucurrent:
        return u32v(NV(nvmlDeviceGetCurrPcieLinkGeneration, h, &u), &u, out, n);
    case K_pcie_link_gen_max: return u32v(NV(nvmlDeviceGetMaxPcieLinkGeneration, h, &u), &u, out, n);
    case K_pcie_link_gen_gpumax: return u32v(NV(nvmlDeviceGetGpuMaxPcieLinkGeneration, h, &u), &u, out, n);
    case K_pcie_link_width_current: return u32v(NV(nvmlDeviceGetCurrPcieLinkWidth, h, &u), &u, out, n);
    case K_pcie_link_width_max: return u32v(NV(nvmlDeviceGetMaxPcieLinkWidth, h, &u), &u, out, n);
    case K_x_pcie_replay: return u32v(NV(nvmlDeviceGetPcieReplayCounter, h, &u), &u, out, n);
    case K_x_pcie_tx: case K_x_pcie_rx:
        r = NV(nvmlDeviceGetPcieThroughput, h, key == K_x_pcie_tx ? NVML_PCIE_UTIL_TX_BYTES : NVML_PCIE_UTIL_RX_BYTES, &u);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%u KB/s", u);
    case K_display_mode:
        r = NV(nvmlDeviceGetDisplayMode, h, &e1);
        return r == NVML_SUCCESS ? PUT("%s", e1 ? "Enabled" : "Disabled") : from(r);
    case K_display_active:
        r = NV(nvmlDeviceGetDisplayActive, h, &e1);
        return r == NVML_SUCCESS ? PUT("%s", e1 ? "Enabled" : "Disabled") : from(r);
    case K_persistence_mode:
        r = NV(nvmlDeviceGetPersistenceMode, h, &e1);
        return r == NVML_SUCCESS ? PUT("%s", e1 ? "Enabled" : "Disabled") : from(r);
    case K_accounting_mode:
        r = NV(nvmlDeviceGetAccountingMode, h, &e1);
        return r == NVML_SUCCESS ? PUT("%s", e1 ? "Enabled" : "Disabled") : from(r);
    case K_accounting_buffer_size:
        r = NV(nvmlDeviceGetAccountingBufferSize, h, &u);
        return r == NVML_SUCCESS ? PUT("%u", u) : from(r);
    case K_mig_mode_current: case K_mig_mode_pending: {
        struct mokka_mig_snapshot mv;
        if (mig_read(d->index, &mv) != 0 || !mv.capable)
            return V_NA;
        return PUT("%s", (key == K_mig_mode_current ? mv.mode : mv.pending) ? "Enabled" : "Disabled");
    }
    case K_ecc_mode_current: case K_ecc_mode_pending:
        r = NV(nvmlDeviceGetEccMode, h, &e1, &e2);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%s", (key == K_ecc_mode_current ? e1 : e2) ? "Enabled" : "Disabled");
    case K_x_product_brand:
        r = NV(nvmlDeviceGetBrand, h, (nvmlBrandType_t *)&u);
        return r == NVML_SUCCESS ? PUT("%s", brand_name(u)) : from(r);
    case K_x_product_architecture:
        r = NV(nvmlDeviceGetArchitecture, h, (nvmlDeviceArchitecture_t *)&u);
        return r == NVML_SUCCESS ? PUT("%s", arch_name(u)) : from(r);
    case K_x_minor_number: return u32v(NV(nvmlDeviceGetMinorNumber, h, &u), &u, out, n);
    case K_power_management: /* -q's "Power Management" before 535; deprecated from 590 (above) */
        r = NV(nvmlDeviceGetPowerManagementMode, h, &e1);
        return r == NVML_SUCCESS ? PUT("%s", e1 ? "Supported" : "N/A") : from(r);
    case K_x_multigpu_board:
        r = NV(nvmlDeviceGetMultiGpuBoard, h, &u);
        return r == NVML_SUCCESS ? PUT("%s", u ? "Yes" : "No") : from(r);
    case K_x_board_id:
        r = NV(nvmlDeviceGetBoardId, h, &u);
        return r == NVML_SUCCESS ? PUT("0x%x", u) : from(r);
    case K_platform_module_id: return u32v(NV(nvmlDeviceGetModuleId, h, &u), &u, out, n);
    case K_fan_speed: return u32v(NV(nvmlDeviceGetFanSpeed, h, &u), &u, out, n);
    case K_pstate: case K_x_power_state:
        r = NV(nvmlDeviceGetPerformanceState, h, (nvmlPstates_t *)&u);
        if (r != NVML_SUCCESS)
            return from(r);
        return u == NVML_PSTATE_UNKNOWN ? V_NA : PUT("P%u", u);
    case K_clocks_event_reasons_supported: case K_clocks_event_reasons_active: {
        unsigned long long m = 0;
        r = key == K_clocks_event_reasons_active ? NV(nvmlDeviceGetCurrentClocksEventReasons, h, &m)
                                                  : NV(nvmlDeviceGetSupportedClocksEventReasons, h, &m);
        return r == NVML_SUCCESS ? PUT("0x%016llX", m) : from(r);
    }
    case K_clocks_event_reasons_gpu_idle: return reason(h, nvmlClocksEventReasonGpuIdle, out, n);
    case K_clocks_event_reasons_applications_clocks_setting:
        return reason(h, nvmlClocksEventReasonApplicationsClocksSetting, out, n);
    case K_clocks_event_reasons_sw_power_cap: return reason(h, nvmlClocksEventReasonSwPowerCap, out, n);
    case K_clocks_event_reasons_hw_slowdown: return reason(h, nvmlClocksThrottleReasonHwSlowdown, out, n);
    case K_clocks_event_reasons_hw_thermal_slowdown: return reason(h, nvmlClocksThrottleReasonHwThermalSlowdown, out, n);
    case K_clocks_event_reasons_hw_power_brake_slowdown:
        return reason(h, nvmlClocksThrottleReasonHwPowerBrakeSlowdown, out, n);
    case K_clocks_event_reasons_sw_thermal_slowdown: return reason(h, nvmlClocksEventReasonSwThermalSlowdown, out, n);
    case K_clocks_event_reasons_sync_boost: return reason(h, nvmlClocksEventReasonSyncBoost, out, n);
    case K_x_display_clock_setting: return reason(h, nvmlClocksEventReasonDisplayClockSetting, out, n);
    case K_memory_total: return memv(d, 0, out, n);
    case K_memory_reserved: return memv(d, 1, out, n);
    case K_memory_used: return memv(d, 2, out, n);
    case K_memory_free: return memv(d, 3, out, n);
    case K_x_bar1_total: case K_x_bar1_used: case K_x_bar1_free: {
        nvmlBAR1Memory_t b;
        r = NV(nvmlDeviceGetBAR1MemoryInfo, h, &b);
        if (r != NVML_SUCCESS)
            return from(r);
        unsigned long long v = key == K_x_bar1_total ? b.bar1Total : key == K_x_bar1_used ? b.bar1Used : b.bar1Free;
        return PUT("%llu MiB", v >> 20);
    }
    case K_compute_mode:
        r = NV(nvmlDeviceGetComputeMode, h, (nvmlComputeMode_t *)&u);
        return r == NVML_SUCCESS ? PUT("%s", compute_mode_name(u)) : from(r);
    case K_compute_cap: {
        int ma = 0, mi = 0;
        r = NV(nvmlDeviceGetCudaComputeCapability, h, &ma, &mi);
        return r == NVML_SUCCESS ? PUT("%d.%d", ma, mi) : from(r);
    }
    case K_utilization_gpu: case K_utilization_memory: {
        nvmlUtilization_t ut;
        r = NV(nvmlDeviceGetUtilizationRates, h, &ut);
        if (r != NVML_SUCCESS)
            return from(r);
        return PUT("%u", key == K_utilization_gpu ? ut.gpu : ut.memory);
    }
    case K_utilization_encoder: return u32v(NV(nvmlDeviceGetEncoderUtilization, h, &u, &u2), &u, out, n);
    case K_utilization_decoder: return u32v(NV(nvmlDeviceGetDecoderUtilization, h, &u, &u2), &u, out, n);
    case K_ecc_errors_corrected_volatile_total:
        return ecc_total(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, out, n);
    case K_ecc_errors_corrected_aggregate_total:
        return ecc_total(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, out, n);
    case K_ecc_errors_uncorrected_volatile_total:
        return ecc_total(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, out, n);
    case K_ecc_errors_uncorrected_aggregate_total:
        return ecc_total(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, out, n);
    case K_ecc_errors_corrected_volatile_device_memory: case K_ecc_errors_corrected_volatile_dram: case K_x_ecc_dram_corr_vol:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, NVML_MEMORY_LOCATION_DRAM, out, n);
    case K_ecc_errors_corrected_aggregate_device_memory: case K_ecc_errors_corrected_aggregate_dram: case K_x_ecc_dram_corr_agg:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_DRAM, out, n);
    case K_ecc_errors_uncorrected_volatile_device_memory: case K_ecc_errors_uncorrected_volatile_dram: case K_x_ecc_dram_unc_vol:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, NVML_MEMORY_LOCATION_DRAM, out, n);
    case K_ecc_errors_uncorrected_aggregate_device_memory: case K_ecc_errors_uncorrected_aggregate_dram: case K_x_ecc_dram_unc_agg:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_DRAM, out, n);
    case K_ecc_errors_corrected_volatile_sram: case K_x_ecc_sram_corr_vol:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, NVML_MEMORY_LOCATION_SRAM, out, n);
    case K_ecc_errors_corrected_aggregate_sram: case K_x_ecc_sram_corr_agg:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_SRAM, out, n);
    case K_ecc_errors_uncorrected_volatile_sram:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, NVML_MEMORY_LOCATION_SRAM, out, n);
    case K_ecc_errors_uncorrected_aggregate_sram:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_SRAM, out, n);
    case K_ecc_errors_corrected_volatile_l2_cache:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, NVML_MEMORY_LOCATION_L2_CACHE, out, n);
    case K_ecc_errors_corrected_aggregate_l2_cache:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_L2_CACHE, out, n);
    case K_ecc_errors_uncorrected_volatile_l2_cache:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, NVML_MEMORY_LOCATION_L2_CACHE, out, n);
    case K_ecc_errors_uncorrected_aggregate_l2_cache:
        return ecc_count(d, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, NVML_MEMORY_LOCATION_L2_CACHE, out, n);
    case K_retired_pages_single_bit_ecc_count: return retired(d, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, out, n);
    case K_retired_pages_double_bit_count: return retired(d, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, out, n);
    case K_retired_pages_pending:
        r = NV(nvmlDeviceGetRetiredPagesPendingStatus, h, &e1);
        return r == NVML_SUCCESS ? PUT("%s", e1 ? "Yes" : "No") : from(r);
    case K_remapped_rows_correctable: case K_remapped_rows_uncorrectable: case K_remapped_rows_pending:
    case K_remapped_rows_failure: {
        unsigned corr = 0, unc = 0, pend = 0, fail = 0;
        r = NV(nvmlDeviceGetRemappedRows, h, &corr, &unc, &pend, &fail);
        if (r != NVML_SUCCESS)
            return from(r);
        if (key == K_remapped_rows_correctable)
            return PUT("%u", corr);
        if (key == K_remapped_rows_uncorrectable)
            return PUT("%u", unc);
        return PUT("%s", (key == K_remapped_rows_pending ? pend : fail) ? "Yes" : "No");
    }
    case K_temperature_gpu:
        return u32v(NV(nvmlDeviceGetTemperature, h, NVML_TEMPERATURE_GPU, &u), &u, out, n);
    case K_temperature_memory: {
        nvmlFieldValue_t fv;
        memset(&fv, 0, sizeof(fv));
        fv.fieldId = NVML_FI_DEV_MEMORY_TEMP;
        r = NV(nvmlDeviceGetFieldValues, h, 1, &fv);
        if (r == NVML_SUCCESS)
            r = fv.nvmlReturn;
        return r == NVML_SUCCESS ? PUT("%u", fv.value.uiVal) : from(r);
    }
    case K_temperature_gpu_tlimit: {
        nvmlMarginTemperature_t mt = {.version = nvmlMarginTemperature_v1};
        r = NV(nvmlDeviceGetMarginTemperature, h, &mt);
        return r == NVML_SUCCESS ? PUT("%d", mt.marginTemperature) : from(r);
    }
    case K_x_temp_shutdown: return temp_threshold(d, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, 1, out, n);
    case K_x_temp_slowdown: return temp_threshold(d, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, 1, out, n);
    case K_x_temp_max_gpu: return temp_threshold(d, NVML_TEMPERATURE_THRESHOLD_GPU_MAX, 1, out, n);
    case K_x_temp_max_mem: return temp_threshold(d, NVML_TEMPERATURE_THRESHOLD_MEM_MAX, 1, out, n);
    case K_x_temp_target: return temp_threshold(d, NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR, 1, out, n);
    case K_x_temp_shutdown_tlimit: return temp_tlimit(d, NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT, out, n);
    case K_x_temp_slowdown_tlimit: return temp_tlimit(d, NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT, out, n);
    case K_x_temp_max_gpu_tlimit: return temp_tlimit(d, NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT, out, n);
    case K_x_temp_max_mem_tlimit: return temp_tlimit(d, NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT, out, n);
    case K_addressing_mode: {
        /* 535 and 550 print N/A (their binaries ask NVML nothing here); 570 answers (A100
           capture) */
        if (g_branch < 570)
            return V_NA;
        nvmlDeviceAddressingMode_t am = {.version = nvmlDeviceAddressingMode_v1};
        r = NV(nvmlDeviceGetAddressingMode, h, &am);
        if (r != NVML_SUCCESS)
            return from(r);
        static const char *const MODES[] = {"None", "HMM", "ATS"};
        return am.value < 3 ? PUT("%s", MODES[am.value]) : V_NA;
    }
    case K_power_draw: case K_power_draw_average: case K_power_draw_instant:
        return watts(NV(nvmlDeviceGetPowerUsage, h, &u), &u, out, n);
    case K_power_limit: return watts(NV(nvmlDeviceGetPowerManagementLimit, h, &u), &u, out, n);
    case K_enforced_power_limit: return watts(NV(nvmlDeviceGetEnforcedPowerLimit, h, &u), &u, out, n);
    case K_power_default_limit: return watts(NV(nvmlDeviceGetPowerManagementDefaultLimit, h, &u), &u, out, n);
    case K_power_min_limit: case K_power_max_limit:
        r = NV(nvmlDeviceGetPowerManagementLimitConstraints, h, &u, &u2);
        return watts(r, key == K_power_min_limit ? &u : &u2, out, n);
    case K_clocks_current_graphics: return clockv(NV(nvmlDeviceGetClockInfo, h, NVML_CLOCK_GRAPHICS, &u), &u, out, n);
    case K_clocks_current_sm: return clockv(NV(nvmlDeviceGetClockInfo, h, NVML_CLOCK_SM, &u), &u, out, n);
    case K_clocks_current_memory: return clockv(NV(nvmlDeviceGetClockInfo, h, NVML_CLOCK_MEM, &u), &u, out, n);
    case K_clocks_current_video: return clockv(NV(nvmlDeviceGetClockInfo, h, NVML_CLOCK_VIDEO, &u), &u, out, n);
    case K_clocks_applications_graphics:
        return clockv(NV(nvmlDeviceGetApplicationsClock, h, NVML_CLOCK_GRAPHICS, &u), &u, out, n);
    case K_clocks_applications_memory:
        return clockv(NV(nvmlDeviceGetApplicationsClock, h, NVML_CLOCK_MEM, &u), &u, out, n);
    case K_clocks_default_applications_graphics:
        return clockv(NV(nvmlDeviceGetDefaultApplicationsClock, h, NVML_CLOCK_GRAPHICS, &u), &u, out, n);
    case K_clocks_default_applications_memory:
        return clockv(NV(nvmlDeviceGetDefaultApplicationsClock, h, NVML_CLOCK_MEM, &u), &u, out, n);
    case K_clocks_max_graphics: case K_x_supported_graphics_clock:
        return clockv(NV(nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_GRAPHICS, &u), &u, out, n);
    case K_clocks_max_sm: return clockv(NV(nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_SM, &u), &u, out, n);
    case K_clocks_max_memory: case K_x_supported_mem_clock:
        return clockv(NV(nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_MEM, &u), &u, out, n);
    case K_x_clocks_max_video: return clockv(NV(nvmlDeviceGetMaxClockInfo, h, NVML_CLOCK_VIDEO, &u), &u, out, n);
    case K_x_clocks_max_boost_graphics:
        return clockv(NV(nvmlDeviceGetMaxCustomerBoostClock, h, NVML_CLOCK_GRAPHICS, &u), &u, out, n);
    case K_fabric_state: case K_fabric_status: case K_fabric_cliqueId: case K_fabric_clusterUuid: {
        nvmlGpuFabricInfo_t f;
        memset(&f, 0, sizeof(f));
        r = NV(nvmlDeviceGetGpuFabricInfo, h, &f);
        if (r != NVML_SUCCESS)
            return from(r);
        if (key == K_fabric_state) {
            static const char *st[] = {"Not Supported", "Not Started", "In Progress", "Completed"};
            return PUT("%s", f.state < 4 ? st[f.state] : "N/A");
        }
        if (key == K_fabric_status)
            return PUT("%s", f.status == NVML_SUCCESS ? "Success" : nvml_error(f.status));
        if (key == K_fabric_cliqueId)
            return PUT("%u", f.cliqueId);
        const unsigned char *c = f.clusterUuid;
        return PUT("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", c[0], c[1], c[2], c[3],
                   c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15]);
    }
    case K_fabric_health_summary: case K_fabric_health_bandwidth: case K_fabric_health_route_recovery_in_progress:
    case K_fabric_health_route_unhealthy: case K_fabric_health_access_timeout_recovery:
    case K_fabric_health_incorrect_configuration: {
        nvmlGpuFabricInfoV_t f;
        memset(&f, 0, sizeof(f));
        f.version = nvmlGpuFabricInfo_v3;
        if (NV(nvmlDeviceGetGpuFabricInfoV, h, &f) != NVML_SUCCESS)
            return V_NA;
        if (key == K_fabric_health_summary) {
            static const char *sum[] = {NULL, "Healthy", "Unhealthy", "Limited Capacity"};
            return f.healthSummary >= 1 && f.healthSummary <= 3 ? PUT("%s", sum[f.healthSummary]) : V_NA;
        }
        if (key == K_fabric_health_incorrect_configuration) /* only "correct" is modelled */
            return NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _INCORRECT_CONFIGURATION) ==
                           NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE ? PUT("None") : V_NA;
        unsigned v = key == K_fabric_health_bandwidth ? NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _DEGRADED_BW)
                   : key == K_fabric_health_route_recovery_in_progress
                       ? NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _ROUTE_RECOVERY)
                   : key == K_fabric_health_route_unhealthy ? NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _ROUTE_UNHEALTHY)
                   : NVML_GPU_FABRIC_HEALTH_GET(f.healthMask, _ACCESS_TIMEOUT_RECOVERY);
        if (v != 1 && v != 2) /* 0: not supported */
            return V_NA;
        if (key == K_fabric_health_bandwidth)
            return PUT("%s", v == 1 ? "Degraded" : "Full");
        return PUT("%s", v == 1 ? "True" : "False");
    }
    default:
        return captured_value(d, key, out, n);
    }
}

/* The unit of each --query-gpu field, by key (from the real CSV header). */
static const char *g_unit[K_COUNT];

static void init_units(void)
{
    for (const struct qfield *f = QUERY_GPU_FIELDS; f->name; f++)
        if (f->key >= 0 && f->key < K_COUNT)
            g_unit[f->key] = f->unit;
    for (const struct qfield *f = g_fields; f->name; f++)
        if (f->key >= 0 && f->key < K_COUNT && (!g_unit[f->key] || !*g_unit[f->key]))
            g_unit[f->key] = f->unit;
}

/* Value with its unit as -q and -q -x print it ("81559 MiB"); "N/A" when unavailable. */
static void value_text(const struct dev *d, int key, const char *suffix, char *out, size_t n)
{
    char v[256];
    enum vr r = key < 0 ? V_NA : value(d, key, v, sizeof(v));
    if (r == V_DEPRECATED) {
        snprintf(out, n, "Requested functionality has been deprecated");
    } else if (r != V_OK) {
        snprintf(out, n, "N/A");
    } else {
        const char *unit = key < K_COUNT && g_unit[key] && *g_unit[key] ? g_unit[key] : NULL;
        if (key == K_x_clocks_max_video || key == K_x_clocks_max_boost_graphics || key == K_x_supported_mem_clock ||
            key == K_x_supported_graphics_clock)
            unit = "MHz";
        snprintf(out, n, "%s%s%s%s", v, unit ? " " : "", unit ? unit : "", suffix ? suffix : "");
    }
}

/* ---- processes ------------------------------------------------------------------------ */

struct proc { unsigned pid; unsigned long long mem; char type[4]; unsigned gi, ci; };

static unsigned get_procs(const struct dev *d, struct proc *out, unsigned cap)
{
    unsigned total = 0;
    nvmlProcessInfo_t buf[64];
    for (int kind = 0; kind < 2; kind++) {
        unsigned cnt = 64;
        nvmlReturn_t r = kind == 0 ? NV(nvmlDeviceGetComputeRunningProcesses_v3, d->h, &cnt, buf)
                                   : NV(nvmlDeviceGetGraphicsRunningProcesses_v3, d->h, &cnt, buf);
        if (r != NVML_SUCCESS)
            continue;
        for (unsigned i = 0; i < cnt && i < 64; i++) {
            unsigned j;
            for (j = 0; j < total; j++)
                if (out[j].pid == buf[i].pid)
                    break;
            if (j < total) {  /* a process with both contexts is "C+G" */
                snprintf(out[j].type, sizeof(out[j].type), "C+G");
                continue;
            }
            if (total >= cap)
                break;
            out[total].pid = buf[i].pid;
            out[total].mem = buf[i].usedGpuMemory;
            out[total].gi = buf[i].gpuInstanceId;
            out[total].ci = buf[i].computeInstanceId;
            snprintf(out[total].type, sizeof(out[total].type), kind == 0 ? "C" : "G");
            total++;
        }
    }
    /* Which MIG device each process runs on, as CUDA's accounting told the model. */
    struct mokka_mig_snapshot mv;
    if (total && mig_read(d->index, &mv) == 0)
        for (unsigned j = 0; j < total; j++)
            mig_of_pid(&mv, out[j].pid, &out[j].gi, &out[j].ci);
    return total;
}

/* The name the real tool shows: NVML's (argv[0] as the process was started, "/root/tools/memhog",
   "./gpu_burn" in the captures, not its 15-byte comm); N/A where NVML has none. */
static void proc_name(unsigned pid, char *out, size_t n)
{
    if (NV(nvmlSystemGetProcessName, pid, out, (unsigned)n) != NVML_SUCCESS)
        snprintf(out, n, "N/A");
}

/* ---- MIG devices in the listings (-L, the default table, -q, -q -x) ----------------------- */

/* BAR1 of a GPU instance, as the model computed it (model/mig.py bar1_bytes). */
static unsigned long long mig_bar1_mib(const struct mokka_mig_snapshot *v, const struct mokka_mig_gi *g)
{
    (void)v;
    return g->bar1_total >> 20;
}

/* "  MIG 3g.40gb     Device  0: (UUID: MIG-...)" under each GPU of -L. */
static void mig_list(unsigned index)
{
    struct mokka_mig_snapshot v;
    if (mig_read(index, &v) != 0 || !v.capable || !v.mode)
        return;
    for (unsigned m = 0; m < v.dev_count; m++)
        printf("  MIG %-12sDevice %2u: (UUID: %s)\n", v.dev[m].profile_name, m, v.dev[m].uuid);
}

/* Is a selected GPU in MIG mode (the default table then has a "MIG devices:" table)? */
static int mig_table_any(void)
{
    int any = 0;
    for (unsigned i = 0; i < g_ndevs; i++)
        any |= g_devs[i].err == NVML_SUCCESS && mig_enabled(g_devs[i].index);
    return any;
}

/* The default table's "MIG devices:" table, when a selected GPU is in MIG mode; 0 when none is;
   `rule`: the branch's frame rule (its width). Layouts: the user guide's 580.65.06 H100 table
   ("Shared Memory-Usage"), a 570.148.08 one before 580, and the records of NVIDIA's 470, 525,
   535 and 550 binaries (tests/fixtures/nvidia-smi-branches/<b>/mig/table.txt): the memory cell is
   22 wide up to 525, 32 in 535, 34 from 550. Compute instances of one GPU instance share its
   memory cells, as the user guide shows. */
static int mig_table(const char *rule)
{
    if (!mig_table_any())
        return 0;
    int width = (int)strlen(rule) - 1;
    int cell = g_branch < 535 ? 22 : g_branch < 550 ? 32 : 34;
    char dashes[64], sep[160], inner[160];
    memset(dashes, '-', (size_t)cell);
    dashes[cell] = '\0';
    snprintf(sep, sizeof(sep), "+------------------+%s+-----------+-----------------------+\n", dashes);
    snprintf(inner, sizeof(inner), "+------------------+%*s+-----------+-----------------------+\n", cell, "");
    printf("%s| MIG devices:%*s|\n%s", rule, width - 15, "", sep);
    if (g_branch >= 580)
        printf("| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |\n"
               "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |\n");
    else if (g_branch >= 570)
        printf("| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|        Shared         |\n"
               "|      ID  ID  Dev |                       BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |\n");
    else if (g_branch >= 535)
        printf("| GPU  GI  CI  MIG |%*s |        Vol|      Shared           |\n"
               "|      ID  ID  Dev |%*s | SM     Unc| CE ENC DEC OFA JPG    |\n", cell - 1, "Memory-Usage", cell - 1,
               "BAR1-Usage");
    else
        printf("| GPU  GI  CI  MIG |         Memory-Usage |        Vol|         Shared        |\n"
               "|      ID  ID  Dev |           BAR1-Usage | SM     Unc| CE  ENC  DEC  OFA  JPG|\n");
    char eq[64];
    memset(eq, '=', (size_t)cell);
    eq[cell] = '\0';
    printf("|                  |%*s|        ECC|                       |\n"
           "|==================+%s+===========+=======================|\n", cell, "", eq);
    unsigned rows = 0;
    for (unsigned i = 0; i < g_ndevs; i++) {
        struct mokka_mig_snapshot v;
        if (g_devs[i].err != NVML_SUCCESS || mig_read(g_devs[i].index, &v) != 0 || !v.mode)
            continue;
        for (unsigned m = 0; m < v.dev_count; m++) {
            const struct mokka_mig_device *dv = &v.dev[m];
            const struct mokka_mig_gi *g = &v.gi[dv->gi_slot];
            int first = m == 0 || v.dev[m - 1].gi_id != dv->gi_id;  /* first of its GPU instance */
            int last = m + 1 == v.dev_count || v.dev[m + 1].gi_id != dv->gi_id;
            char used[24], total[24], b_used[24], b_total[24], mem[48] = "", bar1[48] = "";
            snprintf(used, sizeof(used), "%lluMiB", (unsigned long long)(g->memory_used >> 20));
            snprintf(total, sizeof(total), "%lluMiB", (unsigned long long)(g->memory_total >> 20));
            snprintf(b_used, sizeof(b_used), "%lluMiB", 0ULL);
            snprintf(b_total, sizeof(b_total), "%lluMiB", mig_bar1_mib(&v, g));
            if (!first) {
                snprintf(mem, sizeof(mem), "%*s", cell, "");
                snprintf(bar1, sizeof(bar1), "%*s", cell, "");
            } else if (cell == 22) {
                snprintf(mem, sizeof(mem), "%10s / %8s ", used, total);
                snprintf(bar1, sizeof(bar1), "%10s / %8s ", b_used, b_total);
            } else if (cell == 32) {
                snprintf(mem, sizeof(mem), "%19s / %8s  ", used, total);
                snprintf(bar1, sizeof(bar1), "%19s / %8s  ", b_used, b_total);
            } else {
                snprintf(mem, sizeof(mem), "%19s / %8s    ", used, total);
                snprintf(bar1, sizeof(bar1), g_branch >= 580 ? "%19s / %8s    " : "%21s / %8s  ", b_used, b_total);
            }
            /* Vol. Unc. ECC: the instance's volatile uncorrected SRAM count, NVML's answer on its
               handle (the GPU's: the model keeps no per-instance counts). */
            unsigned long long unc = 0;
            nvmlDevice_t mh;
            char ecc[24] = "N/A";
            if (NV(nvmlDeviceGetMigDeviceHandleByIndex, g_devs[i].h, m, &mh) == NVML_SUCCESS &&
                NV(nvmlDeviceGetMemoryErrorCounter, mh, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
                   NVML_MEMORY_LOCATION_SRAM, &unc) == NVML_SUCCESS)
                snprintf(ecc, sizeof(ecc), "%llu", unc);
            printf("|%3u%5u%4u%4u  |%s| %-3u%6s |%3u%4u%5u%5u%5u |\n", g_devs[i].index, dv->gi_id, dv->ci_id, m, mem,
                   dv->multiprocessor_count, ecc, g->copy_engine_count, g->encoder_count, g->decoder_count,
                   g->ofa_count, g->jpeg_count);
            printf("|                  |%s|           |                       |\n", bar1);
            printf("%s", last ? sep : inner);
            rows++;
        }
    }
    if (!rows)
        printf("|  No MIG devices found%*s|\n%s", width - 24, "", rule);
    return 1;
}

/* -q's "MIG Device" blocks, after "MIG Mode" (labels of a real 610 -q; 580+ say "Shared"). */
/* The skeletons come from boards that report their thresholds either relative to T.Limit (Ada,
   Hopper and later; the 525-550 records) or absolute (A100, T4; the 470 record). A board of the
   other kind gets its own rows in the same places, as the real tool prints them (real 535 on an
   A100 and on an H100 differ in exactly these four rows, text and XML). */
static const struct skel *threshold_row(const struct skel *s, int tlimit_board, int xml)
{
    static const short KEYS[2][4] = {
        {K_x_temp_shutdown, K_x_temp_slowdown, K_x_temp_max_gpu, K_x_temp_max_mem},
        {K_x_temp_shutdown_tlimit, K_x_temp_slowdown_tlimit, K_x_temp_max_gpu_tlimit, K_x_temp_max_mem_tlimit}};
    static const char *NAMES[2][2][4] = { /* [xml][tlimit] */
        {{"GPU Shutdown Temp", "GPU Slowdown Temp", "GPU Max Operating Temp", "Memory Max Operating Temp"},
         {"GPU Shutdown T.Limit Temp", "GPU Slowdown T.Limit Temp", "GPU Max Operating T.Limit Temp",
          "Memory Max Operating T.Limit Temp"}},
        {{"gpu_temp_max_threshold", "gpu_temp_slow_threshold", "gpu_temp_max_gpu_threshold",
          "gpu_temp_max_mem_threshold"},
         {"gpu_temp_max_tlimit_threshold", "gpu_temp_slow_tlimit_threshold", "gpu_temp_max_gpu_tlimit_threshold",
          "gpu_temp_max_mem_tlimit_threshold"}}};
    static struct skel row;
    for (int i = 0; i < 4; i++)
        if (s->key == KEYS[0][i] || s->key == KEYS[1][i]) {
            row = *s;
            row.key = KEYS[tlimit_board][i];
            row.tag = NAMES[xml][tlimit_board][i];
            return &row;
        }
    return s;
}

static void q_line(int depth, const char *label, const char *val);
static void tabs(int n);
static const char *opt_value(int argc, char **argv, int *i, const char *longname, const char *shortname);
static int is_opt(const char *a, const char *longname, const char *shortname);

/* MIG device m of GPU `index`: its volatile uncorrected SRAM count, NVML's answer on its handle
   (as the real tool asks it), into out; "N/A" when NVML has none. */
static void mig_sram_unc(unsigned index, unsigned m, char *out, size_t n)
{
    unsigned long long unc = 0;
    nvmlDevice_t mh;
    snprintf(out, n, "N/A");
    for (unsigned i = 0; i < g_ndevs; i++)
        if (g_devs[i].index == index && g_devs[i].err == NVML_SUCCESS &&
            NV(nvmlDeviceGetMigDeviceHandleByIndex, g_devs[i].h, m, &mh) == NVML_SUCCESS &&
            NV(nvmlDeviceGetMemoryErrorCounter, mh, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
               NVML_MEMORY_LOCATION_SRAM, &unc) == NVML_SUCCESS)
            snprintf(out, n, "%llu", unc);
}

static void mig_query_text(unsigned index)
{
    struct mokka_mig_snapshot v;
    if (mig_read(index, &v) != 0 || !v.capable || !v.mode)
        return;
    const char *fb = g_branch >= 580 ? "Shared FB Memory Usage" : "FB Memory Usage";
    /* 470-550 (their records) say "BAR1 Memory" and list the SRAM count; 555-565 are assumed so */
    const char *bar = g_branch >= 580 ? "Shared BAR1 Memory" : g_branch >= 570 ? "BAR1 Memory Usage" : "BAR1 Memory";
    for (unsigned m = 0; m < v.dev_count; m++) {
        const struct mokka_mig_device *dv = &v.dev[m];
        const struct mokka_mig_gi *g = &v.gi[dv->gi_slot];
        char t[32];
        unsigned long long total = g->memory_total >> 20, used = g->memory_used >> 20, b1 = mig_bar1_mib(&v, g);
        printf("    MIG Device\n");
#define QN(depth, label, fmt, val) (snprintf(t, sizeof(t), fmt, val), q_line(depth, label, t))
        QN(1, "Index", "%u", m);
        QN(1, "GPU Instance ID", "%u", dv->gi_id);
        QN(1, "Compute Instance ID", "%u", dv->ci_id);
        printf("        Device Attributes\n            Shared\n");
        QN(3, "Multiprocessor count", "%u", dv->multiprocessor_count);
        QN(3, "Copy Engine count", "%u", g->copy_engine_count);
        QN(3, "Encoder count", "%u", g->encoder_count);
        QN(3, "Decoder count", "%u", g->decoder_count);
        QN(3, "OFA count", "%u", g->ofa_count);
        QN(3, "JPG count", "%u", g->jpeg_count);
        if (g_branch < 570) {
            char unc[24];
            mig_sram_unc(index, m, unc, sizeof(unc));
            printf("        ECC Errors\n            Volatile\n");
            q_line(3, "SRAM Uncorrectable", unc);
        }
        printf("        %s\n", fb);
        QN(2, "Total", "%llu MiB", total);
        if (g_branch >= 525) /* 470 has no Reserved row in a MIG device's memory (its real -q) */
            QN(2, "Reserved", "%llu MiB", 0ULL);
        QN(2, "Used", "%llu MiB", used);
        QN(2, "Free", "%llu MiB", total > used ? total - used : 0);
        printf("        %s\n", bar);
        QN(2, "Total", "%llu MiB", b1);
        QN(2, "Used", "%llu MiB", 0ULL);
        QN(2, "Free", "%llu MiB", b1);
#undef QN
    }
}

/* -q -x's <mig_devices>: None, or one <mig_device> each (element names of real 535/575 logs). */
static void mig_query_xml(unsigned index, int depth)
{
    struct mokka_mig_snapshot v;
    tabs(depth);
    printf("<mig_devices>\n");
    if (mig_read(index, &v) != 0 || !v.capable || !v.mode || !v.dev_count) {
        tabs(depth + 1);
        printf("None\n");
    }
    for (unsigned m = 0; v.capable && v.mode && m < v.dev_count; m++) {
        const struct mokka_mig_device *dv = &v.dev[m];
        const struct mokka_mig_gi *g = &v.gi[dv->gi_slot];
        unsigned long long total = g->memory_total >> 20, used = g->memory_used >> 20, b1 = mig_bar1_mib(&v, g);
        int d = g_branch < 570 ? depth : depth + 1; /* 470-550 indent <mig_device> as <mig_devices> */
#define XE(dd, tag, fmt, val) (tabs(dd), printf("<%s>" fmt "</%s>\n", tag, val, tag))
        tabs(d); printf("<mig_device>\n");
        XE(d + 1, "index", "%u", m);
        XE(d + 1, "gpu_instance_id", "%u", dv->gi_id);
        XE(d + 1, "compute_instance_id", "%u", dv->ci_id);
        tabs(d + 1); printf("<device_attributes>\n");
        tabs(d + 2); printf("<shared>\n");
        XE(d + 3, "multiprocessor_count", "%u", dv->multiprocessor_count);
        XE(d + 3, "copy_engine_count", "%u", g->copy_engine_count);
        XE(d + 3, "encoder_count", "%u", g->encoder_count);
        XE(d + 3, "decoder_count", "%u", g->decoder_count);
        XE(d + 3, "ofa_count", "%u", g->ofa_count);
        XE(d + 3, "jpg_count", "%u", g->jpeg_count);
        tabs(d + 2); printf("</shared>\n");
        tabs(d + 1); printf("</device_attributes>\n");
        if (g_branch < 570) { /* as in -q */
            char unc[24];
            mig_sram_unc(index, m, unc, sizeof(unc));
            tabs(d + 1); printf("<ecc_error_count>\n");
            tabs(d + 2); printf("<volatile_count>\n");
            XE(d + 3, "sram_uncorrectable", "%s", unc);
            tabs(d + 2); printf("</volatile_count>\n");
            tabs(d + 1); printf("</ecc_error_count>\n");
        }
        tabs(d + 1); printf("<fb_memory_usage>\n");
        XE(d + 2, "total", "%llu MiB", total);
        if (g_branch >= 525) /* as in -q */
            XE(d + 2, "reserved", "%llu MiB", 0ULL);
        XE(d + 2, "used", "%llu MiB", used);
        XE(d + 2, "free", "%llu MiB", total > used ? total - used : 0);
        tabs(d + 1); printf("</fb_memory_usage>\n");
        tabs(d + 1); printf("<bar1_memory_usage>\n");
        XE(d + 2, "total", "%llu MiB", b1);
        XE(d + 2, "used", "%llu MiB", 0ULL);
        XE(d + 2, "free", "%llu MiB", b1);
        tabs(d + 1); printf("</bar1_memory_usage>\n");
        tabs(d); printf("</mig_device>\n");
#undef XE
    }
    tabs(depth);
    printf("</mig_devices>\n");
}

/* ---- MIG commands: -mig 0|1 and `nvidia-smi mig` ------------------------------------------ */

/* Every change goes to the daemon as the vocabulary's `gpu=N mig ...` (docs/mig.md), one instance
   at a time as the real tool calls NVML, so a list stops at its first failure with the instances
   before it made. Messages, layouts and their sources: docs/nvidia-smi.md, "MIG". The exit code
   of a failure is the NVML error's number, as the configuration commands do. */

/* The daemon's answer as NVML's error, and the tool's word for it ("Insufficient Resources":
   what nvidia-smi prints, where nvmlErrorString says more). */
static nvmlReturn_t mig_ctl_error(enum mokka_ctl_status st)
{
    return (nvmlReturn_t)mokka_ctl_nvml_error(st);
}

static const char *mig_error(nvmlReturn_t r)
{
    return r == NVML_ERROR_INSUFFICIENT_RESOURCES ? "Insufficient Resources" : nvml_error(r);
}

static int mig_exit(nvmlReturn_t r)
{
    return r > 0 && r < 255 ? (int)r : EXIT_OTHER;
}

/* The bus id the tool names a GPU by: "00000000:18:00.0". */
static void mig_bus_id(const struct dev *d, char *out, size_t n)
{
    nvmlPciInfo_t pci;
    if (NV(nvmlDeviceGetPciInfo_v3, d->h, &pci) == NVML_SUCCESS)
        snprintf(out, n, "%s", pci.busId);
    else
        lost_bus_id(d->index, out, n);
}

/* -mig 0|1: "Enabled MIG Mode for GPU B" per GPU, then "All done.". A board without MIG is a
   warning the tool moves on from; a change a process holds up waits for a reset, with the
   driver's warning; anything else ends the run. */
static int cmd_mig_mode(unsigned enable)
{
    const char *verb = enable ? "enable" : "disable";
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        char bus[32], line[64], reply[MOKKA_CONTROL_MAX];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            printf("Terminating early due to previous errors.\n");
            return mig_exit(d->err);
        }
        mig_bus_id(d, bus, sizeof(bus));
        struct mokka_mig_snapshot v;
        if (mig_read(d->index, &v) != 0 || !v.capable) {
            printf("Unable to %s MIG Mode for GPU %s: %s\nTreating as warning and moving on.\n", verb, bus,
                   nvml_error(NVML_ERROR_NOT_SUPPORTED));
            continue;
        }
        snprintf(line, sizeof(line), "gpu=%u mig %s", d->index, verb);
        enum mokka_ctl_status st = mokka_control(line, reply, sizeof(reply));
        if (st != MOKKA_CTL_OK) {
            nvmlReturn_t r = mig_ctl_error(st);
            printf("Unable to %s MIG Mode for GPU %s: %s\nTerminating early due to previous errors.\n", verb, bus,
                   mig_error(r));
            return mig_exit(r);
        }
        if (!strcmp(reply, "pending in_use"))
            printf("Warning: MIG mode is in pending %s state for GPU %s:%s\n%s is currently being used by one or more "
                   "other processes (e.g. CUDA application or a monitoring application such as another instance of "
                   "nvidia-smi). Please first kill all processes using the device and retry the command or reboot "
                   "the system to make MIG mode effective.\n", verb, bus, nvml_error(NVML_ERROR_IN_USE), bus);
        else
            printf("%s MIG Mode for GPU %s\n", enable ? "Enabled" : "Disabled", bus);
    }
    printf("All done.\n");
    return 0;
}

enum mig_action { MA_NONE, MA_LGIP, MA_LGIPP, MA_LCIP, MA_CGI, MA_CCI, MA_LGI, MA_LCI, MA_DGI, MA_DCI };

struct mig_cmd {
    enum mig_action action;
    const char *list;           /* -cgi / -cci: profiles, comma-separated; NULL: -cci's default */
    int default_ci;             /* -C */
    int gi[MOKKA_MAX_GPU_INSTANCES * 2], ngi;   /* -gi: ids; none given: every one */
    int ci[MOKKA_MAX_MIG_DEVICES * 2], nci;     /* -ci */
};

static int mig_wanted(const int *ids, int n, unsigned id)
{
    if (!n)
        return 1;
    for (int k = 0; k < n; k++)
        if ((unsigned)ids[k] == id)
            return 1;
    return 0;
}

/* The GPU instances in the order the tool lists them: by profile (NVML's index), then id. */
static unsigned mig_gi_order(const struct mokka_mig_snapshot *v, const struct mig_cmd *c, unsigned *slots)
{
    unsigned n = 0;
    for (unsigned k = 0; k < v->gi_count; k++)
        if (mig_wanted(c->gi, c->ngi, v->gi[k].id))
            slots[n++] = k;
    for (unsigned a = 1; a < n; a++)
        for (unsigned b = a; b > 0; b--) {
            const struct mokka_mig_gi *x = &v->gi[slots[b - 1]], *y = &v->gi[slots[b]];
            if (x->profile < y->profile || (x->profile == y->profile && x->id <= y->id))
                break;
            unsigned t = slots[b - 1];
            slots[b - 1] = slots[b];
            slots[b] = t;
        }
    return n;
}

/* Its compute instances (MIG devices) in the order the tool lists them: by profile, then id. */
static unsigned mig_ci_order(const struct mokka_mig_snapshot *v, unsigned gi_id, const struct mig_cmd *c, unsigned *devs)
{
    unsigned n = 0;
    for (unsigned m = 0; m < v->dev_count; m++)
        if (v->dev[m].gi_id == gi_id && mig_wanted(c->ci, c->nci, v->dev[m].ci_id))
            devs[n++] = m;
    for (unsigned a = 1; a < n; a++)
        for (unsigned b = a; b > 0; b--) {
            const struct mokka_mig_device *x = &v->dev[devs[b - 1]], *y = &v->dev[devs[b]];
            if (x->profile < y->profile || (x->profile == y->profile && x->ci_id <= y->ci_id))
                break;
            unsigned t = devs[b - 1];
            devs[b - 1] = devs[b];
            devs[b] = t;
        }
    return n;
}

static const struct mokka_mig_gi *mig_gi_by_id(const struct mokka_mig_snapshot *v, unsigned id)
{
    for (unsigned k = 0; k < v->gi_count; k++)
        if (v->gi[k].id == id)
            return &v->gi[k];
    return NULL;
}

static const struct mokka_mig_device *mig_dev_by_id(const struct mokka_mig_snapshot *v, unsigned gi, unsigned ci)
{
    for (unsigned m = 0; m < v->dev_count; m++)
        if (v->dev[m].gi_id == gi && v->dev[m].ci_id == ci)
            return &v->dev[m];
    return NULL;
}

/* One profile as the user gave it, for the vocabulary: "3g.40gb", "MIG 3g.40gb", "9"; 0 if it
   cannot be one (the daemon would refuse it too, but nothing odd is sent). */
static int mig_profile_word(const char *given, char *out, size_t n)
{
    if (!strncmp(given, "MIG ", 4))
        given += 4;
    size_t l = strlen(given);
    if (!l || l >= n || strspn(given, "0123456789abcdefghijklmnopqrstuvwxyz.+:") != l)
        return 0;
    memcpy(out, given, l + 1);
    return 1;
}

static unsigned mig_first_number(const char *reply, const char *key)
{
    const char *p = strstr(reply, key);
    return p ? (unsigned)strtoul(p + strlen(key), NULL, 10) : 0;
}

/* -cgi LIST [-C] on one GPU. */
static int mig_create_gis(const struct dev *d, const struct mig_cmd *c)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", c->list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char word[48], line[96], reply[MOKKA_CONTROL_MAX];
        nvmlReturn_t r = NVML_ERROR_INVALID_ARGUMENT;
        if (mig_profile_word(tok, word, sizeof(word))) {
            snprintf(line, sizeof(line), "gpu=%u mig %s %s", d->index, c->default_ci ? "create" : "create_gi", word);
            r = mig_ctl_error(mokka_control(line, reply, sizeof(reply)));
        }
        if (r != NVML_SUCCESS) {
            printf("Unable to create a GPU instance on GPU %2u using profile %s: %s\n"
                   "Failed to create GPU instances: %s\n", d->index, tok, mig_error(r), mig_error(r));
            return mig_exit(r);
        }
        unsigned gi = mig_first_number(reply, "gi=");
        struct mokka_mig_snapshot v;
        mig_read(d->index, &v);
        const struct mokka_mig_gi *g = mig_gi_by_id(&v, gi);
        printf("Successfully created GPU instance ID %2u on GPU %2u using profile MIG %s (ID %2u)\n", gi, d->index,
               g ? g->profile_name : word, g ? g->profile_id : 0);
        const struct mokka_mig_device *dv = c->default_ci ? mig_dev_by_id(&v, gi, mig_first_number(reply, "ci=")) : NULL;
        if (dv)
            printf("Successfully created compute instance ID %2u on GPU %2u GPU instance ID %2u using profile MIG %s "
                   "(ID %2u)\n", dv->ci_id, d->index, gi, dv->profile_name, dv->profile);
    }
    return 0;
}

/* -cci [LIST] in each GPU instance -gi names (all without it); no LIST: the full-size profile. */
static int mig_create_cis(const struct dev *d, const struct mig_cmd *c, const struct mokka_mig_snapshot *v0)
{
    unsigned slots[MOKKA_MAX_GPU_INSTANCES], n = mig_gi_order(v0, c, slots);
    unsigned gis[MOKKA_MAX_GPU_INSTANCES];
    for (unsigned k = 0; k < n; k++)
        gis[k] = v0->gi[slots[k]].id;
    if (!n) {
        printf("No GPU instances found: %s\n", nvml_error(NVML_ERROR_NOT_FOUND));
        return EXIT_NOT_FOUND;
    }
    for (unsigned k = 0; k < n; k++) {
        char buf[1024];
        if (c->list) {
            snprintf(buf, sizeof(buf), "%s", c->list);
        } else { /* the GPU instance's own full-size compute profile, which -lcip marks with '*' */
            const struct mokka_mig_profile *p = mig_profile(v0->gi[slots[k]].profile);
            unsigned best = 0;
            for (unsigned j = 0; p && j < p->ci_profile_count; j++)
                if (p->ci_profiles[j].slice_count > p->ci_profiles[best].slice_count)
                    best = j;
            snprintf(buf, sizeof(buf), "%u", p && p->ci_profile_count ? p->ci_profiles[best].id : 0);
        }
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char word[48], line[96], reply[MOKKA_CONTROL_MAX];
            nvmlReturn_t r = NVML_ERROR_INVALID_ARGUMENT;
            if (mig_profile_word(tok, word, sizeof(word))) {
                snprintf(line, sizeof(line), "gpu=%u mig create_ci %u %s", d->index, gis[k], word);
                r = mig_ctl_error(mokka_control(line, reply, sizeof(reply)));
            }
            if (r != NVML_SUCCESS) {
                printf("Unable to create a compute instance on GPU %2u GPU instance ID %2u using profile %s: %s\n"
                       "Failed to create compute instances: %s\n", d->index, gis[k], tok, mig_error(r), mig_error(r));
                return mig_exit(r);
            }
            struct mokka_mig_snapshot v;
            mig_read(d->index, &v);
            const struct mokka_mig_device *dv = mig_dev_by_id(&v, gis[k], mig_first_number(reply, "ci="));
            printf("Successfully created compute instance ID %2u on GPU %2u GPU instance ID %2u using profile MIG %s "
                   "(ID %2u)\n", dv ? dv->ci_id : 0, d->index, gis[k], dv ? dv->profile_name : word,
                   dv ? dv->profile : 0);
        }
    }
    return 0;
}

/* -dci, -dgi: each instance -gi/-ci name (all without them), in listing order. */
static int mig_destroy(const struct dev *d, const struct mig_cmd *c, const struct mokka_mig_snapshot *v)
{
    unsigned slots[MOKKA_MAX_GPU_INSTANCES], n = mig_gi_order(v, c, slots), done = 0;
    for (unsigned k = 0; k < n; k++) {
        const struct mokka_mig_gi *g = &v->gi[slots[k]];
        char line[96], reply[MOKKA_CONTROL_MAX];
        if (c->action == MA_DGI) {
            snprintf(line, sizeof(line), "gpu=%u mig destroy_gi %u", d->index, g->id);
            nvmlReturn_t r = mig_ctl_error(mokka_control(line, reply, sizeof(reply)));
            if (r != NVML_SUCCESS) {
                printf("Unable to destroy GPU instance ID %2u from GPU %2u: %s\nFailed to destroy GPU instances: %s\n",
                       g->id, d->index, mig_error(r), mig_error(r));
                return mig_exit(r);
            }
            printf("Successfully destroyed GPU instance ID %2u from GPU %2u\n", g->id, d->index);
            done++;
            continue;
        }
        unsigned devs[MOKKA_MAX_MIG_DEVICES], nd = mig_ci_order(v, g->id, c, devs);
        for (unsigned j = 0; j < nd; j++) {
            const struct mokka_mig_device *dv = &v->dev[devs[j]];
            snprintf(line, sizeof(line), "gpu=%u mig destroy_ci %u %u", d->index, g->id, dv->ci_id);
            nvmlReturn_t r = mig_ctl_error(mokka_control(line, reply, sizeof(reply)));
            if (r != NVML_SUCCESS) {
                printf("Unable to destroy compute instance ID %2u from GPU %2u GPU instance ID %2u: %s\n"
                       "Failed to destroy compute instances: %s\n", dv->ci_id, d->index, g->id, mig_error(r),
                       mig_error(r));
                return mig_exit(r);
            }
            printf("Successfully destroyed compute instance ID %2u from GPU %2u GPU instance ID %2u\n", dv->ci_id,
                   d->index, g->id);
            done++;
        }
    }
    if (!done) {
        printf(c->action == MA_DGI ? "No GPU instances found: %s\n" : "No compute instances found: %s\n",
               nvml_error(NVML_ERROR_NOT_FOUND));
        return EXIT_NOT_FOUND;
    }
    return 0;
}

static const char RULE_LGIP_WIDE[] = "+-------------------------------------------------------------------------------+\n";
static const char RULE_LGI_WIDE[] = "+---------------------------------------------------------+\n";
/* Up to 550 (the records of NVIDIA's 470-550 binaries, tests/fixtures/nvidia-smi-branches/<b>/mig)
   the Name columns of -lgip and -lgi are two narrower; 570 and later (the captures) print the wide
   ones. Which 555-565 print is not recorded: they take the older layout. */
static const char RULE_LGIP_NARROW[] = "+-----------------------------------------------------------------------------+\n";
static const char RULE_LGI_NARROW[] = "+-------------------------------------------------------+\n";
#define MIG_NARROW (g_branch < 570)
#define RULE_LGIP (MIG_NARROW ? RULE_LGIP_NARROW : RULE_LGIP_WIDE)
#define RULE_LGI (MIG_NARROW ? RULE_LGI_NARROW : RULE_LGI_WIDE)
static const char RULE_LCI[] = "+--------------------------------------------------------------------+\n";
static const char RULE_LCIP[] = "+--------------------------------------------------------------------------------------+\n";

/* The listings: tables of the layouts real 570/580 drivers print (docs/nvidia-smi.md, "MIG"). */
static unsigned mig_list_rows(const struct dev *d, const struct mig_cmd *c, const struct mokka_mig_snapshot *v, int print)
{
    unsigned rows = 0;
    if (c->action == MA_LGIP || c->action == MA_LGIPP) {
        for (unsigned k = 0; k < g_mig_profile_count; k++, rows++) {
            const struct mokka_mig_profile *p = &g_mig_profiles[k];
            char a[64] = "", b[16];
            /* 470's NVML ends at NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 (7): its tool never asks
               for the later profiles (the A100's 1g.10gb, index 9, is not in its record). */
            if (g_branch < 525 && p->index >= 8) {
                rows--;
                continue;
            }
            if (!print)
                continue;
            if (c->action == MA_LGIPP) {
                size_t o = 0;
                for (unsigned j = 0; j < p->placement_count && o < sizeof(a); j++)
                    o += (size_t)snprintf(a + o, sizeof(a) - o, "%s%u", j ? "," : "", p->placements[j]);
                printf("GPU %2u Profile ID %2u Placement%s: {%s}:%u\n", d->index, p->id,
                       p->placement_count > 1 ? "s" : " ", a, p->placement_size);
                continue;
            }
            snprintf(a, sizeof(a), "%u/%u", v->remaining[k], p->instance_count);
            snprintf(b, sizeof(b), "%.2f", (double)p->memory_mib / 1024.0);
            printf("|%4u  MIG %-*s%3u     %-11s%-11s%-7s%-7u%-6u%-4u|\n", d->index, MIG_NARROW ? 13 : 15, p->name,
                   p->id, a, b, p->p2p ? "Yes" : "No", p->multiprocessor_count, p->decoder_count, p->encoder_count);
            printf("|%*s%-6u%-6u%-4u|\n%s", MIG_NARROW ? 61 : 63, "", p->copy_engine_count, p->jpeg_count,
                   p->ofa_count, RULE_LGIP);
        }
        return rows;
    }
    unsigned slots[MOKKA_MAX_GPU_INSTANCES], n = mig_gi_order(v, c, slots);
    for (unsigned k = 0; k < n; k++) {
        const struct mokka_mig_gi *g = &v->gi[slots[k]];
        char place[16];
        if (c->action == MA_LGI) {
            snprintf(place, sizeof(place), "%u:%u", g->start, g->size);
            if (print)
                printf("|%4u  MIG %-*s%3u%9u          %-8s|\n%s", d->index, MIG_NARROW ? 15 : 17, g->profile_name,
                       g->profile_id, g->id, place, RULE_LGI);
            rows++;
        } else if (c->action == MA_LCI) {
            unsigned devs[MOKKA_MAX_MIG_DEVICES], nd = mig_ci_order(v, g->id, c, devs);
            for (unsigned j = 0; j < nd; j++, rows++) {
                const struct mokka_mig_device *dv = &v->dev[devs[j]];
                snprintf(place, sizeof(place), "%u:%u", dv->start, dv->size);
                if (print)
                    printf("|%4u%7u       MIG %-15s%3u%10u          %-8s|\n%s", d->index, g->id, dv->profile_name,
                           dv->profile, dv->ci_id, place, RULE_LCI);
            }
        } else if (c->action == MA_LCIP) {
            const struct mokka_mig_profile *p = mig_profile(g->profile);
            unsigned best = 0;
            for (unsigned j = 0; p && j < p->ci_profile_count; j++)
                if (p->ci_profiles[j].slice_count > p->ci_profiles[best].slice_count)
                    best = j;
            for (unsigned j = 0; p && j < p->ci_profile_count; j++, rows++) {
                const struct mokka_mig_ci_profile *cp = &p->ci_profiles[j];
                char free_total[16];
                snprintf(free_total, sizeof(free_total), "%u/%u", g->ci_remaining[j], cp->instance_count);
                if (!print)
                    continue;
                printf("|%4u%7u       MIG %-15s%3u%c     %-12s%4u%9u%6u%6u   |\n", d->index, g->id, cp->name, cp->id,
                       j == best ? '*' : ' ', free_total, cp->multiprocessor_count, g->decoder_count, g->encoder_count,
                       g->ofa_count);
                printf("|%62s%9u%6u%9s|\n%s", "", g->copy_engine_count, g->jpeg_count, "", RULE_LCIP);
            }
        }
    }
    return rows;
}

static int cmd_mig(const struct mig_cmd *c)
{
    /* GPUs in MIG mode among those selected; the rest are not MIG devices to this command. */
    struct dev *sel[MOKKA_MAX_GPUS];
    unsigned nsel = 0, capable = 0;
    for (unsigned i = 0; i < g_ndevs; i++) {
        struct mokka_mig_snapshot v;
        if (g_devs[i].err != NVML_SUCCESS || mig_read(g_devs[i].index, &v) != 0 || !v.capable)
            continue;
        capable++;
        if (v.mode)
            sel[nsel++] = &g_devs[i];
    }
    if (!nsel) {
        printf(capable ? "No MIG-enabled devices found.\n" : "No MIG-supported devices found.\n");
        return EXIT_NOT_FOUND;
    }
    if (c->action == MA_CGI || c->action == MA_CCI || c->action == MA_DGI || c->action == MA_DCI) {
        for (unsigned i = 0; i < nsel; i++) {
            struct mokka_mig_snapshot v;
            mig_read(sel[i]->index, &v);
            int rc = c->action == MA_CGI ? mig_create_gis(sel[i], c)
                   : c->action == MA_CCI ? mig_create_cis(sel[i], c, &v)
                                         : mig_destroy(sel[i], c, &v);
            if (rc)
                return rc;
        }
        return 0;
    }
    /* A listing with nothing in it is an error line, not an empty table: count first. */
    unsigned rows = 0;
    for (unsigned i = 0; i < nsel; i++) {
        struct mokka_mig_snapshot v;
        mig_read(sel[i]->index, &v);
        rows += mig_list_rows(sel[i], c, &v, 0);
    }
    if (!rows) {
        printf(c->action == MA_LCI ? "No compute instances found: %s\n" : "No GPU instances found: %s\n",
               nvml_error(NVML_ERROR_NOT_FOUND));
        return EXIT_NOT_FOUND;
    }
    if (c->action == MA_LGIP && MIG_NARROW)
        printf("%s| GPU instance profiles:                                                      |\n"
               "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |\n"
               "|                              Free/Total   GiB              CE    JPEG  OFA  |\n"
               "|=============================================================================|\n", RULE_LGIP);
    else if (c->action == MA_LGI && MIG_NARROW)
        printf("%s| GPU instances:                                        |\n"
               "| GPU   Name             Profile  Instance   Placement  |\n"
               "|                          ID       ID       Start:Size |\n"
               "|=======================================================|\n", RULE_LGI);
    else if (c->action == MA_LGIP)
        printf("%s| GPU instance profiles:                                                        |\n"
               "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |\n"
               "|                                Free/Total   GiB              CE    JPEG  OFA  |\n"
               "|===============================================================================|\n", RULE_LGIP);
    else if (c->action == MA_LGI)
        printf("%s| GPU instances:                                          |\n"
               "| GPU   Name               Profile  Instance   Placement  |\n"
               "|                            ID       ID       Start:Size |\n"
               "|=========================================================|\n", RULE_LGI);
    else if (c->action == MA_LCI)
        printf("%s| Compute instances:                                                 |\n"
               "| GPU     GPU       Name             Profile   Instance   Placement  |\n"
               "|       Instance                       ID        ID       Start:Size |\n"
               "|         ID                                                         |\n"
               "|====================================================================|\n", RULE_LCI);
    else if (c->action == MA_LCIP)
        printf("%s| Compute instance profiles:                                                           |\n"
               "| GPU     GPU       Name             Profile  Instances   Exclusive       Shared       |\n"
               "|       Instance                       ID     Free/Total     SM       DEC   ENC   OFA  |\n"
               "|         ID                                                          CE    JPEG       |\n"
               "|======================================================================================|\n",
               RULE_LCIP);
    for (unsigned i = 0; i < nsel; i++) {
        struct mokka_mig_snapshot v;
        mig_read(sel[i]->index, &v);
        mig_list_rows(sel[i], c, &v, 1);
    }
    return 0;
}

/* -gi / -ci: ids, comma-separated. */
static int mig_parse_ids(const char *text, int *ids, int cap)
{
    char buf[256];
    int n = 0;
    if (!text || !*text || strlen(text) >= sizeof(buf))
        return -1;
    snprintf(buf, sizeof(buf), "%s", text);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!*t || strspn(t, "0123456789") != strlen(t) || strlen(t) > 3 || n >= cap)
            return -1;
        ids[n++] = atoi(t);
    }
    return n ? n : -1;
}

/* `nvidia-smi mig ...` (argv[1] == "mig"): 0 and *out filled, or an exit code after the message. */
static int mig_parse(int argc, char **argv, struct mig_cmd *c, const char **ids)
{
    static const struct { const char *s, *l; enum mig_action a; } ACTIONS[] = {
        {"-lgip", "--list-gpu-instance-profiles", MA_LGIP},
        {"-lgipp", "--list-gpu-instance-possible-placements", MA_LGIPP},
        {"-lcip", "--list-compute-instance-profiles", MA_LCIP},
        {"-lgi", "--list-gpu-instances", MA_LGI},
        {"-lci", "--list-compute-instances", MA_LCI},
        {"-dgi", "--destroy-gpu-instance", MA_DGI},
        {"-dci", "--destroy-compute-instance", MA_DCI},
    };
    memset(c, 0, sizeof(*c));
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v;
        enum mig_action act = MA_NONE;
        for (size_t k = 0; k < sizeof(ACTIONS) / sizeof(ACTIONS[0]); k++)
            if (!strcmp(a, ACTIONS[k].s) || !strcmp(a, ACTIONS[k].l))
                act = ACTIONS[k].a;
        if (act == MA_NONE && (is_opt(a, "--create-gpu-instance", "-cgi"))) {
            act = MA_CGI;
            c->list = opt_value(argc, argv, &i, "--create-gpu-instance", "-cgi");
            if (!c->list || !*c->list)
                return -1;
        } else if (act == MA_NONE && (!strcmp(a, "-cci") || !strcmp(a, "--create-compute-instance"))) {
            act = MA_CCI; /* the list is optional: without one, each GPU instance's full-size profile */
            if (i + 1 < argc && argv[i + 1][0] != '-')
                c->list = argv[++i];
        } else if (act == MA_NONE && (!strncmp(a, "-cci=", 5) || !strncmp(a, "--create-compute-instance=", 26))) {
            act = MA_CCI;
            c->list = strchr(a, '=') + 1;
        }
        if (act != MA_NONE) {
            if (c->action != MA_NONE)
                return -1; /* one action a run */
            c->action = act;
        } else if (!strcmp(a, "-C") || !strcmp(a, "--default-compute-instance")) {
            c->default_ci = 1;
        } else if (is_opt(a, "--gpu-instance-id", "-gi")) {
            v = opt_value(argc, argv, &i, "--gpu-instance-id", "-gi");
            if ((c->ngi = mig_parse_ids(v, c->gi, (int)(sizeof(c->gi) / sizeof(c->gi[0])))) < 0)
                return -1;
        } else if (is_opt(a, "--compute-instance-id", "-ci")) {
            v = opt_value(argc, argv, &i, "--compute-instance-id", "-ci");
            if ((c->nci = mig_parse_ids(v, c->ci, (int)(sizeof(c->ci) / sizeof(c->ci[0])))) < 0)
                return -1;
        } else if (is_opt(a, "--id", "-i")) {
            *ids = opt_value(argc, argv, &i, "--id", "-i");
            if (!*ids || !**ids)
                return -1;
        } else {
            return -1;
        }
    }
    if (c->action == MA_NONE || (c->default_ci && c->action != MA_CGI) || (c->list && !*c->list))
        return -1;
    return 0;
}

/* ---- output modes --------------------------------------------------------------------- */

static int g_exit;

static int check_handles(int abort_all)
{
    int bad = 0;
    for (unsigned i = 0; i < g_ndevs; i++)
        if (g_devs[i].err != NVML_SUCCESS) {
            bad = 1;
            if (abort_all)
                print_handle_error(&g_devs[i]);
        }
    if (bad)
        g_exit = g_devs[0].err == NVML_ERROR_GPU_IS_LOST ? EXIT_LOST : EXIT_LOST;
    return bad;
}

static int cmd_list(void)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            g_exit = EXIT_LOST;
            continue;
        }
        char name[96] = "N/A", uuid[96] = "N/A";
        NV(nvmlDeviceGetName, d->h, name, sizeof(name));
        NV(nvmlDeviceGetUUID, d->h, uuid, sizeof(uuid));
        printf("GPU %u: %s (UUID: %s)\n", d->index, name, uuid);
        mig_list(d->index);
    }
    return g_exit;
}

static int cmd_version(void)
{
    char nvml[96] = "N/A";
    NV(nvmlSystemGetNVMLVersion, nvml, sizeof(nvml));
    /* NVML says "13.590.48.01" (CUDA major first); the tool prints the driver's "590.48" */
    char *first = strchr(nvml, '.');
    if (first && strchr(first + 1, '.')) {
        memmove(nvml, first + 1, strlen(first + 1) + 1);
        char *dot = strchr(nvml, '.');
        char *second = dot ? strchr(dot + 1, '.') : NULL;
        if (second)
            *second = 0;
    }
    printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n",
           g_driver, nvml, g_driver, g_cuda);
    return 0;
}

static void fit(char *s, size_t width, int keep_tail)
{
    size_t l = strlen(s);
    if (l <= width)
        return;
    if (keep_tail) {  /* ".../usr/lib/firefox/firefox" */
        memmove(s + 3, s + l - (width - 3), width - 3 + 1);
        memcpy(s, "...", 3);
    } else {
        strcpy(s + width - 3, "...");
    }
}

/* The frame of the default table: a recorded branch's (before 570: 79 columns up to 525, 89 in
   535, 91 from 550), else the 91 columns of the captures. */
static void table(void)
{
    const struct frame *fr = g_rec ? &g_rec->table : NULL;
    int wide = !fr || fr->width == 91, narrow = fr && fr->width == 79;
    const char *rule = fr ? fr->rule : "+-----------------------------------------------------------------------------------------+\n";
    const char *grid = fr ? fr->grid : g_branch >= 580 ? "+-----------------------------------------+------------------------+----------------------+\n"
                                       : "|-----------------------------------------+------------------------+----------------------+\n";
    char ts[64];
    timestamp(ts, sizeof(ts), 0);
    printf("%s%*s\n", ts, fr ? fr->ts_pad : 7, "");
    printf("%s", rule);
    printf("| NVIDIA-SMI %-*sDriver Version: %-*sCUDA Version: %-*s|\n", fr ? fr->w_smi : 23, g_driver,
           fr ? fr->w_drv : 15, g_driver, fr ? fr->w_cuda : 9, g_cuda);
    printf("%s", grid);
    printf("%s", fr ? fr->head :
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n"
           "|                                         |                        |               MIG M. |\n"
           "|=========================================+========================+======================|\n");
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        char name[96] = "N/A", pers[8] = "N/A", bus[32] = "N/A", disp[8] = "N/A", ecc[24] = "N/A";
        char fan[8] = "N/A", temp[8] = "N/A", perf[8] = "N/A", pw[16] = "N/A", cap[16] = "N/A";
        char mused[24] = "N/A", mtot[24] = "N/A", util[8] = "N/A", cm[24] = "N/A", mig[16] = "N/A", v[96];
        nvmlEnableState_t e, pend;
        unsigned u;
        if (value(d, K_name, name, sizeof(name)) != V_OK)
            snprintf(name, sizeof(name), "N/A");
        fit(name, narrow ? 18 : 30, 0);
        if (NV(nvmlDeviceGetPersistenceMode, d->h, &e) == NVML_SUCCESS)
            snprintf(pers, sizeof(pers), "%s", e ? "On" : "Off");
        if (value(d, K_pci_bus_id, v, sizeof(v)) == V_OK)
            snprintf(bus, sizeof(bus), "%s", v);
        if (NV(nvmlDeviceGetDisplayActive, d->h, &e) == NVML_SUCCESS)
            snprintf(disp, sizeof(disp), "%s", e ? "On" : "Off");
        else
            snprintf(disp, sizeof(disp), "Off");
        struct mokka_mig_snapshot mv;
        int mig_capable = mig_read(d->index, &mv) == 0 && mv.capable;
        int ecc_on = NV(nvmlDeviceGetEccMode, d->h, &e, &pend) == NVML_SUCCESS && e;
        if (ecc_on && mig_capable && mv.mode)
            snprintf(ecc, sizeof(ecc), "On"); /* MIG mode: the counts are the MIG devices' */
        else if (ecc_on && value(d, K_ecc_errors_uncorrected_volatile_total, v, sizeof(v)) == V_OK)
            snprintf(ecc, sizeof(ecc), "%s", v);
        if (NV(nvmlDeviceGetFanSpeed, d->h, &u) == NVML_SUCCESS)
            snprintf(fan, sizeof(fan), "%u%%", u);
        if (NV(nvmlDeviceGetTemperature, d->h, NVML_TEMPERATURE_GPU, &u) == NVML_SUCCESS)
            snprintf(temp, sizeof(temp), "%uC", u);
        if (value(d, K_pstate, v, sizeof(v)) == V_OK)
            snprintf(perf, sizeof(perf), "%s", v);
        if (NV(nvmlDeviceGetPowerUsage, d->h, &u) == NVML_SUCCESS)
            snprintf(pw, sizeof(pw), "%uW", u / 1000);
        if (NV(nvmlDeviceGetEnforcedPowerLimit, d->h, &u) == NVML_SUCCESS)
            snprintf(cap, sizeof(cap), "%uW", u / 1000);
        if (value(d, K_memory_used, v, sizeof(v)) == V_OK)
            snprintf(mused, sizeof(mused), "%sMiB", v);
        if (value(d, K_memory_total, v, sizeof(v)) == V_OK)
            snprintf(mtot, sizeof(mtot), "%sMiB", v);
        if (mig_capable)
            snprintf(mig, sizeof(mig), "%s", mv.mode ? "Enabled" : "Disabled");
        if (value(d, K_utilization_gpu, v, sizeof(v)) == V_OK) /* N/A in MIG mode */
            snprintf(util, sizeof(util), "%s%%", v);
        if (NV(nvmlDeviceGetComputeMode, d->h, (nvmlComputeMode_t *)&u) == NVML_SUCCESS) {
            static const char *names[] = {"Default", "E. Thread", "Prohibited", "E. Process"};
            snprintf(cm, sizeof(cm), "%s", u < 4 ? names[u] : "Unknown");
        }
        if (wide) {
            printf("|%4u  %-31s%-3s |   %-16s %3s |%21s |\n", d->index, name, pers, bus, disp, ecc);
            printf("|%4s %5s    %-3s%15s / %5s |%11s / %9s |%8s%13s |\n", fan, temp, perf, pw, cap, mused, mtot, util, cm);
            printf("|                                         |                        |%21s |\n", mig);
        } else if (narrow) { /* 470, 525 */
            printf("|%4u  %-18s  %-3s  | %-16s %3s |%21s |\n", d->index, name, pers, bus, disp, ecc);
            printf("|%4s %5s    %-3s%6s / %4s |%10s / %8s |%8s%13s |\n", fan, temp, perf, pw, cap, mused, mtot, util, cm);
            printf("|                               |                      |%21s |\n", mig);
        } else { /* 535 */
            printf("|%4u  %-31s%-3s | %-16s %3s |%21s |\n", d->index, name, pers, bus, disp, ecc);
            printf("|%4s %5s    %-3s%16s / %4s |%10s / %8s |%8s%13s |\n", fan, temp, perf, pw, cap, mused, mtot, util, cm);
            printf("|                                         |                      |%21s |\n", mig);
        }
        printf("%s", fr ? fr->row_rule : "+-----------------------------------------+------------------------+----------------------+\n");
    }
    const char *gap = fr ? fr->gap : g_branch >= 560 ? "\n" : "                                                                                         \n";
    /* Up to 565 the real tool puts an empty line between the GPUs and a MIG table, and the
       branch's gap after it (the 470-550 records). */
    printf("%s", g_branch < 570 && mig_table_any() ? "\n" : gap);
    if (mig_table(rule)) /* between the GPUs and the processes, with a gap of its own */
        printf("%s", gap);
    printf("%s", rule);
    if (fr) {
        printf("%s", fr->procs_head);
    } else {
        printf("| Processes:                                                                              |\n");
        if (g_branch >= 570)
            printf("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n"
                   "|        ID   ID                                                               Usage      |\n");
        else
            printf("|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |\n"
                   "|        ID   ID                                                               Usage      |\n");
        printf("|=========================================================================================|\n");
    }
    int width = fr ? fr->width - 49 : g_branch >= 570 ? 36 : 42; /* the process name's column */
    int any = 0;
    for (unsigned i = 0; i < g_ndevs; i++) {
        struct proc ps[64];
        unsigned np = get_procs(&g_devs[i], ps, 64);
        for (unsigned j = 0; j < np; j++) {
            char name[256], gi[8] = "N/A", ci[8] = "N/A", mem[24] = "N/A";
            proc_name(ps[j].pid, name, sizeof(name));
            if (ps[j].gi != 0xFFFFFFFFu) {
                snprintf(gi, sizeof(gi), "%u", ps[j].gi);
                snprintf(ci, sizeof(ci), "%u", ps[j].ci);
            }
            if (ps[j].mem != (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
                snprintf(mem, sizeof(mem), "%lluMiB", ps[j].mem >> 20);
            if (ps[j].gi != 0xFFFFFFFFu) { /* a MIG process: ids in their own columns (user guide, 580) */
                fit(name, width, 1);
                if (g_branch >= 570)
                    printf("|%5u%5u%5u %16u %6s   %-36s%10s |\n", g_devs[i].index, ps[j].gi, ps[j].ci, ps[j].pid,
                           ps[j].type, name, mem);
                else
                    printf("|%5u%5u%5u %10u %6s   %-*s%10s |\n", g_devs[i].index, ps[j].gi, ps[j].ci, ps[j].pid,
                           ps[j].type, width, name, mem);
            } else if (g_branch >= 570) {
                fit(name, 36, 1);
                printf("|%5u %5s%5s%16u %6s   %-36s%10s |\n", g_devs[i].index, gi, ci, ps[j].pid, ps[j].type, name, mem);
            } else {
                fit(name, width, 1);
                printf("|%5u %5s%5s%10u %6s   %-*s%10s |\n", g_devs[i].index, gi, ci, ps[j].pid, ps[j].type, width,
                       name, mem);
            }
            any = 1;
        }
    }
    if (!any)
        printf("%s", fr ? fr->no_procs : "|  No running processes found                                                             |\n");
    printf("%s", rule);
}

static int cmd_table(void)
{
    if (check_handles(1))
        return g_exit;
    table();
    return 0;
}

/* --query-gpu / --query-compute-apps ---------------------------------------------------- */

struct col { const char *spelled; int key; const char *unit; };

static int g_noheader, g_nounits;

static int parse_format(const char *f)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", f);
    int csv = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        if (!strcmp(t, "csv"))
            csv = 1;
        else if (!strcmp(t, "noheader"))
            g_noheader = 1;
        else if (!strcmp(t, "nounits"))
            g_nounits = 1;
        else
            return -1;
    }
    return csv ? 0 : -1;
}

static int parse_gpu_fields(const char *list, struct col *cols, int cap)
{
    char buf[8192];
    snprintf(buf, sizeof(buf), "%s", list);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t l = strlen(t);
        while (l && t[l - 1] == ' ')
            t[--l] = 0;
        const struct qfield *f;
        for (f = g_fields; f->name; f++)
            if (!strcasecmp(t, f->name) || (*f->alias && !strcasecmp(t, f->alias)))
                break;
        if (!f->name) { /* the tool names it from a 64-byte buffer (real 470-550) */
            printf("Field \"%.63s\" is not a valid field to query.\n\n", t);
            return -1;
        }
        if (n >= cap) {
            printf("%s", MSG_INVALID);
            return -1;
        }
        cols[n].spelled = f->name; /* the header names the field by its first name, as asked or not */
        cols[n].key = f->key;
        cols[n].unit = f->unit;
        n++;
    }
    return n;
}

static void print_header(const struct col *cols, int n, const char *list)
{
    if (g_noheader)
        return;
    for (int i = 0; i < n; i++) {
        printf("%s%s", i ? ", " : "", cols[i].spelled);
        if (*cols[i].unit) /* nounits drops the cells' units, not the header's (real 470-550) */
            printf(" [%s]", cols[i].unit);
    }
    (void)list;
    printf("\n");
}

static void csv_cell(const struct dev *d, const struct col *c, char *out, size_t n)
{
    char v[256];
    enum vr r = value(d, c->key, v, sizeof(v));
    if (r == V_DEPRECATED)
        snprintf(out, n, "[Requested functionality has been deprecated]");
    else if (r != V_OK && c->key >= K_fabric_health_summary && c->key <= K_fabric_health_incorrect_configuration)
        snprintf(out, n, "N/A");  /* the driver prints these without brackets */
    else if (r != V_OK)
        snprintf(out, n, "[N/A]");
    else if (!g_nounits && *c->unit && strcmp(c->unit, "us"))
        snprintf(out, n, "%s %s", v, c->unit);
    else if (!g_nounits && *c->unit)
        snprintf(out, n, "%s %s", v, c->unit);
    else
        snprintf(out, n, "%s", v);
}

static void query_gpu_once(const struct col *cols, int n)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            g_exit = EXIT_LOST;
            continue;
        }
        char line[16384];
        size_t pos = 0;
        line[0] = 0;
        for (int c = 0; c < n; c++) {
            char cell[512];
            csv_cell(d, &cols[c], cell, sizeof(cell));
            int w = snprintf(line + pos, sizeof(line) - pos, "%s%s", c ? ", " : "", cell);
            if (w < 0 || (size_t)w >= sizeof(line) - pos)
                break;
            pos += (size_t)w;
        }
        printf("%s\n", line);
    }
}

static const struct { const char *name, *alias, *unit; } APP_FIELDS[] = {
    {"timestamp", "", ""}, {"gpu_name", "", ""}, {"gpu_bus_id", "", ""}, {"gpu_serial", "", ""},
    {"gpu_uuid", "", ""}, {"pid", "", ""}, {"process_name", "name", ""}, {"used_gpu_memory", "used_memory", "MiB"},
    {0, 0, 0},
};

/* --query-accounted-apps: the records of nvmlDeviceGetAccountingPids/Stats (accounting mode on). */
static const struct { const char *name, *alias, *unit; } ACCT_FIELDS[] = {
    {"gpu_name", "", ""}, {"gpu_bus_id", "", ""}, {"gpu_serial", "", ""}, {"gpu_uuid", "", ""}, {"pid", "", ""},
    {"gpu_utilization", "gpu_util", "%"}, {"mem_utilization", "mem_util", "%"},
    {"max_memory_usage", "", "MiB"}, {"time", "", "ms"}, {0, 0, 0},
};

static int parse_fields_of(const char *list, int *idx, const char **spelled, int cap, int accounted);

static int parse_app_fields(const char *list, int *idx, const char **spelled, int cap)
{
    return parse_fields_of(list, idx, spelled, cap, 0);
}

static int parse_fields_of(const char *list, int *idx, const char **spelled, int cap, int accounted)
{
    const __typeof__(APP_FIELDS[0]) *T = accounted ? (const __typeof__(APP_FIELDS[0]) *)ACCT_FIELDS : APP_FIELDS;
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", list);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        int k;
        for (k = 0; T[k].name; k++)
            if (!strcasecmp(t, T[k].name) || (*T[k].alias && !strcasecmp(t, T[k].alias)))
                break;
        if (!T[k].name) {
            printf("Field \"%s\" is not a valid field to query.\n\n", t);
            return -1;
        }
        if (n >= cap)
            return -1;
        idx[n] = k;
        spelled[n] = list + (t - buf);
        n++;
    }
    return n;
}

static void query_apps_once(const int *idx, int n)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS)
            continue;
        struct proc ps[64];
        unsigned np = get_procs(d, ps, 64);
        for (unsigned j = 0; j < np; j++) {
            if (strcmp(ps[j].type, "G") == 0)
                continue;
            for (int c = 0; c < n; c++) {
                char v[256] = "[N/A]";
                switch (idx[c]) {
                case 0: timestamp(v, sizeof(v), 1); break;
                case 1: if (value(d, K_name, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 2: if (value(d, K_pci_bus_id, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 3: if (value(d, K_serial, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 4: if (value(d, K_uuid, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 5: snprintf(v, sizeof(v), "%u", ps[j].pid); break;
                case 6: proc_name(ps[j].pid, v, sizeof(v)); break;
                case 7:
                    if (ps[j].mem != (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
                        snprintf(v, sizeof(v), g_nounits ? "%llu" : "%llu MiB", ps[j].mem >> 20);
                    break;
                }
                printf("%s%s", c ? ", " : "", v);
            }
            printf("\n");
        }
    }
}

static void query_accounted_once(const int *idx, int n)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS)
            continue;
        static unsigned pids[MOKKA_ACCOUNTING_RECORDS];
        unsigned np = MOKKA_ACCOUNTING_RECORDS;
        if (NV(nvmlDeviceGetAccountingPids, d->h, &np, pids) != NVML_SUCCESS)
            continue; /* accounting mode off: nothing to list */
        for (unsigned j = 0; j < np; j++) {
            nvmlAccountingStats_t st;
            if (NV(nvmlDeviceGetAccountingStats, d->h, pids[j], &st) != NVML_SUCCESS)
                continue;
            for (int c = 0; c < n; c++) {
                char v[256] = "[N/A]";
                switch (idx[c]) {
                case 0: if (value(d, K_name, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 1: if (value(d, K_pci_bus_id, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 2: if (value(d, K_serial, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 3: if (value(d, K_uuid, v, sizeof(v)) != V_OK) snprintf(v, sizeof(v), "[N/A]"); break;
                case 4: snprintf(v, sizeof(v), "%u", pids[j]); break;
                case 5: snprintf(v, sizeof(v), g_nounits ? "%u" : "%u %%", st.gpuUtilization); break;
                case 6: snprintf(v, sizeof(v), g_nounits ? "%u" : "%u %%", st.memoryUtilization); break;
                case 7: snprintf(v, sizeof(v), g_nounits ? "%llu" : "%llu MiB", st.maxMemoryUsage >> 20); break;
                case 8: snprintf(v, sizeof(v), g_nounits ? "%llu" : "%llu ms", st.time); break;
                }
                printf("%s%s", c ? ", " : "", v);
            }
            printf("\n");
        }
    }
}

/* -q / -q -x ------------------------------------------------------------------------------ */

/* The -q labels and -q -x elements of each -d section; "... Samples" and "Supported
   GPU_TARGET_TEMP" are the labels only -d prints (records of 470-550). */
struct section { const char *name; const char *text[12]; const char *xml[8]; };

static const struct section SECTIONS[] = {
    {"MEMORY", {"FB Memory Usage", "BAR1 Memory Usage", "Conf Compute Protected Memory Usage"},
     {"fb_memory_usage", "bar1_memory_usage", "cc_protected_memory_usage"}},
    {"UTILIZATION", {"Utilization", "GPU Utilization Samples", "Memory Utilization Samples", "ENC Utilization Samples",
                     "DEC Utilization Samples", "JPG Utilization Samples", "OFA Utilization Samples"}, {"utilization"}},
    {"ECC", {"ECC Mode", "ECC Errors", "Ecc Mode"}, {"ecc_mode", "ecc_errors"}},
    {"TEMPERATURE", {"Temperature"}, {"temperature"}},
    {"POWER", {"GPU Power Readings", "GPU Memory Power Readings ", "Module Power Readings", "GPU Memory Power Readings",
               "Power Readings", "Power Samples"},
     {"gpu_power_readings", "gpu_memory_power_readings", "module_power_readings", "power_readings"}},
    {"CLOCK", {"Clocks", "Applications Clocks", "Default Applications Clocks", "Deferred Clocks", "Max Clocks",
               "Max Customer Boost Clocks", "Clock Policy", "SM Clock Samples", "Memory Clock Samples"},
     {"clocks", "applications_clocks", "default_applications_clocks", "deferred_clocks", "max_clocks",
      "max_customer_boost_clocks", "clock_policy"}},
    {"COMPUTE", {"Compute Mode"}, {"compute_mode"}},
    {"PIDS", {"Processes"}, {"processes"}},
    {"PERFORMANCE", {"Performance State", "Clocks Event Reasons", "Clocks Event Reasons Counters",
                     "Clocks Throttle Reasons", "Sparse Operation Mode"},
     {"performance_state", "clocks_event_reasons", "clocks_event_reasons_counters", "clocks_throttle_reasons"}},
    {"SUPPORTED_CLOCKS", {"Supported Clocks"}, {"supported_clocks"}},
    {"PAGE_RETIREMENT", {"Retired Pages"}, {"retired_pages"}},
    {"ACCOUNTING", {"Accounting Mode", "Accounting Mode Buffer Size", "Accounted Processes"}, {"accounting_mode", "accounting_mode_buffer_size"}},
    {"ENCODER_STATS", {"Encoder Stats"}, {"encoder_stats"}},
    {"SUPPORTED_GPU_TARGET_TEMP", {"Supported GPU Target Temp", "Supported GPU_TARGET_TEMP"}, {"supported_gpu_target_temp"}},
    {"VOLTAGE", {"Voltage"}, {"voltage"}},
    {"FBC_STATS", {"FBC Stats"}, {"fbc_stats"}},
    {"ROW_REMAPPER", {"Remapped Rows"}, {"remapped_rows"}},
    {"RESET_STATUS", {"GPU Reset Status"}, {"gpu_reset_status"}},
    {"GSP_FIRMWARE_VERSION", {"GSP Firmware Version"}, {"gsp_firmware_version"}},
    {"POWER_SMOOTHING", {"Power Smoothing"}, {"power_smoothing"}},
    {"POWER_PROFILES", {"Workload Power Profiles"}, {"power_profiles"}},
    {0, {0}, {0}},
};

static unsigned g_sections;   /* bit per SECTIONS entry; 0 = everything */

static int parse_sections(const char *list)
{
    if (strspn(list, ", ") == strlen(list))
        return -1;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k;
        for (k = 0; SECTIONS[k].name; k++)
            if (!strcasecmp(t, SECTIONS[k].name))
                break;
        if (!SECTIONS[k].name)
            return -1;
        g_sections |= 1u << k;
    }
    return 0;
}

static int top_selected(const char *label, int xml)
{
    if (!g_sections)
        return 1;
    for (int k = 0; SECTIONS[k].name; k++) {
        if (!(g_sections & (1u << k)))
            continue;
        for (int j = 0; j < (xml ? 8 : 12); j++) {
            const char *s = xml ? SECTIONS[k].xml[j] : SECTIONS[k].text[j];
            if (s && !strcmp(s, label))
                return 1;
        }
    }
    return 0;
}

static const struct skel *xml_skeleton(const struct dev *d)
{
    char name[96] = "";
    if (g_rec) /* the branch's own elements, the same for every board it drives */
        return g_rec->xml;
    NV(nvmlDeviceGetName, d->h, name, sizeof(name));
    for (const struct board *b = XML_BOARDS; b->profile; b++)
        if (!strcmp(b->product, name))
            return b->xml;
    /* A board without a capture: the capture of the nearest driver branch. */
    const char *fallback = g_branch < 580 ? "a100" : g_branch >= 590 ? "l40s" : "h100";
    for (const struct board *b = XML_BOARDS; b->profile; b++)
        if (!strcmp(b->profile, fallback))
            return b->xml;
    return XML_BOARDS[0].xml;
}

static void xml_escape(const char *s, char *out, size_t n)
{
    size_t o = 0;
    for (; *s && o + 7 < n; s++) {
        const char *rep = *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : NULL;
        if (rep) {
            size_t l = strlen(rep);
            memcpy(out + o, rep, l);
            o += l;
        } else {
            out[o++] = *s;
        }
    }
    out[o] = 0;
}

static void tabs(int n)
{
    for (int i = 0; i < n; i++)
        putchar('\t');
}

static void xml_processes(const struct dev *d, int depth, const char *tag)
{
    struct proc ps[64];
    unsigned np = strcmp(tag, "processes") ? 0 : get_procs(d, ps, 64);
    if (!strcmp(tag, "mig_devices")) {
        mig_query_xml(d->index, depth);
        return;
    }
    tabs(depth);
    printf("<%s>\n", tag);
    for (unsigned j = 0; j < np; j++) {
        char name[256], esc[512];
        proc_name(ps[j].pid, name, sizeof(name));
        xml_escape(name, esc, sizeof(esc));
        tabs(depth + 1); printf("<process_info>\n");
        if (ps[j].gi != 0xFFFFFFFFu) {
            tabs(depth + 2); printf("<gpu_instance_id>%u</gpu_instance_id>\n", ps[j].gi);
            tabs(depth + 2); printf("<compute_instance_id>%u</compute_instance_id>\n", ps[j].ci);
        } else {
            tabs(depth + 2); printf("<gpu_instance_id>N/A</gpu_instance_id>\n");
            tabs(depth + 2); printf("<compute_instance_id>N/A</compute_instance_id>\n");
        }
        tabs(depth + 2); printf("<pid>%u</pid>\n", ps[j].pid);
        tabs(depth + 2); printf("<type>%s</type>\n", ps[j].type);
        tabs(depth + 2); printf("<process_name>%s</process_name>\n", esc);
        tabs(depth + 2); printf("<used_memory>%llu MiB</used_memory>\n", ps[j].mem >> 20);
        tabs(depth + 1); printf("</process_info>\n");
    }
    tabs(depth);
    printf("</%s>\n", tag);
}

static void xml_gpu(const struct dev *d)
{
    char v[512], esc[1024], bus[32] = "N/A";
    value(d, K_pci_bus_id, bus, sizeof(bus));
    printf("\t<gpu id=\"%s\">\n", bus);
    const struct skel *s = xml_skeleton(d);
    char tl[32];
    int tlimit_board = value(d, K_temperature_gpu_tlimit, tl, sizeof(tl)) == V_OK;
    int skip_depth = -1;  /* inside a top-level element that -d did not select */
    for (; s->kind != 9; s++) {
        if (s->depth == 2 && s->kind != 2)
            skip_depth = top_selected(s->tag, 1) ? -1 : 2;
        if (skip_depth >= 0) {
            if (s->depth == 2 && s->kind == 2)
                skip_depth = -1;
            continue;
        }
        switch (s->kind) {
        case 0: tabs(s->depth); printf("<%s>\n", s->tag); break;
        case 2: tabs(s->depth); printf("</%s>\n", s->tag); break;
        case 3: xml_processes(d, s->depth, s->tag); break;
        default: {
            const struct skel *row = threshold_row(s, tlimit_board, 1);
            value_text(d, row->key, row->suffix, v, sizeof(v));
            /* XML spells PCI numbers without 0x */
            const char *p = v;
            if (!strncmp(row->tag, "pci_", 4) && !strncmp(v, "0x", 2))
                p = v + 2;
            xml_escape(p, esc, sizeof(esc));
            tabs(row->depth);
            printf("<%s>%s</%s>\n", row->tag, esc, row->tag);
        }
        }
    }
    printf("\t</gpu>\n\n");
}

static int cmd_xml(void)
{
    char ts[64];
    timestamp(ts, sizeof(ts), 0);
    printf("<?xml version=\"1.0\" ?>\n");
    printf("<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v%d.dtd\">\n", g_rec ? g_rec->dtd : g_branch >= 580 ? 13 : 12);
    printf("<nvidia_smi_log>\n");
    printf("\t<timestamp>%s</timestamp>\n", ts);
    printf("\t<driver_version>%s</driver_version>\n", g_driver);
    printf("\t<cuda_version>%s</cuda_version>\n", g_cuda);
    printf("\t<attached_gpus>%u</attached_gpus>\n", g_count);
    for (unsigned i = 0; i < g_ndevs; i++) {
        if (g_devs[i].err != NVML_SUCCESS) {
            /* the real tool reports the handle failure and omits the GPU */
            fflush(stdout);
            print_handle_error(&g_devs[i]);
            g_exit = EXIT_LOST;
            continue;
        }
        xml_gpu(&g_devs[i]);
    }
    printf("</nvidia_smi_log>\n");
    return g_exit;
}

static void q_line(int depth, const char *label, const char *val)
{
    int indent = 4 * (depth + 1);
    printf("%*s%-*s: %s\n", indent, "", g_colon - indent, label, val);
}

static int cmd_query(void)
{
    char ts[64];
    timestamp(ts, sizeof(ts), 0);
    printf("\n==============NVSMI LOG==============\n\n");
    q_line(-1, "Timestamp", ts);
    q_line(-1, "Driver Version", g_driver);
    q_line(-1, "CUDA Version", g_cuda);
    printf("\n");
    char cnt[16];
    snprintf(cnt, sizeof(cnt), "%u", g_count);
    q_line(-1, "Attached GPUs", cnt);
    const struct skel *skel = g_rec ? (g_sections ? g_rec->text_display : g_rec->text)
                                    : g_branch >= 595 ? TEXT_595 : TEXT_590;
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            g_exit = EXIT_LOST;
            continue;
        }
        char bus[32] = "N/A", v[512];
        value(d, K_pci_bus_id, bus, sizeof(bus));
        printf("GPU %s\n", bus);
        int skipping = 0;
        char tl[32];
        int tlimit_board = value(d, K_temperature_gpu_tlimit, tl, sizeof(tl)) == V_OK;
        for (const struct skel *s = skel; s->kind != 9; s++) {
            if (s->depth == 0)
                skipping = !top_selected(s->tag, 0);
            if (skipping)
                continue;
            if (s->kind == 0) {
                printf("%*s%s\n", 4 * (s->depth + 1), "", s->tag);
            } else if (s->kind == 3) {
                struct proc ps[64];
                unsigned np = get_procs(d, ps, 64);
                if (!np) {
                    q_line(s->depth, s->tag, "None");
                    continue;
                }
                printf("%*s%s\n", 4 * (s->depth + 1), "", "Processes");
                for (unsigned j = 0; j < np; j++) {
                    char name[256], num[32];
                    proc_name(ps[j].pid, name, sizeof(name));
                    snprintf(num, sizeof(num), "%s", "N/A");
                    q_line(s->depth + 1, "GPU instance ID", ps[j].gi != 0xFFFFFFFFu ? (snprintf(num, sizeof(num), "%u", ps[j].gi), num) : "N/A");
                    q_line(s->depth + 1, "Compute instance ID", ps[j].ci != 0xFFFFFFFFu ? (snprintf(num, sizeof(num), "%u", ps[j].ci), num) : "N/A");
                    snprintf(num, sizeof(num), "%u", ps[j].pid);
                    q_line(s->depth + 1, "Process ID", num);
                    /* the rest one level deeper, under the Process ID (every real -q: 470-595) */
                    q_line(s->depth + 2, "Type", ps[j].type);
                    q_line(s->depth + 2, "Name", name);
                    snprintf(num, sizeof(num), "%llu MiB", ps[j].mem >> 20);
                    q_line(s->depth + 2, "Used GPU Memory", num);
                }
            } else {
                const struct skel *row = threshold_row(s, tlimit_board, 0);
                value_text(d, row->key, row->suffix, v, sizeof(v));
                q_line(s->depth, row->tag, v);
                if (s->key == K_mig_mode_pending)
                    mig_query_text(d->index);
            }
        }
        printf("\n");
    }
    return g_exit;
}

/* topo, nvlink, dmon, pmon ---------------------------------------------------------------- */

static void cpu_list(const unsigned long *mask, unsigned words, char *out, size_t n)
{
    size_t o = 0;
    out[0] = 0;
    unsigned bits = words * 64;
    for (unsigned b = 0; b < bits;) {
        if (!(mask[b / 64] >> (b % 64) & 1)) {
            b++;
            continue;
        }
        unsigned e = b;
        while (e + 1 < bits && (mask[(e + 1) / 64] >> ((e + 1) % 64) & 1))
            e++;
        int w = e > b ? snprintf(out + o, n - o, "%s%u-%u", o ? "," : "", b, e)
                      : snprintf(out + o, n - o, "%s%u", o ? "," : "", b);
        if (w < 0 || (size_t)w >= n - o)
            break;
        o += (size_t)w;
        b = e + 1;
    }
    if (!out[0])
        snprintf(out, n, "N/A");
}

static unsigned nvlinks_between(const struct dev *a, const struct dev *b)
{
    nvmlPciInfo_t pb;
    if (NV(nvmlDeviceGetPciInfo_v3, b->h, &pb) != NVML_SUCCESS)
        return 0;
    unsigned count = 0;
    for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
        nvmlEnableState_t st;
        nvmlReturn_t r = NV(nvmlDeviceGetNvLinkState, a->h, l, &st);
        if (r == NVML_ERROR_INVALID_ARGUMENT || r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND)
            break;
        if (r != NVML_SUCCESS || st != NVML_FEATURE_ENABLED)
            continue;
        nvmlPciInfo_t rp;
        if (NV(nvmlDeviceGetNvLinkRemotePciInfo_v2, a->h, l, &rp) == NVML_SUCCESS) {
            if (rp.domain == pb.domain && rp.bus == pb.bus && rp.device == pb.device)
                count++;
        }
    }
    return count;
}

static int nvswitch_links(const struct dev *a)
{
    int n = 0;
    for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
        nvmlEnableState_t st;
        nvmlReturn_t r = NV(nvmlDeviceGetNvLinkState, a->h, l, &st);
        if (r == NVML_ERROR_INVALID_ARGUMENT || r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND)
            break;
        nvmlIntNvLinkDeviceType_t t;
        if (r == NVML_SUCCESS && st == NVML_FEATURE_ENABLED && NV(nvmlDeviceGetNvLinkRemoteDeviceType, a->h, l, &t) == NVML_SUCCESS &&
            t == NVML_NVLINK_DEVICE_TYPE_SWITCH)
            n++;
    }
    return n;
}

static int cmd_topo(void)
{
    if (check_handles(1))
        return g_exit;
    printf("\t\x1b[4m");
    for (unsigned i = 0; i < g_ndevs; i++)
        printf("GPU%u\t", g_devs[i].index);
    printf("CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n");
    int sw[MOKKA_MAX_GPUS];
    for (unsigned i = 0; i < g_ndevs; i++)
        sw[i] = nvswitch_links(&g_devs[i]);
    for (unsigned i = 0; i < g_ndevs; i++) {
        printf("GPU%u\t", g_devs[i].index);
        for (unsigned j = 0; j < g_ndevs; j++) {
            if (i == j) {
                printf(" X \t");
                continue;
            }
            unsigned nl = nvlinks_between(&g_devs[i], &g_devs[j]);
            if (!nl && sw[i] && sw[j])
                nl = (unsigned)(sw[i] < sw[j] ? sw[i] : sw[j]);
            if (nl) {
                printf("NV%u\t", nl);
                continue;
            }
            nvmlGpuTopologyLevel_t lvl;
            const char *s = "SYS";
            if (NV(nvmlDeviceGetTopologyCommonAncestor, g_devs[i].h, g_devs[j].h, &lvl) == NVML_SUCCESS)
                s = lvl <= NVML_TOPOLOGY_SINGLE ? "PIX" : lvl == NVML_TOPOLOGY_MULTIPLE ? "PXB"
                  : lvl == NVML_TOPOLOGY_HOSTBRIDGE ? "PHB" : lvl == NVML_TOPOLOGY_NODE ? "NODE" : "SYS";
            printf("%s\t", s);
        }
        unsigned long cpus[16] = {0}, mem[4] = {0};
        char cl[512] = "N/A", numa[64] = "N/A";
        if (NV(nvmlDeviceGetCpuAffinity, g_devs[i].h, 16, cpus) == NVML_SUCCESS)
            cpu_list(cpus, 16, cl, sizeof(cl));
        if (NV(nvmlDeviceGetMemoryAffinity, g_devs[i].h, 4, mem, NVML_AFFINITY_SCOPE_NODE) == NVML_SUCCESS)
            cpu_list(mem, 4, numa, sizeof(numa));
        printf("%s\t%s\t\tN/A\n", cl, numa);
    }
    printf("\nLegend:\n\n"
           "  X    = Self\n"
           "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
           "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
           "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
           "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
           "  PIX  = Connection traversing at most a single PCIe bridge\n"
           "  NV#  = Connection traversing a bonded set of # NVLinks\n");
    return 0;
}

static const char *link_speed(unsigned version)
{
    /* per-link unidirectional rate the driver prints for each NVLink version (nvmlNvlinkVersion_t) */
    switch (version) {
    case NVML_NVLINK_VERSION_1_0: return "20 GB/s";
    case NVML_NVLINK_VERSION_2_0: case NVML_NVLINK_VERSION_2_2: return "25.781 GB/s";
    case NVML_NVLINK_VERSION_3_0: case NVML_NVLINK_VERSION_3_1: return "25 GB/s";
    case NVML_NVLINK_VERSION_4_0: return "26.562 GB/s";
    default: return "53.125 GB/s";
    }
}

static int cmd_nvlink(char mode)
{
    if (check_handles(1))
        return g_exit;
    static const char *counters[] = {"Replay Errors", "Recovery Errors", "CRC Errors", "CRC Data Errors"};
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        char name[96] = "N/A", uuid[96] = "N/A";
        NV(nvmlDeviceGetName, d->h, name, sizeof(name));
        NV(nvmlDeviceGetUUID, d->h, uuid, sizeof(uuid));
        printf("GPU %u: %s (UUID: %s)\n", d->index, name, uuid);
        unsigned links = 0;
        int mig = mig_enabled(d->index); /* MIG mode takes the GPU's NVLinks down */
        for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
            nvmlEnableState_t st;
            nvmlReturn_t r = NV(nvmlDeviceGetNvLinkState, d->h, l, &st);
            if (r == NVML_ERROR_INVALID_ARGUMENT || r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND)
                break;
            links++;
            unsigned ver = 0;
            NV(nvmlDeviceGetNvLinkVersion, d->h, l, &ver);
            if (mode == 's') {
                printf("\t Link %u: %s\n", l, r == NVML_SUCCESS && st == NVML_FEATURE_ENABLED && !mig ? link_speed(ver) : "<inactive>");
            } else if (mode == 'c') {
                static const char *caps[] = {"P2P is supported", "Access to system memory supported",
                                             "P2P atomics supported", "System memory atomics supported",
                                             "SLI is supported", "Link is supported"};
                for (unsigned c = 0; c < 6; c++) {
                    unsigned v = 0;
                    nvmlReturn_t rc = NV(nvmlDeviceGetNvLinkCapability, d->h, l, (nvmlNvLinkCapability_t)c, &v);
                    printf("\t Link %u, %s: %s\n", l, caps[c], rc == NVML_SUCCESS ? (v ? "true" : "false") : "N/A");
                }
            } else {
                for (unsigned c = 0; c < 4; c++) {
                    unsigned long long v = 0;
                    nvmlReturn_t rc = NV(nvmlDeviceGetNvLinkErrorCounter, d->h, l, (nvmlNvLinkErrorCounter_t)c, &v);
                    if (rc == NVML_SUCCESS)
                        printf("\t Link %u: %s: %llu\n", l, counters[c], v);
                    else
                        printf("\t Link %u: %s: N/A\n", l, counters[c]);
                }
            }
        }
        if (!links)
            printf("Device does not have or support Nvlink\n");
    }
    return 0;
}

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig; g_stop = 1; }

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (!g_stop && nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static void dash_or(char *out, size_t n, nvmlReturn_t r, unsigned v)
{
    if (r == NVML_SUCCESS)
        snprintf(out, n, "%u", v);
    else
        snprintf(out, n, "-");
}

static int cmd_dmon(long count, long delay_s)
{
    if (check_handles(1))
        return g_exit;
    printf("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk \n"
           "# Idx      W      C      C      %%      %%      %%      %%      %%      %%    MHz    MHz \n");
    fflush(stdout);
    for (long it = 0; !g_stop && (count <= 0 || it < count); it++) {
        if (it)
            sleep_ms(delay_s * 1000);
        if (g_stop)
            break;
        for (unsigned i = 0; i < g_ndevs; i++) {
            const struct dev *d = &g_devs[i];
            char c[12][16];
            unsigned u = 0, u2;
            nvmlUtilization_t ut = {0, 0};
            nvmlReturn_t r = NV(nvmlDeviceGetPowerUsage, d->h, &u);
            dash_or(c[0], 16, r, u / 1000);
            r = NV(nvmlDeviceGetTemperature, d->h, NVML_TEMPERATURE_GPU, &u);
            dash_or(c[1], 16, r, u);
            char mt[32];
            if (value(d, K_temperature_memory, mt, sizeof(mt)) == V_OK)
                snprintf(c[2], 16, "%s", mt);
            else
                snprintf(c[2], 16, "-");
            r = NV(nvmlDeviceGetUtilizationRates, d->h, &ut);
            dash_or(c[3], 16, r, ut.gpu);
            dash_or(c[4], 16, r, ut.memory);
            r = NV(nvmlDeviceGetEncoderUtilization, d->h, &u, &u2);
            dash_or(c[5], 16, r, u);
            r = NV(nvmlDeviceGetDecoderUtilization, d->h, &u, &u2);
            dash_or(c[6], 16, r, u);
            snprintf(c[7], 16, "0");
            snprintf(c[8], 16, "0");
            r = NV(nvmlDeviceGetClockInfo, d->h, NVML_CLOCK_MEM, &u);
            dash_or(c[9], 16, r, u);
            r = NV(nvmlDeviceGetClockInfo, d->h, NVML_CLOCK_GRAPHICS, &u);
            dash_or(c[10], 16, r, u);
            printf("%5u", d->index);
            for (int k = 0; k < 11; k++)
                printf("%7s", c[k]);
            printf(" \n");
        }
        fflush(stdout);
    }
    return 0;
}

static int cmd_pmon(long count, long delay_s)
{
    if (check_handles(1))
        return g_exit;
    printf("# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command \n"
           "# Idx           #    C/G      %%      %%      %%      %%      %%      %%    name \n");
    fflush(stdout);
    for (long it = 0; !g_stop && (count <= 0 || it < count); it++) {
        if (it)
            sleep_ms(delay_s * 1000);
        if (g_stop)
            break;
        for (unsigned i = 0; i < g_ndevs; i++) {
            struct proc ps[64];
            unsigned np = get_procs(&g_devs[i], ps, 64);
            if (!np)
                printf("%5u%11s%6s%7s%7s%7s%7s%7s%7s    %-15s\n", g_devs[i].index, "-", "-", "-", "-", "-", "-", "-", "-", "-");
            for (unsigned j = 0; j < np; j++) {
                char name[256];
                proc_name(ps[j].pid, name, sizeof(name));
                const char *base = strrchr(name, '/');
                printf("%5u%11u%6s%7s%7s%7s%7s%7s%7s    %-15s\n", g_devs[i].index, ps[j].pid, ps[j].type, "-", "-",
                       "-", "-", "-", "-", base ? base + 1 : name);
            }
        }
        fflush(stdout);
    }
    return 0;
}

/* ---- configuration commands (-pm, -c, -pl, -lgc, -rgc, -ac, -rac, -lmc, -rmc, -e, -p, -am, -caa,
   --auto-boost-default, --gom, -r) ----------------------------------------------------------- */

/* One setting for every selected GPU, in index order, through NVML's setters (which send it to
   the daemon). The first failure ends the run, as the real tool's "Terminating early" does; the
   exit code is the NVML error (4 for NO_PERMISSION, as real captures show). Messages and their
   sources: docs/nvidia-smi.md, "Configuration commands". */
enum set_kind { SET_NONE, SET_PM, SET_CM, SET_PL, SET_LGC, SET_RGC, SET_AC, SET_RAC, SET_LMC, SET_RMC, SET_ECC,
                SET_CLEAR_ECC, SET_AM, SET_CAA, SET_AUTO_BOOST, SET_GOM, SET_RESET };

struct set_cmd {
    enum set_kind kind;
    unsigned value;             /* PM, ECC, AM, AUTO_BOOST: 0/1; CM: nvmlComputeMode_t; PL: milliwatts;
                                   LGC, LMC: min MHz; AC: memory MHz; CLEAR_ECC: nvmlEccCounterType_t;
                                   GOM: nvmlGpuOperationMode_t */
    unsigned value2;            /* LGC, LMC: max MHz; AC: graphics MHz */
    char lgc_text[2][16];       /* LGC, LMC: the values as given ("1500", "tdp"), as the tool echoes them */
};

static const char MSG_TERMINATING[] = "Terminating early due to previous errors.\n";
static const char *const COMPUTE_MODE_WORD[] = {"DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS"};

/* 0/1 or DISABLED/ENABLED, any case. */
static int parse_enable(const char *v, unsigned *out)
{
    if (!strcmp(v, "0") || !strcasecmp(v, "DISABLED"))
        return *out = 0, 0;
    if (!strcmp(v, "1") || !strcasecmp(v, "ENABLED"))
        return *out = 1, 0;
    return -1;
}

static int parse_compute_mode(const char *v, unsigned *out)
{
    for (unsigned m = 0; m < 4; m++)
        if ((v[0] == (char)('0' + m) && !v[1]) || !strcasecmp(v, COMPUTE_MODE_WORD[m]))
            return *out = m, 0;
    return -1;
}

/* Watts, with decimals ("450", "450.5"); NVML takes milliwatts. */
static int parse_watts(const char *v, unsigned *mw)
{
    char *end = NULL;
    errno = 0;
    double w = strtod(v, &end);
    if (errno || end == v || *end || !(w >= 0) || w > 4294967.0)
        return -1;
    *mw = (unsigned)(w * 1000.0 + 0.5);
    return 0;
}

/* One clock of -lgc: MHz, or the symbolic "tdp" that nvml.h names. */
static int parse_clock(const char *v, unsigned *mhz)
{
    if (!strcasecmp(v, "tdp"))
        return *mhz = NVML_CLOCK_LIMIT_ID_TDP, 0;
    if (!*v || strspn(v, "0123456789") != strlen(v) || strlen(v) > 6)
        return -1;
    *mhz = (unsigned)strtoul(v, NULL, 10);
    return 0;
}

/* "MIN,MAX", or one value for both. */
static int parse_lgc(const char *v, struct set_cmd *c)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", v);
    char *comma = strchr(buf, ',');
    const char *lo = buf, *hi = buf;
    if (comma) {
        *comma = 0;
        hi = comma + 1;
    }
    if (strlen(v) >= sizeof(buf) || parse_clock(lo, &c->value) || parse_clock(hi, &c->value2))
        return -1;
    snprintf(c->lgc_text[0], sizeof(c->lgc_text[0]), "%s", lo);
    snprintf(c->lgc_text[1], sizeof(c->lgc_text[1]), "%s", hi);
    return 0;
}

/* The bus id the tool names a GPU by in these messages: "00000000:18:00.0". */
static void set_bus_id(const struct dev *d, char *out, size_t n)
{
    nvmlPciInfo_t pci;
    if (NV(nvmlDeviceGetPciInfo_v3, d->h, &pci) == NVML_SUCCESS)
        snprintf(out, n, "%s", pci.busId);
    else
        lost_bus_id(d->index, out, n);
}

/* "MEM,GRAPHICS" of -ac: two clocks in MHz. */
static int parse_ac(const char *v, struct set_cmd *c)
{
    char buf[64];
    if (strlen(v) >= sizeof(buf))
        return -1;
    snprintf(buf, sizeof(buf), "%s", v);
    char *comma = strchr(buf, ',');
    if (!comma)
        return -1;
    *comma = 0;
    if (!strcasecmp(buf, "tdp") || !strcasecmp(comma + 1, "tdp"))
        return -1;
    return parse_clock(buf, &c->value) || parse_clock(comma + 1, &c->value2) ? -1 : 0;
}

/* -gom: 0/ALL_ON, 1/COMPUTE, 2/LOW_DP. */
static int parse_gom(const char *v, unsigned *out)
{
    static const char *const names[] = {"ALL_ON", "COMPUTE", "LOW_DP"};
    for (unsigned m = 0; m < 3; m++)
        if ((v[0] == (char)('0' + m) && !v[1]) || !strcasecmp(v, names[m]))
            return *out = m, 0;
    return -1;
}

/* A setter the board does not offer: the tool warns and goes on (exit 0), as real ones do for
   -ac and --auto-boost-default on boards without them. */
static void not_supported_warning(const char *what, const char *bus)
{
    printf("%s is not supported for GPU %s.\nTreating as warning and moving on.\n", what, bus);
}

static int set_failed(nvmlReturn_t r);

/* -r: NVML has no public reset, so the tool asks the daemon, as the real one asks its driver:
   the node's `reset idle` command for this GPU, through the control socket beside the state
   file the loaded NVML reads (mokka_control.h). The node refuses a GPU with a process on it
   (IN_USE), the one check NVML's reset entry meets too. */
static int reset_gpu(const struct dev *d, const char *bus)
{
    char line[64];
    (void)state_of(d->index); /* maps the node's state, which names the socket */
    snprintf(line, sizeof(line), "gpu=%u reset idle", d->index);
    nvmlReturn_t r = mokka_ctl_nvml_error(mokka_control(line, NULL, 0));
    if (r == NVML_ERROR_IN_USE) { /* the real tool's words, and no "Terminating early" line */
        printf("GPU reset unavailable: %s\n", nvml_error(r));
        return (int)r;
    }
    if (r != NVML_SUCCESS) {
        printf("Unable to reset GPU %s: %s\n", bus, nvml_error(r));
        return set_failed(r);
    }
    printf("GPU %s was successfully reset.\n", bus);
    return 0;
}

static int set_failed(nvmlReturn_t r)
{
    printf("%s", MSG_TERMINATING);
    return r > 0 && r < 255 ? (int)r : EXIT_OTHER;
}

static int set_one(const struct set_cmd *c, const struct dev *d)
{
    char bus[32];
    nvmlReturn_t r;
    set_bus_id(d, bus, sizeof(bus));
    switch (c->kind) {
    case SET_PM: {
        nvmlEnableState_t now;
        /* The tool reads first and does not write a value the GPU already has. */
        if (NV(nvmlDeviceGetPersistenceMode, d->h, &now) == NVML_SUCCESS && (unsigned)now == c->value) {
            printf("Persistence mode is already %s for GPU %s.\n", c->value ? "Enabled" : "Disabled", bus);
            return 0;
        }
        r = NV(nvmlDeviceSetPersistenceMode, d->h, c->value ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
        if (r != NVML_SUCCESS) {
            printf("Unable to set persistence mode for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("%s persistence mode for GPU %s.\n", c->value ? "Enabled" : "Disabled", bus);
        return 0;
    }
    case SET_CM:
        r = NV(nvmlDeviceSetComputeMode, d->h, (nvmlComputeMode_t)c->value);
        if (r != NVML_SUCCESS) {
            printf("Unable to set compute mode for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("Set compute mode to %s for GPU %s.\n", COMPUTE_MODE_WORD[c->value], bus);
        return 0;
    case SET_PL: {
        unsigned lo = 0, hi = 0, old = 0;
        r = NV(nvmlDeviceGetPowerManagementLimitConstraints, d->h, &lo, &hi);
        if (r == NVML_SUCCESS)
            r = NV(nvmlDeviceGetPowerManagementLimit, d->h, &old);
        if (r != NVML_SUCCESS) {
            printf("Changing power management limit is not supported for GPU: %s.\n", bus);
            return set_failed(r);
        }
        /* The tool checks the range itself, before it asks the driver (so before any permission check). */
        if (c->value < lo || c->value > hi) {
            printf("Provided power limit %.2f W is not a valid power limit which should be between %.2f W and "
                   "%.2f W for GPU %s\n", c->value / 1000.0, lo / 1000.0, hi / 1000.0, bus);
            return set_failed(NVML_ERROR_INVALID_ARGUMENT);
        }
        r = NV(nvmlDeviceSetPowerManagementLimit, d->h, c->value);
        if (r != NVML_SUCCESS) {
            printf("Failed to set power management limit for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("Power limit for GPU %s was set to %.2f W from %.2f W.\n", bus, c->value / 1000.0, old / 1000.0);
        return 0;
    }
    case SET_LGC:
    case SET_RGC:
        r = c->kind == SET_LGC ? NV(nvmlDeviceSetGpuLockedClocks, d->h, c->value, c->value2)
                               : NV(nvmlDeviceResetGpuLockedClocks, d->h);
        if (r == NVML_ERROR_NO_PERMISSION) {
            printf("The current user does not have permission to change clocks for GPU %s.\n", bus);
            return set_failed(r);
        }
        if (r != NVML_SUCCESS) {
            printf("Failed to %s GPU clocks for GPU %s: %s\n", c->kind == SET_LGC ? "lock" : "reset", bus, nvml_error(r));
            return set_failed(r);
        }
        if (c->kind == SET_LGC)
            printf("GPU clocks set to \"(gpuClkMin %s, gpuClkMax %s)\" for GPU %s\n", c->lgc_text[0], c->lgc_text[1], bus);
        return 0;
    case SET_LMC:
    case SET_RMC:
        r = c->kind == SET_LMC ? NV(nvmlDeviceSetMemoryLockedClocks, d->h, c->value, c->value2)
                               : NV(nvmlDeviceResetMemoryLockedClocks, d->h);
        if (r == NVML_ERROR_NO_PERMISSION) {
            printf("The current user does not have permission to change clocks for GPU %s.\n", bus);
            return set_failed(r);
        }
        if (r != NVML_SUCCESS) {
            printf("Failed to %s memory clocks for GPU %s: %s\n", c->kind == SET_LMC ? "lock" : "reset", bus,
                   nvml_error(r));
            return set_failed(r);
        }
        if (c->kind == SET_LMC)
            printf("Memory clocks set to \"(memClkMin %s, memClkMax %s)\" for GPU %s\n", c->lgc_text[0], c->lgc_text[1],
                   bus);
        return 0;
    case SET_AC:
    case SET_RAC:
        r = c->kind == SET_AC ? NV(nvmlDeviceSetApplicationsClocks, d->h, c->value, c->value2)
                              : NV(nvmlDeviceResetApplicationsClocks, d->h);
        if (r == NVML_ERROR_NOT_SUPPORTED) {
            not_supported_warning(c->kind == SET_AC ? "Setting applications clocks" : "Resetting applications clocks",
                                  bus);
            return 0;
        }
        if (r == NVML_ERROR_NO_PERMISSION) {
            printf("The current user does not have permission to change clocks for GPU %s.\n", bus);
            return set_failed(r);
        }
        if (r == NVML_ERROR_INVALID_ARGUMENT && c->kind == SET_AC) {
            printf("Specified clock combination \"(MEM %u, SM %u)\" is not supported for GPU %s. Run 'nvidia-smi -q -d "
                   "SUPPORTED_CLOCKS' to see list of supported clock combinations\n", c->value, c->value2, bus);
            return set_failed(r);
        }
        if (r != NVML_SUCCESS) {
            printf("Failed to %s applications clocks for GPU %s: %s\n", c->kind == SET_AC ? "set" : "reset", bus,
                   nvml_error(r));
            return set_failed(r);
        }
        if (c->kind == SET_AC) /* -rac prints only the closing "All done." */
            printf("Applications clocks set to \"(MEM %u, SM %u)\" for GPU %s\n", c->value, c->value2, bus);
        return 0;
    case SET_ECC:
        r = NV(nvmlDeviceSetEccMode, d->h, c->value ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
        if (r != NVML_SUCCESS) {
            printf("Unable to set the ECC mode for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("%s ECC support for GPU %s.\n", c->value ? "Enabled" : "Disabled", bus);
        return 0;
    case SET_CLEAR_ECC:
        r = NV(nvmlDeviceClearEccErrorCounts, d->h, (nvmlEccCounterType_t)c->value);
        if (r != NVML_SUCCESS) {
            printf("Unable to reset ECC error count for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("Reset %s ECC errors to zero for GPU %s.\n", c->value == NVML_AGGREGATE_ECC ? "aggregate" : "volatile",
               bus);
        return 0;
    case SET_AM:
        r = NV(nvmlDeviceSetAccountingMode, d->h, c->value ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
        if (r != NVML_SUCCESS) {
            printf("Unable to set accounting mode for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("%s Accounting Mode for GPU %s.\n", c->value ? "Enabled" : "Disabled", bus);
        return 0;
    case SET_CAA:
        r = NV(nvmlDeviceClearAccountingPids, d->h);
        if (r != NVML_SUCCESS) {
            printf("Unable to clear accounted PIDs for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("Cleared Accounted PIDs for GPU %s.\n", bus);
        return 0;
    case SET_AUTO_BOOST:
        r = NV(nvmlDeviceSetDefaultAutoBoostedClocksEnabled, d->h,
               c->value ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED, 0);
        if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND) {
            printf("Enabling/disabling default auto boosted clocks is not supported for GPU: %s.\nTreating as warning "
                   "and moving on.\n", bus);
            return 0;
        }
        if (r != NVML_SUCCESS) {
            printf("Unable to set default auto boosted clocks for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        return 0;
    case SET_GOM:
        r = NV(nvmlDeviceSetGpuOperationMode, d->h, (nvmlGpuOperationMode_t)c->value);
        if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND) {
            not_supported_warning("Setting GPU operation mode", bus);
            return 0;
        }
        if (r != NVML_SUCCESS) {
            printf("Unable to set GPU operation mode for GPU %s: %s\n", bus, nvml_error(r));
            return set_failed(r);
        }
        printf("GPU operation mode set for GPU %s.\n", bus);
        return 0;
    case SET_RESET:
        return reset_gpu(d, bus);
    default:
        return 0;
    }
}

static int cmd_set(const struct set_cmd *c)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        if (g_devs[i].err != NVML_SUCCESS) {
            print_handle_error(&g_devs[i]);
            return set_failed(g_devs[i].err);
        }
        int rc = set_one(c, &g_devs[i]);
        if (rc) {
            fflush(stdout);
            return rc;
        }
    }
    printf("All done.\n");
    if (c->kind == SET_ECC) /* the new mode is pending until the GPU is reset */
        printf("Reboot required.\n");
    return 0;
}

/* The configuration options, as the help names them: long, short (NULL: none), what they set. */
static const struct {
    const char *longname, *shortname;
    enum set_kind kind;
    int takes_value;
} SET_OPTIONS[] = {
    {"--persistence-mode", "-pm", SET_PM, 1}, {"--compute-mode", "-c", SET_CM, 1},
    {"--power-limit", "-pl", SET_PL, 1}, {"--lock-gpu-clocks", "-lgc", SET_LGC, 1},
    {"--reset-gpu-clocks", "-rgc", SET_RGC, 0}, {"--applications-clocks", "-ac", SET_AC, 1},
    {"--reset-applications-clocks", "-rac", SET_RAC, 0}, {"--lock-memory-clocks", "-lmc", SET_LMC, 1},
    {"--reset-memory-clocks", "-rmc", SET_RMC, 0}, {"--ecc-config", "-e", SET_ECC, 1},
    {"--reset-ecc-errors", "-p", SET_CLEAR_ECC, 1}, {"--accounting-mode", "-am", SET_AM, 1},
    {"--clear-accounted-apps", "-caa", SET_CAA, 0}, {"--auto-boost-default", NULL, SET_AUTO_BOOST, 1},
    {"--gom", NULL, SET_GOM, 1}, {"--gpu-reset", "-r", SET_RESET, 0},
};

static int is_opt(const char *a, const char *longname, const char *shortname);

static int set_option(const char *a)
{
    for (int k = 0; k < (int)(sizeof(SET_OPTIONS) / sizeof(SET_OPTIONS[0])); k++)
        if (is_opt(a, SET_OPTIONS[k].longname, SET_OPTIONS[k].shortname))
            return k;
    return -1;
}

/* The value of c->kind's option into c; -1 if it does not parse. */
static int parse_set_value(const char *v, struct set_cmd *c)
{
    switch (c->kind) {
    case SET_PM: case SET_ECC: case SET_AM: case SET_AUTO_BOOST: return parse_enable(v, &c->value);
    case SET_CM: return parse_compute_mode(v, &c->value);
    case SET_PL: return parse_watts(v, &c->value);
    case SET_LGC: case SET_LMC: return parse_lgc(v, c);
    case SET_AC: return parse_ac(v, c);
    case SET_GOM: return parse_gom(v, &c->value);
    case SET_CLEAR_ECC: /* 0: volatile, 1: aggregate (nvmlEccCounterType_t) */
        if ((v[0] == '0' || v[0] == '1') && !v[1])
            return c->value = (unsigned)(v[0] - '0'), 0;
        return -1;
    default: return -1;
    }
}

/* ---- command line --------------------------------------------------------------------- */

static void set_branch(void)
{
    g_rec = NULL;
    if (g_branch < 570) {
        g_rec = &BRANCHES[0];
        for (const struct branch *b = BRANCHES; b->branch; b++)
            if (b->branch <= g_branch)
                g_rec = b;
    }
    g_fields = g_rec ? g_rec->fields : QUERY_GPU_FIELDS;
    g_colon = g_rec ? g_rec->colon : g_branch >= 595 ? TEXT_595_COLON : TEXT_590_COLON;
}

/* The branch before the command line is parsed (the help texts and the answer to an unknown
   argument are the branch's): the driver is asked quietly; without one, the 590 layouts. */
static const char *probe_branch(void)
{
    const char *version = HELP_VERSION;
    if (load_nvml() == 0 && NV(nvmlInit_v2) == NVML_SUCCESS) {
        if (NV(nvmlSystemGetDriverVersion, g_driver, sizeof(g_driver)) == NVML_SUCCESS && atoi(g_driver) > 0) {
            g_branch = atoi(g_driver);
            version = g_driver;
        }
        NV(nvmlShutdown);
    }
    set_branch();
    return version;
}

/* An argument the tool does not know: the recorded branch's message ("ERROR: Option X is not
   recognized..." from 535, the invalid-combination line before) and exit code. */
static int unknown_option(const char *a)
{
    probe_branch();
    if (!g_rec) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    const char *at = strstr(g_rec->unknown, "%s");
    if (at)
        printf("%.*s%s%s", (int)(at - g_rec->unknown), g_rec->unknown, a, at + 2);
    else
        fputs(g_rec->unknown, stdout);
    return g_rec->unknown_rc;
}

/* -h and the --help-query-* texts are the driver's branch's, -h headed by its version as the real
   tool's by its own. The accounted-apps, retired-pages and remapped-rows texts are recorded for
   470-550 only; from 570 those options stay unknown. */
static int print_help(const char *option, int which)
{
    const char *version = probe_branch();
    const char *text = NULL;
    switch (which) {
    case 0:
        printf("NVIDIA System Management Interface -- v%s\n", version);
        text = g_rec ? g_rec->help : HELP_TEXT;
        break;
    case 1: text = g_rec ? g_rec->help_query_gpu : HELP_QUERY_GPU; break;
    case 2: text = g_rec ? g_rec->help_query_apps : HELP_QUERY_COMPUTE_APPS; break;
    case 3: text = g_rec ? g_rec->help_query_accounted : NULL; break;
    case 4: text = g_rec ? g_rec->help_query_retired : NULL; break;
    default: text = g_rec ? g_rec->help_query_remapped : NULL; break;
    }
    if (!text)
        return unknown_option(option);
    fputs(text, stdout);
    return 0;
}

static int init_nvml(void)
{
    if (load_nvml() != 0) {
        printf("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
               "Display Driver is properly installed and present in your system.\nPlease also try adding directory "
               "that contains libnvidia-ml.so to your system PATH.\n");
        return EXIT_NO_LIB;
    }
    nvmlReturn_t r = NV(nvmlInit_v2);
    if (r == NVML_ERROR_DRIVER_NOT_LOADED || r == NVML_ERROR_FUNCTION_NOT_FOUND || r == NVML_ERROR_LIBRARY_NOT_FOUND) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.\n");
        return EXIT_NO_DRIVER;
    }
    if (r != NVML_SUCCESS) {
        printf("Failed to initialize NVML: %s\n", nvml_error(r));
        return r > 0 && r < 255 ? (int)r : EXIT_OTHER;
    }
    NV(nvmlSystemGetDriverVersion, g_driver, sizeof(g_driver));
    g_branch = atoi(g_driver) > 0 ? atoi(g_driver) : 590;
    set_branch();
    int cv = 0;
    if (NV(nvmlSystemGetCudaDriverVersion_v2, &cv) == NVML_SUCCESS && cv > 0)
        snprintf(g_cuda, sizeof(g_cuda), "%d.%d", cv / 1000, (cv % 1000) / 10);
    if (NV(nvmlDeviceGetCount_v2, &g_count) != NVML_SUCCESS)
        g_count = 0;
    init_units();
    return 0;
}

static const char *opt_value(int argc, char **argv, int *i, const char *longname, const char *shortname)
{
    const char *a = argv[*i];
    size_t l = strlen(longname);
    if (!strncmp(a, longname, l) && a[l] == '=')
        return a + l + 1;
    if ((!strcmp(a, longname) || (shortname && !strcmp(a, shortname))) && *i + 1 < argc)
        return argv[++*i];
    if (shortname && !strncmp(a, shortname, strlen(shortname)) && a[strlen(shortname)] == '=')
        return a + strlen(shortname) + 1;
    return NULL;
}

static int is_opt(const char *a, const char *longname, const char *shortname)
{
    size_t l = strlen(longname);
    return !strcmp(a, longname) || (!strncmp(a, longname, l) && a[l] == '=') ||
           (shortname && (!strcmp(a, shortname) || (!strncmp(a, shortname, strlen(shortname)) && a[strlen(shortname)] == '=')));
}

/* `nvidia-smi mig ...`: its own options, then the same start as every mode. */
static int main_mig(int argc, char **argv)
{
    struct mig_cmd c;
    const char *ids = NULL;
    if (mig_parse(argc, argv, &c, &ids) != 0)
        return printf("%s", MSG_INVALID), EXIT_INVALID;
    int rc = init_nvml();
    if (rc)
        return rc;
    if (g_count == 0 || select_devices(ids) != 0 || g_ndevs == 0) {
        printf("%s", MSG_NO_DEVICES);
        return EXIT_NOT_FOUND;
    }
    rc = cmd_mig(&c);
    NV(nvmlShutdown);
    return rc;
}

int main(int argc, char **argv)
{
    enum { M_TABLE, M_LIST, M_QUERY, M_XML, M_QGPU, M_QAPPS, M_QACCT, M_TOPO, M_NVLINK, M_DMON, M_PMON, M_VERSION } mode = M_TABLE;
    const char *ids = NULL, *fields = NULL, *format = NULL, *dsections = NULL;
    long loop_ms = 0, count = 0, delay = 1;
    char nvmode = 0;
    int q = 0, x = 0, nset = 0, k, mig_mode = -1;
    struct set_cmd set = {0};

    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int argi = 1;
    if (argc > 1 && argv[1][0] != '-') {
        const char *sub = argv[1];
        if (!strcmp(sub, "topo")) mode = M_TOPO;
        else if (!strcmp(sub, "nvlink")) mode = M_NVLINK;
        else if (!strcmp(sub, "dmon")) mode = M_DMON;
        else if (!strcmp(sub, "pmon")) mode = M_PMON;
        else if (!strcmp(sub, "mig")) return main_mig(argc, argv);
        else
            return unknown_option(sub);
        argi = 2;
    }
    for (int i = argi; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            return print_help(a, 0);
        } else if (!strcmp(a, "--help-query-gpu")) {
            return print_help(a, 1);
        } else if (!strcmp(a, "--help-query-compute-apps")) {
            return print_help(a, 2);
        } else if (!strcmp(a, "--help-query-accounted-apps")) {
            return print_help(a, 3);
        } else if (!strcmp(a, "--help-query-retired-pages")) {
            return print_help(a, 4);
        } else if (!strcmp(a, "--help-query-remapped-rows")) {
            return print_help(a, 5);
        } else if (!strcmp(a, "--version")) {
            if (probe_branch() && g_rec && !strstr(g_rec->help, "--version"))
                return unknown_option(a); /* not an option before 550 */
            mode = M_VERSION;
        } else if (!strcmp(a, "-L") || !strcmp(a, "--list-gpus")) {
            mode = M_LIST;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--query") || !strcmp(a, "-a")) {
            q = 1;
        } else if (!strcmp(a, "-x") || !strcmp(a, "--xml-format")) {
            x = 1;
        } else if (mode == M_TOPO && !strcmp(a, "-m")) {
        } else if (mode == M_NVLINK && (!strcmp(a, "-s") || !strcmp(a, "-c") || !strcmp(a, "-e"))) {
            nvmode = a[1];
        } else if (mode == M_NVLINK && (!strcmp(a, "--status") || !strcmp(a, "--capabilities") || !strcmp(a, "--error-counters"))) {
            nvmode = !strcmp(a, "--status") ? 's' : !strcmp(a, "--capabilities") ? 'c' : 'e';
        } else if ((mode == M_DMON || mode == M_PMON) && (v = opt_value(argc, argv, &i, "--count", "-c"))) {
            count = strtol(v, NULL, 10);
            if (count <= 0)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if ((mode == M_DMON || mode == M_PMON) && (v = opt_value(argc, argv, &i, "--delay", "-d"))) {
            delay = strtol(v, NULL, 10);
            if (delay <= 0 || delay > 86400)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if ((mode == M_DMON || mode == M_PMON) && (is_opt(a, "--count", "-c") || is_opt(a, "--delay", "-d"))) {
            return printf("%s", MSG_INVALID), EXIT_INVALID;  /* -c / -d without a value */
        } else if (argi == 1 && (k = set_option(a)) >= 0) {
            /* Device modification options: "[any one of]", each with a value or none. */
            set.kind = SET_OPTIONS[k].kind;
            nset++;
            if (SET_OPTIONS[k].takes_value) {
                v = opt_value(argc, argv, &i, SET_OPTIONS[k].longname, SET_OPTIONS[k].shortname);
                if (!v || parse_set_value(v, &set))
                    return printf("%s", MSG_INVALID), EXIT_INVALID;
            } else if (strchr(a, '=')) {
                return printf("%s", MSG_INVALID), EXIT_INVALID;
            }
        } else if (argi == 1 && is_opt(a, "--multi-instance-gpu", "-mig")) {
            v = opt_value(argc, argv, &i, "--multi-instance-gpu", "-mig");
            unsigned on = 0;
            if (!v || parse_enable(v, &on))
                return printf("%s", MSG_INVALID), EXIT_INVALID;
            mig_mode = (int)on;
            nset++;
        } else if (is_opt(a, "--id", "-i")) {
            ids = opt_value(argc, argv, &i, "--id", "-i");
            if (!ids || !*ids)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (!strncmp(a, "-i", 2) && a[2] && isdigit((unsigned char)a[2])) {
            ids = a + 2;
        } else if (is_opt(a, "--query-gpu", NULL)) {
            fields = opt_value(argc, argv, &i, "--query-gpu", NULL);
            mode = M_QGPU;
        } else if (is_opt(a, "--query-compute-apps", NULL)) {
            fields = opt_value(argc, argv, &i, "--query-compute-apps", NULL);
            mode = M_QAPPS;
        } else if (is_opt(a, "--query-accounted-apps", NULL)) {
            fields = opt_value(argc, argv, &i, "--query-accounted-apps", NULL);
            mode = M_QACCT;
        } else if (is_opt(a, "--format", NULL)) {
            format = opt_value(argc, argv, &i, "--format", NULL);
        } else if (is_opt(a, "--display", "-d")) {
            dsections = opt_value(argc, argv, &i, "--display", "-d");
            if (!dsections)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (is_opt(a, "--loop-ms", "-lms")) {
            v = opt_value(argc, argv, &i, "--loop-ms", "-lms");
            loop_ms = v ? strtol(v, NULL, 10) : 0;
            if (loop_ms <= 0)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (is_opt(a, "--loop", "-l")) {
            v = opt_value(argc, argv, &i, "--loop", "-l");
            /* "-l" alone loops every 5 seconds */
            loop_ms = v ? strtol(v, NULL, 10) * 1000 : 5000;
            if (v && !isdigit((unsigned char)v[0]))
                return printf("%s", MSG_INVALID), EXIT_INVALID;
            if (loop_ms <= 0)
                loop_ms = 5000;
        } else {
            return unknown_option(a);
        }
    }
    /* A configuration command is one of its kind and goes with nothing but -i. */
    if (nset > 1 || (nset && (mode != M_TABLE || q || x || fields || format || dsections || loop_ms))) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    if (mode == M_TABLE && x && !q && !nset && !fields && !format && !dsections) { /* real 470-550 */
        printf("Invalid combination of input arguments. Specify -q/--query and -x/--xml-format to run an XML query.  "
               "Please run 'nvidia-smi -h' for help.\n\n");
        return EXIT_INVALID;
    }
    if (mode == M_TABLE && q)
        mode = x ? M_XML : M_QUERY;
    if ((mode == M_QGPU || mode == M_QAPPS || mode == M_QACCT) && (!fields || !*fields || !format || parse_format(format) != 0)) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    if (dsections && (!(mode == M_QUERY || mode == M_XML) || parse_sections(dsections) != 0)) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    if (mode == M_NVLINK && !nvmode)
        nvmode = 's';

    int rc = init_nvml();
    if (rc)
        return rc;
    if (g_rec && dsections && mode == M_XML) { /* real 470-550 */
        printf("Invalid combination of input arguments: --display/-d flags can not be combined with -x/--xml-format "
               "flags.\n");
        return EXIT_INVALID;
    }
    if (mode == M_VERSION)
        return cmd_version();
    if (g_count == 0) {
        printf("%s", MSG_NO_DEVICES);
        return EXIT_NOT_FOUND;
    }
    if (select_devices(ids) != 0 || g_ndevs == 0) {
        printf("%s", MSG_NO_DEVICES);
        return EXIT_NOT_FOUND;
    }

    if (mig_mode >= 0) {
        rc = cmd_mig_mode((unsigned)mig_mode);
        NV(nvmlShutdown);
        return rc;
    }
    if (nset) {
        rc = cmd_set(&set);
        NV(nvmlShutdown);
        return rc;
    }

    struct col cols[512];
    int ncols = 0, app_idx[16];
    const char *app_spelled[16];
    if (mode == M_QGPU) {
        ncols = parse_gpu_fields(fields, cols, 512);
        if (ncols <= 0)
            return EXIT_INVALID;
    } else if (mode == M_QAPPS || mode == M_QACCT) {
        ncols = parse_fields_of(fields, app_idx, app_spelled, 16, mode == M_QACCT);
        if (ncols <= 0)
            return EXIT_INVALID;
    }

    for (long it = 0; !g_stop; it++) {
        if (it)
            sleep_ms(loop_ms);
        if (g_stop)
            break;
        g_exit = 0;
        switch (mode) {
        case M_LIST: rc = cmd_list(); break;
        case M_QUERY: rc = cmd_query(); break;
        case M_XML: rc = cmd_xml(); break;
        case M_TOPO: rc = cmd_topo(); break;
        case M_NVLINK: rc = cmd_nvlink(nvmode); break;
        case M_DMON: rc = cmd_dmon(count, delay); break;
        case M_PMON: rc = cmd_pmon(count, delay); break;
        case M_QGPU:
            if (it == 0)
                print_header(cols, ncols, fields);
            query_gpu_once(cols, ncols);
            rc = g_exit;
            break;
        case M_QAPPS:
        case M_QACCT:
            if (it == 0 && !g_noheader) {
                for (int c = 0; c < ncols; c++) { /* each field by its first name, as --query-gpu */
                    const char *unit = mode == M_QACCT ? ACCT_FIELDS[app_idx[c]].unit : APP_FIELDS[app_idx[c]].unit;
                    const char *name = mode == M_QACCT ? ACCT_FIELDS[app_idx[c]].name : APP_FIELDS[app_idx[c]].name;
                    printf("%s%s", c ? ", " : "", name);
                    if (!g_nounits && *unit)
                        printf(" [%s]", unit);
                }
                printf("\n");
            }
            if (mode == M_QACCT)
                query_accounted_once(app_idx, ncols);
            else
                query_apps_once(app_idx, ncols);
            rc = 0;
            break;
        default: rc = cmd_table(); break;
        }
        fflush(stdout);
        if (!loop_ms || mode == M_DMON || mode == M_PMON || mode == M_TOPO || mode == M_NVLINK)
            break;
    }
    NV(nvmlShutdown);
    return rc;
}
