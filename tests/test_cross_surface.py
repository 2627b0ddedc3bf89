"""One fact, every surface that shows it, one answer.

For every shipped profile, one mount (with `--metrics`) and one probe process under `mokka run`
(tests/surface_probe.py) read the node through NVML (pynvml), CUDA, our nvidia-smi (-q -x,
--query-gpu, topo -m), sysfs, procfs and /dev at their real paths, /metrics and the control
files, before and after each kind of fault. Each test here compares one family of facts across
those surfaces: identity, memory, thresholds, power limits, clocks, NUMA and CPU affinity,
NVLink remote PCI devices against sysfs, topology levels against the PCI tree, and health.
This is the guard that keeps "one model, every surface a view of it" true as the tree grows.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MountedNode, force_unmount, mokka_cmd
from prometheus_client.parser import text_string_to_metric_families

from mokkafs.model.profiles import available_profiles
from helpers import free_port

pytestmark = pytest.mark.level("cross")

PROBE = Path(__file__).with_name("surface_probe.py")
MIB = 1 << 20
# nvmlGpuTopologyLevel_t
INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM = 0, 10, 20, 30, 40, 50
TOPO_WORDS = {SINGLE: "PIX", MULTIPLE: "PXB", HOSTBRIDGE: "PHB", NODE: "NODE", SYSTEM: "SYS"}
NVLINK_GPU, NVLINK_SWITCH = 0, 2  # nvmlIntNvLinkDeviceType_t


def fault_plan(links: bool, gpu: int) -> list[dict]:
    steps = [("lost", "lost", "1"), ("xid79", "inject_xid", "79"), ("xid48", "inject_xid", "48"),
             ("xid64", "inject_xid", "64"), ("ecc_dbe", "inject_ecc", "dbe 2"), ("xid13", "inject_xid", "13"),
             ("xid119", "inject_xid", "119")]
    if links:
        steps += [("nvlink_down", "nvlink", "0 down"), ("xid74", "inject_xid", "74")]
    return [{"name": name, "gpu": gpu, "writes": [[f, data + "\n"]]} for name, f, data in steps]


class Seen(dict):
    """The probe's output for one profile; short in a failure report."""

    def __repr__(self) -> str:
        return f"<surfaces of a {self['profile'].name} node>"


@pytest.fixture(scope="module", params=available_profiles())
def seen(request, tmp_path_factory):
    """The probe's JSON for one mounted node of this profile."""
    from mokkafs.model.profiles import load_profile

    profile = load_profile(request.param)
    node = MountedNode(tmp_path_factory.mktemp(f"xs-{request.param}"), request.param)
    url = f"http://127.0.0.1:{free_port()}/metrics"
    node.mount(("--metrics", url.removeprefix("http://").removesuffix("/metrics")))
    try:
        count = int(node.read("node/gpu_count"))
        plan = fault_plan(profile.nvlink.links > 0, count - 1)
        r = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", sys.executable, str(PROBE),
                            str(node.mnt), url, json.dumps(plan)],
                           capture_output=True, text=True, env=node.env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        data = json.loads(r.stdout)
        data["probe_stderr"] = r.stderr
    finally:
        node.umount()
        force_unmount(node.mnt)
    problems = node.unexpected_log_lines()
    assert problems == [], problems
    data["profile"] = profile
    return Seen(data)


# --- how each surface spells things ------------------------------------------------------------


