/*
 * umad.c -- the umad_* API of our libibumad.so.3 (docs/infiniband.md).
 *
 * CAs and ports are read from sysfs (/sys/class/infiniband, /sys/class/infiniband_mad) as
 * rdma-core's library reads them; under `mokka run` those are the node's. A port "opened"
 * is an eventfd (readable while a received MAD waits), its agents a table, and a sent MAD is
 * answered at once by umad_fabric.c: the reply, or, for a MAD the fabric cannot deliver, the
 * sent MAD back with status ETIMEDOUT once timeout_ms * (retries + 1) has passed, as the
 * kernel's MAD layer does. Every entry point checks its arguments; nothing here blocks
 * except umad_recv/umad_poll for the time the caller gave.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <endian.h>

#include "umad_internal.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_OPEN 64
#define MAX_QUEUE 1024

struct pending {
    struct pending *next;
    uint64_t ready_ns;
    uint32_t agent_id;
    uint32_t status;
    size_t length;          /* MAD bytes */
    ib_mad_addr_t addr;
    uint8_t *data;
};

struct agent {
    int used;
    uint8_t mgmt_class;
    uint8_t class_version;
};

struct open_port {
    int fd;                 /* eventfd; the port id */
    char ca_name[UMAD_CA_NAME_LEN];
    int portnum;
    struct agent agents[UMAD_CA_MAX_AGENTS];
    struct pending *head;
    int queued;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct open_port ports[MAX_OPEN];
static int debug_level;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- sysfs ---- */

int sysfs_read(const char *path, char *buf, size_t size)
{
    if (size == 0)
        return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, size - 1);
    int err = errno;
    close(fd);
    if (n < 0)
        return -err;
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = 0;
    return (int)n;
}

unsigned long long sysfs_ull(const char *path, unsigned long long dflt)
{
    char buf[64];
    if (sysfs_read(path, buf, sizeof buf) <= 0)
        return dflt;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(buf, &end, 0);
    return (end == buf || errno) ? dflt : v;
}

static void scopy(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

static int valid_name(const char *name)
{
    if (!name || !*name || strlen(name) >= UMAD_CA_NAME_LEN || strchr(name, '/') || name[0] == '.')
        return 0;
    return 1;
}

static int ca_path(char *out, size_t size, const char *ca, const char *rest)
{
    int n = snprintf(out, size, SYS_INFINIBAND "/%s/%s", ca, rest);
    return n > 0 && (size_t)n < size;
}

/* "a088:c203:00e3:142a" -> host-order 64 bits */
static uint64_t parse_guid(const char *s)
{
    uint64_t v = 0;
    int digits = 0;
    for (; *s && digits < 16; s++) {
        if (*s == ':')
            continue;
        if (!isxdigit((unsigned char)*s))
            break;
        v = (v << 4) | (uint64_t)(isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10));
        digits++;
    }
    return v;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The CA names under /sys/class/infiniband, sorted; returns how many (at most max). */
static int list_cas(char names[][UMAD_CA_NAME_LEN], int max)
{
    DIR *d = opendir(SYS_INFINIBAND);
    if (!d)
        return -ENODEV;
    char *found[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == '.' || !valid_name(e->d_name))
            continue;
        found[n++] = strdup(e->d_name);
        if (!found[n - 1])
            n--;
    }
    closedir(d);
    qsort(found, (size_t)n, sizeof found[0], cmp_names);
    int out = 0;
    for (int i = 0; i < n; i++) {
        if (out < max) {
            scopy(names[out], UMAD_CA_NAME_LEN, found[i]);
            out++;
        }
        free(found[i]);
    }
    return out;
}

static int port_state(const char *ca, int port)
{
    char rel[64], path[512];
    snprintf(rel, sizeof rel, "ports/%d/state", port);
    if (!ca_path(path, sizeof path, ca, rel))
        return -1;
    return (int)sysfs_ull(path, 0);
}

