/*
 * What the CUDA runtime (and frameworks over it) need of the driver beyond devices, contexts,
 * accounting and memory: streams and events, modules, libraries, functions and kernel launches,
 * occupancy. Memory the runtime asks for beyond cuMemAlloc, copies and memsets are
 * cuda_copy.c's; context settings cuda_ctx_settings.c's.
 *
 * No compute runs. Device memory is host memory of this process (cuda_memory.c's windows), so a
 * copy is a memcpy, done at once: every stream is always idle and every event complete. Modules load
 * without being read and launches succeed doing nothing (results undefined); with
 * MOKKA_CUDA_LAUNCH=fail a launch is CUDA_ERROR_NOT_SUPPORTED, with one line on stderr.
 *
 * Streams, events, modules, functions, libraries and kernels are numbers (tag | generation |
 * slot) in a table this file owns, as contexts are in cuda_context.c: nothing a caller hands in
 * is dereferenced, a destroyed handle is CUDA_ERROR_INVALID_HANDLE.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

int cuCtxGetCurrent(CUcontext *pctx);
int cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);

typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef void (*CUhostFn)(void *userData);
typedef void (*CUstreamCallback)(CUstream hStream, CUresult status, void *userData);

enum {
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_NOT_FOUND_ = 500,
    CUDA_ERROR_NOT_READY = 600,
};

/* ---- handles ------------------------------------------------------------------------------ */

enum kind { K_FREE = 0, K_STREAM, K_EVENT, K_MODULE, K_FUNCTION, K_LIBRARY, K_KERNEL };

struct obj {
    uint32_t gen;      /* odd while live */
    uint8_t kind;
    unsigned flags;
    int priority;
    CUcontext ctx;
    uint64_t parent;   /* a function's module, a kernel's library */
    uint64_t stamp_ns; /* an event's last record (0: never) */
    char name[64];     /* a function's or kernel's name (truncated) */
};

#define H_TAG 0x6d6bull /* "mk" */
static pthread_mutex_t g_obj_lock = PTHREAD_MUTEX_INITIALIZER;
static struct obj *g_objs;
static size_t g_nobjs, g_free_hint;
static uint64_t g_serial; /* stream ids */

/* handle = tag (16) | generation (24) | slot (24) */
static uint64_t obj_handle(size_t slot, uint32_t gen) { return H_TAG << 48 | (uint64_t)(gen & 0xFFFFFF) << 24 | slot; }

/* A new live object of `kind` (g_obj_lock held); 0 when memory runs out. */
static uint64_t obj_new(enum kind kind, CUcontext ctx, unsigned flags, struct obj **out)
{
    size_t i = g_free_hint;
    for (; i < g_nobjs && g_objs[i].kind != K_FREE; i++)
        ;
    if (i == g_nobjs) {
        if (g_nobjs >= (1u << 24))
            return 0;
        size_t cap = g_nobjs ? g_nobjs * 2 : 256;
        struct obj *t = realloc(g_objs, cap * sizeof(*t));
        if (!t)
            return 0;
        memset(t + g_nobjs, 0, (cap - g_nobjs) * sizeof(*t));
        g_objs = t;
        g_nobjs = cap;
    }
    g_free_hint = i + 1;
    struct obj *o = &g_objs[i];
    uint32_t gen = (o->gen + 1) | 1;
    memset(o, 0, sizeof(*o));
    o->gen = gen & 0xFFFFFF ? gen & 0xFFFFFF : 1;
    o->kind = (uint8_t)kind;
    o->ctx = ctx;
    o->flags = flags;
    if (out)
        *out = o;
    return obj_handle(i, o->gen);
}

