/*
 * umad_fabric.c -- answers MADs from the node's fabric (docs/infiniband.md).
 *
 * The fabric (switches, CAs, cables, LIDs, GUIDs, the SM's switch) is the text file ib/fabric
 * of the mount (mokkafs/model/ibfabric.py), found at $MOKKA_ROOT/ib/fabric or, for a library
 * served from a tree's driver root (<mount>/driver/usr/lib64), three levels above it. What
 * moves, a local HCA's port state and counters, is read from its sysfs at each MAD, so a
 * port fault shows in the next reply. Layouts are the IBA specification's (byte offsets as
 * libibmad's field table places them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "umad_internal.h"

#define MAX_NODES 4096
#define MAX_PORTS 160
#define LID_PERMISSIVE 0xFFFF

/* MAD status (IBA 13.4.7): invalid-field codes in bits 2-4 */
#define ST_BAD_VERSION 0x0004
#define ST_BAD_METHOD 0x0008
#define ST_BAD_ATTR 0x000C
#define ST_BAD_MODIFIER 0x001C
#define SA_NO_RECORDS (3 << 8)

struct fnode {
    int type;           /* 1 CA, 2 switch */
    int nports;
    uint64_t guid;
    uint16_t lid;
    uint16_t devid;
    uint32_t vendor;
    int local_hca;      /* this node's HCA index, -1 otherwise */
    char desc[65];
    int *peer;          /* [port] -> node index, -1 */
    int *peer_port;
};

static struct {
    int loaded;
    int n;
    struct fnode *nodes;
    int sm, sm_priority, rate;
    uint16_t max_lid;
} fab;
static pthread_mutex_t fab_lock = PTHREAD_MUTEX_INITIALIZER;

static void fabric_path(char *out, size_t size)
{
    const char *root = getenv("MOKKA_ROOT");
    if (root && *root) {
        snprintf(out, size, "%s/ib/fabric", root);
        return;
    }
    Dl_info info;
    out[0] = 0;
    if (dladdr((void *)fabric_path, &info) && info.dli_fname) {
        char lib[4096];
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
        for (int i = 0; i < 4; i++) {
            char *slash = strrchr(lib, '/');
            if (!slash)
                return;
            *slash = 0;
        }
        snprintf(out, size, "%s/ib/fabric", lib);
    }
}

static void load(void)
{
    if (fab.loaded)
        return;
    fab.loaded = 1;
    char path[4200];
    fabric_path(path, sizeof path);
    FILE *f = path[0] ? fopen(path, "re") : NULL;
    if (!f)
        return;
    char line[512];
    if (!fgets(line, sizeof line, f) || strncmp(line, "mokka-fabric 1", 14)) {
        fclose(f);
        return;
    }
    fab.nodes = calloc(MAX_NODES, sizeof *fab.nodes);
    if (!fab.nodes) {
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        int idx, type, nports, lid, hca, pos = 0;
        unsigned long long guid;
        unsigned devid, vendor;
        int a, pa, b, pb;
        if (sscanf(line, "node %d %d %d %llx %d %x %x %d %n", &idx, &type, &nports, &guid, &lid, &devid, &vendor,
                   &hca, &pos) == 8 && pos > 0) {
            if (idx < 0 || idx >= MAX_NODES || nports < 1 || nports >= MAX_PORTS || lid < 1 || lid > 0xBFFF)
                continue;
            struct fnode *n = &fab.nodes[idx];
            n->type = type;
            n->nports = nports;
            n->guid = guid;
            n->lid = (uint16_t)lid;
            n->devid = (uint16_t)devid;
            n->vendor = vendor;
            n->local_hca = hca;
            snprintf(n->desc, sizeof n->desc, "%s", line + pos);
            n->peer = malloc(sizeof(int) * (size_t)(nports + 1));
            n->peer_port = malloc(sizeof(int) * (size_t)(nports + 1));
            if (!n->peer || !n->peer_port) {
                n->type = 0;
                continue;
            }
            for (int p = 0; p <= nports; p++)
                n->peer[p] = n->peer_port[p] = -1;
            if (idx + 1 > fab.n)
                fab.n = idx + 1;
            if (lid > fab.max_lid)
                fab.max_lid = (uint16_t)lid;
        } else if (sscanf(line, "link %d %d %d %d", &a, &pa, &b, &pb) == 4) {
            if (a < 0 || b < 0 || a >= fab.n || b >= fab.n || !fab.nodes[a].type || !fab.nodes[b].type)
                continue;
            if (pa < 1 || pa > fab.nodes[a].nports || pb < 1 || pb > fab.nodes[b].nports)
                continue;
            fab.nodes[a].peer[pa] = b;
            fab.nodes[a].peer_port[pa] = pb;
            fab.nodes[b].peer[pb] = a;
            fab.nodes[b].peer_port[pb] = pa;
        } else {
            sscanf(line, "sm %d %d", &fab.sm, &fab.sm_priority);
            sscanf(line, "rate %d", &fab.rate);
        }
    }
    fclose(f);
    if (fab.sm < 0 || fab.sm >= fab.n || fab.nodes[fab.sm].type != 2)
        fab.sm = -1;  /* a file without a valid SM: no SMInfo, no SA, SMLid 0 */
}