static int max_port(const char *ca)
{
    char path[512];
    if (!ca_path(path, sizeof path, ca, "ports"))
        return -ENODEV;
    DIR *d = opendir(path);
    if (!d)
        return -ENODEV;
    int max = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long p = strtol(e->d_name, &end, 10);
        if (end != e->d_name && !*end && p > max && p < UMAD_CA_MAX_PORTS)
            max = (int)p;
    }
    closedir(d);
    return max;
}

/* rdma-core's rule: no name, the first CA with an active port (else the first CA); port 0,
   its first active port (else port 1). */
static int resolve(const char *ca_name, int portnum, char *ca_out, int *port_out)
{
    char names[32][UMAD_CA_NAME_LEN];
    int n = list_cas(names, 32);
    if (n <= 0)
        return -ENODEV;
    if (ca_name) {
        if (!valid_name(ca_name))
            return -ENODEV;
        int found = 0;
        for (int i = 0; i < n; i++)
            found |= !strcmp(names[i], ca_name);
        if (!found)
            return -ENODEV;
        scopy(ca_out, UMAD_CA_NAME_LEN, ca_name);
    } else {
        int pick = 0;
        for (int i = 0; i < n && !pick; i++) {
            int mp = max_port(names[i]);
            for (int p = 1; p <= mp; p++)
                if (port_state(names[i], p) == 4) {
                    scopy(ca_out, UMAD_CA_NAME_LEN, names[i]);
                    pick = 1;
                    break;
                }
        }
        if (!pick)
            scopy(ca_out, UMAD_CA_NAME_LEN, names[0]);
    }
    int mp = max_port(ca_out);
    if (mp <= 0)
        return -ENODEV;
    if (portnum < 0 || portnum > mp)
        return -EINVAL;
    if (portnum == 0) {
        portnum = 1;
        for (int p = 1; p <= mp; p++)
            if (port_state(ca_out, p) == 4) {
                portnum = p;
                break;
            }
    }
    *port_out = portnum;
    return 0;
}

/* ---- CAs and ports ---- */

EXPORT int umad_init(void) { return 0; }
EXPORT int umad_done(void) { return 0; }

EXPORT int umad_get_cas_names(char cas[][UMAD_CA_NAME_LEN], int max)
{
    if (!cas || max <= 0)
        return -EINVAL;
    return list_cas(cas, max);
}

static int fill_port(const char *ca, int portnum, umad_port_t *port)
{
    char path[512], rel[96], buf[128];
    memset(port, 0, sizeof *port);
    scopy(port->ca_name, sizeof port->ca_name, ca);
    port->portnum = portnum;
#define PORT_FILE(name) (snprintf(rel, sizeof rel, "ports/%d/%s", portnum, name), ca_path(path, sizeof path, ca, rel))
    if (!PORT_FILE("state") || sysfs_read(path, buf, sizeof buf) < 0)
        return -ENODEV;
    port->state = (unsigned)strtoul(buf, NULL, 0);
    if (PORT_FILE("lid")) port->base_lid = (unsigned)sysfs_ull(path, 0);
    if (PORT_FILE("lid_mask_count")) port->lmc = (unsigned)sysfs_ull(path, 0);
    if (PORT_FILE("sm_lid")) port->sm_lid = (unsigned)sysfs_ull(path, 0);
    if (PORT_FILE("sm_sl")) port->sm_sl = (unsigned)sysfs_ull(path, 0);
    if (PORT_FILE("phys_state")) port->phys_state = (unsigned)sysfs_ull(path, 0);
    if (PORT_FILE("rate")) port->rate = (unsigned)sysfs_ull(path, 0);
    if (PORT_FILE("cap_mask")) port->capmask = htobe32((uint32_t)sysfs_ull(path, 0));
    snprintf(port->link_layer, sizeof port->link_layer, "IB");
    if (PORT_FILE("link_layer") && sysfs_read(path, buf, sizeof buf) > 0)
        scopy(port->link_layer, sizeof port->link_layer, buf);
    if (PORT_FILE("gids/0") && sysfs_read(path, buf, sizeof buf) > 0 && strlen(buf) >= 39) {
        port->gid_prefix = htobe64(parse_guid(buf));
        port->port_guid = htobe64(parse_guid(buf + 20));
    }
    /* pkeys/N in index order */
    unsigned count = 0;
    if (PORT_FILE("pkeys")) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)))
                if (isdigit((unsigned char)e->d_name[0]))
                    count++;
            closedir(d);
        }
    }
    if (count > 0 && count <= 65536) {
        port->pkeys = calloc(count, sizeof *port->pkeys);
        if (port->pkeys) {
            port->pkeys_size = count;
            for (unsigned i = 0; i < count; i++) {
                char name[32];
                snprintf(name, sizeof name, "pkeys/%u", i);
                if (PORT_FILE(name))
                    port->pkeys[i] = (uint16_t)sysfs_ull(path, 0);
            }
        }
    }
