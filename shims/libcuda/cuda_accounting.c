/*
 * libcuda's process accounting and compute modes. This process's own record (a sealed memfd the
 * daemon made for it alone, mokka_state.h) mirrors its contexts and memory, which the daemon
 * folds into NVML's process lists and memory used; every wait on the daemon is bounded, and the
 * record's descriptor and the daemon connection live as long as the process. Compute modes are
 * a flock per GPU, taken with a process's first context there.
 */
#define _GNU_SOURCE
#include "cuda_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- this process's record --------------------------------------------------------------- */

/* Everything below, and the allocation table (cuda_memory.c), is guarded by g_acct_lock. The
   process's own totals live here; its record (mokka_state.h) only mirrors them, so a record
   lost with the daemon is refilled from them. */
pthread_mutex_t g_acct_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mokka_proc_record *g_rec;     /* our record, mapped read-write; NULL: unaccounted */
static int g_rec_fd = -1;                   /* kept open: a restarted daemon re-opens it here */
static dev_t g_rec_dev;
static ino_t g_rec_ino;
static int g_conn = -1;                     /* our connection to the daemon, for pings */
static dev_t g_conn_dev;                    /* what it was, in case the program closes it and */
static ino_t g_conn_ino;                    /* the number comes back as another file */
static int g_unaccounted;                   /* no daemon, or it declined: retried after a while */
static unsigned g_since_check;              /* accounting calls since the connection was checked */
static uint64_t g_told;                     /* GPUs the daemon has folded our context in for */
static uint64_t g_told_mem;                 /* and our memory */
uint64_t g_mine[MOKKA_MAX_GPUS];            /* bytes this process has allocated, by GPU index */
static unsigned g_ctx_refs[MOKKA_MAX_GPUS]; /* contexts per GPU index */
static int g_hold_fd[MOKKA_MAX_GPUS];       /* GPU index -> its context lock's descriptor + 1 (0: none) */
static dev_t g_hold_dev[MOKKA_MAX_GPUS];
static ino_t g_hold_ino[MOKKA_MAX_GPUS];

/* One byte from the daemon's socket and, unless the daemon declines to account for us (our uid
   is at its cap), our record (a sealed memfd) in SCM_RIGHTS; -1 if the daemon does not answer
   within the timeouts. *conn gets the connection, which we keep: the daemon answers our pings on
   it. */
static int procs_from_daemon(int *conn)
{
    *conn = -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    char path[PATH_MAX];
    int dirfd = -1; /* a node under a long path: the socket through its directory (mokka_client.h) */
    if (snprintf(path, sizeof(path), "%s%s", mokka_path(), MOKKA_PROCS_SOCK_SUFFIX) >= (int)sizeof(path) ||
        mokka_unix_address(path, &addr, &dirfd) != 0)
        return -1;
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        if (dirfd >= 0)
            close(dirfd);
        return -1;
    }
    struct timeval tv = {0, 250000}; /* connect, then receive: a wedged daemon costs 0.5 s once */
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int fd = -1;
    int connected = connect(sock, (struct sockaddr *)&addr, sizeof(addr)) == 0;
    if (dirfd >= 0)
        close(dirfd);
    if (connected) /* a signal restarts the wait, only until the deadline (mokka_client.h) */
        fd = mokka_recv_fd(sock, mokka_now_ns() + 250000000ull, NULL);
    if (fd < 0) {
        close(sock);
        return -1;
    }
    *conn = sock;
    return fd;
}

/* Is descriptor fd still what we opened (dev, ino)? One the program closed, or whose number now
   names another file, must be neither used nor closed by us. */
static int still_ours(int fd, dev_t dev, ino_t ino)
{
    struct stat sb;
    return fd >= 0 && fstat(fd, &sb) == 0 && sb.st_dev == dev && sb.st_ino == ino;
}

