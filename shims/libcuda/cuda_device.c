/*
 * libcuda.so.1 for a simulated node, over the mokkafs shared state (mokka_state.h): discovery
 * (the devices the process can open, CUDA_VISIBLE_DEVICES and MIG), cuInit, versions and error
 * strings, cuGetProcAddress, and what a device is (name, UUID, memory, PCI, attributes). The
 * driver's other domains are cuda_accounting.c, cuda_context.c and cuda_memory.c (sharing
 * through cuda_internal.h); the CUDA runtime's private tables are cuda_export.c's; copies,
 * streams, events, modules and launches (which run nothing) cuda_runtime.c's; every other
 * exported function is a generated CUDA_ERROR_NOT_SUPPORTED stub (cuda_gen.c, by
 * shims/gen_cuda.py).
 *
 * Host safety: no abort(), no unbounded waits; no state file is CUDA_ERROR_NO_DEVICE; errno is
 * restored around syscalls; every wait on the daemon is bounded; the mappings, the record's
 * descriptor and the daemon connection live as long as the process (no destructor unmaps
 * anything).
 */
#define _GNU_SOURCE
#include "cuda_internal.h"
#include "mokka_client.h"
#include "mokka_view.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- state ----------------------------------------------------------------------------- */

/* Finding, mapping, re-checking and reading the state is the shared client's (mokka_client.h).
   The devices cuInit found are shared with the other files (cuda_internal.h). */

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
int g_initialized;
int g_count;
unsigned g_visible[MOKKA_MAX_GPUS];

/* Called with g_lock held. */
static CUresult map_state(void)
{
    if (mokka_mapped)
        return CUDA_SUCCESS;
    switch (mokka_open()) {
    case MOKKA_OK: return CUDA_SUCCESS;
    case MOKKA_MISMATCH: return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    default: return CUDA_ERROR_NO_DEVICE;
    }
}

/* No destructor unmaps anything: at exit() other threads may still be inside a call, and
   unmapping under them is a SIGSEGV in the host process. The kernel drops the mappings. */

/* ---- CUDA_VISIBLE_DEVICES and MIG ------------------------------------------------------

   As the driver reads it: comma-separated entries; unset means every GPU in index order. An
   entry is a GPU index, a GPU UUID ("GPU-" prefix optional, any unique prefix), a MIG device's
   UUID ("MIG-" and any unique prefix of the rest) or, as drivers before R470 named MIG devices,
   "MIG-GPU-<GPU UUID>/<GPU instance id>/<compute instance id>". The list ends at the first entry
   that names nothing (or a GPU already listed).

   MIG (NVIDIA's MIG user guide, docs/mig.md "CUDA"): a CUDA process sees its compute instance
   and the GPU instance's memory as one device, and at most one MIG device: the first one the
   list names. A GPU with MIG enabled is never a device itself: named by index or UUID (or by
   default), it stands for its first MIG device, or for nothing when it has none; a second MIG
   device is left out. What a MIG device is (name, UUID, SMs, memory) is taken once, here, as the
   driver probes it at init. */

static struct mig_view g_mig[MOKKA_MAX_GPUS]; /* by CUdevice ordinal; written in cuInit only */
struct mig_view g_mig_of[MOKKA_MAX_GPUS];       /* the same by GPU index (a GPU is listed once) */
static struct mokka_gpu g_scratch;            /* cuInit's copy of one GPU record (g_lock) */

/* ---- enumeration: the devices the process can open (mokka_view.h) ----------------------

   The driver's list comes first: the GPUs whose /dev/nvidiaN the process can open, numbered from
   0, and of their MIG devices those whose capability nodes it can open. CUDA_VISIBLE_DEVICES
   then picks from that list, by its indexes and among its UUIDs. Decided in cuInit only. */
static struct mokka_view g_view;

/* The node's GPU index of the driver's visible index i. */
static unsigned view_node(unsigned i) { return g_view.gpu[i]; }

/* The driver's list for cuInit: decided now, its length (at most the node's count). */
static unsigned view_decide(unsigned node_count)
{
    mokka_view_decide(state(), &g_view);
    unsigned n = 0;
    while (mokka_view_node(&g_view, n, node_count) >= 0)
        n++;
    return n;
}

