/*
 * libnvidia-ml: event sets, device and system, and waiting on the state's event ring (futex wake word).
 */
#include "nvml_internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- events --------------------------------------------------------------------------- */

#define SUPPORTED_EVENTS (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | \
                          nvmlEventTypeXidCriticalError | nvmlEventTypeGpuRecoveryAction)
/* System events ride the same ring with MOKKA_EVENT_SYSTEM set in their type (mokka_state.h); a
   device set skips them (their low bits are the system types, which share values with SBE and DBE). */
#define SUPPORTED_SYSTEM_EVENTS (nvmlSystemEventTypeGpuDriverUnbind | nvmlSystemEventTypeGpuDriverBind)

/* Event sets live in a table the library owns, and a handle is a number, never an address:
   tag (16 bits) | generation (32) | slot (16). Nothing a caller hands back is dereferenced, so a
   random value, a pointer to anything, or a freed set is refused with INVALID_ARGUMENT. Freeing
   gives the slot a new generation: the old handle stays refused after the slot is reused, and a
   thread waiting on a set that another thread frees sees the change under the lock and returns.
   Chunks of the table are allocated on first use and never freed, so a slot's memory outlives
   every handle to it. One lock guards every set: they are created, registered and polled rarely,
   and never held across a sleep. */
#define SET_TAG 0x6d65ull /* the top 16 bits of every event-set handle */
#define SET_CHUNK 64
#define SET_CHUNKS 64     /* at most 4096 live sets per process */

struct event_set {
    uint32_t gen;                               /* odd while handed out, even while free */
    unsigned system;                            /* a system event set (its mask in mask[0]) */
    unsigned waiters;                           /* threads in nvmlEventSetWait on this slot */
    uint64_t next;                              /* next event number to look at */
    unsigned long long mask[MOKKA_MAX_GPUS];    /* registered types per GPU */
};

static pthread_mutex_t g_sets_lock = PTHREAD_MUTEX_INITIALIZER;
static struct event_set *g_set_chunks[SET_CHUNKS]; /* guarded by g_sets_lock */

_Static_assert(sizeof(nvmlEventSet_t) == 8, "handles carry 64 bits");

/* The set of that kind a handle names, or NULL if it names none that is live (g_sets_lock held). */
static struct event_set *set_of_kind(uint64_t h, unsigned system)
{
    unsigned slot = (unsigned)(h & 0xFFFF);
    uint32_t gen = (uint32_t)(h >> 16);
    if (h >> 48 != SET_TAG || slot >= SET_CHUNK * SET_CHUNKS || !(gen & 1))
        return NULL;
    struct event_set *chunk = g_set_chunks[slot / SET_CHUNK];
    if (!chunk || chunk[slot % SET_CHUNK].gen != gen || chunk[slot % SET_CHUNK].system != system)
        return NULL;
    return &chunk[slot % SET_CHUNK];
}

static struct event_set *set_of(nvmlEventSet_t set) { return set_of_kind((uint64_t)(uintptr_t)set, 0); }

/* A fork while another thread holds the lock would leave the child's copy locked forever. */
static void sets_prepare(void) { pthread_mutex_lock(&g_sets_lock); }
static void sets_release(void) { pthread_mutex_unlock(&g_sets_lock); }
__attribute__((constructor)) static void sets_atfork(void) { pthread_atfork(sets_prepare, sets_release, sets_release); }

static nvmlReturn_t set_create(unsigned system, uint64_t *handle)
{
    int saved = errno;
    nvmlReturn_t r = NVML_ERROR_MEMORY; /* every slot taken, or no memory for a new chunk */
    pthread_mutex_lock(&g_sets_lock);
    for (unsigned c = 0; c < SET_CHUNKS && r != NVML_SUCCESS; c++) {
        if (!g_set_chunks[c] && !(g_set_chunks[c] = calloc(SET_CHUNK, sizeof(struct event_set))))
            break;
        for (unsigned i = 0; i < SET_CHUNK; i++) {
            struct event_set *es = &g_set_chunks[c][i];
            if (es->gen & 1)
                continue;
            es->gen++;
            es->system = system;
            memset(es->mask, 0, sizeof(es->mask));
            /* Only events after creation: a new set does not replay history. */
            es->next = __atomic_load_n(&state()->event_head, __ATOMIC_ACQUIRE);
            *handle = SET_TAG << 48 | (uint64_t)es->gen << 16 | (c * SET_CHUNK + i);
            r = NVML_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_sets_lock);
    errno = saved;
    return r;
}

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    ARG(set);
    uint64_t h;
    nvmlReturn_t r = set_create(0, &h);
    if (r == NVML_SUCCESS)
        *set = (nvmlEventSet_t)(uintptr_t)h;
    return r;
}

