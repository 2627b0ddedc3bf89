/* nvidia-smi's queries: -q and -q -x (the generated skeletons filled with values),
   --query-gpu, --query-compute-apps and --query-accounted-apps (CSV). */
#include "smi.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* --query-gpu / --query-compute-apps ---------------------------------------------------- */

int g_noheader, g_nounits;

int parse_format(const char *f)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", f);
    int csv = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        if (!strcmp(t, "csv"))
            csv = 1;
        else if (!strcmp(t, "noheader"))
            g_noheader = 1;
        else if (!strcmp(t, "nounits"))
            g_nounits = 1;
        else
            return -1; /* "Format modifier is not recognized." */
    }
    return csv ? 0 : -2; /* "Format modifier --format=csv is mandatory." */
}

int parse_gpu_fields(const char *list, struct col *cols, int cap)
{
    char buf[8192];
    snprintf(buf, sizeof(buf), "%s", list);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t l = strlen(t);
        while (l && t[l - 1] == ' ')
            t[--l] = 0;
        const struct qfield *f;
        for (f = g_fields; f->name; f++)
            if (!strcasecmp(t, f->name) || (*f->alias && !strcasecmp(t, f->alias)))
                break;
        if (!f->name) { /* the tool names it from a 64-byte buffer (real 470-550) */
            printf("Field \"%.63s\" is not a valid field to query.\n\n", t);
            return -1;
        }
        if (n >= cap) {
            printf("%s", MSG_INVALID);
            return -1;
        }
        cols[n].spelled = f->name; /* the header names the field by its first name, as asked or not */
        cols[n].key = f->key;
        cols[n].unit = f->unit;
        n++;
    }
    return n;
}

void print_header(const struct col *cols, int n, const char *list)
{
    if (g_noheader)
        return;
    for (int i = 0; i < n; i++) {
        printf("%s%s", i ? ", " : "", cols[i].spelled);
        if (*cols[i].unit) /* nounits drops the cells' units, not the header's (real 470-550) */
            printf(" [%s]", cols[i].unit);
    }
    (void)list;
    printf("\n");
}

static void csv_cell(const struct dev *d, const struct col *c, char *out, size_t n)
{
    char v[256];
    enum vr r = value(d, c->key, v, sizeof(v));
    if (r == V_DEPRECATED)
        snprintf(out, n, "[Requested functionality has been deprecated]");
    else if (r != V_OK && c->key >= 0 && FACTS[c->key].na_plain)
        snprintf(out, n, "N/A");  /* the driver prints these without brackets */
    else if (r != V_OK)
        snprintf(out, n, "[N/A]");
    else if (!g_nounits && *c->unit && strcmp(c->unit, "us"))
        snprintf(out, n, "%s %s", v, c->unit);
    else if (!g_nounits && *c->unit)
        snprintf(out, n, "%s %s", v, c->unit);
    else
        snprintf(out, n, "%s", v);
}

void query_gpu_once(const struct col *cols, int n)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            g_exit = EXIT_LOST;
            continue;
        }
        char line[16384];
        size_t pos = 0;
        line[0] = 0;
        for (int c = 0; c < n; c++) {
            char cell[512];
            csv_cell(d, &cols[c], cell, sizeof(cell));
            int w = snprintf(line + pos, sizeof(line) - pos, "%s%s", c ? ", " : "", cell);
            if (w < 0 || (size_t)w >= sizeof(line) - pos)
                break;
            pos += (size_t)w;
        }
        printf("%s\n", line);
    }
}

struct app_field { const char *name, *alias, *unit; };

static const struct app_field APP_FIELDS[] = {
    {"timestamp", "", ""}, {"gpu_name", "", ""}, {"gpu_bus_id", "", ""}, {"gpu_serial", "", ""},
    {"gpu_uuid", "", ""}, {"pid", "", ""}, {"process_name", "name", ""}, {"used_gpu_memory", "used_memory", "MiB"},
    {0, 0, 0},
};

/* --query-accounted-apps: the records of nvmlDeviceGetAccountingPids/Stats (accounting mode on),
   the fields of every branch's --help-query-accounted-apps (470-595). */