/* Keep in g_scratch only the MIG devices the view shows, in their order. */
static void view_mig_only(void)
{
    unsigned kept = 0, n = g_scratch.mig_device_count < MOKKA_MAX_MIG_DEVICES ? g_scratch.mig_device_count
                                                                                : MOKKA_MAX_MIG_DEVICES;
    for (unsigned k = 0; k < n; k++) {
        const struct mokka_mig_device *d = &g_scratch.mig_devices[k];
        uint32_t slot = d->gi_slot < MOKKA_MAX_GPU_INSTANCES ? d->gi_slot : 0;
        if (mokka_view_mig(&g_view, g_scratch.mig_gi[slot].minor, d->minor))
            g_scratch.mig_devices[kept++] = *d;
    }
    g_scratch.mig_device_count = kept;
}

static int match_uuid(const char *want, size_t n, unsigned count)
{
    if (n >= 4 && strncasecmp(want, "GPU-", 4) == 0) {
        want += 4;
        n -= 4;
    }
    if (n == 0)
        return -1;
    int found = -1;
    for (unsigned i = 0; i < count; i++) {
        char uuid[96];
        SNAP(state()->gpus[view_node(i)].uuid, uuid);
        uuid[sizeof(uuid) - 1] = '\0';
        const char *u = strncmp(uuid, "GPU-", 4) == 0 ? uuid + 4 : uuid;
        if (strlen(u) >= n && strncasecmp(u, want, n) == 0) {
            if (found >= 0)
                return -1; /* ambiguous prefix */
            found = (int)i;
        }
    }
    return found;
}

/* Visible GPU gpu's record, copied whole into g_scratch (its MIG devices, those the process
   can open); 1 if it is in MIG mode. */
static int mig_gpu(unsigned gpu)
{
    mokka_read_gpu(state(), view_node(gpu), &g_scratch);
    view_mig_only();
    return g_scratch.mig_mode == 1;
}

/* MIG device k of the GPU in g_scratch. */
static void mig_take(unsigned k, struct mig_view *out)
{
    const struct mokka_mig_device *d = &g_scratch.mig_devices[k];
    const struct mokka_mig_gi *g = &g_scratch.mig_gi[d->gi_slot < MOKKA_MAX_GPU_INSTANCES ? d->gi_slot : 0];
    out->on = 1;
    out->gi = d->gi_id;
    out->ci = d->ci_id;
    out->sm = d->multiprocessor_count;
    out->mem_total = g->memory_total;
    memcpy(out->name, d->name, sizeof(out->name));
    out->name[sizeof(out->name) - 1] = '\0';
    memcpy(out->uuid, d->uuid, sizeof(out->uuid));
    out->uuid[sizeof(out->uuid) - 1] = '\0';
}

static unsigned mig_count(void)
{
    return g_scratch.mig_device_count < MOKKA_MAX_MIG_DEVICES ? g_scratch.mig_device_count : MOKKA_MAX_MIG_DEVICES;
}

/* "MIG-<uuid or unique prefix>": the GPU index, with *out filled; -1 if none or ambiguous. */
static int match_mig_uuid(const char *want, size_t n, unsigned count, struct mig_view *out)
{
    want += 4;
    n -= 4;
    if (n == 0)
        return -1;
    int found = -1;
    for (unsigned i = 0; i < count; i++) {
        if (!mig_gpu(i))
            continue;
        for (unsigned k = 0; k < mig_count(); k++) {
            const char *u = g_scratch.mig_devices[k].uuid;
            size_t len = strnlen(u, sizeof(g_scratch.mig_devices[k].uuid));
            if (len < 4 || len - 4 < n || strncasecmp(u + 4, want, n) != 0)
                continue;
            if (found >= 0)
                return -1;
            found = (int)i;
            mig_take(k, out);
        }
    }
    return found;
}

