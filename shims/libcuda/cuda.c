/*
 * libcuda.so.1 for a simulated node: device discovery, contexts and memory accounting over the
 * mokkafs shared state (mokka_state.h). The CUDA runtime's private tables are cuda_export.c's;
 * copies, streams, events, modules and launches (which run nothing) cuda_runtime.c's; every
 * other exported function is a generated CUDA_ERROR_NOT_SUPPORTED stub (cuda_gen.c, by
 * shims/gen_cuda.py).
 *
 * Memory: cuMemAlloc hands out unique addresses from a per-GPU window, backed by this process's
 * own memory reserved lazily (MAP_NORESERVE: only what is written costs anything), and adds the
 * size to this process's own record (a sealed memfd the daemon made for it alone), which the
 * daemon folds into NVML's process lists and memory used.
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
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ARG(p)                                                       \
    do {                                                             \
        if (!(p))                                                    \
            return CUDA_ERROR_INVALID_VALUE;                         \
    } while (0)

/* ---- state ----------------------------------------------------------------------------- */

/* Finding, mapping, re-checking and reading the state is the shared client's (mokka_client.h). */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;                   /* cuInit succeeded */
static int g_count;                         /* visible devices */
static unsigned g_visible[MOKKA_MAX_GPUS];  /* CUdevice ordinal -> GPU index in the state */

/* The mapping to read: the client moves to the daemon's new file when it retires this one. */
static inline const struct mokka_state *state(void) { return mokka_state(); }

/* A consistent copy of n bytes at src, inside the mapping. src may lie in a mapping the client
   has just left: the daemon never writes a file again once it retired it, so that copy is
   stable whichever mapping's seqlock is checked. */
static inline void snap(const void *src, void *dst, size_t n) { mokka_read(state(), src, dst, n); }
#define SNAP(field, out) snap(&(field), &(out), sizeof(out))

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

/* One byte from the daemon's socket and, unless the daemon declines to account for us (our uid
   is at its cap), our record (a sealed memfd) in SCM_RIGHTS; -1 if the daemon does not answer
   within the timeouts. *conn gets the connection, which we keep: the daemon answers our pings on
   it. */
static int procs_from_daemon(int *conn)
{
    *conn = -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char path[PATH_MAX];
    int dirfd = -1; /* a node under a long path: the socket through its directory (mokka_client.h) */
    if (snprintf(path, sizeof(path), "%s%s", mokka_path(), MOKKA_PROCS_SOCK_SUFFIX) >= (int)sizeof(path) ||
        mokka_unix_address(path, &addr, &dirfd) != 0)
        return -1;
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        if (dirfd >= 0)
            close(dirfd);
        return -1;
    }
    struct timeval tv = {0, 250000}; /* connect, then receive: a wedged daemon costs 0.5 s once */
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int fd = -1;
    int connected = connect(sock, (struct sockaddr *)&addr, sizeof(addr)) == 0;
    if (dirfd >= 0)
        close(dirfd);
    if (connected) {
        char byte = 0;
        struct iovec iov = {&byte, 1};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
        /* A signal cuts recvmsg short even under SA_RESTART when a timeout is set: retry, but
           only until the deadline, so a stream of signals cannot make the wait unbounded. */
        struct timespec now, end;
        clock_gettime(CLOCK_MONOTONIC, &end);
        end.tv_nsec += 250000000L;
        if (end.tv_nsec >= 1000000000L) {
            end.tv_sec++;
            end.tv_nsec -= 1000000000L;
        }
        ssize_t n;
        while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            long left_us = (long)(end.tv_sec - now.tv_sec) * 1000000L + (end.tv_nsec - now.tv_nsec) / 1000;
            if (left_us <= 0)
                break;
            struct timeval rest = {left_us / 1000000L, left_us % 1000000L};
            setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &rest, sizeof(rest));
        }
        struct cmsghdr *h = n == 1 ? CMSG_FIRSTHDR(&msg) : NULL;
        if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS && h->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(h), sizeof(fd));
    }
    if (fd < 0) {
        close(sock);
        return -1;
    }
    *conn = sock;
    return fd;
}

/* No destructor unmaps anything: at exit() other threads may still be inside a call, and
   unmapping under them is a SIGSEGV in the host process. The kernel drops the mappings. */

static inline const struct mokka_gpu *gpu_of(CUdevice dev) { return &state()->gpus[g_visible[dev]]; }

static inline int lost(CUdevice dev) { return (int)__atomic_load_n(&gpu_of(dev)->lost, __ATOMIC_RELAXED); }

#define INIT()                                                       \
    do {                                                             \
        if (!LOAD(&g_initialized))                                   \
            return CUDA_ERROR_NOT_INITIALIZED;                       \
    } while (0)

#define DEVICE(dev)                                                  \
    do {                                                             \
        INIT();                                                      \
        if ((dev) < 0 || (dev) >= g_count)                           \
            return CUDA_ERROR_INVALID_DEVICE;                        \
    } while (0)

/* A GPU that fell off the bus answers what the driver probed (name, UUID, PCI, attributes) but
   fails everything that would touch it, with the error applications report after Xid 79. */
#define LIVE_DEVICE(dev)                                             \
    do {                                                             \
        DEVICE(dev);                                                 \
        if (lost(dev))                                               \
            return CUDA_ERROR_UNKNOWN;                               \
    } while (0)

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

struct mig_view {
    uint32_t on;          /* the ordinal is a MIG device */
    uint32_t gi, ci;      /* its GPU and compute instance ids */
    uint32_t sm;
    uint64_t mem_total;   /* bytes: its GPU instance's memory */
    char name[96];
    char uuid[48];
};
static struct mig_view g_mig[MOKKA_MAX_GPUS]; /* by CUdevice ordinal; written in cuInit only */
static struct mig_view g_mig_of[MOKKA_MAX_GPUS]; /* the same by GPU index (a GPU is listed once) */
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

/* The SM's limits per compute capability (the CUDA programming guide's "technical
   specifications per compute capability") are data, in mokkafs/model/compute.py, published. */
