/*
 * mokka_state.h -- the one definition of the shared state file <state-dir>/state.
 *
 * Theory of operation
 * -------------------
 * The mokkafs daemon is the only writer. It creates the file at its full size
 * (MOKKA_STATE_SIZE, fixed for a given MOKKA_STATE_VERSION) and maps it; every
 * shim maps it read-only (MAP_SHARED) and never writes to it.
 *
 * Validity: a reader checks, in this order, that the file is at least
 * sizeof(struct mokka_state) bytes long (before touching the mapping, so a
 * short file can never SIGBUS), that `magic` is MOKKA_STATE_MAGIC, `version`
 * is MOKKA_STATE_VERSION and `size` equals sizeof(struct mokka_state). Anything
 * else is "no driver" to the shim, never a crash.
 *
 * Seqlock: `seq` is even while the records are stable and odd while the daemon
 * rewrites them. The daemon publishes every record at once (after each event and
 * on a ~100 ms tick for time-varying values): seq+1, write, seq+1. A reader
 * copies what it needs between two loads of `seq` and retries while they differ
 * or are odd; the retry is bounded. A writer that died mid-write (seq odd past
 * the bounded wait) leaves records that may be torn: readers answer their API's
 * error for it (NVML_ERROR_UNKNOWN), never a torn value and never a hang.
 *
 * Events: `ring` holds the last MOKKA_EVENT_RING events. Event number n lives in
 * ring[n % MOKKA_EVENT_RING] with its `seq` field set to n+1 (0 = never written).
 * The daemon writes the slot, then bumps `event_head` (events ever written),
 * then increments `event_wake` and FUTEX_WAKEs every waiter on it (a shared,
 * not private, futex). A waiter loads `event_wake`, then `event_head`, and if
 * it has nothing new sleeps in FUTEX_WAIT on the `event_wake` value it loaded,
 * so a wake between the check and the sleep is never lost. Each NVML event set
 * keeps its own cursor, so every set in every process sees each event once.
 *
 * Processes (struct mokka_proc_record): the one thing consumers write, and
 * each process writes only its own. A process that takes its first context
 * connects to the unix socket <state path>.procs.sock and keeps the
 * connection for its life. The daemon identifies the caller by the kernel's
 * word only (SO_PEERCRED pid and uid, a pidfd for liveness), makes a record
 * for it (a memfd of exactly sizeof(struct mokka_proc_record), sealed against
 * shrinking and growing, so no mapping of it can fault) and sends it to that
 * caller alone in SCM_RIGHTS with one byte; nobody else ever gets a
 * descriptor of it. One byte without a descriptor means "unaccounted" (the
 * uid is at its cap of live records, MOKKA_PROCS_PER_UID): CUDA works on,
 * counting the process's own memory. The shim refuses a record without the
 * seals, of the wrong size or with the wrong header.
 *
 * The process stores its contexts mask, its per-GPU bytes and, per GPU, the
 * MIG device it uses (its GPU and compute instance ids) into its
 * record; the daemon folds every live record into the model (SetProcesses,
 * published in the GPU records) on a ~100 ms tick, clamping each counter to
 * the GPU's memory, and lists it under the peer pid (the daemon's pid
 * namespace, so containers show node pids). The daemon writes `pid` (that
 * listed pid) and `others[gpu]`: the bytes that count against this process
 * on each GPU (its own uid's other processes and root's; claims of other
 * users are listed but refuse nobody, since the simulator cannot tell a claim
 * from an allocation). A process that scribbles on its record only lies about
 * itself. When a process first takes a context on a GPU, or first has memory
 * there, it writes one byte on its connection and waits (bounded, 200 ms) for
 * the daemon's byte, which comes after the record was folded and published:
 * NVML lists it at once. The record goes when the connection closes or the
 * pidfd says the process exited. <state path>.procs.id lists "pid start_time
 * dev ino" of each live record, so that a restarted daemon re-opens it
 * through /proc/<pid>/fd (start time checked) and hands the same record back
 * when the shim, having seen its connection close, reconnects.
 *
 * Accounting (version 7): accounting[i] holds GPU i's accounting records
 * (nvmlDeviceGetAccountingStats), oldest first, `count` of them; the daemon
 * rewrites a GPU's buffer, under the seqlock, only when its records changed.
 *
 * MIG (version 7): the board's profile tables (mig_profiles) are written once; each GPU
 * record carries its MIG mode (current, pending), its GPU instances (mig_gi, by
 * id) and its MIG devices (mig_devices, one per compute instance, ordered by GPU
 * instance id then compute instance id: index m is MIG handle m), each with its
 * name, MIG- UUID, capability minor, SMs and memory as the model computed them.
 * Shims change MIG only through the control socket (`gpu=N mig ...`, docs/mig.md).
 *
 * Addressing mode (version 8): each GPU record carries the board's
 * nvmlDeviceGetAddressingMode answer (the profile's addressing_mode).
 *
 * Features (version 12): each GPU record carries what its compute
 * capability turns on in CUDA (L2 persistence, clusters, multicast, ...)
 * and which of NVML's architecture-bound queries it answers, as the model
 * decided them; the shims copy the values, never compare an architecture.
 *
 * Recovery action (version 13): each GPU record carries what the driver asks for after a
 * fault (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), as the model's Xid catalogue sets it. System
 * events (a GPU's driver unbound or bound, nvmlSystemEventSetWait) share the event ring, their
 * type marked MOKKA_EVENT_SYSTEM so that no device event set matches one.
 *
 * Board readings without an NVML getter (version 14): each GPU record carries the graphics
 * voltage and the sparse operation mode its board reports (nvidia-smi -q's Voltage and Sparse
 * Operation Mode, which the real tool reads through the driver's private table).
 *
 * Supported clocks (version 15): the board's memory clocks and, for each, the graphics
 * clocks it allows (nvmlDeviceGetSupportedMemoryClocks / GetSupportedGraphicsClocks), written
 * once for the node as the model lists them, highest first.
 *
 * Restart: a daemon that finds a valid file of this version rewrites it in
 * place and continues `event_head`/`event_wake`, so consumers that hold the
 * mapping across a daemon restart keep working.
 *
 * Repair: the daemon checks on every tick that the path still names its file
 * (same inode, regular) and that the file's size and header are what it wrote.
 * A file changed in place is put back in place, counters included. A file
 * replaced or removed is superseded: the daemon writes a new file with all it
 * had (records, ring, counters), renames it into place, then stores
 * MOKKA_STATE_RETIRED in the old file's magic and wakes its futex. A reader
 * that finds any magic but MOKKA_STATE_MAGIC in its mapping looks at the path
 * again (on a later call, at most every 10 ms) and maps the valid file there;
 * one whose generation has not moved for a second looks too, on the calls a
 * poller makes once a round (a copy put in place by someone else is never
 * written, nor retired, by the daemon).
 *
 * Layout rules: only fixed-width integers and char arrays, every field
 * naturally aligned with explicit padding, so Python (cffi, reading the
 * region between the CDEF markers) and C agree; tests/test_state_layout.py
 * compiles this header and compares every offset. Units are NVML's: bytes,
 * MHz, milliwatts, millijoules, degrees C, percent.
 */
