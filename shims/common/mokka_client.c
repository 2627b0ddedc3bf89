/*
 * mokka_client.c -- finding, mapping, validating and re-checking the shared state for the
 * three shims (see mokka_client.h). Only the slow paths live here; the reads are inline.
 *
 * Mappings are never unmapped: a thread may be inside a read of one at any time, and a
 * munmap under it is a SIGSEGV in the host. A replaced file leaves its mapping behind (one per
 * replacement, which only root can cause); the kernel drops them all at exit.
 */
#define _GNU_SOURCE
#include "mokka_client.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* What the rest of the shims are allowed to rely on; a layout change that breaks one of these
   must change the readers too. (Sizes of the records are free to grow with the version.) */
_Static_assert(offsetof(struct mokka_state, magic) == 0, "magic first: a reader checks it before anything");
_Static_assert(offsetof(struct mokka_state, version) == 8 && offsetof(struct mokka_state, gpu_count) == 12 &&
                   offsetof(struct mokka_state, size) == 16,
               "the header a reader validates with one pread, before it maps anything");
_Static_assert(offsetof(struct mokka_state, seq) / 64 == 0 && offsetof(struct mokka_state, generation) / 64 == 0,
               "magic, seq and generation share the first cache line: the fast path's checks cost one line");
_Static_assert(offsetof(struct mokka_state, seq) % 4 == 0 && offsetof(struct mokka_state, event_wake) % 4 == 0,
               "seq and the futex word are aligned 32-bit words");
_Static_assert(offsetof(struct mokka_state, event_head) % 8 == 0 && offsetof(struct mokka_state, generation) % 8 == 0,
               "64-bit counters are naturally aligned, so single loads of them never tear");
_Static_assert(offsetof(struct mokka_state, gpus) % 8 == 0 && sizeof(struct mokka_gpu) % 8 == 0,
               "every GPU record starts 8-byte aligned");
_Static_assert(sizeof(((struct mokka_gpu *)0)->processes) / sizeof(struct mokka_gpu_process) == MOKKA_MAX_GPU_PROCS,
               "a process list holds MOKKA_MAX_GPU_PROCS entries");
_Static_assert(sizeof(struct mokka_state) % 8 == 0, "the file is whole 64-bit words");
_Static_assert(MOKKA_STATE_RETIRED != MOKKA_STATE_MAGIC, "a retired file must fail the magic check");

const struct mokka_state *mokka_mapped;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* opening and re-checking */
static char g_path[PATH_MAX];                              /* guarded by g_lock */
static dev_t g_dev;
static ino_t g_ino;
static const void *g_anchor;
static uint32_t g_stuck_seq;                               /* see mokka_section_retry */
static uint64_t g_seen_generation, g_seen_ns, g_checked_ns; /* the re-check's clock */

#define MS 1000000ull
#define RECHECK_HEADER_NS (10 * MS)  /* a bad header: look at the path at most this often */
#define RECHECK_STALL_NS (1000 * MS) /* a generation that has not moved for this long */

/* A fork while another thread holds the lock would leave the child's copy locked forever. */
static void lock_prepare(void) { pthread_mutex_lock(&g_lock); }
static void lock_release(void) { pthread_mutex_unlock(&g_lock); }
__attribute__((constructor)) static void client_atfork(void) { pthread_atfork(lock_prepare, lock_release, lock_release); }

uint64_t mokka_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* See mokka_client.h. */
int mokka_recv_fd(int sock, uint64_t deadline_ns, int *got_byte)
{
    char byte;
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    ssize_t got = -1;
    struct msghdr msg;
    for (;;) {
        uint64_t now = mokka_now_ns();
        if (now >= deadline_ns)
            break;
        uint64_t left = deadline_ns - now;
        struct timeval tv = {(time_t)(left / 1000000000ull), (suseconds_t)(left % 1000000000ull / 1000)};
        if (tv.tv_sec == 0 && tv.tv_usec == 0)
            tv.tv_usec = 1;
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        msg = (struct msghdr){.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
        got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (got >= 0 || errno != EINTR)
            break;
    }
    if (got_byte)
        *got_byte = got == 1;
    int fd = -1;
    for (struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL; c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int passed;
            memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fd < 0 && got == 1 && c->cmsg_len == CMSG_LEN(sizeof(int)))
                fd = passed;
            else
                close(passed);
        }
    }
    return fd;
}

/* ---- discovery -------------------------------------------------------------------------- */

