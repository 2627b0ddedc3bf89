/*
 * nvidia-smi for a simulated node: the real tool's modes and output formats, answered by
 * calling libnvidia-ml.so.1 through dlopen/dlsym the way the real tool does, so it runs in
 * containers without Python and exercises our NVML. Links nothing but libc.
 *
 * Layouts come from real captures (tests/fixtures/captures): help texts, the --query-gpu
 * field table and the -q / -q -x element skeletons are generated into smi_gen.h by
 * gen_smi.py, and each value's getter from fields.yaml; the files fill them with values. A
 * getter that NVML does not support prints what the real tool prints for an unsupported field
 * ([N/A] in CSV, N/A in -q and XML).
 *
 * One file per mode, this header between them: smi_nvml.c (NVML at run time, the devices -i
 * selects, their processes, the shared state), smi_values.c (one value of a GPU),
 * smi_table.c (the default table, -L, --version), smi_query.c (-q, -q -x, --query-*),
 * smi_mig.c (MIG in every listing, -mig and `nvidia-smi mig`), smi_monitor.c (topo, nvlink,
 * dmon, pmon), smi_set.c (the configuration commands), smi_main.c (the command line).
 *
 * Host safety: no abort(), no unbounded loops; every buffer write is bounded.
 */
#ifndef SMI_H
#define SMI_H

#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"
#include "mokka_client.h"
#include "mokka_control.h"
#include "mokka_view.h"
#include "smi_gen.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/* Cells are fixed-width: a value longer than its cell is cut, as intended. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* ---- NVML, resolved at run time (smi_nvml.c) ------------------------------------------- */

