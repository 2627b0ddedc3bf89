/*
 * mokka_view.h -- which of the node's devices this process may use, decided as the driver
 * decides it: by the device nodes the process can open (docs/containers.md).
 *
 *   - No /dev/nvidiactl at all: the host's view, every GPU and MIG device (a shell on a host
 *     where nothing made the nodes; `eval "$(mokka env)"`). Once nvidiactl is there (a
 *     container, `mokka run`, a host whose nodes nvidia-modprobe made), the rule applies:
 *   - GPU i is visible when /dev/nvidia<minor> is a character device with the driver's major
 *     and that minor, and the process may read and write it (faccessat, effective ids);
 *   - a MIG device of a visible GPU is visible when the process may read the MIG monitor
 *     capability (/dev/nvidia-caps/nvidia-cap2, which lets a monitor see every instance), or
 *     both its GPU instance's and its compute instance's capability nodes
 *     (/dev/nvidia-caps/nvidia-cap<minor>, the minors of proc/driver/nvidia-caps/mig-minors).
 *   - Visible GPUs are numbered from 0 in the node's (PCI) order; minors, bus ids and UUIDs
 *     stay the node's.
 *
 * Decided once, at the shim's init (and re-init): a few stat/faccessat calls and one readdir.
 * The getters never look at it: a handle of an invisible GPU is never handed out.
 */
#ifndef MOKKA_VIEW_H
#define MOKKA_VIEW_H

#include "mokka_state.h"

#include <stdint.h>

#pragma GCC visibility push(hidden)

#define MOKKA_VIEW_CAPS 4352u /* nvidia-caps minors remembered: MIG's 3..4322, fabric-imex-mgmt 4323 */

struct mokka_view {
    uint32_t whole;                           /* no /dev/nvidiactl: everything is visible */
    uint32_t count;                           /* visible GPUs */
    uint8_t gpu[MOKKA_MAX_GPUS];              /* visible index -> the node's GPU index */
    int16_t index[MOKKA_MAX_GPUS];            /* the node's GPU index -> visible index, or -1 */
    uint32_t mig_all;                         /* the monitor capability: every MIG device */
    uint8_t caps[MOKKA_VIEW_CAPS / 8];        /* nvidia-cap<minor> may be read */
};

/* Decide what this process sees of the node in s (its /dev now). Thread-safe in itself; the
   caller publishes *v under its own lock. errno is preserved. */
void mokka_view_decide(const struct mokka_state *s, struct mokka_view *v);

/* The view of the whole node (count GPUs), as without /dev/nvidiactl. */
void mokka_view_whole(unsigned count, struct mokka_view *v);

/* Is the MIG device whose GPU instance has capability minor gi_minor and whose compute
   instance has ci_minor visible (its GPU being visible)? */
static inline int mokka_view_mig(const struct mokka_view *v, uint32_t gi_minor, uint32_t ci_minor)
{
    if (v->whole || v->mig_all)
        return 1;
    return gi_minor < MOKKA_VIEW_CAPS && ci_minor < MOKKA_VIEW_CAPS && (v->caps[gi_minor / 8] >> (gi_minor % 8) & 1) &&
           (v->caps[ci_minor / 8] >> (ci_minor % 8) & 1);
}

/* The node's GPU index of visible index i, or -1 when there is none (or the node has fewer GPUs
   than when the view was decided). */
static inline int mokka_view_node(const struct mokka_view *v, unsigned i, unsigned gpu_count)
{
    return i < v->count && v->gpu[i] < gpu_count ? (int)v->gpu[i] : -1;
}

struct mokka_mig_snapshot;
/* Drop from a GPU's MIG snapshot (mokka_client.h) the MIG devices the view hides, keeping the
   order of the rest; what is left is what the process enumerates. */
void mokka_view_filter_mig(const struct mokka_view *v, struct mokka_mig_snapshot *m);

#pragma GCC visibility pop

#endif /* MOKKA_VIEW_H */