void mokka_set_anchor(const void *address_in_object) { g_anchor = address_in_object; }

/* The file this shim was loaded from, resolved: dladdr's name for a library, /proc/self/exe
   for a program (whose dladdr name is only argv[0]). 0 if neither is known. */
static int own_object(char *out)
{
    Dl_info info;
    const void *anchor = g_anchor ? g_anchor : (const void *)&mokka_open;
    if (dladdr(anchor, &info) && info.dli_fname && strchr(info.dli_fname, '/') && realpath(info.dli_fname, out))
        return 1;
    return realpath("/proc/self/exe", out) != NULL;
}

/* The driver root R of a shim at <R>/<dir>/<dir>/<file> (usr/lib64, usr/bin, usr/lib/<triplet>
   less one level: any two directories); 0 if unknown. */
static int driver_root(char *obj)
{
    if (!own_object(obj))
        return 0;
    for (int up = 0; up < 3; up++) { /* the file, then usr/lib64 (or usr/bin) */
        char *slash = strrchr(obj, '/');
        if (!slash)
            return 0;
        *slash = '\0';
    }
    return 1;
}

/* <R>/run/mokka/state for a shim at <R>/<dir>/<dir>/<file>, when <R>/run/mokka is a directory
   (a mounted tree's driver root links it to the node's state directory; a container gets the
   state directory there). The directory is resolved, so later opens do not walk the tree. */
static int driver_root_state(const char *root, char *out, size_t n)
{
    char dir[PATH_MAX], real[PATH_MAX];
    struct stat sb;
    if (snprintf(dir, sizeof(dir), "%s/run/mokka", root) >= (int)sizeof(dir) || stat(dir, &sb) != 0 ||
        !S_ISDIR(sb.st_mode) || !realpath(dir, real))
        return 0;
    return snprintf(out, n, "%s/state", strcmp(real, "/") ? real : "") < (int)n;
}

/* <R>/run/nvidia-persistenced/socket, when it is a socket: what NVIDIA's CDI specs mount from a
   driver root, and in a mount's driver root the node's socket (docs/containers.md). */
static int driver_root_socket(const char *root, char *out, size_t n)
{
    struct stat sb;
    return snprintf(out, n, "%s%s", root, MOKKA_NODE_SOCKET) < (int)n && stat(out, &sb) == 0 && S_ISSOCK(sb.st_mode);
}

void mokka_discover(char *out, size_t n)
{
    int saved = errno;
    const char *env = getenv(MOKKA_STATE_ENV);
    char root[PATH_MAX];
    if (env && *env) {
        snprintf(out, n, "%s", env);
        errno = saved;
        return;
    }
    int have_root = driver_root(root); /* only now: it resolves the shim's path, a few syscalls */
    if (have_root && driver_root_state(root, out, n))
        ;
    else if (have_root && strcmp(root, "") != 0 && driver_root_socket(root, out, n))
        ;
    else if (!driver_root_socket("", out, n))
        out[0] = '\0'; /* no node: never another one's default place */
    errno = saved;
}

/* A descriptor of the state file from the node's socket at `path` (mokkafs/node_socket.py): one
   byte and the descriptor in SCM_RIGHTS; -1 if nothing answers so within the timeouts (a real
   nvidia-persistenced's socket says nothing). */
static int fd_from_socket(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int dirfd = -1;
    if (mokka_unix_address(path, &addr, &dirfd) != 0)
        return -1;
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int fd = -1;
    if (sock >= 0) {
        struct timeval tv = {0, 250000};
        setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(sock, (struct sockaddr *)&addr, sizeof(addr)) == 0)
            fd = mokka_recv_fd(sock, mokka_now_ns() + 250000000ull, NULL);
        close(sock);
    }
    if (dirfd >= 0)
        close(dirfd);
    return fd;
}

const char *mokka_path(void) { return g_path; }

/* ---- open, validate, map ---------------------------------------------------------------- */

struct header {
    uint64_t magic;
    uint32_t version, gpu_count;
    uint64_t size;
};

/* The file at `path`, measured, then validated from its header (read, not mapped), then
   mapped. *m is the mapping to use: the current one if the path still names its file. Called
   with g_lock held. */