#define NVML_FUNCS(X)                                                                         \
    X(nvmlInit_v2) X(nvmlShutdown) X(nvmlErrorString) X(nvmlSystemGetDriverVersion)          \
    X(nvmlSystemGetNVMLVersion) X(nvmlSystemGetCudaDriverVersion_v2) X(nvmlDeviceGetCount_v2) \
    X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetName) X(nvmlDeviceGetUUID)               \
    X(nvmlDeviceGetSerial) X(nvmlDeviceGetBoardPartNumber) X(nvmlDeviceGetVbiosVersion)      \
    X(nvmlDeviceGetInforomImageVersion) X(nvmlDeviceGetInforomVersion)                       \
    X(nvmlDeviceGetMultiGpuBoard) X(nvmlDeviceGetBoardId) X(nvmlDeviceGetMinorNumber)        \
    X(nvmlDeviceGetBrand) X(nvmlDeviceGetArchitecture) X(nvmlDeviceGetCudaComputeCapability) \
    X(nvmlDeviceGetPciInfo_v3) X(nvmlDeviceGetMaxPcieLinkGeneration)                         \
    X(nvmlDeviceGetGpuMaxPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkGeneration)          \
    X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetCurrPcieLinkWidth)                       \
    X(nvmlDeviceGetPcieReplayCounter) X(nvmlDeviceGetPcieThroughput) X(nvmlDeviceGetFanSpeed) \
    X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetCurrentClocksEventReasons)               \
    X(nvmlDeviceGetSupportedClocksEventReasons) X(nvmlDeviceGetMemoryInfo_v2)                \
    X(nvmlDeviceGetSupportedMemoryClocks) X(nvmlDeviceGetSupportedGraphicsClocks)            \
    X(nvmlDeviceGetBAR1MemoryInfo) X(nvmlDeviceGetComputeMode) X(nvmlDeviceGetUtilizationRates) \
    X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization) X(nvmlDeviceGetEccMode) \
    X(nvmlDeviceGetMemoryErrorCounter) X(nvmlDeviceGetTotalEccErrors)                        \
    X(nvmlDeviceGetRetiredPages) X(nvmlDeviceGetRetiredPages_v2) X(nvmlDeviceGetRetiredPagesPendingStatus) \
    X(nvmlDeviceGetRemappedRows) X(nvmlDeviceGetTemperature) X(nvmlDeviceGetTemperatureThreshold) \
    X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetPowerManagementLimit)                          \
    X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetPowerManagementDefaultLimit)           \
    X(nvmlDeviceGetPowerManagementLimitConstraints) X(nvmlDeviceGetClockInfo)                \
    X(nvmlDeviceGetMaxClockInfo) X(nvmlDeviceGetApplicationsClock)                           \
    X(nvmlDeviceGetDefaultApplicationsClock) X(nvmlDeviceGetMaxCustomerBoostClock)           \
    X(nvmlDeviceGetMigMode) X(nvmlDeviceGetPersistenceMode) X(nvmlDeviceGetDisplayMode)      \
    X(nvmlDeviceGetDisplayActive) X(nvmlDeviceGetGpuFabricInfo)                              \
    X(nvmlDeviceGetGpuFabricInfoV)                                                           \
    X(nvmlDeviceGetComputeRunningProcesses_v3) X(nvmlDeviceGetGraphicsRunningProcesses_v3)   \
    X(nvmlSystemGetProcessName) X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetNvLinkVersion)    \
    X(nvmlDeviceGetNvLinkCapability) X(nvmlDeviceGetNvLinkErrorCounter)                      \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2) X(nvmlDeviceGetTopologyCommonAncestor)            \
    X(nvmlDeviceGetCpuAffinity) X(nvmlDeviceGetMemoryAffinity) X(nvmlDeviceGetModuleId) X(nvmlDeviceGetPowerManagementMode)      \
    X(nvmlDeviceGetGspFirmwareVersion) X(nvmlDeviceGetGspFirmwareMode) X(nvmlDeviceValidateInforom) X(nvmlDeviceGetPowerState) X(nvmlDeviceGetMarginTemperature)  \
    X(nvmlDeviceGetFieldValues) X(nvmlDeviceGetPciInfoExt) X(nvmlDeviceGetNvLinkRemoteDeviceType) \
    X(nvmlDeviceSetPersistenceMode) X(nvmlDeviceSetComputeMode) X(nvmlDeviceSetPowerManagementLimit) \
    X(nvmlDeviceSetGpuLockedClocks) X(nvmlDeviceResetGpuLockedClocks)                        \
    X(nvmlDeviceSetApplicationsClocks) X(nvmlDeviceResetApplicationsClocks)                  \
    X(nvmlDeviceSetMemoryLockedClocks) X(nvmlDeviceResetMemoryLockedClocks)                  \
    X(nvmlDeviceSetEccMode) X(nvmlDeviceClearEccErrorCounts) X(nvmlDeviceSetAccountingMode)  \
    X(nvmlDeviceClearAccountingPids) X(nvmlDeviceGetAccountingPids) X(nvmlDeviceGetAccountingMode)       \
    X(nvmlDeviceGetAccountingBufferSize)                          \
    X(nvmlDeviceGetAccountingStats) X(nvmlDeviceSetDefaultAutoBoostedClocksEnabled)          \
    X(nvmlDeviceSetGpuOperationMode) X(nvmlDeviceGetAddressingMode)                          \
    NVML_FUNCS_CAPTURED(X)

/* The getters of the values the captures have beyond --query-gpu's basics. */
#define NVML_FUNCS_CAPTURED(X)                                                                \
    X(nvmlDeviceGetPdi) X(nvmlDeviceGetC2cModeInfoV) X(nvmlDeviceGetVirtualizationMode)      \
    X(nvmlDeviceGetJpgUtilization) X(nvmlDeviceGetOfaUtilization) X(nvmlDeviceGetEncoderStats) \
    X(nvmlDeviceGetFBCStats) X(nvmlDeviceGetConfComputeProtectedMemoryUsage)                 \
    X(nvmlDeviceGetSramEccErrorStatus) X(nvmlDeviceGetRowRemapperHistogram)                  \
    X(nvmlDeviceGetMigDeviceHandleByIndex)                                                   \
    X(nvmlDeviceGetRepairStatus) X(nvmlDeviceGetCapabilities) X(nvmlDeviceGetRemappedRows_v2)  \
    X(nvmlDeviceGetUnrepairableMemoryFlag_v1)

