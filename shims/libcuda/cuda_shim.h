/*
 * The few CUDA driver API types and numbers libcuda's sources need, written from NVIDIA's public
 * documentation (cuda.h itself may not be redistributed; shims/gen_cuda.py reads it from the
 * nvidia-cuda-runtime wheel). ABI: every handle is a pointer, CUdevice an int, CUdeviceptr 64-bit.
 */
#ifndef MOKKA_CUDA_SHIM_H
#define MOKKA_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned int CUdevice_attribute;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef int CUdriverProcAddressQueryResult;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46, /* compute mode EXCLUSIVE_PROCESS or PROHIBITED */
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_UNKNOWN = 999,
};

enum { /* CUcomputemode, the same numbers as NVML's */
    CU_COMPUTEMODE_PROHIBITED = 2,
    CU_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
};

enum {
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
};

#define CU_DEVICE_ATTRIBUTE_MAX 162

/* shims/gen_cuda.py's tables (cuda_gen.c) */
struct mokka_proc {
    const char *name;          /* what callers ask cuGetProcAddress for */
    int version;               /* the CUDA version that introduced this ABI (0: any) */
    int per_thread_stream;     /* a _ptds/_ptsz variant */
    void *fn;
};
struct mokka_error_name {
    int code;
    const char *name;
};
extern const struct mokka_proc mokka_procs[];
extern const unsigned mokka_procs_count;
extern const struct mokka_error_name mokka_error_names[];
extern const unsigned mokka_error_names_count;

#endif /* MOKKA_CUDA_SHIM_H */
