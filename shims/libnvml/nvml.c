/*
 * libnvidia-ml.so.1 for a simulated node: answers from the mokkafs shared state file
 * (layout and protocol in mokka_state.h). Functions not written here are generated
 * NOT_SUPPORTED stubs (nvml_stubs.c, by shims/gen_nvml.py); the export list is generated too.
 *
 * Host safety: no abort(), no unbounded waits; a missing, short or foreign state file is
 * NVML_ERROR_DRIVER_NOT_LOADED; errno is restored by every function that makes a syscall;
 * the mapping is kept across nvmlShutdown so a racing thread never touches unmapped memory,
 * and released by the library destructor (dlclose).
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"
#include "mokka_client.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* ---- state mapping -------------------------------------------------------------------- */

/* Finding, mapping, re-checking and reading the state is the shared client's (mokka_client.h);
   what is left here is NVML's view of it: handles, the init refcount and NVML's error codes. */

struct nvmlDevice_st { unsigned int index; };
static struct nvmlDevice_st g_devices[MOKKA_MAX_GPUS];

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;                          /* guarded by g_lock */
static int g_initialized;                       /* read atomically */

#define ATOMIC_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)

static inline int initialized(void) { return ATOMIC_LOAD(&g_initialized); }
static inline const struct mokka_state *state(void) { return mokka_state(); }

/* Copy n bytes at src (inside the mapping) consistently under the seqlock. */
static inline void snap(const struct mokka_state *s, const void *src, void *dst, size_t n) { mokka_read(s, src, dst, n); }

#define SNAP(s, field, out) MOKKA_SNAP((s), (field), (out))

/* Map (or keep) the state file. Called with g_lock held. */
static nvmlReturn_t map_state(void)
{
    switch (mokka_open()) {
    case MOKKA_OK: return NVML_SUCCESS;
    case MOKKA_MISMATCH: return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    default: return NVML_ERROR_DRIVER_NOT_LOADED;
    }
}

static unsigned int gpu_count(const struct mokka_state *s) { return mokka_gpu_count(s); }

/* A device handle is the address of one of g_devices' elements, exactly: the offset test never
   reads through the caller's pointer, so a stray pointer (or one a few bytes into the array)
   costs a subtraction and two compares, not a fault. */
static inline int handle_ok(nvmlDevice_t d)
{
    uintptr_t off = (uintptr_t)d - (uintptr_t)g_devices;
    return off < sizeof(g_devices) && off % sizeof(g_devices[0]) == 0;
}

/* The common prologue: initialised, a valid handle, and (unless allowed) not lost. */
static inline nvmlReturn_t dev_check(nvmlDevice_t d, int allow_lost, const struct mokka_state **sp,
                                     const struct mokka_gpu **gp)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    const struct mokka_state *s = state();
    if (!s || !handle_ok(d) || d->index >= gpu_count(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_gpu *g = &s->gpus[d->index];
    if (!allow_lost && __atomic_load_n(&g->lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    *sp = s;
    *gp = g;
    return NVML_SUCCESS;
}

#define DEV(d)                                                       \
    const struct mokka_state *s;                                     \
    const struct mokka_gpu *g;                                       \
    do {                                                             \
        nvmlReturn_t r_ = dev_check((d), 0, &s, &g);                 \
        if (r_ != NVML_SUCCESS)                                      \
            return r_;                                               \
    } while (0)

/* Identity survives a fall off the bus: the driver keeps what it probed, and health checkers
   (the device plugin) need the UUID of the GPU an Xid 79 event names. */
#define DEV_STATIC(d)                                                \
    const struct mokka_state *s;                                     \
    const struct mokka_gpu *g;                                       \
    do {                                                             \
        nvmlReturn_t r_ = dev_check((d), 1, &s, &g);                 \
        if (r_ != NVML_SUCCESS)                                      \
            return r_;                                               \
    } while (0)

#define ARG(p)                                                       \
    do {                                                             \
        if (!(p))                                                    \
            return NVML_ERROR_INVALID_ARGUMENT;                      \
    } while (0)

static nvmlReturn_t copy_string(const struct mokka_state *s, const char *field, size_t field_len, char *out,
                                unsigned int length)
{
    char buf[128];
    if (field_len > sizeof(buf))
        field_len = sizeof(buf);
    snap(s, field, buf, field_len);
    buf[field_len - 1] = '\0';
    size_t n = strlen(buf);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, buf, n + 1);
    return NVML_SUCCESS;
}

#define STRING(field, out, length) copy_string(s, (field), sizeof(field), (out), (length))

/* ---- init, shutdown, errors ----------------------------------------------------------- */

static nvmlReturn_t init_common(void)
{
    int saved = errno;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_refcount == 0) {
        r = map_state();
        if (r == NVML_SUCCESS) {
            for (unsigned i = 0; i < MOKKA_MAX_GPUS; i++)
                g_devices[i].index = i;
            __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
        }
    }
    if (r == NVML_SUCCESS)
        g_refcount++;
    pthread_mutex_unlock(&g_lock);
    errno = saved;
    return r;
}

nvmlReturn_t DECLDIR nvmlInit(void) { return init_common(); }
nvmlReturn_t DECLDIR nvmlInit_v2(void) { return init_common(); }
nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags) { (void)flags; return init_common(); }

