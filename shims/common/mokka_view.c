/*
 * mokka_view.c -- deciding which of the node's devices the process can open (mokka_view.h).
 */
#define _GNU_SOURCE
#include "mokka_view.h"
#include "mokka_client.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define NVIDIA_MAJOR 195u
#define MIG_MONITOR_MINOR 2u
#define DEV_DIR "/dev"
#define CAPS_DIR "/dev/nvidia-caps"

void mokka_view_whole(unsigned count, struct mokka_view *v)
{
    memset(v, 0, sizeof(*v));
    v->whole = 1;
    v->count = count > MOKKA_MAX_GPUS ? MOKKA_MAX_GPUS : count;
    for (unsigned i = 0; i < MOKKA_MAX_GPUS; i++) {
        v->index[i] = i < v->count ? (int16_t)i : -1;
        v->gpu[i] = (uint8_t)(i < v->count ? i : 0);
    }
}

/* A character device at dirfd/name with the given minor (and major, unless any_major) that the
   process may open for `mode` with its effective ids. */
static int may_open(int dirfd, const char *name, unsigned major_want, int any_major, unsigned minor_want, int mode)
{
    struct stat sb;
    if (fstatat(dirfd, name, &sb, 0) != 0 || !S_ISCHR(sb.st_mode))
        return 0;
    if ((!any_major && major(sb.st_rdev) != major_want) || minor(sb.st_rdev) != minor_want)
        return 0;
    return faccessat(dirfd, name, mode, AT_EACCESS) == 0;
}

/* The capability nodes the process may read: one readdir, one stat and one access per node. */
static void read_caps(struct mokka_view *v)
{
    DIR *d = opendir(CAPS_DIR);
    if (!d)
        return;
    int fd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "nvidia-cap", 10) != 0 || !e->d_name[10])
            continue;
        char *end;
        unsigned long minor = strtoul(e->d_name + 10, &end, 10);
        if (*end || minor >= MOKKA_VIEW_CAPS || e->d_name[10] < '0' || e->d_name[10] > '9')
            continue;
        if (!may_open(fd, e->d_name, 0, 1, (unsigned)minor, R_OK))
            continue;
        v->caps[minor / 8] |= (uint8_t)(1u << (minor % 8));
        if (minor == MIG_MONITOR_MINOR)
            v->mig_all = 1;
    }
    closedir(d);
}

void mokka_view_decide(const struct mokka_state *s, struct mokka_view *v)
{
    int saved = errno;
    unsigned n = mokka_gpu_count(s);
    struct stat sb;
    if (lstat(DEV_DIR "/nvidiactl", &sb) != 0 && errno == ENOENT) {
        mokka_view_whole(n, v);
        errno = saved;
        return;
    }
    memset(v, 0, sizeof(*v));
    for (unsigned i = 0; i < MOKKA_MAX_GPUS; i++)
        v->index[i] = -1;
    int dev = open(DEV_DIR, O_PATH | O_DIRECTORY | O_CLOEXEC);
    for (unsigned i = 0; dev >= 0 && i < n; i++) {
        uint32_t minor;
        MOKKA_SNAP(s, s->gpus[i].minor, minor);
        char name[32];
        snprintf(name, sizeof(name), "nvidia%u", minor);
        if (!may_open(dev, name, NVIDIA_MAJOR, 0, minor, R_OK | W_OK))
            continue;
        v->index[i] = (int16_t)v->count;
        v->gpu[v->count++] = (uint8_t)i;
    }
    if (dev >= 0)
        close(dev);
    read_caps(v);
    errno = saved;
}

void mokka_view_filter_mig(const struct mokka_view *v, struct mokka_mig_snapshot *m)
{
    if (v->whole || v->mig_all)
        return;
    unsigned kept = 0;
    for (unsigned k = 0; k < m->dev_count; k++) {
        const struct mokka_mig_device *d = &m->dev[k];
        if (mokka_view_mig(v, m->gi[d->gi_slot].minor, d->minor))
            m->dev[kept++] = *d;
    }
    m->dev_count = kept;
}
