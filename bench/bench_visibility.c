/* The getter path and the cost of deciding visibility (docs/containers.md), for one library:
   ns per call of three getters (best of ROUNDS rounds of CALLS), and nvmlInit_v2 + nvmlShutdown
   (each init decides the view again). One line, `key=value` pairs, for bench_visibility.py.
   Usage: bench_visibility LIBNVIDIA-ML   (MOKKA_STATE points at the node). */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "bench.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define CALLS 400000
#define ROUNDS 5
#define INITS 2000

typedef nvmlReturn_t (*init_fn)(void);
typedef nvmlReturn_t (*count_fn)(unsigned *);
typedef nvmlReturn_t (*handle_fn)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*temp_fn)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned *);
typedef nvmlReturn_t (*power_fn)(nvmlDevice_t, unsigned *);
typedef nvmlReturn_t (*mem_fn)(nvmlDevice_t, nvmlMemory_t *);

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "%s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBNVIDIA-ML\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    init_fn init = (init_fn)sym(lib, "nvmlInit_v2"), shutdown = (init_fn)sym(lib, "nvmlShutdown");
    count_fn count = (count_fn)sym(lib, "nvmlDeviceGetCount_v2");
    handle_fn handle = (handle_fn)sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    temp_fn temp = (temp_fn)sym(lib, "nvmlDeviceGetTemperature");
    power_fn power = (power_fn)sym(lib, "nvmlDeviceGetPowerUsage");
    mem_fn mem = (mem_fn)sym(lib, "nvmlDeviceGetMemoryInfo");
    unsigned n = 0;
    nvmlDevice_t dev;
    if (init() != NVML_SUCCESS || count(&n) != NVML_SUCCESS || n == 0 || handle(0, &dev) != NVML_SUCCESS) {
        fprintf(stderr, "no device: is MOKKA_STATE set, and a GPU node in /dev?\n");
        return 1;
    }
    double best[3] = {1e30, 1e30, 1e30};
    for (int r = 0; r < ROUNDS; r++) {
        unsigned v;
        nvmlMemory_t m;
        double t0 = now_ns();
        for (int i = 0; i < CALLS; i++)
            temp(dev, NVML_TEMPERATURE_GPU, &v);
        double t1 = now_ns();
        for (int i = 0; i < CALLS; i++)
            power(dev, &v);
        double t2 = now_ns();
        for (int i = 0; i < CALLS; i++)
            mem(dev, &m);
        double t3 = now_ns();
        double d[3] = {(t1 - t0) / CALLS, (t2 - t1) / CALLS, (t3 - t2) / CALLS};
        for (int k = 0; k < 3; k++)
            best[k] = d[k] < best[k] ? d[k] : best[k];
    }
    shutdown();
    static double lat[INITS];
    for (int i = 0; i < INITS; i++) {
        double t0 = now_ns();
        init();
        shutdown();
        lat[i] = now_ns() - t0;
    }
    sort_doubles(lat, INITS);
    printf("gpus=%u temperature_ns=%.2f power_ns=%.2f memory_ns=%.2f init_p50_us=%.2f init_p99_us=%.2f\n", n,
           best[0], best[1], best[2], lat[INITS / 2] / 1e3, lat[INITS * 99 / 100] / 1e3);
    return 0;
}
