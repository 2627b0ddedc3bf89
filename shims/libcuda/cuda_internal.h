/*
 * What libcuda's source files share with one another (never exported: libcuda.map keeps every
 * name local but the CUDA API). cuda.c owns devices, contexts and the allocation table;
 * cuda_export.c the runtime's private tables; cuda_runtime.c copies, streams, events, modules
 * and launches.
 */
#ifndef MOKKA_CUDA_INTERNAL_H
#define MOKKA_CUDA_INTERNAL_H

#include "cuda_shim.h"

/* cuda.c */
int mokka_ctx_device(CUcontext c, CUdevice *dev); /* 1: a live context of ours, *dev filled */
unsigned mokka_gpu_index(CUdevice dev);            /* the GPU index in the state of an ordinal */
CUresult mokka_current_device(CUdevice *dev);      /* the current context's device */
/* A device's primary context handle, one for the life of the process, retained or not. */
CUresult mokka_primary_handle(CUcontext *pctx, CUdevice dev);

/* One live allocation, as the allocation table holds it. */
enum { MOKKA_MEM_DEVICE = 0, MOKKA_MEM_MANAGED = 1, MOKKA_MEM_HOST = 2 };
struct mokka_range {
    uint64_t ptr, size;
    unsigned gi, kind;
    CUcontext ctx;
};
/* The live allocation holding [p, p + n) (n = 0: holding p); 0 if none. */
int mokka_mem_find(uint64_t p, uint64_t n, struct mokka_range *out);
/* Allocate in the current context: device or managed memory (accounted to its GPU) or host
   memory (not accounted). */
CUresult mokka_mem_alloc(CUdeviceptr *out, size_t bytes, unsigned kind);
CUresult mokka_mem_free(CUdeviceptr p, unsigned kind);
/* Does p lie in a GPU's address window (allocated or not)? */
int mokka_device_address(uint64_t p);

/* cuda_export.c: the context-local storage of a context that has ended is dropped, its
   destructors called (outside every lock of cuda.c). */
void mokka_cls_context_ended(CUcontext c);
/* cuda_runtime.c: a context's streams, events, modules and functions end with it. */
void mokka_objects_context_ended(CUcontext c);

/* MOKKA_CUDA_TRACE=1: one line on stderr per private table asked for and per slot we do not
   implement that is called. */
int mokka_trace_on(void);

#endif /* MOKKA_CUDA_INTERNAL_H */