enum { A_TIMESTAMP, A_NAME, A_BUS_ID, A_SERIAL, A_UUID, A_VGPU, A_PID, A_GPU_UTIL, A_MEM_UTIL, A_MAX_MEM, A_TIME };
static const struct app_field ACCT_FIELDS[] = {
    {"timestamp", "", ""}, {"gpu_name", "", ""}, {"gpu_bus_id", "", ""}, {"gpu_serial", "", ""}, {"gpu_uuid", "", ""},
    {"vgpu_instance", "", ""}, {"pid", "", ""}, {"gpu_utilization", "gpu_util", "%"},
    {"mem_utilization", "mem_util", "%"}, {"max_memory_usage", "", "MiB"}, {"time", "", "ms"}, {0, 0, 0},
};

/* --query-retired-pages: the fields of every branch's --help-query-retired-pages (470-595). */
enum { R_TIMESTAMP, R_NAME, R_BUS_ID, R_SERIAL, R_UUID, R_ADDRESS, R_RETIRED_AT, R_CAUSE };
static const struct app_field RETIRED_FIELDS[] = {
    {"timestamp", "", ""}, {"gpu_name", "", ""}, {"gpu_bus_id", "", ""}, {"gpu_serial", "", ""}, {"gpu_uuid", "", ""},
    {"retired_pages.address", "", ""}, {"retired_pages.timestamp", "", ""}, {"retired_pages.cause", "", ""},
    {0, 0, 0},
};

/* --query-supported-clocks: the fields of --help-query-supported-clocks (NVIDIA's 470-550). */
enum { C_MEMORY = 5, C_GRAPHICS };
static const struct app_field CLOCK_FIELDS[] = {
    {"timestamp", "", ""}, {"gpu_name", "", ""}, {"gpu_bus_id", "", ""}, {"gpu_serial", "", ""}, {"gpu_uuid", "", ""},
    {"memory", "mem", "MHz"}, {"graphics", "gr", "MHz"}, {0, 0, 0},
};

static const struct app_field *const LIST_FIELDS[] = {APP_FIELDS, ACCT_FIELDS, RETIRED_FIELDS, CLOCK_FIELDS};

int parse_fields_of(const char *list, int *idx, const char **spelled, int cap, int which)
{
    const struct app_field *T = LIST_FIELDS[which];
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", list);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        int k;
        for (k = 0; T[k].name; k++)
            if (!strcasecmp(t, T[k].name) || (*T[k].alias && !strcasecmp(t, T[k].alias)))
                break;
        if (!T[k].name) {
            printf("Field \"%s\" is not a valid field to query.\n\n", t);
            return -1;
        }
        if (n >= cap)
            return -1;
        idx[n] = k;
        spelled[n] = list + (t - buf);
        n++;
    }
    return n;
}

/* The header of --query-compute-apps / --query-accounted-apps / --query-retired-pages /
   --query-supported-clocks: each field by its first name, with its unit even under nounits, as
   --query-gpu's (NVIDIA's 470-550 binaries). */
void print_apps_header(const int *idx, int n, int which)
{
    if (g_noheader)
        return;
    for (int c = 0; c < n; c++) {
        const struct app_field *f = &LIST_FIELDS[which][idx[c]];
        printf("%s%s", c ? ", " : "", f->name);
        if (*f->unit)
            printf(" [%s]", f->unit);
    }
    printf("\n");
}

/* A GPU's identity cell of a process or page list (timestamp, name, bus id, serial, UUID). */
static void gpu_cell(const struct dev *d, int field, char *v, size_t n)
{
    static const int KEYS[] = {-1, K_name, K_pci_bus_id, K_serial, K_uuid};
    if (field == 0)
        timestamp(v, n, 1);
    else if (value(d, KEYS[field], v, n) != V_OK)
        snprintf(v, n, "[N/A]");
}

