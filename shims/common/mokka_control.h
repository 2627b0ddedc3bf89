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

#define MOKKA_CONTROL_SUFFIX ".ctl.sock"
#define MOKKA_CONTROL_TIMEOUT_MS 2000
#define MOKKA_CONTROL_MAX 512 /* bytes of a request or reply line, newline included */

/* The reply's first word, and what happened when there was none. */
enum mokka_ctl_status {
    MOKKA_CTL_OK = 0,
    MOKKA_CTL_NO_PERMISSION,    /* "no_permission": neither root nor the control group */
    MOKKA_CTL_INVALID_ARGUMENT, /* "invalid_argument": refused, nothing changed */
    MOKKA_CTL_NOT_SUPPORTED,    /* "not_supported": the board does not offer it */
    MOKKA_CTL_GPU_IS_LOST,      /* "gpu_is_lost" */
    MOKKA_CTL_BUSY,             /* "busy": too many connections from this uid */
    MOKKA_CTL_ERROR,            /* "error", or a reply no client knows */
    MOKKA_CTL_NO_DAEMON,        /* no socket, nobody listening, or no reply in time */
    MOKKA_CTL_INSUFFICIENT_RESOURCES, /* "insufficient_resources": no room for a MIG instance */
    MOKKA_CTL_IN_USE,           /* "in_use": MIG instances or processes are on it */
    MOKKA_CTL_NOT_FOUND,        /* "not_found": no MIG instance of that id */
};

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