#ifndef MOKKA_STATE_H
#define MOKKA_STATE_H

#include <stdint.h>

/* BEGIN CDEF -- parsed by mokkafs/daemon/shm/layout.py; plain #defines and structs only */
#define MOKKA_STATE_MAGIC 0x4554415453414b4d
#define MOKKA_STATE_VERSION 15
#define MOKKA_MAX_GPUS 64
#define MOKKA_CPU_WORDS 16         /* 1024 CPUs, what NVML's CPU masks carry */
#define MOKKA_MAX_NVLINKS 18
#define MOKKA_EVENT_COUNTERS 5     /* clocks event reasons whose time the driver counts */
#define MOKKA_EVENT_RING 256
#define MOKKA_STATE_RETIRED 0x4452544552414b4d
#define MOKKA_ECC_LOCATIONS 8
#define MOKKA_NVLINK_COUNTERS 4
#define MOKKA_MAX_RETIRED 64
#define MOKKA_MAX_GPU_PROCS 64
#define MOKKA_PROCS_MAGIC 0x53434f5250414b4d
#define MOKKA_PROCS_VERSION 5
#define MOKKA_PROCS_PER_UID 64
#define MOKKA_ACCOUNTING_RECORDS 4000 /* per GPU: the real driver's buffer */
#define MOKKA_PROC_ON_MIG 0x10000    /* mokka_proc_record.mig: set when the process is on a MIG device */
#define MOKKA_MAX_GPU_INSTANCES 8  /* per GPU */
#define MOKKA_MAX_MIG_DEVICES 8    /* compute instances per GPU, all GPU instances together */
#define MOKKA_MAX_MIG_PROFILES 16  /* GPU instance profiles in a board's table */
#define MOKKA_MAX_CI_PROFILES 8    /* compute instance profiles of one GPU instance profile */
#define MOKKA_MAX_MIG_PLACEMENTS 8
#define MOKKA_NO_MIG 0xFFFF        /* mokka_gpu_process.mig_gi/mig_ci: not on a MIG device */
#define MOKKA_EVENT_SYSTEM 0x8000000000000000 /* mokka_event.type: a system event (nvmlSystemEventType bits below it) */
#define MOKKA_MAX_MEM_CLOCKS 4         /* memory clocks a board supports (version 15) */
#define MOKKA_MAX_GRAPHICS_CLOCKS 320  /* graphics clocks one memory clock allows */

