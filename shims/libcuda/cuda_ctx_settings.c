/*
 * Context settings the CUDA runtime reads: stream priorities, limits (CUlimit, settable and read
 * back per process), cache and shared-memory configs, context ids, peer access and P2P
 * attributes; the profiler's no-ops; CUDA 13's context-taking variants.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <pthread.h>

int cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);

enum { CUDA_ERROR_UNSUPPORTED_LIMIT = 215 };


CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    CUdevice dev;
    CUresult r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return CUDA_SUCCESS;
}

/* CUlimit: the driver's defaults, settable (and read back) per process. */
static size_t g_limits[10] = {1024, 1u << 20, 8u << 20, 2, 2048, 64, 0, 0, 0, 0};
static pthread_mutex_t g_limit_lock = PTHREAD_MUTEX_INITIALIZER;

CUresult cuCtxGetLimit(size_t *pvalue, unsigned limit)
{
    if (!pvalue)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    CUresult r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (limit >= sizeof(g_limits) / sizeof(g_limits[0]))
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    pthread_mutex_lock(&g_limit_lock);
    *pvalue = g_limits[limit];
    pthread_mutex_unlock(&g_limit_lock);
    return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(unsigned limit, size_t value)
{
    CUdevice dev;
    CUresult r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (limit >= sizeof(g_limits) / sizeof(g_limits[0]))
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    pthread_mutex_lock(&g_limit_lock);
    g_limits[limit] = value;
    pthread_mutex_unlock(&g_limit_lock);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCacheConfig(unsigned *pconfig)
{
    if (!pconfig)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    *pconfig = 0; /* CU_FUNC_CACHE_PREFER_NONE */
    return mokka_current_device(&dev);
}

CUresult cuCtxSetCacheConfig(unsigned config)
{
    CUdevice dev;
    return config > 3 ? CUDA_ERROR_INVALID_VALUE : mokka_current_device(&dev);
}

CUresult cuCtxGetSharedMemConfig(unsigned *pConfig)
{
    if (!pConfig)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    *pConfig = 1; /* CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE */
    return mokka_current_device(&dev);
}

CUresult cuCtxSetSharedMemConfig(unsigned config)
{
    CUdevice dev;
    return config > 2 ? CUDA_ERROR_INVALID_VALUE : mokka_current_device(&dev);
}

CUresult cuCtxResetPersistingL2Cache(void)
{
    CUdevice dev;
    return mokka_current_device(&dev);
}

/* A context's unique id: its handle, which is never reused while the process lives... but a
   primary context's is one for life, as the driver's. */
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    if (!ctxId)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx)
        ctx = mokka_current_or_null();
    CUdevice dev;
    if (!ctx || !mokka_ctx_device(ctx, &dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    *ctxId = (unsigned long long)(uintptr_t)ctx & 0xFFFFFFFFFFFFull;
    return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    CUdevice peer, dev;
    if (Flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mokka_ctx_device(peerContext, &peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    return mokka_current_device(&dev);
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CUdevice peer, dev;
    if (!mokka_ctx_device(peerContext, &peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    return mokka_current_device(&dev);
}

CUresult cuDeviceGetP2PAttribute(int *value, int attrib, CUdevice srcDevice, CUdevice dstDevice)
{
    if (!value || srcDevice == dstDevice)
        return CUDA_ERROR_INVALID_DEVICE;
    int count = 0, r = cuDeviceGetAttribute(&count, 16, srcDevice);
    if (r != CUDA_SUCCESS || (r = cuDeviceGetAttribute(&count, 16, dstDevice)) != CUDA_SUCCESS)
        return r;
    switch (attrib) {
    case 1: *value = 0; break;        /* PERFORMANCE_RANK */
    case 2: case 3: case 4: *value = 1; break; /* ACCESS, NATIVE_ATOMIC, CUDA_ARRAY_ACCESS */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuProfilerStart(void) { return CUDA_SUCCESS; }
CUresult cuProfilerStop(void) { return CUDA_SUCCESS; }

/* ---- CUDA 13's context-taking variants ------------------------------------------------------ */

int cuCtxSynchronize(void);

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx)
        return mokka_current_device(device);
    return mokka_ctx_device(ctx, device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    CUdevice dev;
    if (!ctx)
        return cuCtxSynchronize();
    return mokka_ctx_device(ctx, &dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
