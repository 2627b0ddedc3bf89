"""What a board's generation decides: its compute capability, as the CUDA driver reports it
through cuDeviceGetAttribute (the SM's limits, data, and the features each architecture turns
on, rules), and its architecture, as NVML answers the queries it documents per architecture.
Read by the model and published for libcuda.so.1 and libnvidia-ml.so.1, which decide none of it.

Source of the limits: the CUDA C++ Programming Guide, "Compute Capabilities": the table
"Technical Specifications per Compute Capability" (maximum resident threads and blocks per SM,
shared memory per SM, shared memory per block with opt-in) and the arithmetic-throughput table
(FP32 to FP64 ratio). A capability the table does not list takes the row of the nearest one
below it (the lowest row for anything older). Source of the features: the driver API's
CUdevice_attribute reference and the guide's chapters on L2 persistence (8.0 and later) and
thread-block clusters, memory synchronization domains, the Tensor Memory Accelerator and
multicast objects (9.0 and later). Source of NVML's: nvml.h's "Ampere or newer" and the like on
each query, and the captures.
"""
from __future__ import annotations

from dataclasses import dataclass

from mokkafs.model.nvml_consts import DEVICE_ARCHS

KIB = 1024


@dataclass(frozen=True)
class ComputeLimits:
    max_threads_per_sm: int  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
    shared_memory_per_sm: int  # bytes, ..._MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    shared_memory_per_block_optin: int  # bytes, ..._MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    max_blocks_per_sm: int  # ..._MAX_BLOCKS_PER_MULTIPROCESSOR
    fp32_to_fp64_ratio: int  # ..._SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO


LIMITS: dict[tuple[int, int], ComputeLimits] = {
    (7, 5): ComputeLimits(1024, 64 * KIB, 64 * KIB, 16, 32),  # Turing (T4)
    (8, 0): ComputeLimits(2048, 164 * KIB, 163 * KIB, 32, 2),  # A100
    (8, 6): ComputeLimits(1536, 100 * KIB, 99 * KIB, 16, 64),  # GA10x
    (8, 9): ComputeLimits(1536, 100 * KIB, 99 * KIB, 24, 64),  # Ada (L40S)
    (9, 0): ComputeLimits(2048, 228 * KIB, 227 * KIB, 32, 2),  # Hopper
    (10, 0): ComputeLimits(2048, 228 * KIB, 227 * KIB, 32, 2),  # Blackwell (B200, GB200)
    # Blackwell Ultra: the guide gives sm_100's per-SM limits; the FP64 ratio is sm_100's too,
    # not checked against a real GB300.
    (10, 3): ComputeLimits(2048, 228 * KIB, 227 * KIB, 32, 2),
    (12, 0): ComputeLimits(1536, 100 * KIB, 99 * KIB, 24, 64),  # Blackwell workstation
}


def _capability(capability: str) -> tuple[int, int]:
    major, minor = (int(x) for x in capability.split("."))
    return major, minor


def compute_limits(capability: str) -> ComputeLimits:
    """The limits of compute capability `capability` ("9.0")."""
    cc = _capability(capability)
    known = sorted(LIMITS)
    below = [k for k in known if k <= cc]
    return LIMITS[below[-1] if below else known[0]]


AMPERE = (8, 0)  # L2 persistence, compression, the driver's reserved shared memory, RDMA ordering
HOPPER = (9, 0)  # clusters, memory synchronization domains, tensor maps, multicast

# The largest access policy window (CUaccessPolicyWindow::num_bytes) from Ampere on: 128 MiB
# less one 4 KiB page, as real boards report it (a Turing board reports 0).
ACCESS_POLICY_WINDOW_MAX = 128 * 1024 * KIB - 4 * KIB
RESERVED_SHARED_MEMORY_PER_BLOCK = 1 * KIB  # the driver's own per block, from Ampere on
# CUGPUDirectRDMAWritesOrdering: NONE before Ampere, OWNER (the GPU's own writes see them) after
RDMA_WRITES_ORDERING_NONE, RDMA_WRITES_ORDERING_OWNER = 0, 100
MEM_SYNC_DOMAINS = 4  # Hopper's; one (the default domain) before