/* The live object of one of the kinds in `mask` behind handle h (g_obj_lock held), or NULL. */
static struct obj *obj_get(uint64_t h, unsigned mask)
{
    if (h >> 48 != H_TAG)
        return NULL;
    size_t slot = h & 0xFFFFFF;
    if (slot >= g_nobjs)
        return NULL;
    struct obj *o = &g_objs[slot];
    if (o->kind == K_FREE || !(mask >> o->kind & 1) || o->gen != ((h >> 24) & 0xFFFFFF))
        return NULL;
    return o;
}

static void obj_free(uint64_t h)
{
    size_t slot = h & 0xFFFFFF;
    g_objs[slot].kind = K_FREE;
    g_objs[slot].gen++; /* even: dead; the next obj_new makes it odd again */
    if (slot < g_free_hint)
        g_free_hint = slot;
}

#define M(k) (1u << (k))

static void after_fork_child(void)
{
    pthread_mutex_init(&g_obj_lock, NULL);
}

__attribute__((constructor)) static void register_fork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* A context has ended: its streams, events and modules (and their functions) end with it. */
void mokka_objects_context_ended(CUcontext c)
{
    pthread_mutex_lock(&g_obj_lock);
    for (size_t i = 0; i < g_nobjs; i++)
        if (g_objs[i].kind != K_FREE && g_objs[i].kind != K_LIBRARY && g_objs[i].kind != K_KERNEL &&
            g_objs[i].ctx == c)
            obj_free(obj_handle(i, g_objs[i].gen));
    pthread_mutex_unlock(&g_obj_lock);
}

CUcontext mokka_current_or_null(void)
{
    CUcontext c = NULL;
    cuCtxGetCurrent(&c);
    return c;
}

CUresult mokka_stream_ok(CUstream s)
{
    uint64_t h = (uint64_t)(uintptr_t)s;
    if (h <= 2)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get(h, M(K_STREAM)) != NULL;
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- streams ------------------------------------------------------------------------------ */

static CUresult stream_create(CUstream *ph, unsigned flags, int priority)
{
    if (!ph || flags > 1) /* CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING */
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUdevice dev;
    CUresult r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    c = mokka_current_or_null();
    if (priority > 0)
        priority = 0; /* clamped to the range cuCtxGetStreamPriorityRange gives, as the driver does */
    if (priority < -5)
        priority = -5;
    pthread_mutex_lock(&g_obj_lock);
    struct obj *o;
    uint64_t h = obj_new(K_STREAM, c, flags, &o);
    if (h) {
        o->priority = priority;
        o->stamp_ns = ++g_serial;
    }
    pthread_mutex_unlock(&g_obj_lock);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = (CUstream)(uintptr_t)h;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) { return stream_create(phStream, Flags, 0); }
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    return stream_create(phStream, flags, priority);
}

