"""Reads every surface of a mounted node from inside `mokka run` and prints one JSON document.

Run as `mokka run --root MNT -- python tests/surface_probe.py MNT METRICS_URL PLAN`, where PLAN
is a JSON list of fault steps `{"name", "gpu", "writes": [[file, data], ...]}`. The probe reads
everything once (the baseline), then per step writes the control files, reads the faulted GPU
through every surface, and resets it. It judges nothing: tests/test_cross_surface.py compares.
Surfaces: NVML (pynvml), CUDA (ctypes on libcuda.so.1), our nvidia-smi (-q -x, --query-gpu,
topo -m), sysfs and procfs at their real paths, /dev, /metrics and the control files.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pynvml as N

from mokkafs.model.smi_fields import FIELDS

# The facts read through nvidia-smi, by nvidia-smi's field table (shims/nvidia-smi/fields.yaml):
# --query-gpu by their names, -q -x at their elements (the newest layout's), each under the name
# tests/test_cross_surface.py compares.
QUERY = ",".join(FIELDS[f].query[0] for f in (
    "index", "name", "uuid", "serial", "pci.bus_id", "pci.device_id", "pci.sub_device_id", "memory.total",
    "memory.reserved", "memory.used", "memory.free", "power.limit", "power.default_limit", "power.min_limit",
    "power.max_limit", "clocks.current.graphics", "clocks.current.sm", "clocks.current.memory", "clocks.max.graphics",
    "clocks.max.sm", "clocks.max.memory", "remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending",
    "ecc.errors.uncorrected.volatile.total", "fan.speed", "fabric.state"))
XML_FACTS = {
    "name": "name", "uuid": "uuid", "serial": "serial", "minor": "x.minor_number", "bus_id": "pci.bus_id",
    "device_id": "pci.device_id", "subsystem_id": "pci.sub_device_id", "fb_total": "memory.total",
    "fb_reserved": "memory.reserved", "fb_used": "memory.used", "fb_free": "memory.free", "bar1_total": "x.bar1.total",
    "bar1_used": "x.bar1.used", "shutdown": "x.temp.shutdown", "slowdown": "x.temp.slowdown", "gpu_max": "x.temp.max_gpu",
    "mem_max": "x.temp.max_mem", "power_limit": "enforced.power.limit", "power_default": "power.default_limit",
    "power_min": "power.min_limit", "power_max": "power.max_limit", "clock_graphics": "clocks.current.graphics",
    "clock_sm": "clocks.current.sm", "clock_mem": "clocks.current.memory", "max_graphics": "clocks.max.graphics",
    "max_sm": "clocks.max.sm", "max_mem": "clocks.max.memory", "fan": "fan.speed", "fabric_state": "fabric.state",
    "remap_pending": "remapped_rows.pending", "remap_failure": "remapped_rows.failure",
    "retired_pending": "retired_pages.pending", "dbe_volatile": "ecc.errors.uncorrected.volatile.dram",
}
LEVELS = (N.NVML_TOPOLOGY_INTERNAL, N.NVML_TOPOLOGY_SINGLE, N.NVML_TOPOLOGY_MULTIPLE, N.NVML_TOPOLOGY_HOSTBRIDGE,
          N.NVML_TOPOLOGY_NODE, N.NVML_TOPOLOGY_SYSTEM)
THRESHOLDS = {"shutdown": 0, "slowdown": 1, "mem_max": 2, "gpu_max": 3}
SYSFS_GPU_ATTRS = ("subsystem_vendor", "subsystem_device", "numa_node", "local_cpulist", "local_cpus")


def error(e: N.NVMLError) -> str:
    names = {v: k for k, v in vars(N).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)}
    return "ERR:" + names.get(e.value, str(e.value)).removeprefix("NVML_ERROR_")


def call(fn, *args):
    """fn's value, or "ERR:<NVML error name>"."""
    try:
        v = fn(*args)
    except N.NVMLError as e:
        return error(e)
    return v.decode() if isinstance(v, bytes) else v


