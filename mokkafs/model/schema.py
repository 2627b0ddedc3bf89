"""The schemas of GPU profiles (facts a real board reports) and node compositions (how boards sit
in a machine: how many, on which buses and NUMA nodes, beside which switches, HCAs and CPUs, which
driver), as pydantic models, with the rules that belong to the data itself (which driver branch
drives a board, where a composition's GPUs sit by default, how MIG placements coexist).

Every number in a profile should be traceable to a real capture, every choice in a composition
to a public description of such a machine (`docs/profiles.md` says which). Loading the YAML
files is `mokkafs.model.profiles`.
"""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mokkafs.model.nvml_consts import ADDRESSING_MODES, BRANDS, DEVICE_ARCHS
from mokkafs.model import state_limits


MAX_GPUS = state_limits.MAX_GPUS  # what the shared state holds
MAX_MEM_CLOCKS, MAX_GRAPHICS_CLOCKS = state_limits.MAX_MEM_CLOCKS, state_limits.MAX_GRAPHICS_CLOCKS


class ProfileError(ValueError):
    """A profile that is missing, unreadable or invalid; the message names the file and key."""


# The first driver branch that drives each architecture's data-center boards, from NVIDIA's
# releases: Turing (T4) R410 (its launch driver, 410.79); Ampere (A100) R450 (the A100 launch
# driver, 450.36.06); Hopper (H100) R520 (NVIDIA AI Enterprise 2.3 added H100 with 520.61.05);
# Ada Lovelace (L40, L40S) R525 (the first data-center branch listing Ada; the 520 GeForce
# release is not a data-center driver); Blackwell (B200, GB200, GB300) R570 (the GPU Operator's
# platform notes: HGX B200 and GB200 NVL from 570.124.06, B200 needing 570.133.20). A node
# whose driver is older is refused: that driver cannot drive the board.
FIRST_BRANCH = {"Turing": 410, "Ampere": 450, "Hopper": 520, "Ada Lovelace": 525, "Blackwell": 570}


def driver_branch(version: str) -> int:
    """The branch of a driver version ("535.261.03" -> 535)."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        raise ProfileError(f"driver version {version!r} does not look like 580.105.08")
    return int(version.split(".", 1)[0])


# The CUDA version each driver branch reports (nvmlSystemGetCudaDriverVersion, cuDriverGetVersion,
# nvidia-smi's "CUDA Version"): the real captures where there is one (535 12.2, 550 12.4, 555
# 12.5, 565 12.7, 570 12.8, 580 13.0, 590 13.1, 595 13.2), else the CUDA toolkit release notes'
# table of the minimum driver of each CUDA release (560 12.6, 575 12.9, ...). A branch between two
# reports what the newest listed one not above it does (docs/profiles.md, "Driver and CUDA").
CUDA_OF_BRANCH = {
    410: "10.0", 418: "10.1", 440: "10.2", 450: "11.0", 455: "11.1", 460: "11.2", 465: "11.3", 470: "11.4",
    495: "11.5", 510: "11.6", 515: "11.7", 520: "11.8", 525: "12.0", 530: "12.1", 535: "12.2", 545: "12.3",
    550: "12.4", 555: "12.5", 560: "12.6", 565: "12.7", 570: "12.8", 575: "12.9", 580: "13.0", 590: "13.1",
    595: "13.2",
}


def cuda_of_driver(driver_version: str) -> str:
    """The CUDA version a driver reports, by its branch (CUDA_OF_BRANCH)."""
    branch = driver_branch(driver_version)
    known = [b for b in CUDA_OF_BRANCH if b <= branch]
    if not known:
        raise ProfileError(f"driver {driver_version}: no CUDA version is known for a branch before "
                           f"R{min(CUDA_OF_BRANCH)}")
    return CUDA_OF_BRANCH[max(known)]


def check_driver_drives(profile: "GpuProfile", driver_version: str) -> None:
    """Refuse a driver branch older than the first that drives the profile's architecture."""
    first = FIRST_BRANCH[profile.architecture]
    if driver_branch(driver_version) < first:
        raise ProfileError(
            f"driver {driver_version} cannot drive {profile.product_name} ({profile.architecture}): "
            f"the first driver branch that can is R{first}; give a --driver-version of branch {first} or later"
        )


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def control_character_problem(text: str) -> str | None:
    """Why `text` may not be printed as it is (a control character, which would end a line of a
    status file, move a terminal's cursor or split a label), or None."""
    m = _CONTROL.search(text)
    return None if m is None else f"control character {m.group()!r} at position {m.start()}; text here is printed as is"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*")
    @classmethod
    def _printable(cls, v):
        """Every text of a profile or composition ends up printed (nvidia-smi, status files,
        /metrics labels, the DMI files): no control characters in any of them."""
        for text in (v if isinstance(v, tuple) else (v,)):
            if isinstance(text, str) and (problem := control_character_problem(text)):
                raise ValueError(problem)
        return v


Hex16 = Annotated[int, Field(ge=0, le=0xFFFF)]


class PciIds(_Strict):
    vendor_id: Hex16 = 0x10DE
    device_id: Hex16
    subsystem_vendor_id: Hex16 = 0x10DE
    subsystem_device_id: Hex16
    class_code: Literal[0x030000, 0x030200]  # display / 3D controller, as the board reports
    revision: Annotated[int, Field(ge=0, le=0xFF)] = 0xA1
    max_link_gen: Annotated[int, Field(ge=1, le=6)]
    max_link_width: Literal[1, 2, 4, 8, 16]