#undef PORT_FILE
    return 0;
}

EXPORT int umad_get_port(const char *ca_name, int portnum, umad_port_t *port)
{
    char ca[UMAD_CA_NAME_LEN];
    int p;
    if (!port)
        return -EINVAL;
    int r = resolve(ca_name, portnum, ca, &p);
    if (r < 0)
        return r;
    return fill_port(ca, p, port);
}

EXPORT int umad_release_port(umad_port_t *port)
{
    if (!port)
        return -EINVAL;
    free(port->pkeys);
    port->pkeys = NULL;
    port->pkeys_size = 0;
    return 0;
}

EXPORT int umad_get_ca(const char *ca_name, umad_ca_t *ca)
{
    char name[UMAD_CA_NAME_LEN], path[512], buf[128];
    int p;
    if (!ca)
        return -EINVAL;
    int r = resolve(ca_name, 0, name, &p);
    if (r < 0)
        return r;
    memset(ca, 0, sizeof *ca);
    scopy(ca->ca_name, sizeof ca->ca_name, name);
    if (ca_path(path, sizeof path, name, "node_type"))
        ca->node_type = (unsigned)sysfs_ull(path, 0);
    if (ca_path(path, sizeof path, name, "fw_ver") && sysfs_read(path, buf, sizeof buf) >= 0)
        scopy(ca->fw_ver, sizeof ca->fw_ver, buf);
    if (ca_path(path, sizeof path, name, "hw_rev") && sysfs_read(path, buf, sizeof buf) >= 0)
        scopy(ca->hw_ver, sizeof ca->hw_ver, buf);
    if (ca_path(path, sizeof path, name, "hca_type") && sysfs_read(path, buf, sizeof buf) >= 0)
        scopy(ca->ca_type, sizeof ca->ca_type, buf);
    if (ca_path(path, sizeof path, name, "node_guid") && sysfs_read(path, buf, sizeof buf) > 0)
        ca->node_guid = htobe64(parse_guid(buf));
    if (ca_path(path, sizeof path, name, "sys_image_guid") && sysfs_read(path, buf, sizeof buf) > 0)
        ca->system_guid = htobe64(parse_guid(buf));
    ca->numports = max_port(name);
    if (ca->numports < 0)
        ca->numports = 0;
    for (int i = 1; i <= ca->numports && i < UMAD_CA_MAX_PORTS; i++) {
        umad_port_t *port = calloc(1, sizeof *port);
        if (!port)
            break;
        if (fill_port(name, i, port) < 0) {
            free(port);
            continue;
        }
        ca->ports[i] = port;
    }
    return 0;
}

EXPORT int umad_release_ca(umad_ca_t *ca)
{
    if (!ca)
        return -EINVAL;
    for (int i = 0; i < UMAD_CA_MAX_PORTS; i++) {
        if (ca->ports[i]) {
            umad_release_port(ca->ports[i]);
            free(ca->ports[i]);
            ca->ports[i] = NULL;
        }
    }
    return 0;
}

EXPORT int umad_get_ca_portguids(const char *ca_name, uint64_t *portguids, int max)
{
    umad_ca_t ca;
    if (!portguids || max <= 0)
        return -EINVAL;
    int r = umad_get_ca(ca_name, &ca);
    if (r < 0)
        return r;
    int n = ca.numports + 1;
    if (n > max) {
        umad_release_ca(&ca);
        return -ENOMEM;
    }
    portguids[0] = 0;
    for (int i = 1; i < n; i++)
        portguids[i] = ca.ports[i] ? ca.ports[i]->port_guid : 0;
    umad_release_ca(&ca);
    return n;
}

