/* nvidia-smi's command line: the options of every mode, the branch the driver's version picks,
   the help texts, and the loop that runs one mode. */
#include "smi.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

int g_branch = 590;
const struct branch *g_rec;
const struct captured *g_cap = CAPTURED;
const struct qfield *g_fields;
int g_colon = 55;
char g_driver[96] = "N/A";
char g_cuda[16] = "N/A";
unsigned g_count;
int g_exit;

const char MSG_INVALID[] = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n";
const char MSG_NO_DEVICES[] = "No devices were found\n";

/* ---- command line --------------------------------------------------------------------- */

static void set_branch(void)
{
    g_rec = NULL;
    if (g_branch < 570) {
        g_rec = &BRANCHES[0];
        for (const struct branch *b = BRANCHES; b->branch; b++)
            if (b->branch <= g_branch)
                g_rec = b;
    }
    g_cap = CAPTURED; /* 570-594: the 590 capture's; from 595 595's */
    for (const struct captured *c = CAPTURED; c->branch; c++)
        if (c->branch <= g_branch)
            g_cap = c;
    g_fields = g_rec ? g_rec->fields : g_cap->fields;
    g_colon = g_rec ? g_rec->colon : g_branch >= 595 ? TEXT_595_COLON : TEXT_590_COLON;
}

/* The branch before the command line is parsed (the help texts and the answer to an unknown
   argument are the branch's): the driver is asked quietly; without one, the 590 layouts. */
static const char *probe_branch(void)
{
    const char *version = HELP_VERSION;
    if (load_nvml() == 0 && NV(nvmlInit_v2) == NVML_SUCCESS) {
        if (NV(nvmlSystemGetDriverVersion, g_driver, sizeof(g_driver)) == NVML_SUCCESS && atoi(g_driver) > 0) {
            g_branch = atoi(g_driver);
            version = g_driver;
        }
        NV(nvmlShutdown);
    }
    set_branch();
    return version;
}

/* An argument the tool does not know: the recorded branch's message ("ERROR: Option X is not
   recognized..." from 535, the invalid-combination line before) and exit code. */
static int unknown_option(const char *a)
{
    probe_branch();
    if (!g_rec) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    const char *at = strstr(g_rec->unknown, "%s");
    if (at)
        printf("%.*s%s%s", (int)(at - g_rec->unknown), g_rec->unknown, a, at + 2);
    else
        fputs(g_rec->unknown, stdout);
    return g_rec->unknown_rc;
}

/* -h and the --help-query-* texts are the driver's branch's, -h headed by its version as the real
   tool's by its own. The remapped-rows text is recorded for 470-550 only (no capture from 570 has
   it), so from 570 that option stays unknown. */
static int print_help(const char *option, int which)
{
    const char *version = probe_branch();
    const char *text = NULL;
    switch (which) {
    case 0:
        printf("NVIDIA System Management Interface -- v%s\n", version);
        text = g_rec ? g_rec->help : g_cap->help;
        break;
    case 1: text = g_rec ? g_rec->help_query_gpu : g_cap->help_query_gpu; break;
    case 2: text = g_rec ? g_rec->help_query_apps : g_cap->help_query_apps; break;
    case 3: text = g_rec ? g_rec->help_query_accounted : g_cap->help_query_accounted; break;
    case 4: text = g_rec ? g_rec->help_query_retired : g_cap->help_query_retired; break;
    default: text = g_rec ? g_rec->help_query_remapped : NULL; break;
    }
    if (!text)
        return unknown_option(option);
    fputs(text, stdout);
    return 0;
}

static int init_nvml(void)
{
    if (load_nvml() != 0) {
        printf("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
               "Display Driver is properly installed and present in your system.\nPlease also try adding directory "
               "that contains libnvidia-ml.so to your system PATH.\n");
        return EXIT_NO_LIB;
    }
    nvmlReturn_t r = NV(nvmlInit_v2);
    if (r == NVML_ERROR_DRIVER_NOT_LOADED || r == NVML_ERROR_FUNCTION_NOT_FOUND || r == NVML_ERROR_LIBRARY_NOT_FOUND) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.\n");
        return EXIT_NO_DRIVER;
    }
    if (r != NVML_SUCCESS) {
        printf("Failed to initialize NVML: %s\n", nvml_error(r));
        return r > 0 && r < 255 ? (int)r : EXIT_OTHER;
    }
    NV(nvmlSystemGetDriverVersion, g_driver, sizeof(g_driver));
    g_branch = atoi(g_driver) > 0 ? atoi(g_driver) : 590;
    set_branch();
    int cv = 0;
    if (NV(nvmlSystemGetCudaDriverVersion_v2, &cv) == NVML_SUCCESS && cv > 0)
        snprintf(g_cuda, sizeof(g_cuda), "%d.%d", cv / 1000, (cv % 1000) / 10);
    if (NV(nvmlDeviceGetCount_v2, &g_count) != NVML_SUCCESS)
        g_count = 0;
    init_units();
    return 0;
}

