"""A node: a board (the profile) in a composition, and where each GPU sits (BDF, NUMA, minor, UUID).

Everything here is a pure, deterministic function of the profile, the composition, the counts and
the hostname, so two daemons started with the same arguments describe the same node, byte for byte.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cached_property

from mokkafs.model.schema import (MAX_GPUS, Composition, GpuProfile, GpuSlot, ProfileError, check_driver_drives,
                                  check_fits, control_character_problem, cuda_of_driver, default_slots)
from mokkafs.model.profiles import load_composition

# A fixed namespace so UUIDs are stable across runs and machines for the same hostname/index.
_UUID_NAMESPACE = uuid.UUID("6d6f6b6b-6166-7300-8000-000000000001")


@dataclass(frozen=True)
class Bdf:
    domain: int
    bus: int
    device: int = 0
    function: int = 0

    @cached_property  # immutable; the renderers ask thousands of times per render
    def sysfs(self) -> str:
        """`0000:53:00.0`, the sysfs and /proc/driver/nvidia/gpus spelling (lowercase)."""
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @cached_property  # immutable; the renderers ask thousands of times per render
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

    @property
    def board_id(self) -> int:
        """nvmlDeviceGetBoardId: one number per board, from where it sits (domain and bus)."""
        return (self.domain << 16) | (self.bus << 8)


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
    # The node's composition as resolved: every GPU's slot listed, count and version overrides
    # applied (`compose`).
    composition: Composition
    hostname: str

    @property
    def gpus(self) -> int:
        return self.composition.gpus

    @property
    def driver_version(self) -> str:
        return self.composition.driver_version

    @property
    def cuda_version(self) -> str:
        return self.composition.cuda_version

    @property
    def numa_nodes(self) -> int:
        return self.composition.cpu.numa_nodes

    @property
    def nvswitches(self) -> int:
        return self.composition.nvswitches

    @property
    def hcas(self) -> int:
        return self.composition.hcas

    @property
    def slots(self) -> tuple[GpuSlot, ...]:
        assert self.composition.slots is not None  # compose lists them all
        return self.composition.slots

    @property
    def key(self) -> dict:
        """What must match for a saved state to belong to this node. The composition counts
        only where it is not the profile's own, so that state saved before compositions matches."""
        key = {"profile": self.profile.name, "gpus": self.gpus, "hostname": self.hostname}
        if self.composition.name != self.profile.default_composition().name:
            key["node"] = self.composition.name
        return key


def compose(
    profile: GpuProfile,
    *,
    node: Composition | str | None = None,
    gpus: int | None = None,
    driver_version: str | None = None,
    cuda_version: str | None = None,
    numa_nodes: int | None = None,
    hcas: int | None = None,
    hostname: str = "mokka-node",
) -> NodeConfig:
    """A node of `profile` in composition `node` (a Composition, a shipped name or a file; by
    default the profile's own), each part overridable. A count override (GPUs, NUMA nodes, HCAs)
    lays the GPUs out by the default rule: a composition's slots describe its own counts."""
    problem = control_character_problem(hostname) or (None if 0 < len(hostname) <= 253 else "1 to 253 characters")
    if problem:
        raise ProfileError(f"hostname {hostname[:40]!r}: {problem}")
    base = profile.default_composition() if node is None else node if isinstance(node, Composition) else (
        load_composition(node))
    check_fits(profile, base)
    count = base.gpus if gpus is None else gpus
    if not 1 <= count <= MAX_GPUS:
        raise ProfileError(f"gpus must be between 1 and {MAX_GPUS}, got {count}")
    if gpus is not None and profile.max_gpus_per_node is not None and count > profile.max_gpus_per_node:
        # The same limit check_fits holds a composition to: a form-factor fact of the board.
        raise ProfileError(
            f"--gpus {count}: {profile.name} ({profile.product_name}) boards sit at most "
            f"{profile.max_gpus_per_node} to a node (the profile's max_gpus_per_node)")
    numa = base.cpu.numa_nodes if numa_nodes is None else numa_nodes
    if not 1 <= numa <= 8:
        raise ProfileError(f"numa_nodes must be between 1 and 8, got {numa}")
    hca_count = base.hcas if hcas is None else hcas
    if hca_count and base.hca is None:
        raise ProfileError(f"profile {profile.name} in composition {base.name} has no HCA model; pass hcas=0")
    if base.slots is not None and (count, numa, hca_count) == (base.gpus, base.cpu.numa_nodes, base.hcas):
        slots = base.layout()
    else:
        numa = min(numa, count)
        slots = default_slots(count, numa, hca_count, base.pci_domain)
    driver = driver_version or base.driver_version
    check_driver_drives(profile, driver)
    # A driver given without its CUDA version reports its branch's (the composition's pairs its own)
    cuda = cuda_version or (cuda_of_driver(driver) if driver_version else base.cuda_version)
    # NVSwitches serve the whole baseboard; a node of fewer GPUs keeps them all.
    resolved = base.model_copy(update={
        "gpus": count, "driver_version": driver,
        "cuda_version": cuda, "cpu": base.cpu.model_copy(update={"numa_nodes": numa}),
        "hcas": hca_count, "slots": slots,
    })
    config = NodeConfig(profile=profile, composition=resolved, hostname=hostname)
    from mokkafs.model import ibfabric  # it builds on NodeConfig

    try:
        ibfabric.build(config)
    except ValueError as e:
        raise ProfileError(f"composition {base.name}: {e}") from None
    return config


def gpu_identities(config: NodeConfig) -> list[GpuIdentity]:
    out = []
    for i, slot in enumerate(config.slots):
        u = uuid.uuid5(_UUID_NAMESPACE, f"{config.hostname}/{config.profile.name}/gpu{i}")
        out.append(
            GpuIdentity(
                index=i,
                # The driver numbers minors in probe (PCI) order, which is also NVML's default
                # index order; they are separate fields because consumers must not conflate them.
                minor=i,
                bdf=Bdf(slot.domain, slot.bus),
                numa_node=slot.numa,
                uuid=f"GPU-{u}",
                serial=f"{1650000000000 + (u.int % 10**9) * 100 + i}",
                module_id=i + 1,
                pdi=(u.int >> 64) & 0xFFFF_FFFF_FFFF_FFFF,
            )
        )
    return out