struct mokka_gpu_process {
    uint32_t pid;
    uint16_t mig_gi;           /* the GPU instance id it runs on; MOKKA_NO_MIG: none (version 7) */
    uint16_t mig_ci;           /* the compute instance id; MOKKA_NO_MIG: none */
    uint64_t used_memory;      /* bytes */
};

/* MIG (version 7; docs/mig.md). The board's tables are node-wide (mokka_state.mig_profiles);
   each GPU lists its GPU instances and its MIG devices (compute instances), every fact computed
   by the model (mokkafs/model/mig.py). While a GPU is lost or MIG is off, it lists none. */
struct mokka_mig_ci_profile {  /* nvmlComputeInstanceProfileInfo_v3_t; nvidia-smi mig -lcip */
    uint32_t id;               /* NVML_COMPUTE_INSTANCE_PROFILE_*, also the id the driver reports */
    uint32_t slice_count;
    uint32_t span;             /* placement units one instance takes (1, 2, 4, 4, 8 for 1-7 slices;
                                  model/mig.py ci_span; version 11) */
    uint32_t instance_count;   /* in an empty GPU instance */
    uint32_t multiprocessor_count;
    uint32_t placement_count;
    uint32_t placements[MOKKA_MAX_MIG_PLACEMENTS]; /* first placement units; each takes span */
    char name[32];             /* "1c.3g.40gb"; the full-size one is named as its GPU instance */
};

struct mokka_mig_profile {     /* nvmlGpuInstanceProfileInfo_v3_t; nvidia-smi mig -lgip/-lgipp */
    uint32_t index;            /* NVML_GPU_INSTANCE_PROFILE_*: what GetGpuInstanceProfileInfo takes */
    uint32_t id;               /* the id the driver reports (19 for 1g.10gb on H100) */
    uint32_t slice_count;      /* compute slices */
    uint32_t instance_count;   /* on an empty GPU */
    uint32_t multiprocessor_count;
    uint32_t copy_engine_count;
    uint32_t decoder_count;
    uint32_t encoder_count;
    uint32_t jpeg_count;
    uint32_t ofa_count;
    uint32_t p2p;
    uint32_t placement_size;   /* memory slices one instance takes */
    uint32_t placement_count;
    uint32_t ci_profile_count;
    uint64_t memory_mib;       /* memorySizeMB */
    uint32_t placements[MOKKA_MAX_MIG_PLACEMENTS]; /* first memory slices */
    char name[32];             /* "1g.10gb", without the "MIG " nvidia-smi prints */
    struct mokka_mig_ci_profile ci_profiles[MOKKA_MAX_CI_PROFILES];
};

