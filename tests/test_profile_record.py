"""`mokka profile record` (level: real tools against the mount): record a mounted node from
inside `mokka run` (so NVML, nvidia-smi, CUDA and sysfs are read at their real paths), mount the
recording, and every surface gives back what the original node showed; the recording changes
nothing on the node; without NVML, GPUs or nvidia-smi it refuses and writes nothing."""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import MountedNode, force_unmount, mokka_cmd
from helpers_nvml import consumer_env
from mokkafs.model.identity import compose
from mokkafs.cli.profile_record import Gpu, NodeFacts, RecordRefused, composition_of
from mokkafs.model.schema import Composition, driver_branch, legacy_node
from mokkafs.model.profiles import available_profiles, load_composition_file, load_profile

pytestmark = pytest.mark.level("tools")

REPO = Path(__file__).resolve().parents[1]
BOARDS = available_profiles()

# Every surface, read inside `mokka run` by tests/surface_probe.py's readers, plus the whole
# -q -x document and the text of topo -m, nvlink -s and lspci.
PROBE = r"""
import json, subprocess, sys, xml.etree.ElementTree as ET
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import surface_probe as P
count = int(P.read(Path(sys.argv[2]) / "node" / "gpu_count"))
P.N.nvmlInit()
nvml = {str(i): P.nvml_gpu(i, count) for i in range(count)}
P.N.nvmlShutdown()
def leaves(e, prefix=""):
    out = {}
    for c in e:
        p = prefix + c.tag + "".join(f"[{k}={v}]" for k, v in sorted(c.attrib.items()))
        out.update(leaves(c, p + "/") if len(c) else {p: (c.text or "").strip()})
    return out
run = lambda *a: subprocess.run(a, capture_output=True, text=True, timeout=60).stdout
ib = {}
for d in sorted(Path("/sys/class/infiniband").glob("*")):
    ib[d.name] = {a: P.read(d / a) for a in ("hca_type", "board_id", "fw_ver", "node_guid", "ports/1/rate",
                                             "ports/1/link_layer", "device/device", "device/numa_node")}
json.dump({"count": count, "nvml": nvml, "cuda": P.cuda_gpus(), "xml": leaves(ET.fromstring(run("nvidia-smi", "-q", "-x"))),
           "topo": run("nvidia-smi", "topo", "-m"), "nvlink": run("nvidia-smi", "nvlink", "-s"),
           "query": P.smi_query()["rows"], "sysfs": P.sysfs(), "procfs": P.procfs(), "ib": ib,
           "lspci": run("lspci", "-nn", "-vvv", "-d", "10de:")}, sys.stdout)
"""

# -q -x elements that follow the clock or the node's own history, not the profile: when the
# document was printed, and what an idle node's sensors and counters read at that moment.
VOLATILE = re.compile(
    r"^(timestamp|.*/(power_draw|average_power_draw|instant_power_draw|total_energy_consumption|gpu_temp|memory_temp"
    r"|gpu_util|memory_util|encoder_util|decoder_util|jpeg_util|ofa_util))$"
)


def probe(node: MountedNode) -> dict:
    r = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", sys.executable, "-c", PROBE,
                        str(REPO / "tests"), str(node.mnt)],
                       env=node.env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    data["xml"] = {k: v for k, v in data["xml"].items() if not VOLATILE.match(k)}
    for gpu in data["nvml"].values():
        gpu.pop("clocks", None)  # current clocks: idle readings, compared through -q -x's clocks/
    return data


def node_state(node: MountedNode) -> dict[str, str]:
    """What a write would change: every persisted file of the state directory (settings, MIG
    layout, events, the mirror, the log) and every GPU's settings as `gpuN/config` shows them.
    The shared state file is left out: its readings move with the clock. Waits for the daemon's
    first mirror, which it writes after the mount is ready."""
    deadline = time.monotonic() + 30
    while not (node.state_dir / "mirror" / "sys").is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    out = {}
    for p in sorted(node.state_dir.rglob("*")):
        if p.is_file() and not p.is_socket() and p.name != "state":
            out[str(p.relative_to(node.state_dir))] = hashlib.sha256(p.read_bytes()).hexdigest()
    for gpu in sorted(node.mnt.glob("gpu[0-9]*")):
        out[f"{gpu.name}/config"] = (gpu / "config").read_text()
        out[f"{gpu.name}/mig"] = (gpu / "mig").read_text()
    return out


def record(node: MountedNode, out: Path, *args: str, env_prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", *env_prefix, sys.executable, "-m",
                           "mokkafs.cli", "profile", "record", "-o", str(out), *args],
                          env=node.env, capture_output=True, text=True, timeout=180)


