/*
 * The memory the CUDA runtime asks for beyond cuMemAlloc (cuda_memory.c): pinned host, managed,
 * pitched and stream-ordered memory, prefetches and advice, pointer attributes; and copies and
 * memsets, all synchronous: device memory is host memory of this process (cuda_memory.c's
 * windows), so a copy is a memcpy, done at once, and an asynchronous one is done before it
 * returns (its stream is checked, cuda_runtime.c's).
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>


CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    return mokka_mem_alloc((CUdeviceptr *)pp, bytesize, MOKKA_MEM_HOST);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (Flags & ~0xFu) /* PORTABLE, DEVICEMAP, WRITECOMBINED and 0x8 */
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemAllocHost_v2(pp, bytesize);
}

CUresult cuMemFreeHost(void *p)
{
    if (!p) /* no "NULL is nothing to free" here, unlike cuMemFree */
        return CUDA_ERROR_INVALID_VALUE;
    return mokka_mem_free((CUdeviceptr)(uintptr_t)p, MOKKA_MEM_HOST);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != 1 && flags != 2) /* CU_MEM_ATTACH_GLOBAL or _HOST */
        return CUDA_ERROR_INVALID_VALUE;
    return mokka_mem_alloc(dptr, bytesize, MOKKA_MEM_MANAGED);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    if (!pPitch || !WidthInBytes || !Height || (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511; /* TEXTURE_PITCH_ALIGNMENT-friendly */
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = mokka_mem_alloc(dptr, pitch * Height, MOKKA_MEM_DEVICE);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : mokka_mem_alloc(dptr, bytesize, MOKKA_MEM_DEVICE);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : mokka_mem_free(dptr, MOKKA_MEM_DEVICE);
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    struct mokka_range r;
    if (!pdptr || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mokka_mem_find((uint64_t)(uintptr_t)p, 0, &r) || r.kind != MOKKA_MEM_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    struct mokka_range r;
    if (!pFlags || !mokka_mem_find((uint64_t)(uintptr_t)p, 0, &r) || r.kind != MOKKA_MEM_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    *pFlags = 0x2; /* DEVICEMAP: every pinned allocation is mapped under unified addressing */
    return CUDA_SUCCESS;
}

/* Registering host memory pins nothing here; the pages are the program's own already. */
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    (void)Flags;
    return p && bytesize ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemHostUnregister(void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    struct mokka_range r;
    if (!mokka_mem_find(dptr, 0, &r) || r.kind == MOKKA_MEM_HOST)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = r.ptr;
    if (psize)
        *psize = r.size;
    return CUDA_SUCCESS;
}

/* One pointer attribute into data; 0 on success, else the error. `known`: ptr is ours. */
static CUresult pointer_attribute(void *data, unsigned attribute, CUdeviceptr ptr, const struct mokka_range *r, int known)
{
    unsigned type = !known ? 0 : r->kind == MOKKA_MEM_HOST ? 1 : 2; /* CU_MEMORYTYPE_HOST/DEVICE */
    int ordinal = -2;
    if (known) {
        CUdevice dev;
        ordinal = mokka_ctx_device(r->ctx, &dev) ? dev : -2;
    }
    switch (attribute) {
    case 1: *(CUcontext *)data = known ? r->ctx : NULL; break;                 /* CONTEXT */
    case 2: *(unsigned *)data = type; break;                                    /* MEMORY_TYPE */
    case 3: *(CUdeviceptr *)data = known ? ptr : 0; break;                      /* DEVICE_POINTER */
    case 4: *(void **)data = known && r->kind != MOKKA_MEM_DEVICE ? (void *)(uintptr_t)ptr : NULL; break;
    case 5: memset(data, 0, 16); break;                                         /* P2P_TOKENS */
    case 6: *(int *)data = 0; break;                                            /* SYNC_MEMOPS */
    case 7: *(unsigned long long *)data = known ? r->ptr : 0; break;            /* BUFFER_ID */
    case 8: *(int *)data = known && r->kind == MOKKA_MEM_MANAGED; break;        /* IS_MANAGED */
    case 9: *(int *)data = ordinal; break;                                      /* DEVICE_ORDINAL */
    case 10: *(int *)data = known && r->kind == MOKKA_MEM_DEVICE; break;        /* IS_LEGACY_CUDA_IPC_CAPABLE */
    case 11: *(CUdeviceptr *)data = known ? r->ptr : 0; break;                  /* RANGE_START_ADDR */
    case 12: *(size_t *)data = known ? r->size : 0; break;                      /* RANGE_SIZE */
    case 13: *(int *)data = known; break;                                       /* MAPPED */
    case 14: *(unsigned long long *)data = 0; break;                            /* ALLOWED_HANDLE_TYPES */
    case 15: *(int *)data = known && r->kind == MOKKA_MEM_DEVICE; break;        /* IS_GPU_DIRECT_RDMA_CAPABLE */
    case 16: *(unsigned long long *)data = known ? 3 : 0; break;                /* ACCESS_FLAGS: read-write */
    case 17: *(void **)data = NULL; break;                                      /* MEMPOOL_HANDLE */
    case 18: *(size_t *)data = known ? r->size : 0; break;                      /* MAPPING_SIZE */
    case 19: *(CUdeviceptr *)data = known ? r->ptr : 0; break;                  /* MAPPING_BASE_ADDR */
    case 20: *(unsigned long long *)data = known ? r->ptr : 0; break;           /* MEMORY_BLOCK_ID */
    case 21: *(int *)data = 0; break;                                           /* IS_HW_DECOMPRESS_CAPABLE */
    case 22: *(int *)data = -1; break;                                          /* LOCALITY_DOMAIN_ORDINAL */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, unsigned attribute, CUdeviceptr ptr)
{
    struct mokka_range r;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mokka_mem_find(ptr, 0, &r)) /* the driver knows nothing of this address */
        return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attribute, ptr, &r, 1);
}

/* Unlike the single query, an unknown pointer is no error: its memory type is 0 (what the runtime
   calls cudaMemoryTypeUnregistered). */
CUresult cuPointerGetAttributes(unsigned int numAttributes, unsigned *attributes, void **data, CUdeviceptr ptr)
{
    struct mokka_range r;
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    int known = mokka_mem_find(ptr, 0, &r);
    for (unsigned i = 0; i < numAttributes; i++) {
        if (!data[i])
            continue;
        CUresult e = pointer_attribute(data[i], attributes[i], ptr, &r, known);
        if (e != CUDA_SUCCESS)
            return e;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, int advice, int location) /* 13.x: a struct */
{
    (void)advice, (void)location;
    return mokka_mem_find(devPtr, count, NULL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, int advice, CUdevice device)
{
    (void)advice, (void)device;
    return mokka_mem_find(devPtr, count, NULL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream)
{
    (void)dstDevice;
    CUresult r = mokka_stream_ok(hStream);
    if (r != CUDA_SUCCESS)
        return r;
    return mokka_mem_find(devPtr, count, NULL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

struct mem_location { /* CUmemLocation */
    int type, id;
};

CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, struct mem_location location, unsigned int flags,
                               CUstream hStream)
{
    (void)location, (void)flags;
    return cuMemPrefetchAsync(devPtr, count, 0, hStream);
}

/* ---- copies and memsets ------------------------------------------------------------------- */

/* [p, p + n) on the device side of a copy: inside one live allocation of ours (device, managed
   or pinned host memory, all addressable under unified addressing). */
static CUresult device_range(CUdeviceptr p, size_t n)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return mokka_mem_find(p, n, NULL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Either side of a cuMemcpy (unified addressing): one of our allocations (SUCCESS), or else host
   memory of the program's (pageable: HOST_SIDE), which copy() reaches without trusting it. */
#define HOST_SIDE (-1)
static CUresult any_range(CUdeviceptr p, size_t n)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (mokka_mem_find(p, n, NULL))
        return CUDA_SUCCESS;
    return mokka_device_address(p) ? CUDA_ERROR_INVALID_VALUE : HOST_SIDE;
}

/* Copy n bytes. A side that is the program's own host memory (HOST_SIDE) may be any address: the
   kernel copies through process_vm_readv, so an unmapped one is INVALID_VALUE, not a fault in the
   host process. Where that call is refused (a seccomp filter), a plain memmove. */
static CUresult copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUresult rd, CUresult rs)
{
    if (rd != CUDA_SUCCESS && rd != HOST_SIDE)
        return rd;
    if (rs != CUDA_SUCCESS && rs != HOST_SIDE)
        return rs;
    CUdevice dev;
    CUresult r = mokka_current_device(&dev); /* a copy needs a context, as on the driver */
    if (r != CUDA_SUCCESS)
        return r;
    if (rd == HOST_SIDE || rs == HOST_SIDE) {
        int saved = errno;
        struct iovec local = {(void *)(uintptr_t)dst, n}, remote = {(void *)(uintptr_t)src, n};
        ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
        int err = errno;
        errno = saved;
        if (got == (ssize_t)n)
            return CUDA_SUCCESS;
        if (got >= 0 || err == EFAULT)
            return CUDA_ERROR_INVALID_VALUE;
        if ((uintptr_t)dst < 65536 || (uintptr_t)src < 65536) /* below mmap_min_addr: never mapped */
            return CUDA_ERROR_INVALID_VALUE;
    }
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

#define ZERO_OK(n)                                                   \
    do {                                                             \
        if ((n) == 0)                                                \
            return CUDA_SUCCESS;                                     \
    } while (0)

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    ZERO_OK(ByteCount);
    return copy(dst, src, ByteCount, any_range(dst, ByteCount), any_range(src, ByteCount));
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : cuMemcpy(dst, src, ByteCount);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    if (!srcHost)
        return CUDA_ERROR_INVALID_VALUE;
    ZERO_OK(ByteCount);
    return copy(dstDevice, (CUdeviceptr)(uintptr_t)srcHost, ByteCount, device_range(dstDevice, ByteCount),
                srcHost ? any_range((CUdeviceptr)(uintptr_t)srcHost, ByteCount) : CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    if (!dstHost)
        return CUDA_ERROR_INVALID_VALUE;
    ZERO_OK(ByteCount);
    return copy((CUdeviceptr)(uintptr_t)dstHost, srcDevice, ByteCount,
                dstHost ? any_range((CUdeviceptr)(uintptr_t)dstHost, ByteCount) : CUDA_ERROR_INVALID_VALUE,
                device_range(srcDevice, ByteCount));
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    ZERO_OK(ByteCount);
    return copy(dstDevice, srcDevice, ByteCount, device_range(dstDevice, ByteCount), device_range(srcDevice, ByteCount));
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                      size_t ByteCount)
{
    CUdevice d;
    if (!mokka_ctx_device(dstContext, &d) || !mokka_ctx_device(srcContext, &d))
        return CUDA_ERROR_INVALID_CONTEXT;
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                           size_t ByteCount, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : cuMemcpyPeer(dstDevice, dstContext, srcDevice, srcContext, ByteCount);
}

/* CUDA_MEMCPY2D (cuda.h): arrays are not supported (no CUDA arrays on this driver). */
struct memcpy2d {
    size_t srcXInBytes, srcY;
    unsigned srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    unsigned dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
};

/* The first byte and extent of one side of a 2D copy, checked. */
static CUresult side_2d(unsigned type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t pitch,
                        size_t width, size_t height, CUdeviceptr *start)
{
    if (type == 3) /* CU_MEMORYTYPE_ARRAY */
        return CUDA_ERROR_NOT_SUPPORTED;
    if (pitch < width && height > 1)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr base = type == 1 ? (CUdeviceptr)(uintptr_t)host : dev;
    if (type < 1 || type > 4 || !base)
        return CUDA_ERROR_INVALID_VALUE;
    *start = base + y * pitch + x;
    size_t extent = (height - 1) * pitch + width;
    if (type == 2)
        return device_range(*start, extent);
    return any_range(*start, extent); /* host or unified: ours, or the program's host memory */
}

CUresult cuMemcpy2D_v2(const struct memcpy2d *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (!p->WidthInBytes || !p->Height)
        return CUDA_SUCCESS;
    CUdeviceptr s, d;
    CUresult rs = side_2d(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, p->srcPitch,
                          p->WidthInBytes, p->Height, &s);
    if (rs != CUDA_SUCCESS && rs != HOST_SIDE)
        return rs;
    CUresult r = side_2d(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY, p->dstPitch,
                         p->WidthInBytes, p->Height, &d);
    CUresult rd = r;
    if (rs != CUDA_SUCCESS && rs != HOST_SIDE)
        return rs;
    if (rd != CUDA_SUCCESS && rd != HOST_SIDE)
        return rd;
    for (size_t row = 0; row < p->Height; row++) {
        CUresult e = copy(d + row * p->dstPitch, s + row * p->srcPitch, p->WidthInBytes, rd, rs);
        if (e != CUDA_SUCCESS)
            return e;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemcpy2DUnaligned_v2(const struct memcpy2d *p) { return cuMemcpy2D_v2(p); }

CUresult cuMemcpy2DAsync_v2(const struct memcpy2d *p, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    return r != CUDA_SUCCESS ? r : cuMemcpy2D_v2(p);
}

static CUresult memset_2d(CUdeviceptr dst, size_t pitch, unsigned value, unsigned elem, size_t width, size_t height)
{
    if (!width || !height)
        return CUDA_SUCCESS;
    if (dst % elem || (height > 1 && pitch < width * elem))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = device_range(dst, (height - 1) * pitch + width * elem);
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t row = 0; row < height; row++) {
        uint8_t *p = (uint8_t *)(uintptr_t)(dst + row * pitch);
        if (elem == 1) {
            memset(p, (int)(value & 0xFF), width);
        } else if (elem == 2) {
            uint16_t v = (uint16_t)value, *q = (uint16_t *)p;
            for (size_t i = 0; i < width; i++)
                q[i] = v;
        } else {
            uint32_t *q = (uint32_t *)p;
            for (size_t i = 0; i < width; i++)
                q[i] = value;
        }
    }
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char uc, size_t N) { return memset_2d(d, N, uc, 1, N, 1); }
CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short us, size_t N) { return memset_2d(d, N * 2, us, 2, N, 1); }
CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int ui, size_t N) { return memset_2d(d, N * 4, ui, 4, N, 1); }
CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char uc, size_t w, size_t h)
{
    return memset_2d(d, pitch, uc, 1, w, h);
}
CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short us, size_t w, size_t h)
{
    return memset_2d(d, pitch, us, 2, w, h);
}
CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int ui, size_t w, size_t h)
{
    return memset_2d(d, pitch, ui, 4, w, h);
}

#define ASYNC(call, s)                                               \
    do {                                                             \
        CUresult r_ = mokka_stream_ok(s);                                  \
        return r_ != CUDA_SUCCESS ? r_ : (call);                     \
    } while (0)

CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char uc, size_t N, CUstream s) { ASYNC(cuMemsetD8_v2(d, uc, N), s); }
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short us, size_t N, CUstream s) { ASYNC(cuMemsetD16_v2(d, us, N), s); }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int ui, size_t N, CUstream s) { ASYNC(cuMemsetD32_v2(d, ui, N), s); }
CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char uc, size_t w, size_t h, CUstream s)
{
    ASYNC(cuMemsetD2D8_v2(d, p, uc, w, h), s);
}
CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short us, size_t w, size_t h, CUstream s)
{
    ASYNC(cuMemsetD2D16_v2(d, p, us, w, h), s);
}
CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned int ui, size_t w, size_t h, CUstream s)
{
    ASYNC(cuMemsetD2D32_v2(d, p, ui, w, h), s);
}