static CUresult stream_destroy(CUstream s)
{
    pthread_mutex_lock(&g_obj_lock);
    uint64_t h = (uint64_t)(uintptr_t)s;
    int ok = obj_get(h, M(K_STREAM)) != NULL;
    if (ok)
        obj_free(h);
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuStreamDestroy_v2(CUstream hStream) { return stream_destroy(hStream); }
CUresult cuStreamDestroy(CUstream hStream) { return stream_destroy(hStream); }

/* Nothing is ever queued: every stream is idle. */
CUresult cuStreamSynchronize(CUstream hStream) { return mokka_stream_ok(hStream); }
CUresult cuStreamQuery(CUstream hStream) { return mokka_stream_ok(hStream); }

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    (void)Flags;
    CUresult r = mokka_stream_ok(hStream);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get((uint64_t)(uintptr_t)hEvent, M(K_EVENT)) != NULL;
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* A stream's fields; the default streams answer the defaults of the current context. */
static CUresult stream_info(CUstream s, unsigned *flags, int *priority, CUcontext *ctx, uint64_t *id)
{
    uint64_t h = (uint64_t)(uintptr_t)s;
    if (h <= 2) {
        CUcontext c = mokka_current_or_null();
        if (!c)
            return CUDA_ERROR_INVALID_CONTEXT;
        *flags = 0, *priority = 0, *ctx = c, *id = h;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_obj_lock);
    struct obj *o = obj_get(h, M(K_STREAM));
    if (o)
        *flags = o->flags, *priority = o->priority, *ctx = o->ctx, *id = 100 + o->stamp_ns;
    pthread_mutex_unlock(&g_obj_lock);
    return o ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

#define STREAM_FIELD(out, field)                                     \
    do {                                                             \
        if (!(out))                                                  \
            return CUDA_ERROR_INVALID_VALUE;                         \
        unsigned f_;                                                 \
        int p_;                                                      \
        CUcontext c_;                                                \
        uint64_t i_;                                                 \
        CUresult r_ = stream_info(hStream, &f_, &p_, &c_, &i_);      \
        if (r_ == CUDA_SUCCESS)                                      \
            *(out) = field;                                          \
        return r_;                                                   \
    } while (0)

CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags) { STREAM_FIELD(flags, f_); }
CUresult cuStreamGetPriority(CUstream hStream, int *priority) { STREAM_FIELD(priority, p_); }
CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx) { STREAM_FIELD(pctx, c_); }
CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId) { STREAM_FIELD(streamId, i_); }
CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult r = cuStreamGetCtx(hStream, &c);
    if (r == CUDA_SUCCESS && !mokka_ctx_device(c, device))
        r = CUDA_ERROR_INVALID_CONTEXT;
    return r;
}

/* No capture ever runs (graphs are not supported): every stream is CU_STREAM_CAPTURE_STATUS_NONE. */
CUresult cuStreamIsCapturing(CUstream hStream, unsigned *captureStatus)
{
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    *captureStatus = 0;
    return mokka_stream_ok(hStream);
}

CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, unsigned *status, cuuint64_t *id, void **graph,
                                   const void **deps, size_t *ndeps)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = 0;
    if (id)
        *id = 0;
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (ndeps)
        *ndeps = 0;
    return mokka_stream_ok(hStream);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, unsigned *status, cuuint64_t *id, void **graph,
                                   const void **deps, const void **edges, size_t *ndeps)
{
    if (edges)
        *edges = NULL;
    return cuStreamGetCaptureInfo_v2(hStream, status, id, graph, deps, ndeps);
}

CUresult cuStreamGetCaptureInfo(CUstream hStream, unsigned *status, cuuint64_t *id)
{
    return cuStreamGetCaptureInfo_v2(hStream, status, id, NULL, NULL, NULL);
}

static __thread unsigned t_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

CUresult cuThreadExchangeStreamCaptureMode(unsigned *mode)
{
    if (!mode || *mode > 2)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* A host function runs at once, on the caller's thread: everything before it in the stream has
   completed already. */
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mokka_stream_ok(hStream);
    if (r == CUDA_SUCCESS)
        fn(userData);
    return r;
}

CUresult cuLaunchHostFunc_v2(CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode)
{
    (void)syncMode;
    return cuLaunchHostFunc(hStream, fn, userData);
}

CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
    if (!callback || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mokka_stream_ok(hStream);
    if (r == CUDA_SUCCESS)
        callback(hStream, CUDA_SUCCESS, userData);
    return r;
}

/* ---- events ------------------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    if (!phEvent || Flags & ~0xFu) /* BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS */
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    CUresult r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    CUcontext c = mokka_current_or_null();
    pthread_mutex_lock(&g_obj_lock);
    uint64_t h = obj_new(K_EVENT, c, Flags, NULL);
    pthread_mutex_unlock(&g_obj_lock);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phEvent = (CUevent)(uintptr_t)h;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CUresult r = mokka_stream_ok(hStream);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t t = now_ns();
    pthread_mutex_lock(&g_obj_lock);
    struct obj *o = obj_get((uint64_t)(uintptr_t)hEvent, M(K_EVENT));
    if (o)
        o->stamp_ns = t;
    pthread_mutex_unlock(&g_obj_lock);
    return o ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    (void)flags;
    return cuEventRecord(hEvent, hStream);
}