class Memory(_Strict):
    total_mib: Annotated[int, Field(gt=0, le=1 << 24)]  # 16 TiB: past any GPU, within every field that holds it
    reserved_mib: Annotated[int, Field(ge=0)]
    # the share a driver before R510 holds back, which it leaves out of the total it reports
    # (model/dynamics.py, framebuffer); null: not known, reserved_mib stands in for it
    reserved_before_510_mib: Annotated[int, Field(ge=0)] | None = None
    bar1_mib: Annotated[int, Field(gt=0)]
    bar1_used_mib: Annotated[int, Field(ge=0)] = 0  # what the idle board's driver maps (bar1_memory_usage/used)
    bus_width_bits: Annotated[int, Field(gt=0)]
    ecc: bool
    # the DRAM banks the row remapper keeps spare rows in (-q -x row_remapper_histogram_max of
    # the idle board, every bank at full availability); null: no row remapper, or not known
    row_remap_banks: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _reserved_fits(self) -> "Memory":
        if self.reserved_mib >= self.total_mib:
            raise ValueError("reserved_mib must be smaller than total_mib")
        if self.reserved_before_510_mib is not None and self.reserved_before_510_mib >= self.total_mib:
            raise ValueError("reserved_before_510_mib must be smaller than total_mib")
        if self.bar1_used_mib > self.bar1_mib:
            raise ValueError("bar1_used_mib must be at most bar1_mib")
        return self


class Power(_Strict):
    idle_w: Annotated[float, Field(gt=0)]
    default_limit_w: Annotated[float, Field(gt=0)]
    min_limit_w: Annotated[float, Field(gt=0)]
    max_limit_w: Annotated[float, Field(gt=0)]

    @model_validator(mode="after")
    def _ordered(self) -> "Power":
        if not (self.min_limit_w <= self.default_limit_w <= self.max_limit_w):
            raise ValueError("need min_limit_w <= default_limit_w <= max_limit_w")
        if self.idle_w >= self.min_limit_w and self.idle_w >= self.default_limit_w:
            raise ValueError("idle_w must be below default_limit_w")
        return self


class SupportedClock(_Strict):
    """One memory clock the board supports and the graphics clocks it allows with it: every
    `graphics_step_mhz` from `graphics_max_mhz` down to `graphics_min_mhz` (-q -x's
    <supported_mem_clock>)."""

    memory_mhz: Annotated[int, Field(gt=0)]
    graphics_max_mhz: Annotated[float, Field(gt=0)]  # 2062.5 on GB200: the list prints it 2062
    graphics_min_mhz: Annotated[int, Field(gt=0)]

    @model_validator(mode="after")
    def _ordered(self) -> "SupportedClock":
        if self.graphics_min_mhz > self.graphics_max_mhz:
            raise ValueError("graphics_min_mhz must be at most graphics_max_mhz")
        return self


