"""`mokka profile import`: a GPU profile from a real node's captures, every value traced.

Pure: capture texts in, a profile (as data and as commented YAML) out. The captures are what a
user can run on a real node: `nvidia-smi -q -x` (the ground truth), and when given `nvidia-smi -q`,
`nvidia-smi topo -m`, `nvidia-smi nvlink -s`, `nvidia-smi --query-gpu=...,compute_cap
--format=csv`, `lspci -vvv -d 10de:` and CUDA's `deviceQuery` sample, alone or as the sections of
one nvidia_gpu_exporter capture file. Without `-q -x`, the text `-q` (any layout from 470 to 595)
is the ground truth. Each key of the profile is either read from a capture (its comment names the
element), missing (listed with the reason), or filled from a shipped board of the same
architecture (`--fill-from`), and then marked so. docs/profiles.md ("Importing a capture") lists
which key comes from where.
"""
from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from mokkafs.model.profiles import validation_problem
from mokkafs.model.schema import GpuProfile, SupportedClock, graphics_clocks
from mokkafs.model.smi_fields import BY_PROFILE, FIELDS, TEXT_TO_XML

# Driver branches whose behaviour mokkafs models: from 470 (the oldest branch whose NVML export
# table is traced, docs/nvml.md) to 595 (the newest captured nvidia-smi, docs/nvidia-smi.md).
OLDEST_BRANCH, NEWEST_BRANCH = 470, 595
ARCHITECTURES = ("Turing", "Ampere", "Ada Lovelace", "Hopper", "Blackwell")


class ImportRefused(ValueError):
    """A capture that cannot become a profile; the message says which file and why."""


# --- one capture, as element paths -------------------------------------------------------------


@dataclass
class Gpu:
    """One GPU of a capture: its values by `-q -x` element path, and where each was read."""

    bus_id: str
    values: dict[str, str] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    # -q -x's <supported_clocks>: (memory clock, its graphics clocks) as listed; None: not given
    supported_clocks: list[tuple[str, list[str]]] | None = None

    def get(self, path: str) -> str | None:
        return self.values.get(path)


@dataclass
class Captures:
    """All that the given captures say about one node."""

    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None
    top_origin: dict[str, str] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)  # from -q -x, else -q
    text_gpus: list[Gpu] = field(default_factory=list)  # from -q, when -q -x is given too
    compute_cap: tuple[str, str] | None = None  # (value, origin)
    nvlink: tuple[int, float, str] | None = None  # links, GB/s per link, origin (nvlink -s)
    topo: dict[str, Any] | None = None  # gpus, nics, numa_nodes, nvlinks (GPU0's NV#), origin
    lspci: dict[str, Any] | None = None  # gpus, revision, nvswitches, nvswitch_device_id, origin
    device_query: dict[str, Any] | None = None  # name, compute_capability, sm_count, l2, bus width, origin
    notes: list[str] = field(default_factory=list)