static enum mokka_status open_path(const char *path, const struct mokka_state **m, dev_t *dev, ino_t *ino)
{
    if (!path[0])
        return MOKKA_ABSENT;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENXIO) /* a socket: the node's, which hands over the state file */
        fd = fd_from_socket(path);
    if (fd < 0)
        return MOKKA_ABSENT;
    struct stat sb;
    struct header h;
    enum mokka_status r = MOKKA_ABSENT;
    const struct mokka_state *cur = __atomic_load_n(&mokka_mapped, __ATOMIC_ACQUIRE);
    /* Short is absent, not a mismatch: it is never mapped past its end, so never a SIGBUS. */
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < sizeof(struct mokka_state))
        goto out;
    *dev = sb.st_dev;
    *ino = sb.st_ino;
    if (cur && sb.st_dev == g_dev && sb.st_ino == g_ino) { /* the file we have: nothing to map */
        *m = cur;
        r = MOKKA_OK;
        goto out;
    }
    r = MOKKA_MISMATCH;
    if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || h.magic != MOKKA_STATE_MAGIC ||
        h.version != MOKKA_STATE_VERSION || h.size != sizeof(struct mokka_state) || h.gpu_count > MOKKA_MAX_GPUS)
        goto out;
    r = MOKKA_ABSENT;
    void *p = mmap(NULL, sizeof(struct mokka_state), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        goto out;
    const struct mokka_state *s = p;
    /* The header again, through the mapping: it may have changed since the pread. */
    if (s->magic != MOKKA_STATE_MAGIC || s->version != MOKKA_STATE_VERSION || s->size != sizeof(struct mokka_state) ||
        s->gpu_count > MOKKA_MAX_GPUS) {
        munmap(p, sizeof(struct mokka_state)); /* nobody has seen it */
        r = MOKKA_MISMATCH;
        goto out;
    }
    *m = s;
    r = MOKKA_OK;
out:
    close(fd);
    return r;
}

/* Make `m` (from `path`) the mapping every reader uses. Called with g_lock held. */
static void adopt(const char *path, const struct mokka_state *m, dev_t dev, ino_t ino)
{
    if (path != g_path)
        snprintf(g_path, sizeof(g_path), "%s", path);
    g_dev = dev;
    g_ino = ino;
    if (m != __atomic_load_n(&mokka_mapped, __ATOMIC_RELAXED)) {
        __atomic_store_n(&g_seen_generation, __atomic_load_n(&m->generation, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        __atomic_store_n(&g_seen_ns, mokka_now_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&mokka_mapped, m, __ATOMIC_RELEASE);
    }
}

enum mokka_status mokka_open(void)
{
    int saved = errno;
    char path[PATH_MAX];
    mokka_discover(path, sizeof(path));
    pthread_mutex_lock(&g_lock);
    const struct mokka_state *m = NULL;
    dev_t dev = 0;
    ino_t ino = 0;
    enum mokka_status r = open_path(path, &m, &dev, &ino);
    if (r == MOKKA_OK)
        adopt(path, m, dev, ino);
    pthread_mutex_unlock(&g_lock);
    errno = saved;
    return r;
}

/* ---- staying on the node's file ---------------------------------------------------------- */

/* Does the path still name the file we map? If it names another valid one (the daemon's
   repair of a replaced or removed file, or a new daemon's), map that. Anything else keeps the
   current mapping: its last values are better than none, and the daemon repairs in a tick. */
static void recheck(void)
{
    if (pthread_mutex_trylock(&g_lock) != 0)
        return; /* another thread is at it */
    const struct mokka_state *m = NULL;
    dev_t dev = 0;
    ino_t ino = 0;
    if (g_path[0] && open_path(g_path, &m, &dev, &ino) == MOKKA_OK)
        adopt(g_path, m, dev, ino);
    pthread_mutex_unlock(&g_lock);
}

/* Rarely taken: the mapping's magic is not ours (a retired file, or an overwritten header), or
   a poller's once-a-round call (mokka_state_checked). */
const struct mokka_state *mokka_state_slow(const struct mokka_state *s)
{
    int saved = errno;
    uint64_t now = mokka_now_ns();
    if (__atomic_load_n(&s->magic, __ATOMIC_RELAXED) != MOKKA_STATE_MAGIC) {
        uint64_t last = __atomic_load_n(&g_checked_ns, __ATOMIC_RELAXED);
        if (now - last >= RECHECK_HEADER_NS) {
            __atomic_store_n(&g_checked_ns, now, __ATOMIC_RELAXED);
            recheck();
        }
    } else {
        /* The daemon bumps the generation every tick (100 ms). One that stood still for a
           second is a dead daemon, or a file nobody writes: look at the path once a second. */
        uint64_t gen = __atomic_load_n(&s->generation, __ATOMIC_RELAXED);
        if (gen != __atomic_load_n(&g_seen_generation, __ATOMIC_RELAXED)) {
            __atomic_store_n(&g_seen_generation, gen, __ATOMIC_RELAXED);
            __atomic_store_n(&g_seen_ns, now, __ATOMIC_RELAXED);
        } else if (now - __atomic_load_n(&g_seen_ns, __ATOMIC_RELAXED) >= RECHECK_STALL_NS) {
            __atomic_store_n(&g_seen_ns, now, __ATOMIC_RELAXED);
            recheck();
        }
    }
    errno = saved;
    return __atomic_load_n(&mokka_mapped, __ATOMIC_ACQUIRE);
}

/* ---- the seqlock read ------------------------------------------------------------------- */

/* The copy just made may be torn: try again, a bounded number of times. A writer that died
   mid-publish leaves seq odd forever; once one wait on that value timed out, later reads that
   find it take their copy at once (a -q of 8 GPUs would otherwise wait once per field). */
void mokka_section_retry(struct mokka_section *r)
{
    uint32_t a = r->seq;
    if ((a & 1) && a == __atomic_load_n(&g_stuck_seq, __ATOMIC_RELAXED)) {
        r->done = 1;
        return;
    }
    if (++r->tries > 100000) {
        if (a & 1)
            __atomic_store_n(&g_stuck_seq, a, __ATOMIC_RELAXED);
        r->done = 1;
        return;
    }
    if (r->tries > 64) {
        int saved = errno;
        sched_yield();
        errno = saved;
    }
    r->seq = __atomic_load_n(&r->s->seq, __ATOMIC_ACQUIRE);
}

int mokka_settled_slow(const struct mokka_state *s)
{
    struct mokka_section r = {s, __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE), 0, 0};
    while (r.seq & 1) {
        mokka_section_retry(&r);
        if (r.done) /* the bounded wait ran out, or an earlier one did on this very value */
            return !(__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) & 1);
    }
    return 1;
}