static void after_fork_child(void)
{
    /* The child is another process with no contexts: the parent's record and connection are the
       parent's (the daemon knows the parent by them), so the child lets go of both and gets its
       own on its first context. The child has one thread, so unmapping is safe here. Its
       contexts and allocation table are dropped by cuda_context.c's and cuda_memory.c's own
       handlers. */
    pthread_mutex_init(&g_lock, NULL);
    pthread_mutex_init(&g_acct_lock, NULL);
    if (g_rec)
        munmap(g_rec, sizeof(*g_rec));
    g_rec = NULL;
    if (still_ours(g_rec_fd, g_rec_dev, g_rec_ino)) /* not a number the program reused */
        close(g_rec_fd);
    if (still_ours(g_conn, g_conn_dev, g_conn_ino))
        close(g_conn);
    g_rec_fd = g_conn = -1;
    for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++) {
        /* close, never LOCK_UN: the lock belongs to the open file the parent still holds */
        if (g_hold_fd[gi] && still_ours(g_hold_fd[gi] - 1, g_hold_dev[gi], g_hold_ino[gi]))
            close(g_hold_fd[gi] - 1);
        g_hold_fd[gi] = 0;
    }
    g_unaccounted = 0;
    g_since_check = 0;
    g_told = g_told_mem = 0;
    memset(g_mine, 0, sizeof(g_mine));
    memset(g_ctx_refs, 0, sizeof(g_ctx_refs));
}

__attribute__((constructor)) static void register_fork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

static uint64_t ctx_mask(void)
{
    uint64_t m = 0;
    for (unsigned gi = 0; gi < MOKKA_MAX_GPUS; gi++)
        if (g_ctx_refs[gi])
            m |= 1ull << gi;
    return m;
}

static void drop_conn(void)
{
    if (still_ours(g_conn, g_conn_dev, g_conn_ino))
        close(g_conn);
    g_conn = -1;
}

/* Connect and take the record the daemon gives (our own again after a daemon restart, or a
   fresh one); a record without the seals, of another size or header is refused, which only
   turns accounting off. A new record is filled from our totals. Called on the first context,
   not in cuInit, which stays off the daemon's round trip. */