void query_apps_once(const int *idx, int n)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS)
            continue;
        struct proc ps[64];
        unsigned np = get_procs(d, ps, 64);
        for (unsigned j = 0; j < np; j++) {
            if (strcmp(ps[j].type, "G") == 0)
                continue;
            for (int c = 0; c < n; c++) {
                char v[256] = "[N/A]";
                switch (idx[c]) {
                case 0: case 1: case 2: case 3: case 4: gpu_cell(d, idx[c], v, sizeof(v)); break;
                case 5: snprintf(v, sizeof(v), "%u", ps[j].pid); break;
                case 6: proc_name(ps[j].pid, v, sizeof(v)); break;
                case 7:
                    if (ps[j].mem != (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
                        snprintf(v, sizeof(v), g_nounits ? "%llu" : "%llu MiB", ps[j].mem >> 20);
                    break;
                }
                printf("%s%s", c ? ", " : "", v);
            }
            printf("\n");
        }
    }
}

void query_accounted_once(const int *idx, int n)
{
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS)
            continue;
        static unsigned pids[MOKKA_ACCOUNTING_RECORDS];
        unsigned np = MOKKA_ACCOUNTING_RECORDS;
        if (NV(nvmlDeviceGetAccountingPids, d->h, &np, pids) != NVML_SUCCESS)
            continue; /* accounting mode off: nothing to list */
        for (unsigned j = 0; j < np; j++) {
            nvmlAccountingStats_t st;
            if (NV(nvmlDeviceGetAccountingStats, d->h, pids[j], &st) != NVML_SUCCESS)
                continue;
            for (int c = 0; c < n; c++) {
                char v[256] = "[N/A]";
                switch (idx[c]) {
                case A_TIMESTAMP: case A_NAME: case A_BUS_ID: case A_SERIAL: case A_UUID:
                    gpu_cell(d, idx[c] - A_TIMESTAMP, v, sizeof(v));
                    break;
                case A_VGPU: break; /* bare metal: no vGPU instance ([N/A], unverified) */
                case A_PID: snprintf(v, sizeof(v), "%u", pids[j]); break;
                case A_GPU_UTIL: snprintf(v, sizeof(v), g_nounits ? "%u" : "%u %%", st.gpuUtilization); break;
                case A_MEM_UTIL: snprintf(v, sizeof(v), g_nounits ? "%u" : "%u %%", st.memoryUtilization); break;
                case A_MAX_MEM: snprintf(v, sizeof(v), g_nounits ? "%llu" : "%llu MiB", st.maxMemoryUsage >> 20); break;
                case A_TIME: snprintf(v, sizeof(v), g_nounits ? "%llu" : "%llu ms", st.time); break;
                }
                printf("%s%s", c ? ", " : "", v);
            }
            printf("\n");
        }
    }
}

/* --query-retired-pages: per GPU, the pages NVML lists for each cause (multiple single-bit
   errors, then double-bit), one row each; a GPU that retires no pages (it remaps rows:
   NOT_SUPPORTED) gets one row per cause with the page's cells [N/A], as the 590 and 595 captures
   and NVIDIA's 470-550 binaries print it. */
void query_retired_once(const int *idx, int n)
{
    static const struct { nvmlPageRetirementCause_t cause; const char *name; } CAUSES[] = {
        {NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "Single Bit ECC"},
        {NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "Double Bit ECC"}};
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS)
            continue;
        for (unsigned k = 0; k < 2; k++) {
            unsigned long long *addr = NULL, *when = NULL;
            unsigned np = 0;
            nvmlReturn_t r = NV(nvmlDeviceGetRetiredPages_v2, d->h, CAUSES[k].cause, &np, NULL, NULL);
            if (r == NVML_ERROR_INSUFFICIENT_SIZE && np <= 1u << 20) {
                addr = calloc(np, sizeof(*addr));
                when = calloc(np, sizeof(*when));
                r = addr && when ? NV(nvmlDeviceGetRetiredPages_v2, d->h, CAUSES[k].cause, &np, addr, when)
                                 : NVML_ERROR_MEMORY;
            }
            int known = r == NVML_SUCCESS;
            if (!known)
                np = 1; /* one row, its page unknown */
            for (unsigned j = 0; j < np; j++) {
                for (int c = 0; c < n; c++) {
                    char v[256] = "[N/A]";
                    switch (idx[c]) {
                    case R_TIMESTAMP: case R_NAME: case R_BUS_ID: case R_SERIAL: case R_UUID:
                        gpu_cell(d, idx[c], v, sizeof(v));
                        break;
                    case R_ADDRESS:
                        if (known)
                            snprintf(v, sizeof(v), "0x%016llx", addr[j]);
                        break;
                    case R_RETIRED_AT:
                        /* Our NVML gives no retirement time (0), which NVIDIA's 470-550 print
                           "(null)"; another is printed as NVML gives it (unverified). */
                        if (known)
                            snprintf(v, sizeof(v), when[j] ? "%llu" : "(null)", when[j]);
                        break;
                    case R_CAUSE: snprintf(v, sizeof(v), "%s", CAUSES[k].name); break;
                    }
                    printf("%s%s", c ? ", " : "", v);
                }
                printf("\n");
            }
            free(addr);
            free(when);
        }
    }
}