#define DECLARE(f) extern __typeof__(f) *p_##f;
NVML_FUNCS(DECLARE)
#undef DECLARE

/* A symbol the library lacks answers like an unsupported getter. */
#define NV(f, ...) (p_##f ? p_##f(__VA_ARGS__) : NVML_ERROR_FUNCTION_NOT_FOUND)

int load_nvml(void);
const char *nvml_error(nvmlReturn_t r);

/* ---- the driver's branch and the node (smi_main.c) -------------------------------------- */

extern int g_branch;            /* driver major: picks layouts that changed between branches */
/* Before 570: the layouts recorded from NVIDIA's own nvidia-smi of the nearest older Debian-shipped
   branch (smi_gen.h's BRANCHES; the oldest for older drivers). From 570: the 590/595 captures. */
extern const struct branch *g_rec;
/* From 570: the text capture of the newest captured branch not above the driver's (590, 595). */
extern const struct captured *g_cap;
extern const struct qfield *g_fields;
extern int g_colon;             /* -q's colon column */
extern char g_driver[96];
extern char g_cuda[16];
extern unsigned g_count;
extern int g_exit;              /* the exit code of the run so far (a lost GPU) */

enum { EXIT_OK = 0, EXIT_INVALID = 2, EXIT_NOT_FOUND = 6, EXIT_NO_DRIVER = 9, EXIT_NO_LIB = 12,
       EXIT_LOST = 15, EXIT_OTHER = 255 };

extern const char MSG_INVALID[];
extern const char MSG_NO_DEVICES[];

/* ---- devices, their processes and the shared state (smi_nvml.c) ------------------------- */

struct dev {
    unsigned index;
    nvmlDevice_t h;
    nvmlReturn_t err;           /* SUCCESS, or why there is no handle (GPU_IS_LOST, ...) */
};

extern struct dev g_devs[MOKKA_MAX_GPUS];
extern unsigned g_ndevs;        /* selected by -i, in index order */

/* What this process sees of the node, as its NVML does (mokka_view.h). */
extern struct mokka_view g_view;
const struct mokka_state *state_of(unsigned index, unsigned *node);
/* The node's GPU index of NVML index `index`: what the daemon's commands name. */
unsigned node_of(unsigned index);
int state_string(unsigned index, size_t offset, size_t len, char *out, size_t n);
#define STATE_STRING(index, field, out, n)                                                         \
    state_string((index), offsetof(struct mokka_gpu, field), sizeof(((struct mokka_gpu *)0)->field), (out), (n))
void lost_bus_id(unsigned index, char *out, size_t n);
void print_handle_error(const struct dev *d);
int select_devices(const char *ids);
int check_handles(int abort_all);

struct proc { unsigned pid; unsigned long long mem; char type[4]; unsigned gi, ci; };
unsigned get_procs(const struct dev *d, struct proc *out, unsigned cap);
void proc_name(unsigned pid, char *out, size_t n);

/* ---- values (smi_values.c) ------------------------------------------------------------ */

enum vr { V_OK, V_NA, V_DEPRECATED };

/* One value, without its unit. V_NA / V_DEPRECATED leave `out` unspecified. */
enum vr value(const struct dev *d, int key, char *out, size_t n);
/* Value with its unit as -q and -q -x print it ("81559 MiB"); "N/A" when unavailable. */
void value_text(const struct dev *d, int key, const char *suffix, char *out, size_t n);
void init_units(void);
void timestamp(char *out, size_t n, int csv);

/* ---- the default table, -L, --version (smi_table.c) -------------------------------------- */

int cmd_list(void);
int cmd_version(void);
int cmd_table(void);

/* ---- -q, -q -x, --query-gpu, --query-compute-apps, -accounted-apps, -retired-pages (smi_query.c) */

struct col { const char *spelled; int key; const char *unit; };