struct mokka_mig_gi {          /* a GPU instance */
    uint32_t id;
    uint32_t profile;          /* NVML_GPU_INSTANCE_PROFILE_* */
    uint32_t profile_id;       /* the id the driver reports */
    uint32_t start;            /* placement: first memory slice */
    uint32_t size;             /* placement: memory slices */
    uint32_t slice_count;      /* compute slices */
    uint32_t multiprocessor_count;
    uint32_t copy_engine_count;
    uint32_t decoder_count;
    uint32_t encoder_count;
    uint32_t jpeg_count;
    uint32_t ofa_count;
    uint32_t minor;            /* nvidia-caps minor of gpu<gpu minor>/gi<id>/access */
    uint32_t ci_count;         /* its compute instances (in mig_devices) */
    uint64_t memory_total;     /* bytes: the profile's memory */
    uint64_t memory_used;      /* bytes the processes on it use */
    uint64_t bar1_total;       /* bytes of BAR1 aperture (version 9; model/mig.py bar1_bytes) */
    char profile_name[32];     /* "3g.40gb" */
    uint32_t ci_remaining[MOKKA_MAX_CI_PROFILES]; /* compute instances of each of its profile's
                                                     ci_profiles that still fit (table order) */
};

struct mokka_mig_device {      /* a compute instance: one MIG device */
    uint32_t gi_slot;          /* its GPU instance: index into mokka_gpu.mig_gi */
    uint32_t gi_id;
    uint32_t ci_id;
    uint32_t profile;          /* NVML_COMPUTE_INSTANCE_PROFILE_*, also the id reported */
    uint32_t start;            /* placement: first compute slice in its GPU instance */
    uint32_t size;             /* placement: its span, 1, 2, 4, 4, 8 for 1, 2, 3, 4, 7 slices */
    uint32_t multiprocessor_count;
    uint32_t minor;            /* nvidia-caps minor of gpu<gpu minor>/gi<gi>/ci<ci>/access */
    char name[96];             /* NVML's name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb" */
    char uuid[48];             /* "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    char profile_name[32];     /* "1c.3g.40gb", or the GPU instance's for a full-size one */
};

struct mokka_nvlink {
    uint32_t state;            /* 1 = up (NVML_FEATURE_ENABLED), 0 = down */
    uint32_t version;          /* nvmlDeviceGetNvLinkVersion */
    uint64_t errors[MOKKA_NVLINK_COUNTERS]; /* replay, recovery, crc_flit, crc_data */
    uint32_t remote_domain;
    uint32_t remote_bus;
    uint32_t remote_device;
    uint32_t remote_pci_device_id; /* (device << 16) | vendor */
    uint32_t remote_type;      /* nvmlIntNvLinkDeviceType_t: 0 GPU, 1 IBMNPU, 2 SWITCH */
    uint32_t remote_has_pci;   /* 1: remote_* name a PCI function sysfs shows; 0: none to name */
};