def graphics_clocks(entry: SupportedClock, step_mhz: float) -> list[int]:
    """Every `step_mhz` from `entry`'s top graphics clock down to its lowest, each rounded down
    to a whole MHz (a GB200's 2062.5, 2055, 2047.5 print 2062, 2055, 2047)."""
    top, step, low = round(entry.graphics_max_mhz * 1000), round(step_mhz * 1000), entry.graphics_min_mhz * 1000
    return [(top - k * step) // 1000 for k in range((top - low) // step + 1)]


class Clocks(_Strict):
    """MHz. idle_* are what an idle board reports (P0 at rest); max_* the boost ceilings."""

    idle_graphics: Annotated[int, Field(gt=0)]
    idle_video: Annotated[int, Field(gt=0)]
    max_graphics: Annotated[int, Field(gt=0)]
    max_sm: Annotated[int, Field(gt=0)]
    max_mem: Annotated[int, Field(gt=0)]
    max_video: Annotated[int, Field(gt=0)]
    default_app_graphics: Annotated[int, Field(gt=0)]
    default_app_mem: Annotated[int, Field(gt=0)]
    # The supported clocks (nvmlDeviceGetSupportedMemoryClocks/GraphicsClocks, -q -x's
    # <supported_clocks>), highest memory clock first; empty: the board lists none (N/A). The
    # graphics clocks are every step from the top (15 MHz; 7.5 on Blackwell, printed rounded down).
    supported: tuple[SupportedClock, ...] = ()
    graphics_step_mhz: Literal[15, 7.5] = 15

    def graphics_clocks(self, entry: SupportedClock) -> list[int]:
        """The graphics clocks `entry`'s memory clock allows, highest first, as NVML lists them."""
        return graphics_clocks(entry, self.graphics_step_mhz)

    def listed(self, memory_mhz: int) -> SupportedClock | None:
        """The list's entry for a memory clock, or None when the board lists no such clock."""
        return next((e for e in self.supported if e.memory_mhz == memory_mhz), None)

    def allows(self, memory_mhz: int, graphics_mhz: int) -> bool:
        """Whether the list gives this pair (what nvmlDeviceSetApplicationsClocks takes)."""
        entry = self.listed(memory_mhz)
        return entry is not None and graphics_mhz in self.graphics_clocks(entry)

    @model_validator(mode="after")
    def _supported(self) -> "Clocks":
        mems = [e.memory_mhz for e in self.supported]
        if mems != sorted(set(mems), reverse=True):
            raise ValueError("clocks.supported: memory clocks are listed once each, highest first")
        if len(mems) > MAX_MEM_CLOCKS:
            raise ValueError(f"clocks.supported: at most {MAX_MEM_CLOCKS} memory clocks")
        if self.supported and mems[0] != self.max_mem:
            raise ValueError(f"clocks.supported: the first memory clock must be max_mem ({self.max_mem} MHz)")
        for e in self.supported:
            if len(self.graphics_clocks(e)) > MAX_GRAPHICS_CLOCKS:
                raise ValueError(f"clocks.supported: {e.memory_mhz} MHz allows more than {MAX_GRAPHICS_CLOCKS} "
                                 "graphics clocks")
            if self.graphics_clocks(e)[0] > self.max_graphics:
                raise ValueError(f"clocks.supported: {e.memory_mhz} MHz allows a graphics clock above max_graphics")
        return self

    @model_validator(mode="after")
    def _below_the_ceilings(self) -> "Clocks":
        """An idle or default clock above its board's maximum is no board's: NVML's
        ranges (locked clocks, applications clocks) run from the one to the other."""
        for low, high in (("idle_graphics", "max_graphics"), ("idle_video", "max_video"),
                          ("default_app_graphics", "max_graphics"), ("default_app_mem", "max_mem")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} {getattr(self, low)} MHz is above {high} {getattr(self, high)} MHz")
        return self

    @model_validator(mode="after")
    def _default_pair_listed(self) -> "Clocks":
        """The driver's default applications clocks are a pair its nvmlDeviceSetApplicationsClocks
        would take. After the ceilings: a default above its maximum is said as that."""
        if self.supported and not self.allows(self.default_app_mem, self.default_app_graphics):
            raise ValueError(f"clocks.supported: the default applications clocks ({self.default_app_mem} "
                             f"{self.default_app_graphics} MHz) are not a pair the list allows")
        return self


class Thermal(_Strict):
    """Degrees C. slowdown/shutdown are absolute; tlimit_c is the T.Limit reference where the
    architecture reports temperatures relative to it (Hopper and later), else null."""

    idle_c: int
    memory_idle_c: int | None
    max_load_c: int  # steady temperature at the power limit, used by the simulated curve
    slowdown_c: int
    shutdown_c: int
    max_operating_c: int
    tlimit_c: int | None = None
    memory_max_operating_c: int | None = None  # HBM/GDDR max operating temperature; null: not reported

    @model_validator(mode="after")
    def _memory_sensor(self) -> "Thermal":
        if self.memory_max_operating_c is not None and self.memory_idle_c is None:
            raise ValueError("memory_max_operating_c needs memory_idle_c (a board without a memory sensor has none)")
        return self

    @model_validator(mode="after")
    def _ordered(self) -> "Thermal":
        if not (self.idle_c < self.max_load_c <= self.shutdown_c and self.slowdown_c <= self.shutdown_c):
            raise ValueError("need idle_c < max_load_c <= shutdown_c and slowdown_c <= shutdown_c")
        return self


class InfoRom(_Strict):
    image: str
    oem: str
    ecc: str
    power: str = "N/A"


class NvLink(_Strict):
    links: Annotated[int, Field(ge=0, le=state_limits.MAX_NVLINKS)]
    version: Annotated[int, Field(ge=0, le=5)]
    link_speed_gbps: Annotated[float, Field(ge=0)]  # per-link, per direction


ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class FabricHealth(_Strict):
    """nvmlGpuFabricInfo_v3's health as nvidia-smi prints it; null where the board reports N/A."""

    summary: Literal["Healthy", "Unhealthy", "Limited Capacity"] | None = None
    bandwidth: Literal["Full", "Degraded"] | None = None
    route_recovery_in_progress: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    incorrect_configuration: Literal["None"] | None = None  # "None": the configuration is correct

    @property
    def summary_code(self) -> int:
        """NVML_GPU_FABRIC_HEALTH_SUMMARY_*."""
        return {None: 0, "Healthy": 1, "Unhealthy": 2, "Limited Capacity": 3}[self.summary]

    @property
    def mask(self) -> int:
        """NVML_GPU_FABRIC_HEALTH_MASK_*: per item 0 not supported, 1 true, 2 false, at its shift."""
        def flag(v: bool | None) -> int:
            return 0 if v is None else 1 if v else 2

        return (
            flag(None if self.bandwidth is None else self.bandwidth == "Degraded")
            | flag(self.route_recovery_in_progress) << 2
            | flag(self.route_unhealthy) << 4
            | flag(self.access_timeout_recovery) << 6
            | (0 if self.incorrect_configuration is None else 1) << 8  # 1: ..._INCORRECT_CONFIGURATION_NONE
        )


FABRIC_STATES = {"Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}  # nvmlGpuFabricState_t


class Fabric(_Strict):
    """The NVLink fabric as nvmlDeviceGetGpuFabricInfo reports it; every captured board shows
    the state after the fabric manager has run (Completed, status Success). A single-node
    NVSwitch baseboard (HGX) reports clique 0 and an all-zero cluster UUID; a multi-node NVLink
    domain (GB200/GB300 NVL) its own."""

    state: Literal["Not Supported", "Not Started", "In Progress", "Completed"] = "Completed"
    clique_id: Annotated[int, Field(ge=0, le=0xFFFFFFFF)]
    cluster_uuid: Annotated[str, Field(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    health: FabricHealth = FabricHealth()

    @property
    def state_code(self) -> int:
        """nvmlGpuFabricState_t."""
        return FABRIC_STATES[self.state]

    @property
    def multi_node(self) -> bool:
        return self.cluster_uuid != ZERO_UUID


class Hca(_Strict):
    """An InfiniBand / RoCE adapter model carried by nodes of this profile."""

    model: str  # e.g. "ConnectX-7"
    hca_type: str  # sysfs hca_type, e.g. "MT4129"
    pci_device_id: Hex16  # Mellanox 0x15b3 device id
    board_id: str  # e.g. "MT_0000000838"
    fw_ver: str
    rate_gbps: Literal[100, 200, 400, 800]


def _version(v: str | None, info) -> str | None:
    """A driver version (580.105.08) or a CUDA version (13.0), as the driver reports them."""
    pattern, example = {"driver_version": (r"\d+\.\d+(\.\d+)?", "580.105.08"),
                        "cuda_version": (r"\d+\.\d+", "13.0")}[info.field_name]
    if v is not None and not re.fullmatch(pattern, v):
        raise ValueError(f"{info.field_name} must look like {example}")
    return v


class NodeDefaults(_Strict):
    """The composition a real node with this board usually has; every field is overridable."""

    gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    driver_version: str
    cuda_version: str
    numa_nodes: Annotated[int, Field(ge=1, le=8)]
    nvswitches: Annotated[int, Field(ge=0, le=18)]
    nvswitch_device_id: Hex16 | None = None
    hcas: Annotated[int, Field(ge=0, le=MAX_GPUS)]
    hca: Hca | None = None
    pci_domain: Annotated[int, Field(ge=0, le=0xFFFF)] = 0

    @field_validator("driver_version", "cuda_version")
    @classmethod
    def _versions(cls, v: str | None, info) -> str | None:
        return _version(v, info)

    @model_validator(mode="after")
    def _hca_model(self) -> "NodeDefaults":
        if self.hcas and self.hca is None:
            raise ValueError("hcas > 0 needs an hca model")
        return self


MAX_CPUS = state_limits.CPU_WORDS * 64  # what NVML's CPU masks carry ("currently supports up to 1024 processors")
PLATFORM_ROOT_BUS = 0xD8  # the platform complex (NVSwitches, HCAs beside no GPU) takes buses from here


class SystemSpec(_Strict):
    """The machine as its firmware names it (SMBIOS, /sys/class/dmi/id): what GPU feature
    discovery labels nvidia.com/gpu.machine with (product_name)."""

    vendor: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[ -~]+$")]
    product: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[ -~]+$")]
    board: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[ -~]+$")] | None = None  # null: product


class CpuSpec(_Strict):
    """The host's CPUs as Linux numbers them: one NUMA node per socket (or per Grace CPU)."""

    arch: Literal["x86_64", "aarch64"]  # aarch64: Grace (the GPUs reach it over NVLink-C2C)
    model: str = ""  # what the machine carries, for the reader ("2 x Intel Xeon Platinum 8480+")
    numa_nodes: Annotated[int, Field(ge=1, le=8)]
    cores_per_numa_node: Annotated[int, Field(ge=1, le=256)]
    threads_per_core: Literal[1, 2, 4]

    @model_validator(mode="after")
    def _masks(self) -> "CpuSpec":
        total = self.numa_nodes * self.cores_per_numa_node * self.threads_per_core
        if total > MAX_CPUS:
            raise ValueError(f"{total} CPUs: NVML's CPU masks carry at most {MAX_CPUS}")
        return self


class GpuSlot(_Strict):
    """Where one GPU sits: its bus (device 00.0) behind its own root port and PCIe switch, the
    NUMA node of that root complex, and the HCA (index) that shares the switch, if any."""

    bus: Annotated[int, Field(ge=3, lt=PLATFORM_ROOT_BUS - 1)]  # the root bus is bus - 3
    domain: Annotated[int, Field(ge=0, le=0xFFFF)] | None = None  # null: the composition's pci_domain
    numa: Annotated[int, Field(ge=0, le=7)]
    hca: Annotated[int, Field(ge=0, lt=MAX_GPUS)] | None = None


FABRIC_MAX_NODES = 16
FABRIC_MAX_SPINES = 16


class IbFabric(_Strict):
    """The InfiniBand fabric the node's HCAs are cabled into (docs/infiniband.md): one leaf
    switch per rail (HCA index), every leaf cabled once to every spine, the subnet manager on
    one switch. Nodes that declare the same fabric (the same section, `nodes` listing all of
    them) compute the same switches, GUIDs and LIDs, each answering for its own HCAs."""

    name: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] = "fabric"
    # The hostnames of the rail group, in LID order; null: this node alone.
    nodes: Annotated[tuple[Annotated[str, Field(min_length=1, max_length=63)], ...],
                     Field(min_length=1, max_length=FABRIC_MAX_NODES)] | None = None
    spines: Annotated[int, Field(ge=0, le=FABRIC_MAX_SPINES)] = 2
    # The switch that runs the subnet manager: spine-N or leaf-N (1-based); null: spine-1
    # (leaf-1 without spines).
    sm: Annotated[str, Field(pattern=r"^(spine|leaf)-[1-9][0-9]*$")] | None = None
    sm_priority: Annotated[int, Field(ge=0, le=15)] = 14

    @model_validator(mode="after")
    def _unique(self) -> "IbFabric":
        if self.nodes is not None and len(set(self.nodes)) != len(self.nodes):
            raise ValueError("fabric.nodes lists a hostname twice")
        if self.sm is not None:
            kind, n = self.sm.split("-")
            if kind == "spine" and int(n) > self.spines:
                raise ValueError(f"fabric.sm: {self.sm}, but the fabric has {self.spines} spines")
        return self


class Composition(_Strict):
    """A node composition: how boards of some profile sit in one machine (docs/profiles.md,
    "Node compositions"). Which board is the profile's business; a composition names none."""

    name: str
    description: str = ""
    gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    driver_version: str
    cuda_version: str
    cpu: CpuSpec
    pci_domain: Annotated[int, Field(ge=0, le=0xFFFF)] = 0
    # One per GPU, in index order; null: the default layout (`default_slots`).
    slots: tuple[GpuSlot, ...] | None = None
    nvswitches: Annotated[int, Field(ge=0, le=18)] = 0
    nvswitch_device_id: Hex16 | None = None  # null: the host enumerates no NVSwitch PCI function
    hcas: Annotated[int, Field(ge=0, le=MAX_GPUS)] = 0
    hca: Hca | None = None
    fabric: IbFabric | None = None  # null: the default InfiniBand fabric (IbFabric()) where the node has HCAs
    # null: vendor "mokkafs", product the composition's name (a composition of the user's own)
    system: SystemSpec | None = None

    @property
    def dmi(self) -> SystemSpec:
        s = self.system or SystemSpec(vendor="mokkafs", product=self.name)
        return s if s.board else s.model_copy(update={"board": s.product})

    @field_validator("driver_version", "cuda_version")
    @classmethod
    def _versions(cls, v: str | None, info) -> str | None:
        return _version(v, info)

    @model_validator(mode="after")
    def _consistent(self) -> "Composition":
        if self.hcas and self.hca is None:
            raise ValueError("hcas > 0 needs an hca model")
        if self.slots is None:
            return self
        if len(self.slots) != self.gpus:
            raise ValueError(f"slots lists {len(self.slots)} GPUs, gpus is {self.gpus}")
        taken: dict[tuple[int, int], int] = {}
        hcas: set[int] = set()
        for i, s in enumerate(self.slots):
            if s.numa >= self.cpu.numa_nodes:
                raise ValueError(f"slots.{i}.numa: {s.numa}, but cpu.numa_nodes is {self.cpu.numa_nodes}")
            if s.hca is not None:
                if s.hca >= self.hcas:
                    raise ValueError(f"slots.{i}.hca: HCA {s.hca}, but hcas is {self.hcas}")
                if s.hca in hcas:
                    raise ValueError(f"slots.{i}.hca: HCA {s.hca} already sits beside another GPU")
                hcas.add(s.hca)
            domain = self.pci_domain if s.domain is None else s.domain
            # The GPU's root complex takes bus-3 .. bus (bus+1 with an HCA beside it).
            for bus in range(s.bus - 3, s.bus + (2 if s.hca is not None else 1)):
                if (domain, bus) in taken:
                    raise ValueError(
                        f"slots.{i}.bus: 0x{s.bus:02x} needs buses 0x{s.bus - 3:02x}-0x{s.bus:02x} (and the next "
                        f"for an HCA); bus 0x{bus:02x} is GPU {taken[(domain, bus)]}'s")
                taken[(domain, bus)] = i
        return self

    def layout(self) -> tuple[GpuSlot, ...]:
        """Every GPU's slot: the listed ones, or the default layout."""
        if self.slots is not None:
            return tuple(s if s.domain is not None else s.model_copy(update={"domain": self.pci_domain})
                         for s in self.slots)
        return default_slots(self.gpus, self.cpu.numa_nodes, self.hcas, self.pci_domain)

    @property
    def grace(self) -> bool:
        return self.cpu.arch == "aarch64"


# The default layout: GPU i on bus 0x18 + 6 i (each root complex takes six bus numbers: root
# port, switch upstream and downstream, the GPU, the HCA beside it and one spare), 32 to a PCI
# domain before the next domain; spread evenly over the NUMA nodes; HCA i beside GPU i.
_GPUS_PER_DOMAIN = 32
_BUS_BASE = 0x18
_BUS_STEP = 6


def default_slots(gpus: int, numa_nodes: int, hcas: int, pci_domain: int) -> tuple[GpuSlot, ...]:
    numa = min(numa_nodes, gpus)
    return tuple(
        GpuSlot(bus=_BUS_BASE + (i % _GPUS_PER_DOMAIN) * _BUS_STEP, domain=pci_domain + i // _GPUS_PER_DOMAIN,
                numa=i * numa // gpus, hca=i if i < hcas else None)
        for i in range(gpus)
    )


class CompositionRef(_Strict):
    """A profile's default composition: a shipped one by name, with the driver of the board's
    capture where it differs from the composition's."""

    name: str
    driver_version: str | None = None
    cuda_version: str | None = None

    def resolve(self) -> Composition:
        from mokkafs.model.profiles import load_composition

        c = load_composition(self.name, shipped_only=True)
        pins = {k: v for k, v in (("driver_version", self.driver_version), ("cuda_version", self.cuda_version)) if v}
        return c.model_copy(update=pins) if pins else c

    @field_validator("driver_version", "cuda_version")
    @classmethod
    def _versions(cls, v: str | None, info) -> str | None:
        return _version(v, info)


MigPlacements = Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(min_length=1)]


def coexisting_placements(placements: tuple[int, ...], size: int) -> int:
    """How many of these placements (first slice, each `size` slices wide) can be used at once:
    the most pairwise-disjoint ones (greedy by first slice; all are the same width)."""
    count, free_from = 0, -1
    for start in sorted(set(placements)):
        if start >= free_from:
            count, free_from = count + 1, start + size
    return count


def compute_span(slices: int) -> int:
    """The placement units a compute instance of `slices` compute slices spans inside its GPU
    instance (and a GPU instance's compute slices span in all): the size rounded up to a power
    of two, 1, 2, 4, 4, 8 for 1, 2, 3, 4, 7 (`nvidia-smi mig -lci`: a 3g instance's full-size
    compute instance at 0:4; docs/mig.md)."""
    return 1 << (slices - 1).bit_length()


class MigComputeProfile(_Strict):
    """A compute-instance profile inside one GPU-instance profile (nvmlComputeInstanceProfileInfo_v3,
    `nvidia-smi mig -lcip`). Its `profile` (NVML_COMPUTE_INSTANCE_PROFILE_*) is also the id the
    driver reports."""
    profile: Annotated[int, Field(ge=0, le=8)]
    name: str  # "1c.3g.40gb"; the full-size one carries the GPU instance's own name ("3g.40gb")
    slices: Annotated[int, Field(gt=0)]  # compute slices of the GPU instance it takes
    instances: Annotated[int, Field(gt=0)]
    sm: Annotated[int, Field(gt=0)]
    placements: MigPlacements  # valid first compute slices inside the GPU instance; each takes `slices`

    @model_validator(mode="after")
    def _fits(self) -> "MigComputeProfile":
        if self.instances > coexisting_placements(self.placements, self.slices):
            raise ValueError("instances is more than there are placements that can be used at once")
        return self


class MigGpuProfile(_Strict):
    """A GPU-instance profile (nvmlGpuInstanceProfileInfo_v3, `nvidia-smi mig -lgip/-lgipp`)."""
    profile: Annotated[int, Field(ge=0, le=0x11)]  # NVML_GPU_INSTANCE_PROFILE_* (the index NVML is asked with)
    id: Annotated[int, Field(ge=0)]  # the id the driver reports (info.id; the ID column of -lgip)
    name: str  # "1g.10gb", "1g.10gb+me": without the "MIG " nvidia-smi prints before it
    slices: Annotated[int, Field(gt=0)]  # compute slices (sliceCount)
    instances: Annotated[int, Field(gt=0)]  # instanceCount on an empty GPU
    memory_mib: Annotated[int, Field(gt=0)]  # memorySizeMB
    sm: Annotated[int, Field(gt=0)]  # multiprocessorCount
    copy_engines: Annotated[int, Field(ge=0)]
    decoders: Annotated[int, Field(ge=0)]
    encoders: Annotated[int, Field(ge=0)]
    jpegs: Annotated[int, Field(ge=0)]
    ofas: Annotated[int, Field(ge=0)]
    p2p: bool = False
    placement_size: Annotated[int, Field(gt=0)]  # memory slices one instance occupies
    placements: MigPlacements  # valid first memory slices
    compute_profiles: Annotated[tuple[MigComputeProfile, ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _fits(self) -> "MigGpuProfile":
        if self.instances > coexisting_placements(self.placements, self.placement_size):
            raise ValueError("instances is more than there are placements that can be used at once")
        full = [ci for ci in self.compute_profiles if ci.slices == self.slices]
        if len(full) != 1:
            raise ValueError(f"{self.name} needs exactly one full-size compute profile ({self.slices} slices)")
        if (full[0].name, full[0].sm, full[0].instances) != (self.name, self.sm, 1):
            raise ValueError(
                f"the full-size compute profile of {self.name} carries its name and SMs, once "
                f"(got {full[0].name}, {full[0].sm} SMs, {full[0].instances} instances)"
            )
        seen: set[int] = set()
        for ci in self.compute_profiles:
            if ci.profile in seen:
                raise ValueError(f"compute profile {ci.profile} is listed twice")
            seen.add(ci.profile)
            if ci.slices > self.slices:
                raise ValueError(f"compute profile {ci.name} has more slices than the GPU instance")
            if any(p + compute_span(ci.slices) > compute_span(self.slices) for p in ci.placements):
                raise ValueError(f"a placement of compute profile {ci.name} runs past the GPU instance's span")
            if ci.sm > self.sm:
                raise ValueError(f"compute profile {ci.name} has more SMs than the GPU instance")
        return self


class Mig(_Strict):
    """The board's MIG tables: what `nvidia-smi mig -lgip/-lgipp/-lcip` lists on an empty GPU."""
    memory_slices: Annotated[int, Field(gt=0, le=8)]  # placement units (8 on A100/H100)
    compute_slices: Annotated[int, Field(gt=0, le=8)]  # 7 on A100/H100
    gpu_instance_profiles: Annotated[tuple[MigGpuProfile, ...], Field(min_length=1)]
    # GPUs (by index in the node) whose GPU-instance ids count the memory halves the other way
    # round: the same placement has id 1 there where it has id 2 elsewhere (docs/mig.md). Which
    # GPCs a die has fused off decides it on real boards; nodes show both kinds.
    swapped_halves: tuple[Annotated[int, Field(ge=0, lt=64)], ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> "Mig":
        for key in ("profile", "id", "name"):
            values = [getattr(g, key) for g in self.gpu_instance_profiles]
            dup = {v for v in values if values.count(v) > 1}
            if dup:
                raise ValueError(f"GPU instance profile {key} {sorted(dup)[0]} is listed twice")
        for g in self.gpu_instance_profiles:
            if g.slices > self.compute_slices:
                raise ValueError(f"{g.name} has more slices than the GPU has compute slices")
            if any(p + g.placement_size > self.memory_slices for p in g.placements):
                raise ValueError(f"a placement of {g.name} runs past the GPU's memory slices")
        if not any(
            g.slices == self.compute_slices and g.placement_size == self.memory_slices
            for g in self.gpu_instance_profiles
        ):
            raise ValueError("no GPU instance profile takes the whole GPU (every compute and memory slice)")
        return self


class GpuProfile(_Strict):
    name: str
    product_name: str
    product_brand: str
    architecture: Literal["Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell"]
    compute_capability: str
    sm_count: Annotated[int, Field(gt=0)]
    l2_cache_bytes: Annotated[int, Field(gt=0)]
    pci: PciIds
    memory: Memory
    power: Power
    clocks: Clocks
    thermal: Thermal
    vbios_version: str
    board_part_number: str
    gpu_part_number: str
    # nvmlDeviceGetAddressingMode: how the GPU reaches system-allocated memory (the capture's
    # addressing_mode): HMM on x86 hosts with HMM, ATS on Grace (C2C), None where neither is on
    addressing_mode: Literal["None", "HMM", "ATS"]
    # What -q prints that NVML has no getter for (the real tool asks the driver's private table):
    # the idle board's graphics voltage (-q's Voltage/Graphics, millivolts; null: no capture
    # of the board prints one, N/A) and its sparse operation mode (`Disabled` on every Hopper
    # capture; null: N/A, as every other board prints it). docs/nvidia-smi.md, "Gaps".
    voltage_mv: Annotated[float, Field(gt=0, lt=2000)] | None = None
    sparse_operation_mode: Literal["Disabled", "Enabled"] | None = None
    inforom: InfoRom
    nvlink: NvLink
    mig_capable: bool
    mig: Mig | None = None  # the MIG tables; exactly on MIG-capable boards
    fabric: Fabric | None  # null: no fabric info (N/A), as on PCIe boards and before Hopper
    has_fan: bool
    fan_speed_pct: Annotated[int, Field(ge=0, le=100)] | None = None  # the idle board's fan speed; only with has_fan
    # At most this many boards in one node, where the form factor makes it a fact (an HGX
    # baseboard carries 8 SXM modules, a GB200 compute tray 4 GPUs); null: no such limit.
    max_gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS)] | None = None
    # The node a board of this profile sits in by default: a shipped composition (by name, with
    # the capture's driver where it differs), or, in profiles written before compositions, the
    # `node:` section the composition is derived from. Loaded, `node` is always there: with a
    # `composition`, it is that composition's view in the `node:` keys (for older callers).
    composition: CompositionRef | None = None
    node: NodeDefaults

    @model_validator(mode="before")
    @classmethod
    def _node_of_composition(cls, data):
        """Fill `node` from `composition`. Given both (a dumped profile whose `node` was then
        edited), an edited `node` wins: the profile is then one without a composition."""
        if not isinstance(data, dict) or data.get("composition") is None:
            return data
        try:
            view = legacy_node(CompositionRef.model_validate(_ref_mapping(data["composition"])).resolve())
        except (ValidationError, ProfileError):
            return data  # the composition field's own validation says what is wrong
        if data.get("node") is None:
            return {**data, "node": view}
        try:
            given = NodeDefaults.model_validate(data["node"]).model_dump()
        except ValidationError:
            return data  # the node field's own validation says what is wrong
        return data if given == view else {**data, "composition": None}

    @field_validator("composition", mode="before")
    @classmethod
    def _composition_name(cls, v):
        return _ref_mapping(v)

    @field_validator("composition")
    @classmethod
    def _composition_exists(cls, v: CompositionRef | None) -> CompositionRef | None:
        if v is not None:
            try:
                v.resolve()
            except ProfileError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("compute_capability")
    @classmethod
    def _cc(cls, v: str) -> str:
        if not re.fullmatch(r"\d+\.\d+", v):
            raise ValueError("compute_capability must look like 9.0")
        return v

    @model_validator(mode="after")
    def _fan(self) -> "GpuProfile":
        if self.has_fan != (self.fan_speed_pct is not None):
            raise ValueError("fan_speed_pct is given exactly when has_fan is true (the speed the board reports)")
        return self

    @model_validator(mode="after")
    def _driver_drives_board(self) -> "GpuProfile":
        first = FIRST_BRANCH[self.architecture]
        if driver_branch(self.node.driver_version) < first:
            raise ValueError(f"node.driver_version {self.node.driver_version} cannot drive a {self.architecture} "
                             f"board: the first driver branch that can is R{first}")
        return self

    @model_validator(mode="after")
    def _mig(self) -> "GpuProfile":
        if self.mig is None:
            return self
        if not self.mig_capable:
            raise ValueError("mig tables are given only when mig_capable is true")
        for g in self.mig.gpu_instance_profiles:
            if g.sm > self.sm_count:
                raise ValueError(f"mig profile {g.name} has more SMs than the board")
            if g.memory_mib > self.memory.total_mib:
                raise ValueError(f"mig profile {g.name} has more memory than the board")
        return self

    @model_validator(mode="after")
    def _fits_its_composition(self) -> "GpuProfile":
        try:
            check_fits(self, self.default_composition())
        except ProfileError as e:
            raise ValueError(str(e)) from None
        return self

    @property
    def grace(self) -> bool:
        """A Grace superchip's GPU: it reaches system memory through ATS over NVLink-C2C, or it
        sits in a multi-node NVLink domain (GB200/GB300 NVL); its host is a 72-core Arm Grace
        CPU, never an x86 server."""
        return self.addressing_mode == "ATS" or (self.fabric is not None and self.fabric.multi_node)

    # What NVML reports of these facts, as nvml.h numbers them (the publisher copies them).
    @property
    def nvml_brand(self) -> int:
        """nvmlBrandType_t of `product_brand` ("NVIDIA RTX" is NVML_BRAND_NVIDIA_RTX)."""
        return BRANDS.get(self.product_brand.upper().replace(" ", "_"), BRANDS["UNKNOWN"])

    @property
    def nvml_architecture(self) -> int:
        """NVML_DEVICE_ARCH_* of `architecture` ("Ada Lovelace" is NVML_DEVICE_ARCH_ADA)."""
        return DEVICE_ARCHS[self.architecture.split()[0].upper()]

    @property
    def nvml_addressing_mode(self) -> int:
        """nvmlDeviceAddressingModeType_t of `addressing_mode`."""
        return ADDRESSING_MODES[self.addressing_mode.upper()]

    @property
    def c2c_mode(self) -> int:
        """The NVLink-C2C interface (mokka_state.h's c2c_mode): 0 none (before Hopper), 1 present
        but disabled, 2 enabled, where a Grace CPU hosts the GPU."""
        if self.architecture not in ("Hopper", "Blackwell"):
            return 0
        return 2 if self.grace else 1

    def default_composition(self) -> Composition:
        """The node this board sits in unless told otherwise."""
        if self.composition is not None:
            return self.composition.resolve()
        return derived_composition(self)


# --- rules over the schemas (pure: no files) ---------------------------------------------------


def _ref_mapping(v):
    """`composition: hgx-8` is short for `composition: {name: hgx-8}`."""
    return {"name": v} if isinstance(v, str) else v


def legacy_node(c: Composition) -> dict:
    """A composition in the `node:` keys of profiles written before compositions."""
    return NodeDefaults(
        gpus=c.gpus, driver_version=c.driver_version, cuda_version=c.cuda_version, numa_nodes=c.cpu.numa_nodes,
        nvswitches=c.nvswitches, nvswitch_device_id=c.nvswitch_device_id, hcas=c.hcas, hca=c.hca,
        pci_domain=c.pci_domain,
    ).model_dump()


# What the derived composition of a profile without one assumes of its host: Grace trays have
# 72 Arm cores per CPU and no SMT; x86 hosts two 56-core Xeons with hyper-threading.
_GRACE_CPU = {"arch": "aarch64", "model": "NVIDIA Grace", "cores_per_numa_node": 72, "threads_per_core": 1}
_X86_CPU = {"arch": "x86_64", "model": "Intel Xeon Platinum 8480+", "cores_per_numa_node": 56, "threads_per_core": 2}


def derived_composition(profile: GpuProfile) -> Composition:
    """The composition a profile's `node:` section describes, laid out by the default rule."""
    d = profile.node
    return Composition(
        name=f"{profile.name}-node", description=f"the node: section of profile {profile.name}",
        gpus=d.gpus, driver_version=d.driver_version, cuda_version=d.cuda_version,
        cpu=CpuSpec(numa_nodes=d.numa_nodes, **(_GRACE_CPU if profile.grace else _X86_CPU)),
        pci_domain=d.pci_domain, nvswitches=d.nvswitches, nvswitch_device_id=d.nvswitch_device_id,
        hcas=d.hcas, hca=d.hca,
    )


def check_fits(profile: GpuProfile, c: Composition) -> None:
    """Refuse a board in a node it cannot sit in, saying why."""
    if profile.grace and not c.grace:
        raise ProfileError(
            f"{profile.name} ({profile.product_name}) is a Grace superchip's GPU; composition {c.name} has "
            f"{c.cpu.arch} CPUs (use a Grace composition such as gb200-nvl4)")
    if c.grace and not profile.grace:
        raise ProfileError(
            f"composition {c.name} is a Grace (aarch64) tray; {profile.name} ({profile.product_name}) "
            f"is a board for x86 hosts")
    if c.nvswitches and not profile.nvlink.links:
        raise ProfileError(
            f"composition {c.name} has {c.nvswitches} NVSwitches, but {profile.name} ({profile.product_name}) "
            f"has no NVLink: a PCIe-only board sits in a node without NVSwitches (pcie-4, pcie-8, workstation-1)")
    if profile.max_gpus_per_node is not None and c.gpus > profile.max_gpus_per_node:
        raise ProfileError(
            f"composition {c.name} has {c.gpus} GPUs, but {profile.name} boards sit at most "
            f"{profile.max_gpus_per_node} to a node")