struct clock_list { unsigned nmem, mem[8], ngr[8], gr[8][512]; };
static int supported_clocks(const struct dev *d, struct clock_list *c);

/* --query-supported-clocks: per GPU one row per (memory, graphics) pair the board supports,
   memory clocks and graphics clocks highest first; none for a board that lists none (NVIDIA's
   470-550 binaries on our NVML print the same rows). */
void query_clocks_once(const int *idx, int n)
{
    static struct clock_list c;
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS || !supported_clocks(d, &c))
            continue;
        for (unsigned k = 0; k < c.nmem; k++)
            for (unsigned j = 0; j < c.ngr[k]; j++) {
                for (int col = 0; col < n; col++) {
                    char v[256] = "[N/A]";
                    if (idx[col] < C_MEMORY)
                        gpu_cell(d, idx[col], v, sizeof(v));
                    else
                        snprintf(v, sizeof(v), g_nounits ? "%u" : "%u MHz", idx[col] == C_MEMORY ? c.mem[k] : c.gr[k][j]);
                    printf("%s%s", col ? ", " : "", v);
                }
                printf("\n");
            }
    }
}

/* -q / -q -x ------------------------------------------------------------------------------ */

/* The skeletons come from boards that report their thresholds either relative to T.Limit (Ada,
   Hopper and later; the 525-550 records) or absolute (A100, T4; the 470 record). A board of the
   other kind gets its own rows in the same places, as the real tool prints them (real 535 on an
   A100 and on an H100 differ in exactly these four rows, text and XML). */
static const struct skel *threshold_row(const struct skel *s, int tlimit_board, int xml)
{
    static const short KEYS[2][4] = {
        {K_x_temp_shutdown, K_x_temp_slowdown, K_x_temp_max_gpu, K_x_temp_max_mem},
        {K_x_temp_shutdown_tlimit, K_x_temp_slowdown_tlimit, K_x_temp_max_gpu_tlimit, K_x_temp_max_mem_tlimit}};
    static const char *NAMES[2][2][4] = { /* [xml][tlimit] */
        {{"GPU Shutdown Temp", "GPU Slowdown Temp", "GPU Max Operating Temp", "Memory Max Operating Temp"},
         {"GPU Shutdown T.Limit Temp", "GPU Slowdown T.Limit Temp", "GPU Max Operating T.Limit Temp",
          "Memory Max Operating T.Limit Temp"}},
        {{"gpu_temp_max_threshold", "gpu_temp_slow_threshold", "gpu_temp_max_gpu_threshold",
          "gpu_temp_max_mem_threshold"},
         {"gpu_temp_max_tlimit_threshold", "gpu_temp_slow_tlimit_threshold", "gpu_temp_max_gpu_tlimit_threshold",
          "gpu_temp_max_mem_tlimit_threshold"}}};
    static struct skel row;
    for (int i = 0; i < 4; i++)
        if (s->key == KEYS[0][i] || s->key == KEYS[1][i]) {
            row = *s;
            row.key = KEYS[tlimit_board][i];
            row.tag = NAMES[xml][tlimit_board][i];
            return &row;
        }
    return s;
}

/* The -q labels and -q -x elements of each -d section; "... Samples" and "Supported
   GPU_TARGET_TEMP" are the labels only -d prints (records of 470-550). */
struct section { const char *name; const char *text[12]; const char *xml[8]; };

