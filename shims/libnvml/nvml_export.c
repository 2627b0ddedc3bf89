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
#include "mokka_control.h"

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
    E_ARCHITECTURE = 65,      /* 0x208, 470 and 525 (`-r`) */
    E_PROCESS_UTIL = 145,     /* 0x488 */
    E_RESET = 168,            /* 0x540 */
    E_FABRIC_STATE = 169,     /* 0x548 */
    E_RESET_GROUP = 182,      /* 0x5b0 */
    E_RESET_GROUP_MEMBERS = 183, /* 0x5b8 */
    E_RESET_GROUP_DONE = 184, /* 0x5c0 */
    E_TOPO_PATH = 23,         /* 0x0b8 */
    E_MONITOR_SUPPORTED = 72, /* 0x240 */
    E_HANDLE_BY_INDEX = 81,   /* 0x288 */
    E_ENFORCED_POWER = 108,   /* 0x360 */
    E_PROCS_COMPUTE = 213,    /* 0x6a8, 525 and later */
    E_PROCS_GRAPHICS = 214,   /* 0x6b0 */
    E_PROCS_MPS = 215,        /* 0x6b8 */
    E_GPU_PART_NUMBER = 231,  /* 0x738, 525 and later */
    E_ADDRESSING_MODE = 242,  /* 0x790, 535 and 550 */
    E_VOLTAGE = 209,          /* 0x688, 470 to 550 */
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

/* ---- -r: a GPU reset (traced on every Debian branch: docs/nvml.md) ------------------------- */

/* (device, unsigned *arch): 470 and 525 ask it before a reset ("Cannot detect chip architecture"
   without it); the public getter's answer. */
static nvmlReturn_t entry_architecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    return nvmlDeviceGetArchitecture(device, arch);
}

/* (unsigned *state): the NVSwitch fabric's state, asked first ("fabric state could not be
   determined"); 1 takes the tool through its NVLink-group checks (entries 32 and 197), which
   are not identified. 0: the reset goes ahead GPU by GPU. */
static nvmlReturn_t entry_fabric_state(unsigned int *state)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    ARG(state);
    *state = 0;
    return NVML_SUCCESS;
}

/* 182 (group *, nvmlDevice_t *devices, unsigned count, ...), 183 and 184: the group of devices to
   reset together ("failed to allocate group of reset devices", "Failed to get group of reset
   devices"). Each GPU of a simulated node resets alone (the node's `reset` takes one GPU): the
   group is the devices the tool asked for, which it already holds, so nothing is written. */