static void map_procs(void)
{
    drop_conn();
    int conn, fd = procs_from_daemon(&conn);
    if (fd < 0) {
        g_unaccounted = 1;
        return;
    }
    struct stat sb, cb;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(conn, &cb) != 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (size_t)sb.st_size != sizeof(struct mokka_proc_record) || seals < 0 ||
        (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        goto refuse;
    g_conn = conn;
    g_conn_dev = cb.st_dev;
    g_conn_ino = cb.st_ino;
    if (g_rec && sb.st_dev == g_rec_dev && sb.st_ino == g_rec_ino) { /* the daemon kept ours */
        close(fd);
        return;
    }
    void *m = mmap(NULL, sizeof(struct mokka_proc_record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        g_conn = -1;
        goto refuse;
    }
    struct mokka_proc_record *r = m;
    if (r->magic != MOKKA_PROCS_MAGIC || r->version != MOKKA_PROCS_VERSION || r->size != sizeof(*r)) {
        munmap(m, sizeof(*r));
        g_conn = -1;
        goto refuse;
    }
    __atomic_store_n(&r->contexts, ctx_mask(), __ATOMIC_RELAXED);
    for (int gi = 0; gi < MOKKA_MAX_GPUS; gi++) {
        __atomic_store_n(&r->mem[gi], g_mine[gi], __ATOMIC_RELAXED);
        const struct mig_view *m = &g_mig_of[gi];
        __atomic_store_n(&r->mig[gi], m->on ? MOKKA_PROC_ON_MIG | m->gi << 8 | m->ci : 0u, __ATOMIC_RELAXED);
    }
    if (g_rec) /* only ever touched under g_acct_lock, which we hold */
        munmap(g_rec, sizeof(*g_rec));
    if (g_rec_fd >= 0 && still_ours(g_rec_fd, g_rec_dev, g_rec_ino))
        close(g_rec_fd);
    g_rec = r;
    g_rec_fd = fd;
    g_rec_dev = sb.st_dev;
    g_rec_ino = sb.st_ino;
    g_told = g_told_mem = 0; /* a new daemon, or a new record: tell it again */
    return;
refuse:
    close(fd);
    close(conn);
    g_unaccounted = 1;
}

/* Take our record, once (retried after a while when there was none: mokka_sync_slot). */
static void claim_slot(void)
{
    if (!g_rec && !g_unaccounted)
        map_procs();
}

/* Is the daemon still at the other end? A closed connection (the daemon restarted, or the program
   closed our descriptor) is made again, which gives back our record or a new one. Checked once
   every 4096 calls, so the allocation fast path stays a few stores. */
void mokka_sync_slot(void)
{
    if (++g_since_check < 4096) {
        claim_slot();
        return;
    }
    int saved = errno;
    g_since_check = 0;
    if (g_unaccounted) {
        g_unaccounted = 0; /* a daemon may be up, its cap may have room */
    } else if (g_rec) {
        struct pollfd p = {.fd = g_conn, .events = POLLIN};
        char c;
        if (!still_ours(g_conn, g_conn_dev, g_conn_ino) ||
            (poll(&p, 1, 0) == 1 && ((p.revents & (POLLHUP | POLLERR)) || recv(g_conn, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)))
            map_procs();
    }
    claim_slot();
    errno = saved;
}

/* Ask the daemon to fold our record into what NVML shows, and wait (bounded) until it has; a
   daemon that does not answer in time costs this call 200 ms and nothing else. A connection
   found closed is made again once. */
static void tell_daemon(void)
{
    int saved = errno;
    for (int attempt = 0; attempt < 2 && g_rec; attempt++) {
        if (!still_ours(g_conn, g_conn_dev, g_conn_ino)) {
            map_procs();
            continue;
        }
        char buf[64];
        while (recv(g_conn, buf, sizeof(buf), MSG_DONTWAIT) > 0) /* late answers to earlier pings */
            ;
        if (send(g_conn, "?", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
            map_procs();
            continue;
        }
        struct timespec now, end;
        clock_gettime(CLOCK_MONOTONIC, &end);
        end.tv_nsec += 200000000L;
        if (end.tv_nsec >= 1000000000L) {
            end.tv_sec++;
            end.tv_nsec -= 1000000000L;
        }
        for (;;) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            long left_ms = (long)(end.tv_sec - now.tv_sec) * 1000L + (end.tv_nsec - now.tv_nsec) / 1000000L;
            struct pollfd p = {.fd = g_conn, .events = POLLIN};
            int n = left_ms > 0 ? poll(&p, 1, (int)left_ms) : 0;
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) { /* no answer in time: go on, listed at the daemon's next tick */
                errno = saved;
                return;
            }
            break;
        }
        if (recv(g_conn, buf, 1, MSG_DONTWAIT) == 1) {
            errno = saved;
            return;
        }
        map_procs(); /* closed: the daemon restarted */
    }
    errno = saved;
}

/* Mirror our total on GPU index gi into the record; the first time we have memory there, have
   the daemon list it at once. */
void mokka_publish_mem(unsigned gi)
{
    if (!g_rec)
        return;
    __atomic_store_n(&g_rec->mem[gi], LOAD(&g_mine[gi]), __ATOMIC_RELAXED);
    if (g_mine[gi] && !(g_told_mem >> gi & 1)) {
        g_told_mem |= 1ull << gi;
        tell_daemon();
    }
}

/* Bytes that count against us on GPU index gi, as the daemon last told our record: our uid's
   other processes' and root's. Clamped: it is the record, and we may have scribbled on it. */
uint64_t mokka_others_used(unsigned gi, uint64_t cap)
{
    if (!g_rec)
        return 0;
    uint64_t v = __atomic_load_n(&g_rec->others[gi], __ATOMIC_RELAXED);
    return v < cap ? v : cap;
}

/* Usable memory and what the pin (if any) says is used. */
void mokka_memory_limits(unsigned gi, uint64_t *total, uint64_t *usable, uint64_t *pinned)
{
    if (g_mig_of[gi].on) { /* a MIG device: its GPU instance's memory, all of it usable, no pin */
        *total = *usable = g_mig_of[gi].mem_total;
        *pinned = 0;
        return;
    }
    const struct mokka_gpu *g = &state()->gpus[gi];
    uint64_t t, reserved, used;
    uint32_t is_pinned;
    MOKKA_CONSISTENT(state()) {
        t = g->mem_total;
        reserved = g->mem_reserved;
        used = g->mem_used;
        is_pinned = g->mem_used_pinned;
    }
    *total = t;
    *usable = t > reserved ? t - reserved : 0;
    *pinned = is_pinned ? used : 0;
}

/* ---- compute modes ----------------------------------------------------------------------

   The GPU's compute mode is in the state (NVML's numbers, which are CUDA's). PROHIBITED refuses
   every new context. The kernel arbitrates EXCLUSIVE_PROCESS: each GPU has a lock file the daemon
   made next to the state (<state>.procs.lock<N>), and a process holds a flock on it while it has
   any context on that GPU: exclusive in EXCLUSIVE_PROCESS mode, shared otherwise, so a process
   that took its context before the mode changed still keeps a later exclusive one out. flock
   needs only a read-only descriptor (a pod's read-only mount will do), never blocks here
   (LOCK_NB), and dies with its holder, kill -9 included. No daemon round trip. */

/* Take GPU index gi's lock for this process's first context there. Called with g_acct_lock held.
   No lock file (a daemon from before compute modes, or one removed) means nothing to arbitrate
   with: the context is allowed. */
static CUresult hold_gpu(unsigned gi)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s%s%u", mokka_path(), MOKKA_PROCS_LOCK_SUFFIX, gi) >= (int)sizeof(path))
        return CUDA_SUCCESS;
    int saved = errno;
    int exclusive = compute_mode(gi) == CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0)
            close(fd);
        errno = saved;
        return CUDA_SUCCESS;
    }
    int r;
    while ((r = flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB)) < 0 && errno == EINTR)
        ;
    if (r < 0) { /* another process holds it: refused if exclusive, else allowed without it */
        close(fd);
        errno = saved;
        return exclusive ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS;
    }
    g_hold_fd[gi] = fd + 1;
    g_hold_dev[gi] = sb.st_dev;
    g_hold_ino[gi] = sb.st_ino;
    errno = saved;
    return CUDA_SUCCESS;
}