static const struct section SECTIONS[] = {
    {"MEMORY", {"FB Memory Usage", "BAR1 Memory Usage", "Conf Compute Protected Memory Usage"},
     {"fb_memory_usage", "bar1_memory_usage", "cc_protected_memory_usage"}},
    {"UTILIZATION", {"Utilization", "GPU Utilization Samples", "Memory Utilization Samples", "ENC Utilization Samples",
                     "DEC Utilization Samples", "JPG Utilization Samples", "OFA Utilization Samples"}, {"utilization"}},
    {"ECC", {"ECC Mode", "ECC Errors", "Ecc Mode"}, {"ecc_mode", "ecc_errors"}},
    {"TEMPERATURE", {"Temperature"}, {"temperature"}},
    {"POWER", {"GPU Power Readings", "GPU Memory Power Readings ", "Module Power Readings", "GPU Memory Power Readings",
               "Power Readings", "Power Samples"},
     {"gpu_power_readings", "gpu_memory_power_readings", "module_power_readings", "power_readings"}},
    {"CLOCK", {"Clocks", "Applications Clocks", "Default Applications Clocks", "Deferred Clocks", "Max Clocks",
               "Max Customer Boost Clocks", "Clock Policy", "SM Clock Samples", "Memory Clock Samples"},
     {"clocks", "applications_clocks", "default_applications_clocks", "deferred_clocks", "max_clocks",
      "max_customer_boost_clocks", "clock_policy"}},
    {"COMPUTE", {"Compute Mode"}, {"compute_mode"}},
    {"PIDS", {"Processes"}, {"processes"}},
    {"PERFORMANCE", {"Performance State", "Clocks Event Reasons", "Clocks Event Reasons Counters",
                     "Clocks Throttle Reasons", "Sparse Operation Mode"},
     {"performance_state", "clocks_event_reasons", "clocks_event_reasons_counters", "clocks_throttle_reasons"}},
    {"SUPPORTED_CLOCKS", {"Supported Clocks"}, {"supported_clocks"}},
    {"PAGE_RETIREMENT", {"Retired Pages"}, {"retired_pages"}},
    {"ACCOUNTING", {"Accounting Mode", "Accounting Mode Buffer Size", "Accounted Processes"}, {"accounting_mode", "accounting_mode_buffer_size"}},
    {"ENCODER_STATS", {"Encoder Stats"}, {"encoder_stats"}},
    {"SUPPORTED_GPU_TARGET_TEMP", {"Supported GPU Target Temp", "Supported GPU_TARGET_TEMP"}, {"supported_gpu_target_temp"}},
    {"VOLTAGE", {"Voltage"}, {"voltage"}},
    {"FBC_STATS", {"FBC Stats"}, {"fbc_stats"}},
    {"ROW_REMAPPER", {"Remapped Rows"}, {"remapped_rows"}},
    {"RESET_STATUS", {"GPU Reset Status"}, {"gpu_reset_status"}},
    {"GSP_FIRMWARE_VERSION", {"GSP Firmware Version"}, {"gsp_firmware_version"}},
    {"POWER_SMOOTHING", {"Power Smoothing"}, {"power_smoothing"}},
    {"POWER_PROFILES", {"Workload Power Profiles"}, {"power_profiles"}},
    {0, {0}, {0}},
};

static unsigned g_sections;   /* bit per SECTIONS entry; 0 = everything */

int parse_sections(const char *list)
{
    if (strspn(list, ", ") == strlen(list))
        return -1;
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", list);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k;
        for (k = 0; SECTIONS[k].name; k++)
            if (!strcasecmp(t, SECTIONS[k].name))
                break;
        if (!SECTIONS[k].name)
            return -1;
        g_sections |= 1u << k;
    }
    return 0;
}

static int top_selected(const char *label, int xml)
{
    if (!g_sections)
        return 1;
    for (int k = 0; SECTIONS[k].name; k++) {
        if (!(g_sections & (1u << k)))
            continue;
        for (int j = 0; j < (xml ? 8 : 12); j++) {
            const char *s = xml ? SECTIONS[k].xml[j] : SECTIONS[k].text[j];
            if (s && !strcmp(s, label))
                return 1;
        }
    }
    return 0;
}