static CUresult event_ok(CUevent e)
{
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get((uint64_t)(uintptr_t)e, M(K_EVENT)) != NULL;
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Whatever an event waits for has completed already. */
CUresult cuEventQuery(CUevent hEvent) { return event_ok(hEvent); }
CUresult cuEventSynchronize(CUevent hEvent) { return event_ok(hEvent); }

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    pthread_mutex_lock(&g_obj_lock);
    uint64_t h = (uint64_t)(uintptr_t)hEvent;
    int ok = obj_get(h, M(K_EVENT)) != NULL;
    if (ok)
        obj_free(h);
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

/* The host time between the two records, in ms: what the work between them took here. Not
   recorded, or made with CU_EVENT_DISABLE_TIMING: INVALID_HANDLE, as the driver says. */
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_obj_lock);
    struct obj *a = obj_get((uint64_t)(uintptr_t)hStart, M(K_EVENT));
    struct obj *b = obj_get((uint64_t)(uintptr_t)hEnd, M(K_EVENT));
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    if (a && b && a->stamp_ns && b->stamp_ns && !((a->flags | b->flags) & 0x2)) {
        *pMilliseconds = (float)((double)((int64_t)(b->stamp_ns - a->stamp_ns)) / 1e6);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_obj_lock);
    return r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

/* ---- modules, libraries, functions -------------------------------------------------------

   An image is never read: cubins, PTX and fatbins all load, and every name is found (the
   runtime asks for the kernels a program registered; a framework for those it compiled). Device
   variables (cuModuleGetGlobal) cannot be found without reading the image: NOT_FOUND. */

static CUresult new_handle(void **out, enum kind kind, uint64_t parent, const char *name)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    CUresult r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS && kind != K_LIBRARY && kind != K_KERNEL) /* libraries are context-free */
        return r;
    CUcontext c = mokka_current_or_null();
    pthread_mutex_lock(&g_obj_lock);
    struct obj *o;
    uint64_t h = obj_new(kind, c, 0, &o);
    if (h) {
        o->parent = parent;
        if (name)
            snprintf(o->name, sizeof(o->name), "%s", name);
    }
    pthread_mutex_unlock(&g_obj_lock);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = (void *)(uintptr_t)h;
    return CUDA_SUCCESS;
}

CUresult mokka_module_from_fatbin(void **module, const void *image)
{
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle(module, K_MODULE, 0, NULL);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) { return mokka_module_from_fatbin((void **)module, image); }
CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return mokka_module_from_fatbin((void **)module, fatCubin);
}
CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, void *options, void **values)
{
    (void)numOptions, (void)options, (void)values;
    return mokka_module_from_fatbin((void **)module, image);
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!fname)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fname, R_OK) != 0) {
        errno = 0;
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    return new_handle((void **)module, K_MODULE, 0, NULL);
}

