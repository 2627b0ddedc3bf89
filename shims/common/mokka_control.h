/*
 * mokka_control.h -- the shims' client of the daemon's control socket, <state path>.ctl.sock
 * (protocol in docs/setters.md): one command line of the vocabulary in, one reply line out,
 * sent by the daemon once the change is published. NVML's setters use it (and nvidia-smi's
 * configuration commands, through NVML).
 *
 * Bounded: the whole exchange, connect included, takes at most MOKKA_CONTROL_TIMEOUT_MS; a
 * missing, dead or hung daemon is MOKKA_CTL_NO_DAEMON, never a hang. Thread-safe, errno
 * preserved, no signal raised (a closed peer is not a SIGPIPE). Hidden, like mokka_client.h.
 */
#ifndef MOKKA_CONTROL_H
#define MOKKA_CONTROL_H

#include <stddef.h>

#pragma GCC visibility push(hidden)

/* BEGIN PROTOCOL -- the one definition of the control protocol: the daemon
   (mokkafs/daemon/control_protocol.py parses this region) and the shims read these lines. */
#define MOKKA_CONTROL_SUFFIX ".ctl.sock"
#define MOKKA_CONTROL_TIMEOUT_MS 2000 /* what a caller waits, all told, before it gives up on the daemon */
#define MOKKA_CONTROL_MAX 512         /* bytes of a request or reply line, newline included */
/* A reply's first word, in this order. Each shim maps it to its API's error (docs/setters.md). */
#define MOKKA_CTL_REPLIES(X)                                                                   \
    X(OK, "ok")                                                                                \
    X(NO_PERMISSION, "no_permission")       /* neither root nor the control group */           \
    X(INVALID_ARGUMENT, "invalid_argument") /* refused: it did not parse or fit; nothing changed */ \
    X(NOT_SUPPORTED, "not_supported")       /* the board does not offer it */                  \
    X(GPU_IS_LOST, "gpu_is_lost")           /* the GPU fell off the bus */                     \
    X(BUSY, "busy")                         /* too many connections from this uid */           \
    X(ERROR, "error")                       /* the daemon failed (its log says why), or a reply no client knows */ \
    X(INSUFFICIENT_RESOURCES, "insufficient_resources") /* no room for a MIG instance */      \
    X(IN_USE, "in_use")                     /* MIG instances or processes are on it */         \
    X(NOT_FOUND, "not_found")               /* no MIG instance of that id */
/* END PROTOCOL */

/* The reply's first word, and what happened when there was none. */
#define MOKKA_CTL_ENUM(name, word) MOKKA_CTL_##name,
enum mokka_ctl_status {
    MOKKA_CTL_REPLIES(MOKKA_CTL_ENUM)
    MOKKA_CTL_NO_DAEMON, /* no socket, nobody listening, or no reply in time */
};
#undef MOKKA_CTL_ENUM

/* Send `line` (no newline) to the control socket beside the state file the shim mapped
   (mokka_path(); MOKKA_CTL_NO_DAEMON before one was mapped). `reason` (may be NULL) gets the
   daemon's message, NUL-terminated: on success, what the command made (a MIG create's
   `gi=ID[/ci=ID] ...`, a deferred MIG mode's `pending in_use`; docs/mig.md). */
enum mokka_ctl_status mokka_control(const char *line, char *reason, size_t reason_size);

/* The daemon's answer as NVML's error (an nvmlReturn_t): one mapping for libnvidia-ml's setters
   and MIG calls and nvidia-smi's MIG commands. No answer (a dead or hung daemon, past the bounded
   wait) is NVML_ERROR_UNKNOWN, the error every setter documents for "any unexpected error". */
int mokka_ctl_nvml_error(enum mokka_ctl_status status);

#pragma GCC visibility pop

#endif /* MOKKA_CONTROL_H */
