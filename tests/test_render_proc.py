"""/proc/driver/nvidia, /proc/driver/nvidia-caps, /proc/devices and /dev: exact bytes in the
driver's formats (contracts §5) and the real majors and minors."""
from __future__ import annotations

import re

import pytest
from helpers_vfs import entry, listdir, make_node, read

from mokkafs.model.events import InjectXid, Reset
from mokkafs.render.vfs import CharDev

pytestmark = pytest.mark.level("render")

INFO_GPU0 = (
    b"Model: \t\t NVIDIA H100 80GB HBM3\n"
    b"IRQ:   \t\t 192\n"
    b"GPU UUID: \t GPU-9e2c0491-d406-54e9-ba8a-a243d4176fd6\n"
    b"Video BIOS: \t 96.00.99.00.01\n"
    b"Bus Type: \t PCIe\n"
    b"DMA Size: \t 52 bits\n"
    b"DMA Mask: \t 0xfffffffffffff\n"
    b"Bus Location: \t 0000:18:00.0\n"
    b"Device Minor: \t 0\n"
    b"GPU Firmware: \t 580.105.08\n"
    b"GPU Excluded:\t No\n"
)

TABLE = [
    (
        "proc/driver/nvidia/version",
        b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build  "
        b"(dvs-builder@U16-A24-23-2)  Thu Oct 16 21:09:41 UTC 2025\n"
        b"GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n",
    ),
    ("proc/driver/nvidia/gpus/0000:18:00.0/information", INFO_GPU0),
    ("proc/driver/nvidia/registry", b'Binary: ""\n'),
    ("proc/driver/nvidia/capabilities/mig/config", b"DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"),
    ("proc/driver/nvidia/capabilities/mig/monitor", b"DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n"),
]


@pytest.mark.parametrize("path,expected", TABLE, ids=[p for p, _ in TABLE])
def test_h100_bytes(path, expected):
    assert read(make_node(), path) == expected


def test_information_is_consistent_with_identity_and_sysfs():
    node = make_node()
    for ident in node.identities:
        info = read(node, f"proc/driver/nvidia/gpus/{ident.bdf.sysfs}/information").decode()
        assert f"Device Minor: \t {ident.minor}\n" in info and f"GPU UUID: \t {ident.uuid}\n" in info
        irq = re.search(r"IRQ:   \t\t (\d+)", info).group(1)
        assert read(node, f"sys/bus/pci/devices/{ident.bdf.sysfs}/irq") == f"{irq}\n".encode()


def test_older_gpus_have_a_47_bit_dma_mask_and_grace_is_aarch64():
    info = read(make_node("a100"), "proc/driver/nvidia/gpus/0000:18:00.0/information")
    assert b"DMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n" in info
    assert b"for aarch64  " in read(make_node("gb200"), "proc/driver/nvidia/version")


def test_params_lines_match_container_toolkit():
    params = read(make_node(), "proc/driver/nvidia/params").decode().splitlines()
    assert "ModifyDeviceFiles: 1" in params  # the exact line nvidia-ctk matches
    assert "DeviceFileMode: 438" in params and "EnableGpuFirmware: 18" in params
    assert not any(line.startswith("NVreg_") for line in params)
    assert params[-6:] == [f'{k}: ""' for k in
                           ("RegistryDwords", "RegistryDwordsPerDevice", "RmMsg", "GpuBlacklist",
                            "TemporaryFilePath", "ExcludedGpus")]


def test_mig_minors_formula():
    lines = read(make_node(), "proc/driver/nvidia-caps/mig-minors").decode().splitlines()
    table = dict(line.split(" ") for line in lines)
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert table["gpu3/gi3/ci3/access"] == "439" and table["gpu6/gi11/ci7/access"] == "920"
    assert lines[-1] == "gpu31/gi14/ci7/access 4322"
    assert len(lines) == 2 + 32 * 15 * 9


def test_proc_devices():
    text = read(make_node(), "proc/devices").decode()
    chars, blocks = text.split("\nBlock devices:\n")
    assert chars.startswith("Character devices:\n  1 mem\n")
    for line in ("195 nvidia-frontend", "195 nvidia-modeset", "510 nvidia-uvm", "506 nvidia-caps",
                 "505 nvidia-nvswitch", "231 infiniband_mad", "231 infiniband_verbs"):
        assert f"\n{line}\n" in chars + "\n"
    assert "  8 sd\n" in blocks
    majors = [int(line[:3]) for line in chars.splitlines()[1:]]
    assert majors == sorted(majors)


DEV = [
    ("dev/nvidia0", 195, 0, 0o666),
    ("dev/nvidia7", 195, 7, 0o666),
    ("dev/nvidiactl", 195, 255, 0o666),
    ("dev/nvidia-modeset", 195, 254, 0o666),
    ("dev/nvidia-uvm", 510, 0, 0o666),
    ("dev/nvidia-uvm-tools", 510, 1, 0o666),
    ("dev/nvidia-caps/nvidia-cap1", 506, 1, 0o400),
    ("dev/nvidia-caps/nvidia-cap2", 506, 2, 0o444),
    ("dev/nvidia-nvswitch0", 505, 0, 0o666),
    ("dev/nvidia-nvswitchctl", 505, 255, 0o666),
    ("dev/infiniband/umad1", 231, 1, 0o666),
    ("dev/infiniband/uverbs1", 231, 193, 0o666),
]


@pytest.mark.parametrize("path,major,minor,mode", DEV, ids=[d[0] for d in DEV])
def test_dev_nodes(path, major, minor, mode):
    node = entry(make_node(), path)
    assert isinstance(node, CharDev) and (node.major, node.minor, node.mode) == (major, minor, mode)