void mokka_read_string(const struct mokka_state *s, const char *field, size_t n, char *out, size_t room)
{
    if (room == 0)
        return;
    if (n > room)
        n = room;
    mokka_read(s, field, out, n);
    out[n - 1] = '\0';
}

/* ---- MIG ---------------------------------------------------------------------------------- */

#define TERMINATE(field) ((field)[sizeof(field) - 1] = '\0')
#define CLAMP(n, max) ((n) = (n) > (max) ? (max) : (n))

void mokka_read_mig(const struct mokka_state *s, unsigned index, struct mokka_mig_snapshot *out, unsigned flags)
{
    const struct mokka_gpu *g = &s->gpus[index];
    int with_procs = (flags & MOKKA_MIG_WITH_PROCESSES) != 0;
    MOKKA_CONSISTENT(s) {
        out->capable = g->mig_capable;
        out->mode = g->mig_mode;
        out->pending = g->mig_pending;
        out->gi_count = g->mig_gi_count;
        out->dev_count = g->mig_device_count;
        out->bar1_total = g->bar1_total;
        memcpy(out->remaining, g->mig_gi_remaining, sizeof(out->remaining));
        memcpy(out->gi, g->mig_gi, sizeof(out->gi));
        memcpy(out->dev, g->mig_devices, sizeof(out->dev));
        out->proc_count = with_procs ? g->process_count : 0;
        if (with_procs)
            memcpy(out->procs, g->processes, sizeof(out->procs));
    }
    CLAMP(out->gi_count, MOKKA_MAX_GPU_INSTANCES);
    CLAMP(out->dev_count, MOKKA_MAX_MIG_DEVICES);
    CLAMP(out->proc_count, MOKKA_MAX_GPU_PROCS);
    for (unsigned k = 0; k < out->gi_count; k++)
        TERMINATE(out->gi[k].profile_name);
    for (unsigned k = 0; k < out->dev_count; k++) {
        struct mokka_mig_device *d = &out->dev[k];
        TERMINATE(d->name);
        TERMINATE(d->uuid);
        TERMINATE(d->profile_name);
        if (d->gi_slot >= out->gi_count)
            d->gi_slot = 0;
    }
}

