/*
 * libnvidia-ml: nvmlInternalGetExportTable, the private table NVIDIA's own nvidia-smi asks for
 * right after nvmlInit. Without it every real nvidia-smi prints "Mismatch in versions between
 * nvidia-smi and NVML" and exits 255. docs/nvml.md lists the entries, how each was found and
 * what it answers.
 *
 * The table is an array of words: word 0 is its size in bytes, and word k (k >= 1) the entry at
 * byte offset 8k. nvidia-smi checks `size > offset` before each call, so the size is the table's
 * version: each driver branch appends entries, and the size we give is that of the configured
 * driver branch's own library (the node's driver version, in the state). A branch we have not
 * traced gets no table, as before. Entries we have not identified fail with NOT_SUPPORTED, which
 * nvidia-smi shows as N/A or works around; the identified ones answer from the state.
 */
#include "nvml_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The id of nvidia-smi's table: bytes c4 fe 3e 6c c9 8f 6c 4e a3 27 ee 69 6e 12 f7 c4. */
static const unsigned char SMI_TABLE_ID[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
                                               0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};

/* Entry numbers (word index, byte offset / 8). */
enum {
    E_IS_PRIMARY = 20,        /* 0x0a0 */
    E_TOPO_PATH = 23,         /* 0x0b8 */
    E_MONITOR_SUPPORTED = 72, /* 0x240 */
    E_HANDLE_BY_INDEX = 81,   /* 0x288 */
    E_ENFORCED_POWER = 108,   /* 0x360 */
    E_PROCS_COMPUTE = 213,    /* 0x6a8, 525 and later */
    E_PROCS_GRAPHICS = 214,   /* 0x6b0 */
    E_PROCS_MPS = 215,        /* 0x6b8 */
};

/* ---- entries -------------------------------------------------------------------------- */

/* Every entry not identified. The callers pass up to six arguments in registers; none is read. */
static nvmlReturn_t entry_unsupported(void) { return NVML_ERROR_NOT_SUPPORTED; }

/* (device, unsigned *isPrimary, unsigned *second): `-r` refuses the primary GPU (the one the
   console or X uses). A simulated data-centre GPU drives no display: 0 and 0. */
static nvmlReturn_t entry_is_primary(nvmlDevice_t device, unsigned int *is_primary, unsigned int *second)
{
    DEV(device);
    (void)g;
    ARG(is_primary);
    *is_primary = 0;
    if (second)
        *second = 0;
    return NVML_SUCCESS;
}

/* (device, unsigned *supported): dmon and pmon refuse a device unless this says 1 ("Not
   supported on the device(s)"). Every GPU the state has is sampled. */
static nvmlReturn_t entry_monitor_supported(nvmlDevice_t device, unsigned int *supported)
{
    DEV(device);
    (void)g;
    ARG(supported);
    *supported = 1;
    return NVML_SUCCESS;
}

/* (unsigned index, nvmlDevice_t *out, unsigned flags): the handle nvidia-smi uses everywhere;
   flags is 0x22 in every call seen. */
static nvmlReturn_t entry_handle_by_index(unsigned int index, nvmlDevice_t *out, unsigned int flags)
{
    (void)flags;
    return nvmlDeviceGetHandleByIndex_v2(index, out);
}

/* (device, unsigned *milliwatts): --query-gpu's enforced.power.limit, which the tool divides
   by 1000 and prints in W; the public getter's answer. */
static nvmlReturn_t entry_enforced_power(nvmlDevice_t device, unsigned int *milliwatts)
{
    return nvmlDeviceGetEnforcedPowerLimit(device, milliwatts);
}

/* NVLinks between GPU records a and b: direct links to b, else (both behind NVSwitches) the
   smaller number of switch links, as every GPU reaches every other through all of its links.
   The same rule as our own nvidia-smi's `topo -m`. */
static unsigned nvlinks_between(const struct mokka_gpu *a, const struct mokka_gpu *b)
{
    unsigned direct = 0, a_sw = 0, b_sw = 0;
    for (unsigned l = 0; l < a->nvlink_count && l < MOKKA_MAX_NVLINKS; l++) {
        const struct mokka_nvlink *k = &a->nvlink[l];
        if (!k->state)
            continue;
        if (k->remote_type == NVML_NVLINK_DEVICE_TYPE_SWITCH)
            a_sw++;
        else if (k->remote_type == NVML_NVLINK_DEVICE_TYPE_GPU && k->remote_has_pci && k->remote_domain == b->pci_domain &&
                 k->remote_bus == b->pci_bus && k->remote_device == b->pci_device)
            direct++;
    }
    if (direct)
        return direct;
    for (unsigned l = 0; l < b->nvlink_count && l < MOKKA_MAX_NVLINKS; l++)
        if (b->nvlink[l].state && b->nvlink[l].remote_type == NVML_NVLINK_DEVICE_TYPE_SWITCH)
            b_sw++;
    return a_sw < b_sw ? a_sw : b_sw;
}

