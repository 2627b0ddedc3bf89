/* nvidia-smi's MIG: the layout the shared state publishes, in every listing (-L, the default
   table, -q, -q -x), and the MIG commands (-mig 0|1, `nvidia-smi mig`), sent to the daemon. */
#include "smi.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- MIG, as the shared state publishes it (docs/mig.md) -------------------------------- */

/* One GPU's MIG facts: the one client's snapshot (mokka_read_mig), with the GPU's processes for
   the GI/CI columns. Our NVML's MIG calls are not what this tool reads: like the lost GPU's bus
   id, the layout comes from the state the model computed, so every name, id, UUID and share is
   the model's own (nothing re-derived here). */

/* The board's tables (node-wide), filled by mig_read. */
static struct mokka_mig_profile g_mig_profiles[MOKKA_MAX_MIG_PROFILES];
static unsigned g_mig_profile_count;

int mig_read(unsigned index, struct mokka_mig_snapshot *v)
{
    memset(v, 0, sizeof(*v));
    unsigned node;
    const struct mokka_state *s = state_of(index, &node);
    if (!s)
        return -1;
    mokka_read_mig(s, node, v, MOKKA_MIG_WITH_PROCESSES);
    mokka_view_filter_mig(&g_view, v); /* the MIG devices this process can open */
    g_mig_profile_count = mokka_mig_profile_count(s);
    for (unsigned k = 0; k < g_mig_profile_count; k++)
        mokka_read_mig_profile(s, k, &g_mig_profiles[k]);
    return 0;
}

/* Is MIG the current mode of GPU `index`? (What turns utilization into N/A, as on real boards.) */
int mig_enabled(unsigned index)
{
    unsigned node;
    const struct mokka_state *s = state_of(index, &node);
    uint32_t capable = 0, mode = 0;
    if (!s)
        return 0;
    MOKKA_CONSISTENT(s) {
        capable = s->gpus[node].mig_capable;
        mode = s->gpus[node].mig_mode;
    }
    return capable && mode;
}

/* Does -q print section `tag` of GPU `index` as one "N/A" line? `Remapped Rows` of a GPU in MIG
   mode, from 580 (a real H100 at 590 and H200 at 580, 590 and 610; what older branches print
   there is not known, and NVIDIA's 470-550 binaries print what our NVML answers). */