/* ---- live state from sysfs ---- */

static int local_port_down(int hca)
{
    char path[256];
    snprintf(path, sizeof path, SYS_INFINIBAND "/mlx5_%d/ports/1/state", hca);
    return sysfs_ull(path, 4) != 4;
}

static unsigned long long counter(int hca, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, SYS_INFINIBAND "/mlx5_%d/ports/1/counters/%s", hca, name);
    return sysfs_ull(path, 0);
}

static int node_down(int i)
{
    return fab.nodes[i].type == 1 && fab.nodes[i].local_hca >= 0 && local_port_down(fab.nodes[i].local_hca);
}

static int link_up(int i, int port)
{
    if (port < 1 || port > fab.nodes[i].nports)
        return 0;
    int peer = fab.nodes[i].peer[port];
    return peer >= 0 && !node_down(i) && !node_down(peer);
}

static int by_lid(uint16_t lid)
{
    for (int i = 0; i < fab.n; i++)
        if (fab.nodes[i].type && fab.nodes[i].lid == lid)
            return node_down(i) ? -1 : i;
    return -1;
}

/* Hop distances from `to` over live links (dist[i], -1: unreachable). */
static void distances(int to, int *dist)
{
    static int queue[MAX_NODES];
    for (int i = 0; i < fab.n; i++)
        dist[i] = -1;
    int head = 0, tail = 0;
    dist[to] = 0;
    queue[tail++] = to;
    while (head < tail) {
        int v = queue[head++];
        if (fab.nodes[v].type == 1 && v != to)
            continue;  /* CAs do not forward */
        for (int p = 1; p <= fab.nodes[v].nports; p++) {
            int w = fab.nodes[v].peer[p];
            if (w >= 0 && dist[w] < 0 && link_up(v, p)) {
                dist[w] = dist[v] + 1;
                queue[tail++] = w;
            }
        }
    }
}

/* The port switch `sw` forwards `lid` to: 0 itself, 0xFF none. Among equal next hops, the
   LID picks one (as min-hop routing spreads destinations). */
static uint8_t route(int sw, uint16_t lid, int *dist)
{
    if (fab.nodes[sw].lid == lid)
        return 0;
    int to = by_lid(lid);
    if (to < 0)
        return 0xFF;
    distances(to, dist);
    if (dist[sw] < 0)
        return 0xFF;
    int cand[MAX_PORTS], nc = 0;
    for (int p = 1; p <= fab.nodes[sw].nports; p++) {
        int w = fab.nodes[sw].peer[p];
        if (w >= 0 && link_up(sw, p) && dist[w] == dist[sw] - 1)
            cand[nc++] = p;
    }
    return nc ? (uint8_t)cand[lid % nc] : 0xFF;
}