static CUresult drop(void *handle, unsigned mask)
{
    uint64_t h = (uint64_t)(uintptr_t)handle;
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get(h, mask) != NULL;
    if (ok) {
        obj_free(h);
        for (size_t i = 0; i < g_nobjs; i++) /* its functions or kernels go with it */
            if (g_objs[i].kind != K_FREE && g_objs[i].parent == h)
                obj_free(obj_handle(i, g_objs[i].gen));
    }
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuModuleUnload(CUmodule hmod) { return drop(hmod, M(K_MODULE)); }

static CUresult child(void **out, void *parent, unsigned mask, enum kind kind, const char *name)
{
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get((uint64_t)(uintptr_t)parent, mask) != NULL;
    pthread_mutex_unlock(&g_obj_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    return new_handle(out, kind, (uint64_t)(uintptr_t)parent, name);
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    return child((void **)hfunc, hmod, M(K_MODULE), K_FUNCTION, name);
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    (void)dptr, (void)bytes;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get((uint64_t)(uintptr_t)hmod, M(K_MODULE)) != NULL;
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_ERROR_NOT_FOUND_ : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuModuleGetLoadingMode(unsigned *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = 2; /* CU_MODULE_LAZY_LOADING, the default since CUDA 12.2 */
    return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jitOptions, void **jitValues, unsigned nJit,
                           void *libOptions, void **libValues, unsigned nLib)
{
    (void)jitOptions, (void)jitValues, (void)nJit, (void)libOptions, (void)libValues, (void)nLib;
    if (!code)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle((void **)library, K_LIBRARY, 0, NULL);
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, void *jitOptions, void **jitValues,
                               unsigned nJit, void *libOptions, void **libValues, unsigned nLib)
{
    (void)jitOptions, (void)jitValues, (void)nJit, (void)libOptions, (void)libValues, (void)nLib;
    if (!fileName)
        return CUDA_ERROR_INVALID_VALUE;
    if (access(fileName, R_OK) != 0) {
        errno = 0;
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    return new_handle((void **)library, K_LIBRARY, 0, NULL);
}

CUresult cuLibraryUnload(CUlibrary library) { return drop(library, M(K_LIBRARY)); }

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    return child((void **)pKernel, library, M(K_LIBRARY), K_KERNEL, name);
}

CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    return child((void **)pMod, library, M(K_LIBRARY), K_MODULE, "");
}

CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    (void)dptr, (void)bytes;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_obj_lock);
    int ok = obj_get((uint64_t)(uintptr_t)library, M(K_LIBRARY)) != NULL;
    pthread_mutex_unlock(&g_obj_lock);
    return ok ? CUDA_ERROR_NOT_FOUND_ : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    char name[64] = "";
    pthread_mutex_lock(&g_obj_lock);
    struct obj *o = obj_get((uint64_t)(uintptr_t)kernel, M(K_KERNEL));
    if (o)
        memcpy(name, o->name, sizeof(name));
    pthread_mutex_unlock(&g_obj_lock);
    if (!o)
        return CUDA_ERROR_INVALID_HANDLE;
    return new_handle((void **)pFunc, K_FUNCTION, (uint64_t)(uintptr_t)kernel, name);
}