static nvmlReturn_t set_free(uint64_t handle, unsigned system)
{
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of_kind(handle, system);
    unsigned waiters = 0;
    if (es) {
        es->gen++;
        waiters = es->waiters;
    }
    pthread_mutex_unlock(&g_sets_lock);
    if (!es)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (waiters) { /* wake them now rather than at the end of their one-second slice */
        int saved = errno;
        syscall(SYS_futex, &state()->event_wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        errno = saved;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return set_free((uint64_t)(uintptr_t)set, 0);
}

nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    DEV(device);
    (void)g;
    ARG(eventTypes);
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    DEV(device);
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of(set);
    if (!es)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS)
        r = NVML_ERROR_NOT_SUPPORTED;
    else
        es->mask[gpu_index(s, g)] |= eventTypes;
    pthread_mutex_unlock(&g_sets_lock);
    return r;
}

/* Take the next event for the set `handle` names if one is there, into *out (a device set) or
   *sys_out (a system set). 1: filled; 0: nothing new; -1: the set was freed. */
static int take_event(const struct mokka_state *s, uint64_t handle, unsigned system, nvmlEventData_t *out,
                      nvmlSystemEventData_v1_t *sys_out)
{
    int found = 0;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of_kind(handle, system);
    if (!es) {
        pthread_mutex_unlock(&g_sets_lock);
        return -1;
    }
    /* A header that is not ours (retired, or overwritten until the daemon's next tick) has no
       counters to trust: nothing new until it is back. */
    if (__atomic_load_n(&s->magic, __ATOMIC_RELAXED) != MOKKA_STATE_MAGIC) {
        pthread_mutex_unlock(&g_sets_lock);
        return 0;
    }
    uint64_t head = __atomic_load_n(&s->event_head, __ATOMIC_ACQUIRE);
    if (head < es->next) /* the daemon started a fresh file: follow it */
        es->next = head;
    if (head - es->next > MOKKA_EVENT_RING) /* overrun: the oldest are gone */
        es->next = head - MOKKA_EVENT_RING;
    while (!found && es->next < head) {
        uint64_t n = es->next++;
        const struct mokka_event *slot = &s->ring[n % MOKKA_EVENT_RING];
        if (__atomic_load_n(&slot->seq, __ATOMIC_ACQUIRE) != n + 1)
            continue;
        struct mokka_event e;
        memcpy(&e, slot, sizeof(e));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&slot->seq, __ATOMIC_RELAXED) != n + 1 || e.gpu >= MOKKA_MAX_GPUS)
            continue; /* overwritten while read */
        if (system) {
            if (!(e.type & MOKKA_EVENT_SYSTEM) || !(es->mask[0] & e.type & ~(uint64_t)MOKKA_EVENT_SYSTEM))
                continue;
            sys_out->eventType = e.type & ~(uint64_t)MOKKA_EVENT_SYSTEM;
            sys_out->gpuId = e.data; /* the GPU's PCI location, as the daemon wrote it */
            found = 1;
            continue;
        }
        if ((e.type & MOKKA_EVENT_SYSTEM) || !(es->mask[e.gpu] & e.type))
            continue;
        out->device = gpu_handle(e.gpu);
        out->eventType = e.type;
        out->eventData = e.type == nvmlEventTypeXidCriticalError ? e.data : 0;
        /* the MIG instance an Xid names, 0xFFFFFFFF for none (nvml.h) */
        out->gpuInstanceId = e.mig_gi == MOKKA_NO_MIG ? 0xFFFFFFFFu : e.mig_gi;
        out->computeInstanceId = e.mig_ci == MOKKA_NO_MIG ? 0xFFFFFFFFu : e.mig_ci;
        found = 1;
    }
    pthread_mutex_unlock(&g_sets_lock);
    return found;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Wait up to timeoutms for the next event of the set `handle` names (see take_event). */