def test_lost_gpu_leaves_proc_gpus_but_keeps_its_dev_node():
    node = make_node()
    node.apply(InjectXid(2, 79), 1.0)
    assert "0000:24:00.0" not in listdir(node, "proc/driver/nvidia/gpus")
    assert len(listdir(node, "proc/driver/nvidia/gpus")) == 7
    assert "nvidia2" in listdir(node, "dev")
    node.apply(Reset(2), 2.0)
    assert "0000:24:00.0" in listdir(node, "proc/driver/nvidia/gpus")


def test_node_without_hcas_or_nvswitch_ids():
    node = make_node("b200")  # two NVSwitches, but no published PCI id: not on the bus
    assert not [n for n in listdir(node, "dev") if n.startswith("nvidia-nvswitch")]
    assert b"nvidia-nvswitch" not in read(node, "proc/devices")
    t4 = make_node("t4")
    assert "infiniband" not in listdir(t4, "dev") and b"infiniband" not in read(t4, "proc/devices")


# --- MIG capabilities: created and removed with the instances (docs/mig.md) -------------------------


def _mig(node, *lines: str) -> None:
    from mokkafs.model.commands import parse_line

    for line in lines:
        node.apply(parse_line(line).event, 1.0)


def _caps(node) -> dict[str, bytes]:
    """Every file under capabilities/gpu*/, by path."""
    out = {}

    def walk(path: str) -> None:
        e = entry(node, path)
        if isinstance(e, CharDev):
            return
        if hasattr(e, "children"):
            for name in listdir(node, path):
                walk(f"{path}/{name}")
        else:
            out[path] = read(node, path)

    for top in listdir(node, "proc/driver/nvidia/capabilities"):
        if top.startswith("gpu"):
            walk(f"proc/driver/nvidia/capabilities/{top}")
    return out


def test_mig_capability_files_and_nodes_come_and_go_with_the_instances():
    node = make_node(gpus=4)
    assert listdir(node, "proc/driver/nvidia/capabilities") == ["mig"]
    assert listdir(node, "dev/nvidia-caps") == ["nvidia-cap1", "nvidia-cap2"]
    _mig(node, "gpu=2 mig enable")
    assert listdir(node, "proc/driver/nvidia/capabilities") == ["gpu2", "mig"]
    assert listdir(node, "proc/driver/nvidia/capabilities/gpu2/mig") == []
    _mig(node, "gpu=2 mig create 3g.40gb,1g.10gb", "gpu=2 mig create_gi 1g.10gb")
    base = "proc/driver/nvidia/capabilities/gpu2/mig"
    gis = sorted(int(n[2:]) for n in listdir(node, base))
    assert len(gis) == 3
    caps = _caps(node)
    minors = []
    for gi in gis:
        has_ci = f"{base}/gi{gi}/ci0/access" in caps
        want = 3 + 135 * 2 + 9 * gi
        assert caps[f"{base}/gi{gi}/access"] == f"DeviceFileMinor: {want}\nDeviceFileMode: 292\nDeviceFileModify: 1\n".encode()
        minors.append(want)
        if has_ci:
            assert caps[f"{base}/gi{gi}/ci0/access"].startswith(f"DeviceFileMinor: {want + 1}\n".encode())
            minors.append(want + 1)
    assert sum(f"{base}/gi{gi}/ci0/access" in caps for gi in gis) == 2  # create_gi made no compute instance
    assert listdir(node, "dev/nvidia-caps") == sorted(["nvidia-cap1", "nvidia-cap2"] + [f"nvidia-cap{m}" for m in minors])
    for m in minors:
        dev = entry(node, f"dev/nvidia-caps/nvidia-cap{m}")
        assert isinstance(dev, CharDev) and (dev.major, dev.minor, dev.mode) == (506, m, 0o444)
    node.apply(InjectXid(2, 79), 2.0)  # off the bus: no instances on any surface
    assert listdir(node, "proc/driver/nvidia/capabilities") == ["mig"]
    assert listdir(node, "dev/nvidia-caps") == ["nvidia-cap1", "nvidia-cap2"]
    node.apply(Reset(2), 3.0)  # a reset destroys the instances; MIG mode stays on
    assert listdir(node, "proc/driver/nvidia/capabilities") == ["gpu2", "mig"]
    assert listdir(node, f"{base}") == [] and listdir(node, "dev/nvidia-caps") == ["nvidia-cap1", "nvidia-cap2"]


@pytest.mark.parametrize("profile", ["gb200", "gb300"])
def test_nvlink_fabric_boards_have_the_imex_and_fabric_management_capabilities(profile):
    """Multi-node NVLink boards: the compute-domain plugin opens fabric-imex-mgmt (minor 4323,
    root's) to prepare its daemon's claim; nvidia-caps lists the system and NVLink minors."""
    node = make_node(profile)
    assert read(node, "proc/driver/nvidia/capabilities/fabric-imex-mgmt") == \
        b"DeviceFileMinor: 4323\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    assert read(node, "proc/driver/nvidia-caps/sys-minors") == b"fabric-imex-mgmt 4323\n"
    assert read(node, "proc/driver/nvidia-caps/nvlink-minors") == b"fabric-mgmt 0\n"
    dev = entry(node, "dev/nvidia-caps/nvidia-cap4323")
    assert isinstance(dev, CharDev) and (dev.minor, dev.mode) == (4323, 0o400)


def test_other_boards_have_no_fabric_capabilities():
    node = make_node("h100")  # an HGX NVSwitch baseboard: one node's fabric, no IMEX
    assert "fabric-imex-mgmt" not in listdir(node, "proc/driver/nvidia/capabilities")
    assert listdir(node, "proc/driver/nvidia-caps") == ["mig-minors"]
    assert "nvidia-cap4323" not in listdir(node, "dev/nvidia-caps")