def mask_list(words, bits: int = 64) -> list[int]:
    return [w * bits + b for w, word in enumerate(words) for b in range(bits) if word >> b & 1]


def nvml_gpu(i: int, count: int) -> dict:
    h = N.nvmlDeviceGetHandleByIndex(i)
    out: dict = {}
    out["name"] = call(N.nvmlDeviceGetName, h)
    out["uuid"] = call(N.nvmlDeviceGetUUID, h)
    out["serial"] = call(N.nvmlDeviceGetSerial, h)
    out["minor"] = call(N.nvmlDeviceGetMinorNumber, h)
    pci = call(N.nvmlDeviceGetPciInfo_v3, h)
    out["pci"] = pci if isinstance(pci, str) else {
        "bus_id": pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
        "domain": pci.domain, "bus": pci.bus, "device": pci.device,
        "device_id": pci.pciDeviceId, "subsystem_id": pci.pciSubSystemId}
    mem = call(N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2)
    out["memory"] = mem if isinstance(mem, str) else {"total": mem.total, "reserved": mem.reserved,
                                                       "used": mem.used, "free": mem.free}
    bar1 = call(N.nvmlDeviceGetBAR1MemoryInfo, h)
    out["bar1"] = bar1 if isinstance(bar1, str) else {"total": bar1.bar1Total, "used": bar1.bar1Used}
    out["thresholds"] = {k: call(N.nvmlDeviceGetTemperatureThreshold, h, t) for k, t in THRESHOLDS.items()}
    out["power"] = {
        "limit": call(N.nvmlDeviceGetPowerManagementLimit, h),
        "default": call(N.nvmlDeviceGetPowerManagementDefaultLimit, h),
        "enforced": call(N.nvmlDeviceGetEnforcedPowerLimit, h),
        "constraints": call(N.nvmlDeviceGetPowerManagementLimitConstraints, h),
    }
    out["clocks"] = {k: call(N.nvmlDeviceGetClockInfo, h, t) for k, t in
                     (("graphics", N.NVML_CLOCK_GRAPHICS), ("sm", N.NVML_CLOCK_SM), ("mem", N.NVML_CLOCK_MEM))}
    out["max_clocks"] = {k: call(N.nvmlDeviceGetMaxClockInfo, h, t) for k, t in
                         (("graphics", N.NVML_CLOCK_GRAPHICS), ("sm", N.NVML_CLOCK_SM), ("mem", N.NVML_CLOCK_MEM))}
    cpus = call(N.nvmlDeviceGetCpuAffinity, h, 16)
    out["cpus"] = cpus if isinstance(cpus, str) else mask_list(list(cpus))
    for scope_name, scope in (("node", N.NVML_AFFINITY_SCOPE_NODE), ("socket", N.NVML_AFFINITY_SCOPE_SOCKET)):
        c = call(N.nvmlDeviceGetCpuAffinityWithinScope, h, 16, scope)
        out[f"cpus_{scope_name}"] = c if isinstance(c, str) else mask_list(list(c))
    mem_aff = call(N.nvmlDeviceGetMemoryAffinity, h, 1, N.NVML_AFFINITY_SCOPE_NODE)
    out["numa"] = mem_aff if isinstance(mem_aff, str) else mask_list(list(mem_aff))
    out["fan"] = call(N.nvmlDeviceGetFanSpeed, h)
    rows = call(N.nvmlDeviceGetRemappedRows, h)
    out["remapped"] = rows if isinstance(rows, str) else list(rows)
    out["retired_pending"] = call(N.nvmlDeviceGetRetiredPagesPendingStatus, h)
    out["dbe_volatile"] = call(N.nvmlDeviceGetTotalEccErrors, h, N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                               N.NVML_VOLATILE_ECC)
    links = []
    for link in range(N.NVML_NVLINK_MAX_LINKS):
        state = call(N.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str):
            break
        remote = call(N.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        links.append({
            "state": state,
            "type": call(N.nvmlDeviceGetNvLinkRemoteDeviceType, h, link),
            "remote": remote if isinstance(remote, str) else {
                "bus_id": remote.busId.decode() if isinstance(remote.busId, bytes) else remote.busId,
                "domain": remote.domain, "bus": remote.bus, "device": remote.device,
                "device_id": remote.pciDeviceId},
        })
    out["nvlinks"] = links
    out["topology"] = {}
    for j in range(count):
        other = call(N.nvmlDeviceGetHandleByIndex, j)
        if j != i:
            out["topology"][str(j)] = other if isinstance(other, str) else call(
                N.nvmlDeviceGetTopologyCommonAncestor, h, other)
    out["nearest"] = {}
    for level in LEVELS:
        near = call(N.nvmlDeviceGetTopologyNearestGpus, h, level)
        out["nearest"][str(level)] = near if isinstance(near, str) else sorted(
            N.nvmlDeviceGetIndex(d) for d in near)
    return out


def cuda_gpus() -> list[dict] | str:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"ERR:{e}"
    if cu.cuInit(0):
        return "ERR:cuInit"
    n = ctypes.c_int()
    cu.cuDeviceGetCount(ctypes.byref(n))
    out = []
    for i in range(n.value):
        dev = ctypes.c_int()
        cu.cuDeviceGet(ctypes.byref(dev), i)
        name = ctypes.create_string_buffer(256)
        cu.cuDeviceGetName(name, 256, dev)
        bus = ctypes.create_string_buffer(64)
        cu.cuDeviceGetPCIBusId(bus, 64, dev)
        total = ctypes.c_size_t()
        cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev)

        def attr(a: int) -> int | str:
            v = ctypes.c_int()
            r = cu.cuDeviceGetAttribute(ctypes.byref(v), a, dev)
            return v.value if r == 0 else f"ERR:{r}"

        # CUdevice_attribute: 39 MAX_THREADS_PER_MULTIPROCESSOR, 81 MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        # 97 MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 106 MAX_BLOCKS_PER_MULTIPROCESSOR,
        # 87 SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO, 134 NUMA_ID
        out.append({"name": name.value.decode(), "bus_id": bus.value.decode(), "total": total.value,
                    "limits": {str(a): attr(a) for a in (39, 81, 97, 106, 87)}, "numa_id": attr(134)})
    return out


