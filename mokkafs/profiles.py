"""GPU profiles (facts a real board reports) and node compositions (how many, where, which driver).

Profiles are data: `profiles/<name>.yaml`, validated by the pydantic models below. Every number
in a profile should be traceable to a real capture (`docs/profiles.md` says which).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PROFILE_DIRS = [
    Path(__file__).resolve().parent.parent / "profiles",  # a source checkout or editable install
    Path(__file__).resolve().parent / "profiles_data",  # a wheel (package-dir mapping)
]

MAX_GPUS = 64


class ProfileError(ValueError):
    """A profile that is missing, unreadable or invalid; the message names the file and key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    total_mib: Annotated[int, Field(gt=0)]
    reserved_mib: Annotated[int, Field(ge=0)]
    bar1_mib: Annotated[int, Field(gt=0)]
    bar1_used_mib: Annotated[int, Field(ge=0)] = 0  # what the idle board's driver maps (bar1_memory_usage/used)
    bus_width_bits: Annotated[int, Field(gt=0)]
    ecc: bool

    @model_validator(mode="after")
    def _reserved_fits(self) -> "Memory":
        if self.reserved_mib >= self.total_mib:
            raise ValueError("reserved_mib must be smaller than total_mib")
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
    links: Annotated[int, Field(ge=0, le=18)]
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

    @field_validator("driver_version")
    @classmethod
    def _driver_version(cls, v: str) -> str:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", v):
            raise ValueError("driver_version must look like 580.105.08")
        return v

    @field_validator("cuda_version")
    @classmethod
    def _cuda_version(cls, v: str) -> str:
        if not re.fullmatch(r"\d+\.\d+", v):
            raise ValueError("cuda_version must look like 13.0")
        return v

    @model_validator(mode="after")
    def _hca_model(self) -> "NodeDefaults":
        if self.hcas and self.hca is None:
            raise ValueError("hcas > 0 needs an hca model")
        return self


MigPlacements = Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(min_length=1)]


def coexisting_placements(placements: tuple[int, ...], size: int) -> int:
    """How many of these placements (first slice, each `size` slices wide) can be used at once:
    the most pairwise-disjoint ones (greedy by first slice; all are the same width)."""
    count, free_from = 0, -1
    for start in sorted(set(placements)):
        if start >= free_from:
            count, free_from = count + 1, start + size
    return count


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
            if any(p + ci.slices > self.slices for p in ci.placements):
                raise ValueError(f"a placement of compute profile {ci.name} runs past the GPU instance's slices")
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
    inforom: InfoRom
    nvlink: NvLink
    mig_capable: bool
    mig: Mig | None = None  # the MIG tables; exactly on MIG-capable boards
    fabric: Fabric | None  # null: no fabric info (N/A), as on PCIe boards and before Hopper
    has_fan: bool
    fan_speed_pct: Annotated[int, Field(ge=0, le=100)] | None = None  # the idle board's fan speed; only with has_fan
    node: NodeDefaults

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

    @property
    def grace(self) -> bool:
        """Grace-hosted trays: of the shipped profiles, exactly those in a multi-node NVLink
        domain (GB200/GB300 NVL), whose host is a 72-core Arm Grace CPU per GPU pair."""
        return self.fabric is not None and self.fabric.multi_node


def profile_dirs() -> list[Path]:
    return [d for d in PROFILE_DIRS if d.is_dir()]


def available_profiles() -> list[str]:
    names: set[str] = set()
    for d in profile_dirs():
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _format_validation_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid profile"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(e["loc"][:-1])
            msg = f"unknown key; allowed keys here: {', '.join(allowed)}"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def _allowed_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] = GpuProfile
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            break
        ann = field.annotation
        for cand in getattr(ann, "__args__", (ann,)):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                model = cand
                break
    return sorted(model.model_fields)


def load_profile_file(path: Path) -> GpuProfile:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: a profile must be a mapping of keys, got {type(raw).__name__}")
    try:
        return GpuProfile.model_validate(raw)
    except ValidationError as e:
        raise ProfileError(_format_validation_error(path, e)) from None


def load_profile(name_or_path: str) -> GpuProfile:
    """A shipped profile by name (`h100`) or a YAML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return load_profile_file(candidate)
    for d in profile_dirs():
        path = d / f"{name_or_path}.yaml"
        if path.is_file():
            return load_profile_file(path)
    raise ProfileError(
        f"unknown profile {name_or_path!r}; shipped profiles: {', '.join(available_profiles())}"
    )