unsigned mokka_mig_profile_count(const struct mokka_state *s)
{
    uint32_t n;
    MOKKA_SNAP(s, s->mig_profile_count, n);
    return n > MOKKA_MAX_MIG_PROFILES ? MOKKA_MAX_MIG_PROFILES : n;
}

void mokka_read_mig_profile(const struct mokka_state *s, unsigned k, struct mokka_mig_profile *out)
{
    mokka_read(s, &s->mig_profiles[k], out, sizeof(*out));
    TERMINATE(out->name);
    CLAMP(out->placement_count, MOKKA_MAX_MIG_PLACEMENTS);
    CLAMP(out->ci_profile_count, MOKKA_MAX_CI_PROFILES);
    for (unsigned j = 0; j < out->ci_profile_count; j++) {
        TERMINATE(out->ci_profiles[j].name);
        CLAMP(out->ci_profiles[j].placement_count, MOKKA_MAX_MIG_PLACEMENTS);
    }
}

int mokka_find_mig_profile(const struct mokka_state *s, unsigned key, int by_index, struct mokka_mig_profile *out)
{
    unsigned n = mokka_mig_profile_count(s);
    for (unsigned k = 0; k < n; k++) {
        mokka_read_mig_profile(s, k, out);
        if ((by_index ? out->index : out->id) == key)
            return (int)k;
    }
    return -1;
}

/* ---- PCI bus ids -------------------------------------------------------------------------- */

/* Up to `max` hex digits at *p, then `end` (a separator, or '\0'); advances *p past both. */
static int hex_field(const char **p, unsigned max, char end, unsigned *out)
{
    unsigned v = 0, n = 0;
    const char *q = *p;
    for (; n < max; n++, q++) {
        int c = (unsigned char)*q, d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            break;
        v = v << 4 | (unsigned)d;
    }
    if (n == 0 || *q != end)
        return -1;
    *out = v;
    *p = end ? q + 1 : q;
    return 0;
}

int mokka_parse_bus_id(const char *text, struct mokka_bus_id *out)
{
    if (!text)
        return -1;
    unsigned colons = 0, dots = 0;
    for (const char *c = text; *c; c++) {
        colons += *c == ':';
        dots += *c == '.';
    }
    struct mokka_bus_id id = {0, 0, 0, 0};
    const char *p = text;
    int bad;
    if (colons == 2 && dots == 1) /* domain:bus:device.function */
        bad = hex_field(&p, 8, ':', &id.domain) || hex_field(&p, 2, ':', &id.bus) || hex_field(&p, 2, '.', &id.device) ||
              hex_field(&p, 1, '\0', &id.function);
    else if (colons == 2 && dots == 0) /* domain:bus:device */
        bad = hex_field(&p, 8, ':', &id.domain) || hex_field(&p, 2, ':', &id.bus) || hex_field(&p, 2, '\0', &id.device);
    else if (colons == 1 && dots == 1) /* bus:device.function */
        bad = hex_field(&p, 2, ':', &id.bus) || hex_field(&p, 2, '.', &id.device) || hex_field(&p, 1, '\0', &id.function);
    else
        bad = 1;
    if (bad || id.device > 0x1f || id.function > 7)
        return -1;
    *out = id;
    return 0;
}

int mokka_bus_id_is(const struct mokka_state *s, unsigned index, const struct mokka_bus_id *id)
{
    const struct mokka_gpu *g = &s->gpus[index];
    uint32_t domain, bus, device;
    MOKKA_CONSISTENT(s) {
        domain = g->pci_domain;
        bus = g->pci_bus;
        device = g->pci_device;
    }
    return domain == id->domain && bus == id->bus && device == id->device && id->function == 0;
}

/* See mokka_client.h; mokkafs/daemon/unix_path.py binds the daemon's sockets the same way. */
int mokka_unix_address(const char *path, struct sockaddr_un *addr, int *dirfd)
{
    *dirfd = -1;
    if (snprintf(addr->sun_path, sizeof(addr->sun_path), "%s", path) < (int)sizeof(addr->sun_path))
        return 0;
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash || (size_t)(slash - path) >= sizeof(dir))
        return -1;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    *dirfd = open(dir[0] ? dir : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*dirfd < 0)
        return -1;
    if (snprintf(addr->sun_path, sizeof(addr->sun_path), "/proc/self/fd/%d/%s", *dirfd, slash + 1) <
        (int)sizeof(addr->sun_path))
        return 0;
    close(*dirfd);
    *dirfd = -1;
    return -1;
}
