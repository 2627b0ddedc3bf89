"""The composition of a node: which GPUs it has and where they sit (BDF, NUMA, minor, UUID).

Everything here is a pure, deterministic function of the profile, the counts and the hostname,
so two daemons started with the same arguments describe the same node, byte for byte.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from mokkafs.profiles import MAX_GPUS, GpuProfile, ProfileError, check_driver_drives

# A fixed namespace so UUIDs are stable across runs and machines for the same hostname/index.
_UUID_NAMESPACE = uuid.UUID("6d6f6b6b-6166-7300-8000-000000000001")

# GPUs per PCI domain before the layout spills into the next domain (each GPU takes
# six bus numbers: root port, switch upstream/downstream and the GPU, with room to spare).
_GPUS_PER_DOMAIN = 32
_BUS_BASE = 0x18
_BUS_STEP = 6


@dataclass(frozen=True)
class Bdf:
    domain: int
    bus: int
    device: int = 0
    function: int = 0

    @property
    def sysfs(self) -> str:
        """`0000:53:00.0`, the sysfs and /proc/driver/nvidia/gpus spelling (lowercase)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @property
    def nvml(self) -> str:
        """`00000000:53:00.0`, NVML busId and nvidia-smi (8-digit domain, uppercase)."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.{self.function:X}"

    @property
    def legacy(self) -> str:
        """`0000:53:00.0` uppercase, NVML busIdLegacy and cuDeviceGetPCIBusId."""
        return f"{self.domain:04X}:{self.bus:02X}:{self.device:02X}.{self.function:X}"

    @property
    def xid(self) -> str:
        """`0000:53:00`, as the driver prints it in Xid lines (no function)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}"


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    minor: int
    bdf: Bdf
    numa_node: int
    uuid: str
    serial: str
    module_id: int
    # nvmlDeviceGetPdi's per-GPU identifier (-q "GPU PDI", 64 bits; a real board's is random
    # looking, 0xd52bae2e458244e2 in the 590 capture): bits of the UUID the serial does not use
    pdi: int = 0


@dataclass(frozen=True)
class NodeConfig:
    profile: GpuProfile
    gpus: int
    driver_version: str
    cuda_version: str
    numa_nodes: int
    nvswitches: int
    hcas: int
    hostname: str

    @property
    def key(self) -> dict:
        """What must match for a saved state to belong to this node."""
        return {"profile": self.profile.name, "gpus": self.gpus, "hostname": self.hostname}


def compose(
    profile: GpuProfile,
    *,
    gpus: int | None = None,
    driver_version: str | None = None,
    cuda_version: str | None = None,
    numa_nodes: int | None = None,
    hcas: int | None = None,
    hostname: str = "mokka-node",
) -> NodeConfig:
    """A node of `profile` with the profile's usual composition, each part overridable."""
    d = profile.node
    count = d.gpus if gpus is None else gpus
    if not 1 <= count <= MAX_GPUS:
        raise ProfileError(f"gpus must be between 1 and {MAX_GPUS}, got {count}")
    numa = d.numa_nodes if numa_nodes is None else numa_nodes
    if not 1 <= numa <= 8:
        raise ProfileError(f"numa_nodes must be between 1 and 8, got {numa}")
    hca_count = d.hcas if hcas is None else hcas
    if hca_count and profile.node.hca is None:
        raise ProfileError(f"profile {profile.name} has no HCA model; pass hcas=0")
    driver = driver_version or d.driver_version
    check_driver_drives(profile, driver)
    return NodeConfig(
        profile=profile,
        gpus=count,
        driver_version=driver,
        cuda_version=cuda_version or d.cuda_version,
        numa_nodes=min(numa, count),
        # NVSwitches serve the whole baseboard; a node of fewer GPUs keeps them all.
        nvswitches=d.nvswitches,
        hcas=hca_count,
        hostname=hostname,
    )


def gpu_identities(config: NodeConfig) -> list[GpuIdentity]:
    out = []
    for i in range(config.gpus):
        domain = config.profile.node.pci_domain + i // _GPUS_PER_DOMAIN
        bus = _BUS_BASE + (i % _GPUS_PER_DOMAIN) * _BUS_STEP
        u = uuid.uuid5(_UUID_NAMESPACE, f"{config.hostname}/{config.profile.name}/gpu{i}")
        out.append(
            GpuIdentity(
                index=i,
                # The driver numbers minors in probe (PCI) order, which is also NVML's default
                # index order; they are separate fields because consumers must not conflate them.
                minor=i,
                bdf=Bdf(domain, bus),
                numa_node=i * config.numa_nodes // config.gpus,
                uuid=f"GPU-{u}",
                serial=f"{1650000000000 + (u.int % 10**9) * 100 + i}",
                module_id=i + 1,
                pdi=(u.int >> 64) & 0xFFFF_FFFF_FFFF_FFFF,
            )
        )
    return out
