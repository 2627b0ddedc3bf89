/*
 * umad_internal.h -- our libibumad.so.3 (docs/infiniband.md).
 *
 * The structures are the ABI of rdma-core's <infiniband/umad.h> (field for field, as
 * libibmad and infiniband-diags were compiled against it); the MAD layouts are the
 * InfiniBand Architecture Specification's. umad.c is the API (ports, agents, the receive
 * queue, sysfs); umad_fabric.c answers each MAD from the node's fabric (ib/fabric) and the
 * HCAs' sysfs.
 */
#ifndef MOKKA_UMAD_INTERNAL_H
#define MOKKA_UMAD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define UMAD_CA_NAME_LEN 20
#define UMAD_CA_MAX_PORTS 10
#define UMAD_CA_MAX_AGENTS 32
#define SYS_INFINIBAND "/sys/class/infiniband"
#define SYS_INFINIBAND_MAD "/sys/class/infiniband_mad"
#define MAD_SIZE 256

typedef struct ib_mad_addr {
    uint32_t qpn;   /* network order */
    uint32_t qkey;  /* network order */
    uint16_t lid;   /* network order */
    uint8_t sl;
    uint8_t path_bits;
    uint8_t grh_present;
    uint8_t gid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
    uint8_t gid[16];
    uint32_t flow_label;
    uint16_t pkey_index;
    uint8_t reserved[6];
} ib_mad_addr_t;

typedef struct ib_user_mad {
    uint32_t agent_id;
    uint32_t status;
    uint32_t timeout_ms;
    uint32_t retries;
    uint32_t length;
    ib_mad_addr_t addr;
    uint8_t data[];
} ib_user_mad_t;

typedef struct umad_port {
    char ca_name[UMAD_CA_NAME_LEN];
    int portnum;
    unsigned base_lid;
    unsigned lmc;
    unsigned sm_lid;
    unsigned sm_sl;
    unsigned state;
    unsigned phys_state;
    unsigned rate;
    uint32_t capmask;     /* network order */
    uint64_t gid_prefix;  /* network order */
    uint64_t port_guid;   /* network order */
    unsigned pkeys_size;
    uint16_t *pkeys;
    char link_layer[UMAD_CA_NAME_LEN];
} umad_port_t;

typedef struct umad_ca {
    char ca_name[UMAD_CA_NAME_LEN];
    unsigned node_type;
    int numports;
    char fw_ver[20];
    char ca_type[40];
    char hw_ver[20];
    uint64_t node_guid;    /* network order */
    uint64_t system_guid;  /* network order */
    umad_port_t *ports[UMAD_CA_MAX_PORTS];
} umad_ca_t;

struct umad_device_node {
    struct umad_device_node *next;
    const char *ca_name;
};

struct umad_reg_attr {
    uint8_t mgmt_class;
    uint8_t mgmt_class_version;
    uint32_t flags;
    uint64_t method_mask[2];
    uint32_t oui;
    uint8_t rmpp_version;
};

/* One answer to a sent MAD: a reply (status 0) or nothing (the request is lost: the sender's
   MAD comes back with ETIMEDOUT once its timeout has run out). */
struct mad_answer {
    int replied;
    uint8_t *data;        /* malloc'd reply, `length` bytes (>= MAD_SIZE) */
    size_t length;
    uint16_t slid;        /* the responder's LID, host order */
    uint32_t qpn;         /* 0 for SMPs, 1 for GMPs */
};

/* umad_fabric.c: answer `mad` (length bytes), sent on HCA `ca_name` port 1 to `dlid` (host
   order; ignored for directed-route SMPs). Never fails: a MAD it cannot deliver is lost. */
void fabric_answer(const char *ca_name, const uint8_t *mad, size_t length, uint16_t dlid, struct mad_answer *out);

/* umad.c: sysfs helpers shared with umad_fabric.c. */
int sysfs_read(const char *path, char *buf, size_t size);
unsigned long long sysfs_ull(const char *path, unsigned long long dflt);

#endif