static int gpu_by_bus_id(const struct mokka_state *s, const char *bus_id)
{
    char text[64];
    memcpy(text, bus_id, sizeof(text) - 1); /* the caller's buffers are 32 bytes or more */
    text[sizeof(text) - 1] = '\0';
    struct mokka_bus_id id;
    if (mokka_parse_bus_id(text, &id) != 0)
        return -1;
    for (unsigned i = 0; i < gpu_count(s); i++)
        if (mokka_bus_id_is(s, i, &id))
            return (int)i;
    return -1;
}

/* (const char *busId1, const char *busId2, unsigned *path): the cell of `topo -m` for two
   devices by PCI bus id. path is 0 PIX, 1 PXB, 2 PHB, 3 NODE, 4 SYS, and 4 + n for n bonded
   NVLinks (NVn), read off the tool's output for each value. Devices that are not GPUs of the
   state (NICs that sysfs shows) are NOT_FOUND. */
static nvmlReturn_t entry_topo_path(const char *bus1, const char *bus2, unsigned int *path)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!bus1 || !bus2 || !path)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_state *s = state();
    int i = gpu_by_bus_id(s, bus1), j = gpu_by_bus_id(s, bus2);
    if (i < 0 || j < 0)
        return NVML_ERROR_NOT_FOUND;
    struct mokka_gpu a, b;
    mokka_read_gpu(s, (unsigned)i, &a);
    mokka_read_gpu(s, (unsigned)j, &b);
    unsigned links = i == j ? 0 : nvlinks_between(&a, &b);
    if (links) {
        *path = 4 + links;
        return NVML_SUCCESS;
    }
    switch (a.topo_level[j]) {
    case NVML_TOPOLOGY_INTERNAL:
    case NVML_TOPOLOGY_SINGLE: *path = 0; break;
    case NVML_TOPOLOGY_MULTIPLE: *path = 1; break;
    case NVML_TOPOLOGY_HOSTBRIDGE: *path = 2; break;
    case NVML_TOPOLOGY_NODE: *path = 3; break;
    default: *path = 4; break;
    }
    return NVML_SUCCESS;
}

/* One element of the process lists (entries 213-215), as nvidia-smi reads it: the numbers of
   nvmlProcessInfo_v2_t (525) or nvmlProcessDetail_v1_t (535 and 550: one more word,
   usedGpuCcProtectedMemory), then the process name inline, 4096 bytes. The element size is
   the multiplier of the binaries' loops over the list (0x1018 in 525, 0x1020 in 535 and 550);
   the fields were confirmed by listing a CUDA process through the default table, `-q` and
   `pmon`. */
struct smi_process_head {
    uint32_t pid;
    uint32_t pad0;
    uint64_t used_memory;           /* bytes */
    uint32_t gpu_instance_id;       /* 0xFFFFFFFF: not a MIG device */
    uint32_t compute_instance_id;
    uint64_t used_cc_protected_memory; /* 535 and later */
};
#define SMI_PROCESS_NAME 4096
#define SMI_HEAD_525 offsetof(struct smi_process_head, used_cc_protected_memory)
#define SMI_HEAD_535 sizeof(struct smi_process_head)

/* argv[0] of pid, as the driver names a process (comm is only 15 characters). */
static void process_name(uint32_t pid, char *out, size_t n)
{
    int saved = errno;
    char path[64];
    out[0] = '\0';
    snprintf(path, sizeof(path), "/proc/%u/cmdline", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t got = read(fd, out, n - 1);
        close(fd);
        out[got > 0 ? got : 0] = '\0';
    }
    if (!out[0]) {
        snprintf(path, sizeof(path), "/proc/%u/comm", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t got = read(fd, out, n - 1);
            close(fd);
            while (got > 0 && out[got - 1] == '\n')
                got--;
            out[got > 0 ? got : 0] = '\0';
        }
    }
    errno = saved;
}

/* (device, unsigned *count, element *list): *count is the list's capacity in and the number
   of processes out; a list too short gets INSUFFICIENT_SIZE and the number needed, as the
   public process lists answer. head is the size of an element's numbers (the branch's). */
