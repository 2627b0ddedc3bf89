"""`mokka profile record`: a profile of the node this runs on, read live, every value traced.

Reads, never writes: NVML (pynvml against the driver's libnvidia-ml: getters only), the driver's
`nvidia-smi` (`-q -x`, `topo -m`, `nvlink -s`: read-only modes), CUDA's device attributes
(cuInit and cuDeviceGetAttribute: no context is created), and sysfs/procfs. The `-q -x` capture
goes through profile_import's parser and builder, so a recording and an import agree on every
key both read; NVML then answers each key it has, and a disagreement is noted. The node's
composition (GPUs, bus ids, NUMA, NVLink and NVSwitch layout, HCAs, CPUs) is read by one
function, `read_node`. docs/profiles.md ("Recording a node") lists what comes from where.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mokkafs import profile_import as imp
from mokkafs.profiles import ZERO_UUID, GpuProfile

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 60
MIB = 1 << 20
NVIDIA = 0x10DE
MELLANOX = 0x15B3
GPU_CLASSES = (0x0300, 0x0302)  # VGA-compatible and 3D controllers (class >> 8)
NVSWITCH_CLASS = 0x0680  # NVIDIA's bridges of class "other": the NVSwitches
PCI_IDS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")
# nvmlNvlinkVersion_t (nvml.h): what nvmlDeviceGetNvLinkVersion returns -> the NVLink generation.
NVLINK_VERSIONS = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
# CUdevice_attribute
CU_MULTIPROCESSOR_COUNT, CU_GLOBAL_MEMORY_BUS_WIDTH, CU_L2_CACHE_SIZE = 16, 37, 38


class RecordRefused(Exception):
    """The node cannot be recorded (no NVML, no GPU, no nvidia-smi...); the message says why."""


# --- the node's composition: one function, sysfs and procfs -------------------------------------


@dataclass
class Gpu:
    bus_id: str  # sysfs name, "0000:18:00.0"
    device_id: int
    numa_node: int  # -1: the platform reports none
    cpulist: str  # local_cpulist


@dataclass
class Hca:
    name: str  # mlx5_0
    bus_id: str
    pci_device_id: int | None
    numa_node: int
    hca_type: str | None
    board_id: str | None
    fw_ver: str | None
    rate_gbps: int | None
    model: str | None  # from pci.ids


@dataclass
class NodeFacts:
    """What sysfs and procfs say about how the boards sit in this machine."""

    gpus: list[Gpu] = field(default_factory=list)
    nvswitches: list[tuple[str, int]] = field(default_factory=list)  # (bus id, device id)
    hcas: list[Hca] = field(default_factory=list)
    cpus_by_numa: dict[int, str] = field(default_factory=dict)  # the host's /sys/devices/system/node
    driver_version: str | None = None
    origin: dict[str, str] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def numa_nodes(self) -> list[int]:
        """The NUMA nodes the GPUs sit on (0 where the platform reports none)."""
        return sorted({max(g.numa_node, 0) for g in self.gpus})


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def pci_name(vendor: int, device: int) -> str | None:
    """The device's name in pci.ids (`MT2910 Family [ConnectX-7]`), or None."""
    for path in PCI_IDS:
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        in_vendor = False
        for line in lines:
            if line and not line.startswith(("\t", "#")):
                in_vendor = line[:4].lower() == f"{vendor:04x}"
            elif in_vendor and line.startswith("\t") and not line.startswith("\t\t"):
                if line[1:5].lower() == f"{device:04x}":
                    return line[5:].strip()
        return None
    return None