extern int g_noheader, g_nounits;
int parse_format(const char *f);
int parse_gpu_fields(const char *list, struct col *cols, int cap);
void print_header(const struct col *cols, int n, const char *list);
void query_gpu_once(const struct col *cols, int n);
/* which: 0 --query-compute-apps, 1 --query-accounted-apps, 2 --query-retired-pages */
int parse_fields_of(const char *list, int *idx, const char **spelled, int cap, int which);
void print_apps_header(const int *idx, int n, int which);
void query_apps_once(const int *idx, int n);
void query_accounted_once(const int *idx, int n);
void query_clocks_once(const int *idx, int n);
void query_retired_once(const int *idx, int n);
int parse_sections(const char *list);
int cmd_xml(void);
int cmd_query(void);
void q_line(int depth, const char *label, const char *val);
void tabs(int n);

/* ---- MIG (smi_mig.c) ------------------------------------------------------------------ */

int mig_read(unsigned index, struct mokka_mig_snapshot *v);
int mig_enabled(unsigned index);
int mig_section_na(unsigned index, const char *tag);
int mig_of_pid(const struct mokka_mig_snapshot *v, unsigned pid, unsigned *gi, unsigned *ci);
void mig_list(unsigned index);
int mig_table_any(void);
int mig_table(const char *rule);
void mig_query_text(unsigned index);
void mig_query_xml(unsigned index, int depth);
int cmd_mig_mode(unsigned enable);

enum mig_action { MA_NONE, MA_LGIP, MA_LGIPP, MA_LCIP, MA_CGI, MA_CCI, MA_LGI, MA_LCI, MA_DGI, MA_DCI };

struct mig_cmd {
    enum mig_action action;
    const char *list;           /* -cgi / -cci: profiles, comma-separated; NULL: -cci's default */
    int default_ci;             /* -C */
    int gi[MOKKA_MAX_GPU_INSTANCES * 2], ngi;   /* -gi: ids; none given: every one */
    int ci[MOKKA_MAX_MIG_DEVICES * 2], nci;     /* -ci */
};

int mig_parse(int argc, char **argv, struct mig_cmd *c, const char **ids);
int cmd_mig(const struct mig_cmd *c);

/* ---- topo, nvlink, dmon, pmon (smi_monitor.c) -------------------------------------------- */

extern volatile sig_atomic_t g_stop;
void on_signal(int sig);
void sleep_ms(long ms);
int cmd_topo(void);
int cmd_nvlink(char mode);
int cmd_dmon(long count, long delay_s);
int cmd_pmon(long count, long delay_s);

/* ---- configuration commands (smi_set.c) ------------------------------------------------- */

enum set_kind { SET_NONE, SET_PM, SET_CM, SET_PL, SET_LGC, SET_RGC, SET_AC, SET_RAC, SET_LMC, SET_RMC, SET_ECC,
                SET_CLEAR_ECC, SET_AM, SET_CAA, SET_AUTO_BOOST, SET_GOM, SET_RESET };

struct set_cmd {
    enum set_kind kind;
    unsigned value;             /* PM, ECC, AM, AUTO_BOOST: 0/1; CM: nvmlComputeMode_t; PL: milliwatts;
                                   LGC, LMC: min MHz; AC: memory MHz; CLEAR_ECC: nvmlEccCounterType_t;
                                   GOM: nvmlGpuOperationMode_t */
    unsigned value2;            /* LGC, LMC: max MHz; AC: graphics MHz */
    char lgc_text[2][16];       /* LGC, LMC: the values as given ("1500", "tdp"), as the tool echoes them */
};

int parse_enable(const char *v, unsigned *out);
int set_parse(int argc, char **argv, int *i, struct set_cmd *c);
int cmd_set(const struct set_cmd *c);

/* ---- the command line (smi_main.c) ------------------------------------------------------ */

const char *opt_value(int argc, char **argv, int *i, const char *longname, const char *shortname);
int is_opt(const char *a, const char *longname, const char *shortname);

#endif