/* Our last context on GPU index gi is gone: let another process have it. */
static void let_go_gpu(unsigned gi)
{
    if (g_hold_fd[gi] && still_ours(g_hold_fd[gi] - 1, g_hold_dev[gi], g_hold_ino[gi])) {
        int saved = errno;
        close(g_hold_fd[gi] - 1);
        errno = saved;
    }
    g_hold_fd[gi] = 0;
}

/* One context more (delta +1) or fewer (-1) on GPU index gi. The first takes the GPU's lock and
   fails with DEVICE_UNAVAILABLE when another process holds it in EXCLUSIVE_PROCESS mode; the last
   lets it go. */
CUresult mokka_context_ref(unsigned gi, int delta)
{
    CUresult res = CUDA_SUCCESS;
    pthread_mutex_lock(&g_acct_lock);
    if (delta > 0 && g_ctx_refs[gi] == 0)
        res = hold_gpu(gi);
    if (res == CUDA_SUCCESS && (delta > 0 || g_ctx_refs[gi] > 0)) {
        g_ctx_refs[gi] += (unsigned)delta;
        if (g_ctx_refs[gi] == 0)
            let_go_gpu(gi);
        mokka_sync_slot();
        if (g_rec) {
            __atomic_store_n(&g_rec->contexts, ctx_mask(), __ATOMIC_RELAXED);
            if (g_ctx_refs[gi] && !(g_told >> gi & 1)) { /* a first context here: listed at once */
                g_told |= 1ull << gi;
                tell_daemon();
            }
        }
    }
    pthread_mutex_unlock(&g_acct_lock);
    return res;
}