def read_node(sys_root: str = "/sys", proc_root: str = "/proc") -> NodeFacts:
    """The node's composition from sysfs and procfs (read-only). Every fact's path is in
    `origin`; what is absent is in `unreadable` with the reason."""
    facts = NodeFacts()
    devices = Path(sys_root) / "bus" / "pci" / "devices"
    try:
        names = sorted(os.listdir(devices))
    except OSError as e:
        raise RecordRefused(f"{devices}: cannot list the PCI devices ({e.strerror})") from None
    for name in names:
        d = devices / name
        vendor, cls = _hex(_read(d / "vendor")), _hex(_read(d / "class"))
        if vendor != NVIDIA or cls is None:
            continue
        device = _hex(_read(d / "device")) or 0
        numa = int(_read(d / "numa_node") or -1)
        if cls >> 8 in GPU_CLASSES:
            facts.gpus.append(Gpu(name, device, numa, _read(d / "local_cpulist") or ""))
        elif cls >> 8 == NVSWITCH_CLASS:
            facts.nvswitches.append((name, device))
    where = f"{devices}/*/{{vendor,class}}"
    facts.origin["gpus"] = f"{where} (vendor 0x10de, class 0x0300/0x0302)"
    facts.origin["nvswitches"] = f"{where} (vendor 0x10de, class 0x0680)"
    facts.origin["numa"] = f"{devices}/<gpu>/numa_node"

    ib = Path(sys_root) / "class" / "infiniband"
    try:
        ib_names = sorted(os.listdir(ib))
    except OSError:
        ib_names = []
        facts.unreadable["hcas"] = f"no {ib} (no RDMA driver loaded, or no HCA)"
    for name in ib_names:
        dev = ib / name / "device"
        pci = os.path.basename(os.path.realpath(dev))
        rate = _read(ib / name / "ports" / "1" / "rate")
        m = re.match(r"(\d+)", rate or "")
        pci_dev = _hex(_read(dev / "device"))
        vendor = _hex(_read(dev / "vendor"))
        model = None
        if vendor is not None and pci_dev is not None:
            full = pci_name(vendor, pci_dev)
            bracket = re.search(r"\[(.+)\]", full or "")
            model = bracket.group(1) if bracket else full
        facts.hcas.append(Hca(name, pci, pci_dev, int(_read(dev / "numa_node") or -1), _read(ib / name / "hca_type"),
                              _read(ib / name / "board_id"), _read(ib / name / "fw_ver"),
                              int(m.group(1)) if m else None, model))
    facts.origin["hcas"] = f"{ib}/*"

    nodes = Path(sys_root) / "devices" / "system" / "node"
    for entry in sorted(nodes.glob("node[0-9]*")) if nodes.is_dir() else []:
        facts.cpus_by_numa[int(entry.name[4:])] = _read(entry / "cpulist") or ""
    facts.origin["cpus"] = f"{nodes}/node*/cpulist"

    version = _read(Path(proc_root) / "driver" / "nvidia" / "version")
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", version or "")
    if m:
        facts.driver_version = m.group(1)
        facts.origin["driver_version"] = f"{proc_root}/driver/nvidia/version"
    else:
        facts.unreadable["driver_version"] = f"{proc_root}/driver/nvidia/version: absent or not understood"
    return facts


def node_values(facts: NodeFacts) -> list[tuple[str, Any, str]]:
    """The profile's `node:` keys from the composition, as (key, value, origin)."""
    out: list[tuple[str, Any, str]] = [("node.gpus", len(facts.gpus), facts.origin["gpus"])]
    if facts.gpus:
        out.append(("node.numa_nodes", len(facts.numa_nodes),
                    facts.origin["numa"] + f" (GPUs on NUMA nodes {','.join(map(str, facts.numa_nodes))})"))
        out.append(("node.pci_domain", int(facts.gpus[0].bus_id.split(":")[0], 16),
                    facts.origin["gpus"] + " (GPU 0's domain)"))
    out.append(("node.nvswitches", len(facts.nvswitches), facts.origin["nvswitches"]))
    ids = sorted({d for _, d in facts.nvswitches})
    out.append(("node.nvswitch_device_id", ids[0] if ids else None, facts.origin["nvswitches"] + " device"))
    out.append(("node.hcas", len(facts.hcas), facts.origin["hcas"]))
    if facts.hcas:
        h = facts.hcas[0]
        where = f"{facts.origin['hcas'].rstrip('*')}{h.name}"
        hca = {"model": h.model, "hca_type": h.hca_type, "pci_device_id": h.pci_device_id, "board_id": h.board_id,
               "fw_ver": h.fw_ver, "rate_gbps": h.rate_gbps}
        if None not in hca.values():
            out.append(("node.hca", hca, f"{where}/{{hca_type,board_id,fw_ver,ports/1/rate,device/device}}, "
                                         f"model: pci.ids 15b3:{h.pci_device_id:04x}"))
    else:
        out.append(("node.hca", None, facts.origin["hcas"] + ": none"))
    return out