/* "MIG-GPU-<uuid>/<gi>/<ci>" (drivers before R470). */
static int match_mig_legacy(const char *want, size_t n, unsigned count, struct mig_view *out)
{
    char buf[160];
    if (n >= sizeof(buf))
        return -1;
    memcpy(buf, want + 4, n - 4);
    buf[n - 4] = '\0';
    char *s1 = strchr(buf, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s2 || strchr(s2 + 1, '/'))
        return -1;
    *s1 = *s2 = '\0';
    char *end;
    unsigned long gi = strtoul(s1 + 1, &end, 10);
    if (!isdigit((unsigned char)s1[1]) || *end || gi > 0xFF)
        return -1;
    unsigned long ci = strtoul(s2 + 1, &end, 10);
    if (!isdigit((unsigned char)s2[1]) || *end || ci > 0xFF)
        return -1;
    int gpu = match_uuid(buf, strlen(buf), count);
    if (gpu < 0 || !mig_gpu((unsigned)gpu))
        return -1;
    for (unsigned k = 0; k < mig_count(); k++)
        if (g_scratch.mig_devices[k].gi_id == gi && g_scratch.mig_devices[k].ci_id == ci) {
            mig_take(k, out);
            return gpu;
        }
    return -1;
}

/* Add GPU index idx (an entry named it, or the default list). A MIG device is added only when
   the process has none yet; a GPU in MIG mode adds its first MIG device, if any. */
static void add_device(unsigned idx, const struct mig_view *named, int *have_mig)
{
    struct mig_view v = {0};
    if (named) {
        v = *named;
    } else if (mig_gpu(idx)) {
        if (mig_count() == 0)
            return;
        mig_take(0, &v);
    }
    if (v.on) {
        if (*have_mig)
            return;
        *have_mig = 1;
    }
    g_mig[g_count] = g_mig_of[view_node(idx)] = v;
    g_visible[g_count++] = view_node(idx);
}

static void parse_visible(unsigned count)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    int have_mig = 0;
    g_count = 0;
    if (!env) {
        for (unsigned i = 0; i < count; i++)
            add_device(i, NULL, &have_mig);
        return;
    }
    const char *p = env;
    while (*p && g_count < MOKKA_MAX_GPUS) {
        while (*p == ' ')
            p++;
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && p[n - 1] == ' ')
            n--;
        int idx = -1;
        struct mig_view named = {0};
        if (n && n < 10 && strspn(p, "0123456789") >= n) {
            idx = atoi(p);
            if (idx >= (int)count)
                idx = -1;
        } else if (n >= 8 && strncasecmp(p, "MIG-GPU-", 8) == 0) {
            idx = match_mig_legacy(p, n, count, &named);
        } else if (n >= 4 && strncasecmp(p, "MIG-", 4) == 0) {
            idx = match_mig_uuid(p, n, count, &named);
        } else if (n) {
            idx = match_uuid(p, n, count);
        }
        if (idx >= 0 && named.on && have_mig) { /* a second MIG device: left out, the list goes on */
            if (!end)
                break;
            p = end + 1;
            continue;
        }
        for (int k = 0; idx >= 0 && k < g_count; k++)
            if (g_visible[k] == view_node((unsigned)idx))
                idx = -1;
        if (idx < 0)
            break;
        add_device((unsigned)idx, named.on ? &named : NULL, &have_mig);
        if (!end)
            break;
        p = end + 1;
    }
}