const char *opt_value(int argc, char **argv, int *i, const char *longname, const char *shortname)
{
    const char *a = argv[*i];
    size_t l = strlen(longname);
    if (!strncmp(a, longname, l) && a[l] == '=')
        return a + l + 1;
    if ((!strcmp(a, longname) || (shortname && !strcmp(a, shortname))) && *i + 1 < argc)
        return argv[++*i];
    if (shortname && !strncmp(a, shortname, strlen(shortname)) && a[strlen(shortname)] == '=')
        return a + strlen(shortname) + 1;
    return NULL;
}

int is_opt(const char *a, const char *longname, const char *shortname)
{
    size_t l = strlen(longname);
    return !strcmp(a, longname) || (!strncmp(a, longname, l) && a[l] == '=') ||
           (shortname && (!strcmp(a, shortname) || (!strncmp(a, shortname, strlen(shortname)) && a[strlen(shortname)] == '=')));
}

/* `nvidia-smi mig ...`: its own options, then the same start as every mode. */
static int main_mig(int argc, char **argv)
{
    struct mig_cmd c;
    const char *ids = NULL;
    if (mig_parse(argc, argv, &c, &ids) != 0)
        return printf("%s", MSG_INVALID), EXIT_INVALID;
    int rc = init_nvml();
    if (rc)
        return rc;
    if (g_count == 0 || select_devices(ids) != 0 || g_ndevs == 0) {
        printf("%s", MSG_NO_DEVICES);
        return EXIT_NOT_FOUND;
    }
    rc = cmd_mig(&c);
    NV(nvmlShutdown);
    return rc;
}

enum smi_mode { M_TABLE, M_LIST, M_QUERY, M_XML, M_QGPU, M_QAPPS, M_QACCT, M_QRETIRED, M_QCLOCKS, M_TOPO, M_NVLINK, M_DMON, M_PMON, M_VERSION };

/* The --query-* options: each takes its field list and selects its listing. */
static const struct {
    const char *opt;
    enum smi_mode mode;
} QUERY_OPTS[] = {
    {"--query-gpu", M_QGPU},
    {"--query-compute-apps", M_QAPPS},
    {"--query-accounted-apps", M_QACCT},
    {"--query-retired-pages", M_QRETIRED},
    {"--query-supported-clocks", M_QCLOCKS},
};

/* The index in QUERY_OPTS of the query option `a` is, or -1. */
static int query_opt(const char *a)
{
    for (size_t k = 0; k < sizeof(QUERY_OPTS) / sizeof(QUERY_OPTS[0]); k++)
        if (is_opt(a, QUERY_OPTS[k].opt, NULL))
            return (int)k;
    return -1;
}