def composition_lines(facts: NodeFacts) -> list[str]:
    """The composition beyond today's `node:` keys (bus ids, NUMA and CPUs per GPU, HCAs), as
    comment lines; a node composition file will hold them as keys."""
    out = ["composition as recorded (not profile keys):"]
    for i, g in enumerate(facts.gpus):
        out.append(f"  GPU {i}: {g.bus_id} device 0x{g.device_id:04x} NUMA {g.numa_node} CPUs {g.cpulist or '?'}")
    for bus, dev in facts.nvswitches:
        out.append(f"  NVSwitch: {bus} device 0x{dev:04x}")
    for h in facts.hcas:
        out.append(f"  HCA {h.name}: {h.bus_id} {h.model} {h.hca_type} NUMA {h.numa_node} {h.rate_gbps} Gb/s")
    for n, cpus in facts.cpus_by_numa.items():
        out.append(f"  host NUMA node {n}: CPUs {cpus}")
    return out


# --- the live readers --------------------------------------------------------------------------


def _nvml():
    """pynvml, initialised; RecordRefused when there is no NVML library or no driver."""
    try:
        import pynvml
    except ImportError:
        raise RecordRefused("pynvml is not installed (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise RecordRefused(f"cannot initialise NVML ({e}): is the NVIDIA driver installed and loaded here "
                            f"(libnvidia-ml.so.1 on the library path)?") from None
    return pynvml


def smi(*args: str) -> str | None:
    """The driver's nvidia-smi in a read-only mode; None where it is absent or fails."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.info("nvidia-smi %s: %s", " ".join(args), e)
        return None
    return r.stdout if r.returncode == 0 else None


def cuda_attributes(bus_id: str) -> dict[str, tuple[int, str]]:
    """SMs, L2 and memory bus width of the GPU at `bus_id` through CUDA's driver API: cuInit
    and cuDeviceGetAttribute read the device's properties without creating a context."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        log.info("libcuda.so.1: %s", e)
        return {}
    dev = ctypes.c_int()
    if cu.cuInit(0) != 0 or cu.cuDeviceGetByPCIBusId(ctypes.byref(dev), bus_id.encode()) != 0:
        return {}
    out = {}
    for key, attr, name in (("sm_count", CU_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT"),
                            ("l2_cache_bytes", CU_L2_CACHE_SIZE, "L2_CACHE_SIZE"),
                            ("memory.bus_width_bits", CU_GLOBAL_MEMORY_BUS_WIDTH, "GLOBAL_MEMORY_BUS_WIDTH")):
        v = ctypes.c_int()
        if cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) == 0 and v.value > 0:
            out[key] = (v.value, f"cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{name})")
    return out


