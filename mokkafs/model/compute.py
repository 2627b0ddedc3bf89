"""Per-compute-capability limits of the SM, as the CUDA driver reports them through
cuDeviceGetAttribute: data, read by the model and published for libcuda.so.1.

Source: the CUDA C++ Programming Guide, "Compute Capabilities": the table "Technical
Specifications per Compute Capability" (maximum resident threads and blocks per SM, shared
memory per SM, shared memory per block with opt-in) and the arithmetic-throughput table (FP32
to FP64 ratio). A capability the table does not list takes the row of the nearest one below
it (the lowest row for anything older).
"""
from __future__ import annotations

from dataclasses import dataclass

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


def compute_limits(capability: str) -> ComputeLimits:
    """The limits of compute capability `capability` ("9.0")."""
    major, minor = (int(x) for x in capability.split("."))
    known = sorted(LIMITS)
    below = [cc for cc in known if cc <= (major, minor)]
    return LIMITS[below[-1] if below else known[0]]
