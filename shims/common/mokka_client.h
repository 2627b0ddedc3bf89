/*
 * mokka_client.h -- the one reader of the shared state (mokka_state.h), compiled into
 * libnvidia-ml.so.1, libcuda.so.1 and nvidia-smi, which are then only their APIs.
 *
 * It owns, for all three:
 *   - discovery (docs/containers.md): MOKKA_STATE when set and non-empty; else the node of the
 *     driver root the shim was loaded from (<R>/run/mokka/state for a shim at <R>/usr/lib64/x.so
 *     or <R>/usr/bin/x, when <R>/run/mokka is a directory); else the node's socket
 *     <R>/run/nvidia-persistenced/socket, then /run/nvidia-persistenced/socket (what NVIDIA's
 *     CDI specs mount), which hands over the state file's descriptor; else no node at all
 *     (MOKKA_ABSENT: Driver Not Loaded), never a default place that may be another node's;
 *   - open, map and validate, with one result (enum mokka_status) that each shim turns into
 *     its API's error in one place; a file is measured before it is mapped, so a short one is
 *     never mapped past its end;
 *   - staying on the node's file: a mapping whose header no longer says MOKKA_STATE_MAGIC (the
 *     daemon retired it, or its header was overwritten) is checked against the path on a
 *     later call, and so is one whose generation stopped moving (a copy someone put in place;
 *     mokka_state_checked); a new valid file there is mapped and used from then on;
 *   - the seqlock read (bounded retries; a writer that died mid-publish costs one wait);
 *   - the one snapshot of a GPU's MIG section and the board's MIG tables, made safe to index;
 *   - PCI bus id parsing;
 *   - the address of a socket beside the state, at any path length.
 *
 * The fast path (mokka_state, mokka_read, MOKKA_CONSISTENT) is inline: no call, no syscall.
 * Everything here is hidden: each shim has its own copy and exports none of it.
 */
#ifndef MOKKA_CLIENT_H
#define MOKKA_CLIENT_H

#include "mokka_state.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#pragma GCC visibility push(hidden)

/* What opening the node's state gave; the same for every shim. */
enum mokka_status {
    MOKKA_OK = 0,
    MOKKA_ABSENT,   /* nothing usable at the path: missing, not a regular file, or too short */
    MOKKA_MISMATCH, /* a file whose header is not this layout: magic, version, size, GPU count */
};

/* Find, open, validate and map the node's state (again: a file already mapped is kept, a new
   one at the path replaces it). Thread-safe; errno is preserved. */
enum mokka_status mokka_open(void);

/* The shim's own location for discovery, when it is not the object this code is linked into:
   nvidia-smi passes an address inside the NVML library it loaded, so that it reads the node
   that library reads. Call before mokka_open. */
void mokka_set_anchor(const void *address_in_object);

/* The path the current mapping came from ("" before a successful mokka_open). */
const char *mokka_path(void);

/* Where the state would be found now (discovery only, nothing opened; "" for nowhere). */
void mokka_discover(char *out, size_t n);

/* An address for unix socket `path` (the control socket, the process table's socket) that fits
   sun_path's 108 bytes: the path itself, or, for a node mounted under a long directory,
   /proc/self/fd/N/<name> through *dirfd, a descriptor of its directory (O_PATH) that the caller
   closes once connected; *dirfd is -1 when none was opened. 0, or -1 when not even that fits. */
struct sockaddr_un;
int mokka_unix_address(const char *path, struct sockaddr_un *addr, int *dirfd);

/* What each of the daemon's sockets hands a caller first: one byte and at most one descriptor
   (SCM_RIGHTS, received close-on-exec). Waits at most until `deadline_ns` (CLOCK_MONOTONIC); a
   signal restarts the wait within it, so a stream of them cannot make it unbounded. Returns the
   descriptor, or -1 if none came with the byte; *got_byte (when not NULL) says whether the byte
   came. A malformed control message's descriptors are closed, never leaked. */
int mokka_recv_fd(int sock, uint64_t deadline_ns, int *got_byte);
uint64_t mokka_now_ns(void);

/* ---- the mapping: inline fast path ---------------------------------------------------- */

extern const struct mokka_state *mokka_mapped;              /* current mapping, or NULL */
const struct mokka_state *mokka_state_slow(const struct mokka_state *s);

/* The mapping to read, or NULL before mokka_open succeeded. One load and a compare on the
   header's cache line, which the seqlock read touches anyway; the rest is out of line. */
static inline const struct mokka_state *mokka_state(void)
{
    const struct mokka_state *s = __atomic_load_n(&mokka_mapped, __ATOMIC_ACQUIRE);
    if (__builtin_expect(s != NULL && __atomic_load_n(&s->magic, __ATOMIC_RELAXED) != MOKKA_STATE_MAGIC, 0))
        s = mokka_state_slow(s);
    return s;
}

/* mokka_state, and also: has the file's generation stood still for a second? (A copy someone
   renamed into place is never written, nor retired.) It reads the clock, so it is for the calls
   a poller makes once a round (device counts, process lists, event waits), not for getters; a
   per-thread call counter on the fast path would need static TLS, which a library loaded late
   into a large process may not get. */
static inline const struct mokka_state *mokka_state_checked(void)
{
    const struct mokka_state *s = __atomic_load_n(&mokka_mapped, __ATOMIC_ACQUIRE);
    return s ? mokka_state_slow(s) : NULL;
}