def nvml_values(N, h) -> list[tuple[str, Any, str]]:
    """The board keys NVML answers for handle `h`, as (key, value, origin); a key whose call is
    not supported is left to the -q -x capture."""
    out: list[tuple[str, Any, str]] = []

    def put(key: str, call: str, fn, conv=lambda v: v) -> Any:
        try:
            v = fn()
        except N.NVMLError as e:
            log.info("%s: %s", call, e)
            return None
        v = v.decode() if isinstance(v, bytes) else v
        out.append((key, conv(v), call))
        return v

    put("product_name", "nvmlDeviceGetName", lambda: N.nvmlDeviceGetName(h))
    put("compute_capability", "nvmlDeviceGetCudaComputeCapability",
        lambda: N.nvmlDeviceGetCudaComputeCapability(h), lambda v: f"{v[0]}.{v[1]}")
    pci = put("pci.device_id", "nvmlDeviceGetPciInfo_v3 pciDeviceId (high 16 bits)", lambda: N.nvmlDeviceGetPciInfo_v3(h),
              lambda p: p.pciDeviceId >> 16)
    if pci is not None:
        out.append(("pci.vendor_id", pci.pciDeviceId & 0xFFFF, "nvmlDeviceGetPciInfo_v3 pciDeviceId (low 16 bits)"))
        out.append(("pci.subsystem_device_id", pci.pciSubSystemId >> 16,
                    "nvmlDeviceGetPciInfo_v3 pciSubSystemId (high 16 bits)"))
        out.append(("pci.subsystem_vendor_id", pci.pciSubSystemId & 0xFFFF,
                    "nvmlDeviceGetPciInfo_v3 pciSubSystemId (low 16 bits)"))
    put("pci.max_link_gen", "nvmlDeviceGetMaxPcieLinkGeneration", lambda: N.nvmlDeviceGetMaxPcieLinkGeneration(h))
    put("pci.max_link_width", "nvmlDeviceGetMaxPcieLinkWidth", lambda: N.nvmlDeviceGetMaxPcieLinkWidth(h))
    mem = put("memory.total_mib", "nvmlDeviceGetMemoryInfo_v2 total", lambda: N.nvmlDeviceGetMemoryInfo(h, N.nvmlMemory_v2),
              lambda m: m.total // MIB)
    if mem is not None:
        out.append(("memory.reserved_mib", mem.reserved // MIB, "nvmlDeviceGetMemoryInfo_v2 reserved"))
    bar1 = put("memory.bar1_mib", "nvmlDeviceGetBAR1MemoryInfo bar1Total", lambda: N.nvmlDeviceGetBAR1MemoryInfo(h),
               lambda b: b.bar1Total // MIB)
    if bar1 is not None:
        out.append(("memory.bar1_used_mib", bar1.bar1Used // MIB, "nvmlDeviceGetBAR1MemoryInfo bar1Used"))
    put("memory.bus_width_bits", "nvmlDeviceGetMemoryBusWidth", lambda: N.nvmlDeviceGetMemoryBusWidth(h))
    put("memory.ecc", "nvmlDeviceGetEccMode (current)", lambda: N.nvmlDeviceGetEccMode(h), lambda v: bool(v[0]))
    put("power.default_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit",
        lambda: N.nvmlDeviceGetPowerManagementDefaultLimit(h), lambda v: v / 1000)
    lim = put("power.min_limit_w", "nvmlDeviceGetPowerManagementLimitConstraints (min)",
              lambda: N.nvmlDeviceGetPowerManagementLimitConstraints(h), lambda v: v[0] / 1000)
    if lim is not None:
        out.append(("power.max_limit_w", lim[1] / 1000, "nvmlDeviceGetPowerManagementLimitConstraints (max)"))
    for key, fn, clock in (("clocks.idle_graphics", "nvmlDeviceGetClockInfo", N.NVML_CLOCK_GRAPHICS),
                           ("clocks.idle_video", "nvmlDeviceGetClockInfo", N.NVML_CLOCK_VIDEO),
                           ("clocks.max_graphics", "nvmlDeviceGetMaxClockInfo", N.NVML_CLOCK_GRAPHICS),
                           ("clocks.max_sm", "nvmlDeviceGetMaxClockInfo", N.NVML_CLOCK_SM),
                           ("clocks.max_mem", "nvmlDeviceGetMaxClockInfo", N.NVML_CLOCK_MEM),
                           ("clocks.max_video", "nvmlDeviceGetMaxClockInfo", N.NVML_CLOCK_VIDEO),
                           ("clocks.default_app_graphics", "nvmlDeviceGetDefaultApplicationsClock", N.NVML_CLOCK_GRAPHICS),
                           ("clocks.default_app_mem", "nvmlDeviceGetDefaultApplicationsClock", N.NVML_CLOCK_MEM)):
        name = {N.NVML_CLOCK_GRAPHICS: "GRAPHICS", N.NVML_CLOCK_SM: "SM", N.NVML_CLOCK_MEM: "MEM",
                N.NVML_CLOCK_VIDEO: "VIDEO"}[clock]
        put(key, f"{fn}(NVML_CLOCK_{name})", lambda fn=fn, clock=clock: getattr(N, fn)(h, clock))
    put("thermal.idle_c", "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU))
    for key, kind, name in (("thermal.shutdown_c", N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, "SHUTDOWN"),
                            ("thermal.slowdown_c", N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, "SLOWDOWN"),
                            ("thermal.max_operating_c", N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, "GPU_MAX")):
        put(key, f"nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_{name})",
            lambda kind=kind: N.nvmlDeviceGetTemperatureThreshold(h, kind))
    try:
        out.append(("thermal.memory_max_operating_c",
                    N.nvmlDeviceGetTemperatureThreshold(h, N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
                    "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX)"))
    except N.NVMLError_NotSupported:
        out.append(("thermal.memory_max_operating_c", None,
                    "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX): NOT_SUPPORTED"))
    except N.NVMLError as e:
        log.info("nvmlDeviceGetTemperatureThreshold(MEM_MAX): %s", e)
    put("vbios_version", "nvmlDeviceGetVbiosVersion", lambda: N.nvmlDeviceGetVbiosVersion(h))
    put("board_part_number", "nvmlDeviceGetBoardPartNumber", lambda: N.nvmlDeviceGetBoardPartNumber(h))
    put("inforom.image", "nvmlDeviceGetInforomImageVersion", lambda: N.nvmlDeviceGetInforomImageVersion(h))
    for key, obj, name in (("inforom.oem", N.NVML_INFOROM_OEM, "OEM"), ("inforom.ecc", N.NVML_INFOROM_ECC, "ECC"),
                           ("inforom.power", N.NVML_INFOROM_POWER, "POWER")):
        put(key, f"nvmlDeviceGetInforomVersion(NVML_INFOROM_{name})",
            lambda obj=obj: N.nvmlDeviceGetInforomVersion(h, obj))
    put("addressing_mode", "nvmlDeviceGetAddressingMode", lambda: N.nvmlDeviceGetAddressingMode(h),
        lambda v: {0: "None", 1: "HMM", 2: "ATS"}.get(v, str(v)))
    try:
        N.nvmlDeviceGetMigMode(h)
        out.append(("mig_capable", True, "nvmlDeviceGetMigMode (answers)"))
    except N.NVMLError_NotSupported:
        out.append(("mig_capable", False, "nvmlDeviceGetMigMode (NOT_SUPPORTED)"))
    except N.NVMLError as e:
        log.info("nvmlDeviceGetMigMode: %s", e)
    try:
        speed = N.nvmlDeviceGetFanSpeed(h)
        out.append(("has_fan", True, "nvmlDeviceGetFanSpeed (answers)"))
        out.append(("fan_speed_pct", speed, "nvmlDeviceGetFanSpeed"))
    except N.NVMLError_NotSupported:
        out.append(("has_fan", False, "nvmlDeviceGetFanSpeed (NOT_SUPPORTED)"))
        out.append(("fan_speed_pct", None, "nvmlDeviceGetFanSpeed (NOT_SUPPORTED)"))
    except N.NVMLError as e:
        log.info("nvmlDeviceGetFanSpeed: %s", e)
    links, version = 0, None
    for link in range(N.NVML_NVLINK_MAX_LINKS):
        try:
            N.nvmlDeviceGetNvLinkState(h, link)
        except N.NVMLError:
            break
        links += 1
        if version is None:
            try:
                version = NVLINK_VERSIONS.get(N.nvmlDeviceGetNvLinkVersion(h, link))
            except N.NVMLError as e:
                log.info("nvmlDeviceGetNvLinkVersion: %s", e)
    out.append(("nvlink.links", links, "nvmlDeviceGetNvLinkState (links that answer)"))
    if links == 0:
        out.append(("nvlink.version", 0, "nvmlDeviceGetNvLinkState (no link)"))
        out.append(("nvlink.link_speed_gbps", 0.0, "nvmlDeviceGetNvLinkState (no link)"))
    elif version is not None:
        out.append(("nvlink.version", version, "nvmlDeviceGetNvLinkVersion (nvmlNvlinkVersion_t)"))
    return out


# --- the recording -----------------------------------------------------------------------------


@dataclass
class Recording:
    imported: imp.Imported
    profile: GpuProfile
    text: str
    node: NodeFacts
    sources: list[str]


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" as sysfs and CUDA spell it: "0000:18:00.0"."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) < 0.01
    return a == b


def overlay(out: imp.Imported, key: str, value: Any, origin: str) -> None:
    """A live value over the -q -x one: NVML's (or sysfs') origin, the capture's agreement or not."""
    if key in out.values and out.values[key] is not None and not _same(out.values[key], value):
        out.notes.append(f"{key}: {origin} says {value!r}, {out.origin[key]} {out.values[key]!r}: took {origin}'s")
        out.put(key, value, origin)
    elif key in out.values:
        out.put(key, value, f"{origin} (= {out.origin[key].removeprefix('-q -x ')})")
    else:
        out.put(key, value, origin)
    out.missing.pop(key, None)
    out.optional.pop(key, None)


def record(name: str, fill_board: tuple[str, GpuProfile] | None = None, sys_root: str = "/sys",
           proc_root: str = "/proc") -> Recording:
    """Read this node and make the profile; RecordRefused when it cannot (nothing is written)."""
    N = _nvml()
    try:
        count = N.nvmlDeviceGetCount()
        if count == 0:
            raise RecordRefused("NVML sees no GPU on this node: nothing to record")
        node = read_node(sys_root, proc_root)
        if not node.gpus:
            raise RecordRefused(f"NVML sees {count} GPUs but {sys_root}/bus/pci/devices shows no NVIDIA GPU")
        xml = smi("-q", "-x")
        if xml is None:
            raise RecordRefused("nvidia-smi -q -x gave nothing (is nvidia-smi on PATH?): it names the board, "
                                "its part numbers and its T.Limit temperatures, which NVML alone does not")
        captures: list[tuple[str, str]] = [("nvidia-smi -q -x", xml)]
        for args, label in ((("topo", "-m"), "nvidia-smi topo -m"), (("nvlink", "-s"), "nvidia-smi nvlink -s")):
            text = smi(*args)
            if text and imp.classify(text) in ("topo", "nvlink"):
                captures.append((label, text))
        try:
            caps = imp.read_captures(captures)
            out = imp.build(caps)
        except imp.ImportRefused as e:
            raise RecordRefused(str(e)) from None
        if len(caps.gpus) != count:
            raise RecordRefused(f"nvidia-smi -q -x shows {len(caps.gpus)} GPUs, NVML {count}")
        h = N.nvmlDeviceGetHandleByIndex(0)
        bus_id = N.nvmlDeviceGetPciInfo_v3(h).busId
        bus_id = sysfs_bus_id(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
        for key, value, origin in nvml_values(N, h):
            overlay(out, key, value, origin)
        try:
            to_switch = N.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0) == N.NVML_NVLINK_DEVICE_TYPE_SWITCH
        except N.NVMLError:
            to_switch = False
        try:
            cuda = N.nvmlSystemGetCudaDriverVersion()
            overlay(out, "node.cuda_version", f"{cuda // 1000}.{cuda % 1000 // 10}", "nvmlSystemGetCudaDriverVersion")
        except N.NVMLError as e:
            log.info("nvmlSystemGetCudaDriverVersion: %s", e)
        driver = N.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        overlay(out, "node.driver_version", driver, "nvmlSystemGetDriverVersion")
        if node.driver_version and node.driver_version != driver:
            out.notes.append(f"{node.origin['driver_version']} says {node.driver_version}, NVML {driver}")
    finally:
        N.nvmlShutdown()
    for key, (value, origin) in cuda_attributes(bus_id).items():
        overlay(out, key, value, origin)
    gpu0 = Path(sys_root) / "bus" / "pci" / "devices" / bus_id
    for key, attr, conv in (("pci.class_code", "class", lambda v: v & 0xFFFF00), ("pci.revision", "revision", None)):
        v = _hex(_read(gpu0 / attr))
        if v is not None:
            overlay(out, key, conv(v) if conv else v, str(gpu0 / attr))
    if len(node.gpus) != count:
        out.notes.append(f"NVML sees {count} GPUs, sysfs {len(node.gpus)}: node.gpus is sysfs'")
    for key, value, origin in node_values(node):
        overlay(out, key, value, origin)
    fabric = out.values.get("fabric.cluster_uuid")
    if not node.nvswitches and to_switch and fabric in (None, ZERO_UUID):
        # HGX B200: the GPUs' NVLinks end at switch chips that are no PCI function of this host.
        out.values.pop("node.nvswitches")
        out.missing["node.nvswitches"] = ("GPU 0's NVLinks end at NVSwitches (nvmlDeviceGetNvLinkRemoteDeviceType) "
                                          "that are not PCI functions of this host: their count is not visible")
    if out.values.get("node.hcas") and out.values.get("node.hca") is None:
        out.missing["node.hca"] = "an HCA's model is not in pci.ids, or its sysfs attributes are absent"
    if out.values.get("node.hcas") == 0:
        out.missing.pop("node.hca", None)
    out.missing.update({k: r for k, r in RECORD_REASONS.items() if k not in out.values})
    if fill_board is not None:
        try:
            imp.fill(out, fill_board[1], fill_board[0])
        except imp.ImportRefused as e:
            raise RecordRefused(str(e)) from None
    if out.missing:
        listing = "\n".join(f"  {k}: {r}" for k, r in out.missing.items())
        raise RecordRefused("this node cannot give these keys, and a profile without them would not load:\n"
                            + listing + "\ngive --fill-from PROFILE (a shipped board of the same architecture) "
                                        "to take them from it, marked as filled")
    try:
        profile = imp.validate(out, name)
    except imp.ImportRefused as e:
        raise RecordRefused(str(e)) from None
    sources = [c for c, _ in captures] + ["NVML (pynvml)", "CUDA device attributes", f"{sys_root}, {proc_root}"]
    text = imp.to_yaml(out, name, sources)
    header = f"# {profile.product_name}: recorded by `mokka profile record` on a live node from"
    text = header + "\n" + text.split("\n", 1)[1]
    text += "".join(f"# {line}\n" for line in composition_lines(node))
    return Recording(out, profile, text, node, sources)


# Keys no live surface gives (imported ones have their reasons in profile_import).
RECORD_REASONS = {
    "thermal.max_load_c": "a steady temperature at the power limit: a recording of an idle node cannot see it",
}


def write_atomically(path: str, text: str) -> None:
    """The whole file or none: a temporary file beside it, renamed over it."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".mokka-record-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