/* ---- encoding ---- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)(v >> 16)); put16(p + 2, (uint16_t)v); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) << 16 | get16(p + 2); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }
static uint16_t sat16(unsigned long long v) { return v > 0xFFFF ? 0xFFFF : (uint16_t)v; }
static uint8_t sat8(unsigned long long v) { return v > 0xFF ? 0xFF : (uint8_t)v; }
static uint32_t sat32(unsigned long long v) { return v > 0xFFFFFFFFull ? 0xFFFFFFFFu : (uint32_t)v; }

#define SUBNET_PREFIX 0xFE80000000000000ull
#define CA_CAPMASK 0xA751E848u      /* a ConnectX-7 port (real ibstat), as sysfs cap_mask */
#define SWITCH_CAPMASK 0x4250C848u  /* switch port 0: extended speeds, CapabilityMask2 */
#define CAP_IS_SM 0x2u

static void ext_speed(uint8_t *active, uint8_t *supported)
{
    switch (fab.rate) {
    case 100: *active = 2; *supported = 3; break;   /* EDR 25G lanes */
    case 200: *active = 4; *supported = 7; break;   /* HDR 50G */
    case 400: *active = 8; *supported = 15; break;  /* NDR 100G */
    default: *active = 0; *supported = 15; break;   /* XDR needs LinkSpeedExt2, which we do not model */
    }
}

/* NodeInfo (IBA 14.2.5.3) of node i answered on `port`. */
static void node_info(int i, int port, uint8_t *d)
{
    struct fnode *n = &fab.nodes[i];
    d[0] = 1;
    d[1] = 1;
    d[2] = (uint8_t)n->type;
    d[3] = (uint8_t)n->nports;
    put64(d + 4, n->guid);
    put64(d + 12, n->guid);
    put64(d + 20, n->guid);
    put16(d + 28, n->type == 2 ? 8 : 128);
    put16(d + 30, n->devid);
    put32(d + 32, n->type == 2 ? 0xA0 : 0);
    d[36] = (uint8_t)port;
    d[37] = (uint8_t)(n->vendor >> 16);
    d[38] = (uint8_t)(n->vendor >> 8);
    d[39] = (uint8_t)n->vendor;
}

/* PortInfo (IBA 14.2.5.6) of node i's port p; `via` is the port the SMP came in on. */
static void port_info(int i, int p, int via, uint8_t *d)
{
    struct fnode *n = &fab.nodes[i];
    int port0 = n->type == 2 && p == 0;
    int up = port0 || link_up(i, p);
    int is_sm_node = fab.sm >= 0 && i == fab.sm;
    if (n->type == 1 || port0) {
        put64(d + 8, SUBNET_PREFIX);
        put16(d + 16, (n->type == 1 && node_down(i)) ? 0xFFFF : n->lid);
        put16(d + 18, (n->type == 1 && node_down(i)) || fab.sm < 0 ? 0 : fab.nodes[fab.sm].lid);
        put32(d + 20, n->type == 1 ? CA_CAPMASK : SWITCH_CAPMASK | (is_sm_node ? CAP_IS_SM : 0));
    }
    put16(d + 26, 15);                 /* M_KeyLeasePeriod */
    d[28] = (uint8_t)(n->type == 1 ? 1 : via);
    d[29] = 3;                          /* LinkWidthEnabled 1X, 4X */
    d[30] = 3;                          /* LinkWidthSupported */
    d[31] = 2;                          /* LinkWidthActive 4X */
    int state = up ? 4 : 1;             /* Active / Down */
    int phys = up ? 5 : (n->type == 1 ? 3 : 2);  /* LinkUp / Disabled (CA, as sysfs) / Polling */
    d[32] = (uint8_t)(7 << 4 | state);  /* LinkSpeedSupported 2.5/5/10, PortState */
    d[33] = (uint8_t)(phys << 4 | 2);   /* PortPhysicalState, LinkDownDefaultState Polling */
    d[34] = 0;                          /* M_KeyProtectBits, LMC */
    d[35] = (uint8_t)(1 << 4 | 7);      /* LinkSpeedActive 2.5 (extended speeds rule), Enabled */
    d[36] = (uint8_t)(5 << 4);          /* NeighborMTU 4096, MasterSMSL 0 */
    d[37] = (uint8_t)(4 << 4);          /* VLCap VL0-7 */
    d[38] = 4;                          /* VLHighLimit */
    d[39] = 8;                          /* VLArbitrationHighCap */
    d[40] = 8;                          /* VLArbitrationLowCap */
    d[41] = 5;                          /* MTUCap 4096 */
    d[42] = n->type == 2 ? 16 : 0;      /* HOQLife */
    d[43] = (uint8_t)((up ? 4 : 0) << 4);  /* OperationalVLs */
    d[50] = n->type == 1 ? 128 : 0;     /* GUIDCap */
    d[51] = 18;                         /* SubnetTimeOut */
    d[52] = 16;                         /* RespTimeValue */
    uint8_t act, sup;
    ext_speed(&act, &sup);
    d[62] = (uint8_t)((up ? act : 0) << 4 | sup);
    d[63] = sup;
}

