/* nvidia-smi's values: the shapes of getter that fields.yaml's rows name, for the generated
   dispatch (smi_values_gen.c) and the getters written by hand (smi_values.c).

   A shape expands inside value(d, key, out, n): it calls NVML for GPU d, writes the value into
   out and answers V_OK, or answers the NVML error as V_NA / V_DEPRECATED (from()). An UPPERCASE
   shape is a macro, since the NVML getter it calls is an argument; every output of an NVML call
   is read after the call (a by-value argument could be read before). */
#ifndef SMI_VALUES_H
#define SMI_VALUES_H

#include "smi.h"

enum vr from(nvmlReturn_t r);
__attribute__((format(printf, 3, 4))) enum vr put(char *out, size_t n, const char *fmt, ...);

/* A string getter: f(h, ARGS..., out, n). */
#define STR(f, ...) from(NV(f, d->h, ##__VA_ARGS__, out, (unsigned)(n)))
/* A string getter that takes no length (its buffer has NVML's fixed size, which out has). */
#define STR_UNSIZED(f) from(NV(f, d->h, out))
/* One scalar output of `type` (an unsigned or an enum: 4 bytes; or unsigned long long), printed
   with fmt: f(h, ARGS..., &v). */
#define SCALAR(type, fmt, f, ...)                                                                 \
    ({                                                                                            \
        type v_ = 0;                                                                              \
        nvmlReturn_t r_ = NV(f, d->h, ##__VA_ARGS__, (void *)&v_);                                \
        r_ == NVML_SUCCESS ? put(out, n, fmt, v_) : from(r_);                                     \
    })
#define U32(f, ...) SCALAR(unsigned, "%u", f, ##__VA_ARGS__)
/* Milliwatts, printed as watts with two decimals. */
#define WATTS(f, ...)                                                                             \
    ({                                                                                            \
        unsigned mw_ = 0;                                                                         \
        nvmlReturn_t r_ = NV(f, d->h, ##__VA_ARGS__, &mw_);                                       \
        r_ == NVML_SUCCESS ? put(out, n, "%u.%02u", mw_ / 1000, (mw_ % 1000) / 10) : from(r_);    \
    })
/* An enumerated output as the tool's word for it: word(v), NULL for no word (N/A). */
#define WORD(f, word)                                                                             \
    ({                                                                                            \
        unsigned v_ = 0;                                                                          \
        nvmlReturn_t r_ = NV(f, d->h, (void *)&v_);                                               \
        const char *w_ = r_ == NVML_SUCCESS ? word(v_) : NULL;                                    \
        r_ != NVML_SUCCESS ? from(r_) : w_ ? put(out, n, "%s", w_) : V_NA;                        \
    })
/* An engine's utilization (f(h, &percent, &sampling period)). */
#define UTILIZATION(f)                                                                            \
    ({                                                                                            \
        unsigned u_ = 0, period_ = 0;                                                             \
        nvmlReturn_t r_ = NV(f, d->h, &u_, &period_);                                             \
        r_ == NVML_SUCCESS ? put(out, n, "%u", u_) : from(r_);                                    \
    })
/* One member of what NVML getter f fills (its struct, or the outputs of a getter of several, in
   a struct of smi_values.c: fill_f); `expr` is the member, with any arithmetic on it
   ("total >> 20"). */
#define MEMBER(f, fmt, expr)                                                                      \
    ({                                                                                            \
        nvmlReturn_t r_ = NVML_SUCCESS;                                                           \
        __typeof__(fill_##f(d, &r_)) s_ = fill_##f(d, &r_);                                       \
        r_ == NVML_SUCCESS ? put(out, n, fmt, s_.expr) : from(r_);                                \
    })
/* One field value (nvmlDeviceGetFieldValues) divided by `scale`. */
#define FIELD(id, fmt, scale)                                                                     \
    ({                                                                                            \
        unsigned long long v_ = 0;                                                                \
        nvmlReturn_t r_ = field_u64(d, (id), &v_);                                                \
        r_ == NVML_SUCCESS ? put(out, n, fmt, v_ / (scale)) : from(r_);                           \
    })
/* One field value as the tool's word for it. */
#define FIELD_WORD(id, word)                                                                      \
    ({                                                                                            \
        unsigned long long v_ = 0;                                                                \
        nvmlReturn_t r_ = field_u64(d, (id), &v_);                                                \
        const char *w_ = r_ == NVML_SUCCESS ? word(v_) : NULL;                                    \
        r_ != NVML_SUCCESS ? from(r_) : w_ ? put(out, n, "%s", w_) : V_NA;                        \
    })
/* A string of GPU d the daemon publishes in the shared state, for what NVML has no call for. */
#define STATE(member) (STATE_STRING(d->index, member, out, n) ? V_OK : V_NA)
/* A value of the run (driver, CUDA version, GPU count, index). */
#define TEXT(fmt, expr) put(out, n, fmt, expr)

nvmlReturn_t field_u64(const struct dev *d, unsigned id, unsigned long long *v);

/* The tool's words for enumerated values; NULL where it has none. */
const char *enabled_word(unsigned long long v);
const char *yes_no_word(unsigned long long v);
const char *supported_word(unsigned long long v);
const char *arch_name(unsigned long long a);
const char *brand_name(unsigned long long b);
const char *compute_mode_name(unsigned long long m);
const char *virtualization_word(unsigned long long m);
const char *recovery_action_word(unsigned long long a);

/* What MEMBER reads: the outputs of one NVML getter, its error in *r. */
nvmlPciInfo_t fill_nvmlDeviceGetPciInfo_v3(const struct dev *d, nvmlReturn_t *r);
nvmlPciInfoExt_t fill_nvmlDeviceGetPciInfoExt(const struct dev *d, nvmlReturn_t *r);
nvmlMemory_v2_t fill_nvmlDeviceGetMemoryInfo_v2(const struct dev *d, nvmlReturn_t *r);
nvmlBAR1Memory_t fill_nvmlDeviceGetBAR1MemoryInfo(const struct dev *d, nvmlReturn_t *r);
nvmlUtilization_t fill_nvmlDeviceGetUtilizationRates(const struct dev *d, nvmlReturn_t *r);
struct ecc_mode { nvmlEnableState_t current, pending; };
struct ecc_mode fill_nvmlDeviceGetEccMode(const struct dev *d, nvmlReturn_t *r);
struct remapped_rows { unsigned correctable, uncorrectable, pending, failure; };
struct remapped_rows fill_nvmlDeviceGetRemappedRows(const struct dev *d, nvmlReturn_t *r);
nvmlMarginTemperature_t fill_nvmlDeviceGetMarginTemperature(const struct dev *d, nvmlReturn_t *r);
nvmlPdi_t fill_nvmlDeviceGetPdi(const struct dev *d, nvmlReturn_t *r);
nvmlC2cModeInfo_v1_t fill_nvmlDeviceGetC2cModeInfoV(const struct dev *d, nvmlReturn_t *r);
nvmlMemory_t fill_nvmlDeviceGetConfComputeProtectedMemoryUsage(const struct dev *d, nvmlReturn_t *r);
struct encoder_stats { unsigned sessions, fps, latency; };
struct encoder_stats fill_nvmlDeviceGetEncoderStats(const struct dev *d, nvmlReturn_t *r);
nvmlFBCStats_t fill_nvmlDeviceGetFBCStats(const struct dev *d, nvmlReturn_t *r);
nvmlEccSramErrorStatus_t fill_nvmlDeviceGetSramEccErrorStatus(const struct dev *d, nvmlReturn_t *r);
nvmlRepairStatus_t fill_nvmlDeviceGetRepairStatus(const struct dev *d, nvmlReturn_t *r);
nvmlRowRemapperHistogramValues_t fill_nvmlDeviceGetRowRemapperHistogram(const struct dev *d, nvmlReturn_t *r);
nvmlDeviceCapabilities_t fill_nvmlDeviceGetCapabilities(const struct dev *d, nvmlReturn_t *r);
nvmlRemappedRowsInfo_v2_t fill_nvmlDeviceGetRemappedRows_v2(const struct dev *d, nvmlReturn_t *r);
nvmlUnrepairableMemoryStatus_v1_t fill_nvmlDeviceGetUnrepairableMemoryFlag_v1(const struct dev *d, nvmlReturn_t *r);

/* Getters of more than one call or output: (d, out, n, ARGS...) as value(). */
enum vr csv_timestamp(const struct dev *d, char *out, size_t n);
enum vr mig_mode(const struct dev *d, char *out, size_t n, int pending);
enum vr addressing_mode(const struct dev *d, char *out, size_t n);
enum vr inforom_valid(const struct dev *d, char *out, size_t n);
enum vr voltage(const struct dev *d, char *out, size_t n);
enum vr gsp_mode(const struct dev *d, char *out, size_t n, int by_default);
enum vr compute_cap(const struct dev *d, char *out, size_t n);
enum vr pstate(const struct dev *d, char *out, size_t n);
enum vr reason(const struct dev *d, char *out, size_t n, unsigned long long bit);
enum vr retired(const struct dev *d, char *out, size_t n, nvmlPageRetirementCause_t cause);
enum vr temp_tlimit(const struct dev *d, char *out, size_t n, unsigned field);
enum vr power_limit_range(const struct dev *d, char *out, size_t n, int max);
enum fabric_part { FABRIC_STATE, FABRIC_STATUS, FABRIC_CLIQUE_ID, FABRIC_CLUSTER_UUID };
enum vr fabric(const struct dev *d, char *out, size_t n, enum fabric_part part);
enum fabric_health_part { HEALTH_SUMMARY, HEALTH_BANDWIDTH, HEALTH_ROUTE_RECOVERY, HEALTH_ROUTE_UNHEALTHY,
                          HEALTH_ACCESS_TIMEOUT_RECOVERY, HEALTH_INCORRECT_CONFIGURATION };
enum vr fabric_health(const struct dev *d, char *out, size_t n, enum fabric_health_part part);

#endif