struct sm_limits {
    uint32_t threads_per_sm, shared_per_sm, shared_optin, blocks_per_sm, fp64_ratio;
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
    MOKKA_CONSISTENT(state()) {
        cc[0] = g->cc_major, cc[1] = g->cc_minor;
        pci[0] = g->pci_domain, pci[1] = g->pci_bus, pci[2] = g->pci_device;
        pci_ids[0] = g->pci_device_id, pci_ids[1] = g->pci_subsystem_id;
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
    int ampere = cc[0] >= 8, hopper = cc[0] >= 9;
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
    case 107: v = ampere; break;                     /* GENERIC_COMPRESSION_SUPPORTED */
    case 108: v = ampere ? (int)(l2 / 4 * 3) : 0; break; /* MAX_PERSISTING_L2_CACHE_SIZE */
    case 109: v = ampere ? 134213632 : 0; break;     /* MAX_ACCESS_POLICY_WINDOW_SIZE */
    case 110: v = 1; break;                          /* GPU_DIRECT_RDMA_WITH_CUDA_VMM */
    case 111: v = ampere ? 1024 : 0; break;          /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    case 112: case 113: case 114: case 115: case 116: case 117: v = 1; break;
    case 118: v = ampere ? 100 : 0; break;           /* GPU_DIRECT_RDMA_WRITES_ORDERING */
    case 119: v = 9; break;                          /* MEMPOOL_SUPPORTED_HANDLE_TYPES */
    case 120: v = hopper; break;                     /* CLUSTER_LAUNCH */
    case 121: case 122: case 123: case 124: case 125: v = 1; break;
    case 126: v = hopper ? 4 : 1; break;             /* MEM_SYNC_DOMAIN_COUNT */
    case 127: v = hopper; break;                     /* TENSOR_MAP_ACCESS_SUPPORTED */
    case 128: v = (int)has_fabric; break;            /* HANDLE_TYPE_FABRIC_SUPPORTED */
    case 129: v = 1; break;                          /* UNIFIED_FUNCTION_POINTERS */
    case 130: v = 0; break;                          /* NUMA_CONFIG: none */
    case 131: v = -1; break;                         /* NUMA_ID */
    case 132: v = hopper && has_fabric; break;       /* MULTICAST_SUPPORTED */
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

/* ---- this process's record --------------------------------------------------------------- */

/* Everything below, and the allocation table further down, is guarded by g_acct_lock. The
   process's own totals live here; its record (mokka_state.h) only mirrors them, so a record
   lost with the daemon is refilled from them. */
static pthread_mutex_t g_acct_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mokka_proc_record *g_rec;     /* our record, mapped read-write; NULL: unaccounted */
static int g_rec_fd = -1;                   /* kept open: a restarted daemon re-opens it here */
static dev_t g_rec_dev;
static ino_t g_rec_ino;
static int g_conn = -1;                     /* our connection to the daemon, for pings */
static dev_t g_conn_dev;                    /* what it was, in case the program closes it and */
static ino_t g_conn_ino;                    /* the number comes back as another file */
static int g_unaccounted;                   /* no daemon, or it declined: retried after a while */
static unsigned g_since_check;              /* accounting calls since the connection was checked */
static uint64_t g_told;                     /* GPUs the daemon has folded our context in for */
static uint64_t g_told_mem;                 /* and our memory */
static uint64_t g_mine[MOKKA_MAX_GPUS];     /* bytes this process has allocated, by GPU index */
static unsigned g_ctx_refs[MOKKA_MAX_GPUS]; /* contexts per GPU index */
static int g_hold_fd[MOKKA_MAX_GPUS];       /* GPU index -> its context lock's descriptor + 1 (0: none) */
static dev_t g_hold_dev[MOKKA_MAX_GPUS];
static ino_t g_hold_ino[MOKKA_MAX_GPUS];

struct alloc {
    CUdeviceptr ptr;  /* 0: empty, 1: deleted */
    uint64_t size;
    unsigned gi;
    unsigned kind;    /* MOKKA_MEM_DEVICE, _MANAGED (both accounted to GPU gi) or _HOST */
    CUcontext ctx;    /* destroying it frees the allocation */
};

static struct alloc *g_allocs;   /* open addressing, linear probing */
static size_t g_cap, g_used_slots, g_live;
/* The same allocations sorted by address, for "which allocation holds this pointer" (copies,
   pointer attributes): a bump allocator appends, so the usual insert and free are at the end. */
static struct mokka_range *g_ranges;
static size_t g_nranges, g_ranges_cap;
static uint64_t g_bump[MOKKA_MAX_GPUS];
static uint64_t g_window[MOKKA_MAX_GPUS]; /* each GPU's reserved address window; 0: not yet */
static unsigned g_nrelease;               /* freed ranges waiting to go back (release_later) */
static uint64_t g_release_bytes;
static unsigned g_primary_refs[MOKKA_MAX_GPUS]; /* guarded by g_lock */
/* Made: the primary context exists on its GPU (compute mode passed, the process listed there). The
   runtime holds every device's primary context from init (cuda_export.c) but makes it only when
   it first makes it current, as the driver creates a context lazily. Guarded by g_lock. */
static unsigned char g_primary_made[MOKKA_MAX_GPUS];
static __thread int t_depth;

/* Is descriptor fd still what we opened (dev, ino)? One the program closed, or whose number now
   names another file, must be neither used nor closed by us. */
static int still_ours(int fd, dev_t dev, ino_t ino)
{
    struct stat sb;
    return fd >= 0 && fstat(fd, &sb) == 0 && sb.st_dev == dev && sb.st_ino == ino;
}

static void after_fork_child(void)
{
    /* The child is another process with no contexts: the parent's record and connection are the
       parent's (the daemon knows the parent by them), so the child lets go of both and gets its
       own on its first context. The child has one thread, so unmapping is safe here. The
       parent's allocation table is left behind, not freed: a thread may have been resizing it
       at fork time. */
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_acct_lock, NULL);
    if (g_rec)
        munmap(g_rec, sizeof(*g_rec));
    g_rec = NULL;
    if (still_ours(g_rec_fd, g_rec_dev, g_rec_ino)) /* not a number the program reused */
        close(g_rec_fd);
    if (still_ours(g_conn, g_conn_dev, g_conn_ino))
        close(g_conn);
    g_rec_fd = g_conn = -1;
    for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++) {
        /* close, never LOCK_UN: the lock belongs to the open file the parent still holds */
        if (g_hold_fd[gi] && still_ours(g_hold_fd[gi] - 1, g_hold_dev[gi], g_hold_ino[gi]))
            close(g_hold_fd[gi] - 1);
        g_hold_fd[gi] = 0;
    }
    g_unaccounted = 0;
    g_since_check = 0;
    g_told = g_told_mem = 0;
    memset(g_mine, 0, sizeof(g_mine));
    memset(g_ctx_refs, 0, sizeof(g_ctx_refs));
    memset(g_primary_refs, 0, sizeof(g_primary_refs));
    memset(g_primary_made, 0, sizeof(g_primary_made));
    memset(g_bump, 0, sizeof(g_bump));
    g_allocs = NULL;
    g_cap = g_used_slots = g_live = 0;
    g_ranges = NULL; /* left behind, like the table */
    g_nranges = g_ranges_cap = 0;
    g_nrelease = 0;
    g_release_bytes = 0;
    t_depth = 0;
}