static const struct skel *xml_skeleton(const struct dev *d)
{
    char name[96] = "";
    if (g_rec) /* the branch's own elements, the same for every board it drives */
        return g_rec->xml;
    NV(nvmlDeviceGetName, d->h, name, sizeof(name));
    for (const struct board *b = XML_BOARDS; b->profile; b++)
        if (!strcmp(b->product, name))
            return b->xml;
    /* A board without a capture: the capture of the nearest driver branch. */
    const char *fallback = g_branch < 580 ? "a100" : g_branch >= 590 ? "l40s" : "h100";
    for (const struct board *b = XML_BOARDS; b->profile; b++)
        if (!strcmp(b->profile, fallback))
            return b->xml;
    return XML_BOARDS[0].xml;
}

static void xml_escape(const char *s, char *out, size_t n)
{
    size_t o = 0;
    for (; *s && o + 7 < n; s++) {
        const char *rep = *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : NULL;
        if (rep) {
            size_t l = strlen(rep);
            memcpy(out + o, rep, l);
            o += l;
        } else {
            out[o++] = *s;
        }
    }
    out[o] = 0;
}

void tabs(int n)
{
    for (int i = 0; i < n; i++)
        putchar('\t');
}

static void xml_processes(const struct dev *d, int depth, const char *tag)
{
    struct proc ps[64];
    unsigned np = strcmp(tag, "processes") ? 0 : get_procs(d, ps, 64);
    if (!strcmp(tag, "mig_devices")) {
        mig_query_xml(d->index, depth);
        return;
    }
    tabs(depth);
    printf("<%s>\n", tag);
    for (unsigned j = 0; j < np; j++) {
        char name[256], esc[512];
        proc_name(ps[j].pid, name, sizeof(name));
        xml_escape(name, esc, sizeof(esc));
        tabs(depth + 1); printf("<process_info>\n");
        if (ps[j].gi != 0xFFFFFFFFu) {
            tabs(depth + 2); printf("<gpu_instance_id>%u</gpu_instance_id>\n", ps[j].gi);
            tabs(depth + 2); printf("<compute_instance_id>%u</compute_instance_id>\n", ps[j].ci);
        } else {
            tabs(depth + 2); printf("<gpu_instance_id>N/A</gpu_instance_id>\n");
            tabs(depth + 2); printf("<compute_instance_id>N/A</compute_instance_id>\n");
        }
        tabs(depth + 2); printf("<pid>%u</pid>\n", ps[j].pid);
        tabs(depth + 2); printf("<type>%s</type>\n", ps[j].type);
        tabs(depth + 2); printf("<process_name>%s</process_name>\n", esc);
        tabs(depth + 2); printf("<used_memory>%llu MiB</used_memory>\n", ps[j].mem >> 20);
        tabs(depth + 1); printf("</process_info>\n");
    }
    tabs(depth);
    printf("</%s>\n", tag);
}

/* The board's supported clocks (nvmlDeviceGetSupportedMemoryClocks, then
   nvmlDeviceGetSupportedGraphicsClocks of each memory clock), highest first; 0: none (N/A). */
static int supported_clocks(const struct dev *d, struct clock_list *c)
{
    c->nmem = 8;
    if (NV(nvmlDeviceGetSupportedMemoryClocks, d->h, &c->nmem, c->mem) != NVML_SUCCESS || !c->nmem)
        return 0;
    for (unsigned k = 0; k < c->nmem; k++) {
        c->ngr[k] = 512;
        if (NV(nvmlDeviceGetSupportedGraphicsClocks, d->h, c->mem[k], &c->ngr[k], c->gr[k]) != NVML_SUCCESS)
            c->ngr[k] = 0;
    }
    return 1;
}

/* -q -x's <supported_clocks>: one <supported_mem_clock> per memory clock, its <value> and each
   graphics clock (every capture from 570, NVIDIA's 470-550 binaries); N/A when the board lists
   none (those binaries on a board that does not). */
static void xml_supported_clocks(const struct dev *d, int depth, const char *tag)
{
    static struct clock_list c;
    tabs(depth);
    if (!supported_clocks(d, &c)) {
        printf("<%s>N/A</%s>\n", tag, tag);
        return;
    }
    printf("<%s>\n", tag);
    for (unsigned k = 0; k < c.nmem; k++) {
        tabs(depth + 1); printf("<supported_mem_clock>\n");
        tabs(depth + 2); printf("<value>%u MHz</value>\n", c.mem[k]);
        for (unsigned j = 0; j < c.ngr[k]; j++) {
            tabs(depth + 2);
            printf("<supported_graphics_clock>%u MHz</supported_graphics_clock>\n", c.gr[k][j]);
        }
        tabs(depth + 1); printf("</supported_mem_clock>\n");
    }
    tabs(depth);
    printf("</%s>\n", tag);
}