int main(int argc, char **argv)
{
    enum smi_mode mode = M_TABLE;
    const char *ids = NULL, *fields = NULL, *format = NULL, *dsections = NULL;
    long loop_ms = 0, count = 0, delay = 1;
    char nvmode = 0;
    int q = 0, x = 0, nset = 0, k, qo, mig_mode = -1;
    struct set_cmd set = {0};

    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    int argi = 1;
    if (argc > 1 && argv[1][0] != '-') {
        const char *sub = argv[1];
        if (!strcmp(sub, "topo")) mode = M_TOPO;
        else if (!strcmp(sub, "nvlink")) mode = M_NVLINK;
        else if (!strcmp(sub, "dmon")) mode = M_DMON;
        else if (!strcmp(sub, "pmon")) mode = M_PMON;
        else if (!strcmp(sub, "mig")) return main_mig(argc, argv);
        else
            return unknown_option(sub);
        argi = 2;
    }
    for (int i = argi; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            return print_help(a, 0);
        } else if (!strcmp(a, "--help-query-gpu")) {
            return print_help(a, 1);
        } else if (!strcmp(a, "--help-query-compute-apps")) {
            return print_help(a, 2);
        } else if (!strcmp(a, "--help-query-accounted-apps")) {
            return print_help(a, 3);
        } else if (!strcmp(a, "--help-query-retired-pages")) {
            return print_help(a, 4);
        } else if (!strcmp(a, "--help-query-remapped-rows")) {
            return print_help(a, 5);
        } else if (!strcmp(a, "--version")) {
            if (probe_branch() && g_rec && !strstr(g_rec->help, "--version"))
                return unknown_option(a); /* not an option before 550 */
            mode = M_VERSION;
        } else if (!strcmp(a, "-L") || !strcmp(a, "--list-gpus")) {
            mode = M_LIST;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--query") || !strcmp(a, "-a")) {
            q = 1;
        } else if (!strcmp(a, "-x") || !strcmp(a, "--xml-format")) {
            x = 1;
        } else if (mode == M_TOPO && !strcmp(a, "-m")) {
        } else if (mode == M_NVLINK && (!strcmp(a, "-s") || !strcmp(a, "-c") || !strcmp(a, "-e"))) {
            nvmode = a[1];
        } else if (mode == M_NVLINK && (!strcmp(a, "--status") || !strcmp(a, "--capabilities") || !strcmp(a, "--error-counters"))) {
            nvmode = !strcmp(a, "--status") ? 's' : !strcmp(a, "--capabilities") ? 'c' : 'e';
        } else if ((mode == M_DMON || mode == M_PMON) && (v = opt_value(argc, argv, &i, "--count", "-c"))) {
            count = strtol(v, NULL, 10);
            if (count <= 0)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if ((mode == M_DMON || mode == M_PMON) && (v = opt_value(argc, argv, &i, "--delay", "-d"))) {
            delay = strtol(v, NULL, 10);
            if (delay <= 0 || delay > 86400)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if ((mode == M_DMON || mode == M_PMON) && (is_opt(a, "--count", "-c") || is_opt(a, "--delay", "-d"))) {
            return printf("%s", MSG_INVALID), EXIT_INVALID;  /* -c / -d without a value */
        } else if (argi == 1 && (k = set_parse(argc, argv, &i, &set)) != 0) {
            /* Device modification options: "[any one of]", each with a value or none. */
            nset++;
            if (k < 0)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (argi == 1 && is_opt(a, "--multi-instance-gpu", "-mig")) {
            v = opt_value(argc, argv, &i, "--multi-instance-gpu", "-mig");
            unsigned on = 0;
            if (!v || parse_enable(v, &on))
                return printf("%s", MSG_INVALID), EXIT_INVALID;
            mig_mode = (int)on;
            nset++;
        } else if (is_opt(a, "--id", "-i")) {
            ids = opt_value(argc, argv, &i, "--id", "-i");
            if (!ids || !*ids)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (!strncmp(a, "-i", 2) && a[2] && isdigit((unsigned char)a[2])) {
            ids = a + 2;
        } else if ((qo = query_opt(a)) >= 0) {
            fields = opt_value(argc, argv, &i, QUERY_OPTS[qo].opt, NULL);
            mode = QUERY_OPTS[qo].mode;
        } else if (is_opt(a, "--format", NULL)) {
            format = opt_value(argc, argv, &i, "--format", NULL);
        } else if (is_opt(a, "--display", "-d")) {
            dsections = opt_value(argc, argv, &i, "--display", "-d");
            if (!dsections)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (is_opt(a, "--loop-ms", "-lms")) {
            v = opt_value(argc, argv, &i, "--loop-ms", "-lms");
            loop_ms = v ? strtol(v, NULL, 10) : 0;
            if (loop_ms <= 0)
                return printf("%s", MSG_INVALID), EXIT_INVALID;
        } else if (is_opt(a, "--loop", "-l")) {
            v = opt_value(argc, argv, &i, "--loop", "-l");
            /* "-l" alone loops every 5 seconds */
            loop_ms = v ? strtol(v, NULL, 10) * 1000 : 5000;
            if (v && !isdigit((unsigned char)v[0]))
                return printf("%s", MSG_INVALID), EXIT_INVALID;
            if (loop_ms <= 0)
                loop_ms = 5000;
        } else {
            return unknown_option(a);
        }
    }
    /* A configuration command is one of its kind and goes with nothing but -i. */
    if (nset > 1 || (nset && (mode != M_TABLE || q || x || fields || format || dsections || loop_ms))) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    if (mode == M_TABLE && x && !q && !nset && !fields && !format && !dsections) { /* real 470-550 */
        printf("Invalid combination of input arguments. Specify -q/--query and -x/--xml-format to run an XML query.  "
               "Please run 'nvidia-smi -h' for help.\n\n");
        return EXIT_INVALID;
    }
    if (mode == M_TABLE && q)
        mode = x ? M_XML : M_QUERY;
    /* The listing a --query-* option other than --query-gpu selects, in the order of the
       listings' field tables (compute apps, accounted apps, retired pages, supported clocks). */
    int which = mode == M_QAPPS ? 0 : mode == M_QACCT ? 1 : mode == M_QRETIRED ? 2 : mode == M_QCLOCKS ? 3 : -1;
    int listing = which >= 0;
    /* A missing or bad --format: below 570 as NVIDIA's 470-550 binaries (a missing one first, the
       fields next, below, then what it says); from 570 the invalid-combination line (unverified). */
    int format_error = 0;
    if (mode == M_QGPU || listing) {
        if (!format || (format_error = parse_format(format)) != 0) {
            probe_branch();
            if (!g_rec) {
                printf("%s", MSG_INVALID);
                return EXIT_INVALID;
            }
        }
        if (!format) {
            printf("\"--format=\" switch is missing. Please run 'nvidia-smi -h' for help.\n\n");
            return EXIT_INVALID;
        }
        if (!fields || !*fields) {
            printf("%s", MSG_INVALID);
            return EXIT_INVALID;
        }
    }
    if (dsections && (!(mode == M_QUERY || mode == M_XML) || parse_sections(dsections) != 0)) {
        printf("%s", MSG_INVALID);
        return EXIT_INVALID;
    }
    if (mode == M_NVLINK && !nvmode)
        nvmode = 's';

    int rc = init_nvml();
    if (rc)
        return rc;
    if (g_rec && dsections && mode == M_XML) { /* real 470-550 */
        printf("Invalid combination of input arguments: --display/-d flags can not be combined with -x/--xml-format "
               "flags.\n");
        return EXIT_INVALID;
    }
    if (mode == M_VERSION)
        return cmd_version();
    if (g_count == 0) {
        printf("%s", MSG_NO_DEVICES);
        return EXIT_NOT_FOUND;
    }
    if (select_devices(ids) != 0 || g_ndevs == 0) {
        printf("%s", MSG_NO_DEVICES);
        return EXIT_NOT_FOUND;
    }

    if (mig_mode >= 0) {
        rc = cmd_mig_mode((unsigned)mig_mode);
        NV(nvmlShutdown);
        return rc;
    }
    if (nset) {
        rc = cmd_set(&set);
        NV(nvmlShutdown);
        return rc;
    }

    struct col cols[512];
    int ncols = 0, app_idx[16];
    const char *app_spelled[16];
    if (mode == M_QGPU) {
        ncols = parse_gpu_fields(fields, cols, 512);
        if (ncols <= 0)
            return EXIT_INVALID;
    } else if (listing) {
        ncols = parse_fields_of(fields, app_idx, app_spelled, 16, which);
        if (ncols <= 0)
            return EXIT_INVALID;
    }
    if (format_error) {
        printf("%s", format_error == -1 ? "Format modifier is not recognized.\n"
                                        : "Format modifier --format=csv is mandatory.\n");
        return EXIT_INVALID;
    }

    for (long it = 0; !g_stop; it++) {
        if (it)
            sleep_ms(loop_ms);
        if (g_stop)
            break;
        g_exit = 0;
        switch (mode) {
        case M_LIST: rc = cmd_list(); break;
        case M_QUERY: rc = cmd_query(); break;
        case M_XML: rc = cmd_xml(); break;
        case M_TOPO: rc = cmd_topo(); break;
        case M_NVLINK: rc = cmd_nvlink(nvmode); break;
        case M_DMON: rc = cmd_dmon(count, delay); break;
        case M_PMON: rc = cmd_pmon(count, delay); break;
        case M_QGPU:
            if (it == 0)
                print_header(cols, ncols, fields);
            query_gpu_once(cols, ncols);
            rc = g_exit;
            break;
        case M_QAPPS:
        case M_QACCT:
        case M_QRETIRED:
        case M_QCLOCKS:
            if (it == 0)
                print_apps_header(app_idx, ncols, which);
            if (mode == M_QCLOCKS)
                query_clocks_once(app_idx, ncols);
            else if (mode == M_QACCT)
                query_accounted_once(app_idx, ncols);
            else if (mode == M_QRETIRED)
                query_retired_once(app_idx, ncols);
            else
                query_apps_once(app_idx, ncols);
            rc = 0;
            break;
        default: rc = cmd_table(); break;
        }
        fflush(stdout);
        if (!loop_ms || mode == M_DMON || mode == M_PMON || mode == M_TOPO || mode == M_NVLINK)
            break;
    }
    NV(nvmlShutdown);
    return rc;
}