static void switch_info(uint8_t *d)
{
    put16(d + 0, 0xC000);     /* LinearFDBCap */
    put16(d + 4, 0x1000);     /* MulticastFDBCap */
    put16(d + 6, fab.max_lid);
    d[8] = 0;
    d[9] = 0xFF;
    d[10] = 0xFF;
    d[11] = (uint8_t)(18 << 3);  /* LifeTimeValue */
    put16(d + 14, 32);        /* PartitionEnforcementCap */
    d[16] = 0xF8;             /* enforcement, filtering, EnhancedPort0 */
}

/* PortCounters (IBA 16.1.3.5) from a local HCA's sysfs counters; other ports count nothing. */
static void port_counters(int i, uint8_t *d)
{
    int h = fab.nodes[i].type == 1 ? fab.nodes[i].local_hca : -1;
    if (h < 0)
        return;
    put16(d + 4, sat16(counter(h, "symbol_error")));
    d[6] = sat8(counter(h, "link_error_recovery"));
    d[7] = sat8(counter(h, "link_downed"));
    put16(d + 8, sat16(counter(h, "port_rcv_errors")));
    put16(d + 10, sat16(counter(h, "port_rcv_remote_physical_errors")));
    put16(d + 12, sat16(counter(h, "port_rcv_switch_relay_errors")));
    put16(d + 14, sat16(counter(h, "port_xmit_discards")));
    d[16] = sat8(counter(h, "port_xmit_constraint_errors"));
    d[17] = sat8(counter(h, "port_rcv_constraint_errors"));
    unsigned long long lli = counter(h, "local_link_integrity_errors"), ebo = counter(h, "excessive_buffer_overrun_errors");
    d[19] = (uint8_t)((lli > 15 ? 15 : lli) << 4 | (ebo > 15 ? 15 : ebo));
    put16(d + 22, sat16(counter(h, "VL15_dropped")));
    put32(d + 24, sat32(counter(h, "port_xmit_data")));
    put32(d + 28, sat32(counter(h, "port_rcv_data")));
    put32(d + 32, sat32(counter(h, "port_xmit_packets")));
    put32(d + 36, sat32(counter(h, "port_rcv_packets")));
    put32(d + 40, sat32(counter(h, "port_xmit_wait")));
}

static void port_counters_ext(int i, uint8_t *d)
{
    int h = fab.nodes[i].type == 1 ? fab.nodes[i].local_hca : -1;
    if (h < 0)
        return;
    static const char *names[] = {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
                                  "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets",
                                  "multicast_rcv_packets"};
    for (int k = 0; k < 8; k++)
        put64(d + 8 + 8 * k, counter(h, names[k]));
    /* the error counters at full width (IsAdditionalPortCountersExtendedSupported) */
    static const char *errors[] = {"symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                                   "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
                                   "port_xmit_discards", "port_xmit_constraint_errors", "port_rcv_constraint_errors",
                                   "local_link_integrity_errors", "excessive_buffer_overrun_errors", "VL15_dropped",
                                   "port_xmit_wait"};
    for (int k = 0; k < 13; k++)
        put64(d + 72 + 8 * k, counter(h, errors[k]));
}

/* ---- answering ---- */

