"""Renderers: proc/modules and sys/module/nvidia* (exact lines, per driver branch, the host's lines
validated), the MIG capability numbering (proc/driver/nvidia-caps/mig-minors and the function the
MIG model renders instance capabilities with), and the host reader at the daemon's edge."""
from __future__ import annotations

import logging
import os
import re

import pytest
from helpers_vfs import NOW, entry, listdir, make_node, read

from mokkafs.daemon.host_modules import HostModules
from mokkafs.render.modules import host_lines, render_proc_modules
from mokkafs.render.proc_nvidia import MigCapability, mig_capabilities, mig_minor, render_mig_minors
from mokkafs.render.tree import root
from mokkafs.render.vfs import Ctx, Symlink, Tree

pytestmark = pytest.mark.level("render")

# 580.105.08 on 8 x H100 with 8 HCAs: sizes from a 580.126.16 capture, peermem on an RDMA node.
H100_MODULES = (
    "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia_uvm 2232320 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia_drm 151552 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia_modeset 1908736 2 nvidia_drm, Live 0x0000000000000000 (OE)\n"
    "nvidia 111489024 100 nvidia_uvm,nvidia_peermem,nvidia_drm,nvidia_modeset, Live 0x0000000000000000 (OE)\n"
)
# 550.90.12 (H200 profile), no HCAs: before 580 nvidia_drm uses nvidia only through nvidia_modeset.
H200_NO_HCA_MODULES = (
    "nvidia_uvm 1605632 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia_drm 69632 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia_modeset 1286144 1 nvidia_drm, Live 0x0000000000000000 (OE)\n"
    "nvidia 56623104 26 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (OE)\n"
)

# Real lines (Ubuntu 22.04 and a root reader's addresses), a module without unload support, and a
# permanent one: kept, with the address zeroed.
GOOD_HOST = [
    ("fuse 176128 9 - Live 0xffffffffc0a12000", "fuse 176128 9 - Live 0x0000000000000000"),
    ("ip_tables 36864 5 iptable_nat,iptable_filter, Live 0xffffffffc1000000 (E)",
     "ip_tables 36864 5 iptable_nat,iptable_filter, Live 0x0000000000000000 (E)"),
    ("zfs 6418432 3 - Loading 0xffffffffc1a00000 (POE+)", "zfs 6418432 3 - Loading 0x0000000000000000 (POE+)"),
    ("vfio 69632 2 vfio_pci_core,[permanent], Live 0x0000000000000000",
     "vfio 69632 2 vfio_pci_core,[permanent], Live 0x0000000000000000"),
    ("sd_mod 73728 - - Live 0xffffffffc0100000", "sd_mod 73728 - - Live 0x0000000000000000"),
]
BAD_HOST = [
    "",
    "broken line",
    "nosize abc 0 - Live 0x0",
    "evil 1 0 - Live 0x0\nnvidia 1 0 - Live 0x0",  # two lines: the second is the host's nvidia
    "nvidia 56823808 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (PO)",  # the host's driver
    "nvidia_uvm 1 0 - Live 0x0",
    "spaced  1 0 - Live 0x0",
    "x 1 0 - Live 0xzz",
    "x 1 0 - Dead 0x0",
    "x 1 0 a,b Live 0x0",  # users without their trailing commas
    "x\t1 0 - Live 0x0",
    "x 1 0 - Live 0x0 (lower)",
    "x 1 0 - Live 0x0 (OE) trailing",
    "m\u00e9 1 0 - Live 0x0",
    "a" * 57 + " 1 0 - Live 0x0",
]


def test_h100_lists_the_driver_modules_as_a_580_node_does():
    assert read(make_node("h100"), "proc/modules").decode() == H100_MODULES


def test_a_550_node_without_hcas_has_the_older_sizes_and_no_peermem():
    node = make_node("h200", hcas=0, gpus=2)
    assert read(node, "proc/modules").decode() == H200_NO_HCA_MODULES


def test_the_host_lines_follow_the_driver_modules():
    node = make_node("h100")
    host = "".join(line + "\n" for line, _ in GOOD_HOST)
    assert render_proc_modules(node.config, host) == H100_MODULES + "".join(want + "\n" for _, want in GOOD_HOST)
    # what mig-parted and the GPU Operator's validator look for: a line whose first field is nvidia
    tree = Tree(root(node.config, host_modules=lambda: host))
    text = read(node, "proc/modules", tree).decode()
    assert [ln.split()[0] for ln in text.splitlines()].count("nvidia") == 1
    assert text.endswith("sd_mod 73728 - - Live 0x0000000000000000\n")


