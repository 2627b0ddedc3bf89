"""`mokka profile import`: every fixture capture becomes a profile equal to the shipped one (or
the difference is explained in docs/profiles.md), the profile mounts and our nvidia-smi gives the
capture's identity back; what the captures lack is refused or filled and marked; bad input is
refused with a clear message."""
from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from conftest import MountedNode, force_unmount, mokka_cmd
from helpers_nvml import consumer_env
from mokkafs.model.profile_import import Captures, ImportRefused, _flat, import_profile, parse_query_text
from mokkafs.model.schema import GpuProfile
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("model")

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "tests" / "fixtures" / "captures"
XML_BOARDS = ["a100", "b200", "gb200", "gb300", "h100", "l40s", "t4"]
# Boards shipped from a text `nvidia-smi -q` (no -q -x found) and CUDA's deviceQuery where there is one.
TEXT_BOARDS = {
    "l4": ["nvidia-smi-q.l4.550.90.07.txt", "deviceQuery.l4.txt"],
    "a10g": ["nvidia-smi-q.a10g.535.247.01.txt"],
    "h100-nvl": ["nvidia-smi-q.h100-nvl.550.54.14.txt", "deviceQuery.h100-nvl.txt"],
    "a100-80gb": ["nvidia-smi-q.a100-80gb.555.42.02.txt", "deviceQuery.a100-80gb.txt"],
}
BOARDS = XML_BOARDS + list(TEXT_BOARDS)
DOCS = REPO / "docs" / "profiles.md"


def capture_files(board: str) -> list[Path]:
    """The board's -q -x capture, and its text capture where there is one (h100, l40s); or, for
    a board shipped from text, its -q and deviceQuery."""
    if board in TEXT_BOARDS:
        return [CAPTURES / name for name in TEXT_BOARDS[board]]
    return [CAPTURES / f"nvidia-smi-q-x.{board}.xml", *sorted(CAPTURES.glob(f"nvidia-smi-text.{board}*.txt"))]


def imported(board: str, fill: str | None = None, name: str | None = None):
    files = [(str(p.relative_to(REPO)), p.read_text()) for p in capture_files(board)]
    return import_profile(files, name or board, (fill, load_profile(fill)) if fill else None)


def xml_text(board: str) -> str:
    return (CAPTURES / f"nvidia-smi-q-x.{board}.xml").read_text()


def section(capture: str, command: str) -> str:
    """The output of one command in an nvidia_gpu_exporter capture."""
    return capture.split(f"# $ {command}\n")[1].split("\n", 1)[1].split("\n####")[0]


def refused(text: str, *more: tuple[str, str], fill: str | None = "h100") -> str:
    with pytest.raises(ImportRefused) as e:
        import_profile([("capture.xml", text), *more], "x", (fill, load_profile(fill)) if fill else None)
    return str(e.value)


# --- consistency with the shipped profiles ------------------------------------------------------