@dataclass(frozen=True)
class ComputeFeatures:
    generic_compression: bool  # CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED
    max_persisting_l2_bytes: int  # ..._MAX_PERSISTING_L2_CACHE_SIZE
    max_access_policy_window_bytes: int  # ..._MAX_ACCESS_POLICY_WINDOW_SIZE
    reserved_shared_memory_per_block: int  # bytes, ..._RESERVED_SHARED_MEMORY_PER_BLOCK
    rdma_writes_ordering: int  # ..._GPU_DIRECT_RDMA_WRITES_ORDERING (CUGPUDirectRDMAWritesOrdering)
    cluster_launch: bool  # ..._CLUSTER_LAUNCH
    mem_sync_domain_count: int  # ..._MEM_SYNC_DOMAIN_COUNT
    tensor_map_access: bool  # ..._TENSOR_MAP_ACCESS_SUPPORTED
    multicast: bool  # ..._MULTICAST_SUPPORTED


def compute_features(capability: str, l2_cache_bytes: int, in_fabric: bool) -> ComputeFeatures:
    """The features of a board of compute capability `capability` ("9.0") with `l2_cache_bytes`
    of L2; `in_fabric`: its NVLinks are in an NVSwitch fabric (multicast goes through the
    switches, so a Hopper board without one has none). Up to 3/4 of the L2 may be set aside for
    persisting accesses."""
    cc = _capability(capability)
    ampere, hopper = cc >= AMPERE, cc >= HOPPER
    return ComputeFeatures(
        generic_compression=ampere,
        max_persisting_l2_bytes=l2_cache_bytes // 4 * 3 if ampere else 0,
        max_access_policy_window_bytes=ACCESS_POLICY_WINDOW_MAX if ampere else 0,
        reserved_shared_memory_per_block=RESERVED_SHARED_MEMORY_PER_BLOCK if ampere else 0,
        rdma_writes_ordering=RDMA_WRITES_ORDERING_OWNER if ampere else RDMA_WRITES_ORDERING_NONE,
        cluster_launch=hopper,
        mem_sync_domain_count=MEM_SYNC_DOMAINS if hopper else 1,
        tensor_map_access=hopper,
        multicast=hopper and in_fabric,
    )


@dataclass(frozen=True)
class NvmlSupport:
    """The queries NVML answers on a board of one architecture (NOT_SUPPORTED elsewhere)."""

    sram_ecc_status: bool  # nvmlDeviceGetSramEccErrorStatus: Ampere and later (with ECC on)
    repair_status: bool  # nvmlDeviceGetRepairStatus: Ada and later, as the captures have it
    unrepairable_memory_flag: bool  # nvmlDeviceGetUnrepairableMemoryFlag_v1: Hopper and later
    # NVML_FI_DEV_POWER_AVERAGE: nvml.h says Ampere except GA100; the A100 and T4 captures show
    # it N/A, and the model answers it from Ada on
    power_average: bool
    edpp_multiplier: bool  # NVML_FI_DEV_EDPP_MULTIPLIER: Hopper and later
    gpm: bool  # GPU performance monitoring (nvmlGpmQueryDeviceSupport): Hopper and later


def nvml_support(architecture: int) -> NvmlSupport:
    """What NVML answers on a board of `architecture` (NVML_DEVICE_ARCH_*; a later number is a
    later architecture). GPM is refused on NVML_DEVICE_ARCH_UNKNOWN, as nvml.h's "Hopper or
    newer" reads; the other queries compare the number alone."""
    ampere, ada, hopper = (architecture >= DEVICE_ARCHS[a] for a in ("AMPERE", "ADA", "HOPPER"))
    return NvmlSupport(
        sram_ecc_status=ampere,
        repair_status=ada,
        unrepairable_memory_flag=hopper,
        power_average=ada,
        edpp_multiplier=hopper,
        gpm=hopper and architecture != DEVICE_ARCHS["UNKNOWN"],
    )