__attribute__((constructor)) static void register_fork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

static uint64_t ctx_mask(void)
{
    uint64_t m = 0;
    for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++)
        if (g_ctx_refs[gi])
            m |= 1ull << gi;
    return m;
}

static void drop_conn(void)
{
    if (still_ours(g_conn, g_conn_dev, g_conn_ino))
        close(g_conn);
    g_conn = -1;
}

/* Connect and take the record the daemon gives (our own again after a daemon restart, or a
   fresh one); a record without the seals, of another size or header is refused, which only
   turns accounting off. A new record is filled from our totals. Called on the first context,
   not in cuInit, which stays off the daemon's round trip. */
static void map_procs(void)
{
    drop_conn();
    int conn, fd = procs_from_daemon(&conn);
    if (fd < 0) {
        g_unaccounted = 1;
        return;
    }
    struct stat sb, cb;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(conn, &cb) != 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (size_t)sb.st_size != sizeof(struct mokka_proc_record) || seals < 0 ||
        (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        goto refuse;
    g_conn = conn;
    g_conn_dev = cb.st_dev;
    g_conn_ino = cb.st_ino;
    if (g_rec && sb.st_dev == g_rec_dev && sb.st_ino == g_rec_ino) { /* the daemon kept ours */
        close(fd);
        return;
    }
    void *m = mmap(NULL, sizeof(struct mokka_proc_record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        g_conn = -1;
        goto refuse;
    }
    struct mokka_proc_record *r = m;
    if (r->magic != MOKKA_PROCS_MAGIC || r->version != MOKKA_PROCS_VERSION || r->size != sizeof(*r)) {
        munmap(m, sizeof(*r));
        g_conn = -1;
        goto refuse;
    }
    __atomic_store_n(&r->contexts, ctx_mask(), __ATOMIC_RELAXED);
    for (int gi = 0; gi < MOKKA_MAX_GPUS; gi++) {
        __atomic_store_n(&r->mem[gi], g_mine[gi], __ATOMIC_RELAXED);
        const struct mig_view *m = &g_mig_of[gi];
        __atomic_store_n(&r->mig[gi], m->on ? MOKKA_PROC_ON_MIG | m->gi << 8 | m->ci : 0u, __ATOMIC_RELAXED);
    }
    if (g_rec) /* only ever touched under g_acct_lock, which we hold */
        munmap(g_rec, sizeof(*g_rec));
    if (g_rec_fd >= 0 && still_ours(g_rec_fd, g_rec_dev, g_rec_ino))
        close(g_rec_fd);
    g_rec = r;
    g_rec_fd = fd;
    g_rec_dev = sb.st_dev;
    g_rec_ino = sb.st_ino;
    g_told = g_told_mem = 0; /* a new daemon, or a new record: tell it again */
    return;
refuse:
    close(fd);
    close(conn);
    g_unaccounted = 1;
}

/* Take our record, once (retried after a while when there was none: sync_slot). */
static void claim_slot(void)
{
    if (!g_rec && !g_unaccounted)
        map_procs();
}

/* Is the daemon still at the other end? A closed connection (the daemon restarted, or the program
   closed our descriptor) is made again, which gives back our record or a new one. Checked once
   every 4096 calls, so the allocation fast path stays a few stores. */
static void sync_slot(void)
{
    if (++g_since_check < 4096) {
        claim_slot();
        return;
    }
    int saved = errno;
    g_since_check = 0;
    if (g_unaccounted) {
        g_unaccounted = 0; /* a daemon may be up, its cap may have room */
    } else if (g_rec) {
        struct pollfd p = {.fd = g_conn, .events = POLLIN};
        char c;
        if (!still_ours(g_conn, g_conn_dev, g_conn_ino) ||
            (poll(&p, 1, 0) == 1 && ((p.revents & (POLLHUP | POLLERR)) || recv(g_conn, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)))
            map_procs();
    }
    claim_slot();
    errno = saved;
}

/* Ask the daemon to fold our record into what NVML shows, and wait (bounded) until it has; a
   daemon that does not answer in time costs this call 200 ms and nothing else. A connection
   found closed is made again once. */
static void tell_daemon(void)
{
    int saved = errno;
    for (int attempt = 0; attempt < 2 && g_rec; attempt++) {
        if (!still_ours(g_conn, g_conn_dev, g_conn_ino)) {
            map_procs();
            continue;
        }
        char buf[64];
        while (recv(g_conn, buf, sizeof(buf), MSG_DONTWAIT) > 0) /* late answers to earlier pings */
            ;
        if (send(g_conn, "?", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
            map_procs();
            continue;
        }
        struct timespec now, end;
        clock_gettime(CLOCK_MONOTONIC, &end);
        end.tv_nsec += 200000000L;
        if (end.tv_nsec >= 1000000000L) {
            end.tv_sec++;
            end.tv_nsec -= 1000000000L;
        }
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            long left_ms = (long)(end.tv_sec - now.tv_sec) * 1000L + (end.tv_nsec - now.tv_nsec) / 1000000L;
            struct pollfd p = {.fd = g_conn, .events = POLLIN};
            int n = left_ms > 0 ? poll(&p, 1, (int)left_ms) : 0;
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) { /* no answer in time: go on, listed at the daemon's next tick */
                errno = saved;
                return;
            }
            break;
        }
        if (recv(g_conn, buf, 1, MSG_DONTWAIT) == 1) {
            errno = saved;
            return;
        }
        map_procs(); /* closed: the daemon restarted */
    }
    errno = saved;
}

/* Mirror our total on GPU index gi into the record; the first time we have memory there, have
   the daemon list it at once. */
static void publish_mem(unsigned gi)
{
    if (!g_rec)
        return;
    __atomic_store_n(&g_rec->mem[gi], LOAD(&g_mine[gi]), __ATOMIC_RELAXED);
    if (g_mine[gi] && !(g_told_mem >> gi & 1)) {
        g_told_mem |= 1ull << gi;
        tell_daemon();
    }
}

/* Bytes that count against us on GPU index gi, as the daemon last told our record: our uid's
   other processes' and root's. Clamped: it is the record, and we may have scribbled on it. */
static uint64_t others_used(unsigned gi, uint64_t cap)
{
    if (!g_rec)
        return 0;
    uint64_t v = __atomic_load_n(&g_rec->others[gi], __ATOMIC_RELAXED);
    return v < cap ? v : cap;
}

/* Usable memory and what the pin (if any) says is used. */
static void memory_limits(unsigned gi, uint64_t *total, uint64_t *usable, uint64_t *pinned)
{
    if (g_mig_of[gi].on) { /* a MIG device: its GPU instance's memory, all of it usable, no pin */
        *total = *usable = g_mig_of[gi].mem_total;
        *pinned = 0;
        return;
    }
    const struct mokka_gpu *g = &state()->gpus[gi];
    uint64_t t, reserved, used;
    uint32_t is_pinned;
    MOKKA_CONSISTENT(state()) {
        t = g->mem_total;
        reserved = g->mem_reserved;
        used = g->mem_used;
        is_pinned = g->mem_used_pinned;
    }
    *total = t;
    *usable = t > reserved ? t - reserved : 0;
    *pinned = is_pinned ? used : 0;
}

/* ---- compute modes ----------------------------------------------------------------------

   The GPU's compute mode is in the state (NVML's numbers, which are CUDA's). PROHIBITED refuses
   every new context. The kernel arbitrates EXCLUSIVE_PROCESS: each GPU has a lock file the daemon
   made next to the state (<state>.procs.lock<N>), and a process holds a flock on it while it has
   any context on that GPU: exclusive in EXCLUSIVE_PROCESS mode, shared otherwise, so a process
   that took its context before the mode changed still keeps a later exclusive one out. flock
   needs only a read-only descriptor (a pod's read-only mount will do), never blocks here
   (LOCK_NB), and dies with its holder, kill -9 included. No daemon round trip. */

static inline uint32_t compute_mode(unsigned gi)
{
    return __atomic_load_n(&state()->gpus[gi].compute_mode, __ATOMIC_RELAXED);
}

/* Take GPU index gi's lock for this process's first context there. Called with g_acct_lock held.
   No lock file (a daemon from before compute modes, or one removed) means nothing to arbitrate
   with: the context is allowed. */
static CUresult hold_gpu(unsigned gi)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s%s%u", mokka_path(), MOKKA_PROCS_LOCK_SUFFIX, gi) >= (int)sizeof(path))
        return CUDA_SUCCESS;
    int saved = errno;
    int exclusive = compute_mode(gi) == CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0)
            close(fd);
        errno = saved;
        return CUDA_SUCCESS;
    }
    int r;
    while ((r = flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB)) < 0 && errno == EINTR)
        ;
    if (r < 0) { /* another process holds it: refused if exclusive, else allowed without it */
        close(fd);
        errno = saved;
        return exclusive ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS;
    }
    g_hold_fd[gi] = fd + 1;
    g_hold_dev[gi] = sb.st_dev;
    g_hold_ino[gi] = sb.st_ino;
    errno = saved;
    return CUDA_SUCCESS;
}