static void set_status(uint8_t *r, uint16_t status, int directed)
{
    if (directed)
        put16(r + 4, (uint16_t)((get16(r + 4) & 0x8000) | (status & 0x7FFF)));
    else
        put16(r + 4, status);
}

/* An SMP's attribute at node i, arrived on port `via`. d: the SMP data (64 bytes). */
static uint16_t smp_attr(int i, int via, uint16_t attr, uint32_t mod, uint8_t *d)
{
    struct fnode *n = &fab.nodes[i];
    static int dist[MAX_NODES];
    switch (attr) {
    case 0x0010:  /* NodeDescription */
        memcpy(d, n->desc, strlen(n->desc));
        return 0;
    case 0x0011:
        node_info(i, via, d);
        return 0;
    case 0x0012:
        if (n->type != 2)
            return ST_BAD_ATTR;
        switch_info(d);
        return 0;
    case 0x0015: {  /* PortInfo: modifier = port; 0 on a CA means the port it came in on */
        int p = (int)(mod & 0xFF);
        if (n->type == 1 && p == 0)
            p = via;
        if (p > n->nports || (n->type == 1 && p < 1))
            return ST_BAD_MODIFIER;
        port_info(i, p, via, d);
        return 0;
    }
    case 0x0016:  /* P_KeyTable: the default partition only */
        if ((mod & 0xFFFF) > 0)
            return ST_BAD_MODIFIER;
        put16(d, 0xFFFF);
        return 0;
    case 0x0019:  /* LinearForwardingTable, 64 LIDs a block */
        if (n->type != 2)
            return ST_BAD_ATTR;
        if (mod * 64 > fab.max_lid)
            return ST_BAD_MODIFIER;
        for (int k = 0; k < 64; k++) {
            uint32_t lid = mod * 64 + (uint32_t)k;
            d[k] = (lid == 0 || lid > fab.max_lid) ? 0xFF : route(i, (uint16_t)lid, dist);
        }
        return 0;
    case 0x0020:  /* SMInfo: only where the SM runs */
        if (fab.sm < 0 || i != fab.sm)
            return ST_BAD_ATTR;
        put64(d, n->guid);
        put32(d + 16, (uint32_t)(time(NULL) & 0x7FFFFFFF));  /* ActCount moves while the SM sweeps */
        d[20] = (uint8_t)(fab.sm_priority << 4 | 3);          /* priority, MASTER */
        return 0;
    default:
        return ST_BAD_ATTR;
    }
}

static uint8_t sa_rate_code(void)
{
    switch (fab.rate) {
    case 100: return 16;
    case 200: return 17;
    case 400: return 21;
    case 800: return 23;
    default: return 3;
    }
}

/* SA records. Returns the status; fills *out with the payload (records, each `*recsize`). */
static uint16_t sa_query(int self, const uint8_t *mad, uint8_t method, uint8_t **out, size_t *outlen, int *recsize)
{
    uint16_t attr = get16(mad + 16);
    uint64_t mask = get64(mad + 48);
    const uint8_t *q = mad + 56;
    *out = NULL;
    *outlen = 0;
    if (method != 0x01 && method != 0x12)
        return ST_BAD_METHOD;
    int size;
    if (attr == 0x0035)
        size = 64;      /* PathRecord */
    else if (attr == 0x0011)
        size = 112;     /* NodeRecord (108 bytes, 8-byte aligned) */
    else
        return ST_BAD_ATTR;
    *recsize = size;
    if (attr == 0x0035 && method == 0x01 && !(mask & 0x14))
        return 6 << 8;  /* ERR_INSUFFICIENT_COMPONENTS: a Get names its destination */
    uint8_t *buf = calloc((size_t)fab.n + 1, (size_t)size);
    if (!buf)
        return 0x0100;  /* no resources */
    int count = 0;
    for (int i = 0; i < fab.n; i++) {
        struct fnode *n = &fab.nodes[i];
        if (!n->type || node_down(i))
            continue;
        uint8_t *r = buf + (size_t)count * (size_t)size;
        if (attr == 0x0035) {
            if ((mask & 0x4) && get64(q + 16) != n->guid)   /* DGID interface id */
                continue;
            if ((mask & 0x10) && get16(q + 40) != n->lid)   /* DLID */
                continue;
            put64(r + 8, SUBNET_PREFIX);
            put64(r + 16, n->guid);
            put64(r + 24, SUBNET_PREFIX);
            put64(r + 32, fab.nodes[self].guid);
            put16(r + 40, n->lid);
            put16(r + 42, fab.nodes[self].lid);
            r[49] = 0x80 | 1;
            put16(r + 50, 0xFFFF);
            r[54] = (uint8_t)(2 << 6 | 5);
            r[55] = (uint8_t)(2 << 6 | sa_rate_code());
            r[56] = (uint8_t)(2 << 6 | 18);
        } else {
            if ((mask & 0x1) && get16(q) != n->lid)
                continue;
            if ((mask & (1ull << 7)) && get64(q + 4 + 12) != n->guid)
                continue;
            if ((mask & (1ull << 8)) && get64(q + 4 + 20) != n->guid)
                continue;
            put16(r, n->lid);
            node_info(i, 1, r + 4);
            memcpy(r + 44, n->desc, strlen(n->desc));
        }
        count++;
        if (method == 0x01)
            break;
    }
    if (!count) {
        free(buf);
        return SA_NO_RECORDS;
    }
    *out = buf;
    *outlen = (size_t)count * (size_t)size;
    return 0;
}