EXPORT int umad_get_issm_path(const char *ca_name, int portnum, char path[], int max)
{
    char ca[UMAD_CA_NAME_LEN];
    int p;
    if (!path || max <= 0)
        return -EINVAL;
    int r = resolve(ca_name, portnum, ca, &p);
    if (r < 0)
        return r;
    for (int i = 0; i < 256; i++) {
        char f[256], buf[64];
        snprintf(f, sizeof f, SYS_INFINIBAND_MAD "/issm%d/ibdev", i);
        if (sysfs_read(f, buf, sizeof buf) < 0 || strcmp(buf, ca))
            continue;
        snprintf(f, sizeof f, SYS_INFINIBAND_MAD "/issm%d/port", i);
        if ((int)sysfs_ull(f, 0) != p)
            continue;
        snprintf(path, (size_t)max, "/dev/infiniband/issm%d", i);
        return 0;
    }
    return -ENODEV;
}

EXPORT struct umad_device_node *umad_get_ca_device_list(void)
{
    char names[32][UMAD_CA_NAME_LEN];
    int n = list_cas(names, 32);
    struct umad_device_node *head = NULL, **tail = &head;
    for (int i = 0; i < n; i++) {
        struct umad_device_node *node = calloc(1, sizeof *node);
        char *name = strdup(names[i]);
        if (!node || !name) {
            free(node);
            free(name);
            break;
        }
        node->ca_name = name;
        *tail = node;
        tail = &node->next;
    }
    if (!head)
        errno = n < 0 ? -n : ENODEV;
    return head;
}

EXPORT void umad_free_ca_device_list(struct umad_device_node *head)
{
    while (head) {
        struct umad_device_node *next = head->next;
        free((char *)head->ca_name);
        free(head);
        head = next;
    }
}

static int cmp_nodes(const void *a, const void *b)
{
    const struct umad_device_node *x = *(struct umad_device_node *const *)a;
    const struct umad_device_node *y = *(struct umad_device_node *const *)b;
    return strcmp(x->ca_name ? x->ca_name : "", y->ca_name ? y->ca_name : "");
}

EXPORT int umad_sort_ca_device_list(struct umad_device_node **head, size_t size)
{
    if (!head)
        return -EINVAL;
    size_t n = 0;
    for (struct umad_device_node *p = *head; p; p = p->next)
        n++;
    if (size && size < n)
        n = size;
    if (n < 2)
        return 0;
    struct umad_device_node **arr = calloc(n, sizeof *arr);
    if (!arr)
        return -ENOMEM;
    struct umad_device_node *p = *head;
    for (size_t i = 0; i < n; i++, p = p->next)
        arr[i] = p;
    struct umad_device_node *rest = p;
    qsort(arr, n, sizeof *arr, cmp_nodes);
    for (size_t i = 0; i + 1 < n; i++)
        arr[i]->next = arr[i + 1];
    arr[n - 1]->next = rest;
    *head = arr[0];
    free(arr);
    return 0;
}

/* ---- ports, agents, send and receive ---- */

static struct open_port *port_of(int portid)
{
    if (portid < 0)
        return NULL;
    for (int i = 0; i < MAX_OPEN; i++)
        if (ports[i].fd == portid && portid > 0)
            return &ports[i];
    return NULL;
}

/* Under the lock: the eventfd is readable exactly while an entry is ready. */
static void signal_ready(struct open_port *p)
{
    uint64_t v;
    while (read(p->fd, &v, sizeof v) == sizeof v)
        ;
    uint64_t now = now_ns();
    for (struct pending *e = p->head; e; e = e->next)
        if (e->ready_ns <= now) {
            v = 1;
            if (write(p->fd, &v, sizeof v) < 0) { /* a full counter is still readable */ }
            return;
        }
}