struct mokka_gpu {
    /* identity (static for the daemon's lifetime) */
    char name[96];
    char uuid[96];
    char serial[32];
    char board_part_number[32];
    char vbios_version[32];
    char inforom_image[16];
    char inforom_oem[16];
    char inforom_ecc[16];
    char inforom_power[16];
    char bus_id[32];           /* 00000000:18:00.0 */
    char bus_id_legacy[16];    /* 0000:18:00.0 */
    uint32_t index;
    uint32_t minor;
    uint32_t brand;            /* nvmlBrandType_t */
    uint32_t architecture;     /* NVML_DEVICE_ARCH_* */
    uint32_t cc_major;
    uint32_t cc_minor;
    uint32_t board_id;
    uint32_t module_id;
    int32_t numa_node;
    uint32_t multiprocessor_count;
    uint32_t pci_domain;
    uint32_t pci_bus;
    uint32_t pci_device;
    uint32_t pci_device_id;    /* (device << 16) | vendor */
    uint32_t pci_subsystem_id; /* (subsystem device << 16) | subsystem vendor */
    uint32_t pcie_max_gen;
    uint32_t pcie_max_width;
    uint32_t pcie_cur_gen;
    uint32_t pcie_cur_width;
    uint32_t pcie_replay;
    uint32_t pcie_tx_kbps;
    uint32_t pcie_rx_kbps;
    /* capabilities */
    uint32_t has_fan;
    uint32_t fan_speed;        /* percent */
    uint32_t ecc_enabled;      /* ECC mode in effect (since the last reset) */
    uint32_t mig_capable;
    uint32_t has_row_remapper; /* 0: retires pages instead */
    uint32_t has_fabric;
    uint32_t fabric_clique_id;
    uint32_t fabric_state;     /* nvmlGpuFabricState_t */
    uint8_t fabric_cluster_uuid[16];
    uint32_t fabric_health_mask;    /* NVML_GPU_FABRIC_HEALTH_MASK_* */
    uint32_t fabric_health_summary; /* NVML_GPU_FABRIC_HEALTH_SUMMARY_* */
    uint32_t persistence_mode;
    uint32_t compute_mode;
    /* memory, bytes */
    uint64_t mem_total;
    uint64_t mem_reserved;
    uint64_t mem_used;         /* excludes reserved (nvmlMemory_v2_t.used) */
    uint64_t mem_free;
    uint64_t bar1_total;
    uint64_t bar1_used;
    uint32_t mem_bus_width;
    uint32_t pstate;           /* nvmlPstates_t */
    /* clocks, MHz, indexed by nvmlClockType_t (graphics, sm, mem, video) */
    uint32_t clock_cur[4];
    uint32_t clock_max[4];
    uint32_t clock_app[4];
    uint32_t clock_default_app[4];
    /* power, milliwatts / millijoules */
    uint32_t power_usage;
    uint32_t power_limit;
    uint32_t power_default_limit;
    uint32_t power_min_limit;
    uint32_t power_max_limit;
    uint32_t power_enforced_limit;
    uint64_t energy_mj;
    /* temperature, degrees C */
    int32_t temp_gpu;
    int32_t temp_mem;          /* -1: no memory sensor */
    int32_t temp_threshold[8]; /* by nvmlTemperatureThresholds_t; -1: not supported */
    int32_t temp_tlimit;       /* T.Limit reference; -1: the architecture has none */
    uint32_t util_gpu;
    uint32_t util_mem;
    uint32_t util_enc;
    uint32_t util_dec;
    uint32_t pci_class;        /* base << 16 | sub << 8 | prog-if (0x030200: 3D controller) */
    uint64_t throttle_mask;    /* nvmlClocksEventReasons bits */
    /* ECC counters, [counter type: volatile, aggregate][error type: corrected,
       uncorrected][nvmlMemoryLocation_t] */
    uint64_t ecc[2][2][MOKKA_ECC_LOCATIONS];
    uint32_t retired_sbe;
    uint32_t retired_dbe;
    uint32_t retired_pending;
    uint32_t remapped_corr;
    uint32_t remapped_unc;
    uint32_t remap_pending;
    uint32_t remap_failure;
    uint32_t nvlink_count;
    struct mokka_nvlink nvlink[MOKKA_MAX_NVLINKS];
    /* faults */
    uint32_t lost;             /* fallen off the bus: NVML_ERROR_GPU_IS_LOST */
    uint32_t needs_reset;
    uint32_t last_xid;         /* 0: none since reset */
    uint32_t recovery_action;  /* nvmlDeviceGpuRecoveryAction_t the driver asks for (version 13) */
    /* CUDA (version 2) */
    uint64_t l2_cache_bytes;
    uint32_t mem_used_pinned;  /* mem_used is a pin, not the processes' sum */
    uint32_t process_count;    /* processes with a context here, at most MOKKA_MAX_GPU_PROCS */
    struct mokka_gpu_process processes[MOKKA_MAX_GPU_PROCS];
    /* identity NVML has no getter for (version 3); nvidia-smi -q reads it here */
    char gpu_part_number[32];
    /* facts of the composition the model computes once (version 5) */
    uint64_t cpu_affinity[MOKKA_CPU_WORDS]; /* bit c: CPU c is local to this GPU (sysfs local_cpus) */
    uint8_t topo_level[MOKKA_MAX_GPUS];     /* nvmlGpuTopologyLevel_t to the GPU of each index */
    /* the SM's limits as cuDeviceGetAttribute reports them (mokkafs/model/compute.py) */
    uint32_t max_threads_per_sm;
    uint32_t shared_memory_per_sm;          /* bytes */
    uint32_t shared_memory_per_block_optin; /* bytes */
    uint32_t max_blocks_per_sm;
    uint32_t fp32_to_fp64_ratio;
    /* what the compute capability turns on, as cuDeviceGetAttribute reports it (version 12,
       mokkafs/model/compute.py compute_features); 0/1 for the flags */
    uint32_t generic_compression;
    uint32_t max_persisting_l2_bytes;
    uint32_t max_access_policy_window_bytes;
    uint32_t reserved_shared_memory_per_block; /* bytes */
    uint32_t rdma_writes_ordering;  /* CUGPUDirectRDMAWritesOrdering */
    uint32_t cluster_launch;
    uint32_t mem_sync_domain_count;
    uint32_t tensor_map_access;
    uint32_t multicast;
    /* what the architecture lets NVML answer (version 12, compute.py nvml_support); 0/1 */
    uint32_t nvml_sram_ecc_status;      /* nvmlDeviceGetSramEccErrorStatus (with ECC on) */
    uint32_t nvml_repair_status;        /* nvmlDeviceGetRepairStatus */
    uint32_t nvml_unrepairable_flag;    /* nvmlDeviceGetUnrepairableMemoryFlag_v1 */
    uint32_t nvml_power_average;        /* NVML_FI_DEV_POWER_AVERAGE */
    uint32_t nvml_edpp_multiplier;      /* NVML_FI_DEV_EDPP_MULTIPLIER */
    uint32_t nvml_gpm;                  /* GPU performance monitoring */
    uint32_t pad4;
    /* settings (version 6) */
    uint32_t ecc_pending;      /* ECC mode the next GPU reset brings (nvmlDeviceGetEccMode pending) */
    uint32_t accounting_mode;  /* nvmlDeviceGetAccountingMode */
    uint32_t pad2;
    /* MIG (version 7) */
    uint32_t mig_mode;         /* current: NVML_DEVICE_MIG_ENABLE (1) or DISABLE (0) */
    uint32_t mig_pending;      /* the mode the next reset activates (equals mig_mode when none is due) */
    uint32_t mig_gi_count;     /* GPU instances, by id */
    uint32_t mig_device_count; /* MIG devices, by (GPU instance id, compute instance id): the MIG handle index */
    uint32_t mig_gi_remaining[MOKKA_MAX_MIG_PROFILES]; /* GPU instances of each of mig_profiles that
                                                          still fit (0 while MIG is off) */
    struct mokka_mig_gi mig_gi[MOKKA_MAX_GPU_INSTANCES];
    struct mokka_mig_device mig_devices[MOKKA_MAX_MIG_DEVICES];
    /* memory addressing (version 8) */
    uint32_t addressing_mode;  /* nvmlDeviceAddressingModeType_t: 0 none, 1 HMM, 2 ATS (the profile's) */
    uint32_t pad3;
    /* values of -q the captures have (version 10) */
    uint64_t pdi;              /* nvmlDeviceGetPdi (the model's, from the UUID) */
    uint64_t event_ns[MOKKA_EVENT_COUNTERS]; /* ns each reason held the clocks: SW power cap,
                                                sync boost, SW thermal, HW thermal, HW power brake */
    uint32_t c2c_mode;         /* 0: no C2C link (before Hopper), 1: disabled, 2: enabled (Grace) */
    uint32_t row_remap_banks;  /* DRAM banks with spare rows (the histogram's); 0: not known */
    /* what nvidia-smi -q prints that NVML has no getter for (version 14) */
    uint32_t voltage_uv;       /* graphics voltage, microvolts; 0: the board reports none (N/A) */
    uint32_t pad5;
    char sparse_operation_mode[16]; /* "Disabled"; "": the board has none (N/A) */
};