/* ---- init, versions, errors ------------------------------------------------------------ */

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (LOAD(&g_initialized))
        return CUDA_SUCCESS;
    int saved = errno;
    pthread_mutex_lock(&g_lock);
    CUresult r = map_state();
    if (r == CUDA_SUCCESS && !g_initialized) {
        uint32_t n;
        SNAP(state()->gpu_count, n);
        parse_visible(view_decide(n > MOKKA_MAX_GPUS ? MOKKA_MAX_GPUS : n));
        if (g_count == 0)
            r = CUDA_ERROR_NO_DEVICE;
        else
            __atomic_store_n(&g_initialized, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    errno = saved;
    return r;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    ARG(driverVersion);
    int saved = errno;
    pthread_mutex_lock(&g_lock);
    CUresult r = map_state();
    pthread_mutex_unlock(&g_lock);
    errno = saved;
    if (r != CUDA_SUCCESS)
        return r;
    uint32_t v;
    SNAP(state()->cuda_version, v);
    *driverVersion = (int)v;
    return CUDA_SUCCESS;
}

static const char *error_string(CUresult e)
{
    switch (e) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 3: return "initialization error";
    case 4: return "driver shutting down";
    case 34: return "CUDA driver is a stub library";
    case 46: return "CUDA-capable device(s) is/are busy or unavailable";
    case 100: return "no CUDA-capable device is detected";
    case 101: return "invalid device ordinal";
    case 200: return "device kernel image is invalid";
    case 201: return "invalid device context";
    case 202: return "context already current";
    case 209: return "no kernel image is available for execution on the device";
    case 218: return "a PTX JIT compilation failed";
    case 304: return "OS call failed or operation not supported on this OS";
    case 400: return "invalid resource handle";
    case 500: return "named symbol not found";
    case 600: return "device not ready";
    case 700: return "an illegal memory access was encountered";
    case 709: return "context is destroyed";
    case 801: return "operation not supported";
    case 803: return "system has unsupported display driver / cuda driver combination";
    case 804: return "forward compatibility was attempted on non supported HW";
    case 999: return "unknown error";
    default: return NULL;
    }
}