@pytest.mark.parametrize("good,want", GOOD_HOST)
def test_a_well_formed_host_line_is_kept_with_its_address_zeroed(good, want):
    assert host_lines(good) == [want + "\n"]


@pytest.mark.parametrize("bad", BAD_HOST)
def test_a_malformed_host_line_or_the_hosts_own_driver_is_dropped(bad):
    assert [line for line in host_lines(bad) if not line.startswith("evil ")] == []


def test_host_lines_are_capped():
    many = "m 1 0 - Live 0x0\n" * 20000
    assert len(host_lines(many)) == 8192


def test_the_tree_reads_the_host_at_every_open():
    node = make_node("h100")
    lines = iter(["fuse 1 0 - Live 0x0\n", "fuse 1 0 - Live 0x0\nloop 2 0 - Live 0x0\n"])
    tree = Tree(root(node.config, host_modules=lambda: next(lines)))
    f = entry(node, "proc/modules", tree)
    ctx = Ctx(node, NOW)
    assert f.read(ctx).decode().endswith("fuse 1 0 - Live 0x0000000000000000\n")
    assert f.read(ctx).decode().endswith("loop 2 0 - Live 0x0000000000000000\n")


def test_sys_module_agrees_with_proc_modules():
    """Cross-surface: lsmod takes the size from coresize, the count from refcnt and the users from
    holders/; each must say what the module's /proc/modules line says."""
    for profile in ("h100", "h200", "gb200", "l40s"):
        node = make_node(profile)
        lines = read(node, "proc/modules").decode().splitlines()
        assert listdir(node, "sys/module") == sorted(ln.split()[0] for ln in lines)
        for line in lines:
            name, size, refcnt, used_by = line.split()[:4]
            base = f"sys/module/{name}"
            assert read(node, f"{base}/coresize") == f"{size}\n".encode()
            assert read(node, f"{base}/refcnt") == f"{refcnt}\n".encode()
            assert read(node, f"{base}/initstate") == b"live\n"
            assert read(node, f"{base}/version") == f"{node.config.driver_version}\n".encode()
            assert read(node, f"{base}/taint") == b"OE\n"
            holders = listdir(node, f"{base}/holders")
            assert holders == sorted(used_by.rstrip(",").split(",")) if used_by != "-" else holders == []
            for h in holders:
                assert entry(node, f"{base}/holders/{h}").target == f"../../{h}"


def test_sys_module_parameters_are_the_readable_ones_with_the_driver_defaults():
    node = make_node("h100")
    assert "parameters" not in listdir(node, "sys/module/nvidia")  # NVreg_* are declared with mode 0
    assert read(node, "sys/module/nvidia_uvm/parameters/uvm_disable_hmm") == b"N\n"
    assert read(node, "sys/module/nvidia_uvm/parameters/uvm_ats_mode") == b"1\n"
    assert entry(node, "sys/module/nvidia_uvm/parameters/uvm_ats_mode").perm == 0o444
    assert read(node, "sys/module/nvidia_drm/parameters/modeset") == b"N\n"
    assert entry(node, "sys/module/nvidia_drm/parameters/modeset").perm == 0o400
    assert read(node, "sys/module/nvidia_modeset/parameters/fail_malloc") == b"-1\n"
    assert read(make_node("gb200"), "sys/module/nvidia_uvm/parameters/uvm_disable_hmm") == b"Y\n"
    link = entry(node, "sys/module/nvidia/drivers/pci:nvidia")
    assert isinstance(link, Symlink) and link.target == "../../../bus/pci/drivers/nvidia"


def test_the_driver_root_carries_proc():
    """nvidia-container-toolkit joins the driver root with /proc/driver/nvidia-caps/mig-minors."""
    node = make_node("h100")
    assert read(node, "driver/proc/driver/nvidia-caps/mig-minors") == read(node, "proc/driver/nvidia-caps/mig-minors")
    assert read(node, "driver/proc/modules") == read(node, "proc/modules")