/* One memory clock and the graphics clocks the board allows with it (version 15). */
struct mokka_supported_clocks {
    uint32_t memory_mhz;
    uint32_t graphics_count;
    uint32_t graphics_mhz[MOKKA_MAX_GRAPHICS_CLOCKS]; /* highest first */
};

/* One process's accounting on one GPU (nvmlAccountingStats_t), kept after it exits. */
struct mokka_accounting_record {
    uint32_t pid;
    uint32_t is_running;
    uint32_t gpu_utilization;  /* percent, over the process's life */
    uint32_t memory_utilization;
    uint64_t max_memory_usage; /* bytes */
    uint64_t time_ms;          /* its life, filled in at exit (0 while it runs) */
    uint64_t start_time_us;    /* CLOCK_REALTIME */
};

struct mokka_accounting {
    uint32_t count;            /* records in use, oldest first */
    uint32_t pad0;
    struct mokka_accounting_record records[MOKKA_ACCOUNTING_RECORDS];
};

struct mokka_event {
    uint64_t seq;              /* event number + 1; 0 = slot never written */
    uint64_t type;             /* nvmlEventType bits; or MOKKA_EVENT_SYSTEM | nvmlSystemEventType bits (version 13) */
    uint64_t data;             /* Xid for XID_CRITICAL_ERROR, count for ECC, the recovery action for
                                  GPU_RECOVERY_ACTION; a system event's gpuId */
    uint32_t gpu;              /* index */
    uint16_t mig_gi;           /* the MIG instance an Xid names (docs/mig.md); MOKKA_NO_MIG: none */
    uint16_t mig_ci;
    uint64_t time_ns;          /* CLOCK_REALTIME when published */
};