/* -q -d SUPPORTED_CLOCKS: "Supported Clocks", then per memory clock a Memory line and its
   Graphics lines one level under it (NVIDIA's 470-550 binaries); N/A when the board lists none. */
static void text_supported_clocks(const struct dev *d, int depth, const char *label)
{
    static struct clock_list c;
    char v[32];
    if (!supported_clocks(d, &c)) {
        q_line(depth, label, "N/A");
        return;
    }
    printf("%*s%s\n", 4 * (depth + 1), "", label);
    for (unsigned k = 0; k < c.nmem; k++) {
        snprintf(v, sizeof(v), "%u MHz", c.mem[k]);
        q_line(depth + 1, "Memory", v);
        for (unsigned j = 0; j < c.ngr[k]; j++) {
            snprintf(v, sizeof(v), "%u MHz", c.gr[k][j]);
            q_line(depth + 2, "Graphics", v);
        }
    }
}

static void xml_gpu(const struct dev *d)
{
    char v[512], esc[1024], bus[32] = "N/A";
    value(d, K_pci_bus_id, bus, sizeof(bus));
    printf("\t<gpu id=\"%s\">\n", bus);
    const struct skel *s = xml_skeleton(d);
    char tl[32];
    int tlimit_board = value(d, K_temperature_gpu_tlimit, tl, sizeof(tl)) == V_OK;
    int skip_depth = -1;  /* inside a top-level element that -d did not select */
    for (; s->kind != 9; s++) {
        if (s->depth == 2 && s->kind != 2)
            skip_depth = top_selected(s->tag, 1) ? -1 : 2;
        if (skip_depth >= 0) {
            if (s->depth == 2 && s->kind == 2)
                skip_depth = -1;
            continue;
        }
        switch (s->kind) {
        case 0: tabs(s->depth); printf("<%s>\n", s->tag); break;
        case 2: tabs(s->depth); printf("</%s>\n", s->tag); break;
        case 3:
            if (s->key == K_supported_clocks)
                xml_supported_clocks(d, s->depth, s->tag);
            else
                xml_processes(d, s->depth, s->tag);
            break;
        default: {
            const struct skel *row = threshold_row(s, tlimit_board, 1);
            value_text(d, row->key, row->suffix, v, sizeof(v));
            /* XML spells PCI numbers without 0x */
            const char *p = v;
            if (!strncmp(row->tag, "pci_", 4) && !strncmp(v, "0x", 2))
                p = v + 2;
            xml_escape(p, esc, sizeof(esc));
            tabs(row->depth);
            printf("<%s>%s</%s>\n", row->tag, esc, row->tag);
        }
        }
    }
    printf("\t</gpu>\n\n");
}

int cmd_xml(void)
{
    char ts[64];
    timestamp(ts, sizeof(ts), 0);
    printf("<?xml version=\"1.0\" ?>\n");
    printf("<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v%d.dtd\">\n", g_rec ? g_rec->dtd : g_branch >= 580 ? 13 : 12);
    printf("<nvidia_smi_log>\n");
    printf("\t<timestamp>%s</timestamp>\n", ts);
    printf("\t<driver_version>%s</driver_version>\n", g_driver);
    printf("\t<cuda_version>%s</cuda_version>\n", g_cuda);
    printf("\t<attached_gpus>%u</attached_gpus>\n", g_count);
    for (unsigned i = 0; i < g_ndevs; i++) {
        if (g_devs[i].err != NVML_SUCCESS) {
            /* the real tool reports the handle failure and omits the GPU */
            fflush(stdout);
            print_handle_error(&g_devs[i]);
            g_exit = EXIT_LOST;
            continue;
        }
        xml_gpu(&g_devs[i]);
    }
    printf("</nvidia_smi_log>\n");
    return g_exit;
}