def smi(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)


def smi_xml(only: int | None = None) -> dict:
    r = smi("-q", "-x", *(() if only is None else ("-i", str(only))))
    try:
        root = ET.fromstring(r.stdout)
    except ET.ParseError:  # a lost GPU asked for alone: nvidia-smi says so instead
        return {"rc": r.returncode, "gpus": {}, "text": r.stdout[:300]}
    gpus = {}
    for g in root.findall("gpu"):
        def t(path: str) -> str | None:
            e = g.find(path)
            return None if e is None else (e.text or "").strip()

        gpus[g.get("id")] = {k: t(FIELDS[fact].x[0]) for k, fact in XML_FACTS.items()}
    return {"rc": r.returncode, "gpus": gpus}


def smi_query(*extra: str) -> dict:
    # only the fields the driver's branch knows: before 570 nvidia-smi refuses, as NVIDIA's 550
    # does, a field of later branches (remapped_rows.pending)
    known = set(re.findall(r'^"([^"]+)"(?: or "([^"]+)")?', smi("--help-query-gpu").stdout, re.M))
    known_names = {n for pair in known for n in pair if n}
    names = [f for f in QUERY.split(",") if f in known_names]
    r = smi(f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits", *extra)
    rows = [dict(zip(names, (c.strip() for c in line.split(",")))) for line in r.stdout.splitlines() if "," in line]
    return {"rc": r.returncode, "rows": rows, "text": r.stdout}


def smi_topo() -> dict:
    r = smi("topo", "-m")
    lines = r.stdout.splitlines()
    head = [c for c in lines[0].replace("\x1b[4m", "").replace("\x1b[0m", "").split("\t") if c] if lines else []
    rows = {}
    for line in lines[1:]:
        if not line.startswith("GPU"):
            break
        cells = line.split("\t")
        rows[cells[0]] = cells[1:]
    return {"rc": r.returncode, "head": head, "rows": rows}


def read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def sysfs(full: bool = True) -> dict:
    """Every PCI function by its sysfs name; with `full`, what the tests compare: ids, class,
    driver and path of each, NUMA and CPUs of the display controllers, config space of bridges."""
    devices: dict = {}
    base = Path("/sys/bus/pci/devices")
    for d in sorted(base.iterdir()):
        if not full:
            devices[d.name] = None
            continue
        entry = {a: read(d / a) for a in ("vendor", "device", "class")}
        entry["path"] = os.path.realpath(d)
        entry["driver"] = os.path.basename(os.readlink(d / "driver")) if (d / "driver").is_symlink() else None
        if (entry["class"] or "").startswith("0x03"):
            entry.update({a: read(d / a) for a in SYSFS_GPU_ATTRS})
        if (entry["class"] or "").startswith("0x0604"):
            entry["config"] = (d / "config").read_bytes()[:256].hex()
        devices[d.name] = entry
    return devices


def procfs() -> dict:
    out = {}
    base = Path("/proc/driver/nvidia/gpus")
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        info = {}
        for line in (read(d / "information") or "").splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
        out[d.name] = info
    return out


def dev_nodes() -> dict:
    out = {}
    for p in sorted(Path("/dev").glob("nvidia[0-9]*")):
        st = os.stat(p)
        out[p.name] = [os.major(st.st_rdev), os.minor(st.st_rdev)]
    return out


def control(mnt: Path, i: int) -> dict:
    g = mnt / f"gpu{i}"
    info = dict(line.split(": ", 1) for line in (read(g / "info") or "").splitlines())
    return {"info": info, **{f: read(g / f) for f in ("memory_used", "clocks", "nvlink", "inject_ecc", "inject_xid",
                                                       "lost")}}


def metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def snapshot(mnt: Path, url: str, count: int, only: int | None = None) -> dict:
    """Every surface; after a fault (`only` = the faulted GPU) sysfs is only listed, and -q -x
    and the control files are read for that GPU alone."""
    N.nvmlInit()
    try:
        nvml = {}
        for i in range(count):
            try:
                nvml[str(i)] = nvml_gpu(i, count)
            except N.NVMLError as e:
                nvml[str(i)] = error(e)
    finally:
        N.nvmlShutdown()
    return {
        "nvml": nvml, "smi_xml": smi_xml(only), "smi_query": smi_query(), "smi_topo": smi_topo(),
        "sysfs": sysfs(full=only is None), "procfs": procfs(),
        "dev": dev_nodes(), "metrics": metrics(url),
        "control": {str(i): control(mnt, i) for i in range(count) if only is None or i == only},
    }


def set_cpu_affinity(count: int) -> dict:
    """What nvmlDeviceSetCpuAffinity pins this thread to, per GPU, and what it printed."""
    N.nvmlInit()
    out = {}
    try:
        before = sorted(os.sched_getaffinity(0))
        for i in range(count):
            h = N.nvmlDeviceGetHandleByIndex(i)
            out[str(i)] = {"rc": call(N.nvmlDeviceSetCpuAffinity, h), "pinned": sorted(os.sched_getaffinity(0))}
            call(N.nvmlDeviceClearCpuAffinity, h)
            out[str(i)]["cleared"] = sorted(os.sched_getaffinity(0))
        out["host"] = before
    finally:
        N.nvmlShutdown()
    return out


def write(path: Path, data: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data.encode())
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def main() -> None:
    mnt, url, plan = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    count = int(read(mnt / "node" / "gpu_count"))
    result = {"count": count, "cuda": cuda_gpus(), "baseline": snapshot(mnt, url, count),
              "affinity": set_cpu_affinity(count), "faults": []}
    for step in plan:
        errs = [write(mnt / f"gpu{step['gpu']}" / f, d) for f, d in step["writes"]]
        result["faults"].append({**step, "errnos": errs, "snap": snapshot(mnt, url, count, only=step["gpu"])})
        write(mnt / f"gpu{step['gpu']}" / "reset", "1\n")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
