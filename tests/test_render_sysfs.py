"""PCI sysfs renderer: exact bytes per path against the kernel's formats (contracts §3), the config
space against `resource`, and Debian's real lspci reading a rendered copy (no mount needed)."""
from __future__ import annotations

import re
import struct
import subprocess

import pytest
from helpers_vfs import dump, entry, listdir, make_node, read, tree_for

from mokkafs.model.events import SetLost
from mokkafs.model.topology import pci_layout
from mokkafs.model.profiles import available_profiles
from mokkafs.render.sysfs_pci import config_space, cpulist, cpumask, resource_file

pytestmark = pytest.mark.level("render")

GPU0 = "sys/bus/pci/devices/0000:18:00.0"
GPU0_DIR = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
DOWN0 = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"

H100_TABLE = [
    (f"{GPU0}/vendor", b"0x10de\n"),
    (f"{GPU0}/device", b"0x2330\n"),
    (f"{GPU0}/subsystem_vendor", b"0x10de\n"),
    (f"{GPU0}/subsystem_device", b"0x16c1\n"),
    (f"{GPU0}/class", b"0x030200\n"),
    (f"{GPU0}/revision", b"0xa1\n"),
    (f"{GPU0}/irq", b"192\n"),
    (f"{GPU0}/numa_node", b"0\n"),
    (f"{GPU0}/enable", b"1\n"),
    (f"{GPU0}/local_cpulist", b"0-55,112-167\n"),
    (f"{GPU0}/local_cpus", b"00000000,000000ff,ffffffff,ffff0000,00000000,00ffffff,ffffffff\n"),
    ("sys/bus/pci/devices/0000:36:00.0/numa_node", b"1\n"),
    ("sys/bus/pci/devices/0000:36:00.0/local_cpulist", b"56-111,168-223\n"),
    (f"{GPU0}/current_link_speed", b"32.0 GT/s PCIe\n"),
    (f"{GPU0}/max_link_speed", b"32.0 GT/s PCIe\n"),
    (f"{GPU0}/current_link_width", b"16\n"),
    (f"{GPU0}/max_link_width", b"16\n"),
    (f"{GPU0}/modalias", b"pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\n"),
    (
        f"{GPU0}/uevent",
        b"DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SUBSYS_ID=10DE:16C1\n"
        b"PCI_SLOT_NAME=0000:18:00.0\nMODALIAS=pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00\n",
    ),
    (
        f"{GPU0}/resource",
        b"0x0000000080000000 0x0000000080ffffff 0x0000000000040200\n"
        b"0x0000200000000000 0x0000201fffffffff 0x000000000014220c\n"
        + b"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
        + b"0x0000202000000000 0x0000202001ffffff 0x000000000014220c\n"
        + b"0x0000000000000000 0x0000000000000000 0x0000000000000000\n" * 9,
    ),
    ("sys/bus/pci/devices/0000:19:00.0/class", b"0x020700\n"),
    ("sys/bus/pci/devices/0000:19:00.0/vendor", b"0x15b3\n"),
    ("sys/bus/pci/devices/0000:19:00.0/device", b"0x1021\n"),
    ("sys/bus/pci/devices/0000:db:00.0/class", b"0x068000\n"),
    ("sys/bus/pci/devices/0000:db:00.0/device", b"0x22a3\n"),
    ("sys/bus/pci/devices/0000:15:01.0/class", b"0x060400\n"),
    ("sys/module/nvidia/version", b"580.105.08\n"),
]


@pytest.mark.parametrize("path,expected", H100_TABLE, ids=[p for p, _ in H100_TABLE])
def test_h100_bytes(path, expected):
    assert read(make_node(), path) == expected


def test_links_are_relative_and_depth_correct():
    node = make_node()
    assert entry(node, GPU0).resolve(None) == f"../../../{GPU0_DIR.removeprefix('sys/')}"
    assert entry(node, f"{GPU0_DIR}/driver").resolve(None) == "../../../../../../bus/pci/drivers/nvidia"
    assert entry(node, "sys/bus/pci/drivers/nvidia/0000:18:00.0").resolve(None) == (
        "../../../../" + GPU0_DIR.removeprefix("sys/")
    )
    assert entry(node, "sys/bus/pci/drivers/nvidia/module").resolve(None) == "../../../../module/nvidia"


