/* Times libcuda.so.1 against a mounted node (MOKKA_STATE set by bench_cuda.py):
   cuInit + enumeration in a freshly loaded library, a cuMemAlloc_v2/cuMemFree_v2 pair, and a
   first context and allocation on a GPU (the daemon round trips). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"

typedef int (*fn_i)(unsigned);
#define MAX_FIRST 64
#define SYM(h, name) ((int (*)())dlsym((h), (name)))

int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libcuda.so.1";
    enum { RUNS = 200 };
    static double t[RUNS];
    int count = 0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_ns();
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h || SYM(h, "cuInit")(0) != 0) {
            fprintf(stderr, "cuInit failed\n");
            return 1;
        }
        SYM(h, "cuDeviceGetCount")(&count);
        for (int i = 0; i < count; i++) {
            int dev, v;
            char name[96], bus[16], uuid[16];
            size_t mem;
            SYM(h, "cuDeviceGet")(&dev, i);
            SYM(h, "cuDeviceGetName")(name, 96, dev);
            SYM(h, "cuDeviceGetUuid_v2")(uuid, dev);
            SYM(h, "cuDeviceTotalMem_v2")(&mem, dev);
            SYM(h, "cuDeviceGetAttribute")(&v, 75, dev);
            SYM(h, "cuDeviceGetAttribute")(&v, 76, dev);
            SYM(h, "cuDeviceGetAttribute")(&v, 16, dev);
            SYM(h, "cuDeviceGetPCIBusId")(bus, 16, dev);
        }
        t[r] = now_ns() - t0;
        dlclose(h);
    }
    sort_doubles(t, RUNS);
    printf("| cuInit + enumeration of %d GPUs (fresh dlopen) | p50 %.0f us, p99 %.0f us | <= 2000 us |\n", count,
           t[RUNS / 2] / 1e3, t[RUNS * 99 / 100] / 1e3);

    void *h = dlopen(lib, RTLD_NOW);
    void *ctx;
    unsigned long long p;
    SYM(h, "cuInit")(0);
    if (SYM(h, "cuCtxCreate_v2")(&ctx, 0, 0) != 0) {
        fprintf(stderr, "cuCtxCreate failed\n");
        return 1;
    }
    int (*alloc)(unsigned long long *, size_t) = (void *)dlsym(h, "cuMemAlloc_v2");
    int (*release)(unsigned long long) = (void *)dlsym(h, "cuMemFree_v2");
    enum { PAIRS = 1000000 };
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
        if (alloc(&p, 1 << 20) != 0 || release(p) != 0) {
            fprintf(stderr, "alloc/free failed\n");
            return 1;
        }
    }
    double pair = (now_ns() - t0) / PAIRS;
    printf("| cuMemAlloc_v2 + cuMemFree_v2 (1 MiB) | %.0f ns/pair | <= 2000 ns |\n", pair);

    /* A first context and a first allocation on a GPU each wait for the daemon to fold the
       process into NVML (two round trips); later ones are stores into the process's record. */
    static double first[MAX_FIRST];
    int n = 0;
    for (int dev = 1; dev < count && n < MAX_FIRST; dev++, n++) {
        void *c;
        double f0 = now_ns();
        if (SYM(h, "cuCtxCreate_v2")(&c, 0, dev) != 0 || alloc(&p, 1 << 20) != 0) {
            fprintf(stderr, "first context/alloc failed\n");
            return 1;
        }
        first[n] = now_ns() - f0;
    }
    if (n) {
        sort_doubles(first, (size_t)n);
        printf("| first cuCtxCreate_v2 + cuMemAlloc_v2 on a GPU (daemon folds) | p50 %.0f us over %d GPUs | <= 200000 us |\n",
               first[n / 2] / 1e3, n);
    }
    return 0;
}