int mig_section_na(unsigned index, const char *tag)
{
    return g_branch >= 580 && !strcmp(tag, "Remapped Rows") && mig_enabled(index);
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
int mig_of_pid(const struct mokka_mig_snapshot *v, unsigned pid, unsigned *gi, unsigned *ci)
{
    for (unsigned k = 0; k < v->proc_count; k++)
        if (v->procs[k].pid == pid && v->procs[k].mig_gi != MOKKA_NO_MIG) {
            *gi = v->procs[k].mig_gi;
            *ci = v->procs[k].mig_ci;
            return 1;
        }
    return 0;
}

/* ---- MIG devices in the listings (-L, the default table, -q, -q -x) ----------------------- */

/* BAR1 of a GPU instance, as the model computed it (model/mig.py bar1_bytes). */
static unsigned long long mig_bar1_mib(const struct mokka_mig_snapshot *v, const struct mokka_mig_gi *g)
{
    (void)v;
    return g->bar1_total >> 20;
}

/* "  MIG 3g.40gb     Device  0: (UUID: MIG-...)" under each GPU of -L. */
void mig_list(unsigned index)
{
    struct mokka_mig_snapshot v;
    if (mig_read(index, &v) != 0 || !v.capable || !v.mode)
        return;
    for (unsigned m = 0; m < v.dev_count; m++)
        printf("  MIG %-12sDevice %2u: (UUID: %s)\n", v.dev[m].profile_name, m, v.dev[m].uuid);
}

/* Is a selected GPU in MIG mode (the default table then has a "MIG devices:" table)? */
int mig_table_any(void)
{
    int any = 0;
    for (unsigned i = 0; i < g_ndevs; i++)
        any |= g_devs[i].err == NVML_SUCCESS && mig_enabled(g_devs[i].index);
    return any;
}

/* A cell of `cell` columns: a value that overflows takes its room from the padding (the spaces
   after it, then those before it, one space left at each end), so the frame never moves. */
static void mig_fit_cell(char *s, int cell)
{
    size_t n = strlen(s);
    while ((int)n > cell && n >= 2 && s[n - 1] == ' ' && s[n - 2] == ' ')
        s[--n] = '\0';
    while ((int)n > cell && n >= 2 && s[0] == ' ' && s[1] == ' ') {
        memmove(s, s + 1, n);
        n--;
    }
}

/* The default table's "MIG devices:" table, when a selected GPU is in MIG mode; 0 when none is;
   `rule`: the branch's frame rule (its width). Layouts: the user guide's 580.65.06 H100 table
   ("Shared Memory-Usage"), a 570.148.08 one before 580, and the records of NVIDIA's 470, 525,
   535 and 550 binaries (tests/fixtures/nvidia-smi-branches/<b>/mig/table.txt): the memory cell is
   22 wide up to 525, 32 in 535, 34 from 550. Before 580 compute instances of one GPU instance
   share its memory cells, as the user guide shows; from 580 ("Shared" memory) each compute
   instance's row repeats them under a full rule (a real H200 at 590 with a 1c and a 2c in GPU
   instance 2). A value too wide for its cell (a 7g.141gb's 143360MiB) takes the padding's room,
   so the frame holds on every board. */
int mig_table(const char *rule)
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
            int per_row = g_branch >= 580; /* every compute instance's row has the cells */
            int first = per_row || m == 0 || v.dev[m - 1].gi_id != dv->gi_id; /* first of its GPU instance */
            int last = per_row || m + 1 == v.dev_count || v.dev[m + 1].gi_id != dv->gi_id;
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
            mig_fit_cell(mem, cell);
            mig_fit_cell(bar1, cell);
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

/* -q's "MIG Device" blocks, after "MIG Mode" (labels of real 580, 590 and 610 -q's). */

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

void mig_query_text(unsigned index)
{
    struct mokka_mig_snapshot v;
    if (mig_read(index, &v) != 0 || !v.capable || !v.mode)
        return;
    /* "Shared" from 590 (real 590 and 610 -q); a real 580.173.02 -q says "FB Memory Usage" and
       "BAR1 Memory", as 470-550 (their records) do; 555-565 are assumed so, 570-575 unverified */
    const char *fb = g_branch >= 590 ? "Shared FB Memory Usage" : "FB Memory Usage";
    const char *bar = g_branch >= 590 ? "Shared BAR1 Memory" : g_branch >= 580 ? "BAR1 Memory"
                    : g_branch >= 570 ? "BAR1 Memory Usage" : "BAR1 Memory";
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
        { /* 470-550 (their records) and 580, 590, 610 (real -q) all print it */
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
void mig_query_xml(unsigned index, int depth)
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
int cmd_mig_mode(unsigned enable)
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
        snprintf(line, sizeof(line), "gpu=%u mig %s", node_of(d->index), verb);
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
            snprintf(line, sizeof(line), "gpu=%u mig %s %s", node_of(d->index), c->default_ci ? "create" : "create_gi", word);
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
                snprintf(line, sizeof(line), "gpu=%u mig create_ci %u %s", node_of(d->index), gis[k], word);
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
            snprintf(line, sizeof(line), "gpu=%u mig destroy_gi %u", node_of(d->index), g->id);
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
            snprintf(line, sizeof(line), "gpu=%u mig destroy_ci %u %u", node_of(d->index), g->id, dv->ci_id);
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

int cmd_mig(const struct mig_cmd *c)
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
int mig_parse(int argc, char **argv, struct mig_cmd *c, const char **ids)
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