# MIG capabilities: the driver's pre-enumerated numbering, checked against the numbers NVIDIA's MIG
# user guide and nvidia-container-toolkit's comments quote.
def test_mig_minors_is_complete_in_the_drivers_numbering():
    text = render_mig_minors()
    lines = text.splitlines()
    assert len(lines) == 2 + 32 * 15 * 9
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    for quoted in ("gpu3/gi3/ci3/access 439", "gpu6/gi11/ci7/access 920", "gpu31/gi14/ci7/access 4322"):
        assert quoted in lines
    assert lines[-1] == "gpu31/gi14/ci7/access 4322"
    numbers = [int(ln.rsplit(" ", 1)[1]) for ln in lines]
    assert numbers == list(range(1, 4323))  # dense, in order, each minor once
    for line in lines[2:]:
        gpu, gi, *rest = re.findall(r"\d+", line.rsplit(" ", 1)[0])
        ci = int(rest[0]) if rest else None
        assert mig_minor(int(gpu), int(gi), ci) == int(line.rsplit(" ", 1)[1])


def test_mig_capabilities_for_live_instances():
    # H100 GPU minor 0 with GPU instances 1 (two compute instances) and 2, and GPU minor 3's gi 3
    caps = mig_capabilities([(3, 3, 3), (0, 1, 1), (0, 1, 0), (0, 2, 0)])
    assert caps == [
        MigCapability("gpu0/mig/gi1/access", 12, 0o444),
        MigCapability("gpu0/mig/gi1/ci0/access", 13, 0o444),
        MigCapability("gpu0/mig/gi1/ci1/access", 14, 0o444),
        MigCapability("gpu0/mig/gi2/access", 21, 0o444),
        MigCapability("gpu0/mig/gi2/ci0/access", 22, 0o444),
        MigCapability("gpu3/mig/gi3/access", 435, 0o444),
        MigCapability("gpu3/mig/gi3/ci3/access", 439, 0o444),
    ]
    assert mig_capabilities([]) == []
    minors = dict(ln.rsplit(" ", 1) for ln in render_mig_minors().splitlines())
    for cap in caps:  # each matches the mig-minors line for the same path, without "/mig"
        assert int(minors[cap.path.replace("/mig/", "/")]) == cap.minor


@pytest.mark.parametrize("bad", [(32, 0, 0), (0, 15, 0), (0, 0, 8), (-1, 0, 0), (0, -1, 0), (0, 0, -1)])
def test_a_capability_outside_the_drivers_range_is_refused(bad):
    with pytest.raises(ValueError):
        mig_capabilities([bad])


# The daemon's edge: the host's file read at each open, never through a link, never blocking.
def test_host_modules_reads_a_regular_file(tmp_path):
    f = tmp_path / "modules"
    f.write_text("fuse 1 0 - Live 0x0\n")
    reader = HostModules(str(f))
    assert reader() == "fuse 1 0 - Live 0x0\n"
    f.write_text("loop 2 0 - Live 0x0\n")
    assert reader() == "loop 2 0 - Live 0x0\n"


def test_host_modules_missing_is_quietly_empty(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert HostModules(str(tmp_path / "none"))() == ""
    assert caplog.records == []


def test_host_modules_never_follows_a_link_nor_blocks_on_a_fifo(tmp_path, caplog, expect_log):
    expect_log("proc/modules lists the driver's modules only")
    real = tmp_path / "real"
    real.write_text("secret 1 0 - Live 0x0\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING, logger="mokkafs.daemon.host_modules"):
        via_link = HostModules(str(link))
        assert via_link() == "" and via_link() == ""
        assert HostModules(str(fifo))() == ""  # returns at once: O_NONBLOCK, then not a regular file
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [str(link), str(fifo)]  # once each


def test_host_modules_reads_at_most_a_mebibyte(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"m 1 0 - Live 0x0\n" * 100000)
    assert len(HostModules(str(f))()) == 1 << 20


def test_the_mirror_leaves_proc_modules_to_the_mount():
    """mokka run binds proc/modules from the mount, where it is read from the host at each open;
    a copy in the mirror would be the host's list as it was at the last event."""
    from mokkafs.daemon.mirror import render as mirror_render

    node = make_node("h100")
    items = mirror_render(Tree(root(node.config, host_modules=lambda: "fuse 1 0 - Live 0x0\n")), Ctx(node, NOW))
    assert "proc/modules" not in items and "proc/devices" in items
    assert items["sys/module/nvidia/coresize"] == ("f", 0o444, b"111489024\n")