/* Our last context on GPU index gi is gone: let another process have it. */
static void let_go_gpu(unsigned gi)
{
    if (g_hold_fd[gi] && still_ours(g_hold_fd[gi] - 1, g_hold_dev[gi], g_hold_ino[gi])) {
        int saved = errno;
        close(g_hold_fd[gi] - 1);
        errno = saved;
    }
    g_hold_fd[gi] = 0;
}

/* One context more (delta +1) or fewer (-1) on GPU index gi. The first takes the GPU's lock and
   fails with DEVICE_UNAVAILABLE when another process holds it in EXCLUSIVE_PROCESS mode; the last
   lets it go. */
static CUresult context_ref(unsigned gi, int delta)
{
    CUresult res = CUDA_SUCCESS;
    pthread_mutex_lock(&g_acct_lock);
    if (delta > 0 && g_ctx_refs[gi] == 0)
        res = hold_gpu(gi);
    if (res == CUDA_SUCCESS && (delta > 0 || g_ctx_refs[gi] > 0)) {
        g_ctx_refs[gi] += (unsigned)delta;
        if (g_ctx_refs[gi] == 0)
            let_go_gpu(gi);
        sync_slot();
        if (g_rec) {
            __atomic_store_n(&g_rec->contexts, ctx_mask(), __ATOMIC_RELAXED);
            if (g_ctx_refs[gi] && !(g_told >> gi & 1)) { /* a first context here: listed at once */
                g_told |= 1ull << gi;
                tell_daemon();
            }
        }
    }
    pthread_mutex_unlock(&g_acct_lock);
    return res;
}

/* ---- contexts -------------------------------------------------------------------------- */

/* Contexts live in a table the library owns, and a CUcontext is a number, never an address:
   tag (16 bits) | generation (32, odd while live) | slot (16). Slots 64.. are cuCtxCreate's:
   destroying one moves its slot to the next generation, so its old handle is refused even after
   the slot is reused, and a stale handle can never destroy, push or allocate into the newer
   context (malloc handed a destroyed context's address to the next one). Slots 0..63 are the
   primary contexts of ordinals 0..63, with one handle each for the life of the process, as the
   driver's: generation 1 while retained, 0 once the last reference is gone, and a later retain
   brings the same handle back (a thread that kept it current carries on, as with the driver). A
   random value or a pointer to anything fails the shape compare; nothing a caller hands in is
   dereferenced. A check is a mask compare and a load, so cuMemAlloc stays on its fast path. */
#define CTX_TAG 0x6d63ull
#define CTX_SLOTS 1024
#define CTX_STACK 32
/* Tag, slot < 1024 and an odd generation, in one compare. */
#define CTX_SHAPE_MASK (0xFFFFull << 48 | 1ull << 16 | (0xFFFFull & ~(CTX_SLOTS - 1ull)))
#define CTX_SHAPE (CTX_TAG << 48 | 1ull << 16)

struct ctx_slot {
    uint32_t gen;  /* odd while live: stored last on create, first on destroy */
    CUdevice dev;
    unsigned flags;
};

struct ctx_info {
    CUdevice dev;
    unsigned flags;
};

static struct ctx_slot g_ctx[CTX_SLOTS];
static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER; /* creating and destroying slots >= 64;
                                                                 the primary slots are g_lock's */
static unsigned g_ctx_next = MOKKA_MAX_GPUS;                   /* where the search for a free slot starts */

_Static_assert(sizeof(CUcontext) == 8 && CTX_SLOTS > MOKKA_MAX_GPUS && (CTX_SLOTS & (CTX_SLOTS - 1)) == 0,
               "a 64-bit handle, room beyond the primary slots, a power of two");

static void free_context_memory(CUcontext c);
static __thread CUcontext t_stack[CTX_STACK];

static inline CUcontext ctx_handle(unsigned slot, uint32_t gen)
{
    return (CUcontext)(uintptr_t)(CTX_TAG << 48 | (uint64_t)gen << 16 | slot);
}

static inline unsigned ctx_slot_of(CUcontext c) { return (unsigned)((uintptr_t)c & 0xFFFF); }