static nvmlReturn_t wait_event(uint64_t handle, unsigned system, nvmlEventData_t *data,
                               nvmlSystemEventData_v1_t *sys_data, unsigned int timeoutms)
{
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of_kind(handle, system); /* its memory is never freed: safe to count out below */
    if (es)
        es->waiters++;
    pthread_mutex_unlock(&g_sets_lock);
    if (!es)
        return NVML_ERROR_INVALID_ARGUMENT;
    int saved = errno;
    uint64_t deadline = now_ns() + (uint64_t)timeoutms * 1000000ull;
    nvmlReturn_t r = NVML_ERROR_TIMEOUT;
    for (;;) {
        /* Each round from the current mapping: the daemon wakes the waiters of a file it
           retires, and they carry on in its successor, whose counters continue the old ones. */
        const struct mokka_state *s = mokka_state_checked();
        uint32_t wake = __atomic_load_n(&s->event_wake, __ATOMIC_ACQUIRE);
        int got = take_event(s, handle, system, data, sys_data);
        if (got != 0) {
            r = got > 0 ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT; /* < 0: freed meanwhile */
            break;
        }
        uint64_t now = now_ns();
        if (now >= deadline)
            break;
        /* Sleep until the daemon bumps the wake word, or the deadline. Slices of at most
           a second keep a daemon without futex support (or a header being repaired) from
           stranding us. */
        uint64_t left = deadline - now;
        if (left > 1000000000ull)
            left = 1000000000ull;
        if (__atomic_load_n(&s->magic, __ATOMIC_RELAXED) != MOKKA_STATE_MAGIC && left > 10000000ull)
            left = 10000000ull; /* retired or being repaired: nobody wakes this word, look again soon */
        struct timespec ts = {(time_t)(left / 1000000000ull), (long)(left % 1000000000ull)};
        syscall(SYS_futex, &s->event_wake, FUTEX_WAIT, wake, &ts, NULL, 0);
    }
    pthread_mutex_lock(&g_sets_lock);
    es->waiters--;
    pthread_mutex_unlock(&g_sets_lock);
    errno = saved;
    return r;
}

nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    return wait_event((uint64_t)(uintptr_t)set, 0, data, NULL, timeoutms);
}

nvmlReturn_t DECLDIR nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* ---- system events: a GPU's driver bound or unbound (nvml.h's nvmlSystemEventType) ---------- */
/* The daemon raises them for every GPU when the node's driver reloads (node/reset): an unbind,
   then a bind (docs/nvml.md). gpuId is the GPU's PCI location, (domain << 16) | (bus << 8) | device. */

nvmlReturn_t DECLDIR nvmlSystemEventSetCreate(nvmlSystemEventSetCreateRequest_t *request)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    VERSIONED_ARG(request, nvmlSystemEventSetCreateRequest_v1);
    uint64_t h;
    nvmlReturn_t r = set_create(1, &h);
    if (r == NVML_SUCCESS)
        request->set = (nvmlSystemEventSet_t)(uintptr_t)h;
    return r;
}

nvmlReturn_t DECLDIR nvmlSystemEventSetFree(nvmlSystemEventSetFreeRequest_t *request)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    VERSIONED_ARG(request, nvmlSystemEventSetFreeRequest_v1);
    return set_free((uint64_t)(uintptr_t)request->set, 1);
}

nvmlReturn_t DECLDIR nvmlSystemRegisterEvents(nvmlSystemRegisterEventRequest_t *request)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    VERSIONED_ARG(request, nvmlSystemRegisterEventRequest_v1);
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_sets_lock);
    struct event_set *es = set_of_kind((uint64_t)(uintptr_t)request->set, 1);
    if (!es)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (request->eventTypes & ~(unsigned long long)SUPPORTED_SYSTEM_EVENTS)
        r = NVML_ERROR_NOT_SUPPORTED; /* none of them registered, as nvml.h says */
    else
        es->mask[0] |= request->eventTypes;
    pthread_mutex_unlock(&g_sets_lock);
    return r;
}

/* Up to dataSize events, waiting up to timeoutms for the first (0: not at all); TIMEOUT when none
   came. numEvent equal to dataSize means more may be waiting. */
nvmlReturn_t DECLDIR nvmlSystemEventSetWait(nvmlSystemEventSetWaitRequest_t *request)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    VERSIONED_ARG(request, nvmlSystemEventSetWaitRequest_v1);
    if (!request->data || !request->dataSize)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t h = (uint64_t)(uintptr_t)request->set;
    request->numEvent = 0;
    nvmlReturn_t r = wait_event(h, 1, NULL, &request->data[0], request->timeoutms);
    if (r != NVML_SUCCESS)
        return r;
    unsigned n = 1;
    int saved = errno;
    while (n < request->dataSize && take_event(mokka_state_checked(), h, 1, NULL, &request->data[n]) > 0)
        n++;
    errno = saved;
    request->numEvent = n;
    return NVML_SUCCESS;
}
