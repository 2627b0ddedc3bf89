/*
 * libnvidia-ml: the library's life and its devices. Init and shutdown (the refcount, mapping the
 * state through the shared client), error strings, system queries, device enumeration, the
 * handle tables and the lookups that hand out handles (nvml_internal.h explains the handles).
 */
#include "nvml_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

/* ---- state and handles --------------------------------------------------------------- */

/* Finding, mapping, re-checking and reading the state is the shared client's (mokka_client.h);
   what is left here is NVML's view of it: the handle tables, the init refcount and NVML's
   error codes. */

struct nvmlDevice_st g_gpu_handles[MOKKA_MAX_GPUS];
struct nvmlDevice_st g_mig_handles[MOKKA_MAX_GPUS][MIG_SLOTS];

int g_initialized;                              /* read atomically (initialized()) */
struct mokka_view g_view;                       /* written by init_common under g_lock */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;                          /* guarded by g_lock */

/* Map (or keep) the state file. Called with g_lock held. */
static nvmlReturn_t map_state(void)
{
    switch (mokka_open()) {
    case MOKKA_OK: return NVML_SUCCESS;
    case MOKKA_MISMATCH: return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    default: return NVML_ERROR_DRIVER_NOT_LOADED;
    }
}

nvmlReturn_t copy_string(const struct mokka_state *s, const char *field, size_t field_len, char *out,
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

int field_equals(const struct mokka_state *s, const char *field, size_t len, const char *want)
{
    char buf[128];
    if (len > sizeof(buf))
        len = sizeof(buf);
    snap(s, field, buf, len);
    buf[len - 1] = '\0';
    return strcmp(buf, want) == 0;
}

/* ---- init, shutdown, errors ----------------------------------------------------------- */

static nvmlReturn_t init_common(void)
{
    int saved = errno;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_refcount == 0) {
        r = map_state();
        if (r == NVML_SUCCESS) {
            /* Which GPUs and MIG devices the process can open, now: once per init, never per call. */
            mokka_view_decide(state(), &g_view);
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

/* A process's name as the driver's library gives it (traced in 535.261.03's libnvidia-ml: one
   reader serves nvmlSystemGetProcessName and nvidia-smi's process lists): /proc/<pid>/cmdline
   read into the caller's buffer, at most `length` bytes, so the C string is argv[0] as the
   process was started ("/usr/bin/python3", "./gpu_burn"), not its 15-byte comm; a name as long
   as the buffer is cropped (its last byte becomes NUL), a trailing newline dropped. No such
   process: NOT_FOUND; an empty command line (a kernel thread, a zombie): NO_DATA. */
nvmlReturn_t nvml_process_name(unsigned int pid, char *name, unsigned int length)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/cmdline", pid);
    int saved = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        errno = saved;
        return e == ENOENT || e == ESRCH ? NVML_ERROR_NOT_FOUND
               : e == EACCES || e == EPERM ? NVML_ERROR_NO_PERMISSION
                                           : NVML_ERROR_UNKNOWN;
    }
    size_t got = 0;
    while (got < length) {
        ssize_t r = read(fd, name + got, length - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    errno = saved;
    if (got == 0)
        return NVML_ERROR_NO_DATA;
    if (got == length) {
        name[length - 1] = '\0';
        return NVML_SUCCESS;
    }
    name[got] = '\0';
    if (name[got - 1] == '\n')
        name[got - 1] = '\0';
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return nvml_process_name(pid, name, length);
}

/* ---- enumeration and handles ---------------------------------------------------------- */

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    SYS();
    ARG(deviceCount);
    s = mokka_state_checked(); /* pollers count devices each round: a good time to look */
    unsigned n = 0;
    while (view_gpu(s, n) >= 0)
        n++;
    *deviceCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

static nvmlReturn_t handle_for(const struct mokka_state *s, unsigned int i, nvmlDevice_t *device)
{
    /* A GPU that fell off the bus has no handle to give, as nvidia-smi's "Unable to determine
       the device handle for GPU...: GPU is lost" shows. */
    if (__atomic_load_n(&s->gpus[i].lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    *device = gpu_handle(i);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    SYS();
    ARG(device);
    int i = view_gpu(s, index);
    if (i < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for(s, (unsigned)i, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* A GPU's UUID, or a MIG device's (`MIG-...`): its MIG device handle (docs/mig.md). */
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    SYS();
    ARG(uuid);
    ARG(device);
    int i;
    if (strncmp(uuid, "MIG-", 4) == 0) {
        for (unsigned v = 0; (i = view_gpu(s, v)) >= 0; v++) {
            const struct mokka_gpu *g = &s->gpus[i];
            uint32_t n;
            SNAP(s, g->mig_device_count, n);
            for (uint32_t k = 0; k < n && k < MOKKA_MAX_MIG_DEVICES; k++) {
                const struct mokka_mig_device *md = &g->mig_devices[k];
                if (field_equals(s, md->uuid, sizeof(md->uuid), uuid)) {
                    if (!view_mig(g, md))
                        return NVML_ERROR_NOT_FOUND; /* its capabilities are not ours to open */
                    uint32_t ids[2];
                    MOKKA_CONSISTENT(s) {
                        ids[0] = md->gi_id;
                        ids[1] = md->ci_id;
                    }
                    if (ids[0] >= MIG_GI_IDS || ids[1] >= MIG_CI_IDS)
                        return NVML_ERROR_NOT_FOUND;
                    *device = mig_handle((unsigned)i, ids[0], ids[1]);
                    return NVML_SUCCESS;
                }
            }
        }
        return NVML_ERROR_NOT_FOUND;
    }
    for (unsigned v = 0; (i = view_gpu(s, v)) >= 0; v++)
        if (field_equals(s, s->gpus[i].uuid, sizeof(s->gpus[i].uuid), uuid))
            return handle_for(s, (unsigned)i, device);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    SYS();
    ARG(serial);
    ARG(device);
    int i;
    for (unsigned v = 0; (i = view_gpu(s, v)) >= 0; v++)
        if (field_equals(s, s->gpus[i].serial, sizeof(s->gpus[i].serial), serial))
            return handle_for(s, (unsigned)i, device);
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
    int i;
    for (unsigned v = 0; (i = view_gpu(s, v)) >= 0; v++)
        if (mokka_bus_id_is(s, (unsigned)i, &id))
            return handle_for(s, (unsigned)i, device);
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* Any live handle, of any kind: answering this for a MIG handle is what the function is for. */
nvmlReturn_t DECLDIR nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    DEV_FLAGS(device, DEV_LOST_OK | DEV_MIG_OK);
    (void)s;
    (void)g;
    ARG(isMigDevice);
    *isMigDevice = mig_dev != NULL;
    return NVML_SUCCESS;
}
