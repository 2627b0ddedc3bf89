/* nvidia-smi's topo -m, nvlink, dmon and pmon. */
#include "smi.h"

#include <errno.h>
#include <string.h>
#include <time.h>

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

int cmd_topo(void)
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

int cmd_nvlink(char mode)
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
        if (mig_enabled(d->index)) { /* a real H100 in MIG mode at 590 (docs/nvidia-smi.md, "MIG") */
            printf("Nvlink queries are not supported for Devices in MIG mode\n");
            continue;
        }
        unsigned links = 0;
        for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
            nvmlEnableState_t st;
            nvmlReturn_t r = NV(nvmlDeviceGetNvLinkState, d->h, l, &st);
            if (r == NVML_ERROR_INVALID_ARGUMENT || r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_FUNCTION_NOT_FOUND)
                break;
            links++;
            unsigned ver = 0;
            NV(nvmlDeviceGetNvLinkVersion, d->h, l, &ver);
            if (mode == 's') {
                printf("\t Link %u: %s\n", l, r == NVML_SUCCESS && st == NVML_FEATURE_ENABLED ? link_speed(ver) : "<inactive>");
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

volatile sig_atomic_t g_stop;
void on_signal(int sig) { (void)sig; g_stop = 1; }

void sleep_ms(long ms)
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

int cmd_dmon(long count, long delay_s)
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

int cmd_pmon(long count, long delay_s)
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