/* ---- the per-thread-default-stream names of the same functions ---------------------------- */

MOKKA_ALIAS(cuMemcpy_ptds, cuMemcpy);
MOKKA_ALIAS(cuMemcpyAsync_ptsz, cuMemcpyAsync);
MOKKA_ALIAS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2);
MOKKA_ALIAS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2);
MOKKA_ALIAS(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD_v2);
MOKKA_ALIAS(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync_v2);
MOKKA_ALIAS(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync_v2);
MOKKA_ALIAS(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync_v2);
MOKKA_ALIAS(cuMemcpyPeer_ptds, cuMemcpyPeer);
MOKKA_ALIAS(cuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync);
MOKKA_ALIAS(cuMemcpy2D_v2_ptds, cuMemcpy2D_v2);
MOKKA_ALIAS(cuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned_v2);
MOKKA_ALIAS(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync_v2);
MOKKA_ALIAS(cuMemsetD8_v2_ptds, cuMemsetD8_v2);
MOKKA_ALIAS(cuMemsetD16_v2_ptds, cuMemsetD16_v2);
MOKKA_ALIAS(cuMemsetD32_v2_ptds, cuMemsetD32_v2);
MOKKA_ALIAS(cuMemsetD2D8_v2_ptds, cuMemsetD2D8_v2);
MOKKA_ALIAS(cuMemsetD2D16_v2_ptds, cuMemsetD2D16_v2);
MOKKA_ALIAS(cuMemsetD2D32_v2_ptds, cuMemsetD2D32_v2);
MOKKA_ALIAS(cuMemsetD8Async_ptsz, cuMemsetD8Async);
MOKKA_ALIAS(cuMemsetD16Async_ptsz, cuMemsetD16Async);
MOKKA_ALIAS(cuMemsetD32Async_ptsz, cuMemsetD32Async);
MOKKA_ALIAS(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async);
MOKKA_ALIAS(cuMemsetD2D16Async_ptsz, cuMemsetD2D16Async);
MOKKA_ALIAS(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async);
MOKKA_ALIAS(cuMemAllocAsync_ptsz, cuMemAllocAsync);
MOKKA_ALIAS(cuMemFreeAsync_ptsz, cuMemFreeAsync);
MOKKA_ALIAS(cuMemPrefetchAsync_v2_ptsz, cuMemPrefetchAsync_v2);