def explained_differences() -> set[tuple[str, str]]:
    """(profile, key) rows of docs/profiles.md's table of import differences."""
    text = DOCS.read_text()
    section = text.split("### Imported vs. shipped", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return {(a.strip().strip("`"), b.strip().strip("`")) for a, b in rows}


@pytest.mark.parametrize("board", BOARDS)
def test_import_equals_the_shipped_profile_or_the_difference_is_explained(board):
    """Filled from the shipped board itself, so every captured value is compared with it."""
    imp, profile, _ = imported(board, fill=board)
    ours, shipped = _flat(profile.model_dump()), _flat(load_profile(board).model_dump())
    # The import writes a node: section; the shipped profile names a composition instead, whose
    # view in the node: keys (node.*) is what is compared.
    captured = [k for k in ours if k not in imp.filled and k not in ("name", "composition")]
    assert len(captured) >= 45  # the identity, memory, power, clocks, thermal, PCI, fabric, driver keys
    differ = {(board, k) for k in captured if ours[k] != shipped[k]}
    explained = {row for row in explained_differences() if row[0] == board}
    assert differ == explained


def test_every_explained_difference_is_a_real_one():
    boards = {b for b, _ in explained_differences()}
    assert boards <= set(BOARDS) and explained_differences()


@pytest.mark.parametrize("board", BOARDS)
def test_each_value_is_traced_to_its_element(board):
    imp, _profile, text = imported(board, fill=board)
    lines = dict(re.match(r"^\s*([a-z_0-9]+):.*?(?:# (.*))?$", line).groups()[::1] for line in text.splitlines()
                 if re.match(r"^\s*[a-z_0-9]+:", line))
    if board in TEXT_BOARDS:
        assert lines["product_name"] == "-q 'Product Name'" and lines["vbios_version"] == "-q 'VBIOS Version'"
        assert lines["device_id"].startswith("-q 'PCI/Device Id'") and lines["total_mib"] == "-q 'FB Memory Usage/Total'"
        dq = "deviceQuery" in " ".join(TEXT_BOARDS[board])
        assert ("deviceQuery (device 0" in lines["sm_count"]) == dq
        assert (lines["sm_count"] == f"FILLED from {board}") == (not dq)
    else:
        assert "<product_name>" in lines["product_name"] and "<vbios_version>" in lines["vbios_version"]
        assert "<pci/pci_device_id>" in lines["device_id"] and "<fb_memory_usage/total>" in lines["total_mib"]
        assert lines["sm_count"] == f"FILLED from {board}"
    for key in imp.filled:
        assert imp.origin[key].startswith("FILLED")
    # the text loads as it is written, and equals the validated result
    assert GpuProfile.model_validate(yaml.safe_load(text)) == _profile


def test_the_text_captures_give_compute_capability_and_nvlink():
    imp, profile, _ = imported("h100", fill="h100")
    assert "compute_capability" not in imp.filled and profile.compute_capability == "9.0"
    assert (profile.nvlink.links, profile.nvlink.link_speed_gbps) == (18, 26.562)
    assert "nvlink -s" in imp.origin["nvlink.links"] and "nvlink.version" in imp.filled
    imp, profile, _ = imported("l40s", fill="l40s")
    assert profile.nvlink.links == 0 and "nvlink.links" not in imp.filled
    assert profile.compute_capability == "8.9" and "compute_capability" not in imp.filled
    # The L40S text capture is of another card (VBIOS, board part): the XML wins, said in a note.
    assert profile.vbios_version == "95.02.66.00.15"
    assert any("vbios_version '95.02.66.00.02'" in n for n in imp.notes)


@pytest.mark.parametrize("board,volt,sparse,read", [("a10g", 956.25, None, True), ("h100-nvl", 705.0, "Disabled", True),
                                                   ("a100-80gb", 706.25, None, True), ("h100", 685.0, "Disabled", False)])
def test_voltage_and_sparse_mode_are_read_where_the_capture_prints_them(board, volt, sparse, read):
    """Text captures (535-555) print the graphics voltage; a 580 -q -x prints none, so it is
    filled from the shipped board. The sparse mode is read as printed, N/A as null."""
    imp, profile, _ = imported(board, fill=board)
    assert (profile.voltage_mv, profile.sparse_operation_mode) == (volt, sparse)
    assert ("voltage_mv" in imp.filled) != read and "sparse_operation_mode" not in imp.filled
    if read:
        assert imp.origin["voltage_mv"] == "-q 'Voltage/Graphics'"


def test_a_topo_of_another_node_is_not_used_for_the_node():
    """The H100 text capture is a one-GPU VM; the XML an 8-GPU HGX: its NUMA and NICs are not this node's."""
    imp, profile, _ = imported("h100", fill="h100")
    assert "node.numa_nodes" in imp.filled and profile.node.numa_nodes == 2
    assert any("shows 1 GPUs, the node 8" in n for n in imp.notes)


# --- what the captures lack: refused, or filled and marked -------------------------------------


def test_without_fill_it_is_refused_and_says_what_and_why():
    with pytest.raises(ImportRefused) as e:
        imported("a100")
    msg = str(e.value)
    for key in ("compute_capability", "sm_count", "l2_cache_bytes", "memory.bus_width_bits", "thermal.max_load_c",
                "nvlink.links", "node.numa_nodes", "node.hca"):
        assert f"  {key}: " in msg
    assert "--fill-from" in msg and "vbios" not in msg


def test_cli_refuses_and_writes_nothing_then_writes_with_fill(tmp_path):
    out = tmp_path / "mine.yaml"
    cap = str(CAPTURES / "nvidia-smi-q-x.t4.xml")
    r = subprocess.run([*mokka_cmd(), "profile", "import", cap, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "sm_count" in r.stderr and not out.exists()
    r = subprocess.run([*mokka_cmd(), "profile", "import", cap, "-o", str(out), "--fill-from", "t4"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "filled from t4" in r.stdout
    p = load_profile(str(out))
    assert p.name == "mine" and p.product_name == "Tesla T4"
    assert "# FILLED from t4" in out.read_text()


def test_fill_from_another_architecture_is_refused():
    with pytest.raises(ImportRefused, match="same architecture"):
        imported("t4", fill="l40s")


def test_mig_tables_come_only_from_the_same_product():
    """h100 filled from h200 (both Hopper): mig_capable as captured, no MIG tables (the schema
    allows a MIG-capable board without tables); filled from h100 itself: its tables."""
    imp, profile, _ = imported("h100", fill="h200")
    assert profile.mig_capable and profile.mig is None and "mig" not in imp.filled
    assert any(n.startswith("mig: not filled") for n in imp.notes)
    _, profile, _ = imported("h100", fill="h100")
    assert profile.mig == load_profile("h100").mig
    _, profile, _ = imported("l40s", fill="l40s")
    assert not profile.mig_capable and profile.mig is None


# --- bad input ---------------------------------------------------------------------------------


def test_not_nvidia_smi_output():
    msg = refused("Hello, this is not a capture\n")
    assert "capture.xml: not a capture this command reads" in msg
    msg = refused('<?xml version="1.0" ?>\n<html><body>502 Bad Gateway</body></html>\n')
    assert "not nvidia-smi -q -x output" in msg


def test_truncated_capture():
    text = xml_text("h100")
    msg = refused(text[: len(text) // 2])
    assert "truncated or damaged capture" in msg and "line" in msg
    # Cut at a <gpu> boundary, the XML closed again: fewer GPUs than attached_gpus says.
    gpus = text.split("\t<gpu id=")
    whole = gpus[0] + "\t<gpu id=" + gpus[1].split("\t</gpu>")[0] + "\t</gpu>\n\n</nvidia_smi_log>\n"
    assert "attached_gpus says 8 but the capture holds 1" in refused(whole)


def test_several_different_boards():
    h100, b200 = xml_text("h100"), xml_text("b200")
    b200_gpu = "\t<gpu id=" + b200.split("\t<gpu id=")[1].split("\t</gpu>")[0] + "\t</gpu>\n"
    mixed = h100.replace("\t<gpu id=", b200_gpu + "\t<gpu id=", 1).replace(
        "<attached_gpus>8</attached_gpus>", "<attached_gpus>9</attached_gpus>")
    msg = refused(mixed)
    assert "several different boards" in msg and "NVIDIA B200" in msg and "NVIDIA H100 80GB HBM3" in msg
    # ... and one board in two captures that disagree on what it is
    text = (CAPTURES / "nvidia-smi-text.l40s.595.80.txt").read_text()
    assert "several different boards" in refused(h100, ("l40s.txt", text))


def test_a_board_with_two_part_numbers_is_one_board():
    """GPU 3 of the H100 capture has another board part number: noted, GPU 0's is taken."""
    imp, profile, _ = imported("h100", fill="h100")
    assert profile.board_part_number == "692-2G520-0200-000"
    assert any("965-2G520-A800-000" in n for n in imp.notes)


@pytest.mark.parametrize("driver", ["418.67", "600.10.01"])
def test_a_driver_branch_we_do_not_model(driver):
    text = xml_text("t4").replace("<driver_version>595.91.07</driver_version>",
                                  f"<driver_version>{driver}</driver_version>")
    msg = refused(text, fill="t4")
    assert f"driver {driver} is branch {driver.split('.')[0]}, which mokkafs does not model" in msg
    assert "--driver-version" in msg
    imp, profile, _ = import_profile([("c.xml", text)], "x", ("t4", load_profile("t4")), driver_version="580.105.08")
    assert profile.node.driver_version == "580.105.08" and "not modelled" in imp.origin["node.driver_version"]


def test_an_architecture_we_do_not_model():
    text = xml_text("t4").replace("<product_architecture>Turing</product_architecture>",
                                  "<product_architecture>Volta</product_architecture>")
    assert "architecture 'Volta'" in refused(text, fill="t4")


def test_only_text_captures_without_the_board():
    text = (CAPTURES / "nvidia-smi-text.h100-80gb-hbm3.590.48.01.txt").read_text()
    topo = section(text, "nvidia-smi topo -m")
    with pytest.raises(ImportRefused, match="nothing names the board"):
        import_profile([("topo.txt", topo)], "x")


def test_text_query_alone_makes_a_profile():
    """No XML: the -q text is the ground truth (H100, driver 590: its own VBIOS and reserved MiB)."""
    path = CAPTURES / "nvidia-smi-text.h100-80gb-hbm3.590.48.01.txt"
    imp, profile, _ = import_profile([(path.name, path.read_text())], "h100q", ("h100", load_profile("h100")))
    assert profile.vbios_version == "96.00.A5.00.01" and profile.memory.reserved_mib == 479
    assert profile.node.driver_version == "590.48.01" and profile.thermal.tlimit_c == 87
    assert "-q 'VBIOS Version'" in imp.origin["vbios_version"]


# --- done when: the imported profile mounts and gives the capture's identity back ---------------

IDENTITY = [
    "product_name", "product_brand", "product_architecture", "vbios_version", "board_part_number",
    "gpu_part_number", "inforom_version/img_version", "inforom_version/oem_object", "inforom_version/ecc_object",
    "inforom_version/pwr_object", "pci/pci_domain", "pci/pci_base_class", "pci/pci_sub_class", "pci/pci_device_id",
    "pci/pci_sub_system_id", "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    "pci/pci_gpu_link_info/link_widths/max_link_width", "fb_memory_usage/total", "fb_memory_usage/reserved",
    "bar1_memory_usage/total", "gpu_power_readings/default_power_limit", "gpu_power_readings/min_power_limit",
    "gpu_power_readings/max_power_limit", "max_clocks/graphics_clock", "max_clocks/sm_clock",
    "max_clocks/mem_clock", "max_clocks/video_clock", "default_applications_clocks/graphics_clock",
    "default_applications_clocks/mem_clock", "temperature/gpu_temp_max_threshold",
    "temperature/gpu_temp_slow_threshold", "temperature/gpu_temp_max_gpu_threshold",
    "temperature/gpu_temp_max_mem_threshold",
    "ecc_mode/current_ecc", "mig_mode/current_mig", "fan_speed", "fabric/state", "fabric/status", "fabric/cliqueId",
    "fabric/clusterUuid", "fabric/health/summary", "fabric/health/bandwidth",
    "fabric/health/route_recovery_in_progress", "fabric/health/route_unhealthy",
    "fabric/health/access_timeout_recovery", "fabric/health/incorrect_configuration",
]


TLIMIT_THRESHOLDS = ["gpu_temp_max_tlimit_threshold", "gpu_temp_slow_tlimit_threshold",
                     "gpu_temp_max_gpu_tlimit_threshold"]
NVML_THRESHOLDS = """
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(*(pynvml.nvmlDeviceGetTemperatureThreshold(h, t) for t in (
    pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
    pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)))
"""


def nvml_thresholds(node: MountedNode) -> list[int]:
    """GPU 0's shutdown, slowdown and max-operating thresholds through pynvml on our NVML."""
    r = subprocess.run([sys.executable, "-c", NVML_THRESHOLDS], env=consumer_env(node.state_dir / "state"),
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return [int(v) for v in r.stdout.split()]


def smi(node: MountedNode, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(node.path("driver/usr/bin/nvidia-smi")), *args],
                          env=consumer_env(node.state_dir / "state"), capture_output=True, text=True, timeout=20)


def capture_identity(board: str) -> tuple[str, str, dict[str, str]]:
    """The capture's driver, GPU count and GPU 0's elements by -q -x path: read from the -q -x
    XML, or, for a board shipped from text, the -q labels as profile_import maps them."""
    if board in XML_BOARDS:
        root = ET.fromstring(xml_text(board))
        gpu = root.find("gpu")
        paths = {p: gpu.findtext(p) for p in IDENTITY + ["temperature/gpu_temp", "temperature/gpu_temp_tlimit",
                                                         *(f"temperature/{t}" for t in TLIMIT_THRESHOLDS)]}
        return root.findtext("driver_version"), root.findtext("attached_gpus"), \
            {p: v for p, v in paths.items() if v is not None}
    caps = Captures()
    parse_query_text((CAPTURES / TEXT_BOARDS[board][0]).read_text(), board, caps)
    return caps.driver_version, str(caps.attached_gpus), caps.gpus[0].values


@pytest.mark.level("shims")
@pytest.mark.parametrize("board", BOARDS)
def test_imported_profile_mounts_and_gives_the_capture_back(board, tmp_path):
    """`mokka profile import` (the CLI), `mokka mount --profile FILE` (a real FUSE mount), then our
    nvidia-smi -q -x on the mounted node: the capture's identity elements, 100 %."""
    out = tmp_path / f"imported-{board}.yaml"
    r = subprocess.run([*mokka_cmd(), "profile", "import", *map(str, capture_files(board)), "-o", str(out),
                        "--fill-from", board], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    node = MountedNode(tmp_path, str(out))
    node.mount()
    try:
        assert node.read("node/profile").strip() == f"imported-{board}"
        res = smi(node, "-q", "-x")
        assert res.returncode == 0, res.stderr
        ours = ET.fromstring(res.stdout)
        driver, attached, real = capture_identity(board)
        assert ours.findtext("driver_version") == driver
        assert ours.findtext("attached_gpus") == attached
        og = ours.find("gpu")
        compared = [p for p in IDENTITY if p in real]
        assert len(compared) >= (40 if board in XML_BOARDS else 34)
        assert {p: og.findtext(p) for p in compared} == {p: real[p] for p in compared}
        # The T.Limit-relative thresholds (Ada and later): our nvidia-smi prints them N/A (it has no
        # NVML source for the margins yet), so they are checked through NVML's absolute thresholds
        # on the mounted node: T.Limit (the capture's gpu_temp + gpu_temp_tlimit) - ours = the margin.
        if real.get("temperature/gpu_temp_tlimit", "N/A") != "N/A":
            tlimit = int(real["temperature/gpu_temp"].split()[0]) + int(real["temperature/gpu_temp_tlimit"].split()[0])
            absolute = nvml_thresholds(node)
            for path, ours_abs in zip(TLIMIT_THRESHOLDS, absolute):
                assert f"{tlimit - ours_abs} C" == real[f"temperature/{path}"], path
        # CUDA's deviceQuery: the compute capability our nvidia-smi reports
        dq = next((CAPTURES / n for n in TEXT_BOARDS.get(board, []) if n.startswith("deviceQuery")), None)
        if dq is not None:
            cc = smi(node, "--query-gpu=compute_cap", "--format=csv,noheader").stdout.splitlines()[0]
            assert f"CUDA Capability Major/Minor version number:    {cc}\n" in dq.read_text()
        # what only the text captures hold: compute capability and the NVLink count
        text = next(iter(CAPTURES.glob(f"nvidia-smi-text.{board}*.txt")), None) if board in XML_BOARDS else None
        if text is not None:
            raw = text.read_text()
            nvlink = section(raw, "nvidia-smi nvlink -s")
            cc = smi(node, "--query-gpu=compute_cap", "--format=csv,noheader").stdout.splitlines()[0]
            assert cc == load_profile(board).compute_capability
            ours_links = smi(node, "nvlink", "-s", "-i", "0").stdout
            assert ours_links.count("\t Link ") == nvlink.count("\t Link ")
            assert ("does not have or support Nvlink" in ours_links) == ("does not have or support Nvlink" in nvlink)
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert node.unexpected_log_lines() == []


@pytest.mark.level("mount")
def test_mount_takes_a_profile_file(tmp_path):
    """`mokka mount --profile FILE` with a shipped profile copied under another name."""
    path = tmp_path / "my-board.yaml"
    path.write_text((REPO / "profiles" / "l40s.yaml").read_text().replace("name: l40s", "name: my-board", 1))
    node = MountedNode(tmp_path, str(path), gpus=2)
    node.mount()
    try:
        assert node.read("node/profile").strip() == "my-board"
        assert node.read("node/gpu_count").strip() == "2"
        assert "NVIDIA L40S" in node.read("gpu0/info")
    finally:
        node.umount()
        force_unmount(node.mnt)
    assert node.unexpected_log_lines() == []


def test_profile_list_and_its_alias():
    a = subprocess.run([*mokka_cmd(), "profile", "list"], capture_output=True, text=True, check=True).stdout
    b = subprocess.run([*mokka_cmd(), "profiles"], capture_output=True, text=True, check=True).stdout
    assert a == b and a.splitlines()[0].startswith("a100 ")


@pytest.mark.level("shims")
def test_node_captures_round_trip_through_a_mounted_node(tmp_path):
    """topo -m, nvlink -s, --query-gpu compute_cap (our nvidia-smi) and Debian's lspci -vvv (under
    `mokka run`) of a mounted h100 node, imported with the real H100 -q -x: the node's NUMA
    nodes, NVSwitches, PCI revision, NVLinks and compute capability come back as the profile has them."""
    node = MountedNode(tmp_path, "h100")
    node.mount()
    try:
        env = consumer_env(node.state_dir / "state")
        tool = str(node.path("driver/usr/bin/nvidia-smi"))
        outs = {}
        for name, args in (("topo.txt", ["topo", "-m"]), ("nvlink.txt", ["nvlink", "-s"]),
                           ("cc.csv", ["--query-gpu=name,compute_cap", "--format=csv"])):
            outs[name] = subprocess.run([tool, *args], env=env, capture_output=True, text=True, timeout=20,
                                        check=True).stdout
        for name, args in (("lspci-nn.txt", ["-vvv", "-nn", "-d", "10de:"]), ("lspci.txt", ["-vvv", "-d", "10de:"])):
            outs[name] = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--", "lspci", *args],
                                        env=node.env, capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        node.umount()
        force_unmount(node.mnt)
    shipped = load_profile("h100")
    xml = ("h100.xml", xml_text("h100"))
    for lspci in ("lspci-nn.txt", "lspci.txt"):
        files = [xml, *((n, t) for n, t in outs.items() if not n.startswith("lspci")), (lspci, outs[lspci])]
        imp, profile, _ = import_profile(files, "rt", ("h100", shipped))
        for key in ("compute_capability", "pci.revision", "nvlink.links", "nvlink.link_speed_gbps",
                    "node.numa_nodes", "node.nvswitches", "node.nvswitch_device_id", "node.hcas"):
            assert key not in imp.filled, key
        assert profile.compute_capability == shipped.compute_capability
        assert profile.pci.revision == shipped.pci.revision
        assert (profile.nvlink.links, profile.nvlink.link_speed_gbps) == (18, shipped.nvlink.link_speed_gbps)
        assert (profile.node.numa_nodes, profile.node.nvswitches) == (shipped.node.numa_nodes, shipped.node.nvswitches)
        assert profile.node.nvswitch_device_id == shipped.node.nvswitch_device_id
        # our topo -m lists no NIC columns yet: the import counts the NICs the legend shows
        assert profile.node.hcas == len(re.findall(r"^\s*NIC\d+:", outs["topo.txt"], re.M))
    assert node.unexpected_log_lines() == []


def test_an_older_layout_power_draw():
    """555 prints one <power_draw>; 525 and before a <power_readings> section: both give idle_w and limits."""
    text = xml_text("t4")
    one = re.sub(r"<average_power_draw>.*?</average_power_draw>\s*<instant_power_draw>(.*?)</instant_power_draw>",
                 r"<power_draw>\1</power_draw>", text)
    assert one != text
    _, profile, _ = import_profile([("c.xml", one)], "x", ("t4", load_profile("t4")))
    assert profile.power.idle_w == load_profile("t4").power.idle_w
    old = one.replace("gpu_power_readings>", "power_readings>")
    _, profile, _ = import_profile([("c.xml", old)], "x", ("t4", load_profile("t4")))
    assert profile.power == load_profile("t4").power


# --- text captures: partial and older layouts, CUDA's deviceQuery ---------------------------------


def text_capture(name: str) -> str:
    return (CAPTURES / name).read_text()


def test_a_truncated_text_capture_is_refused_where_it_ends():
    """A -q pasted short (the last GPU's section ends before its Processes line) or taken with
    -d (a partial section) is refused, naming the GPU and the line it stops at."""
    text = text_capture(TEXT_BOARDS["a100-80gb"][0])
    cut = text[: text.index("GPU 00000000:D4:00.0")] + text[text.index("GPU 00000000:D4:00.0"):].split("    Clocks\n")[0]
    msg = refused(cut, fill="a100")
    assert "GPU 00000000:D4:00.0's section ends at line" in msg and "without its Processes line" in msg
    partial = text_capture(TEXT_BOARDS["l4"][0]).split("    Processes")[0]
    assert "truncated or partial nvidia-smi -q" in refused(partial, fill="l40s")


def test_device_query_gives_the_cuda_properties_and_must_be_of_the_board():
    with pytest.raises(ImportRefused) as e:
        imported("l4")
    assert "sm_count" not in str(e.value) and "compute_capability" not in str(e.value) and "  nvlink.links" in str(e.value)
    imp, profile, _ = imported("l4", fill="l40s")
    assert not {"sm_count", "l2_cache_bytes", "memory.bus_width_bits", "compute_capability"} & set(imp.filled)
    assert (profile.sm_count, profile.l2_cache_bytes, profile.memory.bus_width_bits) == (58, 50331648, 192)
    assert profile.compute_capability == "8.9" and "deviceQuery (device 0, NVIDIA L4)" in imp.origin["sm_count"]
    other = text_capture("deviceQuery.h100-nvl.txt")
    msg = refused(text_capture(TEXT_BOARDS["l4"][0]), ("dq.txt", other), fill="l40s")
    assert "several different boards" in msg and "'NVIDIA H100 NVL'" in msg and "'NVIDIA L4'" in msg
    assert "without a 'Device 0" in refused(text_capture(TEXT_BOARDS["l4"][0]),
                                             ("dq.txt", "deviceQuery Starting...\n\nResult = FAIL\n"), fill="l40s")


def test_an_older_text_layout_without_the_architecture():
    """Drivers before 510 print no Product Architecture (nor the PCI class, in -q before 550):
    refused without --fill-from, which then gives it, marked; 535's one Power Draw is read."""
    text = text_capture(TEXT_BOARDS["a10g"][0])
    old = text.replace("    Product Architecture                  : Ampere\n", "").replace("535.247.01", "470.256.02")
    msg = refused(old, fill=None)
    assert "does not print the architecture of NVIDIA A10G" in msg and "--fill-from" in msg
    imp, profile, _ = import_profile([("old.txt", old)], "x", ("a100", load_profile("a100")))
    assert profile.architecture == "Ampere" and imp.origin["architecture"].startswith("FILLED from a100")
    assert profile.power.idle_w == 60.3 and "Power Draw" in imp.origin["power.idle_w"]
    assert "pci.class_code" in imp.filled and profile.node.driver_version == "470.256.02"