/* A function or kernel handle (cuLaunchKernel takes either); its name into name if given. */
static CUresult function_ok(void *f, char name[64])
{
    pthread_mutex_lock(&g_obj_lock);
    struct obj *o = obj_get((uint64_t)(uintptr_t)f, M(K_FUNCTION) | M(K_KERNEL));
    if (o && name)
        memcpy(name, o->name, 64);
    pthread_mutex_unlock(&g_obj_lock);
    return o ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* CUfunction_attribute values for a kernel nobody compiled: the device's limits and an empty
   kernel's resources. */
static CUresult function_attribute(int *pi, int attrib)
{
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    int v;
    switch (attrib) {
    case 0: v = 1024; break;        /* MAX_THREADS_PER_BLOCK */
    case 1: case 2: case 3: v = 0; break; /* shared, const, local bytes */
    case 4: v = 32; break;          /* NUM_REGS */
    case 5: case 6: {               /* PTX_VERSION, BINARY_VERSION: the device's capability */
        CUdevice dev;
        int major = 0, minor = 0;
        if (mokka_current_device(&dev) == CUDA_SUCCESS) {
            cuDeviceGetAttribute(&major, 75, dev);
            cuDeviceGetAttribute(&minor, 76, dev);
        }
        v = major * 10 + minor;
        break;
    }
    case 7: v = 0; break;           /* CACHE_MODE_CA */
    case 8: v = 49152; break;       /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
    case 9: v = -1; break;          /* PREFERRED_SHARED_MEMORY_CARVEOUT */
    case 10: case 11: case 12: case 13: v = 0; break; /* cluster requirements */
    case 14: v = 1; break;          /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
    case 15: v = 0; break;          /* CLUSTER_SCHEDULING_POLICY_PREFERENCE */
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *pi, int attrib, CUfunction hfunc)
{
    CUresult r = function_ok(hfunc, NULL);
    return r != CUDA_SUCCESS ? r : function_attribute(pi, attrib);
}

CUresult cuKernelGetAttribute(int *pi, int attrib, CUkernel kernel, CUdevice dev)
{
    (void)dev;
    CUresult r = function_ok(kernel, NULL);
    return r != CUDA_SUCCESS ? r : function_attribute(pi, attrib);
}

CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value)
{
    (void)attrib, (void)value;
    return function_ok(hfunc, NULL);
}

CUresult cuKernelSetAttribute(int attrib, int val, CUkernel kernel, CUdevice dev)
{
    (void)attrib, (void)val, (void)dev;
    return function_ok(kernel, NULL);
}

CUresult cuFuncSetCacheConfig(CUfunction hfunc, int config)
{
    (void)config;
    return function_ok(hfunc, NULL);
}

CUresult cuKernelSetCacheConfig(CUkernel kernel, int config, CUdevice dev)
{
    (void)config, (void)dev;
    return function_ok(kernel, NULL);
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    static __thread char buf[64];
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = function_ok(hfunc, buf);
    if (r == CUDA_SUCCESS)
        *name = buf;
    return r;
}

CUresult cuFuncIsLoaded(unsigned *state, CUfunction function)
{
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    *state = 1; /* CU_FUNCTION_LOADING_STATE_LOADED */
    return function_ok(function, NULL);
}

CUresult cuFuncLoad(CUfunction function) { return function_ok(function, NULL); }

/* ---- launches ----------------------------------------------------------------------------- */

/* MOKKA_CUDA_LAUNCH=fail: launches are refused, for users who want to catch accidental compute. */
static int launches_refused(void)
{
    static int refused = -1;
    int v = __atomic_load_n(&refused, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("MOKKA_CUDA_LAUNCH");
        v = e && strcmp(e, "fail") == 0;
        __atomic_store_n(&refused, v, __ATOMIC_RELAXED);
    }
    return v;
}

static CUresult launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shared, CUstream s)
{
    char name[64] = "";
    CUresult r = function_ok(f, name);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = mokka_stream_ok(s)) != CUDA_SUCCESS)
        return r;
    CUdevice dev;
    if ((r = mokka_current_device(&dev)) != CUDA_SUCCESS)
        return r;
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 || bx > 1024 || by > 1024 || bz > 64 ||
        (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    int optin = 0;
    cuDeviceGetAttribute(&optin, 97, dev); /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    if (optin > 0 && shared > (unsigned)optin)
        return CUDA_ERROR_INVALID_VALUE;
    if (launches_refused()) {
        int saved = errno;
        fprintf(stderr, "mokkafs: kernel launch of %s refused: this simulated node runs no kernels "
                "(MOKKA_CUDA_LAUNCH=fail)\n", name[0] ? name : "a kernel");
        errno = saved;
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)kernelParams, (void)extra;
    return launch(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned sharedMemBytes, CUstream hStream, void **kernelParams)
{
    (void)kernelParams;
    return launch(f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream);
}

struct launch_config { /* CUlaunchConfig (cuda.h) */
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
};

CUresult cuLaunchKernelEx(const struct launch_config *config, CUfunction f, void **kernelParams, void **extra)
{
    (void)kernelParams, (void)extra;
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                  config->blockDimZ, config->sharedMemBytes, config->hStream);
}

/* Occupancy from the device's per-SM limits (threads, blocks), for a kernel that uses no shared
   memory or registers beyond them. */