def composition_facts(c: Composition) -> dict:
    """What a composition says about the machine: all but its name, description and CPU model
    (text for the reader), with every GPU's slot as laid out (bus, domain, NUMA, HCA beside it)
    and the DMI names the node shows (a composition without a system block shows its own)."""
    d = c.model_dump(exclude={"name", "description", "slots", "system"})
    del d["cpu"]["model"]
    d["slots"] = [s.model_dump() for s in c.layout()]
    d["system"] = c.dmi.model_dump()
    return d


def diff(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in diff(a.get(k), b.get(k), f"{path}/{k}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def as_the_driver_says(board, driver: str | None = None) -> str:
    """The addressing mode a recording reads: the board's from 570; below, every driver answers
    None whatever the board (each 535-565 capture does, docs/nvidia-smi.md), and a recording keeps
    what the driver said."""
    driver = driver or board.node.driver_version
    return board.addressing_mode if int(driver.split(".")[0]) >= 570 else "None"


@pytest.mark.parametrize("board", BOARDS)
def test_recording_a_node_and_mounting_it_gives_the_node_back(board, tmp_path):
    """Identity, limits, clocks, topology (topo -m, NUMA, NVLink) and composition (count, bus ids,
    NUMA per GPU, HCAs and the GPU each sits beside, NVSwitches, CPUs) on every surface: NVML, CUDA,
    our nvidia-smi -q -x / topo -m / nvlink -s / --query-gpu, sysfs, procfs,
    /sys/class/infiniband and lspci. The recording (the profile and, beside it, its node
    composition) is mounted with `--node` as the documented way, named as the original and under
    the same host name, so the UUIDs and serials (which the profile does not hold) are derived alike."""
    out = tmp_path / f"{board}.yaml"
    node_out = tmp_path / f"{board}.node.yaml"
    original = MountedNode(tmp_path, board, name="orig")
    original.mount()
    try:
        before = node_state(original)
        r = record(original, out, "--fill-from", board, "--name", board)
        assert r.returncode == 0, r.stderr
        after = node_state(original)
        seen = probe(original)
    finally:
        original.umount()
        force_unmount(original.mnt)
    assert before == after  # read-only: nothing persisted, no setting changed

    shipped = load_profile(board)
    filled = set(re.search(r"filled from \S+: (.*)", r.stdout).group(1).split(", "))
    # What no live surface shows: the temperature under full load, how many boards fit one node
    # (a form-factor fact), the MIG tables (reading the compute-instance profiles needs a GPU
    # instance, which only a write could create), the count of NVSwitches that are not on this
    # host's PCI bus (HGX B200's), the bank count of a board without a row remapper, the
    # voltage where -q -x prints none (no Voltage from 580, N/A at 570, N/A on a board without one),
    # and what a driver before 510 holds back (a recording is of the driver it runs on).
    no_voltage = shipped.voltage_mv is None or driver_branch(shipped.node.driver_version) >= 570
    assert filled == {"thermal.max_load_c", "max_gpus_per_node", "memory.reserved_before_510_mib"} | \
        ({"mig"} if shipped.mig else set()) | \
        ({"voltage_mv"} if no_voltage else set()) | \
        ({"memory.row_remap_banks"} if shipped.memory.row_remap_banks is None else set()) | \
        ({"node.nvswitches"} if shipped.node.nvswitches and shipped.node.nvswitch_device_id is None else set())
    recorded = load_profile(str(out))
    # A recording writes the node it saw as a `node:` section; the shipped profile names its
    # composition instead, which resolves to the same `node`. What it saw is the node as mounted:
    # a one-GPU node spans one NUMA node whatever the profile's node section says (l4's 2).
    mounted = compose(shipped).composition
    skip = {"thermal": {"max_load_c"}, "mig": True, "composition": True}
    assert recorded.model_dump(exclude=skip) == {**shipped.model_dump(exclude=skip), "node": legacy_node(mounted),
                                                 "addressing_mode": as_the_driver_says(shipped)}
    text = out.read_text()
    assert "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_GRAPHICS)" in text
    assert ("/sys/class/infiniband/mlx5_0/{hca_type" in text) == bool(shipped.node.hcas)
    assert text.count(" # ") >= 60  # a comment on every key

    # The composition file holds what the shipped profile's composition says of the machine.
    recorded_node = load_composition_file(node_out)
    assert composition_facts(recorded_node) == composition_facts(mounted)
    assert recorded_node.name == f"{board}-node" and f"--node {node_out.name}" in text
    node_text = node_out.read_text()
    assert len(re.findall(r"^  - \{bus: 0x[0-9a-f]{2}.*# GPU \d+: /sys/bus/pci/devices/\S+, its numa_node", node_text,
                          re.M)) == shipped.node.gpus  # a source on every slot

    copy = MountedNode(tmp_path, str(out), name="rec")
    copy.mount(("--node", str(node_out)))
    try:
        again = probe(copy)
    finally:
        copy.umount()
        force_unmount(copy.mnt)
    assert seen["count"] == shipped.node.gpus and seen["xml"] and seen["lspci"]
    for slot in recorded_node.layout():  # the composition's own facts, seen on the surfaces compared
        assert re.search(rf"^(?:{slot.domain:04x}:)?{slot.bus:02x}:00\.0 ", seen["lspci"], re.M)
    assert len(seen["ib"]) == recorded_node.hcas and seen["topo"].count("GPU") >= shipped.node.gpus
    assert diff(seen, again) == []
    assert original.unexpected_log_lines() == [] and copy.unexpected_log_lines() == []


def test_the_recording_names_its_sources_and_the_composition(tmp_path):
    node = MountedNode(tmp_path, "h100")
    node.mount()
    try:
        out = tmp_path / "h.yaml"
        r = record(node, out, "--fill-from", "h100")
        assert r.returncode == 0, r.stderr
    finally:
        node.umount()
        force_unmount(node.mnt)
    text = out.read_text()
    node_text = (tmp_path / "h.node.yaml").read_text()
    comments = {line.split(":")[0].strip(): line.split(" # ", 1)[1] for line in text.splitlines()
                if not line.startswith("#") and " # " in line}
    node_comments = {line.split(":")[0].strip(): line.split(" # ", 1)[1].strip() for line in node_text.splitlines()
                     if not line.startswith(("#", "  - ")) and " # " in line}
    assert comments["total_mib"].startswith("nvmlDeviceGetMemoryInfo_v2 total (= <fb_memory_usage/total>)")
    assert comments["gpu_part_number"] == "-q -x <gpu_part_number>"
    assert comments["sm_count"] == "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)"
    assert comments["revision"].startswith("/sys/bus/pci/devices/0000:") and comments["revision"].endswith("/revision")
    assert comments["nvswitches"].startswith("/sys/bus/pci/devices/*/{vendor,class}")
    assert comments["max_load_c"] == "FILLED from h100"
    assert comments["version"] == "nvmlDeviceGetNvLinkVersion (nvmlNvlinkVersion_t)"
    assert yaml.safe_load(text)["name"] == "h"
    # The node composition beside it: each GPU's bus id, NUMA node and the HCA on its switch,
    # the NVSwitches, HCAs, CPUs and versions, each with its source.
    assert "mokka mount MNT --profile h.yaml --node h.node.yaml" in text and "--node h.node.yaml" in node_text
    slots = re.findall(r"^  - \{bus: (0x\w+), numa: (\d), hca: (\d)\} +# GPU (\d): /sys/bus/pci/devices/(\S+), its "
                       r"numa_node; (mlx5_\d) \((\S+)\) shares its PCIe switch$", node_text, re.M)
    assert [(int(n), int(h), int(g), name) for _, n, h, g, _, name, _ in slots] == \
        [(i * 2 // 8, i, i, f"mlx5_{i}") for i in range(8)]
    assert all(bdf == f"0000:{bus[2:]}:00.0" and int(hca_bdf.split(":")[1], 16) == int(bus, 16) + 1
               for bus, _, _, _, bdf, _, hca_bdf in slots)
    assert node_comments["driver_version"].startswith("nvmlSystemGetDriverVersion")
    assert node_comments["cuda_version"].startswith("nvmlSystemGetCudaDriverVersion")
    assert node_comments["nvswitches"].startswith("/sys/bus/pci/devices/*/{vendor,class} (vendor 0x10de, class 0x0680)")
    assert node_comments["nvswitch_device_id"].endswith("device")
    assert node_comments["hca_type"] == "/sys/class/infiniband/mlx5_0/hca_type"
    assert node_comments["model"].startswith("pci.ids 15b3:1021")
    assert "local_cpulist" in node_comments["threads_per_core"] and "local_cpulist" in node_comments["numa_nodes"]
    assert node_comments["arch"].startswith("the board")
    recorded = load_composition_file(tmp_path / "h.node.yaml")
    assert (recorded.gpus, recorded.nvswitches, recorded.nvswitch_device_id, recorded.hcas, recorded.hca.model) == \
        (8, 4, 0x22a3, 8, "ConnectX-7")
    assert (recorded.cpu.numa_nodes, recorded.cpu.cores_per_numa_node, recorded.cpu.threads_per_core) == (2, 56, 2)


# --- bad conditions: a clear message, a non-zero exit, no file (not even a partial one) ----------


def plain_run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*mokka_cmd(), "profile", "record", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_without_an_nvml_library_it_refuses(tmp_path):
    """This machine has no NVIDIA driver: pynvml finds no libnvidia-ml.so.1."""
    out = tmp_path / "p.yaml"
    env = {k: v for k, v in consumer_env(tmp_path / "none").items() if k not in ("LD_LIBRARY_PATH", "MOKKA_STATE")}
    r = plain_run(["-o", str(out), "--fill-from", "h100"], env)
    assert r.returncode == 2
    assert "cannot initialise NVML" in r.stderr and "libnvidia-ml.so.1" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_with_nvml_but_no_gpu_in_sysfs_it_refuses_and_keeps_the_old_file(tmp_path):
    """NVML answers (a mounted node's state), but outside `mokka run` this host's sysfs has no
    NVIDIA GPU: refused, and a file already at -o stays as it was."""
    node = MountedNode(tmp_path, "t4")
    node.mount()
    try:
        out = tmp_path / "p.yaml"
        out.write_text("old\n")
        r = plain_run(["-o", str(out), "--fill-from", "t4"], consumer_env(node.state_dir / "state"))
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert r.returncode == 2
    assert "NVML sees 1 GPUs but /sys/bus/pci/devices shows no NVIDIA GPU" in r.stderr
    assert out.read_text() == "old\n"
    assert not list(tmp_path.glob(".mokka-record-*"))


def test_with_a_driver_that_does_not_load_it_refuses(tmp_path):
    """The library is there but the node is not (no state): NVML's init fails."""
    out = tmp_path / "p.yaml"
    r = plain_run(["-o", str(out)], consumer_env(tmp_path / "no-such-state"))
    assert r.returncode == 2 and "cannot initialise NVML" in r.stderr
    assert not out.exists()


def test_without_nvidia_smi_or_fill_it_refuses(tmp_path):
    node = MountedNode(tmp_path, "l40s")
    node.mount()
    try:
        out = tmp_path / "p.yaml"
        no_smi = record(node, out, "--fill-from", "l40s", env_prefix=("env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"))
        no_fill = record(node, out)
        other_arch = record(node, out, "--fill-from", "h100")
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert no_smi.returncode == 2 and "nvidia-smi -q -x gave nothing" in no_smi.stderr
    assert no_fill.returncode == 2
    assert "thermal.max_load_c: a steady temperature at the power limit" in no_fill.stderr
    assert "--fill-from PROFILE" in no_fill.stderr
    assert other_arch.returncode == 2 and "--fill-from h100 is Hopper, the capture Ada Lovelace" in other_arch.stderr
    assert not out.exists()


def test_both_files_or_neither(tmp_path):
    """The composition cannot be written (its directory is missing): the profile is not written
    either, and an old profile stays; --node-out naming the profile's own file is refused."""
    node = MountedNode(tmp_path, "t4")
    node.mount()
    try:
        out = tmp_path / "p.yaml"
        out.write_text("old\n")
        missing_dir = record(node, out, "--fill-from", "t4", "--node-out", str(tmp_path / "no" / "n.yaml"))
        same = record(node, out, "--fill-from", "t4", "--node-out", str(out))
        fine = record(node, tmp_path / "q.yaml", "--fill-from", "t4", "--node-out", str(tmp_path / "elsewhere.yaml"))
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert missing_dir.returncode == 2 and "No such file or directory" in missing_dir.stderr
    assert same.returncode == 2 and "is the profile's own file" in same.stderr
    assert out.read_text() == "old\n" and not (tmp_path / "p.node.yaml").exists()
    assert not list(tmp_path.glob(".mokka-record-*"))
    assert fine.returncode == 0, fine.stderr
    assert load_composition_file(tmp_path / "elsewhere.yaml").gpus == 1
    assert "--node elsewhere.yaml" in (tmp_path / "q.yaml").read_text()


def facts_of(buses: list[str], numa: list[int]) -> NodeFacts:
    facts = NodeFacts(gpus=[Gpu(b, 0x2330, n, "0-55,112-167" if n == 0 else "56-111,168-223",
                                f"/sys/devices/pci{b[:7]}/{b}") for b, n in zip(buses, numa)])
    facts.origin.update(gpus="sysfs", nvswitches="sysfs", hcas="sysfs")
    return facts


VERSIONS = {"driver_version": ("580.105.08", "nvmlSystemGetDriverVersion"),
            "cuda_version": ("13.0", "nvmlSystemGetCudaDriverVersion")}


def test_a_node_the_composition_schema_cannot_hold_is_refused():
    """Validated by the Composition schema before anything is written: GPUs whose root complexes
    would overlap, and a board in a node it cannot sit in, are refused by name."""
    h100 = load_profile("h100")
    good = composition_of(facts_of(["0000:18:00.0", "0000:1e:00.0"], [0, 1]), "n", h100, VERSIONS)
    assert [(s.bus, s.numa) for s in good.composition.layout()] == [(0x18, 0), (0x1e, 1)]
    with pytest.raises(RecordRefused, match=r"does not load:\n  \(top level\): Value error, slots.1.bus: 0x19 needs"):
        composition_of(facts_of(["0000:18:00.0", "0000:19:00.0"], [0, 0]), "n", h100, VERSIONS)
    with pytest.raises(RecordRefused, match=r"slots.0.bus: Input should be greater than or equal to 3"):
        composition_of(facts_of(["0000:01:00.0"], [0]), "n", h100, VERSIONS)  # no room for its root port
    with pytest.raises(RecordRefused, match=r"GPU 0 is at 0000:00:1e.0: a composition places each GPU at device 00.0"):
        composition_of(facts_of(["0000:00:1e.0"], [0]), "n", h100, VERSIONS)
    nine = facts_of([f"0000:{0x18 + 6 * i:02x}:00.0" for i in range(9)], [0] * 9)
    with pytest.raises(RecordRefused, match="does not fit the recorded node: composition n has 9 GPUs, but h100 "
                                            "boards sit at most 8"):
        composition_of(nine, "n", h100, VERSIONS)


def test_the_recorder_calls_no_nvml_setter():
    """Read-only by construction too: no NVML call that changes the node appears in the recorder,
    nor among the getters of nvidia-smi's field table, through which it reads most keys."""
    from mokkafs.model.smi_fields import BY_PROFILE

    source = (REPO / "mokkafs" / "cli" / "profile_record.py").read_text()
    calls = set(re.findall(r"\bnvml\w+", source)) | {f.nvml for f in BY_PROFILE.values() if f.nvml}
    assert calls and not {c for c in calls if re.search(r"(Set|Clear|Reset|Create|Destroy|Register)", c)}


def test_recording_through_nvidias_own_nvidia_smi(tmp_path):
    """NVIDIA's nvidia-smi 550 (scripts/fetch_nvidia_smi.sh) first on PATH, as on a real node:
    its -q -x, topo -m and nvlink -s, read through our NVML, make the same profile (the node's
    own driver version and GPU count aside)."""
    cache = REPO / ".cache" / "nvidia-smi" / "550"
    if not (cache / "nvidia-smi").is_file():
        pytest.skip("NVIDIA's nvidia-smi 550 is not fetched: run scripts/fetch_nvidia_smi.sh")
    driver = (cache / "version").read_text().split()[1].split("-")[0]
    node = MountedNode(tmp_path, "h100", gpus=2)
    node.mount(("--driver-version", driver))
    out = tmp_path / "r.yaml"
    try:
        r = record(node, out, "--fill-from", "h100", "--name", "h100",
                   env_prefix=("env", f"PATH={cache}:/usr/sbin:/usr/bin:/sbin:/bin"))
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert r.returncode == 0, r.stderr
    recorded, shipped = load_profile(str(out)).model_dump(), load_profile("h100").model_dump()
    assert recorded["node"].pop("driver_version") == driver and recorded["node"].pop("gpus") == 2
    assert recorded["node"].pop("cuda_version") == "12.4"  # the 550 branch's, not the composition's 13.0
    del shipped["node"]["driver_version"], shipped["node"]["gpus"], shipped["node"]["cuda_version"]
    del shipped["composition"], recorded["composition"]  # a `node:` section against a named composition
    shipped["addressing_mode"] = as_the_driver_says(load_profile("h100"), driver)
    assert recorded == shipped
    assert "gpu_part_number: 2330-885-A1" in out.read_text() and "# -q -x <gpu_part_number>" in out.read_text()
    node = load_composition_file(tmp_path / "r.node.yaml")
    assert (node.gpus, node.driver_version) == (2, driver)