nvmlReturn_t DECLDIR nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_refcount == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else if (--g_refcount == 0)
        __atomic_store_n(&g_initialized, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return r;
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result)
{
    switch ((int)result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "The provided version is invalid/unsupported";
    case NVML_ERROR_DEPRECATED: return "Requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "The GPU was not found";
    case NVML_ERROR_INVALID_STATE: return "The GPU is in an invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system --------------------------------------------------------------------------- */

#define SYS()                                                        \
    if (!initialized())                                              \
        return NVML_ERROR_UNINITIALIZED;                             \
    const struct mokka_state *s = state()

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SYS();
    return STRING(s->driver_version, version, length);
}

nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    SYS();
    return STRING(s->nvml_version, version, length);
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    SYS();
    ARG(cudaDriverVersion);
    uint32_t v;
    SNAP(s, s->cuda_version, v);
    *cudaDriverVersion = (int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t DECLDIR nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int saved = errno;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%u/comm", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    if (fd >= 0)
        close(fd);
    errno = saved;
    if (n <= 0)
        return NVML_ERROR_NOT_FOUND;
    while (n > 0 && buf[n - 1] == '\n')
        n--;
    buf[n] = '\0';
    if ((size_t)length < (size_t)n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(name, buf, (size_t)n + 1);
    return NVML_SUCCESS;
}

/* ---- enumeration and handles ---------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    SYS();
    ARG(deviceCount);
    s = mokka_state_checked(); /* pollers count devices each round: a good time to look */
    *deviceCount = gpu_count(s);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

static nvmlReturn_t handle_for(const struct mokka_state *s, unsigned int i, nvmlDevice_t *device)
{
    /* A GPU that fell off the bus has no handle to give, as nvidia-smi's "Unable to determine
       the device handle for GPU...: GPU is lost" shows. */
    if (__atomic_load_n(&s->gpus[i].lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    *device = &g_devices[i];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    SYS();
    ARG(device);
    if (index >= gpu_count(s))
        return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for(s, index, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static int field_equals(const struct mokka_state *s, const char *field, size_t len, const char *want, int fold)
{
    char buf[128];
    if (len > sizeof(buf))
        len = sizeof(buf);
    snap(s, field, buf, len);
    buf[len - 1] = '\0';
    return fold ? strcasecmp(buf, want) == 0 : strcmp(buf, want) == 0;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    SYS();
    ARG(uuid);
    ARG(device);
    for (unsigned i = 0; i < gpu_count(s); i++)
        if (field_equals(s, s->gpus[i].uuid, sizeof(s->gpus[i].uuid), uuid, 0))
            return handle_for(s, i, device);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    SYS();
    ARG(serial);
    ARG(device);
    for (unsigned i = 0; i < gpu_count(s); i++)
        if (field_equals(s, s->gpus[i].serial, sizeof(s->gpus[i].serial), serial, 0))
            return handle_for(s, i, device);
    return NVML_ERROR_NOT_FOUND;
}

/* The documented forms (mokka_parse_bus_id): "DDDD:BB:DD.F" with a 4- or 8-digit domain,
   "DDDD:BB:DD" and "BB:DD.F" (domain 0), any case. */
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    SYS();
    ARG(pciBusId);
    ARG(device);
    struct mokka_bus_id id;
    if (mokka_parse_bus_id(pciBusId, &id) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < gpu_count(s); i++)
        if (mokka_bus_id_is(s, i, &id))
            return handle_for(s, i, device);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- identity ------------------------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEV_STATIC(device);
    return STRING(g->name, name, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEV_STATIC(device);
    return STRING(g->uuid, uuid, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEV_STATIC(device);
    return STRING(g->serial, serial, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char *partNumber, unsigned int length)
{
    DEV(device);
    return STRING(g->board_part_number, partNumber, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    DEV(device);
    return STRING(g->vbios_version, version, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    DEV(device);
    return STRING(g->inforom_image, version, length);
}

nvmlReturn_t DECLDIR nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object, char *version,
                                                 unsigned int length)
{
    DEV(device);
    switch (object) {
    case NVML_INFOROM_OEM: return STRING(g->inforom_oem, version, length);
    case NVML_INFOROM_ECC: return STRING(g->inforom_ecc, version, length);
    case NVML_INFOROM_POWER:
        if (field_equals(s, g->inforom_power, sizeof(g->inforom_power), "N/A", 0))
            return NVML_ERROR_NOT_SUPPORTED;
        return STRING(g->inforom_power, version, length);
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

#define U32_GETTER(fn, field, check)                                              \
    nvmlReturn_t DECLDIR fn(nvmlDevice_t device, unsigned int *out)               \
    {                                                                             \
        check(device);                                                            \
        ARG(out);                                                                 \
        uint32_t v;                                                               \
        SNAP(s, g->field, v);                                                     \
        *out = v;                                                                 \
        return NVML_SUCCESS;                                                      \
    }

U32_GETTER(nvmlDeviceGetIndex, index, DEV_STATIC)
U32_GETTER(nvmlDeviceGetMinorNumber, minor, DEV_STATIC)
U32_GETTER(nvmlDeviceGetBoardId, board_id, DEV)
U32_GETTER(nvmlDeviceGetModuleId, module_id, DEV)
U32_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen, DEV)
U32_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_max_gen, DEV)
U32_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width, DEV)
U32_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_cur_gen, DEV)
U32_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_cur_width, DEV)
U32_GETTER(nvmlDeviceGetPcieReplayCounter, pcie_replay, DEV)
U32_GETTER(nvmlDeviceGetMemoryBusWidth, mem_bus_width, DEV)
U32_GETTER(nvmlDeviceGetPowerUsage, power_usage, DEV)
U32_GETTER(nvmlDeviceGetPowerManagementLimit, power_limit, DEV)
U32_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, power_default_limit, DEV)
U32_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_enforced_limit, DEV)

nvmlReturn_t DECLDIR nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int *multiGpuBool)
{
    DEV(device);
    ARG(multiGpuBool);
    *multiGpuBool = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t device, unsigned int *maxSpeed)
{
    static const unsigned mbps[] = {0, 2500, 5000, 8000, 16000, 32000, 64000};
    DEV(device);
    ARG(maxSpeed);
    uint32_t gen;
    SNAP(s, g->pcie_max_gen, gen);
    *maxSpeed = gen < 7 ? mbps[gen] : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value)
{
    DEV(device);
    ARG(value);
    uint32_t v;
    if (counter == NVML_PCIE_UTIL_TX_BYTES)
        SNAP(s, g->pcie_tx_kbps, v);
    else if (counter == NVML_PCIE_UTIL_RX_BYTES)
        SNAP(s, g->pcie_rx_kbps, v);
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    *value = v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    DEV(device);
    ARG(type);
    uint32_t v;
    SNAP(s, g->brand, v);
    *type = (nvmlBrandType_t)v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    DEV(device);
    ARG(arch);
    uint32_t v;
    SNAP(s, g->architecture, v);
    *arch = v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEV(device);
    ARG(major);
    ARG(minor);
    uint32_t v[2];
    MOKKA_CONSISTENT(s) {
        v[0] = g->cc_major;
        v[1] = g->cc_minor;
    }
    *major = (int)v[0];
    *minor = (int)v[1];
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    DEV(device);
    ARG(node);
    int32_t v;
    SNAP(s, g->numa_node, v);
    if (v < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)v;
    return NVML_SUCCESS;
}

static void fill_pci(const struct mokka_state *s, const struct mokka_gpu *g, nvmlPciInfo_t *pci, int legacy_bus_id)
{
    struct mokka_gpu c;
    MOKKA_CONSISTENT(s) {
        memcpy(c.bus_id, g->bus_id, sizeof(c.bus_id));
        memcpy(c.bus_id_legacy, g->bus_id_legacy, sizeof(c.bus_id_legacy));
        c.pci_domain = g->pci_domain;
        c.pci_bus = g->pci_bus;
        c.pci_device = g->pci_device;
        c.pci_device_id = g->pci_device_id;
        c.pci_subsystem_id = g->pci_subsystem_id;
    }
    memset(pci, 0, sizeof(*pci));
    c.bus_id[sizeof(c.bus_id) - 1] = c.bus_id_legacy[sizeof(c.bus_id_legacy) - 1] = '\0';
    /* v1 (nvmlDeviceGetPciInfo) reported the legacy 4-digit domain in busId too. */
    snprintf(pci->busId, sizeof(pci->busId), "%s", legacy_bus_id ? c.bus_id_legacy : c.bus_id);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%s", c.bus_id_legacy);
    pci->domain = c.pci_domain;
    pci->bus = c.pci_bus;
    pci->device = c.pci_device;
    pci->pciDeviceId = c.pci_device_id;
    pci->pciSubSystemId = c.pci_subsystem_id;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEV_STATIC(device);
    ARG(pci);
    fill_pci(s, g, pci, 0);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    DEV_STATIC(device);
    ARG(pci);
    if (pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlPciInfo_t base;
    uint32_t cls;
    fill_pci(s, g, &base, 0);
    SNAP(s, g->pci_class, cls);
    memset(pci, 0, sizeof(*pci));
    pci->version = nvmlPciInfoExt_v1;
    pci->domain = base.domain;
    pci->bus = base.bus;
    pci->device = base.device;
    pci->pciDeviceId = base.pciDeviceId;
    pci->pciSubSystemId = base.pciSubSystemId;
    pci->baseClass = (cls >> 16) & 0xFF;
    pci->subClass = (cls >> 8) & 0xFF;
    snprintf(pci->busId, sizeof(pci->busId), "%s", base.busId);
    return NVML_SUCCESS;
}

/* Every board we simulate runs its GSP firmware, whose version is the driver's (the captures
   show gsp_firmware_version equal to driver_version on all seven boards). */
nvmlReturn_t DECLDIR nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version)
{
    DEV(device);
    ARG(version);
    return STRING(s->driver_version, version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *isEnabled,
                                                  unsigned int *defaultMode)
{
    DEV(device);
    ARG(isEnabled);
    ARG(defaultMode);
    *isEnabled = 1;
    *defaultMode = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEV_STATIC(device);
    ARG(pci);
    fill_pci(s, g, pci, 1);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    DEV(device);
    ARG(attributes);
    uint32_t sms;
    uint64_t total;
    SNAP(s, g->multiprocessor_count, sms);
    SNAP(s, g->mem_total, total);
    memset(attributes, 0, sizeof(*attributes));
    attributes->multiprocessorCount = sms;
    attributes->sharedCopyEngineCount = 0;
    attributes->gpuInstanceSliceCount = 0;
    attributes->computeInstanceSliceCount = 0;
    attributes->memorySizeMB = total >> 20;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* ---- memory --------------------------------------------------------------------------- */

struct mem4 { uint64_t total, reserved, used, free; };

static void read_mem(const struct mokka_state *s, const struct mokka_gpu *g, struct mem4 *m)
{
    MOKKA_CONSISTENT(s) {
        m->total = g->mem_total;
        m->reserved = g->mem_reserved;
        m->used = g->mem_used;
        m->free = g->mem_free;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEV(device);
    ARG(memory);
    struct mem4 m;
    read_mem(s, g, &m);
    /* v1 counts the reserved memory as used (consumer-contracts §8.4). */
    memory->total = m.total;
    memory->free = m.free;
    memory->used = m.used + m.reserved;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEV(device);
    ARG(memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct mem4 m;
    read_mem(s, g, &m);
    memory->total = m.total;
    memory->reserved = m.reserved;
    memory->free = m.free;
    memory->used = m.used;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    DEV(device);
    ARG(bar1Memory);
    uint64_t b[2];
    MOKKA_CONSISTENT(s) {
        b[0] = g->bar1_total;
        b[1] = g->bar1_used;
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
    ARG(temperature);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
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
    ARG(marginTempInfo);
    if (marginTempInfo->version != nvmlMarginTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
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

nvmlReturn_t DECLDIR nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                                  unsigned int *maxLimit)
{
    DEV(device);
    ARG(minLimit);
    ARG(maxLimit);
    uint32_t v[2];
    MOKKA_CONSISTENT(s) {
        v[0] = g->power_min_limit;
        v[1] = g->power_max_limit;
    }
    *minLimit = v[0];
    *maxLimit = v[1];
    return NVML_SUCCESS;
}

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
    uint32_t v[2];
    MOKKA_CONSISTENT(s) {
        v[0] = g->util_gpu;
        v[1] = g->util_mem;
    }
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

nvmlReturn_t DECLDIR nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    DEV(device);
    ARG(pState);
    uint32_t v;
    SNAP(s, g->pstate, v);
    *pState = (nvmlPstates_t)v;
    return NVML_SUCCESS;
}

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

nvmlReturn_t DECLDIR nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    DEV(device);
    ARG(mode);
    uint32_t v;
    SNAP(s, g->persistence_mode, v);
    *mode = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    DEV(device);
    ARG(mode);
    uint32_t v;
    SNAP(s, g->compute_mode, v);
    *mode = (nvmlComputeMode_t)v;
    return NVML_SUCCESS;
}

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

nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEV(device);
    ARG(currentMode);
    ARG(pendingMode);
    uint32_t capable;
    SNAP(s, g->mig_capable, capable);
    if (!capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    DEV_STATIC(device);
    ARG(isMigDevice);
    *isMigDevice = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    DEV(device);
    ARG(count);
    *count = 0; /* MIG is disabled on every simulated GPU */
    return NVML_SUCCESS;
}

/* ---- ECC, retired pages, remapped rows ------------------------------------------------ */

nvmlReturn_t DECLDIR nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    DEV(device);
    ARG(current);
    ARG(pending);
    uint32_t on;
    SNAP(s, g->ecc_enabled, on);
    *current = *pending = on ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
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
    DEV(device);
    ARG(count);
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
    *isPending = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
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

/* ---- processes ------------------------------------------------------------------------ */

/* The compute processes the daemon published for this GPU (from the CUDA shim's process table,
   docs/cuda.md). Graphics and MPS lists are always empty: no process draws or runs under MPS.
   Count protocol (pynvml, go-nvml): with *infoCount too small, INSUFFICIENT_SIZE and the count
   needed; with no processes, SUCCESS and 0, even when infos is NULL. */
static unsigned int read_processes(const struct mokka_state *s, const struct mokka_gpu *g,
                                   struct mokka_gpu_process *out)
{
    uint32_t n;
    (void)mokka_state_checked(); /* monitors list processes each round: a good time to look */
    MOKKA_CONSISTENT(s) { /* count and list from one snapshot */
        n = __atomic_load_n(&g->process_count, __ATOMIC_RELAXED);
        if (n > MOKKA_MAX_GPU_PROCS)
            n = MOKKA_MAX_GPU_PROCS;
        memcpy(out, g->processes, n * sizeof(*out));
    }
    return n;
}

#define PROCESS_LIST_GETTER(name, type, graphics_or_mps, fill)                                       \
    nvmlReturn_t DECLDIR name(nvmlDevice_t device, unsigned int *infoCount, type *infos)     \
    {                                                                                          \
        DEV(device);                                                                           \
        ARG(infoCount);                                                                        \
        struct mokka_gpu_process procs[MOKKA_MAX_GPU_PROCS];                                   \
        unsigned int n = (graphics_or_mps) ? 0 : read_processes(s, g, procs);                  \
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

#define NO_MIG (infos[i].gpuInstanceId = 0xFFFFFFFF, infos[i].computeInstanceId = 0xFFFFFFFF)
PROCESS_LIST_GETTER(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 0, (void)0)
PROCESS_LIST_GETTER(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 0, NO_MIG)
PROCESS_LIST_GETTER(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, 0, NO_MIG)
PROCESS_LIST_GETTER(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, 1, (void)0)
PROCESS_LIST_GETTER(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, 1, NO_MIG)
PROCESS_LIST_GETTER(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, 1, NO_MIG)
PROCESS_LIST_GETTER(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, 1, (void)0)
PROCESS_LIST_GETTER(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 1, NO_MIG)
PROCESS_LIST_GETTER(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, 1, NO_MIG)

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

/* ---- NVLink --------------------------------------------------------------------------- */

#define LINK(link)                                                   \
    uint32_t nlinks_;                                                \
    SNAP(s, g->nvlink_count, nlinks_);                               \
    if (nlinks_ == 0)                                                \
        return NVML_ERROR_NOT_SUPPORTED;                             \
    if ((link) >= nlinks_)                                           \
        return NVML_ERROR_INVALID_ARGUMENT;                          \
    const struct mokka_nvlink *nl = &g->nvlink[(link)]

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    DEV(device);
    ARG(isActive);
    LINK(link);
    uint32_t v;
    SNAP(s, nl->state, v);
    *isActive = v ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    DEV(device);
    ARG(version);
    LINK(link);
    uint32_t v;
    SNAP(s, nl->version, v);
    *version = v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                   nvmlNvLinkCapability_t capability, unsigned int *capResult)
{
    DEV(device);
    ARG(capResult);
    LINK(link);
    (void)nl;
    switch (capability) {
    case NVML_NVLINK_CAP_P2P_SUPPORTED:
    case NVML_NVLINK_CAP_P2P_ATOMICS:
    case NVML_NVLINK_CAP_SYSMEM_ACCESS:
    case NVML_NVLINK_CAP_SYSMEM_ATOMICS:
    case NVML_NVLINK_CAP_SLI_BRIDGE:
    case NVML_NVLINK_CAP_VALID:
        *capResult = capability == NVML_NVLINK_CAP_SLI_BRIDGE ? 0 : 1;
        return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    DEV(device);
    ARG(pci);
    LINK(link);
    struct mokka_nvlink c;
    snap(s, nl, &c, sizeof(c));
    if (!c.remote_has_pci)
        return NVML_ERROR_NOT_SUPPORTED; /* a switch the host does not enumerate: nothing to name */
    memset(pci, 0, sizeof(*pci));
    pci->domain = c.remote_domain;
    pci->bus = c.remote_bus;
    pci->device = c.remote_device;
    pci->pciDeviceId = c.remote_pci_device_id;
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", c.remote_domain, c.remote_bus, c.remote_device);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", c.remote_domain & 0xFFFF,
             c.remote_bus & 0xFF, c.remote_device & 0xFF);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                         nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    DEV(device);
    ARG(pNvLinkDeviceType);
    LINK(link);
    uint32_t v;
    SNAP(s, nl->remote_type, v);
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)v;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                     nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue)
{
    DEV(device);
    ARG(counterValue);
    LINK(link);
    if (counter == NVML_NVLINK_ERROR_DL_ECC_DATA) {
        *counterValue = 0;
        return NVML_SUCCESS;
    }
    if ((unsigned)counter >= MOKKA_NVLINK_COUNTERS)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t v;
    SNAP(s, nl->errors[counter], v);
    *counterValue = v;
    return NVML_SUCCESS;
}

/* ---- topology and affinity ------------------------------------------------------------ */

/* The model computes the level of every pair from the PCI tree (mokkafs/model/topology.py). */
static nvmlGpuTopologyLevel_t level_between(const struct mokka_state *s, unsigned a, unsigned b)
{
    uint8_t v;
    SNAP(s, s->gpus[a].topo_level[b], v);
    return (nvmlGpuTopologyLevel_t)v;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                         nvmlGpuTopologyLevel_t *pathInfo)
{
    DEV(device1);
    (void)g;
    const struct mokka_state *s2;
    const struct mokka_gpu *g2;
    nvmlReturn_t r = dev_check(device2, 0, &s2, &g2);
    if (r != NVML_SUCCESS)
        return r;
    ARG(pathInfo);
    *pathInfo = level_between(s, device1->index, device2->index);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level,
                                                      unsigned int *count, nvmlDevice_t *deviceArray)
{
    DEV(device);
    (void)g;
    ARG(count);
    unsigned n = 0, room = *count;
    for (unsigned i = 0; i < gpu_count(s); i++) {
        if (i == device->index || level_between(s, device->index, i) > level)
            continue;
        if (deviceArray && n < room)
            deviceArray[n] = &g_devices[i];
        n++;
    }
    *count = n;
    if (deviceArray == NULL && room == 0)
        return NVML_SUCCESS;
    return n > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* The simulated node's CPU mask of this GPU, as sysfs local_cpus shows it (published by the
   model); both scopes are that mask, since each simulated NUMA node is one socket. */
nvmlReturn_t DECLDIR nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                         unsigned long *cpuSet, nvmlAffinityScope_t scope)
{
    (void)scope;
    DEV(device);
    ARG(cpuSet);
    if (cpuSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t mask[MOKKA_CPU_WORDS];
    SNAP(s, g->cpu_affinity, mask);
    const unsigned bits = sizeof(unsigned long) * 8;
    memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
    for (unsigned c = 0; c < MOKKA_CPU_WORDS * 64 && c / bits < cpuSetSize; c++)
        if (mask[c / 64] >> (c % 64) & 1)
            cpuSet[c / bits] |= 1UL << (c % bits);
    return NVML_SUCCESS;
}

static int g_affinity_noted; /* the one note per process that the host lacks simulated CPUs */

/* nvml.h: pins the calling thread to the GPU's ideal CPUs. The CPUs are the simulated node's;
   the thread runs on the host's, so it is pinned to the part of the mask the host has (the
   kernel drops CPUs that do not exist or are not ours), or to every CPU it may use where that
   part is empty. Where the pinned set is not the mask, one line on stderr says so, once per
   process (docs/nvml.md). */
nvmlReturn_t DECLDIR nvmlDeviceSetCpuAffinity(nvmlDevice_t device)
{
    DEV(device);
    uint64_t mask[MOKKA_CPU_WORDS];
    SNAP(s, g->cpu_affinity, mask);
    int saved = errno;
    cpu_set_t want, all, got;
    CPU_ZERO(&want);
    CPU_ZERO(&all);
    for (unsigned c = 0; c < MOKKA_CPU_WORDS * 64 && c < CPU_SETSIZE; c++) {
        CPU_SET(c, &all);
        if (mask[c / 64] >> (c % 64) & 1)
            CPU_SET(c, &want);
    }
    int fallback = sched_setaffinity(0, sizeof(want), &want) != 0;
    if (fallback && sched_setaffinity(0, sizeof(all), &all) != 0) {
        errno = saved;
        return NVML_ERROR_UNKNOWN;
    }
    if (sched_getaffinity(0, sizeof(got), &got) == 0 && !CPU_EQUAL(&got, &want) &&
        !__atomic_exchange_n(&g_affinity_noted, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "mokka: nvmlDeviceSetCpuAffinity: %s; pinned to %d host CPUs\n",
                fallback ? "this host has none of the simulated GPU's CPUs"
                         : "this host has only part of the simulated GPU's CPUs",
                CPU_COUNT(&got));
    errno = saved;
    return NVML_SUCCESS;
}

/* nvml.h: clears the calling thread's affinity: every CPU the kernel lets it use. */
nvmlReturn_t DECLDIR nvmlDeviceClearCpuAffinity(nvmlDevice_t device)
{
    DEV(device);
    (void)g;
    int saved = errno;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (unsigned c = 0; c < CPU_SETSIZE; c++)
        CPU_SET(c, &all);
    int r = sched_setaffinity(0, sizeof(all), &all);
    errno = saved;
    return r == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet)
{
    return nvmlDeviceGetCpuAffinityWithinScope(device, cpuSetSize, cpuSet, NVML_AFFINITY_SCOPE_NODE);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize, unsigned long *nodeSet,
                                                 nvmlAffinityScope_t scope)
{
    (void)scope;
    DEV(device);
    ARG(nodeSet);
    if (nodeSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int32_t node;
    SNAP(s, g->numa_node, node);
    memset(nodeSet, 0, nodeSetSize * sizeof(unsigned long));
    if (node >= 0 && (unsigned)node < nodeSetSize * sizeof(unsigned long) * 8)
        nodeSet[node / (sizeof(unsigned long) * 8)] |= 1UL << (node % (sizeof(unsigned long) * 8));
    return NVML_SUCCESS;
}

/* ---- fabric --------------------------------------------------------------------------- */

struct fabric { uint32_t has, clique, state, health_mask, health_summary; uint8_t uuid[16]; };

static nvmlReturn_t read_fabric(const struct mokka_state *s, const struct mokka_gpu *g, struct fabric *f)
{
    SNAP(s, g->has_fabric, f->has);
    if (!f->has)
        return NVML_ERROR_NOT_SUPPORTED;
    SNAP(s, g->fabric_clique_id, f->clique);
    SNAP(s, g->fabric_state, f->state);
    SNAP(s, g->fabric_cluster_uuid, f->uuid);
    SNAP(s, g->fabric_health_mask, f->health_mask);
    SNAP(s, g->fabric_health_summary, f->health_summary);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    DEV(device);
    ARG(gpuFabricInfo);
    struct fabric f;
    nvmlReturn_t r = read_fabric(s, g, &f);
    if (r != NVML_SUCCESS)
        return r;
    memset(gpuFabricInfo, 0, sizeof(*gpuFabricInfo));
    memcpy(gpuFabricInfo->clusterUuid, f.uuid, sizeof(f.uuid));
    gpuFabricInfo->status = NVML_SUCCESS;
    gpuFabricInfo->cliqueId = f.clique;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)f.state;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    DEV(device);
    ARG(gpuFabricInfo);
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct fabric f;
    nvmlReturn_t r = read_fabric(s, g, &f);
    if (r != NVML_SUCCESS)
        return r;
    /* v2 is a prefix of v3: fill only what the caller's version has room for. */
    nvmlGpuFabricInfo_v3_t out;
    memset(&out, 0, sizeof(out));
    out.version = version;
    memcpy(out.clusterUuid, f.uuid, sizeof(f.uuid));
    out.status = NVML_SUCCESS;
    out.cliqueId = f.clique;
    out.state = (nvmlGpuFabricState_t)f.state;
    out.healthMask = f.health_mask;
    out.healthSummary = (unsigned char)f.health_summary;
    memcpy(gpuFabricInfo, &out, version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof(out));
    return NVML_SUCCESS;
}

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

/* ---- events --------------------------------------------------------------------------- */

#define SUPPORTED_EVENTS (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | \
                          nvmlEventTypeXidCriticalError)

/* Event sets live in a table the library owns, and a handle is a number, never an address:
   tag (16 bits) | generation (32) | slot (16). Nothing a caller hands back is dereferenced, so a
   random value, a pointer to anything, or a freed set is refused with INVALID_ARGUMENT. Freeing
   gives the slot a new generation: the old handle stays refused after the slot is reused, and a
   thread waiting on a set that another thread frees sees the change under the lock and returns.
   Chunks of the table are allocated on first use and never freed, so a slot's memory outlives
   every handle to it. One lock guards every set: they are created, registered and polled rarely,
   and never held across a sleep. */
#define SET_TAG 0x6d65ull /* the top 16 bits of every event-set handle */
#define SET_CHUNK 64
#define SET_CHUNKS 64     /* at most 4096 live sets per process */

struct event_set {
    uint32_t gen;                               /* odd while handed out, even while free */
    unsigned waiters;                           /* threads in nvmlEventSetWait on this slot */
    uint64_t next;                              /* next event number to look at */
    unsigned long long mask[MOKKA_MAX_GPUS];    /* registered types per GPU */
};

static pthread_mutex_t g_sets_lock = PTHREAD_MUTEX_INITIALIZER;
static struct event_set *g_set_chunks[SET_CHUNKS]; /* guarded by g_sets_lock */

_Static_assert(sizeof(nvmlEventSet_t) == 8, "handles carry 64 bits");

/* The set a handle names, or NULL if it names none that is live (g_sets_lock held). */
static struct event_set *set_of(nvmlEventSet_t set)
{
    uint64_t h = (uint64_t)(uintptr_t)set;
    unsigned slot = (unsigned)(h & 0xFFFF);
    uint32_t gen = (uint32_t)(h >> 16);
    if (h >> 48 != SET_TAG || slot >= SET_CHUNK * SET_CHUNKS || !(gen & 1))
        return NULL;
    struct event_set *chunk = g_set_chunks[slot / SET_CHUNK];
    if (!chunk || chunk[slot % SET_CHUNK].gen != gen)
        return NULL;
    return &chunk[slot % SET_CHUNK];
}

/* A fork while another thread holds the lock would leave the child's copy locked forever. */
static void sets_prepare(void) { pthread_mutex_lock(&g_sets_lock); }
static void sets_release(void) { pthread_mutex_unlock(&g_sets_lock); }
__attribute__((constructor)) static void sets_atfork(void) { pthread_atfork(sets_prepare, sets_release, sets_release); }

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    ARG(set);
    int saved = errno;
    nvmlReturn_t r = NVML_ERROR_MEMORY; /* every slot taken, or no memory for a new chunk */
    pthread_mutex_lock(&g_sets_lock);
    for (unsigned c = 0; c < SET_CHUNKS && r != NVML_SUCCESS; c++) {
        if (!g_set_chunks[c] && !(g_set_chunks[c] = calloc(SET_CHUNK, sizeof(struct event_set))))
            break;
        for (unsigned i = 0; i < SET_CHUNK; i++) {
            struct event_set *es = &g_set_chunks[c][i];
            if (es->gen & 1)
                continue;
            es->gen++;
            memset(es->mask, 0, sizeof(es->mask));
            /* Only events after creation: a new set does not replay history. */
            es->next = __atomic_load_n(&state()->event_head, __ATOMIC_ACQUIRE);
            *set = (nvmlEventSet_t)(uintptr_t)(SET_TAG << 48 | (uint64_t)es->gen << 16 | (c * SET_CHUNK + i));
            r = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_sets_lock);
    errno = saved;
    return r;
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of(set);
    unsigned waiters = 0;
    if (es) {
        es->gen++;
        waiters = es->waiters;
    }
    pthread_mutex_unlock(&g_sets_lock);
    if (!es)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (waiters) { /* wake them now rather than at the end of their one-second slice */
        int saved = errno;
        syscall(SYS_futex, &state()->event_wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        errno = saved;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    DEV(device);
    (void)g;
    ARG(eventTypes);
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    DEV(device);
    (void)g;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of(set);
    if (!es)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        r = NVML_ERROR_NOT_SUPPORTED;
    else
        es->mask[device->index] |= eventTypes;
    pthread_mutex_unlock(&g_sets_lock);
    return r;
}

/* Take the next event for `set` if one is there. 1: *out filled; 0: nothing new; -1: the set
   was freed. */
static int take_event(const struct mokka_state *s, nvmlEventSet_t set, nvmlEventData_t *out)
{
    int found = 0;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of(set);
    if (!es) {
        pthread_mutex_unlock(&g_sets_lock);
        return -1;
    }
    /* A header that is not ours (retired, or overwritten until the daemon's next tick) has no
       counters to trust: nothing new until it is back. */
    if (__atomic_load_n(&s->magic, __ATOMIC_RELAXED) != MOKKA_STATE_MAGIC) {
        pthread_mutex_unlock(&g_sets_lock);
        return 0;
    }
    uint64_t head = __atomic_load_n(&s->event_head, __ATOMIC_ACQUIRE);
    if (head < es->next) /* the daemon started a fresh file: follow it */
        es->next = head;
    if (head - es->next > MOKKA_EVENT_RING) /* overrun: the oldest are gone */
        es->next = head - MOKKA_EVENT_RING;
    while (!found && es->next < head) {
        uint64_t n = es->next++;
        const struct mokka_event *slot = &s->ring[n % MOKKA_EVENT_RING];
        if (__atomic_load_n(&slot->seq, __ATOMIC_ACQUIRE) != n + 1)
            continue;
        struct mokka_event e;
        memcpy(&e, slot, sizeof(e));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&slot->seq, __ATOMIC_RELAXED) != n + 1 || e.gpu >= MOKKA_MAX_GPUS)
            continue; /* overwritten while read */
        if (!(es->mask[e.gpu] & e.type))
            continue;
        out->device = &g_devices[e.gpu];
        out->eventType = e.type;
        out->eventData = e.type == nvmlEventTypeXidCriticalError ? e.data : 0;
        out->gpuInstanceId = 0xFFFFFFFFu;
        out->computeInstanceId = 0xFFFFFFFFu;
        found = 1;
    }
    pthread_mutex_unlock(&g_sets_lock);
    return found;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of(set); /* its memory is never freed: safe to count out below */
    if (es)
        es->waiters++;
    pthread_mutex_unlock(&g_sets_lock);
    if (!es)
        return NVML_ERROR_INVALID_ARGUMENT;
    int saved = errno;
    uint64_t deadline = now_ns() + (uint64_t)timeoutms * 1000000ull;
    nvmlReturn_t r = NVML_ERROR_TIMEOUT;
    for (;;) {
        /* Each round from the current mapping: the daemon wakes the waiters of a file it
           retires, and they carry on in its successor, whose counters continue the old ones. */
        const struct mokka_state *s = mokka_state_checked();
        uint32_t wake = __atomic_load_n(&s->event_wake, __ATOMIC_ACQUIRE);
        int got = take_event(s, set, data);
        if (got != 0) {
            r = got > 0 ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT; /* < 0: freed meanwhile */
            break;
        }
        uint64_t now = now_ns();
        if (now >= deadline)
            break;
        /* Sleep until the daemon bumps the wake word, or the deadline. Slices of at most
           a second keep a daemon without futex support (or a header being repaired) from
           stranding us. */
        uint64_t left = deadline - now;
        if (left > 1000000000ull)
            left = 1000000000ull;
        if (__atomic_load_n(&s->magic, __ATOMIC_RELAXED) != MOKKA_STATE_MAGIC && left > 10000000ull)
            left = 10000000ull; /* retired or being repaired: nobody wakes this word, look again soon */
        struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
        syscall(SYS_futex, &s->event_wake, FUTEX_WAIT, wake, &ts, NULL, 0);
    }
    pthread_mutex_lock(&g_sets_lock);
    es->waiters--;
    pthread_mutex_unlock(&g_sets_lock);
    errno = saved;
    return r;
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