/* 1: a live context, *out filled; 0: not a handle of ours; -1: one of ours, since destroyed.
   The fields are read between two loads of the generation, so a slot destroyed and reused
   meanwhile is reported destroyed, not answered with the newer context's device. */
static inline int ctx_lookup(CUcontext c, struct ctx_info *out)
{
    uint64_t h = (uint64_t)(uintptr_t)c;
    if ((h & CTX_SHAPE_MASK) != CTX_SHAPE)
        return 0;
    const struct ctx_slot *sl = &g_ctx[h & 0xFFFF];
    uint32_t gen = (uint32_t)(h >> 16);
    if (LOAD(&sl->gen) != gen)
        return -1;
    out->dev = __atomic_load_n(&sl->dev, __ATOMIC_RELAXED);
    out->flags = __atomic_load_n(&sl->flags, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&sl->gen, __ATOMIC_RELAXED) == gen ? 1 : -1;
}

/* The child of a fork has none of its parent's contexts (after_fork_child drops the references
   and the stack): every handle it inherited is dead there. */
static void ctx_after_fork_child(void)
{
    pthread_mutex_init(&g_ctx_lock, NULL);
    for (unsigned i = 0; i < CTX_SLOTS; i++)
        if (i < MOKKA_MAX_GPUS)
            g_ctx[i].gen = 0;
        else if (g_ctx[i].gen & 1)
            g_ctx[i].gen++;
}

__attribute__((constructor)) static void ctx_register_fork(void) { pthread_atfork(NULL, NULL, ctx_after_fork_child); }

static CUcontext current(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

/* The thread's current context. One destroyed while current here (by another thread, or a
   primary context released for the last time) is CONTEXT_IS_DESTROYED, as cuda.h says. */
static CUresult current_ctx(CUcontext *out, struct ctx_info *info)
{
    INIT();
    CUcontext c = current();
    int k = c ? ctx_lookup(c, info) : 0;
    if (k <= 0)
        return k < 0 ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* A context handed in as an argument: anything but a live one is INVALID_CONTEXT. */
static inline int ctx_ok(CUcontext c)
{
    struct ctx_info ci;
    return ctx_lookup(c, &ci) > 0;
}

/* Make primary context `dev` on its GPU (g_lock held): the compute mode rules, the process is
   listed there. */
static CUresult primary_make(CUdevice dev)
{
    if (g_primary_made[dev])
        return CUDA_SUCCESS;
    if (lost(dev))
        return CUDA_ERROR_UNKNOWN;
    unsigned gi = g_visible[dev];
    /* under g_lock (then g_acct_lock, the one order): a racing last release is whole */
    CUresult r = compute_mode(gi) == CU_COMPUTEMODE_PROHIBITED ? CUDA_ERROR_DEVICE_UNAVAILABLE : context_ref(gi, +1);
    if (r == CUDA_SUCCESS)
        g_primary_made[dev] = 1;
    return r;
}

/* One reference more on primary context `dev`; with make, the context is made too. */
static CUresult primary_retain(CUcontext *pctx, CUdevice dev, int make)
{
    ARG(pctx);
    DEVICE(dev); /* a lost GPU's handle, but no context on it (primary_make) */
    pthread_mutex_lock(&g_lock);
    struct ctx_slot *sl = &g_ctx[dev];
    if (make) {
        CUresult r = primary_make(dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&g_lock);
            return r;
        }
    }
    if (g_primary_refs[dev] == 0) { /* the first retain brings the one handle (back) to life */
        __atomic_store_n(&sl->dev, dev, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->gen, 1, __ATOMIC_RELEASE);
    }
    g_primary_refs[dev]++;
    CUcontext c = ctx_handle((unsigned)dev, sl->gen);
    pthread_mutex_unlock(&g_lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { return primary_retain(pctx, dev, 1); }

/* What the runtime's CUDART_INTERFACE slot 2 answers (cuda_export.c): retained, not yet made. */
CUresult mokka_primary_handle(CUcontext *pctx, CUdevice dev) { return primary_retain(pctx, dev, 0); }

/* A context about to be current: a primary one the runtime holds unmade is made now. */
static CUresult ctx_materialize(CUcontext c)
{
    unsigned slot = ctx_slot_of(c);
    if (slot >= MOKKA_MAX_GPUS || LOAD(&g_primary_made[slot]))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    CUresult r = g_primary_refs[slot] ? primary_make((CUdevice)slot) : CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&g_lock);
    return r;
}

static CUresult primary_release(CUdevice dev)
{
    DEVICE(dev);
    pthread_mutex_lock(&g_lock);
    if (g_primary_refs[dev] == 0) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    int last = --g_primary_refs[dev] == 0;
    if (last) {
        /* The last release destroys the primary context and what it holds. Still under g_lock,
           so a retain racing it cannot allocate into the context before its memory is freed.
           Inactive, its handle is refused until the next retain. */
        __atomic_store_n(&g_ctx[dev].gen, 0, __ATOMIC_RELEASE);
        free_context_memory(ctx_handle((unsigned)dev, 1));
        if (g_primary_made[dev])
            context_ref(g_visible[dev], -1);
        g_primary_made[dev] = 0;
    }
    pthread_mutex_unlock(&g_lock);
    if (last) { /* the runtime's per-context state goes with it (cuda_export.c), and its handles */
        mokka_cls_context_ended(ctx_handle((unsigned)dev, 1));
        mokka_objects_context_ended(ctx_handle((unsigned)dev, 1));
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
    DEVICE(dev);
    __atomic_store_n(&g_ctx[dev].flags, flags, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) { return primary_set_flags(dev, flags); }
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) { return primary_set_flags(dev, flags); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    ARG(flags);
    ARG(active);
    DEVICE(dev);
    *flags = __atomic_load_n(&g_ctx[dev].flags, __ATOMIC_RELAXED);
    *active = LOAD(&g_primary_made[dev]) && LOAD(&g_primary_refs[dev]) > 0;
    return CUDA_SUCCESS;
}

static CUresult primary_reset(CUdevice dev)
{
    DEVICE(dev);
    pthread_mutex_lock(&g_lock);
    free_context_memory(ctx_handle((unsigned)dev, 1));
    pthread_mutex_unlock(&g_lock);
    mokka_cls_context_ended(ctx_handle((unsigned)dev, 1)); /* cudaDeviceReset's clean-up */
    mokka_objects_context_ended(ctx_handle((unsigned)dev, 1));
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return primary_reset(dev); }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { return primary_reset(dev); }

static CUresult push(CUcontext c)
{
    if (t_depth >= CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE; /* deeper than any real program nests */
    t_stack[t_depth++] = c;
    return CUDA_SUCCESS;
}

/* A free slot beyond the primary ones, made live for `dev`; 0 when all are taken. */
static CUcontext ctx_take(CUdevice dev, unsigned flags)
{
    CUcontext c = NULL;
    pthread_mutex_lock(&g_ctx_lock);
    for (unsigned n = 0; n < CTX_SLOTS - MOKKA_MAX_GPUS && !c; n++) {
        unsigned i = g_ctx_next;
        g_ctx_next = i + 1 < CTX_SLOTS ? i + 1 : MOKKA_MAX_GPUS;
        struct ctx_slot *sl = &g_ctx[i];
        if (sl->gen & 1)
            continue;
        __atomic_store_n(&sl->dev, dev, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->flags, flags, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->gen, sl->gen + 1, __ATOMIC_RELEASE);
        c = ctx_handle(i, sl->gen);
    }
    pthread_mutex_unlock(&g_ctx_lock);
    return c;
}

/* End a live non-primary context; 0 if `c` is not one (already destroyed: a racing destroy of
   the same handle wins once). */
static int ctx_end(CUcontext c, struct ctx_info *ci)
{
    pthread_mutex_lock(&g_ctx_lock);
    int ok = ctx_lookup(c, ci) > 0 && ctx_slot_of(c) >= MOKKA_MAX_GPUS;
    if (ok)
        __atomic_store_n(&g_ctx[ctx_slot_of(c)].gen, g_ctx[ctx_slot_of(c)].gen + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_ctx_lock);
    return ok;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ARG(pctx);
    LIVE_DEVICE(dev);
    unsigned gi = g_visible[dev];
    if (compute_mode(gi) == CU_COMPUTEMODE_PROHIBITED)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    CUresult r = context_ref(gi, +1); /* EXCLUSIVE_PROCESS: refused while another process has one */
    if (r != CUDA_SUCCESS)
        return r;
    CUcontext c = ctx_take(dev, flags);
    if (!c) {
        context_ref(gi, -1);
        return CUDA_ERROR_OUT_OF_MEMORY; /* 960 live contexts: the driver runs out far sooner */
    }
    r = push(c);
    if (r != CUDA_SUCCESS) {
        struct ctx_info ci;
        ctx_end(c, &ci);
        context_ref(gi, -1);
        return r;
    }
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev); }
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { return ctx_create(pctx, flags, dev); }
CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams, unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    return ctx_create(pctx, flags, dev);
}
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    (void)ctxCreateParams;
    return ctx_create(pctx, flags, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    INIT();
    struct ctx_info ci;
    if (ctx_lookup(ctx, &ci) > 0 && ctx_slot_of(ctx) >= MOKKA_MAX_GPUS)
        mokka_cls_context_ended(ctx); /* while it still lives: its destructors may use it */
    if (!ctx_end(ctx, &ci)) /* not ours, destroyed already, or a primary context */
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = t_depth - 1; i >= 0; i--) /* off this thread's stack */
        if (t_stack[i] == ctx) {
            memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - 1 - i) * sizeof(CUcontext));
            t_depth--;
        }
    unsigned gi = g_visible[ci.dev];
    free_context_memory(ctx);
    mokka_objects_context_ended(ctx);
    context_ref(gi, -1);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx) { return ctx_destroy(ctx); }
