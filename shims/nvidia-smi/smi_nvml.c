/* nvidia-smi: NVML resolved at run time, the devices -i selects, their processes, and the shared
   state for what NVML has no call for. */
#include "smi.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFINE(f) __typeof__(f) *p_##f;
NVML_FUNCS(DEFINE)
#undef DEFINE

static void *g_lib;

struct dev g_devs[MOKKA_MAX_GPUS];
unsigned g_ndevs;

int load_nvml(void)
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

const char *nvml_error(nvmlReturn_t r)
{
    const char *s = p_nvmlErrorString ? p_nvmlErrorString(r) : NULL;
    return s ? s : "Unknown Error";
}

/* ---- devices -------------------------------------------------------------------------- */

/* What this process sees of the node (mokka_view.h): the same rule, over the same /dev, as the
   NVML it loaded applies, so NVML index i is the node's GPU g_view.gpu[i] here too. */
struct mokka_view g_view;
static int g_view_decided;

/* The shared state the daemon publishes, for what NVML has no call for (a lost GPU's bus id,
   which the real tool learns from the kernel; the GPU part number, which it reads from the
   board). NULL if there is none, NVML index `index` is not in it, or its records are torn (a
   writer died mid-publish); *node is then, where known, the node's index of that GPU (what the
   state's records and the daemon's commands are indexed by). */
const struct mokka_state *state_of(unsigned index, unsigned *node)
{
    const struct mokka_state *s = mokka_state();
    if (!s && mokka_open() == MOKKA_OK)
        s = mokka_state();
    if (!s)
        return NULL;
    if (!g_view_decided) {
        mokka_view_decide(s, &g_view);
        g_view_decided = 1;
    }
    int i = mokka_view_node(&g_view, index, mokka_gpu_count(s));
    if (i < 0)
        return NULL;
    *node = (unsigned)i;
    /* A writer that died mid-publish left the records half-written: nothing is read from them
       (after the one bounded wait, as libnvml's prologue, whose getters then answer UNKNOWN). */
    return mokka_settled(s) ? s : NULL;
}

unsigned node_of(unsigned index)
{
    unsigned node = index;
    (void)state_of(index, &node);
    return node;
}

/* One identity string of GPU `index` from the state; 0 if the state has none. */
int state_string(unsigned index, size_t offset, size_t len, char *out, size_t n)
{
    unsigned node;
    const struct mokka_state *s = state_of(index, &node);
    char buf[96];
    if (!s)
        return 0;
    mokka_read_string(s, (const char *)&s->gpus[node] + offset, len, buf, sizeof(buf));
    if (!buf[0])
        return 0;
    snprintf(out, n, "%s", buf);
    return 1;
}

void lost_bus_id(unsigned index, char *out, size_t n)
{
    if (!STATE_STRING(index, bus_id_legacy, out, n))
        snprintf(out, n, "%u", index);
}

/* "Unable to determine the device handle for GPU0000:18:00.0: GPU is lost.  Reboot the system
   to recover this GPU" -- the driver's own wording for each failing handle. */
void print_handle_error(const struct dev *d)
{
    char bus[32];
    lost_bus_id(d->index, bus, sizeof(bus));
    if (d->err == NVML_ERROR_GPU_IS_LOST)
        printf("Unable to determine the device handle for GPU%s: GPU is lost.  Reboot the system to recover this GPU\n", bus);
    else
        printf("Unable to determine the device handle for GPU%s: %s\n", bus, nvml_error(d->err));
}

/* -i: indices, UUIDs or bus ids, comma-separated. 0 on success, else an exit code. */
int select_devices(const char *ids)
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
        unsigned node;
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
                } else if (is_bus && state_of(i, &node) && mokka_bus_id_is(state_of(i, &node), node, &bus)) {
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

int check_handles(int abort_all)
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

/* ---- processes ------------------------------------------------------------------------ */

unsigned get_procs(const struct dev *d, struct proc *out, unsigned cap)
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
void proc_name(unsigned pid, char *out, size_t n)
{
    if (NV(nvmlSystemGetProcessName, pid, out, (unsigned)n) != NVML_SUCCESS)
        snprintf(out, n, "N/A");
}