struct mokka_state {
    uint64_t magic;
    uint32_t version;
    uint32_t gpu_count;
    uint64_t size;             /* sizeof(struct mokka_state) */
    uint32_t seq;              /* seqlock over everything below */
    uint32_t event_wake;       /* futex word, incremented after each event */
    uint64_t event_head;       /* events ever appended */
    uint64_t generation;       /* publishes ever made */
    uint64_t publish_time_ns;  /* CLOCK_REALTIME of the last publish */
    uint32_t daemon_pid;
    uint32_t cuda_version;     /* nvmlSystemGetCudaDriverVersion, e.g. 13000 */
    char driver_version[80];
    char nvml_version[80];
    char hostname[64];
    struct mokka_event ring[MOKKA_EVENT_RING];
    struct mokka_gpu gpus[MOKKA_MAX_GPUS];
    struct mokka_accounting accounting[MOKKA_MAX_GPUS]; /* version 6; by GPU index */
    /* the board's MIG tables (version 7); mig_profile_count 0: the board has no MIG */
    uint32_t mig_memory_slices;
    uint32_t mig_compute_slices;
    uint32_t mig_profile_count;
    uint32_t pad1;
    struct mokka_mig_profile mig_profiles[MOKKA_MAX_MIG_PROFILES];
    /* the board's supported clocks (version 15), highest memory clock first; count 0: the board
       lists none (NOT_SUPPORTED) */
    uint32_t supported_clock_count;
    uint32_t pad2;
    struct mokka_supported_clocks supported_clocks[MOKKA_MAX_MEM_CLOCKS];
};

/* One CUDA process's record (see above): written by that process, except `pid` and `others`. */
struct mokka_proc_record {
    uint64_t magic;            /* MOKKA_PROCS_MAGIC */
    uint32_t version;          /* MOKKA_PROCS_VERSION */
    uint32_t pid;              /* daemon: the pid the process is listed under */
    uint64_t size;             /* sizeof(struct mokka_proc_record) */
    uint64_t contexts;         /* bit i: the process holds a context on GPU index i */
    uint64_t mem[MOKKA_MAX_GPUS];    /* bytes allocated, by GPU index */
    uint64_t others[MOKKA_MAX_GPUS]; /* daemon: bytes that count against this process */
    uint32_t mig[MOKKA_MAX_GPUS];    /* the MIG device it uses on each GPU index (version 5): 0 none,
                                        else MOKKA_PROC_ON_MIG | gi id << 8 | ci id */
};
/* END CDEF */

#ifdef __cplusplus
static_assert(sizeof(struct mokka_state) % 8 == 0, "mokka_state size");
#else
_Static_assert(sizeof(struct mokka_state) % 8 == 0, "mokka_state size");
#endif

/* The node's socket, as NVIDIA's CDI specs mount it from a driver root (docs/containers.md). */
#define MOKKA_NODE_SOCKET "/run/nvidia-persistenced/socket"
#define MOKKA_STATE_ENV "MOKKA_STATE"
#define MOKKA_PROCS_SOCK_SUFFIX ".procs.sock"
/* <state path>.procs.lock<N>: GPU index N's context lock (compute modes, docs/cuda.md) */
#define MOKKA_PROCS_LOCK_SUFFIX ".procs.lock"

#endif /* MOKKA_STATE_H */