CUresult cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(ctx); }

static CUresult ctx_push(CUcontext ctx)
{
    INIT();
    if (!ctx_ok(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = ctx_materialize(ctx);
    return r != CUDA_SUCCESS ? r : push(ctx);
}

CUresult cuCtxPushCurrent(CUcontext ctx) { return ctx_push(ctx); }
CUresult cuCtxPushCurrent_v2(CUcontext ctx) { return ctx_push(ctx); }

static CUresult ctx_pop(CUcontext *pctx)
{
    INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx) { return ctx_pop(pctx); }
CUresult cuCtxPopCurrent_v2(CUcontext *pctx) { return ctx_pop(pctx); }

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    INIT();
    if (!ctx) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_ok(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = ctx_materialize(ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (t_depth == 0)
        return push(ctx);
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    ARG(pctx);
    INIT();
    *pctx = current();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    ARG(device);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS)
        *device = ci.dev;
    return r;
}

CUresult cuCtxSynchronize(void)
{
    CUcontext c;
    struct ctx_info ci;
    CUresult r = current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS && lost(ci.dev))
        return CUDA_ERROR_UNKNOWN;
    return r;
}

CUresult cuCtxGetFlags(unsigned int *flags)
{
    ARG(flags);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS)
        *flags = ci.flags;
    return r;
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    ARG(version);
    INIT();
    CUresult r = CUDA_SUCCESS;
    if (!ctx)
        r = current_ctx(&ctx, &(struct ctx_info){0, 0});
    else if (!ctx_ok(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS)
        *version = 3020; /* the context ABI every context since CUDA 3.2 reports */
    return r;
}

/* ---- memory ---------------------------------------------------------------------------- */

/* Device addresses: a 1 TiB window per GPU index, in the range real UVA pointers use
   (0x7000_0000_0000 + index x 2^40 where that is free). A window is reserved at the GPU's first
   allocation as one private anonymous MAP_NORESERVE mapping: it costs address space, and memory
   only where a program writes (an "80 GB" device costs what is copied into it). Freeing gives
   the pages back (MADV_DONTNEED), so freed memory reads back as zeros. */
#define VA_BASE 0x700000000000ull
#define VA_WINDOW (1ull << 40)
#define ALIGN 512ull

static size_t hash(CUdeviceptr p, size_t cap) { return (size_t)((p >> 9) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static int table_insert(struct alloc a)
{
    if ((g_used_slots + 1) * 2 > g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 1024;
        if (g_live * 4 < g_cap)
            cap = g_cap; /* mostly tombstones: rehash at the same size */
        struct alloc *t = calloc(cap, sizeof(*t));
        if (!t)
            return 0;
        for (size_t i = 0; i < g_cap; i++) {
            if (g_allocs[i].ptr > 1) {
                size_t h = hash(g_allocs[i].ptr, cap);
                while (t[h].ptr)
                    h = (h + 1) & (cap - 1);
                t[h] = g_allocs[i];
            }
        }
        free(g_allocs);
        g_allocs = t;
        g_cap = cap;
        g_used_slots = g_live;
    }
    if (g_nranges == g_ranges_cap) { /* room in the sorted index first: nothing to undo after */
        size_t cap = g_ranges_cap ? g_ranges_cap * 2 : 256;
        struct mokka_range *r = realloc(g_ranges, cap * sizeof(*r));
        if (!r)
            return 0;
        g_ranges = r;
        g_ranges_cap = cap;
    }
    size_t h = hash(a.ptr, g_cap);
    while (g_allocs[h].ptr > 1)
        h = (h + 1) & (g_cap - 1);
    if (g_allocs[h].ptr == 0)
        g_used_slots++;
    g_allocs[h] = a;
    g_live++;
    size_t at = g_nranges; /* sorted by address; a bump allocation goes last */
    while (at > 0 && g_ranges[at - 1].ptr > a.ptr)
        at--;
    memmove(&g_ranges[at + 1], &g_ranges[at], (g_nranges - at) * sizeof(*g_ranges));
    g_ranges[at] = (struct mokka_range){a.ptr, a.size, a.gi, a.kind, a.ctx};
    g_nranges++;
    return 1;
}

static struct alloc *table_find(CUdeviceptr p)
{
    if (!g_cap)
        return NULL;
    for (size_t h = hash(p, g_cap), n = 0; g_allocs[h].ptr && n < g_cap; h = (h + 1) & (g_cap - 1), n++)
        if (g_allocs[h].ptr == p)
            return &g_allocs[h];
    return NULL;
}

/* The index of the last range starting at or below p (g_nranges if none). */
static size_t range_at_or_below(uint64_t p)
{
    size_t lo = 0, hi = g_nranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_ranges[mid].ptr <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? lo - 1 : g_nranges;
}

static void range_remove(uint64_t p)
{
    size_t i = range_at_or_below(p);
    if (i < g_nranges && g_ranges[i].ptr == p) {
        memmove(&g_ranges[i], &g_ranges[i + 1], (g_nranges - i - 1) * sizeof(*g_ranges));
        g_nranges--;
    }
}

int mokka_mem_find(uint64_t p, uint64_t n, struct mokka_range *out)
{
    pthread_mutex_lock(&g_acct_lock);
    size_t i = range_at_or_below(p);
    int ok = i < g_nranges && p - g_ranges[i].ptr < g_ranges[i].size &&
             n <= g_ranges[i].size - (p - g_ranges[i].ptr);
    if (ok && out)
        *out = g_ranges[i];
    pthread_mutex_unlock(&g_acct_lock);
    return ok;
}

/* GPU index gi's window (g_acct_lock held); 0 if no address space is left. Where its usual
   place is taken, anywhere the kernel puts it. */
static uint64_t window_of(unsigned gi)
{
    if (g_window[gi])
        return g_window[gi];
    int saved = errno;
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *m = mmap((void *)(uintptr_t)(VA_BASE + gi * VA_WINDOW), VA_WINDOW, PROT_READ | PROT_WRITE,
                   flags | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED)
        m = mmap(NULL, VA_WINDOW, PROT_READ | PROT_WRITE, flags, -1, 0);
    errno = saved;
    if (m == MAP_FAILED)
        return 0;
    g_window[gi] = (uint64_t)(uintptr_t)m;
    return g_window[gi];
}

/* A fresh address range of `size` bytes on GPU index gi (g_acct_lock held); 0 if the window is
   full. Freeing the newest allocation hands its range back, so alloc/free loops reuse it. */
static CUdeviceptr va_take(unsigned gi, uint64_t size)
{
    uint64_t base = window_of(gi);
    if (!base)
        return 0;
    if (g_bump[gi] < base)
        g_bump[gi] = base;
    if (g_bump[gi] + size > base + VA_WINDOW) { /* wrapped: restart after the highest live range */
        uint64_t top = base;
        for (size_t i = 0; i < g_cap; i++)
            if (g_allocs[i].ptr > 1 && g_allocs[i].gi == gi && g_allocs[i].kind != MOKKA_MEM_HOST &&
                g_allocs[i].ptr + g_allocs[i].size > top)
                top = g_allocs[i].ptr + g_allocs[i].size;
        g_bump[gi] = top;
        if (top + size > base + VA_WINDOW)
            return 0;
    }
    CUdeviceptr p = g_bump[gi];
    g_bump[gi] += size;
    return p;
}

/* Freed device pages go back to the kernel (MADV_DONTNEED), but not one system call per free: a
   freed range waits in a short queue, and an allocation that takes it again (an alloc/free loop,
   a framework's pool) takes it off without a system call. The queue is released when it holds 32
   ranges or 64 MiB; a bigger range goes at once. So at most 64 MiB of freed memory stays resident.
   All under g_acct_lock. */
#define RELEASE_SLOTS 32
#define RELEASE_BYTES (64ull << 20)
static struct { uint64_t lo, hi; } g_release[RELEASE_SLOTS];

static void release_now(uint64_t lo, uint64_t hi)
{
    int saved = errno;
    madvise((void *)(uintptr_t)lo, hi - lo, MADV_DONTNEED);
    errno = saved;
}

static void release_drop(unsigned i, int now)
{
    if (now)
        release_now(g_release[i].lo, g_release[i].hi);
    g_release_bytes -= g_release[i].hi - g_release[i].lo;
    g_release[i] = g_release[--g_nrelease];
}

/* The whole pages of a freed range [p, p + size): a neighbour may share its ends. */
static void release_later(uint64_t p, uint64_t size)
{
    uint64_t lo = (p + 4095) & ~4095ull, hi = (p + size) & ~4095ull;
    if (hi <= lo)
        return;
    if (hi - lo >= RELEASE_BYTES) {
        release_now(lo, hi);
        return;
    }
    if (g_nrelease == RELEASE_SLOTS || g_release_bytes + (hi - lo) > RELEASE_BYTES)
        while (g_nrelease)
            release_drop(g_nrelease - 1, 1);
    g_release[g_nrelease].lo = lo;
    g_release[g_nrelease].hi = hi;
    g_nrelease++;
    g_release_bytes += hi - lo;
}

/* A new allocation [p, p + size): queued ranges inside it are simply in use again; one that only
   overlaps it is released now (the new allocation's contents are undefined, zeros will do). */
static void release_reused(uint64_t p, uint64_t size)
{
    for (unsigned i = g_nrelease; i-- > 0;)
        if (g_release[i].lo < p + size && p < g_release[i].hi)
            release_drop(i, !(p <= g_release[i].lo && g_release[i].hi <= p + size));
}

/* Pinned host memory (cuMemAllocHost, cuMemHostAlloc): pages of this process, not the GPU's,
   so not accounted; not locked either (RLIMIT_MEMLOCK would refuse most programs). */
static CUdeviceptr host_take(uint64_t size)
{
    int saved = errno;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    errno = saved;
    return m == MAP_FAILED ? 0 : (CUdeviceptr)(uintptr_t)m;
}

CUresult mokka_mem_alloc(CUdeviceptr *dptr, size_t bytesize, unsigned kind)
{
    ARG(dptr);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = current_ctx(&c, &ci);
    if (r != CUDA_SUCCESS)
        return r;
    if (bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (lost(ci.dev))
        return CUDA_ERROR_UNKNOWN;
    unsigned gi = g_visible[ci.dev];
    if (kind == MOKKA_MEM_HOST) {
        if (bytesize > (1ull << 46))
            return CUDA_ERROR_OUT_OF_MEMORY;
        uint64_t size = ((uint64_t)bytesize + 4095) & ~4095ull;
        CUdeviceptr p = host_take(size);
        if (!p)
            return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_mutex_lock(&g_acct_lock);
        int ok = table_insert((struct alloc){p, size, gi, kind, c});
        pthread_mutex_unlock(&g_acct_lock);
        if (!ok) {
            munmap((void *)(uintptr_t)p, size);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *dptr = p;
        return CUDA_SUCCESS;
    }
    uint64_t total, usable, pinned;
    memory_limits(gi, &total, &usable, &pinned);
    if (bytesize > usable)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t size = ((uint64_t)bytesize + ALIGN - 1) & ~(ALIGN - 1);
    pthread_mutex_lock(&g_acct_lock);
    sync_slot();
    /* What counts against us is what the daemon last folded (at most a tick old): two processes
       racing for the last bytes may both succeed, as they could not on a real GPU. */
    uint64_t before = g_mine[gi];
    uint64_t prior = others_used(gi, total);
    prior = before < total - prior ? prior + before : total;
    CUdeviceptr p = 0;
    if ((prior > pinned ? prior : pinned) + size <= usable) {
        p = va_take(gi, size);
        if (p && !table_insert((struct alloc){p, size, gi, kind, c})) {
            if (g_bump[gi] == p + size)
                g_bump[gi] = p;
            p = 0;
        }
    }
    if (p) {
        release_reused(p, size);
        __atomic_store_n(&g_mine[gi], before + size, __ATOMIC_RELAXED);
        publish_mem(gi);
    }
    pthread_mutex_unlock(&g_acct_lock);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return mokka_mem_alloc(dptr, bytesize, MOKKA_MEM_DEVICE);
}

/* Forget an allocation (g_acct_lock held): device memory's bytes leave our total, its pages go
   back to the kernel and its range may be reused; host memory is unmapped. */
static void forget(struct alloc *a)
{
    unsigned gi = a->gi;
    int saved = errno;
    if (a->kind == MOKKA_MEM_HOST) {
        munmap((void *)(uintptr_t)a->ptr, a->size);
    } else {
        __atomic_store_n(&g_mine[gi], g_mine[gi] - a->size, __ATOMIC_RELAXED);
        if (g_bump[gi] == a->ptr + a->size)
            g_bump[gi] = a->ptr;
        release_later(a->ptr, a->size);
    }
    errno = saved;
    range_remove(a->ptr);
    a->ptr = 1;
    g_live--;
}

/* Free p, an allocation of `kind` (MOKKA_MEM_DEVICE: device or managed memory, cuMemFree's;
   MOKKA_MEM_HOST: cuMemFreeHost's). Anything else, or a pointer inside one, is INVALID_VALUE. */
CUresult mokka_mem_free(CUdeviceptr dptr, unsigned kind)
{
    INIT();
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_acct_lock);
    struct alloc *a = table_find(dptr);
    if (!a || (kind == MOKKA_MEM_HOST) != (a->kind == MOKKA_MEM_HOST)) {
        pthread_mutex_unlock(&g_acct_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    unsigned gi = a->gi, host = a->kind == MOKKA_MEM_HOST;
    forget(a);
    if (!host) {
        sync_slot();
        publish_mem(gi);
    }
    pthread_mutex_unlock(&g_acct_lock);
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return mokka_mem_free(dptr, MOKKA_MEM_DEVICE); }

/* A context's end frees what was allocated in it, as the driver does. */
static void free_context_memory(CUcontext c)
{
    pthread_mutex_lock(&g_acct_lock);
    uint64_t touched = 0;
    for (size_t i = 0; i < g_cap; i++)
        if (g_allocs[i].ptr > 1 && g_allocs[i].ctx == c) {
            if (g_allocs[i].kind != MOKKA_MEM_HOST)
                touched |= 1ull << g_allocs[i].gi;
            forget(&g_allocs[i]);
        }
    if (touched) {
        sync_slot();
        for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++)
            if (touched >> gi & 1)
                publish_mem(gi);
    }
    pthread_mutex_unlock(&g_acct_lock);
}

/* The 32-bit ABI of CUDA < 3.2: addresses and sizes that fit in 32 bits, which ours never do. */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    (void)bytesize;
    ARG(dptr);
    INIT();
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    INIT();
    return dptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    ARG(free_bytes);
    ARG(total_bytes);
    CUcontext c;
    struct ctx_info ci;
    CUresult r = current_ctx(&c, &ci);
    if (r != CUDA_SUCCESS)
        return r;
    if (lost(ci.dev))
        return CUDA_ERROR_UNKNOWN;
    unsigned gi = g_visible[ci.dev];
    uint64_t total, usable, pinned;
    memory_limits(gi, &total, &usable, &pinned);
    pthread_mutex_lock(&g_acct_lock);
    sync_slot();
    uint64_t used = others_used(gi, total), mine = LOAD(&g_mine[gi]);
    pthread_mutex_unlock(&g_acct_lock);
    used = mine < total - used ? used + mine : total;
    if (pinned > used)
        used = pinned;
    *free_bytes = used < usable ? usable - used : 0;
    *total_bytes = total;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    ARG(free_bytes);
    ARG(total_bytes);
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_bytes = f > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)f;
        *total_bytes = t > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)t;
    }
    return r;
}

/* ---- for the other source files (cuda_internal.h) ---------------------------------------- */

int mokka_ctx_device(CUcontext c, CUdevice *dev)
{
    struct ctx_info ci;
    if (ctx_lookup(c, &ci) <= 0)
        return 0;
    *dev = ci.dev;
    return 1;
}

unsigned mokka_gpu_index(CUdevice dev) { return g_visible[dev]; }


int mokka_device_address(uint64_t p)
{
    for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++) {
        uint64_t base = __atomic_load_n(&g_window[gi], __ATOMIC_RELAXED);
        if (base && p - base < VA_WINDOW)
            return 1;
    }
    return 0;
}

CUresult mokka_current_device(CUdevice *dev)
{
    CUcontext c;
    struct ctx_info ci;
    CUresult r = current_ctx(&c, &ci);
    if (r == CUDA_SUCCESS)
        *dev = ci.dev;
    return r;
}
