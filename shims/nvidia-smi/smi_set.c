/* nvidia-smi's configuration commands: each through NVML's setter, -r through the daemon. */
#include "smi.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- configuration commands (-pm, -c, -pl, -lgc, -rgc, -ac, -rac, -lmc, -rmc, -e, -p, -am, -caa,
   --auto-boost-default, --gom, -r) ----------------------------------------------------------- */

/* One setting for every selected GPU, in index order, through NVML's setters (which send it to
   the daemon). The first failure ends the run, as the real tool's "Terminating early" does; the
   exit code is the NVML error (4 for NO_PERMISSION, as real captures show). Messages and their
   sources: docs/nvidia-smi.md, "Configuration commands". */

static const char MSG_TERMINATING[] = "Terminating early due to previous errors.\n";
static const char *const COMPUTE_MODE_WORD[] = {"DEFAULT", "EXCLUSIVE_THREAD", "PROHIBITED", "EXCLUSIVE_PROCESS"};

/* 0/1 or DISABLED/ENABLED, any case. */
int parse_enable(const char *v, unsigned *out)
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
   the node's `reset idle GPU,GPU,...` command for every selected GPU at once, through the control
   socket beside the state file the loaded NVML reads (mokka_control.h). The node refuses the
   whole set while a process is on any of them (IN_USE, the one check NVML's reset entry meets
   too): nothing is reset, and the tool names the busy GPUs in the driver's words, exit 255
   (docs/nvidia-smi.md: real runs, and NVIDIA's own binaries on our NVML). */
static int reset_gpus(void)
{
    char line[32 + 4 * 64] = "node reset idle ";
    size_t len = strlen(line);
    for (unsigned i = 0; i < g_ndevs && len < sizeof(line); i++)
        len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%u", i ? "," : "", node_of(g_devs[i].index));
    nvmlReturn_t r = mokka_ctl_nvml_error(mokka_control(line, NULL, 0));
    char bus[32];
    if (r == NVML_ERROR_IN_USE) {
        unsigned busy[64], n = 0;
        for (unsigned i = 0; i < g_ndevs && n < 64; i++) {
            unsigned cnt = 0;
            nvmlReturn_t pr = NV(nvmlDeviceGetComputeRunningProcesses_v3, g_devs[i].h, &cnt, NULL);
            if ((pr == NVML_SUCCESS || pr == NVML_ERROR_INSUFFICIENT_SIZE) && cnt)
                busy[n++] = i;
        }
        if (!n) /* the process left since the node refused: every GPU it was asked for */
            for (unsigned i = 0; i < g_ndevs && n < 64; i++)
                busy[n++] = i;
        printf("The following GPUs could not be reset:\n");
        for (unsigned k = 0; k < n; k++) {
            set_bus_id(&g_devs[busy[k]], bus, sizeof(bus));
            printf("  GPU %s: %s\n", bus, nvml_error(r));
        }
        printf("\n%u %s currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
               "graphics application such as an X server, or a monitoring application such as another instance of "
               "nvidia-smi). Please first kill all processes using %s and all compute applications running in the "
               "system.\n", n, n == 1 ? "device is" : "devices are", n == 1 ? "this device" : "these devices");
        return EXIT_OTHER;
    }
    if (r != NVML_SUCCESS) {
        set_bus_id(&g_devs[0], bus, sizeof(bus));
        printf("Unable to reset GPU %s: %s\n", bus, nvml_error(r));
        return set_failed(r);
    }
    for (unsigned i = 0; i < g_ndevs; i++) {
        set_bus_id(&g_devs[i], bus, sizeof(bus));
        printf("GPU %s was successfully reset.\n", bus);
    }
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
    default:
        return 0;
    }
}

int cmd_set(const struct set_cmd *c)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        if (g_devs[i].err != NVML_SUCCESS) {
            print_handle_error(&g_devs[i]);
            return set_failed(g_devs[i].err);
        }
        if (c->kind == SET_RESET) { /* every selected GPU at once, after each one's handle */
            if (i + 1 < g_ndevs)
                continue;
            int rc = reset_gpus();
            if (rc) {
                fflush(stdout);
                return rc;
            }
            break;
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

/* argv[*i] as a configuration option: 0 if it is none, 1 if it is one (its value parsed into c),
   -1 if its value is missing or does not parse. */
int set_parse(int argc, char **argv, int *i, struct set_cmd *c)
{
    const char *a = argv[*i];
    int k = set_option(a);
    if (k < 0)
        return 0;
    c->kind = SET_OPTIONS[k].kind;
    if (SET_OPTIONS[k].takes_value) {
        const char *v = opt_value(argc, argv, i, SET_OPTIONS[k].longname, SET_OPTIONS[k].shortname);
        if (!v || parse_set_value(v, c))
            return -1;
    } else if (strchr(a, '=')) {
        return -1;
    }
    return 1;
}