void q_line(int depth, const char *label, const char *val)
{
    int indent = 4 * (depth + 1);
    printf("%*s%-*s: %s\n", indent, "", g_colon - indent, label, val);
}

int cmd_query(void)
{
    char ts[64];
    timestamp(ts, sizeof(ts), 0);
    printf("\n==============NVSMI LOG==============\n\n");
    q_line(-1, "Timestamp", ts);
    q_line(-1, "Driver Version", g_driver);
    q_line(-1, "CUDA Version", g_cuda);
    printf("\n");
    char cnt[16];
    snprintf(cnt, sizeof(cnt), "%u", g_count);
    q_line(-1, "Attached GPUs", cnt);
    const struct skel *skel = g_rec ? (g_sections ? g_rec->text_display : g_rec->text)
                                    : g_branch >= 595 ? TEXT_595 : TEXT_590;
    for (unsigned i = 0; i < g_ndevs; i++) {
        const struct dev *d = &g_devs[i];
        if (d->err != NVML_SUCCESS) {
            print_handle_error(d);
            g_exit = EXIT_LOST;
            continue;
        }
        char bus[32] = "N/A", v[512];
        value(d, K_pci_bus_id, bus, sizeof(bus));
        printf("GPU %s\n", bus);
        int skipping = 0;
        char tl[32];
        int tlimit_board = value(d, K_temperature_gpu_tlimit, tl, sizeof(tl)) == V_OK;
        for (const struct skel *s = skel; s->kind != 9; s++) {
            /* From 570 no capture shows -d SUPPORTED_CLOCKS: its block where 470-550 print it,
               before Processes (unverified) */
            if (!g_rec && s->key == K_processes && top_selected("Supported Clocks", 0) && g_sections)
                text_supported_clocks(d, 0, "Supported Clocks");
            if (s->depth == 0)
                skipping = !top_selected(s->tag, 0);
            if (skipping)
                continue;
            if (s->kind == 3 && s->key == K_supported_clocks) {
                text_supported_clocks(d, s->depth, s->tag);
                continue;
            }
            if (s->kind == 0 && mig_section_na(d->index, s->tag)) { /* one N/A line for the section */
                q_line(s->depth, s->tag, "N/A");
                for (int depth = s->depth; s[1].kind != 9 && s[1].depth > depth;)
                    s++;
            } else if (s->kind == 0) {
                printf("%*s%s\n", 4 * (s->depth + 1), "", s->tag);
            } else if (s->kind == 3) {
                struct proc ps[64];
                unsigned np = get_procs(d, ps, 64);
                if (!np) {
                    q_line(s->depth, s->tag, "None");
                    continue;
                }
                printf("%*s%s\n", 4 * (s->depth + 1), "", "Processes");
                for (unsigned j = 0; j < np; j++) {
                    char name[256], num[32];
                    proc_name(ps[j].pid, name, sizeof(name));
                    snprintf(num, sizeof(num), "%s", "N/A");
                    q_line(s->depth + 1, "GPU instance ID", ps[j].gi != 0xFFFFFFFFu ? (snprintf(num, sizeof(num), "%u", ps[j].gi), num) : "N/A");
                    q_line(s->depth + 1, "Compute instance ID", ps[j].ci != 0xFFFFFFFFu ? (snprintf(num, sizeof(num), "%u", ps[j].ci), num) : "N/A");
                    snprintf(num, sizeof(num), "%u", ps[j].pid);
                    q_line(s->depth + 1, "Process ID", num);
                    /* the rest one level deeper, under the Process ID (every real -q: 470-595) */
                    q_line(s->depth + 2, "Type", ps[j].type);
                    q_line(s->depth + 2, "Name", name);
                    snprintf(num, sizeof(num), "%llu MiB", ps[j].mem >> 20);
                    q_line(s->depth + 2, "Used GPU Memory", num);
                }
            } else {
                const struct skel *row = threshold_row(s, tlimit_board, 0);
                value_text(d, row->key, row->suffix, v, sizeof(v));
                q_line(s->depth, row->tag, v);
                if (s->key == K_mig_mode_pending)
                    mig_query_text(d->index);
            }
        }
        printf("\n");
    }
    return g_exit;
}