static nvmlReturn_t entry_reset_group(void)
{
    return initialized() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* The GPU's index of a handle, or -1. */
static int handle_gpu(nvmlDevice_t device)
{
    unsigned int gpu, mig;
    return handle_resolve(device, &gpu, &mig) == HANDLE_GPU && gpu < gpu_count(state()) ? (int)gpu : -1;
}

/* (unsigned count, nvmlDevice_t *devices, nvmlReturn_t *results, ...): the reset of the devices,
   together, through the node's `reset idle GPU,GPU,...` command (the controller, as our own
   nvidia-smi -r sends it), each one's result in results[k]. The node refuses the whole set while
   a process is on any of them (the one check, the model's: Node.validate), as the driver refuses
   while a client holds a GPU: nothing is reset, the busy GPUs answer IN_USE, the others SUCCESS,
   and the call UNKNOWN. That is what NVIDIA's nvidia-smi (470-550, tried) turns into the driver's
   "The following GPUs could not be reset: ... In use by another client ... N device(s) ...
   currently being used", exit 255; an IN_USE from the call itself would print "GPU reset
   unavailable". A handle that names no GPU answers INVALID_ARGUMENT and is not sent. */
static nvmlReturn_t entry_reset(unsigned int count, nvmlDevice_t *devices, nvmlReturn_t *results)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (count && !devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (count > MOKKA_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_state *s = state();
    char line[32 + 3 * MOKKA_MAX_GPUS] = "node reset idle ";
    size_t len = strlen(line);
    int gpu_of[MOKKA_MAX_GPUS], named[MOKKA_MAX_GPUS] = {0}, sent = 0;
    nvmlReturn_t first = NVML_SUCCESS;
    for (unsigned int k = 0; k < count; k++) {
        int i = gpu_of[k] = handle_gpu(devices[k]);
        if (i < 0) {
            first = NVML_ERROR_INVALID_ARGUMENT;
            continue;
        }
        if (named[i]++)
            continue; /* the node resets a GPU once, however often it is asked */
        len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%d", sent++ ? "," : "", i);
    }
    nvmlReturn_t r = sent ? control_status(mokka_control(line, NULL, 0)) : NVML_SUCCESS;
    unsigned int busy = 0;
    if (r == NVML_ERROR_IN_USE)
        for (unsigned int k = 0; k < count; k++) {
            uint32_t procs = 0;
            if (gpu_of[k] >= 0)
                SNAP(s, s->gpus[gpu_of[k]].process_count, procs);
            busy += procs != 0;
        }
    for (unsigned int k = 0; k < count && results; k++) {
        if (gpu_of[k] < 0)
            results[k] = NVML_ERROR_INVALID_ARGUMENT;
        else if (r != NVML_ERROR_IN_USE)
            results[k] = r;
        else { /* the busy ones; if the process left since the node refused, every one */
            uint32_t procs = 0;
            SNAP(s, s->gpus[gpu_of[k]].process_count, procs);
            results[k] = procs || !busy ? NVML_ERROR_IN_USE : NVML_SUCCESS;
        }
    }
    if (r == NVML_ERROR_IN_USE)
        return NVML_ERROR_UNKNOWN;
    return r != NVML_SUCCESS ? r : first;
}

/* ---- pmon: per-process utilization ------------------------------------------------------- */

/* (device, unsigned long long lastSeen, unsigned *, unsigned *count, element *list): `pmon`'s
   sm, mem, enc, dec (and from 550 jpg, ofa) columns. *count is the list's capacity in (100) and
   the number of samples out. An element is an 8-byte head, then one 0x50-byte block per engine,
   each with the percentage at +0 and the pid at +8 (0xFFFFFFFF: no sample): 4 blocks (0x148
   bytes) up to 535, 6 (0x1e8) in 550, the strides of the binaries' loops. The samples are
   nvmlDeviceGetProcessUtilization's (each process the GPU's utilization, while it is busy);
   none: NOT_FOUND, which the tool shows as `-`. */
#define UTIL_BLOCK 0x50
static nvmlReturn_t process_util(nvmlDevice_t device, unsigned int *count, unsigned char *list, unsigned engines)
{
    ARG(count);
    nvmlProcessUtilizationSample_t samples[MOKKA_MAX_GPU_PROCS];
    unsigned int n = MOKKA_MAX_GPU_PROCS;
    nvmlReturn_t r = nvmlDeviceGetProcessUtilization(device, samples, &n, 0);
    if (r != NVML_SUCCESS) {
        *count = 0;
        return r;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    ARG(list);
    size_t stride = 8 + (size_t)engines * UTIL_BLOCK;
    for (unsigned int k = 0; k < n; k++) {
        unsigned char *e = list + k * stride;
        memset(e, 0, stride);
        const unsigned int util[6] = {samples[k].smUtil, samples[k].memUtil, samples[k].encUtil, samples[k].decUtil, 0, 0};
        for (unsigned b = 0; b < engines; b++) {
            memcpy(e + 8 + b * UTIL_BLOCK, &util[b], 4);
            memcpy(e + 8 + b * UTIL_BLOCK + 8, &samples[k].pid, 4);
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t entry_process_util_4(nvmlDevice_t d, unsigned long long last, unsigned *x, unsigned *count,
                                         unsigned char *list)
{
    (void)last;
    (void)x;
    return process_util(d, count, list, 4);
}

static nvmlReturn_t entry_process_util_6(nvmlDevice_t d, unsigned long long last, unsigned *x, unsigned *count,
                                         unsigned char *list)
{
    (void)last;
    (void)x;
    return process_util(d, count, list, 6);
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

/* (device, char *buf, unsigned length): -q's "GPU Part Number" (the tool passes 0x50 bytes). */
static nvmlReturn_t entry_gpu_part_number(nvmlDevice_t device, char *buf, unsigned int length)
{
    DEV_STATIC(device);
    return STRING(g->gpu_part_number, buf, length);
}

/* (device, unsigned *microvolts, unsigned 1): -q's "Voltage/Graphics", printed as microvolts /
   1000 with three decimals (values written and read off the output: 706250 prints 706.250 mV);
   the third argument is 1 on every call seen. The board's voltage the daemon publishes
   (mokka_state.h voltage_uv); none: NOT_SUPPORTED, which the tool prints N/A. */
static nvmlReturn_t entry_voltage(nvmlDevice_t device, unsigned int *microvolts)
{
    DEV(device);
    ARG(microvolts);
    uint32_t uv;
    SNAP(s, g->voltage_uv, uv);
    if (!uv)
        return NVML_ERROR_NOT_SUPPORTED;
    *microvolts = uv;
    return NVML_SUCCESS;
}

/* (device, unsigned *enabled): -q's "Sparse Operation Mode", entry 243 in 535 and 249 in 550 (0
   prints Disabled, any other value Enabled: tried one by one). The board's mode the daemon
   publishes (sparse_operation_mode); none: NOT_SUPPORTED, which the tool prints N/A. */
static nvmlReturn_t entry_sparse_mode(nvmlDevice_t device, unsigned int *enabled)
{
    DEV(device);
    ARG(enabled);
    char mode[sizeof(g->sparse_operation_mode)];
    snap(s, g->sparse_operation_mode, mode, sizeof(mode));
    mode[sizeof(mode) - 1] = '\0';
    if (!mode[0])
        return NVML_ERROR_NOT_SUPPORTED;
    *enabled = strcmp(mode, "Disabled") != 0;
    return NVML_SUCCESS;
}

/* (device, int *degrees): -q's "GPU T.Limit Temp", the margin below T.Limit; the public
   nvmlDeviceGetMarginTemperature's answer (NOT_SUPPORTED before Hopper). */
/* (device, unsigned *mode): `-q`'s "Addressing Mode" in 535 and 550 (0 None, 1 HMM, 2 ATS: the
   value written printed as such, tried one by one): nvmlDeviceGetAddressingMode's answer, None
   below 570 as every real capture of those branches prints it. */
static nvmlReturn_t entry_addressing_mode(nvmlDevice_t device, unsigned int *mode)
{
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDeviceAddressingMode_t am = {.version = nvmlDeviceAddressingMode_v1};
    nvmlReturn_t r = nvmlDeviceGetAddressingMode(device, &am);
    if (r == NVML_SUCCESS)
        *mode = am.value;
    return r;
}

static nvmlReturn_t entry_tlimit_margin(nvmlDevice_t device, int *degrees)
{
    ARG(degrees);
    nvmlMarginTemperature_t m = {.version = nvmlMarginTemperature_v1};
    nvmlReturn_t r = nvmlDeviceGetMarginTemperature(device, &m);
    if (r == NVML_SUCCESS)
        *degrees = m.marginTemperature;
    return r;
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

/* ---- topo -m's path between two PCI functions ------------------------------------------- */

/* nvmlGpuTopologyLevel_t as topo -m's path code: 0 PIX, 1 PXB, 2 PHB, 3 NODE, 4 SYS. */
static unsigned level_path(unsigned level)
{
    switch (level) {
    case NVML_TOPOLOGY_INTERNAL:
    case NVML_TOPOLOGY_SINGLE: return 0;
    case NVML_TOPOLOGY_MULTIPLE: return 1;
    case NVML_TOPOLOGY_HOSTBRIDGE: return 2;
    case NVML_TOPOLOGY_NODE: return 3;
    default: return 4;
    }
}

/* A function's place in the PCI tree as sysfs shows it (under `mokka run`, the mirror of the
   model's tree): the components of its /sys/devices path, host bridge first
   ("pci0000:15", "0000:15:01.0", ..., the function itself). */
#define MAX_DEPTH 16
struct pci_chain {
    char path[512];
    const char *comp[MAX_DEPTH];
    int n;
};

static int pci_chain(const struct mokka_bus_id *id, struct pci_chain *c)
{
    char link[96];
    snprintf(link, sizeof(link), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", id->domain & 0xFFFF, id->bus, id->device,
             id->function);
    int saved = errno;
    char *real = realpath(link, NULL);
    errno = saved;
    if (!real)
        return -1;
    const char *under = strstr(real, "/devices/");
    int ok = under && strlen(under) < sizeof(c->path);
    if (ok)
        snprintf(c->path, sizeof(c->path), "%s", under + strlen("/devices/"));
    free(real);
    if (!ok)
        return -1;
    c->n = 0;
    for (char *p = c->path; *p && c->n < MAX_DEPTH;) {
        c->comp[c->n++] = p;
        char *slash = strchr(p, '/');
        if (!slash)
            break;
        *slash = '\0';
        p = slash + 1;
    }
    return c->n >= 2 ? 0 : -1;
}

/* Read a small sysfs attribute of component k of c (the function whose chain ends there). */
static ssize_t sysfs_read(const struct pci_chain *c, int k, const char *attr, void *buf, size_t n)
{
    char path[640] = "/sys/devices";
    size_t o = strlen(path);
    for (int i = 0; i <= k + 1; i++) {
        const char *part = i <= k ? c->comp[i] : attr;
        size_t len = strlen(part);
        if (o + 1 + len + 1 > sizeof(path))
            return -1;
        path[o++] = '/';
        memcpy(path + o, part, len + 1);
        o += len;
    }
    int saved = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, n) : -1;
    if (fd >= 0)
        close(fd);
    errno = saved;
    return got;
}

/* Is component k a PCIe switch's upstream port? Its PCI Express capability says so (device/port
   type 5), as the model's tree marks its switch_up ports. */
static int is_switch_upstream(const struct pci_chain *c, int k)
{
    unsigned char cfg[256];
    if (sysfs_read(c, k, "config", cfg, sizeof(cfg)) < (ssize_t)sizeof(cfg))
        return 0;
    unsigned cap = cfg[0x34] & 0xFC;
    for (int hops = 0; cap >= 0x40 && cap < 0xFF && hops < 48; hops++) {
        if (cfg[cap] == 0x10) /* PCI Express */
            return (cfg[cap + 2] >> 4 & 0xF) == 0x5;
        cap = cfg[cap + 1] & 0xFC;
    }
    return 0;
}

static int numa_of(const struct pci_chain *c)
{
    char buf[16] = {0};
    return sysfs_read(c, c->n - 1, "numa_node", buf, sizeof(buf) - 1) > 0 ? atoi(buf) : -1;
}

/* The level of two functions from their sysfs chains, by the model's rule (topology_level in
   mokkafs/model/topology.py): a common bridge below the host bridge is SINGLE when it is a
   switch's upstream port, else MULTIPLE; else the same host bridge, NUMA node, or neither. */
static unsigned sysfs_level(const struct pci_chain *a, const struct pci_chain *b)
{
    if (strcmp(a->comp[0], b->comp[0]) != 0)
        return numa_of(a) == numa_of(b) ? NVML_TOPOLOGY_NODE : NVML_TOPOLOGY_SYSTEM;
    int common = 0; /* bridges both paths cross, host bridge excluded, endpoints excluded */
    for (int i = 1; i < a->n - 1 && i < b->n - 1 && strcmp(a->comp[i], b->comp[i]) == 0; i++)
        common = i;
    if (!common)
        return NVML_TOPOLOGY_HOSTBRIDGE;
    return is_switch_upstream(a, common) ? NVML_TOPOLOGY_SINGLE : NVML_TOPOLOGY_MULTIPLE;
}

/* A bus id the tool passes: NUL-terminated within NVML's 32-byte buffer size, read no further. */
static int parse_bus_id(const char *bus_id, struct mokka_bus_id *id)
{
    char text[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    size_t n = 0;
    while (n < sizeof(text) - 1 && bus_id[n])
        n++;
    memcpy(text, bus_id, n);
    text[n] = '\0';
    return mokka_parse_bus_id(text, id);
}

static int gpu_of(const struct mokka_state *s, const struct mokka_bus_id *id)
{
    for (unsigned i = 0; i < gpu_count(s); i++)
        if (mokka_bus_id_is(s, i, id))
            return (int)i;
    return -1;
}

/* (const char *busId1, const char *busId2, unsigned *path): the cell of `topo -m` for two PCI
   functions: 0 PIX, 1 PXB, 2 PHB, 3 NODE, 4 SYS, and 4 + n for n bonded NVLinks (NVn), read off
   the tool's output for each value. Two GPUs of the node: NVLinks, else the level the model
   computed (the state's). A NIC the tool found in sysfs (under `mokka run`, the mirror of the
   model's tree): the level of the two sysfs paths, by the model's rule. Neither: NOT_FOUND. */
static nvmlReturn_t entry_topo_path(const char *bus1, const char *bus2, unsigned int *path)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!bus1 || !bus2 || !path)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct mokka_state *s = state();
    struct mokka_bus_id id1, id2;
    if (parse_bus_id(bus1, &id1) != 0 || parse_bus_id(bus2, &id2) != 0)
        return NVML_ERROR_NOT_FOUND;
    int i = gpu_of(s, &id1), j = gpu_of(s, &id2);
    if (i >= 0 && j >= 0) {
        struct mokka_gpu a, b;
        mokka_read_gpu(s, (unsigned)i, &a);
        mokka_read_gpu(s, (unsigned)j, &b);
        unsigned links = i == j ? 0 : nvlinks_between(&a, &b);
        *path = links ? 4 + links : level_path(a.topo_level[j]);
        return NVML_SUCCESS;
    }
    struct pci_chain ca, cb;
    if (pci_chain(&id1, &ca) != 0 || pci_chain(&id2, &cb) != 0)
        return NVML_ERROR_NOT_FOUND;
    *path = level_path(sysfs_level(&ca, &cb));
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

/* (device, unsigned *count, element *list): *count is the list's capacity in and the number
   of processes out; a list too short gets INSUFFICIENT_SIZE and the number needed, as the
   public process lists answer. head is the size of an element's numbers (the branch's). */
static nvmlReturn_t process_list(nvmlDevice_t device, unsigned int *count, unsigned char *list, size_t head,
                                 int compute)
{
    /* A MIG device's handle lists the processes on it (the public lists' rule, nvml_procs.c). */
    DEV_FLAGS(device, DEV_MIG_OK);
    ARG(count);
    struct mokka_gpu_process procs[MOKKA_MAX_GPU_PROCS];
    uint32_t n = 0, gi = 0, ci = 0;
    if (compute) {
        MOKKA_CONSISTENT(s) {
            n = g->process_count;
            if (n > MOKKA_MAX_GPU_PROCS)
                n = MOKKA_MAX_GPU_PROCS;
            memcpy(procs, g->processes, n * sizeof(procs[0]));
            if (mig_dev) {
                gi = mig_dev->gi_id;
                ci = mig_dev->ci_id;
            }
        }
    }
    if (mig_dev) {
        uint32_t kept = 0;
        for (uint32_t k = 0; k < n; k++)
            if (procs[k].mig_gi == gi && procs[k].mig_ci == ci)
                procs[kept++] = procs[k];
        n = kept;
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
            /* the instance it runs on; 0xFFFFFFFF on none, as the public lists (nvml.h) */
            .gpu_instance_id = procs[k].mig_gi == MOKKA_NO_MIG ? 0xFFFFFFFFu : procs[k].mig_gi,
            .compute_instance_id = procs[k].mig_ci == MOKKA_NO_MIG ? 0xFFFFFFFFu : procs[k].mig_ci,
        };
        memcpy(e, &h, head);
        /* the name as nvmlSystemGetProcessName gives it (the real library's one reader);
           none (the process is gone): empty */
        char *name = (char *)e + head;
        if (nvml_process_name(procs[k].pid, name, SMI_PROCESS_NAME) != NVML_SUCCESS)
            name[0] = '\0';
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

/* Each branch Debian ships (traced on 470.256.02, 525.147.05, 535.261.03 and 550.163.01): the
   table's size in its real library, and what differs. The entries above keep their index in
   every branch that has them; the tail was not only appended to: 237 is the T.Limit margin in
   525 but the FRU part number in 535 and 550, where the margin moved to 240. */
static const struct {
    unsigned branch;
    uintptr_t size;
    void *procs_compute; /* entry 213's element layout; 470 ends before it (public lists) */
    unsigned tlimit;     /* the T.Limit margin's entry */
    void *process_util;  /* entry 145's element layout (engines per sample) */
    unsigned sparse;     /* the sparse operation mode's entry; 0: the branch prints none */
} BRANCH_SIZES[] = {
    {470, 0x6a8, NULL, 0, (void *)entry_process_util_4, 0},
    {525, 0x770, (void *)entry_procs_compute_525, 237, (void *)entry_process_util_4, 0},
    {535, 0x7a8, (void *)entry_procs_compute_535, 240, (void *)entry_process_util_4, 243},
    {550, 0x7d8, (void *)entry_procs_compute_535, 240, (void *)entry_process_util_6, 249},
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
        w[E_GPU_PART_NUMBER] = U(entry_gpu_part_number);
        w[E_ADDRESSING_MODE] = U(entry_addressing_mode); /* past the end of 470's and 525's tables */
        w[E_ARCHITECTURE] = U(entry_architecture);
        w[E_PROCESS_UTIL] = U(BRANCH_SIZES[t].process_util);
        w[E_RESET] = U(entry_reset);
        w[E_FABRIC_STATE] = U(entry_fabric_state);
        w[E_RESET_GROUP] = U(entry_reset_group);
        w[E_RESET_GROUP_MEMBERS] = U(entry_reset_group);
        w[E_RESET_GROUP_DONE] = U(entry_reset_group);
        if (BRANCH_SIZES[t].tlimit)
            w[BRANCH_SIZES[t].tlimit] = U(entry_tlimit_margin);
        w[E_VOLTAGE] = U(entry_voltage);
        if (BRANCH_SIZES[t].sparse)
            w[BRANCH_SIZES[t].sparse] = U(entry_sparse_mode);
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