EXPORT int umad_open_port(const char *ca_name, int portnum)
{
    char ca[UMAD_CA_NAME_LEN];
    int p;
    int r = resolve(ca_name, portnum, ca, &p);
    if (r < 0)
        return r;
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0)
        return -errno;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_OPEN; i++) {
        if (ports[i].fd > 0)
            continue;
        memset(&ports[i], 0, sizeof ports[i]);
        ports[i].fd = fd;
        scopy(ports[i].ca_name, sizeof ports[i].ca_name, ca);
        ports[i].portnum = p;
        pthread_mutex_unlock(&lock);
        return fd;
    }
    pthread_mutex_unlock(&lock);
    close(fd);
    return -EMFILE;
}

EXPORT int umad_close_port(int portid)
{
    pthread_mutex_lock(&lock);
    struct open_port *p = port_of(portid);
    if (!p) {
        pthread_mutex_unlock(&lock);
        return -EINVAL;
    }
    while (p->head) {
        struct pending *e = p->head;
        p->head = e->next;
        free(e->data);
        free(e);
    }
    close(p->fd);
    p->fd = 0;
    pthread_mutex_unlock(&lock);
    return 0;
}

static int add_agent(int portid, uint8_t mgmt_class, uint8_t version)
{
    pthread_mutex_lock(&lock);
    struct open_port *p = port_of(portid);
    int id = -EINVAL;
    if (p) {
        id = -ENOMEM;
        for (int i = 0; i < UMAD_CA_MAX_AGENTS; i++)
            if (!p->agents[i].used) {
                p->agents[i] = (struct agent){1, mgmt_class, version};
                id = i;
                break;
            }
    }
    pthread_mutex_unlock(&lock);
    return id;
}

EXPORT int umad_register(int portid, int mgmt_class, int mgmt_version, uint8_t rmpp_version, long method_mask[])
{
    (void)rmpp_version;
    (void)method_mask;
    if (mgmt_class < 0 || mgmt_class > 0xff || mgmt_version < 0 || mgmt_version > 0xff)
        return -EINVAL;
    return add_agent(portid, (uint8_t)mgmt_class, (uint8_t)mgmt_version);
}

EXPORT int umad_register_oui(int portid, int mgmt_class, uint8_t rmpp_version, uint8_t oui[3], long method_mask[])
{
    (void)rmpp_version;
    (void)method_mask;
    if (!oui || mgmt_class < 0x30 || mgmt_class > 0x4f)
        return -EINVAL;
    return add_agent(portid, (uint8_t)mgmt_class, 1);
}

EXPORT int umad_register2(int port_fd, struct umad_reg_attr *attr, uint32_t *agent_id)
{
    if (!attr || !agent_id)
        return EINVAL;
    int id = add_agent(port_fd, attr->mgmt_class, attr->mgmt_class_version);
    if (id < 0)
        return -id;
    *agent_id = (uint32_t)id;
    return 0;
}