static nvmlReturn_t process_list(nvmlDevice_t device, unsigned int *count, unsigned char *list, size_t head,
                                 int compute)
{
    DEV(device);
    ARG(count);
    struct mokka_gpu_process procs[MOKKA_MAX_GPU_PROCS];
    uint32_t n = 0;
    if (compute) {
        MOKKA_CONSISTENT(s) {
            n = g->process_count;
            if (n > MOKKA_MAX_GPU_PROCS)
                n = MOKKA_MAX_GPU_PROCS;
            memcpy(procs, g->processes, n * sizeof(procs[0]));
        }
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n && !list)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (uint32_t k = 0; k < n; k++) {
        unsigned char *e = list + k * (head + SMI_PROCESS_NAME);
        struct smi_process_head h = {
            .pid = procs[k].pid,
            .used_memory = procs[k].used_memory,
            .gpu_instance_id = 0xFFFFFFFFu,
            .compute_instance_id = 0xFFFFFFFFu,
        };
        memcpy(e, &h, head);
        process_name(procs[k].pid, (char *)e + head, SMI_PROCESS_NAME);
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t entry_procs_compute_525(nvmlDevice_t d, unsigned int *count, unsigned char *list)
{
    return process_list(d, count, list, SMI_HEAD_525, 1);
}

static nvmlReturn_t entry_procs_compute_535(nvmlDevice_t d, unsigned int *count, unsigned char *list)
{
    return process_list(d, count, list, SMI_HEAD_535, 1);
}

/* Graphics and MPS lists: a simulated node runs neither (docs/cuda.md); the element size does
   not matter for an empty list. */
static nvmlReturn_t entry_procs_none(nvmlDevice_t d, unsigned int *count, unsigned char *list)
{
    return process_list(d, count, list, SMI_HEAD_535, 0);
}

/* ---- the tables ----------------------------------------------------------------------- */

/* The table's size in the real library of each branch Debian ships; entries are only ever
   appended, so the identified ones keep their offsets across these branches (traced on
   470.256.02, 525.147.05, 535.261.03 and 550.163.01). */
static const struct { unsigned branch; uintptr_t size; void *procs_compute; } BRANCH_SIZES[] = {
    {470, 0x6a8, NULL}, /* ends before the process lists: 470 uses the public ones */
    {525, 0x770, (void *)entry_procs_compute_525},
    {535, 0x7a8, (void *)entry_procs_compute_535},
    {550, 0x7d8, (void *)entry_procs_compute_535},
};
#define MAX_WORDS (0x7d8 / 8)

#define U(f) ((uintptr_t)(void *)(f))

/* One table per branch: the same entries, its own size word. Filled on first use (function
   addresses are not constants the compiler may put in a static initializer of uintptr_t). */
static uintptr_t g_tables[sizeof(BRANCH_SIZES) / sizeof(BRANCH_SIZES[0])][MAX_WORDS];
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void)
{
    for (size_t t = 0; t < sizeof(BRANCH_SIZES) / sizeof(BRANCH_SIZES[0]); t++) {
        uintptr_t *w = g_tables[t];
        for (unsigned k = 1; k < MAX_WORDS; k++)
            w[k] = U(entry_unsupported);
        w[E_IS_PRIMARY] = U(entry_is_primary);
        w[E_TOPO_PATH] = U(entry_topo_path);
        w[E_MONITOR_SUPPORTED] = U(entry_monitor_supported);
        w[E_HANDLE_BY_INDEX] = U(entry_handle_by_index);
        w[E_ENFORCED_POWER] = U(entry_enforced_power);
        if (BRANCH_SIZES[t].procs_compute)
            w[E_PROCS_COMPUTE] = U(BRANCH_SIZES[t].procs_compute);
        w[E_PROCS_GRAPHICS] = U(entry_procs_none);
        w[E_PROCS_MPS] = U(entry_procs_none);
        __atomic_store_n(&w[0], BRANCH_SIZES[t].size, __ATOMIC_RELEASE);
    }
}

/* The major number of the node's driver version ("535.261.03" -> 535); 0 if none. */
static unsigned driver_branch(const struct mokka_state *s)
{
    char v[sizeof(s->driver_version)];
    snap(s, s->driver_version, v, sizeof(v));
    v[sizeof(v) - 1] = '\0';
    return (unsigned)strtoul(v, NULL, 10);
}

nvmlReturn_t DECLDIR nvmlInternalGetExportTable(const void **table, const unsigned char *id);

nvmlReturn_t DECLDIR nvmlInternalGetExportTable(const void **table, const unsigned char *id)
{
    if (!table || !id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memcmp(id, SMI_TABLE_ID, sizeof(SMI_TABLE_ID)) != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const struct mokka_state *s = state();
    if (!initialized() || !s)
        return NVML_ERROR_UNINITIALIZED;
    unsigned branch = driver_branch(s);
    for (size_t t = 0; t < sizeof(BRANCH_SIZES) / sizeof(BRANCH_SIZES[0]); t++) {
        if (BRANCH_SIZES[t].branch == branch) {
            pthread_once(&g_tables_once, fill_tables);
            *table = g_tables[t];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_SUPPORTED;
}
