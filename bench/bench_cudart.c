/* One measurement of the CUDA runtime beside the driver API, per process (the runtime initialises
   once per process, so bench_cudart.py runs this afresh for every sample):
     driver-init LIBCUDA     dlopen + cuInit + cuDeviceGetCount, ns; then the dlopen alone
     runtime-init LIBCUDART  dlopen + cudaGetDeviceCount (the runtime's whole init), ns; then the
                             dlopen alone (libcudart's own loading, which no driver can shorten)
     driver-pair LIBCUDA     a cuMemAlloc_v2 + cuMemFree_v2 pair (1 MiB) in a primary context, ns
     runtime-pair LIBCUDART  a cudaMalloc + cudaFree pair (1 MiB) on device 0, ns */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "bench.h"

#define SYM(h, name) ((int (*)())dlsym((h), (name)))
enum { PAIRS = 200000 };

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const char *mode = argv[1];
    int n = -1;
    double t0 = now_ns();
    void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    double loaded = now_ns() - t0; /* the library's own loading, before any driver call */
    if (strcmp(mode, "driver-init") == 0 || strcmp(mode, "driver-pair") == 0) {
        if (SYM(h, "cuInit")(0) != 0 || SYM(h, "cuDeviceGetCount")(&n) != 0)
            return 1;
        if (mode[7] == 'i') {
            printf("%.0f %.0f %d\n", now_ns() - t0, loaded, n);
            return 0;
        }
        void *ctx;
        unsigned long long p;
        if (SYM(h, "cuDevicePrimaryCtxRetain")(&ctx, 0) != 0 || SYM(h, "cuCtxSetCurrent")(ctx) != 0)
            return 1;
        int (*alloc)(unsigned long long *, size_t) = (void *)dlsym(h, "cuMemAlloc_v2");
        int (*release)(unsigned long long) = (void *)dlsym(h, "cuMemFree_v2");
        alloc(&p, 1 << 20), release(p); /* the first allocation waits for the daemon's fold */
        t0 = now_ns();
        for (int i = 0; i < PAIRS; i++)
            if (alloc(&p, 1 << 20) != 0 || release(p) != 0)
                return 1;
        printf("%.1f\n", (now_ns() - t0) / PAIRS);
        return 0;
    }
    if (SYM(h, "cudaGetDeviceCount")(&n) != 0)
        return 1;
    if (strcmp(mode, "runtime-init") == 0) {
        printf("%.0f %.0f %d\n", now_ns() - t0, loaded, n);
        return 0;
    }
    void *p;
    int (*alloc)(void **, size_t) = (void *)dlsym(h, "cudaMalloc");
    int (*release)(void *) = (void *)dlsym(h, "cudaFree");
    if (SYM(h, "cudaSetDevice")(0) != 0 || alloc(&p, 1 << 20) != 0 || release(p) != 0)
        return 1;
    t0 = now_ns();
    for (int i = 0; i < PAIRS; i++)
        if (alloc(&p, 1 << 20) != 0 || release(p) != 0)
            return 1;
    printf("%.1f\n", (now_ns() - t0) / PAIRS);
    return 0;
}
