"""libcuda's attributes that follow from the compute capability: `cuDeviceGetAttribute` through
ctypes, from the driver root of a mounted node of each board, against the values CUDA documents
per compute capability (the table below). Level: shims."""
from __future__ import annotations

import json

import pytest

from helpers import mount_env, run_py

pytestmark = pytest.mark.level("shims")

# CUdevice_attribute (cuda.h) -> its name, for the failure message.
ATTRIBUTES = {
    107: "GENERIC_COMPRESSION_SUPPORTED",
    108: "MAX_PERSISTING_L2_CACHE_SIZE",
    109: "MAX_ACCESS_POLICY_WINDOW_SIZE",
    111: "RESERVED_SHARED_MEMORY_PER_BLOCK",
    117: "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS",
    118: "GPU_DIRECT_RDMA_WRITES_ORDERING",
    120: "CLUSTER_LAUNCH",
    126: "MEM_SYNC_DOMAIN_COUNT",
    127: "TENSOR_MAP_ACCESS_SUPPORTED",
    132: "MULTICAST_SUPPORTED",
}

# What the CUDA driver reports, by the programming guide and the driver API's reference:
# - compute capability 8.0 and later (Ampere): compression, L2 persistence with a set-aside of
#   up to 3/4 of the L2 and a window of 128 MiB less 4 KiB (134213632, as captured on real
#   boards; a Turing T4 answers 0 for both), 1 KiB of shared memory the driver reserves per
#   block, and GPUDirect RDMA writes ordered for the owner (CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER,
#   100);
# - 9.0 and later (Hopper): thread-block clusters, four memory synchronization domains (one
#   before), the Tensor Memory Accelerator's tensor maps, and, on a board in an NVLink fabric,
#   multicast;
# - every board flushes RDMA writes from the host (CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST).
# Per board: (compute capability, L2 bytes, in a fabric) and the values.
EXPECTED = {
    "t4": {107: 0, 108: 0, 109: 0, 111: 0, 117: 1, 118: 0, 120: 0, 126: 1, 127: 0, 132: 0},  # 7.5, 4 MiB
    "a100": {107: 1, 108: 31457280, 109: 134213632, 111: 1024, 117: 1, 118: 100,  # 8.0, 40 MiB
             120: 0, 126: 1, 127: 0, 132: 0},
    "l4": {107: 1, 108: 37748736, 109: 134213632, 111: 1024, 117: 1, 118: 100,  # 8.9, 48 MiB
           120: 0, 126: 1, 127: 0, 132: 0},
    "h100": {107: 1, 108: 39321600, 109: 134213632, 111: 1024, 117: 1, 118: 100,  # 9.0, 50 MiB, fabric
             120: 1, 126: 4, 127: 1, 132: 1},
    "h100-nvl": {107: 1, 108: 47185920, 109: 134213632, 111: 1024, 117: 1, 118: 100,  # 9.0, 60 MiB, PCIe
                 120: 1, 126: 4, 127: 1, 132: 0},
    "b200": {107: 1, 108: 99483648, 109: 134213632, 111: 1024, 117: 1, 118: 100,  # 10.0, 126.5 MiB, fabric
             120: 1, 126: 4, 127: 1, 132: 1},
}

READ = """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
n = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(n))
out = []
for dev in range(n.value):
    row = {}
    for a in %r:
        v = ctypes.c_int(-7)
        r = cu.cuDeviceGetAttribute(ctypes.byref(v), a, dev)
        row[a] = v.value if r == 0 else f"ERR:{r}"
    out.append(row)
print(json.dumps(out))
"""


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_capability_attributes_per_board(node_factory, profile):
    node = node_factory(profile, gpus=2)
    seen = json.loads(run_py(mount_env(node), READ % sorted(ATTRIBUTES)))
    assert len(seen) == 2
    want = {ATTRIBUTES[a]: v for a, v in EXPECTED[profile].items()}
    for dev in seen:
        assert {ATTRIBUTES[int(a)]: v for a, v in dev.items()} == want