def parse_xml(text: str, name: str, into: Captures) -> None:
    """`nvidia-smi -q -x`: every leaf under each <gpu> by its path."""
    if "<nvidia_smi_log" not in text[:2000]:
        raise ImportRefused(f"{name}: not nvidia-smi -q -x output (no <nvidia_smi_log> root)")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        line, col = e.position
        raise ImportRefused(
            f"{name}: the XML ends or breaks at line {line}, column {col} ({e.msg.split(':')[0]}); "
            f"a truncated or damaged capture: capture it again with nvidia-smi -q -x > FILE"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise ImportRefused(f"{name}: not nvidia-smi -q -x output (root <{root.tag}>)")
    gpus = root.findall("gpu")
    attached = root.findtext("attached_gpus")
    if not gpus:
        raise ImportRefused(f"{name}: no <gpu> element: a capture of a node without GPUs, or cut short")
    if attached and attached.strip().isdigit() and int(attached) != len(gpus):
        raise ImportRefused(
            f"{name}: attached_gpus says {attached.strip()} but the capture holds {len(gpus)} <gpu> "
            f"elements: truncated, or taken with -i (capture every GPU)"
        )
    into.driver_version = (root.findtext("driver_version") or "").strip() or None
    into.cuda_version = (root.findtext("cuda_version") or "").strip() or None
    into.attached_gpus = len(gpus)
    for key in ("driver_version", "cuda_version", "attached_gpus"):
        into.top_origin[key] = f"{name}: <{key}>"
    for g in gpus:
        gpu = Gpu(g.get("id", "?"))

        def walk(e: ET.Element, prefix: str) -> None:
            for c in e:
                p = f"{prefix}{c.tag}"
                if len(c):
                    walk(c, p + "/")
                elif p not in gpu.values:
                    gpu.values[p] = (c.text or "").strip()
                    gpu.origin[p] = f"-q -x <{p}>"

        walk(g, "")
        clocks = g.find("supported_clocks")
        if clocks is not None and len(clocks):
            gpu.supported_clocks = [((m.findtext("value") or "").strip(),
                                     [(c.text or "").strip() for c in m.findall("supported_graphics_clock")])
                                    for m in clocks.findall("supported_mem_clock")]
        into.gpus.append(gpu)


def _hex_plain(v: str) -> str:
    return v[2:] if v.lower().startswith("0x") else v


def _xml_spelling(path: str):
    """How -q -x writes what -q prints at the same place: PCI numbers without 0x (every <pci_*>
    leaf), the domain in four digits; None: the same text."""
    if path == "pci/pci_domain":
        return lambda v: _hex_plain(v).zfill(4)
    return _hex_plain if path.rsplit("/", 1)[-1].startswith("pci_") else None


# The facts of nvidia-smi's field table read from a capture beyond those a profile key is read from
# (the table's `profile` column): the board's ids and class, the readings the old layouts and the
# T.Limit thresholds are relative to, the fabric's status, the row remapper's histogram (whose
# buckets add up to the board's bank count).
ALSO_READ = ("pci.device_id", "pci.sub_device_id", "pci.baseClass", "pci.subClass", "power.draw", "power.draw.instant",
             "temperature.gpu.tlimit", "x.temp.shutdown_tlimit", "x.temp.slowdown_tlimit", "x.temp.max_gpu_tlimit",
             "x.temp.max_mem_tlimit", "fabric.status", *(f"remapped_rows.histogram.{b}" for b in
                                                          ("max", "high", "partial", "low", "none")))
# `nvidia-smi -q` labels of those facts (section/label, as printed, every layout from 470 to 595)
# -> the -q -x element of the same value, and how the XML writes it.
TEXT_LABELS: dict[str, tuple[str, Any]] = {
    label: (TEXT_TO_XML[label], _xml_spelling(TEXT_TO_XML[label]))
    for name in [*(f.name for f in BY_PROFILE.values()), *ALSO_READ] for label in FIELDS[name].q
}
_KV = re.compile(r"^( *)(\S.*?)\s+: ?(.*)$")


def parse_query_text(text: str, name: str, into: Captures) -> None:
    """`nvidia-smi -q`: labels nested by indentation (4 spaces a level), mapped to -q -x paths."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "NVSMI LOG" in line)
    gpus: list[Gpu] = []
    top: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, section label) under the current GPU
    ended: set[int] = set()  # GPUs whose section reached its last item (Processes)
    last = (start + 1, "NVSMI LOG")  # the last line read: (number, label), for a truncation message
    for number, line in enumerate(lines[start + 1:], start + 2):
        if not line.strip():
            continue
        if line.startswith("GPU ") and ":" in line and " : " not in line:
            gpus.append(Gpu(line[4:].strip()))
            stack = []
            continue
        last = (number, line.strip())
        if gpus and line.startswith("    Processes") and not line.startswith("     "):
            ended.add(len(gpus) - 1)  # every -q layout (470 to 595) closes a GPU with Processes
        m = _KV.match(line) if (" : " in line or line.rstrip().endswith(" :")) else None
        if m:
            indent, label, value = len(m.group(1)), m.group(2).strip(), m.group(3).strip()
            if not gpus:
                top[label] = value
                continue
            while stack and stack[-1][0] >= indent:
                stack.pop()
            key = "/".join([s for _, s in stack] + [label])
            if key in TEXT_LABELS:
                path, conv = TEXT_LABELS[key]
                gpu = gpus[-1]
                if path not in gpu.values:
                    gpu.values[path] = conv(value) if conv and value != "N/A" else value
                    gpu.origin[path] = f"-q '{key}'"
        else:
            indent = len(line) - len(line.lstrip(" "))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, line.strip()))
    if not gpus:
        raise ImportRefused(f"{name}: nvidia-smi -q output without a GPU section (cut short?)")
    for i, gpu in enumerate(gpus):
        if i not in ended:
            where = f"at line {last[0]} ({last[1][:40]!r})" if i == len(gpus) - 1 else "before the next GPU"
            raise ImportRefused(
                f"{name}: GPU {gpu.bus_id}'s section ends {where} without its Processes line: a truncated or "
                f"partial nvidia-smi -q (a -d selection, or a paste cut short); capture it again with nvidia-smi -q > FILE"
            )
    attached = top.get("Attached GPUs", "")
    if attached.isdigit() and int(attached) != len(gpus):
        raise ImportRefused(f"{name}: -q says {attached} attached GPUs but holds {len(gpus)}: truncated?")
    target = into.text_gpus if into.gpus else into.gpus
    target.extend(gpus)
    for key, label in (("driver_version", "Driver Version"), ("cuda_version", "CUDA Version")):
        if getattr(into, key) is None and top.get(label):
            setattr(into, key, top[label])
            into.top_origin[key] = f"{name}: -q '{label}'"
    if into.attached_gpus is None:
        into.attached_gpus = len(gpus)
        into.top_origin["attached_gpus"] = f"{name}: -q 'Attached GPUs'"


def parse_nvlink(text: str, name: str, into: Captures) -> None:
    """`nvidia-smi nvlink -s`: GPU 0's links and their speed."""
    block: list[str] = []
    seen_gpu = False
    for line in text.splitlines():
        if line.startswith("GPU "):
            if seen_gpu:
                break
            seen_gpu = True
            continue
        if seen_gpu:
            block.append(line.strip())
    speeds = [float(m.group(1)) for line in block if (m := re.match(r"Link \d+: ([\d.]+) GB/s", line))]
    if any("does not have or support Nvlink" in line for line in block):
        into.nvlink = (0, 0.0, f"{name}: nvlink -s (GPU 0: no NVLink)")
    elif speeds:
        into.nvlink = (len(speeds), max(speeds), f"{name}: nvlink -s (GPU 0: {len(speeds)} links)")
    else:
        raise ImportRefused(f"{name}: nvlink -s output without a link line for GPU 0")


def parse_topo(text: str, name: str, into: Captures) -> None:
    """`nvidia-smi topo -m`: GPU and NIC count, NUMA nodes the GPUs sit on, GPU0's NV# to a peer."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split("\t") for line in lines if line.lstrip().startswith("GPU0")), None)
    if header is None:
        raise ImportRefused(f"{name}: topo -m output without its GPU0 header")
    cols = [c.strip() for c in header]
    rows = [line.split("\t") for line in lines if re.match(r"GPU\d+\t", line)]
    nics = [line for line in lines if re.match(r"\s*NIC\d+:", line)]
    numa = set()
    nv = 0
    if "NUMA Affinity" in cols:
        i = cols.index("NUMA Affinity")
        numa = {r[i].strip() for r in rows if len(r) > i and r[i].strip() not in ("", "N/A")}
    for cell in rows[0][1:] if rows else []:
        if m := re.fullmatch(r"NV(\d+)", cell.strip()):
            nv = max(nv, int(m.group(1)))
    into.topo = {"gpus": len(rows), "nics": len(nics), "numa_nodes": len(numa) or None, "nvlinks": nv,
                 "origin": f"{name}: topo -m"}


def parse_lspci(text: str, name: str, into: Captures) -> None:
    """`lspci -vvv -d 10de:` (`-nn` adds the ids): GPUs and their revision, NVSwitch bridges."""
    heads = [line for line in text.splitlines() if re.match(r"^[0-9a-fA-F:.]+ [^:]+: NVIDIA", line)]
    gpus = [h for h in heads if "VGA compatible controller" in h or "3D controller" in h]
    switches = [h for h in heads if re.search(r" Bridge( \[0680\])?: ", h)]  # NVIDIA's bridges are NVSwitches
    rev = None
    if gpus and (m := re.search(r"\(rev ([0-9a-f]{2})\)", gpus[0])):
        rev = int(m.group(1), 16)
    sw_id = None
    if switches and (m := re.search(r"\[10de:([0-9a-f]{4})\]|NVIDIA Corporation Device ([0-9a-f]{4})\b", switches[0])):
        sw_id = int(m.group(1) or m.group(2), 16)
    into.lspci = {"gpus": len(gpus), "revision": rev, "nvswitches": len(switches), "nvswitch_device_id": sw_id,
                  "origin": f"{name}: lspci"}


def parse_device_query(text: str, name: str, into: Captures) -> None:
    """CUDA's `deviceQuery` sample: device 0's name, compute capability, SMs, L2 and bus width
    (the CUDA device properties no nvidia-smi output prints)."""
    blocks = re.split(r'^Device (\d+): "(.*)"$', text, flags=re.M)
    if len(blocks) < 4:
        raise ImportRefused(f"{name}: deviceQuery output without a 'Device 0: \"NAME\"' block (no CUDA device, or cut short)")
    device, body = blocks[2], blocks[3]
    found = {
        "compute_capability": re.search(r"CUDA Capability Major/Minor version number:\s+(\d+\.\d+)", body),
        "sm_count": re.search(r"\(\s*0*(\d+)\)\s+Multiprocessors", body),
        "l2_cache_bytes": re.search(r"L2 Cache Size:\s+(\d+) bytes", body),
        "memory.bus_width_bits": re.search(r"Memory Bus Width:\s+(\d+)-bit", body),
    }
    values: dict[str, Any] = {k: (m.group(1) if k == "compute_capability" else int(m.group(1)))
                              for k, m in found.items() if m}
    if not values:
        raise ImportRefused(f"{name}: deviceQuery's device 0 block has none of compute capability, SMs, L2 or bus width")
    into.device_query = {"name": device, "values": values, "origin": f"{name}: deviceQuery (device 0, {device})"}


def parse_query_csv(text: str, name: str, into: Captures) -> None:
    """`nvidia-smi --query-gpu=...,compute_cap --format=csv`: GPU 0's compute capability."""
    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    header = [c.strip() for c in rows[0]]
    if "compute_cap" in header and len(rows) > 1:
        value = rows[1][header.index("compute_cap")].strip()
        if re.fullmatch(r"\d+\.\d+", value):
            into.compute_cap = (value, f"{name}: --query-gpu compute_cap")


def _exporter_sections(text: str) -> list[tuple[str, str]]:
    """The (command, body) sections of an nvidia_gpu_exporter capture; idle ones, not under load."""
    out = []
    parts = re.split(r"^#{20,}\n", text, flags=re.M)
    for head, body in zip(parts[1::2], parts[2::2]):
        title = re.search(r"^# (.+)$", head, re.M)
        cmd = re.search(r"^# \$ (.+)$", head, re.M)
        if title and cmd and not title.group(1).startswith("load ::"):
            out.append((cmd.group(1).strip(), body))
    return out


def classify(text: str) -> str:
    head = text.lstrip()[:4000]
    if head.startswith("<?xml") or head.startswith("<nvidia_smi_log") or "<!DOCTYPE nvidia_smi_log" in head:
        return "xml"
    if "# nvidia_gpu_exporter GPU capture" in head:
        return "exporter"
    if "NVSMI LOG" in head:
        return "query"
    if re.search(r"^\s*(\x1b\[[0-9;]*m)?GPU0\t", head, re.M):
        return "topo"
    if re.search(r"^GPU \d+: .*\(UUID: ", head, re.M):
        return "nvlink"
    if re.search(r"^[0-9a-fA-F]{2,4}:[0-9a-fA-F]{2}\.\d.*NVIDIA", head, re.M) or \
            re.search(r"^[0-9a-fA-F:]+\.\d [^:]+: NVIDIA", head, re.M):
        return "lspci"
    if "CUDA Device Query (Runtime API)" in head or head.startswith("deviceQuery Starting"):
        return "devicequery"
    first = head.splitlines()[0] if head else ""
    if "," in first and "compute_cap" in first:
        return "csv"
    return "unknown"


_PARSERS = {"xml": parse_xml, "query": parse_query_text, "topo": parse_topo, "nvlink": parse_nvlink,
            "lspci": parse_lspci, "csv": parse_query_csv, "devicequery": parse_device_query}


def _command_kind(cmd: str) -> str | None:
    """Which parser reads the output of an exporter section's command line."""
    words = cmd.split()
    if words[:1] == ["lspci"]:
        return "lspci"
    if words[:1] and words[0].endswith("deviceQuery"):
        return "devicequery"
    if words[:1] != ["nvidia-smi"]:
        return None
    rest = words[1:]
    if rest in (["-q", "-x"], ["-x", "-q"]):
        return "xml"
    if rest == ["-q"]:
        return "query"
    if rest[:2] == ["topo", "-m"]:
        return "topo"
    if rest[:2] == ["nvlink", "-s"]:
        return "nvlink"
    if rest and rest[0].startswith("--query-gpu=") and "compute_cap" in rest[0]:
        return "csv"
    return None


def read_captures(files: list[tuple[str, str]]) -> Captures:
    """Parse (name, text) pairs, -q -x first so that it is the ground truth the text checks."""
    caps = Captures()
    kinds = [(classify(text), name, text) for name, text in files]
    for kind, name, _ in kinds:
        if kind == "unknown":
            raise ImportRefused(
                f"{name}: not a capture this command reads (nvidia-smi -q -x, -q, topo -m, nvlink -s, "
                f"--query-gpu=...compute_cap --format=csv, lspci -vvv -d 10de:, CUDA's deviceQuery, or an "
                f"nvidia_gpu_exporter capture)"
            )
    order = {"xml": 0, "exporter": 1, "query": 1}
    for kind, name, text in sorted(kinds, key=lambda k: order.get(k[0], 2)):
        if kind == "exporter":
            for cmd, body in _exporter_sections(text):
                sub = _command_kind(cmd)
                if sub is not None:
                    _PARSERS[sub](body, f"{name} ({cmd.split(' --format')[0][:40]})", caps)
        else:
            _PARSERS[kind](text, name, caps)
    if not caps.gpus:
        raise ImportRefused("no nvidia-smi -q -x or -q capture among the files: nothing names the board")
    return caps


# --- the board: one product, checked across GPUs and captures ------------------------------------

BOARD_IDS = ("product_name", "pci/pci_device_id", "pci/pci_sub_system_id")
IDENTITY_PATHS = (
    "product_name", "product_brand", "product_architecture", "vbios_version", "board_part_number",
    "gpu_part_number", "inforom_version/img_version", "inforom_version/oem_object",
    "inforom_version/ecc_object", "inforom_version/pwr_object", "pci/pci_device_id", "pci/pci_sub_system_id",
    "fb_memory_usage/total", "fb_memory_usage/reserved", "bar1_memory_usage/total",
    "gpu_power_readings/default_power_limit", "gpu_power_readings/max_power_limit", "max_clocks/graphics_clock",
    "max_clocks/mem_clock",
)


def _check_one_board(caps: Captures) -> None:
    first = caps.gpus[0]
    for other in caps.gpus[1:] + caps.text_gpus:
        ids = [(k, first.get(k), other.get(k)) for k in BOARD_IDS if other.get(k) is not None]
        if any(a != b for _, a, b in ids):
            raise ImportRefused(
                f"several different boards: GPU {first.bus_id} is {first.get('product_name')} "
                f"({first.get('pci/pci_device_id')}/{first.get('pci/pci_sub_system_id')}) but GPU {other.bus_id} "
                f"is {other.get('product_name')} ({other.get('pci/pci_device_id')}/"
                f"{other.get('pci/pci_sub_system_id')}); a profile is one board: capture the GPUs of one "
                f"kind (nvidia-smi -q -x -i <their indices>)"
            )
    for other in caps.gpus[1:] + caps.text_gpus:
        where = "-q" if other in caps.text_gpus else "-q -x"
        for k in IDENTITY_PATHS:
            a, b = first.get(k), other.get(k)
            if b is not None and a is not None and a != b:
                caps.notes.append(f"GPU {other.bus_id} ({where}) has {k} {b!r}, GPU {first.bus_id} {a!r}: "
                                  f"the profile takes GPU {first.bus_id}'s")


def _check_branch(driver: str | None, override: str | None) -> str:
    if override:
        return override
    if driver is None:
        raise ImportRefused("the captures give no driver version; give --driver-version")
    try:
        branch = int(driver.split(".")[0])
    except ValueError:
        raise ImportRefused(f"driver version {driver!r} does not look like 580.105.08") from None
    if not OLDEST_BRANCH <= branch <= NEWEST_BRANCH:
        raise ImportRefused(
            f"driver {driver} is branch {branch}, which mokkafs does not model (branches {OLDEST_BRANCH} to "
            f"{NEWEST_BRANCH}: NVML's export table and nvidia-smi's layouts are traced only there); "
            f"import with --driver-version set to a modelled one, e.g. 580.105.08, to simulate the board "
            f"under that driver"
        )
    return driver


# --- the profile -------------------------------------------------------------------------------


@dataclass
class Imported:
    """The result: values by dotted profile key with their origin; what is missing and why."""

    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # required: the profile does not load without
    optional: dict[str, str] = field(default_factory=dict)  # written as null/default unless filled
    filled: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fill_name: str | None = None

    def put(self, key: str, value: Any, origin: str) -> None:
        self.values[key] = value
        self.origin[key] = origin


def _num(v: str) -> float:
    return float(v.split()[0].rstrip("x%"))


def _supported_clocks(listed: list[tuple[str, list[str]]], where: str) -> tuple[list[dict], float]:
    """The profile's clocks.supported and graphics_step_mhz from -q -x's lists: each memory
    clock's graphics clocks are every step (15 MHz; 7.5, printed rounded down, on Blackwell) from
    the top down; a list that is not is refused."""
    try:
        rows = [(int(_num(m)), [int(_num(c)) for c in gr]) for m, gr in listed]
    except (ValueError, IndexError):
        raise ImportRefused(f"{where}: a clock that is not 'N MHz'") from None
    for step in (15, 7.5):
        out = []
        for mem, gr in rows:
            entry = next((e for top in (gr[0], gr[0] + 0.5) if gr
                          for e in [SupportedClock(memory_mhz=mem, graphics_max_mhz=top, graphics_min_mhz=gr[-1])]
                          if graphics_clocks(e, step) == gr), None)
            if entry is None:
                break
            out.append({"memory_mhz": mem, "graphics_max_mhz": entry.graphics_max_mhz, "graphics_min_mhz": gr[-1]})
        else:
            return out, step
    raise ImportRefused(f"{where}: the graphics clocks are not one step apart (15 or 7.5 MHz) from the top down")


def _pair(v: str) -> tuple[int, int]:
    raw = int(v, 16)
    return raw >> 16, raw & 0xFFFF


REQUIRED_REASONS = {
    "compute_capability": "not in -q or -q -x; give --query-gpu=compute_cap --format=csv (or deviceQuery)",
    "sm_count": "no nvidia-smi output or sysfs file reports SMs; give CUDA's deviceQuery output",
    "l2_cache_bytes": "no nvidia-smi output reports the L2 size; give CUDA's deviceQuery output",
    "memory.bus_width_bits": "no nvidia-smi output reports the memory bus width; give CUDA's deviceQuery output",
    "thermal.max_load_c": "a steady temperature at the power limit: the captures are of an idle board",
    "nvlink.links": "-q -x has no NVLink section; give nvidia-smi nvlink -s (or topo -m of a multi-GPU node)",
    "nvlink.version": "no capture prints the NVLink version",
    "nvlink.link_speed_gbps": "only nvidia-smi nvlink -s prints the per-link speed",
    "node.numa_nodes": "give nvidia-smi topo -m (NUMA Affinity column)",
    "node.nvswitches": "give lspci -vvv -d 10de: (NVSwitch bridges), or the NVSwitches are not in this node",
    "node.hcas": "give nvidia-smi topo -m (its NIC legend)",
    "node.hca": "the HCA model (type, PSID, firmware) is not in any NVIDIA capture (ibv_devinfo has it)",
    "clocks.default_app_graphics": "this driver prints 'deprecated' for default application clocks",
    "clocks.default_app_mem": "this driver prints 'deprecated' for default application clocks",
    "power.idle_w": "average and instant power draw are both N/A",
}
OPTIONAL_REASONS = {
    "pci.revision": "nvidia-smi does not print the PCI revision; lspci does (schema default 0xa1)",
    "thermal.memory_max_operating_c": "the board prints only a T.Limit margin for memory, whose reference is not printed",
    "node.nvswitch_device_id": "lspci -nn prints the NVSwitch device id",
    "mig": "MIG tables come from nvidia-smi mig -lgip/-lgipp/-lcip, which this command does not read",
    "max_gpus_per_node": "a form-factor fact (an HGX baseboard's 8, a compute tray's 4) that no capture prints",
    "memory.row_remap_banks": "the capture has no row remapper histogram (no row remapper, or an older driver)",
    "memory.reserved_before_510_mib": "what a driver before 510 holds back is not in a later one's capture",
    "voltage_mv": "the capture prints no graphics voltage (N/A from 570, no Voltage section from 580)",
    "sparse_operation_mode": "the capture has no Sparse Operation Mode (before 535)",
    "clocks.supported": "only -q -x (and -q -d SUPPORTED_CLOCKS) lists the supported clocks",
    "clocks.graphics_step_mhz": "as clocks.supported",
}


def build(caps: Captures, driver_override: str | None = None, fill_board: tuple[str, GpuProfile] | None = None) -> Imported:
    """The profile's values from the captures; every key with its origin, or missing with a reason.
    `fill_board` gives the architecture when the capture's layout does not print it (before 510)."""
    _check_one_board(caps)
    out = Imported(notes=list(caps.notes))
    g = caps.gpus[0]
    gpu0 = f"GPU {g.bus_id}"

    # Older layouts: 555 prints one <power_draw>, 525 and before a <power_readings> section.
    for path in list(g.values):
        if path.startswith("power_readings/"):
            alias = "gpu_" + path
            if alias not in g.values:
                g.values[alias], g.origin[alias] = g.values[path], g.origin[path]
    for alias in ("gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw"):
        if alias not in g.values and "gpu_power_readings/power_draw" in g.values:
            g.values[alias] = g.values["gpu_power_readings/power_draw"]
            g.origin[alias] = g.origin["gpu_power_readings/power_draw"]

    def text(path: str) -> str | None:
        return g.get(path)

    def src(*paths: str) -> str:
        """Where GPU 0's elements were read (-q -x <path> or -q 'Label')."""
        return ", ".join(g.origin.get(p, f"<{p}>") for p in paths)

    def take(key: str, conv=lambda v: v, when=lambda v: v not in (None, "N/A"), path: str | None = None) -> bool:
        """Profile key `key` from the element nvidia-smi's field table reads it from (or `path`)."""
        path = path or BY_PROFILE[key].x[0]
        v = text(path)
        if when(v):
            try:
                value = conv(v)
            except (ValueError, IndexError, OverflowError):
                raise ImportRefused(f"{g.origin[path]}: {key}: {' '.join(str(v).split())[:80]!r} is not what "
                                    "the driver prints there") from None
            out.put(key, value, g.origin[path])
            return True
        return False

    arch = text("product_architecture")
    if arch is None and fill_board is None:
        raise ImportRefused(
            f"the capture does not print the architecture of {text('product_name')} (driver "
            f"{caps.driver_version}: -q and -q -x print Product Architecture from 510 on); give --fill-from "
            f"a shipped board of its architecture, which then gives it too, marked as filled")
    if arch is None:
        arch = fill_board[1].architecture
        out.put("architecture", arch, f"FILLED from {fill_board[0]} (the capture's layout does not print it)")
        out.filled.append("architecture")
    if arch not in ARCHITECTURES:
        raise ImportRefused(f"architecture {arch!r} ({text('product_name')}) is not modelled; "
                            f"mokkafs models {', '.join(ARCHITECTURES)}")
    take("product_name")
    take("product_brand")
    take("architecture")
    if caps.device_query:
        dq = caps.device_query
        if dq["name"] != text("product_name"):
            raise ImportRefused(
                f"several different boards: {dq['origin']} is {dq['name']!r} but GPU {g.bus_id} is "
                f"{text('product_name')!r}; give the deviceQuery of the same node")
        for key, value in dq["values"].items():
            out.put(key, value, dq["origin"])
    if caps.compute_cap:
        out.put("compute_capability", *caps.compute_cap)

    for path in ("pci/pci_device_id", "pci/pci_sub_system_id"):
        if text(path) in (None, "N/A"):
            raise ImportRefused(f"the capture has no {path} for {gpu0}: it cannot name the board")
    dev, ven = _pair(text("pci/pci_device_id"))
    sdev, sven = _pair(text("pci/pci_sub_system_id"))
    out.put("pci.vendor_id", ven, g.origin["pci/pci_device_id"] + " (low 16 bits)")
    out.put("pci.device_id", dev, g.origin["pci/pci_device_id"] + " (high 16 bits)")
    out.put("pci.subsystem_vendor_id", sven, g.origin["pci/pci_sub_system_id"] + " (low 16 bits)")
    out.put("pci.subsystem_device_id", sdev, g.origin["pci/pci_sub_system_id"] + " (high 16 bits)")
    base, sub = text("pci/pci_base_class"), text("pci/pci_sub_class")
    if base not in (None, "N/A") and sub not in (None, "N/A"):
        out.put("pci.class_code", (int(base, 16) << 16) | (int(sub, 16) << 8),
                src("pci/pci_base_class", "pci/pci_sub_class"))
    if caps.lspci and caps.lspci["revision"] is not None:
        out.put("pci.revision", caps.lspci["revision"], caps.lspci["origin"] + " (rev)")
    take("pci.max_link_gen", lambda v: int(_num(v)))
    take("pci.max_link_width", lambda v: int(_num(v)))

    take("memory.total_mib", lambda v: int(_num(v)))
    take("memory.reserved_mib", lambda v: int(_num(v)))
    take("memory.bar1_mib", lambda v: int(_num(v)))
    take("memory.bar1_used_mib", lambda v: int(_num(v)))
    take("memory.ecc", lambda v: v == "Enabled", when=lambda v: v is not None)
    # every bank is in one bucket of the row remapper's histogram: their sum is the bank count
    buckets = [text(f"remapped_rows/row_remapper_histogram/row_remapper_histogram_{x}")
               for x in ("max", "high", "partial", "low", "none")]
    if all(v not in (None, "N/A") for v in buckets):
        out.put("memory.row_remap_banks", sum(int(_num(v)) for v in buckets),
                g.origin["remapped_rows/row_remapper_histogram/row_remapper_histogram_max"] + " (all five buckets)")

    if not take("power.idle_w", lambda v: round(_num(v), 2)):
        take("power.idle_w", lambda v: round(_num(v), 2), path=FIELDS["power.draw.instant"].x[0])
    take("power.default_limit_w", _num)
    take("power.min_limit_w", _num)
    take("power.max_limit_w", _num)

    mhz = lambda v: int(_num(v))  # noqa: E731
    is_mhz = lambda v: v is not None and v.endswith("MHz")  # noqa: E731
    if g.supported_clocks:
        supported, step = _supported_clocks(g.supported_clocks, f"{gpu0}: -q -x <supported_clocks>")
        out.put("clocks.supported", supported, "-q -x <supported_clocks> (each memory clock's first and last)")
        out.put("clocks.graphics_step_mhz", step, "-q -x <supported_clocks> (the step between graphics clocks)")
    take("clocks.idle_graphics", mhz, is_mhz)
    take("clocks.idle_video", mhz, is_mhz)
    take("clocks.max_graphics", mhz, is_mhz)
    take("clocks.max_sm", mhz, is_mhz)
    take("clocks.max_mem", mhz, is_mhz)
    take("clocks.max_video", mhz, is_mhz)
    take("clocks.default_app_graphics", mhz, is_mhz)
    take("clocks.default_app_mem", mhz, is_mhz)

    deg = lambda v: int(_num(v))  # noqa: E731
    take("thermal.idle_c", deg)
    if not take("thermal.memory_idle_c", deg):
        out.put("thermal.memory_idle_c", None, src("temperature/memory_temp") + " N/A")
    tl = text("temperature/gpu_temp_tlimit")
    if tl not in (None, "N/A") and text("temperature/gpu_temp") not in (None, "N/A"):
        t = int(_num(text("temperature/gpu_temp"))) + int(_num(tl))
        out.put("thermal.tlimit_c", t, src("temperature/gpu_temp") + " + " + src("temperature/gpu_temp_tlimit"))
        for key, path in (("shutdown_c", "gpu_temp_max_tlimit_threshold"),
                          ("slowdown_c", "gpu_temp_slow_tlimit_threshold"),
                          ("max_operating_c", "gpu_temp_max_gpu_tlimit_threshold")):
            v = text(f"temperature/{path}")
            if v not in (None, "N/A"):
                out.put(f"thermal.{key}", t - int(_num(v)), f"T.Limit {t} - " + src(f"temperature/{path}"))
        if text("temperature/gpu_temp_max_mem_tlimit_threshold") in (None, "N/A"):
            out.put("thermal.memory_max_operating_c", None, src("temperature/gpu_temp_max_mem_tlimit_threshold") + " N/A")
    else:
        out.put("thermal.tlimit_c", None, src("temperature/gpu_temp_tlimit") + " N/A: absolute thresholds")
        take("thermal.shutdown_c", deg)
        take("thermal.slowdown_c", deg)
        take("thermal.max_operating_c", deg)
        if not take("thermal.memory_max_operating_c", deg):
            out.put("thermal.memory_max_operating_c", None, src("temperature/gpu_temp_max_mem_threshold") + " N/A")

    take("vbios_version")
    take("board_part_number")
    take("gpu_part_number")
    take("inforom.image", when=lambda v: v is not None)
    take("inforom.oem", when=lambda v: v is not None)
    take("inforom.ecc", when=lambda v: v is not None)
    take("inforom.power", when=lambda v: v is not None)

    if caps.nvlink:
        links, speed, origin = caps.nvlink
        out.put("nvlink.links", links, origin)
        out.put("nvlink.link_speed_gbps", speed, origin)
        if links == 0:
            out.put("nvlink.version", 0, origin)
    elif caps.topo and caps.topo["gpus"] > 1:
        out.put("nvlink.links", caps.topo["nvlinks"], caps.topo["origin"] + " (GPU0's NV#)")
        if caps.topo["nvlinks"] == 0:
            out.put("nvlink.version", 0, caps.topo["origin"])
            out.put("nvlink.link_speed_gbps", 0.0, caps.topo["origin"])

    take("mig_capable", lambda v: v != "N/A", when=lambda v: v is not None)
    take("addressing_mode", when=lambda v: v in ("None", "HMM", "ATS"))
    # the idle board's graphics voltage: read where the driver prints one (its N/A from 570 is
    # the branch's, not the board's: the A100's 555 capture has a value, its 570 one N/A)
    take("voltage_mv", lambda v: round(_num(v), 3), when=lambda v: v is not None and v.endswith(" mV"))
    if text("sparse_operation_mode") == "N/A":
        out.put("sparse_operation_mode", None, g.origin["sparse_operation_mode"] + " N/A")
    else:
        take("sparse_operation_mode", when=lambda v: v in ("Disabled", "Enabled"))
    state = text("fabric/state")
    if state is None or state == "N/A":
        out.put("fabric", None, src("fabric/state") + " N/A" if state else "no <fabric> in the capture")
    else:
        out.put("fabric.state", state, g.origin["fabric/state"])
        take("fabric.clique_id", int)
        take("fabric.cluster_uuid")
        flags = {"True": True, "False": False}
        for key, conv in (("summary", str), ("bandwidth", str), ("route_recovery_in_progress", flags.get),
                          ("route_unhealthy", flags.get), ("access_timeout_recovery", flags.get),
                          ("incorrect_configuration", str)):
            path = f"fabric/health/{key}"
            if text(path) is not None:
                v = text(path)
                out.put(f"fabric.health.{key}", None if v == "N/A" else conv(v), g.origin[path])
    fan = text("fan_speed")
    if fan is not None:
        out.put("has_fan", fan != "N/A", g.origin["fan_speed"])
        out.put("fan_speed_pct", None if fan == "N/A" else int(_num(fan)), g.origin["fan_speed"])

    out.put("node.gpus", caps.attached_gpus, caps.top_origin.get("attached_gpus", "attached GPUs"))
    driver = _check_branch(caps.driver_version, driver_override)
    out.put("node.driver_version", driver,
            "--driver-version (the capture's " + str(caps.driver_version) + " is not modelled)"
            if driver_override else caps.top_origin["driver_version"])
    if caps.cuda_version:
        out.put("node.cuda_version", caps.cuda_version, caps.top_origin["cuda_version"])
    if text("pci/pci_domain") not in (None, "N/A"):
        out.put("node.pci_domain", int(text("pci/pci_domain"), 16), g.origin["pci/pci_domain"])
    for what, cap in (("topo -m", caps.topo), ("lspci", caps.lspci)):
        if cap and cap["gpus"] != caps.attached_gpus:
            out.notes.append(f"{cap['origin']} shows {cap['gpus']} GPUs, the node {caps.attached_gpus}: not the same "
                             f"node, so its node facts (NUMA, NICs, NVSwitches) are not used")
    if caps.topo and caps.topo["gpus"] != caps.attached_gpus:
        caps.topo = None
    if caps.lspci and caps.lspci["gpus"] != caps.attached_gpus:
        caps.lspci = None
    if caps.topo:
        if caps.topo["numa_nodes"]:
            out.put("node.numa_nodes", caps.topo["numa_nodes"], caps.topo["origin"] + " (NUMA Affinity)")
        out.put("node.hcas", caps.topo["nics"], caps.topo["origin"] + " (NIC legend)")
        if caps.topo["nics"] == 0:
            out.put("node.hca", None, caps.topo["origin"] + ": no NIC")
    if caps.lspci:
        out.put("node.nvswitches", caps.lspci["nvswitches"], caps.lspci["origin"] + " (NVSwitch bridges)")
        if caps.lspci["nvswitches"] == 0 or caps.lspci["nvswitch_device_id"] is not None:
            out.put("node.nvswitch_device_id", caps.lspci["nvswitch_device_id"], caps.lspci["origin"])

    for key, reason in REQUIRED_REASONS.items():
        if key not in out.values:
            if key == "node.hca" and out.values.get("node.hcas") == 0:
                continue
            out.missing[key] = reason
    for key, reason in OPTIONAL_REASONS.items():
        if key not in out.values:
            if key == "mig" and not out.values.get("mig_capable"):
                continue
            if key == "node.nvswitch_device_id" and out.values.get("node.nvswitches") == 0:
                continue
            out.optional[key] = reason
    # Identity keys the capture lacks (an older driver's layout): required too.
    for key in ("product_name", "product_brand", "architecture", "pci.class_code", "pci.max_link_gen",
                "pci.max_link_width", "memory.total_mib", "memory.reserved_mib", "memory.bar1_mib", "memory.ecc",
                "power.default_limit_w", "power.min_limit_w", "power.max_limit_w", "clocks.idle_graphics",
                "clocks.idle_video", "clocks.max_graphics", "clocks.max_sm", "clocks.max_mem", "clocks.max_video",
                "thermal.idle_c", "thermal.slowdown_c", "thermal.shutdown_c", "thermal.max_operating_c",
                "vbios_version", "board_part_number", "gpu_part_number", "inforom.image", "inforom.oem",
                "inforom.ecc", "mig_capable", "addressing_mode", "has_fan", "node.cuda_version"):
        if key not in out.values and key not in out.missing:
            out.missing[key] = "not in the captures (this driver's layout lacks it)"
    return out


def _flat(data: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and k != "mig":
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def fill(imported: Imported, board: GpuProfile, board_name: str) -> None:
    """Take each missing key (and each optional one) from a shipped board of the same
    architecture, marked as filled; the MIG tables only from the same product."""
    arch = imported.values.get("architecture")
    if board.architecture != arch:
        raise ImportRefused(f"--fill-from {board_name} is {board.architecture}, the capture {arch}: "
                            f"fill from a board of the same architecture")
    imported.fill_name = board_name
    src = _flat(board.model_dump(mode="python"))
    for key in list(imported.missing) + list(imported.optional):
        if key == "mig":
            if board.product_name == imported.values.get("product_name") and board.mig is not None:
                imported.put("mig", board.mig.model_dump(mode="python"), f"FILLED from {board_name} (the same product)")
                imported.filled.append("mig")
            else:
                imported.notes.append(
                    f"mig: not filled: {board_name} is {board.product_name}, not {imported.values.get('product_name')}; "
                    f"its MIG tables would be another board's (mig_capable stays as captured, mig absent)")
            continue
        if key in ("clocks.supported", "clocks.graphics_step_mhz", "memory.reserved_before_510_mib") and \
                board.product_name != imported.values.get("product_name"):
            if key == "clocks.supported":
                imported.notes.append(f"clocks.supported: not filled: {board_name} is {board.product_name}, not "
                                      f"{imported.values.get('product_name')}; its clocks would be another board's "
                                      "(none listed: NVML answers NOT_SUPPORTED)")
            continue
        if key == "node.hca":  # a section: taken whole
            value = board.node.hca.model_dump(mode="python") if board.node.hca else None
        else:
            value = src.get(key)
        captured_switches = imported.values.get("node.nvswitches")
        if key == "node.nvswitch_device_id" and captured_switches not in (None, board.node.nvswitches):
            continue  # a captured switch count of another kind: leave the id at null
        gpus = imported.values.get("node.gpus")
        if key == "node.numa_nodes" and gpus and value and value > gpus:
            # the model gives each NUMA node at least one GPU: a node of fewer GPUs has fewer
            imported.put(key, gpus, f"FILLED from {board_name} ({value}), at most one per GPU of the capture")
            imported.filled.append(key)
            continue
        imported.put(key, value, f"FILLED from {board_name}")
        imported.filled.append(key)
    imported.missing = {k: r for k, r in imported.missing.items() if k not in imported.values}
    imported.optional = {k: r for k, r in imported.optional.items() if k not in imported.values}
    if imported.values.get("node.hcas") and imported.values.get("node.hca") is None and board.node.hca:
        imported.put("node.hca", board.node.hca.model_dump(mode="python"), f"FILLED from {board_name}")
        imported.filled.append("node.hca")


# --- as data and as YAML -------------------------------------------------------------------------


def as_data(imported: Imported, name: str) -> dict[str, Any]:
    """The profile mapping (nested, schema order), ready for GpuProfile.model_validate."""
    values = dict(imported.values)
    values["name"] = name
    data: dict[str, Any] = {}
    for key in _schema_order():
        if key in values:
            v = values[key]
            if key == "fabric" and v is None:
                data["fabric"] = None
                continue
            node = data
            parts = key.split(".")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = v
    return data


def _schema_order() -> list[str]:
    keys: list[str] = []

    def walk(model, prefix):
        for fname, f in model.model_fields.items():
            ann = f.annotation
            models = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and hasattr(a, "model_fields")]
            sub = models[0] if models else None
            key = f"{prefix}{fname}"
            if sub is not None and fname not in ("mig", "hca"):
                keys.append(key)  # the section itself (null as a whole: fabric)
                walk(sub, key + ".")
            else:
                keys.append(key)

    walk(GpuProfile, "")
    return keys


def validate(imported: Imported, name: str) -> GpuProfile:
    try:
        return GpuProfile.model_validate(as_data(imported, name))
    except ValidationError as e:
        raise ImportRefused(f"the imported profile does not load: {validation_problem(e, GpuProfile)}") from None


HEX_KEYS = {"pci.vendor_id", "pci.device_id", "pci.subsystem_vendor_id", "pci.subsystem_device_id",
            "pci.class_code", "pci.revision", "node.nvswitch_device_id", "node.hca.pci_device_id"}


def _scalar(key: str, v: Any) -> str:
    if key in HEX_KEYS and isinstance(v, int):
        return f"0x{v:06x}" if key == "pci.class_code" else f"0x{v:04x}" if key != "pci.revision" else f"0x{v:02x}"
    return yaml.safe_dump([v], default_flow_style=True, width=10**6).strip()[1:-1]


def to_yaml(imported: Imported, name: str, sources: list[str]) -> str:
    """The profile as YAML, one comment per key: the capture element it came from, or FILLED."""
    data = as_data(imported, name)
    out = [f"# {imported.values.get('product_name')}: imported by `mokka profile import` from",
           *(f"#   {s}" for s in sources)]
    if imported.filled:
        out.append(f"# FILLED (not in the captures) from the shipped profile {imported.fill_name}: "
                   + ", ".join(imported.filled))
    for k, reason in sorted(imported.optional.items()):
        out.append(f"# not captured, left at the schema's default: {k} ({reason})")
    for n in imported.notes:
        out.append(f"# note: {n}")

    def line(indent: int, text: str, comment: str | None) -> None:
        s = " " * indent + text
        out.append(f"{s:<40} # {comment}" if comment else s)

    def emit(node: dict, prefix: str, indent: int) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            comment = imported.origin.get(key)
            if key == "mig" and v is not None:
                line(indent, "mig:", comment)
                body = yaml.safe_dump(v, sort_keys=False, default_flow_style=None, width=120)
                out.extend(" " * (indent + 2) + b for b in body.splitlines())
            elif isinstance(v, dict):
                line(indent, f"{k}:", comment)
                emit(v, key + ".", indent + 2)
            else:
                line(indent, f"{k}: {_scalar(key, v)}", comment if key != "name" else "--name / the output file")

    emit(data, "", 0)
    return "\n".join(out) + "\n"


def import_profile(files: list[tuple[str, str]], name: str, fill_board: tuple[str, GpuProfile] | None = None,
                   driver_version: str | None = None) -> tuple[Imported, GpuProfile, str]:
    """Captures (name, text) -> (what was read, the validated profile, its YAML). Refuses
    (ImportRefused) when a required key is missing and no fill board is given."""
    caps = read_captures(files)
    imported = build(caps, driver_version, fill_board)
    if fill_board is not None:
        fill(imported, fill_board[1], fill_board[0])
    if imported.missing:
        listing = "\n".join(f"  {k}: {r}" for k, r in imported.missing.items())
        raise ImportRefused(
            "the captures cannot give these keys, and a profile without them would not load:\n" + listing
            + "\ngive --fill-from PROFILE (a shipped board of the same architecture) to take them from it, "
              "marked as filled"
        )
    try:
        profile = validate(imported, name)
    except ImportRefused as e:
        raise ImportRefused(f"{', '.join(n for n, _ in files)}: {e}") from None
    text = to_yaml(imported, name, [n for n, _ in files])
    return imported, profile, text