def _caps(cfg: bytes) -> dict[int, int]:
    out, ptr = {}, cfg[0x34]
    while ptr:
        out[cfg[ptr]] = ptr
        ptr = cfg[ptr + 1]
    return out


@pytest.mark.parametrize("profile", available_profiles())
def test_config_space_agrees_with_resource(profile):
    """Every BAR in `config` sits where `resource` says (no `[virtual]` in lspci), every function
    has PM, MSI and a PCIe capability whose LnkCap is the device's max link."""
    node = make_node(profile)
    for fn in pci_layout(node.config).functions:
        cfg = config_space(fn)
        assert len(cfg) == 4096
        assert struct.unpack_from("<HH", cfg, 0) == (fn.vendor, fn.device)
        assert int.from_bytes(cfg[9:12], "little") == fn.class_code
        assert set(_caps(cfg)) == {0x01, 0x05, 0x10}
        pcie = _caps(cfg)[0x10]
        lnkcap = struct.unpack_from("<I", cfg, pcie + 0x0C)[0]
        assert (lnkcap & 0xF, (lnkcap >> 4) & 0x3F) == (fn.link_gen, fn.link_width)
        rows = [tuple(int(x, 16) for x in line.split()) for line in resource_file(fn).splitlines()]
        assert len(rows) == (17 if fn.is_bridge else 13)
        for i, (start, end, flags) in enumerate(rows[:6]):
            if fn.is_bridge or not start:
                continue
            low = struct.unpack_from("<I", cfg, 0x10 + 4 * i)[0]
            addr = low & ~0xF
            if low & 0x4:
                addr |= struct.unpack_from("<I", cfg, 0x14 + 4 * i)[0] << 32
            assert addr == start, (fn.bdf.sysfs, i)
            assert (end - start + 1) & (end - start) == 0  # a power of two


def test_cpu_masks():
    assert cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cpumask([0, 33], 64) == "00000002,00000001"


def test_lost_gpu_leaves_the_bus_and_comes_back():
    node = make_node()
    before = listdir(node, "sys/bus/pci/devices")
    node.apply(SetLost(2, True), 1.0)
    after = listdir(node, "sys/bus/pci/devices")
    assert set(before) - set(after) == {"0000:24:00.0"}
    assert "0000:24:00.0" not in listdir(node, "sys/bus/pci/drivers/nvidia")
    down = "sys/bus/pci/devices/0000:23:00.0"
    assert read(node, f"{down}/current_link_width") == b"0\n"
    assert read(node, f"{down}/current_link_speed") == b"2.5 GT/s PCIe\n"
    assert "0000:24:00.0" not in listdir(node, "sys/devices/pci0000:21/0000:21:01.0/0000:22:00.0/0000:23:00.0")
    node.apply(SetLost(2, False), 2.0)
    assert listdir(node, "sys/bus/pci/devices") == before
    assert read(node, f"{down}/current_link_width") == b"16\n"


def _lspci(root, *args) -> str:
    res = subprocess.run(
        ["lspci", "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", *args],
        capture_output=True, text=True, check=True,
    )
    return res.stdout


def pci_ids_name(vendor: int, device: int) -> str:
    """The name the installed pci.ids gives (Debian's copy writes `GH100[H100 SXM5 80GB]`)."""
    with open("/usr/share/misc/pci.ids", encoding="utf-8", errors="replace") as f:
        text = f.read()
    block = re.search(rf"^{vendor:04x}  .*?(?=^[0-9a-f]{{4}}  )", text, re.M | re.S).group(0)
    m = re.search(rf"^\t{device:04x}  (.*)$", block, re.M)
    return m.group(1) if m else "Device"  # lspci -nn: "Device [10de:2901]" for an unknown id