static const char *error_name(CUresult e)
{
    for (unsigned i = 0; i < mokka_error_names_count; i++)
        if (mokka_error_names[i].code == e)
            return mokka_error_names[i].name;
    return NULL;
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    ARG(pStr);
    const char *n = error_name(error);
    *pStr = n;
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    ARG(pStr);
    const char *n = error_name(error);
    if (!n) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    const char *s = error_string(error);
    *pStr = s ? s : n;
    return CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ------------------------------------------------------------------ */

/* The newest ABI variant of `symbol` introduced at or before `cudaVersion`; with the
   per-thread default stream flag, its _ptds/_ptsz variant where one exists. */
static CUresult proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (pfn)
        *pfn = NULL;
    if (!symbol || !pfn) {
        if (status)
            *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_INVALID_VALUE;
    }
    unsigned lo = 0, hi = mokka_procs_count;
    while (lo < hi) { /* the table is sorted by name: first row of `symbol` */
        unsigned mid = (lo + hi) / 2;
        if (strcmp(mokka_procs[mid].name, symbol) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    const struct mokka_proc *best = NULL, *best_pt = NULL;
    int known = 0;
    for (unsigned i = lo; i < mokka_procs_count && strcmp(mokka_procs[i].name, symbol) == 0; i++) {
        known = 1;
        if (mokka_procs[i].version > cudaVersion)
            continue;
        if (mokka_procs[i].per_thread_stream)
            best_pt = &mokka_procs[i];
        else
            best = &mokka_procs[i];
    }
    if (best_pt && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
        (!best || best_pt->version >= best->version))
        best = best_pt;
    if (!best) {
        if (status)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* ---- devices --------------------------------------------------------------------------- */

CUresult cuDeviceGetCount(int *count)
{
    ARG(count);
    INIT();
    (void)mokka_state_checked(); /* a poller's once-a-round call: has our file gone stale? */
    *count = g_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    ARG(device);
    INIT();
    if (ordinal < 0 || ordinal >= g_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    ARG(name);
    ARG(len > 0);
    DEVICE(dev);
    char buf[96];
    if (g_mig[dev].on)
        memcpy(buf, g_mig[dev].name, sizeof(buf));
    else
        SNAP(gpu_of(dev)->name, buf);
    buf[sizeof(buf) - 1] = '\0';
    snprintf(name, (size_t)len, "%s", buf);
    return CUDA_SUCCESS;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
}

/* The GPU's UUID, or with mig the MIG device's (cuDeviceGetUuid_v2: "If the device is in MIG
   mode, returns its MIG UUID"); the 16 bytes its hex digits spell. */
static CUresult device_uuid(CUuuid *uuid, CUdevice dev, int mig)
{
    ARG(uuid);
    DEVICE(dev);
    char buf[96];
    if (mig && g_mig[dev].on)
        memcpy(buf, g_mig[dev].uuid, sizeof(g_mig[dev].uuid));
    else
        SNAP(gpu_of(dev)->uuid, buf);
    buf[sizeof(buf) - 1] = '\0';
    memset(uuid->bytes, 0, sizeof(uuid->bytes));
    const char *p = strncmp(buf, "GPU-", 4) == 0 ? buf + 4 : strncmp(buf, "MIG-", 4) == 0 ? buf + 4 : buf;
    for (int n = 0; *p && n < 32; p++) {
        int v = hexval((unsigned char)*p);
        if (v < 0)
            continue; /* the dashes */
        uuid->bytes[n / 2] = (char)(uuid->bytes[n / 2] | (n % 2 ? v : v << 4));
        n++;
    }
    return CUDA_SUCCESS;
}

/* The first ABI answers the parent GPU's UUID on a MIG device; _v2 (what cuda.h names
   cuDeviceGetUuid since CUDA 11.4) the MIG device's. */
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return device_uuid(uuid, dev, 0); }
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return device_uuid(uuid, dev, 1); }

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ARG(bytes);
    DEVICE(dev);
    uint64_t total;
    if (g_mig[dev].on)
        total = g_mig[dev].mem_total;
    else
        SNAP(gpu_of(dev)->mem_total, total);
    *bytes = total;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    ARG(bytes);
    size_t total;
    CUresult r = cuDeviceTotalMem_v2(&total, dev);
    if (r == CUDA_SUCCESS)
        *bytes = total > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)total;
    return r;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    ARG(major);
    ARG(minor);
    DEVICE(dev);
    uint32_t cc[2];
    const struct mokka_gpu *g = gpu_of(dev);
    MOKKA_CONSISTENT(state()) {
        cc[0] = g->cc_major;
        cc[1] = g->cc_minor;
    }
    *major = (int)cc[0];
    *minor = (int)cc[1];
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    ARG(pciBusId);
    ARG(len > 0);
    DEVICE(dev);
    uint32_t pci[3]; /* domain, bus, device */
    const struct mokka_gpu *g = gpu_of(dev);
    MOKKA_CONSISTENT(state()) {
        pci[0] = g->pci_domain;
        pci[1] = g->pci_bus;
        pci[2] = g->pci_device;
    }
    snprintf(pciBusId, (size_t)len, "%04X:%02X:%02X.0", pci[0], pci[1], pci[2]);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    ARG(dev);
    ARG(pciBusId);
    INIT();
    /* the documented forms: domain:bus:device.function (a 4- or 8-digit domain),
       domain:bus:device and bus:device.function (mokka_parse_bus_id) */
    struct mokka_bus_id id;
    if (mokka_parse_bus_id(pciBusId, &id) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < g_count; d++) {
        if (mokka_bus_id_is(state(), g_visible[d], &id)) {
            *dev = d;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* What the compute capability decides (the SM's limits, the CUDA programming guide's "technical
   specifications per compute capability", and the features each architecture turns on) is the
   model's, in mokkafs/model/compute.py, published: copied here, never re-derived. */
struct sm_limits {
    uint32_t threads_per_sm, shared_per_sm, shared_optin, blocks_per_sm, fp64_ratio;
};

struct cc_features {
    uint32_t compression, persisting_l2, policy_window, reserved_shared, rdma_ordering, cluster_launch,
        sync_domains, tensor_map, multicast;
};

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    ARG(pi);
    DEVICE(dev);
    if (attrib < 1 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    const struct mokka_gpu *g = gpu_of(dev);
    uint32_t cc[2], pci[3], sm, bus_width, ecc, compute_mode, clk_max[4], index, has_fabric, pci_ids[2];
    int32_t numa;
    uint64_t l2;
    struct cc_features f;
    MOKKA_CONSISTENT(state()) {
        cc[0] = g->cc_major, cc[1] = g->cc_minor;
        pci[0] = g->pci_domain, pci[1] = g->pci_bus, pci[2] = g->pci_device;
        pci_ids[0] = g->pci_device_id, pci_ids[1] = g->pci_subsystem_id;
        f.compression = g->generic_compression;
        f.persisting_l2 = g->max_persisting_l2_bytes;
        f.policy_window = g->max_access_policy_window_bytes;
        f.reserved_shared = g->reserved_shared_memory_per_block;
        f.rdma_ordering = g->rdma_writes_ordering;
        f.cluster_launch = g->cluster_launch;
        f.sync_domains = g->mem_sync_domain_count;
        f.tensor_map = g->tensor_map_access;
        f.multicast = g->multicast;
    }
    SNAP(g->multiprocessor_count, sm);
    if (g_mig[dev].on)
        sm = g_mig[dev].sm; /* the compute instance's SMs */
    SNAP(g->mem_bus_width, bus_width);
    SNAP(g->ecc_enabled, ecc);
    SNAP(g->compute_mode, compute_mode);
    SNAP(g->clock_max, clk_max);
    SNAP(g->index, index);
    SNAP(g->has_fabric, has_fabric);
    SNAP(g->numa_node, numa);
    SNAP(g->l2_cache_bytes, l2);
    struct sm_limits a;
    SNAP(g->max_threads_per_sm, a.threads_per_sm);
    SNAP(g->shared_memory_per_sm, a.shared_per_sm);
    SNAP(g->shared_memory_per_block_optin, a.shared_optin);
    SNAP(g->max_blocks_per_sm, a.blocks_per_sm);
    SNAP(g->fp32_to_fp64_ratio, a.fp64_ratio);
    int v = 0;
    switch (attrib) {
    case 1: v = 1024; break;                         /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: v = 1024; break;                 /* MAX_BLOCK_DIM_X, _Y */
    case 4: v = 64; break;                           /* MAX_BLOCK_DIM_Z */
    case 5: v = 2147483647; break;                   /* MAX_GRID_DIM_X */
    case 6: case 7: v = 65535; break;                /* MAX_GRID_DIM_Y, _Z */
    case 8: v = 49152; break;                        /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: v = 65536; break;                        /* TOTAL_CONSTANT_MEMORY */
    case 10: v = 32; break;                          /* WARP_SIZE */
    case 11: v = 2147483647; break;                  /* MAX_PITCH */
    case 12: v = 65536; break;                       /* MAX_REGISTERS_PER_BLOCK */
    case 13: v = (int)clk_max[1] * 1000; break;      /* CLOCK_RATE, kHz */
    case 14: v = 512; break;                         /* TEXTURE_ALIGNMENT */
    case 15: v = 1; break;                           /* GPU_OVERLAP */
    case 16: v = (int)sm; break;                     /* MULTIPROCESSOR_COUNT */
    case 17: case 18: v = 0; break;                  /* KERNEL_EXEC_TIMEOUT, INTEGRATED */
    case 19: v = 1; break;                           /* CAN_MAP_HOST_MEMORY */
    case 20: v = (int)compute_mode; break;           /* COMPUTE_MODE */
    case 21: case 22: v = 131072; break;             /* texture 1D, 2D width */
    case 23: v = 65536; break;
    case 24: case 25: case 26: v = 16384; break;     /* texture 3D */
    case 27: case 28: v = 32768; break;              /* layered 2D */
    case 29: v = 2048; break;
    case 30: v = 512; break;                         /* SURFACE_ALIGNMENT */
    case 31: v = 1; break;                           /* CONCURRENT_KERNELS */
    case 32: v = (int)ecc; break;                    /* ECC_ENABLED */
    case 33: v = (int)pci[1]; break;                 /* PCI_BUS_ID */
    case 34: v = (int)pci[2]; break;                 /* PCI_DEVICE_ID (the slot) */
    case 35: v = 0; break;                           /* TCC_DRIVER */
    case 36: v = (int)clk_max[2] * 1000; break;      /* MEMORY_CLOCK_RATE, kHz */
    case 37: v = (int)bus_width; break;              /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: v = (int)l2; break;                     /* L2_CACHE_SIZE */
    case 39: v = (int)a.threads_per_sm; break;       /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 40: v = 2; break;                           /* ASYNC_ENGINE_COUNT */
    case 41: v = 1; break;                           /* UNIFIED_ADDRESSING */
    case 42: v = 32768; break;
    case 43: v = 2048; break;
    case 44: v = 1; break;
    case 45: case 46: v = 32768; break;
    case 47: case 48: v = 8192; break;
    case 49: v = 32768; break;
    case 50: v = (int)pci[0]; break;                 /* PCI_DOMAIN_ID */
    case 51: v = 32; break;                          /* TEXTURE_PITCH_ALIGNMENT */
    case 52: case 53: v = 32768; break;
    case 54: v = 2046; break;
    case 55: case 56: v = 32768; break;
    case 57: v = 65536; break;
    case 58: case 59: case 60: v = 16384; break;
    case 61: case 63: case 64: v = 32768; break;
    case 62: case 65: v = 2048; break;
    case 66: case 67: v = 32768; break;
    case 68: v = 2046; break;
    case 69: v = 268435456; break;
    case 70: case 71: v = 131072; break;
    case 72: v = 2097120; break;
    case 73: case 74: v = 32768; break;
    case 75: v = (int)cc[0]; break;                  /* COMPUTE_CAPABILITY_MAJOR */
    case 76: v = (int)cc[1]; break;                  /* COMPUTE_CAPABILITY_MINOR */
    case 77: v = 32768; break;
    case 78: case 79: case 80: v = 1; break;         /* stream priorities, L1 caches */
    case 81: v = (int)a.shared_per_sm; break;        /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: v = 65536; break;                       /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 83: v = 1; break;                           /* MANAGED_MEMORY */
    case 84: v = 0; break;                           /* MULTI_GPU_BOARD */
    case 85: v = (int)index; break;                  /* MULTI_GPU_BOARD_GROUP_ID */
    case 87: v = (int)a.fp64_ratio; break;           /* SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO */
    case 89: case 90: case 91: v = 1; break;         /* concurrent managed access, preemption, ... */
    case 95: v = 1; break;                           /* COOPERATIVE_LAUNCH */
    case 97: v = (int)a.shared_optin; break;         /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 99: v = 1; break;                           /* HOST_REGISTER_SUPPORTED */
    case 102: case 103: v = 1; break;                /* VMM, POSIX fd handles */
    case 106: v = (int)a.blocks_per_sm; break;       /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    case 107: v = (int)f.compression; break;         /* GENERIC_COMPRESSION_SUPPORTED */
    case 108: v = (int)f.persisting_l2; break;       /* MAX_PERSISTING_L2_CACHE_SIZE */
    case 109: v = (int)f.policy_window; break;       /* MAX_ACCESS_POLICY_WINDOW_SIZE */
    case 110: v = 1; break;                          /* GPU_DIRECT_RDMA_WITH_CUDA_VMM */
    case 111: v = (int)f.reserved_shared; break;     /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    case 112: case 113: case 114: case 115: case 116: case 117: v = 1; break;
    case 118: v = (int)f.rdma_ordering; break;       /* GPU_DIRECT_RDMA_WRITES_ORDERING */
    case 119: v = 9; break;                          /* MEMPOOL_SUPPORTED_HANDLE_TYPES */
    case 120: v = (int)f.cluster_launch; break;      /* CLUSTER_LAUNCH */
    case 121: case 122: case 123: case 124: case 125: v = 1; break;
    case 126: v = (int)f.sync_domains; break;        /* MEM_SYNC_DOMAIN_COUNT */
    case 127: v = (int)f.tensor_map; break;          /* TENSOR_MAP_ACCESS_SUPPORTED */
    case 128: v = (int)has_fabric; break;            /* HANDLE_TYPE_FABRIC_SUPPORTED */
    case 129: v = 1; break;                          /* UNIFIED_FUNCTION_POINTERS */
    case 130: v = 0; break;                          /* NUMA_CONFIG: none */
    case 131: v = -1; break;                         /* NUMA_ID */
    case 132: v = (int)f.multicast; break;           /* MULTICAST_SUPPORTED */
    case 134: v = numa; break;                       /* HOST_NUMA_ID */
    case 139: v = (int)pci_ids[0]; break;            /* GPU_PCI_DEVICE_ID */
    case 140: v = (int)pci_ids[1]; break;            /* GPU_PCI_SUBSYSTEM_ID */
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    ARG(canAccessPeer);
    DEVICE(dev);
    DEVICE(peerDev);
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* For the other source files (cuda_internal.h). */
unsigned mokka_gpu_index(CUdevice dev) { return g_visible[dev]; }