def cpulist(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if part and part != "N/A":
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    return out


def cpumask(text: str) -> list[int]:
    value = int(text.replace(",", ""), 16)
    return [b for b in range(value.bit_length()) if value >> b & 1]


def mib(text: str) -> int:
    return int(text.removesuffix(" MiB"))


def watts_mw(text: str) -> int:
    return round(float(text.removesuffix(" W")) * 1000)


def mhz(text: str) -> int:
    return int(text.removesuffix(" MHz"))


def sysfs_bdf(bus_id: str) -> str:
    """`00000000:18:00.0` (NVML) or `0000:18:00.0` (CUDA) -> `0000:18:00.0` (sysfs)."""
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def metrics(text: str) -> dict[str, dict[str, float]]:
    """metric -> gpu index -> value; and `labels` -> gpu index -> the DCGM labels."""
    out: dict = {"labels": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "gpu" in s.labels:
                out.setdefault(fam.name, {})[s.labels["gpu"]] = s.value
                out["labels"][s.labels["gpu"]] = s.labels
    return out


def gpus(seen: dict, snap: dict | None = None):
    """(index, NVML's record, -q -x record, --query-gpu row, control files) per GPU."""
    snap = snap or seen["baseline"]
    rows = {r["index"]: r for r in snap["smi_query"]["rows"]}
    for i in range(seen["count"]):
        nv = snap["nvml"][str(i)]
        xml = snap["smi_xml"]["gpus"].get(nv["pci"]["bus_id"]) if isinstance(nv, dict) else None
        yield i, nv, xml, rows.get(str(i)), snap["control"][str(i)]


def port_type(config_hex: str) -> int | None:
    """The PCIe capability's device/port type (bits 7:4), walked from config space as lspci does."""
    cfg = bytes.fromhex(config_hex)
    ptr = cfg[0x34] if cfg[0x06] & 0x10 else 0
    while ptr:
        if cfg[ptr] == 0x10:
            return cfg[ptr + 2] >> 4 & 0xF
        ptr = cfg[ptr + 1]
    return None


def level_from_sysfs(sysfs: dict, a: str, b: str) -> int:
    """nvmlGpuTopologyLevel_t of two devices, from their sysfs paths, port types and NUMA nodes."""
    pa, pb = sysfs[a]["path"].split("/")[3:-1], sysfs[b]["path"].split("/")[3:-1]
    host_a, host_b = sysfs[a]["path"].split("/")[3], sysfs[b]["path"].split("/")[3]
    bridges_a, bridges_b = pa[1:], pb[1:]
    common = 0
    while common < min(len(bridges_a), len(bridges_b)) and bridges_a[common] == bridges_b[common]:
        common += 1
    if common:
        top = bridges_a[common - 1]
        # Below one switch's upstream port the path crosses that switch only.
        return SINGLE if port_type(sysfs[top]["config"]) == 0x5 else MULTIPLE
    if host_a == host_b:
        return HOSTBRIDGE
    return NODE if sysfs[a]["numa_node"] == sysfs[b]["numa_node"] else SYSTEM


# --- identity ----------------------------------------------------------------------------------


def test_identity(seen):
    snap = seen["baseline"]
    m = metrics(snap["metrics"])
    assert len(snap["nvml"]) == len(snap["smi_query"]["rows"]) == len(snap["procfs"]) == seen["count"]
    for i, nv, xml, row, ctl in gpus(seen):
        info, bdf = ctl["info"], sysfs_bdf(nv["pci"]["bus_id"])
        labels, proc, sysfs = m["labels"][str(i)], snap["procfs"][bdf], snap["sysfs"][bdf]
        names = {nv["name"], xml["name"], row["name"], info["name"], proc["Model"], labels["modelName"]}
        assert names == {seen["profile"].product_name}, (i, names)
        assert {nv["uuid"], xml["uuid"], row["uuid"], info["uuid"], proc["GPU UUID"], labels["UUID"]} == {nv["uuid"]}
        assert {nv["serial"], xml["serial"], row["serial"], info["serial"]} == {nv["serial"]}
        bus_ids = {nv["pci"]["bus_id"], xml["bus_id"], row["pci.bus_id"], info["bus_id"], labels["pci_bus_id"]}
        assert bus_ids == {nv["pci"]["bus_id"]}, (i, bus_ids)
        assert proc["Bus Location"] == bdf and sysfs["driver"] == "nvidia"
        assert (nv["pci"]["domain"], nv["pci"]["bus"], nv["pci"]["device"]) == tuple(
            int(x, 16) for x in re.split("[:.]", bdf)[:3])
        assert {nv["minor"], int(xml["minor"]), int(info["minor"]), int(proc["Device Minor"])} == {nv["minor"]}
        assert snap["dev"][f"nvidia{nv['minor']}"] == [195, nv["minor"]]
        assert int(info["index"]) == i and labels["device"] == f"nvidia{nv['minor']}"
        device_id = int(sysfs["device"], 16) << 16 | int(sysfs["vendor"], 16)
        subsystem = int(sysfs["subsystem_device"], 16) << 16 | int(sysfs["subsystem_vendor"], 16)
        assert {nv["pci"]["device_id"], int(xml["device_id"], 16), int(row["pci.device_id"], 16)} == {device_id}
        assert {nv["pci"]["subsystem_id"], int(xml["subsystem_id"], 16),
                int(row["pci.sub_device_id"], 16)} == {subsystem}
        cuda = seen["cuda"][i]
        assert cuda["name"] == nv["name"] and sysfs_bdf(cuda["bus_id"]) == bdf


# --- memory, thresholds, power, clocks ---------------------------------------------------------


def test_memory(seen):
    m = metrics(seen["baseline"]["metrics"])
    for i, nv, xml, row, ctl in gpus(seen):
        mem = nv["memory"]
        assert {mem["total"], mib(xml["fb_total"]) * MIB, int(row["memory.total"]) * MIB,
                seen["cuda"][i]["total"]} == {mem["total"]}
        assert {mem["reserved"], mib(xml["fb_reserved"]) * MIB, int(row["memory.reserved"]) * MIB,
                m["DCGM_FI_DEV_FB_RESERVED"][str(i)] * MIB} == {mem["reserved"]}
        assert {mem["used"], mib(xml["fb_used"]) * MIB, int(row["memory.used"]) * MIB,
                m["DCGM_FI_DEV_FB_USED"][str(i)] * MIB, int(ctl["memory_used"]) * MIB} == {mem["used"]}
        assert {mem["free"], mib(xml["fb_free"]) * MIB, int(row["memory.free"]) * MIB,
                m["DCGM_FI_DEV_FB_FREE"][str(i)] * MIB} == {mem["free"]}
        assert mem["total"] == mem["reserved"] + mem["used"] + mem["free"]
        assert (nv["bar1"]["total"], nv["bar1"]["used"]) == (mib(xml["bar1_total"]) * MIB, mib(xml["bar1_used"]) * MIB)


def test_temperature_thresholds(seen):
    for i, nv, xml, row, ctl in gpus(seen):
        for name, value in nv["thresholds"].items():
            shown = xml[name]
            if isinstance(value, str):  # NVML has none: nvidia-smi shows none
                assert shown in (None, "N/A"), (i, name, value, shown)
            elif shown is not None:  # -q -x shows absolute thresholds where the board has no T.Limit
                assert shown == f"{value} C", (i, name, value, shown)


def test_power_limits(seen):
    for i, nv, xml, row, ctl in gpus(seen):
        p = nv["power"]
        lo, hi = p["constraints"]
        assert {p["limit"], p["enforced"], watts_mw(xml["power_limit"]), watts_mw(row["power.limit"] + " W")} == {
            p["limit"]}
        assert {p["default"], watts_mw(xml["power_default"]), watts_mw(row["power.default_limit"] + " W")} == {
            p["default"]}
        assert (lo, hi) == (watts_mw(xml["power_min"]), watts_mw(xml["power_max"]))
        assert (lo, hi) == (watts_mw(row["power.min_limit"] + " W"), watts_mw(row["power.max_limit"] + " W"))


def test_clocks(seen):
    m = metrics(seen["baseline"]["metrics"])
    for i, nv, xml, row, ctl in gpus(seen):
        c, mx = nv["clocks"], nv["max_clocks"]
        assert (c["graphics"], c["sm"], c["mem"]) == (mhz(xml["clock_graphics"]), mhz(xml["clock_sm"]),
                                                      mhz(xml["clock_mem"]))
        assert (c["graphics"], c["sm"], c["mem"]) == (int(row["clocks.current.graphics"]),
                                                      int(row["clocks.current.sm"]), int(row["clocks.current.memory"]))
        assert (c["sm"], c["mem"]) == (m["DCGM_FI_DEV_SM_CLOCK"][str(i)], m["DCGM_FI_DEV_MEM_CLOCK"][str(i)])
        assert ctl["clocks"] == f"{c['sm']} {c['mem']}"
        assert (mx["graphics"], mx["sm"], mx["mem"]) == (mhz(xml["max_graphics"]), mhz(xml["max_sm"]),
                                                         mhz(xml["max_mem"]))
        assert (mx["graphics"], mx["sm"], mx["mem"]) == (int(row["clocks.max.graphics"]), int(row["clocks.max.sm"]),
                                                         int(row["clocks.max.memory"]))


# --- NUMA and CPU affinity ---------------------------------------------------------------------


def test_numa_and_cpu_affinity(seen):
    snap = seen["baseline"]
    topo = snap["smi_topo"]
    cpu_col, numa_col = topo["head"].index("CPU Affinity"), topo["head"].index("NUMA Affinity")
    for i, nv, xml, row, ctl in gpus(seen):
        sysfs = snap["sysfs"][sysfs_bdf(nv["pci"]["bus_id"])]
        numa = int(sysfs["numa_node"])
        cells = topo["rows"][f"GPU{i}"]
        assert nv["numa"] == [numa], (i, nv["numa"], numa)
        assert int(ctl["info"]["numa_node"]) == numa and seen["cuda"][i]["numa_id"] == numa
        assert cells[numa_col] == str(numa), (i, cells)
        cpus = cpulist(sysfs["local_cpulist"])
        assert cpumask(sysfs["local_cpus"]) == cpus
        assert nv["cpus"] == cpus, f"GPU{i}: NVML CPU affinity {nv['cpus'][:8]}... vs sysfs {sysfs['local_cpulist']}"
        assert nv["cpus_node"] == nv["cpus_socket"] == cpus
        assert cpulist(cells[cpu_col]) == cpus, (i, cells[cpu_col], sysfs["local_cpulist"])


def test_set_cpu_affinity_pins_to_the_part_of_the_mask_the_host_has(seen):
    aff = seen["affinity"]
    host = set(aff["host"])
    for i, nv, xml, row, ctl in gpus(seen):
        wanted = set(nv["cpus"]) & host
        assert aff[str(i)]["rc"] is None, aff[str(i)]
        assert set(aff[str(i)]["pinned"]) == (wanted or host), (i, aff[str(i)], sorted(wanted))
        assert set(aff[str(i)]["cleared"]) == host
    # Said at most once per process, however many GPUs were pinned.
    assert seen["probe_stderr"].count("nvmlDeviceSetCpuAffinity") <= 1, seen["probe_stderr"]


# --- NVLink and topology -----------------------------------------------------------------------


def test_nvlink_remote_devices_exist_in_sysfs(seen):
    snap = seen["baseline"]
    links = seen["profile"].nvlink.links
    for i, nv, xml, row, ctl in gpus(seen):
        assert len(nv["nvlinks"]) == links
        assert len(ctl["nvlink"].splitlines()) == links
        for link, nl in enumerate(nv["nvlinks"]):
            remote = nl["remote"]
            if isinstance(remote, str):
                # No PCI function to name (a switch the host does not enumerate): say so, never invent.
                assert remote == "ERR:NOT_SUPPORTED" and nl["type"] == NVLINK_SWITCH, (i, link, nl)
                continue
            bdf = sysfs_bdf(remote["bus_id"])
            assert bdf in snap["sysfs"], f"GPU{i} link {link}: NVML names {remote['bus_id']}, absent from sysfs"
            dev = snap["sysfs"][bdf]
            assert (remote["domain"], remote["bus"], remote["device"]) == tuple(
                int(x, 16) for x in re.split("[:.]", bdf)[:3])
            assert remote["device_id"] == int(dev["device"], 16) << 16 | int(dev["vendor"], 16), (i, link, remote, dev)
            expected_driver = {NVLINK_SWITCH: "nvidia-nvswitch", NVLINK_GPU: "nvidia"}[nl["type"]]
            assert dev["driver"] == expected_driver, (i, link, nl, dev)


def test_topology_levels_follow_the_pci_tree(seen):
    snap = seen["baseline"]
    topo = snap["smi_topo"]
    bdfs = {i: sysfs_bdf(nv["pci"]["bus_id"]) for i, nv, *_ in gpus(seen)}
    for i, nv, xml, row, ctl in gpus(seen):
        cells = topo["rows"][f"GPU{i}"]
        assert cells[i] == " X "
        for j in range(seen["count"]):
            if j == i:
                continue
            level = level_from_sysfs(snap["sysfs"], bdfs[i], bdfs[j])
            assert nv["topology"][str(j)] == level, (i, j, nv["topology"][str(j)], level)
            links = _nvlinks_between(nv, snap["nvml"][str(j)])
            assert cells[j] == (f"NV{links}" if links else TOPO_WORDS[level]), (i, j, cells[j], level, links)
            assert topo["rows"][f"GPU{j}"][i] == cells[j], f"topo -m is not symmetric: GPU{i}/GPU{j} {cells[j]}"
        for lvl, near in nv["nearest"].items():
            assert near == [j for j in range(seen["count"]) if j != i and
                            level_from_sysfs(snap["sysfs"], bdfs[i], bdfs[j]) <= int(lvl)], (i, lvl, near)


def _nvlinks_between(a: dict, b: dict) -> int:
    """NV# as nvidia-smi counts it: links from a to b, or through switches the fewer of both."""
    up = [nl for nl in a["nvlinks"] if nl["state"] == 1]
    direct = sum(1 for nl in up if isinstance(nl["remote"], dict) and nl["remote"]["bus_id"] == b["pci"]["bus_id"])
    if direct:
        return direct
    sw_a = sum(1 for nl in up if nl["type"] == NVLINK_SWITCH)
    sw_b = sum(1 for nl in b["nvlinks"] if nl["state"] == 1 and nl["type"] == NVLINK_SWITCH)
    return min(sw_a, sw_b)


# --- health after each fault -------------------------------------------------------------------


def _yes(text: str | None) -> bool | None:
    return None if text in (None, "N/A", "[N/A]") else text == "Yes"


def test_health_after_each_fault(seen):
    base = seen["baseline"]
    for step in seen["faults"]:
        g, snap = step["gpu"], step["snap"]
        assert step["errnos"] == [0], step["name"]
        ctl = snap["control"][str(g)]
        info = ctl["info"]
        faults = set(info["faults"].split()) - {"none"}
        nv = snap["nvml"][str(g)]
        bdf = sysfs_bdf(base["nvml"][str(g)]["pci"]["bus_id"])
        m = metrics(snap["metrics"])
        rows = {r["index"]: r for r in snap["smi_query"]["rows"]}
        where = f"{step['name']} on GPU{g}"
        lost = info["health"] == "lost"
        # Lost: every surface, at once.
        assert (nv == "ERR:GPU_IS_LOST") == lost, (where, nv if isinstance(nv, str) else "handle ok")
        assert (bdf not in snap["sysfs"]) == lost and (bdf not in snap["procfs"]) == lost, where
        assert ("lost" in faults) == lost and (ctl["lost"] == "1") == lost, where
        assert (str(g) not in m.get("DCGM_FI_DEV_GPU_TEMP", {})) == lost, where
        assert (str(g) not in rows) == lost, (where, snap["smi_query"]["text"][-300:])
        xid = 0 if ctl["inject_xid"] == "none" else int(ctl["inject_xid"].split()[0])
        assert m["DCGM_FI_DEV_XID_ERRORS"][str(g)] == xid, where
        if lost:
            assert step["name"] in ("lost", "xid79"), where
            continue
        assert info["health"] != "healthy", (where, info)  # every step here is a fault
        xml, row = snap["smi_xml"]["gpus"][nv["pci"]["bus_id"]], rows[str(g)]
        # Row remapping (Ampere and later) or page retirement (Turing), as each surface shows it.
        if isinstance(nv["remapped"], list):
            corr, unc, pending, failure = nv["remapped"]
            assert bool(pending) == ("row_remap_pending" in faults) == _yes(xml["remap_pending"]) == _yes(
                row.get("remapped_rows.pending", "Yes" if pending else "No")), where  # no such fields before 570
            assert bool(failure) == ("row_remap_failure" in faults) == _yes(xml["remap_failure"]) == _yes(
                row.get("remapped_rows.failure", "Yes" if failure else "No")) == bool(
                m["DCGM_FI_DEV_ROW_REMAP_FAILURE"][str(g)]), where
            assert (unc, corr) == (m["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"][str(g)],
                                   m["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"][str(g)]), where
            assert nv["retired_pending"] == "ERR:NOT_SUPPORTED", where
        else:
            assert nv["remapped"] == "ERR:NOT_SUPPORTED", where
            pending = nv["retired_pending"]
            assert bool(pending) == ("page_retirement_pending" in faults) == _yes(row["retired_pages.pending"]) == bool(
                m["DCGM_FI_DEV_RETIRED_PENDING"][str(g)]), where
        # Uncorrectable ECC in device memory.
        dbe = nv["dbe_volatile"]
        assert dbe == int(xml["dbe_volatile"]) == int(row["ecc.errors.uncorrected.volatile.total"]) == m[
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][str(g)], where
        assert f"volatile dbe {dbe}" in ctl["inject_ecc"].splitlines(), where
        assert (dbe > 0) == ("uncorrectable_ecc" in faults), where
        # NVLink state: NVML, the control file, info's faults and topo -m's NV count.
        for link, nl in enumerate(nv["nvlinks"]):
            down = f"nvlink{link}_down" in faults
            assert (nl["state"] == 0) == down, (where, link)
            assert ctl["nvlink"].splitlines()[link].split()[1] == ("down" if down else "up"), (where, link)
        cells = snap["smi_topo"]["rows"][f"GPU{g}"]
        for j in range(seen["count"]):
            if j != g and isinstance(snap["nvml"][str(j)], dict):
                links = _nvlinks_between(nv, snap["nvml"][str(j)])
                assert (cells[j] == f"NV{links}") if links else not cells[j].startswith("NV"), (where, j, cells[j])
    assert {s["name"] for s in seen["faults"]} >= {"lost", "xid48", "xid79"}


# --- surfaces against the facts the node is made of ---------------------------------------------


def test_surfaces_show_the_profiles_facts(seen):
    """Board data reaches every surface from the profile, not from a value some layer made up."""
    from mokkafs.model import Node, compose
    from mokkafs.model.schema import FABRIC_STATES

    p = seen["profile"]
    model = Node(compose(p), 0.0)
    limits = model.compute
    for i, nv, xml, row, ctl in gpus(seen):
        assert nv["bar1"]["used"] == p.memory.bar1_used_mib * MIB and mib(xml["bar1_used"]) == p.memory.bar1_used_mib
        assert nv["bar1"]["total"] == p.memory.bar1_mib * MIB
        mem_max = p.thermal.memory_max_operating_c
        assert nv["thresholds"]["mem_max"] == ("ERR:NOT_SUPPORTED" if mem_max is None else mem_max)
        assert (nv["thresholds"]["shutdown"], nv["thresholds"]["slowdown"], nv["thresholds"]["gpu_max"]) == (
            p.thermal.shutdown_c, p.thermal.slowdown_c, p.thermal.max_operating_c)
        assert nv["fan"] == ("ERR:NOT_SUPPORTED" if p.fan_speed_pct is None else p.fan_speed_pct)
        assert xml["fan"] == ("N/A" if p.fan_speed_pct is None else f"{p.fan_speed_pct} %")
        state = "N/A" if p.fabric is None else p.fabric.state
        assert xml["fabric_state"] == row["fabric.state"].strip("[]") == state  # csv brackets what it lacks
        assert p.fabric is None or FABRIC_STATES[state] == p.fabric.state_code
        # Pages are retired where rows are not remapped: NVML answers exactly one of the two.
        remaps = isinstance(nv["remapped"], list)
        assert remaps == (not isinstance(nv["retired_pending"], int)) == model.has_row_remapper
        assert seen["cuda"][i]["limits"] == {
            "39": limits.max_threads_per_sm, "81": limits.shared_memory_per_sm,
            "97": limits.shared_memory_per_block_optin, "106": limits.max_blocks_per_sm,
            "87": limits.fp32_to_fp64_ratio}
