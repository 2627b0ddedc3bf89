/*
 * mokka_control.c -- one request to the daemon's control socket (see mokka_control.h). A new
 * connection per request: setters are rare, a unix connect costs microseconds, and nothing is
 * held between calls (no descriptor to leak across fork or dlclose).
 */
#define _GNU_SOURCE
#include "mokka_control.h"
#include "mokka_client.h"
#include "nvml.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Bound the next blocking call on fd by what is left of the deadline; 0 when nothing is. A
   unix socket's connect waits for backlog room under SO_SNDTIMEO, so this bounds it too. */
static int time_left(int fd, long long deadline)
{
    long long left = deadline - now_ms();
    if (left <= 0)
        return 0;
    struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return 1;
}

#define MOKKA_CTL_WORD(name, word) {word, MOKKA_CTL_##name},
static const struct {
    const char *word;
    enum mokka_ctl_status status;
} g_words[] = {MOKKA_CTL_REPLIES(MOKKA_CTL_WORD)};
#undef MOKKA_CTL_WORD

static enum mokka_ctl_status parse_reply(char *reply, char *reason, size_t reason_size)
{
    char *space = strchr(reply, ' ');
    const char *message = "";
    if (space) {
        *space = '\0';
        message = space + 1;
    }
    if (reason && reason_size)
        snprintf(reason, reason_size, "%s", message);
    for (size_t i = 0; i < sizeof(g_words) / sizeof(g_words[0]); i++)
        if (strcmp(reply, g_words[i].word) == 0)
            return g_words[i].status;
    return MOKKA_CTL_ERROR;
}

/* The node's socket first hands every caller a byte and the state file's descriptor: take them
   (closing the descriptor) before the request. 0 when it did not answer so. */
static int take_handover(int fd, long long deadline)
{
    int byte = 0;
    long long left = deadline - now_ms();
    int passed = left > 0 ? mokka_recv_fd(fd, mokka_now_ns() + (uint64_t)left * 1000000ull, &byte) : -1;
    if (passed >= 0)
        close(passed);
    return byte;
}

static enum mokka_ctl_status exchange(int fd, const struct sockaddr_un *addr, int node_socket, const char *request,
                                      size_t n, char *reason, size_t reason_size)
{
    long long deadline = now_ms() + MOKKA_CONTROL_TIMEOUT_MS;
    for (;;) {
        if (!time_left(fd, deadline))
            return MOKKA_CTL_NO_DAEMON;
        if (connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0 || errno == EISCONN)
            break;
        if (errno != EINTR) /* ENOENT, ECONNREFUSED (a dead daemon's socket), EAGAIN (timed out) */
            return MOKKA_CTL_NO_DAEMON;
    }
    if (node_socket && !take_handover(fd, deadline))
        return MOKKA_CTL_NO_DAEMON;
    for (size_t sent = 0; sent < n;) {
        if (!time_left(fd, deadline))
            return MOKKA_CTL_NO_DAEMON;
        ssize_t w = send(fd, request + sent, n - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return MOKKA_CTL_NO_DAEMON;
        sent += (size_t)w;
    }
    char reply[MOKKA_CONTROL_MAX + 1];
    size_t got = 0;
    while (got < MOKKA_CONTROL_MAX) {
        if (!time_left(fd, deadline))
            return MOKKA_CTL_NO_DAEMON;
        ssize_t r = recv(fd, reply + got, MOKKA_CONTROL_MAX - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return MOKKA_CTL_NO_DAEMON; /* closed without a reply: the daemon died mid-request */
        char *nl = memchr(reply + got, '\n', (size_t)r);
        got += (size_t)r;
        if (nl) {
            *nl = '\0';
            return parse_reply(reply, reason, reason_size);
        }
    }
    return MOKKA_CTL_ERROR; /* a reply longer than any the daemon sends */
}

enum mokka_ctl_status mokka_control(const char *line, char *reason, size_t reason_size)
{
    int saved = errno;
    if (reason && reason_size)
        reason[0] = '\0';
    char request[MOKKA_CONTROL_MAX];
    int n = snprintf(request, sizeof(request), "%s\n", line);
    if (n < 0 || (size_t)n >= sizeof(request))
        return MOKKA_CTL_INVALID_ARGUMENT;
    char path[PATH_MAX];
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    const char *state = mokka_path();
    int dirfd = -1;
    /* The node found through its socket (a container given the driver root's
       run/nvidia-persistenced/socket, not the state directory): the request goes there; the
       daemon hands it to its control socket's handler (mokkafs/daemon/node_socket.py). */
    struct stat sb;
    int node_socket = state[0] && stat(state, &sb) == 0 && S_ISSOCK(sb.st_mode);
    if (!state[0] ||
        snprintf(path, sizeof(path), "%s%s", state, node_socket ? "" : MOKKA_CONTROL_SUFFIX) >= (int)sizeof(path) ||
        mokka_unix_address(path, &addr, &dirfd) != 0) {
        errno = saved;
        return MOKKA_CTL_NO_DAEMON; /* the daemon cannot bind a path this long either */
    }
    enum mokka_ctl_status r = MOKKA_CTL_NO_DAEMON;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        r = exchange(fd, &addr, node_socket, request, (size_t)n, reason, reason_size);
        close(fd);
    }
    if (dirfd >= 0)
        close(dirfd);
    errno = saved;
    return r;
}

int mokka_ctl_nvml_error(enum mokka_ctl_status status)
{
    switch (status) {
    case MOKKA_CTL_OK: return NVML_SUCCESS;
    case MOKKA_CTL_NO_PERMISSION: return NVML_ERROR_NO_PERMISSION;
    case MOKKA_CTL_INVALID_ARGUMENT: return NVML_ERROR_INVALID_ARGUMENT;
    case MOKKA_CTL_NOT_SUPPORTED: return NVML_ERROR_NOT_SUPPORTED;
    case MOKKA_CTL_GPU_IS_LOST: return NVML_ERROR_GPU_IS_LOST;
    case MOKKA_CTL_INSUFFICIENT_RESOURCES: return NVML_ERROR_INSUFFICIENT_RESOURCES;
    case MOKKA_CTL_IN_USE: return NVML_ERROR_IN_USE;
    case MOKKA_CTL_NOT_FOUND: return NVML_ERROR_NOT_FOUND;
    default: return NVML_ERROR_UNKNOWN;
    }
}
