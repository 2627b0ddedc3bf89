"""`mokka profile record`: a profile of the node this runs on, read live, every value traced.

Reads, never writes: NVML (pynvml against the driver's libnvidia-ml: getters only), the driver's
`nvidia-smi` (`-q -x`, `topo -m`, `nvlink -s`: read-only modes), CUDA's device attributes
(cuInit and cuDeviceGetAttribute: no context is created), and sysfs/procfs. The `-q -x` capture
goes through profile_import's parser and builder, so a recording and an import agree on every
key both read; NVML then answers each key it has, and a disagreement is noted. The node's
composition (GPUs, bus ids, NUMA, NVLink and NVSwitch layout, HCAs, CPUs) is read by one
function, `read_node`, and written as a composition file beside the profile (`composition_of`).
docs/profiles.md ("Recording a node") lists what comes from where.
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

import yaml
from pydantic import ValidationError

from mokkafs.model import profile_import as imp
from mokkafs.model.schema import ZERO_UUID, Composition, GpuProfile, ProfileError, check_fits
from mokkafs.model.smi_fields import BY_PROFILE

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
    path: str = ""  # the device's place in the PCI tree (realpath under /sys/devices)


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
    path: str = ""  # the device's place in the PCI tree (realpath under /sys/devices)


@dataclass
class NodeFacts:
    """What sysfs and procfs say about how the boards sit in this machine."""

    gpus: list[Gpu] = field(default_factory=list)
    nvswitches: list[tuple[str, int]] = field(default_factory=list)  # (bus id, device id)
    hcas: list[Hca] = field(default_factory=list)
    cpus_by_numa: dict[int, str] = field(default_factory=dict)  # the host's /sys/devices/system/node
    driver_version: str | None = None
    cpu_model: str = ""  # /proc/cpuinfo's first model name
    dmi: dict[str, str] = field(default_factory=dict)  # /sys/class/dmi/id: sys_vendor, product_name, board_name
    sys_root: str = "/sys"
    origin: dict[str, str] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


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
    facts = NodeFacts(sys_root=sys_root)
    for key in ("sys_vendor", "product_name", "board_name"):  # the machine as its firmware names it
        value = _read(Path(sys_root) / "class" / "dmi" / "id" / key)
        if value:
            facts.dmi[key] = value
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
            facts.gpus.append(Gpu(name, device, numa, _read(d / "local_cpulist") or "", os.path.realpath(d)))
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
    for name in sorted(ib_names, key=_natural):  # mlx5_2 before mlx5_10: the composition's HCA order
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
                              int(m.group(1)) if m else None, model, os.path.realpath(dev)))
    facts.origin["hcas"] = f"{ib}/*"

    nodes = Path(sys_root) / "devices" / "system" / "node"
    for entry in sorted(nodes.glob("node[0-9]*")) if nodes.is_dir() else []:
        facts.cpus_by_numa[int(entry.name[4:])] = _read(entry / "cpulist") or ""
    facts.origin["cpus"] = f"{nodes}/node*/cpulist"

    cpuinfo = _read(Path(proc_root) / "cpuinfo") or ""
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    if m:
        facts.cpu_model = m.group(1).strip()
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
        # The host's NUMA nodes, as the composition's cpu.numa_nodes (the count does not depend
        # on the arch, which only settles a one-run cpulist's threads per core).
        cpu, origin = cpu_layout(facts, "x86_64")
        out.append(("node.numa_nodes", cpu["numa_nodes"], origin["numa_nodes"]))
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


def _runs(cpulist: str) -> list[tuple[int, int]]:
    """"0-55,112-167" -> [(0, 56), (112, 56)]: (first CPU, length) of each run."""
    out = []
    for part in filter(None, cpulist.split(",")):
        a, _, b = part.partition("-")
        out.append((int(a), int(b or a) - int(a) + 1))
    return out


def cpu_layout(facts: NodeFacts, arch: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The composition's `cpu:` keys (less arch and model) and each one's origin. Linux numbers
    the first thread of every core, node after node, then the siblings: a NUMA node's cpulist is
    one run per thread of each core, as long as the node has cores. The host's node directories
    and thread siblings say it where they agree with the GPUs' local_cpulist; where they do not
    (a node seen through `mokka run`, whose /sys/devices/system is the host's), the GPUs' own
    lists say it."""
    nodes = f"{facts.sys_root}/devices/system/node"
    gpu_lists = {max(g.numa_node, 0): g.cpulist for g in facts.gpus if g.cpulist}
    if not gpu_lists:
        raise RecordRefused("no GPU has a local_cpulist: the node's CPU layout cannot be read")
    host_agrees = all(facts.cpus_by_numa.get(n) == c for n, c in gpu_lists.items())
    numa, cpulist = min(gpu_lists.items())
    runs = _runs(cpulist)
    total = sum(length for _, length in runs)
    where = f"/sys/bus/pci/devices/<GPU on NUMA node {numa}>/local_cpulist ({cpulist})"
    siblings_file = f"{facts.sys_root}/devices/system/cpu/cpu{runs[0][0]}/topology/thread_siblings_list"
    siblings = _read(Path(siblings_file))
    if host_agrees and siblings:
        threads, threads_from = len(_cpus(siblings)), f"{siblings_file} ({siblings})"
    elif len(runs) > 1 and all(length == runs[0][1] for _, length in runs):
        threads, threads_from = len(runs), f"{where}: one run per thread of a core"
    else:
        # One run: the siblings follow the cores at once, so the list cannot tell them apart.
        threads = 2 if arch == "x86_64" and total % 2 == 0 else 1
        threads_from = (f"{where} is one run, which does not show the siblings, and this host's {siblings_file} "
                        f"is not the GPUs' CPUs: assumed {threads} ({'SMT on x86_64' if threads == 2 else 'no SMT'})")
    cores = total // threads
    if host_agrees:
        count, count_from = len(facts.cpus_by_numa), f"{nodes}/node* ({len(facts.cpus_by_numa)} nodes)"
    elif len(runs) > 1:
        count = (runs[1][0] - runs[0][0]) // cores
        count_from = f"{where}: the sibling threads start {runs[1][0] - runs[0][0]} CPUs on, {cores} cores a node"
    else:
        count = max(max(gpu_lists) + 1, (runs[0][0] + total) // total)
        count_from = "/sys/bus/pci/devices/<GPU>/{numa_node,local_cpulist}: the highest NUMA node a GPU sits on"
    source = f"{nodes}/node*/cpulist (= the GPUs' local_cpulist)" if host_agrees else where
    values = {"numa_nodes": count, "cores_per_numa_node": cores, "threads_per_core": threads}
    origin = {"numa_nodes": count_from, "cores_per_numa_node": f"{source}: CPUs / threads per core",
              "threads_per_core": threads_from}
    return values, origin


def _cpus(cpulist: str) -> list[int]:
    return [c for start, length in _runs(cpulist) for c in range(start, start + length)]


def _shared_depth(a: str, b: str) -> int:
    """How many PCI-tree levels below the root complex two device paths share."""
    pa, pb = a.split("/"), b.split("/")
    n = 0
    while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
        n += 1
    roots = [i for i, part in enumerate(pa) if part.startswith("pci")]
    return n - (roots[0] + 1) if roots and n > roots[0] else 0


def hca_beside(facts: NodeFacts) -> dict[int, int]:
    """GPU index -> the HCA (index) on the same PCIe switch: the one sharing the deepest part of
    its PCI path (more than the root port), one HCA per GPU, as a composition holds them."""
    out: dict[int, int] = {}
    for j, h in enumerate(facts.hcas):
        depths = [(_shared_depth(g.path, h.path), -i) for i, g in enumerate(facts.gpus) if i not in out]
        if depths and max(depths)[0] >= 2:  # the root port and the switch above both
            out[-max(depths)[1]] = j
    return out


def _yaml(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


@dataclass
class RecordedComposition:
    composition: Composition
    text: str


def composition_of(facts: NodeFacts, name: str, profile: GpuProfile, versions: dict[str, tuple[str, str]],
                   profile_file: str = "PROFILE.yaml", node_file: str = "NODE.yaml",
                   nvswitches: tuple[int, str] | None = None) -> RecordedComposition:
    """The node composition (compositions/*.yaml's schema) of what read_node saw, every value
    with its source as a comment; RecordRefused when it does not validate or the board does not
    fit it. `versions`: driver_version and cuda_version as (value, NVML call); `nvswitches`: a
    count from elsewhere (filled) where the switches are no PCI function of this host."""
    if not facts.gpus:
        raise RecordRefused("no GPU in sysfs: no composition to record")
    rows: list[str] = []  # rendered lines

    def put(key: str, value: Any, origin: str, indent: str = "") -> None:
        text = f"{indent}{key}: {value if isinstance(value, str) and value.startswith('0x') else _yaml(value)}"
        rows.append(f"{text:<40} # {origin}")

    domain = int(facts.gpus[0].bus_id.split(":")[0], 16)
    near = hca_beside(facts)
    machine = os.uname().machine
    arch = "aarch64" if profile.grace else "x86_64"
    cpu, cpu_origin = cpu_layout(facts, arch)
    arch_from = ("the board: a Grace superchip's GPU (addressing mode ATS or a multi-node NVLink domain) sits "
                 "beside Grace" if profile.grace else "the board: a PCIe/SXM board for x86 hosts")
    if machine != arch:
        arch_from += f" (this process runs on {machine})"
    model = facts.cpu_model if cpu_origin["numa_nodes"].startswith(f"{facts.sys_root}/devices/system") else ""
    rows += [f"# {name}: the node composition recorded by `mokka profile record` beside {profile_file}.",
             f"# Mount the two together: mokka mount MNT --profile {profile_file} --node {node_file}",
             f"# (docs/profiles.md, \"Recording a node\"); each value's source is its comment."]
    put("name", name, "the profile's name with -node")
    put("description", f"recorded: {len(facts.gpus)} x {profile.product_name}", "mokka profile record")
    put("gpus", len(facts.gpus), facts.origin["gpus"])
    put("driver_version", versions["driver_version"][0], versions["driver_version"][1])
    put("cuda_version", versions["cuda_version"][0], versions["cuda_version"][1])
    rows.append("cpu:")
    put("arch", arch, arch_from, "  ")
    put("model", model, "/proc/cpuinfo model name" if model else
        "not read: this host's /sys/devices/system/node is not the GPUs' (their local_cpulist differs)", "  ")
    for key in ("numa_nodes", "cores_per_numa_node", "threads_per_core"):
        put(key, cpu[key], cpu_origin[key], "  ")
    dmi = f"{facts.sys_root}/class/dmi/id"
    printable = re.compile(r"[ -~]{1,64}")
    if all(printable.fullmatch(facts.dmi.get(k, "")) for k in ("sys_vendor", "product_name")):
        rows.append("system:                                  # the machine as its firmware names it")
        put("vendor", facts.dmi["sys_vendor"], f"{dmi}/sys_vendor", "  ")
        put("product", facts.dmi["product_name"], f"{dmi}/product_name", "  ")
        board = facts.dmi.get("board_name", "")
        if printable.fullmatch(board) and board != facts.dmi["product_name"]:
            put("board", board, f"{dmi}/board_name", "  ")
    else:
        rows.append(f"# system: not recorded ({dmi}/sys_vendor and product_name absent or not printable ASCII)")
    put("pci_domain", domain, f"{facts.gpus[0].bus_id}: GPU 0's PCI domain")
    rows.append("slots:                                   # per GPU, in bus order (NVML's index order)")
    for i, g in enumerate(facts.gpus):
        d, bus = int(g.bus_id.split(":")[0], 16), int(g.bus_id.split(":")[1], 16)
        if not g.bus_id.endswith(":00.0"):  # a cloud VM's GPU at 00:1e.0, say
            raise RecordRefused(f"GPU {i} is at {g.bus_id}: a composition places each GPU at device 00.0 of its "
                                f"own bus, behind its own root port and switch, so this node's layout cannot be "
                                f"recorded (mount the profile with a shipped composition: mokka profile nodes)")
        slot = {"bus": f"0x{bus:02x}", **({"domain": d} if d != domain else {}), "numa": max(g.numa_node, 0)}
        origin = f"GPU {i}: /sys/bus/pci/devices/{g.bus_id}, its numa_node"
        if i in near:
            slot["hca"] = near[i]
            h = facts.hcas[near[i]]
            origin += f"; {h.name} ({h.bus_id}) shares its PCIe switch"
        rows.append(f"{'  - {' + ', '.join(f'{k}: {v}' for k, v in slot.items()) + '}':<40} # {origin}")
    if nvswitches is not None and not facts.nvswitches:
        put("nvswitches", *nvswitches)
    else:
        put("nvswitches", len(facts.nvswitches), facts.origin["nvswitches"])
    ids = sorted({dev for _, dev in facts.nvswitches})
    if ids:
        put("nvswitch_device_id", f"0x{ids[0]:04x}", facts.origin["nvswitches"] + " device")
    put("hcas", len(facts.hcas), facts.origin["hcas"])
    if facts.hcas:
        h = facts.hcas[0]
        where = f"{facts.origin['hcas'].rstrip('*')}{h.name}"
        rows.append("hca:                                     # the first HCA's model (every HCA is taken as it)")
        for key, value, origin in (
                ("model", h.model, f"pci.ids 15b3:{h.pci_device_id or 0:04x}"),
                ("hca_type", h.hca_type, f"{where}/hca_type"),
                ("pci_device_id", None if h.pci_device_id is None else f"0x{h.pci_device_id:04x}",
                 f"{where}/device/device"),
                ("board_id", h.board_id, f"{where}/board_id"), ("fw_ver", h.fw_ver, f"{where}/fw_ver"),
                ("rate_gbps", h.rate_gbps, f"{where}/ports/1/rate")):
            if value is None:
                raise RecordRefused(f"HCA {h.name}: {origin} is absent or not understood, and a composition with "
                                    f"HCAs needs it")
            put(key, value, origin, "  ")
        others = {(x.model, x.hca_type, x.rate_gbps) for x in facts.hcas}
        if len(others) > 1:
            rows.append(f"# note: the HCAs are not all alike ({len(others)} models or rates); a composition "
                        f"holds one model")
    spare = [h.name for j, h in enumerate(facts.hcas) if j not in near.values()]
    if spare:
        rows.append(f"# HCAs beside no GPU (on the platform's own buses): {', '.join(spare)}")
    text = "\n".join(rows) + "\n"
    try:
        composition = Composition.model_validate(yaml.safe_load(text))
        check_fits(profile, composition)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in e.errors()]
        raise RecordRefused("the recorded node composition does not load:\n" + "\n".join(lines)) from None
    except ProfileError as e:
        raise RecordRefused(f"the recorded board does not fit the recorded node: {e}") from None
    return RecordedComposition(composition, text)


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

    def from_table(key: str, conv=lambda v: v) -> Any:
        """Profile key `key` through the NVML call nvidia-smi's field table reads its fact with."""
        f = BY_PROFILE[key]
        call = f.nvml + (f"({', '.join(f.nvml_args)})" if f.nvml_args else "")
        return put(key, call, lambda: getattr(N, f.nvml)(h, *(getattr(N, a) for a in f.nvml_args)), conv)

    from_table("product_name")
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
    from_table("pci.max_link_gen")
    from_table("pci.max_link_width")
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
    from_table("power.default_limit_w", lambda v: v / 1000)
    lim = put("power.min_limit_w", "nvmlDeviceGetPowerManagementLimitConstraints (min)",
              lambda: N.nvmlDeviceGetPowerManagementLimitConstraints(h), lambda v: v[0] / 1000)
    if lim is not None:
        out.append(("power.max_limit_w", lim[1] / 1000, "nvmlDeviceGetPowerManagementLimitConstraints (max)"))
    for key in ("clocks.idle_graphics", "clocks.idle_video", "clocks.max_graphics", "clocks.max_sm", "clocks.max_mem",
                "clocks.max_video", "clocks.default_app_graphics", "clocks.default_app_mem", "thermal.idle_c",
                "thermal.shutdown_c", "thermal.slowdown_c", "thermal.max_operating_c"):
        from_table(key)
    try:
        out.append(("thermal.memory_max_operating_c",
                    N.nvmlDeviceGetTemperatureThreshold(h, N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
                    "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX)"))
    except N.NVMLError_NotSupported:
        out.append(("thermal.memory_max_operating_c", None,
                    "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX): NOT_SUPPORTED"))
    except N.NVMLError as e:
        log.info("nvmlDeviceGetTemperatureThreshold(MEM_MAX): %s", e)
    for key in ("vbios_version", "board_part_number", "inforom.image", "inforom.oem", "inforom.ecc", "inforom.power"):
        from_table(key)
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
    composition: RecordedComposition


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
           proc_root: str = "/proc", profile_file: str = "PROFILE.yaml", node_file: str = "NODE.yaml") -> Recording:
    """Read this node and make the profile and its node composition (to be written as
    `profile_file` and `node_file`, names the texts mention); RecordRefused when it cannot
    (nothing is written)."""
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
        versions = {k: (out.values.get(f"node.{k}"), out.origin.get(f"node.{k}", "absent"))
                    for k in ("driver_version", "cuda_version")}
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
    switches = (profile.node.nvswitches, out.origin["node.nvswitches"]) if "node.nvswitches" in out.filled else None
    comp = composition_of(node, f"{name}-node", profile, versions, profile_file, node_file, switches)
    note = (f"# The node it sat in is the composition {node_file} (bus ids, NUMA, CPUs, NVSwitches, HCAs);\n"
            f"# mount the two together: mokka mount MNT --profile {profile_file} --node {node_file}.\n"
            f"# The node: section below is that composition's summary, for a mount without --node.\n")
    text = note + header + "\n" + text.split("\n", 1)[1]
    return Recording(out, profile, text, node, sources, comp)


# Keys no live surface gives (imported ones have their reasons in profile_import).
RECORD_REASONS = {
    "thermal.max_load_c": "a steady temperature at the power limit: a recording of an idle node cannot see it",
}


def write_atomically(files: dict[str, str]) -> None:
    """Every file whole or none: each text goes to a temporary file beside its path first; only
    when all are written are they renamed over their paths (a failed rename puts back the files
    already replaced)."""
    temps: dict[str, str] = {}
    try:
        for path, text in files.items():
            fd, tmp = tempfile.mkstemp(prefix=".mokka-record-", dir=os.path.dirname(os.path.abspath(path)))
            temps[path] = tmp
            with os.fdopen(fd, "w") as f:
                f.write(text)
        backups: dict[str, str | None] = {}
        try:
            for path, tmp in temps.items():
                backup = None
                if os.path.exists(path):
                    backup = tmp + ".old"
                    os.link(path, backup)
                backups[path] = backup
                os.replace(tmp, path)
        except BaseException:
            for path, backup in backups.items():
                if backup is not None:
                    os.replace(backup, path)
                elif not os.path.exists(temps[path]):
                    os.unlink(path)
            raise
        for backup in backups.values():
            if backup is not None:
                os.unlink(backup)
    finally:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
