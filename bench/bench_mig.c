/* MIG in NVML, side by side in one run: a getter on a MIG device handle beside the
   same getter on a GPU handle (ns per call), and making and taking down a full 7-instance layout
   (seven 1g.10gb GPU instances, each with its compute instance: 14 creates, then 14 destroys,
   each a command to the daemon answered once published).
   Usage: bench_mig   (MOKKA_STATE and LD_LIBRARY_PATH point at the node; run as root). */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define CALLS 500000
#define ROUNDS 5
#define LAYOUTS 30
#define SEVEN 7

/* percentiles in ms */
static void report(const char *what, double *v, int n)
{
    report_percentiles(what, 52, v, n, 1e6, "ms", 2);
}

#define CHECK(call)                                                                \
    do {                                                                           \
        nvmlReturn_t r_ = (call);                                                  \
        if (r_ != NVML_SUCCESS) {                                                  \
            fprintf(stderr, "%s: %s\n", #call, nvmlErrorString(r_));               \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

int main(void)
{
    nvmlDevice_t gpu0, gpu1, mig;
    CHECK(nvmlInit_v2());
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &gpu0));
    CHECK(nvmlDeviceGetHandleByIndex_v2(1, &gpu1));
    nvmlReturn_t activation;
    CHECK(nvmlDeviceSetMigMode(gpu1, NVML_DEVICE_MIG_ENABLE, &activation));
    nvmlGpuInstanceProfileInfo_v2_t gp = {.version = nvmlGpuInstanceProfileInfo_v2};
    CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(gpu1, NVML_GPU_INSTANCE_PROFILE_1_SLICE, &gp));

    /* getters: GPU 0's handle (MIG off) beside a MIG device of GPU 1 */
    nvmlGpuInstance_t gi;
    nvmlComputeInstance_t ci;
    CHECK(nvmlDeviceCreateGpuInstance(gpu1, gp.id, &gi));
    CHECK(nvmlGpuInstanceCreateComputeInstance(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &ci));
    CHECK(nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0, &mig));
    nvmlMemory_t mem;
    char text[96];
    unsigned int u;
    nvmlDeviceAttributes_t attrs;
    double t0, per[2];
    /* Rounds alternate between the two handles and the best round of each is kept: on a shared
       machine that is the call's cost, not its neighbours'. */
#define SIDE_BY_SIDE(name, call_on)                                                 \
    per[0] = per[1] = 1e18;                                                         \
    for (int round = 0; round < 2 * ROUNDS; round++) {                              \
        int k = round % 2;                                                          \
        nvmlDevice_t d = k ? mig : gpu0;                                            \
        t0 = now_ns();                                                              \
        for (int i = 0; i < CALLS; i++)                                             \
            call_on;                                                                \
        double t = (now_ns() - t0) / CALLS;                                         \
        per[k] = t < per[k] ? t : per[k];                                           \
    }                                                                               \
    printf("%-34s GPU %6.1f ns   MIG device %6.1f ns   (x%.2f)\n", name, per[0], per[1], per[1] / per[0]);
    SIDE_BY_SIDE("nvmlDeviceGetMemoryInfo", nvmlDeviceGetMemoryInfo(d, &mem))
    SIDE_BY_SIDE("nvmlDeviceGetName", nvmlDeviceGetName(d, text, sizeof(text)))
    SIDE_BY_SIDE("nvmlDeviceGetUUID", nvmlDeviceGetUUID(d, text, sizeof(text)))
    SIDE_BY_SIDE("nvmlDeviceGetAttributes_v2", nvmlDeviceGetAttributes_v2(d, &attrs))
    SIDE_BY_SIDE("nvmlDeviceIsMigDeviceHandle", nvmlDeviceIsMigDeviceHandle(d, &u))
    CHECK(nvmlComputeInstanceDestroy(ci));
    CHECK(nvmlGpuInstanceDestroy(gi));

    /* a full layout, made and taken down */
    static double made[LAYOUTS], gone[LAYOUTS];
    nvmlGpuInstance_t gis[SEVEN];
    nvmlComputeInstance_t cis[SEVEN];
    for (int t = 0; t < LAYOUTS; t++) {
        t0 = now_ns();
        for (int k = 0; k < SEVEN; k++) {
            CHECK(nvmlDeviceCreateGpuInstance(gpu1, gp.id, &gis[k]));
            CHECK(nvmlGpuInstanceCreateComputeInstance(gis[k], NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &cis[k]));
        }
        made[t] = now_ns() - t0;
        t0 = now_ns();
        for (int k = 0; k < SEVEN; k++) {
            CHECK(nvmlComputeInstanceDestroy(cis[k]));
            CHECK(nvmlGpuInstanceDestroy(gis[k]));
        }
        gone[t] = now_ns() - t0;
    }
    report("7 x 1g.10gb GPU + compute instances created", made, LAYOUTS);
    report("... and destroyed", gone, LAYOUTS);
    for (int t = 0; t < LAYOUTS; t++)
        made[t] /= 2 * SEVEN;
    report("  per create call", made, LAYOUTS);
    CHECK(nvmlDeviceSetMigMode(gpu1, NVML_DEVICE_MIG_DISABLE, &activation));
    nvmlShutdown();
    return 0;
}