static inline unsigned mokka_gpu_count(const struct mokka_state *s)
{
    uint32_t n = __atomic_load_n(&s->gpu_count, __ATOMIC_RELAXED);
    return n > MOKKA_MAX_GPUS ? MOKKA_MAX_GPUS : n;
}

/* ---- the seqlock read ---------------------------------------------------------------- */

struct mokka_section {
    const struct mokka_state *s;
    uint32_t seq;
    unsigned tries;
    int done;
};

void mokka_section_retry(struct mokka_section *r);

static inline struct mokka_section mokka_section_begin(const struct mokka_state *s)
{
    struct mokka_section r = {s, __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE), 0, 0};
    return r;
}

static inline void mokka_section_end(struct mokka_section *r)
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__builtin_expect(!(r->seq & 1) && __atomic_load_n(&r->s->seq, __ATOMIC_RELAXED) == r->seq, 1))
        r->done = 1;
    else
        mokka_section_retry(r);
}

/* MOKKA_CONSISTENT(s) { ...copy fields of s... }  runs the block until what it copied was one
   publish's values, wherever the fields lie (bounded: a dead writer's copy is taken stale).
   The block may run more than once; it must only copy, and never return or break. */
#define MOKKA_CONSISTENT(s) \
    for (struct mokka_section mokka_sec_ = mokka_section_begin(s); !mokka_sec_.done; mokka_section_end(&mokka_sec_))

static inline void mokka_read(const struct mokka_state *s, const void *src, void *dst, size_t n)
{
    MOKKA_CONSISTENT(s) memcpy(dst, src, n);
}

/* Is s's record stable enough to read? 1 at once while seq is even (one load, on the line the
   fast path reads anyway); else the section's bounded wait for the writer to finish, and 0 when
   seq stays odd past it (a writer that died mid-publish): what is in the mapping may be torn,
   and the caller answers its API's error instead of reading it. */
int mokka_settled_slow(const struct mokka_state *s);

static inline int mokka_settled(const struct mokka_state *s)
{
    return __builtin_expect(!(__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) & 1), 1) || mokka_settled_slow(s);
}

/* One field into a variable of its type. */
#define MOKKA_SNAP(s, field, out) mokka_read((s), &(field), &(out), sizeof(out))

/* One consistent copy of GPU `index`'s whole record. */
static inline void mokka_read_gpu(const struct mokka_state *s, unsigned index, struct mokka_gpu *out)
{
    mokka_read(s, &s->gpus[index], out, sizeof(*out));
}

/* A NUL-terminated copy of a char array field (n: the field's size, at most `room`). */
void mokka_read_string(const struct mokka_state *s, const char *field, size_t n, char *out, size_t room);

/* ---- MIG (docs/mig.md) ------------------------------------------------------------------ */

/* One GPU's MIG section from one publish, made safe to index: counts clamped to their arrays,
   strings terminated, every gi_slot naming a listed GPU instance (a torn or hostile record
   never reads past an array). The same names as the GPU record's fields, less the mig_ prefix. */
struct mokka_mig_snapshot {
    uint32_t capable, mode, pending;                     /* pending: the mode the next reset activates */
    uint32_t gi_count, dev_count, proc_count;
    uint64_t bar1_total;                                 /* bytes, the whole GPU's */
    uint32_t remaining[MOKKA_MAX_MIG_PROFILES];          /* mig_gi_remaining */
    struct mokka_mig_gi gi[MOKKA_MAX_GPU_INSTANCES];     /* by id */
    struct mokka_mig_device dev[MOKKA_MAX_MIG_DEVICES];  /* MIG device order */
    struct mokka_gpu_process procs[MOKKA_MAX_GPU_PROCS]; /* only with MOKKA_MIG_WITH_PROCESSES */
};

#define MOKKA_MIG_WITH_PROCESSES 1u /* also the GPU's process list, from the same publish */

/* GPU `index`'s MIG section (index < mokka_gpu_count(s)); flags: MOKKA_MIG_WITH_PROCESSES. */
void mokka_read_mig(const struct mokka_state *s, unsigned index, struct mokka_mig_snapshot *out, unsigned flags);

/* The board's GPU instance profiles: how many (at most MOKKA_MAX_MIG_PROFILES; 0 without MIG),
   and profile k of them, made safe like a snapshot. The tables never change while a daemon runs. */
unsigned mokka_mig_profile_count(const struct mokka_state *s);
void mokka_read_mig_profile(const struct mokka_state *s, unsigned k, struct mokka_mig_profile *out);

/* The board's profile whose NVML_GPU_INSTANCE_PROFILE_* (by_index) or reported id is `key`:
   its position in the table (what mig_gi_remaining is indexed by) and *out, or -1. */
int mokka_find_mig_profile(const struct mokka_state *s, unsigned key, int by_index, struct mokka_mig_profile *out);

/* ---- PCI bus ids ----------------------------------------------------------------------- */

struct mokka_bus_id {
    unsigned domain, bus, device, function;
};

/* The forms both NVML and CUDA document, hex digits in any case: domain:bus:device.function,
   domain:bus:device and bus:device.function (domain 0, function 0 where left out).
   0 on success, -1 for anything else. */
int mokka_parse_bus_id(const char *text, struct mokka_bus_id *out);

/* Is GPU `index` of s the device that id names (function 0: a GPU is one function)? */
int mokka_bus_id_is(const struct mokka_state *s, unsigned index, const struct mokka_bus_id *id);

#pragma GCC visibility pop

#endif /* MOKKA_CLIENT_H */