@pytest.mark.level("tools")
@pytest.mark.parametrize("profile", available_profiles())
def test_real_lspci_reads_a_rendered_copy(profile, tmp_path):
    node = make_node(profile)
    dump(node, "sys", tmp_path / "sys")
    p = node.profile
    listing = _lspci(tmp_path, "-nn")
    kind = "3D controller [0302]" if p.pci.class_code == 0x030200 else "VGA compatible controller [0300]"
    name = pci_ids_name(0x10DE, p.pci.device_id)
    line = f"{kind}: NVIDIA Corporation {name} [10de:{p.pci.device_id:04x}]"
    assert listing.count(line) == node.config.gpus, listing
    verbose = _lspci(tmp_path, "-vvv")
    assert "[virtual]" not in verbose
    assert verbose.count("Kernel driver in use: nvidia\n") == node.config.gpus
    assert "NUMA node:" in verbose and "LnkCap:" in verbose and "LnkSta:" in verbose
    tree = _lspci(tmp_path, "-t")
    assert f"[{p.node.pci_domain:04x}:15]" in tree


def test_h100_lspci_name_is_the_issue_s(tmp_path):
    """A real node's line, modulo the Debian pci.ids spelling without a space before '['."""
    dump(make_node(), "sys", tmp_path / "sys")
    listing = _lspci(tmp_path, "-nn")
    wanted = "3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]"
    assert any(line.split(" ", 1)[1].replace("GH100[", "GH100 [").startswith(wanted) for line in listing.splitlines())


@pytest.mark.parametrize("profile, vendor, product", [("h100", "NVIDIA", "DGXH100"), ("gb200", "NVIDIA", "GB200 NVL")])
def test_dmi_names_the_composition_s_system(profile, vendor, product):
    """GPU feature discovery's nvidia.com/gpu.machine is /sys/class/dmi/id/product_name."""
    from helpers_vfs import make_node, read

    node = make_node(profile)
    assert read(node, "sys/class/dmi/id/product_name") == f"{product}\n".encode()
    assert read(node, "sys/class/dmi/id/sys_vendor") == f"{vendor}\n".encode()
    assert read(node, "sys/class/dmi/id/board_name") == f"{product}\n".encode()


def test_a_composition_without_a_system_is_named_after_itself():
    from helpers_vfs import make_node, read

    node = make_node("l4")  # its composition (a PCIe server) names no system
    assert read(node, "sys/class/dmi/id/sys_vendor") == b"mokkafs\n"
    assert read(node, "sys/class/dmi/id/product_name") == f"{node.config.composition.name}\n".encode()


def test_device_files_and_mig_minors_are_made_at_first_look(monkeypatch):
    """Building the tree (every mount -> ready) renders no PCI device file, makes no gpuN/
    file and not the 4,322 lines of mig-minors: each is made when first looked at, then kept,
    with the same bytes."""
    from mokkafs.render import control, proc_nvidia, sysfs_pci

    made = {"config": 0, "mig-minors": 0, "gpuN": 0}

    def counted(name, real):
        def call(*a, **kw):
            made[name] += 1
            return real(*a, **kw)
        return call

    monkeypatch.setattr(sysfs_pci, "config_space", counted("config", sysfs_pci.config_space))
    monkeypatch.setattr(proc_nvidia, "render_mig_minors", counted("mig-minors", proc_nvidia.render_mig_minors))
    monkeypatch.setattr(control, "_gpu_files", counted("gpuN", control._gpu_files))
    proc_nvidia._mig_minors_file.cache_clear()
    node = make_node("h100")
    tree = tree_for(node)
    assert made == {"config": 0, "mig-minors": 0, "gpuN": 0}
    assert read(node, "gpu3/temperature", tree) == read(node, "gpu3/temperature", tree) and made["gpuN"] == 1
    bridge = "sys/bus/pci/devices/0000:15:01.0/config"  # a bridge's config is rendered once, then kept
    first = read(node, bridge, tree)
    assert made["config"] == 1 and read(node, bridge, tree) == first and made["config"] == 1
    minors = read(node, "proc/driver/nvidia-caps/mig-minors", tree)
    assert minors == proc_nvidia.render_mig_minors().encode() and made["mig-minors"] == 2
    read(node, "proc/driver/nvidia-caps/mig-minors", tree_for(node))  # another node, the same lines
    assert made["mig-minors"] == 2