static CUresult blocks_per_sm(void *func, int block_size, int *out)
{
    CUresult r = function_ok(func, NULL);
    CUdevice dev;
    if (r == CUDA_SUCCESS)
        r = mokka_current_device(&dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (block_size <= 0 || block_size > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    int threads = 2048, blocks = 32;
    cuDeviceGetAttribute(&threads, 39, dev); /* MAX_THREADS_PER_MULTIPROCESSOR */
    cuDeviceGetAttribute(&blocks, 106, dev); /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    int warps = (block_size + 31) / 32;
    int n = threads / (warps * 32);
    *out = n < blocks ? n : blocks;
    return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize)
{
    (void)dynamicSMemSize;
    if (!numBlocks)
        return CUDA_ERROR_INVALID_VALUE;
    return blocks_per_sm(func, blockSize, numBlocks);
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                              size_t dynamicSMemSize, unsigned int flags)
{
    (void)flags;
    return cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, dynamicSMemSize);
}

CUresult cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func, void *sizeFn,
                                          size_t dynamicSMemSize, int blockSizeLimit)
{
    (void)sizeFn, (void)dynamicSMemSize;
    if (!minGridSize || !blockSize)
        return CUDA_ERROR_INVALID_VALUE;
    int size = blockSizeLimit > 0 && blockSizeLimit < 1024 ? blockSizeLimit : 1024, n, sms = 1;
    CUresult r = blocks_per_sm(func, size, &n);
    CUdevice dev;
    if (r == CUDA_SUCCESS && mokka_current_device(&dev) == CUDA_SUCCESS)
        cuDeviceGetAttribute(&sms, 16, dev);
    if (r == CUDA_SUCCESS) {
        *blockSize = size;
        *minGridSize = n * sms;
    }
    return r;
}

CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, CUfunction func, void *sizeFn,
                                                   size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)
{
    (void)flags;
    return cuOccupancyMaxPotentialBlockSize(minGridSize, blockSize, func, sizeFn, dynamicSMemSize, blockSizeLimit);
}

/* ---- the per-thread-default-stream names of the same functions ---------------------------- */

MOKKA_ALIAS(cuStreamSynchronize_ptsz, cuStreamSynchronize);
MOKKA_ALIAS(cuStreamQuery_ptsz, cuStreamQuery);
MOKKA_ALIAS(cuStreamWaitEvent_ptsz, cuStreamWaitEvent);
MOKKA_ALIAS(cuStreamGetFlags_ptsz, cuStreamGetFlags);
MOKKA_ALIAS(cuStreamGetPriority_ptsz, cuStreamGetPriority);
MOKKA_ALIAS(cuStreamGetCtx_ptsz, cuStreamGetCtx);
MOKKA_ALIAS(cuStreamGetId_ptsz, cuStreamGetId);
MOKKA_ALIAS(cuStreamGetDevice_ptsz, cuStreamGetDevice);
MOKKA_ALIAS(cuStreamIsCapturing_ptsz, cuStreamIsCapturing);
MOKKA_ALIAS(cuStreamGetCaptureInfo_ptsz, cuStreamGetCaptureInfo);
MOKKA_ALIAS(cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v2);
MOKKA_ALIAS(cuStreamGetCaptureInfo_v3_ptsz, cuStreamGetCaptureInfo_v3);
MOKKA_ALIAS(cuStreamAddCallback_ptsz, cuStreamAddCallback);
MOKKA_ALIAS(cuLaunchHostFunc_ptsz, cuLaunchHostFunc);
MOKKA_ALIAS(cuLaunchHostFunc_v2_ptsz, cuLaunchHostFunc_v2);
MOKKA_ALIAS(cuEventRecord_ptsz, cuEventRecord);
MOKKA_ALIAS(cuEventRecordWithFlags_ptsz, cuEventRecordWithFlags);
MOKKA_ALIAS(cuLaunchKernel_ptsz, cuLaunchKernel);
MOKKA_ALIAS(cuLaunchKernelEx_ptsz, cuLaunchKernelEx);
MOKKA_ALIAS(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel);