static void reply_common(uint8_t *r, uint8_t method)
{
    r[3] = method == 0x12 ? 0x92 : 0x81;  /* GetTableResp / GetResp */
}

void fabric_answer(const char *ca_name, const uint8_t *mad, size_t length, uint16_t dlid, struct mad_answer *out)
{
    memset(out, 0, sizeof *out);
    if (length < MAD_SIZE)
        return;  /* a short MAD never leaves the HCA */
    pthread_mutex_lock(&fab_lock);
    load();
    int hca = -1;
    if (ca_name && !strncmp(ca_name, "mlx5_", 5))
        hca = atoi(ca_name + 5);
    int self = -1;
    for (int i = 0; i < fab.n && hca >= 0; i++)
        if (fab.nodes[i].type == 1 && fab.nodes[i].local_hca == hca)
            self = i;
    uint8_t method = mad[3];
    uint8_t mclass = mad[1];
    if (self < 0 || (method & 0x80)) {
        pthread_mutex_unlock(&fab_lock);
        return;  /* no fabric for this CA, or a response: nothing answers */
    }
    uint8_t *r = calloc(1, MAD_SIZE);
    if (!r) {
        pthread_mutex_unlock(&fab_lock);
        return;
    }
    memcpy(r, mad, MAD_SIZE);
    reply_common(r, method);
    int target = -1, via = 1, directed = mclass == 0x81;
    uint16_t status = 0;

    if (directed) {
        /* walk the initial path from our port */
        int hops = mad[7];
        if (hops > 63) {
            free(r);
            pthread_mutex_unlock(&fab_lock);
            return;
        }
        int cur = self;
        via = 1;
        for (int k = 1; k <= hops; k++) {
            int p = mad[128 + k];
            if (!link_up(cur, p) || (fab.nodes[cur].type == 1 && k > 1)) {
                cur = -1;
                break;
            }
            int next = fab.nodes[cur].peer[p];
            via = fab.nodes[cur].peer_port[p];
            r[192 + k] = (uint8_t)via;
            cur = next;
        }
        target = cur;
        r[4] |= 0x80;  /* D: the response direction */
        r[6] = (uint8_t)hops;
    } else {
        if (dlid == LID_PERMISSIVE || dlid == fab.nodes[self].lid)
            target = self;
        else if (!node_down(self))
            target = by_lid(dlid);
        if (target >= 0 && target != self) {
            static int dist[MAX_NODES];
            distances(self, dist);
            if (dist[target] < 0) {
                target = -1;
            } else {
                /* the port it arrives on: one whose peer is a hop nearer to us */
                via = 1;
                for (int p = 1; p <= fab.nodes[target].nports; p++) {
                    int w = fab.nodes[target].peer[p];
                    if (w >= 0 && link_up(target, p) && dist[w] == dist[target] - 1) {
                        via = p;
                        break;
                    }
                }
            }
        }
    }
    if (target < 0) {
        free(r);
        pthread_mutex_unlock(&fab_lock);
        return;  /* lost: the sender times out */
    }
    uint16_t attr = get16(mad + 16);
    uint32_t mod = get32(mad + 20);
    if (mad[0] != 1) {
        status = ST_BAD_VERSION;
    } else if (mclass == 0x01 || mclass == 0x81) {
        if (mad[2] != 1)
            status = ST_BAD_VERSION;
        else if (method != 0x01 && method != 0x02)
            status = ST_BAD_METHOD;
        else {
            /* a Set is answered with the attribute as it stands: MADs do not change the model */
            memset(r + 64, 0, 64);
            status = smp_attr(target, via, attr, mod, r + 64);
        }
    } else if (mclass == 0x04) {  /* PerfMgt */
        if (mad[2] != 1)
            status = ST_BAD_VERSION;
        else if (method != 0x01 && method != 0x02)
            status = ST_BAD_METHOD;
        else {
            uint8_t *d = r + 64;
            int sel = mad[64 + 1];
            if (attr == 0x0001) {
                memset(d, 0, 192);
                d[0] = 1;
                d[1] = 1;
                /* as ConnectX HCAs answer (captures show CapMask 0x5300): AllPortSelect, extended
                   width, XmitWait, additional PortCountersExtended counters */
                put16(d + 2, 0x4000 | 0x1000 | 0x0200 | 0x0100);
                d[7] = 18;
            } else if (attr == 0x0012 || attr == 0x001D) {
                struct fnode *n = &fab.nodes[target];
                if (sel != 0xFF && (sel > n->nports || (n->type == 1 && sel != 1 && sel != 0)))
                    status = ST_BAD_MODIFIER;
                else {
                    uint8_t keep[4];
                    memcpy(keep, d, 4);
                    memset(d, 0, 192);
                    memcpy(d, keep, 4);
                    if (attr == 0x0012)
                        port_counters(target, d);
                    else
                        port_counters_ext(target, d);
                }
            } else {
                status = ST_BAD_ATTR;
            }
        }
    } else if (mclass == 0x03) {  /* SubnAdm: only at the SM's LID */
        if (fab.sm < 0 || target != fab.sm || mad[2] != 2) {
            status = ST_BAD_VERSION;
        } else if (attr == 0x0001) {
            memset(r + 56, 0, 200);
            r[56] = 1;
            r[57] = 2;
            put16(r + 58, 0x2000);
            r[63] = 18;
        } else {
            uint8_t *payload;
            size_t plen;
            int recsize = 64;
            status = sa_query(self, mad, method, &payload, &plen, &recsize);
            if (!status) {
                /* GetTableResp: as the kernel hands over a reassembled RMPP transfer, the
                   header and the payload's length; a GetResp is one whole MAD */
                size_t total = 56 + plen;
                if (total < MAD_SIZE && method != 0x12)
                    total = MAD_SIZE;
                uint8_t *big = calloc(1, total);
                if (big) {
                    memcpy(big, r, 56);
                    memcpy(big + 56, payload, plen);
                    put16(big + 44, (uint16_t)(recsize / 8));
                    if (method == 0x12) {  /* RMPP, reassembled as the kernel hands it over */
                        big[24] = 1;
                        big[25] = 1;
                        big[26] = 0x07;
                        put32(big + 28, 1);
                        put32(big + 32, (uint32_t)(20 + plen));
                    }
                    free(r);
                    r = big;
                    out->length = total;
                } else {
                    status = 0x0100;
                }
                free(payload);
            }
        }
    } else {
        status = ST_BAD_VERSION;  /* a class no agent here serves */
    }
    set_status(r, status, directed);
    out->replied = 1;
    out->data = r;
    if (!out->length)
        out->length = MAD_SIZE;
    out->slid = directed ? LID_PERMISSIVE : fab.nodes[target].lid;
    out->qpn = (mclass == 0x01 || mclass == 0x81) ? 0 : 1;
    pthread_mutex_unlock(&fab_lock);
}