EXPORT int umad_unregister(int portid, int agentid)
{
    pthread_mutex_lock(&lock);
    struct open_port *p = port_of(portid);
    int r = -EINVAL;
    if (p && agentid >= 0 && agentid < UMAD_CA_MAX_AGENTS && p->agents[agentid].used) {
        p->agents[agentid].used = 0;
        r = 0;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static void enqueue(struct open_port *p, struct pending *e)
{
    struct pending **tail = &p->head;
    while (*tail)
        tail = &(*tail)->next;
    *tail = e;
    p->queued++;
}

EXPORT int umad_send(int portid, int agentid, void *umad, int length, int timeout_ms, int retries)
{
    if (!umad || length < 24 || length > 65536 || agentid < 0 || agentid >= UMAD_CA_MAX_AGENTS)
        return -EINVAL;
    ib_user_mad_t *u = umad;
    char ca[UMAD_CA_NAME_LEN];
    pthread_mutex_lock(&lock);
    struct open_port *p = port_of(portid);
    if (!p || !p->agents[agentid].used) {
        pthread_mutex_unlock(&lock);
        return -EINVAL;
    }
    if (p->queued >= MAX_QUEUE) {
        pthread_mutex_unlock(&lock);
        return -ENOMEM;
    }
    scopy(ca, sizeof ca, p->ca_name);
    pthread_mutex_unlock(&lock);

    struct mad_answer ans = {0};
    fabric_answer(ca, u->data, (size_t)length, ntohs(u->addr.lid), &ans);
    uint8_t method = u->data[3];
    struct pending *e = calloc(1, sizeof *e);
    if (!e) {
        free(ans.data);
        return -ENOMEM;
    }
    e->agent_id = (uint32_t)agentid;
    if (ans.replied) {
        e->data = ans.data;
        e->length = ans.length;
        e->ready_ns = now_ns();
        e->addr.lid = htons(ans.slid);
        e->addr.qpn = htonl(ans.qpn);
        e->addr.qkey = htonl(ans.qpn ? 0x80010000u : 0);
    } else if (timeout_ms > 0 && !(method & 0x80)) {
        /* lost: the MAD layer gives the sent MAD back with ETIMEDOUT */
        e->data = malloc((size_t)length);
        if (!e->data) {
            free(e);
            return -ENOMEM;
        }
        memcpy(e->data, u->data, (size_t)length);
        e->length = (size_t)length;
        e->status = ETIMEDOUT;
        e->addr = u->addr;
        uint64_t wait = (uint64_t)timeout_ms * (uint64_t)((retries > 0 ? retries : 0) + 1);
        e->ready_ns = now_ns() + wait * 1000000ull;
    } else {
        free(ans.data);
        free(e);
        return 0;  /* nothing comes back for a response or a send without timeout */
    }
    pthread_mutex_lock(&lock);
    p = port_of(portid);
    if (!p) {
        pthread_mutex_unlock(&lock);
        free(e->data);
        free(e);
        return -EINVAL;
    }
    enqueue(p, e);
    signal_ready(p);
    pthread_mutex_unlock(&lock);
    if (debug_level > 0)
        fprintf(stderr, "umad_send: port %d agent %d attr 0x%04x %s\n", portid, agentid,
                (unsigned)(u->data[16] << 8 | u->data[17]), ans.replied ? "answered" : "lost");
    return 0;
}

/* Under the lock: the earliest-ready entry, or NULL; *next_ns its ready time. */
static struct pending **earliest(struct open_port *p, uint64_t *next_ns)
{
    struct pending **best = NULL;
    for (struct pending **e = &p->head; *e; e = &(*e)->next)
        if (!best || (*e)->ready_ns < (*best)->ready_ns)
            best = e;
    *next_ns = best ? (*best)->ready_ns : 0;
    return best;
}

/* Waits until an entry of portid is ready (0), the timeout passes (-ETIMEDOUT) or the port is
   not open (-EINVAL). Called without the lock; returns with it held on 0. */
static int wait_ready(int portid, int timeout_ms)
{
    uint64_t deadline = timeout_ms >= 0 ? now_ns() + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
    for (;;) {
        pthread_mutex_lock(&lock);
        struct open_port *p = port_of(portid);
        if (!p) {
            pthread_mutex_unlock(&lock);
            return -EINVAL;
        }
        uint64_t next;
        uint64_t now = now_ns();
        if (earliest(p, &next) && next <= now)
            return 0;
        int fd = p->fd;
        int has = p->head != NULL;
        pthread_mutex_unlock(&lock);
        if (now >= deadline)
            return -ETIMEDOUT;
        uint64_t until = deadline;
        if (has && next < until)
            until = next;
        uint64_t wait_ns = until == UINT64_MAX ? 1000000000ull : until - now;
        int ms = (int)((wait_ns + 999999) / 1000000);
        if (ms > 1000)
            ms = 1000;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        poll(&pfd, 1, ms);
    }
}

EXPORT int umad_recv(int portid, void *umad, int *length, int timeout_ms)
{
    if (!umad || !length || *length < 0) {
        errno = EINVAL;
        return -EINVAL;
    }
    int r = wait_ready(portid, timeout_ms);
    if (r < 0) {
        r = r == -ETIMEDOUT && timeout_ms == 0 ? -EWOULDBLOCK : r;
        errno = -r;
        return r;
    }
    struct open_port *p = port_of(portid);
    uint64_t next;
    struct pending **slot = earliest(p, &next);
    struct pending *e = *slot;
    if ((size_t)*length < e->length) {
        /* as the kernel does: the header only, the MAD stays queued, the length it needs */
        ib_user_mad_t *u = umad;
        u->agent_id = e->agent_id;
        u->status = e->status;
        u->length = (uint32_t)(sizeof(ib_user_mad_t) + e->length);
        u->addr = e->addr;
        *length = (int)e->length;
        pthread_mutex_unlock(&lock);
        errno = ENOSPC;
        return -ENOSPC;
    }
    *slot = e->next;
    p->queued--;
    signal_ready(p);
    pthread_mutex_unlock(&lock);
    ib_user_mad_t *u = umad;
    u->agent_id = e->agent_id;
    u->status = e->status;
    u->timeout_ms = 0;
    u->retries = 0;
    u->length = (uint32_t)(sizeof(ib_user_mad_t) + e->length);
    u->addr = e->addr;
    memcpy(u->data, e->data, e->length);
    *length = (int)e->length;
    int agent = (int)e->agent_id;
    free(e->data);
    free(e);
    return agent;
}

EXPORT int umad_poll(int portid, int timeout_ms)
{
    int r = wait_ready(portid, timeout_ms);
    if (r == 0)
        pthread_mutex_unlock(&lock);
    return r;
}

EXPORT int umad_get_fd(int portid)
{
    pthread_mutex_lock(&lock);
    struct open_port *p = port_of(portid);
    int fd = p ? p->fd : -EINVAL;
    pthread_mutex_unlock(&lock);
    return fd;
}

/* ---- the umad buffer ---- */

EXPORT size_t umad_size(void) { return sizeof(ib_user_mad_t); }

EXPORT void *umad_get_mad(void *umad) { return umad ? ((ib_user_mad_t *)umad)->data : NULL; }

EXPORT int umad_status(void *umad) { return umad ? (int)((ib_user_mad_t *)umad)->status : -EINVAL; }

EXPORT ib_mad_addr_t *umad_get_mad_addr(void *umad) { return umad ? &((ib_user_mad_t *)umad)->addr : NULL; }

EXPORT int umad_set_grh(void *umad, void *mad_addr)
{
    if (!umad)
        return -EINVAL;
    ib_user_mad_t *u = umad;
    ib_mad_addr_t *a = mad_addr;
    if (a) {
        u->addr.grh_present = 1;
        memcpy(u->addr.gid, a->gid, 16);
        u->addr.flow_label = htonl(a->flow_label);
        u->addr.hop_limit = a->hop_limit;
        u->addr.traffic_class = a->traffic_class;
    } else {
        u->addr.grh_present = 0;
    }
    return 0;
}

EXPORT int umad_set_pkey(void *umad, int pkey_index)
{
    if (!umad)
        return -EINVAL;
    ((ib_user_mad_t *)umad)->addr.pkey_index = (uint16_t)pkey_index;
    return 0;
}

EXPORT int umad_get_pkey(void *umad) { return umad ? ((ib_user_mad_t *)umad)->addr.pkey_index : -EINVAL; }

EXPORT int umad_set_addr(void *umad, int dlid, int dqp, int sl, int qkey)
{
    if (!umad)
        return -EINVAL;
    ib_user_mad_t *u = umad;
    u->addr.qpn = htonl((uint32_t)dqp);
    u->addr.lid = htons((uint16_t)dlid);
    u->addr.qkey = htonl((uint32_t)qkey);
    u->addr.sl = (uint8_t)sl;
    return 0;
}

EXPORT int umad_set_addr_net(void *umad, uint16_t dlid, uint32_t dqp, int sl, uint32_t qkey)
{
    if (!umad)
        return -EINVAL;
    ib_user_mad_t *u = umad;
    u->addr.qpn = dqp;
    u->addr.lid = dlid;
    u->addr.qkey = qkey;
    u->addr.sl = (uint8_t)sl;
    return 0;
}

/* ---- debugging and names ---- */

EXPORT int umad_debug(int level)
{
    if (level >= 0)
        debug_level = level;
    return debug_level;
}

EXPORT void umad_addr_dump(ib_mad_addr_t *addr)
{
    if (!addr)
        return;
    fprintf(stderr, "qpn %u qkey 0x%x lid %u sl %d\n", ntohl(addr->qpn), ntohl(addr->qkey), ntohs(addr->lid), addr->sl);
    fprintf(stderr, "grh_present %d gid_index %d hop_limit %d traffic_class %d flow_label 0x%x pkey_index 0x%x\n",
            addr->grh_present, addr->gid_index, addr->hop_limit, addr->traffic_class, ntohl(addr->flow_label),
            addr->pkey_index);
}

EXPORT void umad_dump(void *umad)
{
    if (!umad)
        return;
    ib_user_mad_t *u = umad;
    fprintf(stderr, "agent id %u status %u timeout %u\n", u->agent_id, u->status, u->timeout_ms);
    umad_addr_dump(&u->addr);
}

EXPORT const char *umad_class_str(uint8_t mgmt_class)
{
    switch (mgmt_class) {
    case 0x01: return "Subn";
    case 0x81: return "SubnDirectedRoute";
    case 0x03: return "SubnAdmin";
    case 0x04: return "Perf";
    case 0x05: return "BM";
    case 0x06: return "DevMgt";
    case 0x07: return "ComMgt";
    case 0x08: return "SNMP";
    case 0x21: return "CC";
    default: return "<unknown>";
    }
}

EXPORT const char *umad_method_str(uint8_t mgmt_class, uint8_t method)
{
    (void)mgmt_class;
    switch (method) {
    case 0x01: return "Get";
    case 0x02: return "Set";
    case 0x81: return "GetResp";
    case 0x03: return "Send";
    case 0x05: return "Trap";
    case 0x06: return "Report";
    case 0x86: return "ReportResp";
    case 0x07: return "TrapRepress";
    case 0x12: return "GetTable";
    case 0x92: return "GetTableResp";
    case 0x15: return "Delete";
    case 0x95: return "DeleteResp";
    default: return "<unknown>";
    }
}

EXPORT const char *umad_common_mad_status_str(uint16_t status)
{
    status = ntohs(status);
    if (status & 0x1) return "Busy";
    if (status & 0x2) return "Redirection required";
    switch ((status >> 2) & 0x7) {
    case 0: return "Success";
    case 1: return "Bad Class and/or Base Version";
    case 2: return "Method not supported";
    case 3: return "Method/Attribute combination not supported";
    case 7: return "Invalid Attribute/Modifier field";
    default: return "Reserved";
    }
}

EXPORT const char *umad_sa_mad_status_str(uint16_t status)
{
    switch ((ntohs(status) >> 8) & 0xff) {
    case 0: return "Success";
    case 1: return "No Resources";
    case 2: return "Request Invalid";
    case 3: return "No Records";
    case 4: return "Too Many Records";
    case 5: return "Invalid GID";
    case 6: return "Insufficient Components";
    case 7: return "Request Denied";
    case 8: return "Priority Suggested";
    default: return "Undefined Error";
    }
}

EXPORT const char *umad_attribute_str(uint8_t mgmt_class, uint16_t attr_id)
{
    uint16_t a = ntohs(attr_id);
    if (a == 0x0001) return "ClassPortInfo";
    if (a == 0x0002) return "Notice";
    if (a == 0x0003) return "InformInfo";
    if (mgmt_class == 0x01 || mgmt_class == 0x81) {
        switch (a) {
        case 0x0010: return "NodeDescription";
        case 0x0011: return "NodeInfo";
        case 0x0012: return "SwitchInfo";
        case 0x0014: return "GUIDInfo";
        case 0x0015: return "PortInfo";
        case 0x0016: return "P_KeyTable";
        case 0x0019: return "LinearForwardingTable";
        case 0x0020: return "SMInfo";
        }
    } else if (mgmt_class == 0x03) {
        switch (a) {
        case 0x0011: return "NodeRecord";
        case 0x0012: return "PortInfoRecord";
        case 0x0035: return "PathRecord";
        }
    } else if (mgmt_class == 0x04) {
        switch (a) {
        case 0x0012: return "PortCounters";
        case 0x001D: return "PortCountersExtended";
        }
    }
    return "<unknown>";
}
