"""InfiniBand sysfs renderer and the per-port control file: exact bytes (contracts §4), strict
parsing (a bad write changes nothing), and the HCA state's persistence."""
from __future__ import annotations

import pytest
from helpers_vfs import entry, listdir, make_node, read

from mokkafs.model.commands import hca, parse_write
from mokkafs.model.events import IbPortCommand, InvalidCommand, Reset
from mokkafs.daemon.persist import StateDir
from mokkafs.render.vfs import File

pytestmark = pytest.mark.level("render")

IB0 = "sys/class/infiniband/mlx5_0"
PORT0 = f"{IB0}/ports/1"

UP_TABLE = [
    (f"{IB0}/node_type", b"1: CA\n"),
    (f"{IB0}/node_guid", b"a088:c203:0091:691b\n"),
    (f"{IB0}/sys_image_guid", b"a088:c203:0091:691b\n"),
    (f"{IB0}/fw_ver", b"28.43.3608\n"),
    (f"{IB0}/hw_rev", b"0\n"),
    (f"{IB0}/hca_type", b"MT4129\n"),
    (f"{IB0}/board_id", b"MT_0000000838\n"),
    (f"{IB0}/node_desc", b"testhost mlx5_0\n"),
    (f"{PORT0}/state", b"4: ACTIVE\n"),
    (f"{PORT0}/phys_state", b"5: LinkUp\n"),
    (f"{PORT0}/rate", b"400 Gb/sec (4X NDR)\n"),
    (f"{PORT0}/lid", b"0x12\n"),
    (f"{PORT0}/sm_lid", b"0x1\n"),
    (f"{PORT0}/lid_mask_count", b"0\n"),
    (f"{PORT0}/sm_sl", b"0\n"),
    (f"{PORT0}/cap_mask", b"0xa751e848\n"),
    (f"{PORT0}/link_layer", b"InfiniBand\n"),
    (f"{PORT0}/gids/0", b"fe80:0000:0000:0000:a088:c203:0091:691b\n"),
    (f"{PORT0}/pkeys/0", b"0xffff\n"),
    (f"{PORT0}/counters/symbol_error", b"0\n"),
    (f"{PORT0}/counters/link_downed", b"0\n"),
    ("sys/class/infiniband/mlx5_3/ports/1/lid", b"0x15\n"),
    ("sys/class/infiniband_mad/abi_version", b"5\n"),
    ("sys/class/infiniband_mad/umad2/ibdev", b"mlx5_2\n"),
    ("sys/class/infiniband_mad/umad2/port", b"1\n"),
    ("sys/class/infiniband_verbs/abi_version", b"6\n"),
    ("sys/class/infiniband_verbs/uverbs2/ibdev", b"mlx5_2\n"),
    ("sys/class/infiniband_verbs/uverbs2/dev", b"231:194\n"),
]


@pytest.mark.parametrize("path,expected", UP_TABLE, ids=[p for p, _ in UP_TABLE])
def test_active_port_bytes(path, expected):
    assert read(make_node(), path) == expected


DOWN_TABLE = [
    (f"{PORT0}/state", b"1: DOWN\n"),
    (f"{PORT0}/phys_state", b"3: Disabled\n"),
    (f"{PORT0}/rate", b"10 Gb/sec (4X SDR)\n"),
    (f"{PORT0}/lid", b"0xffff\n"),
    (f"{PORT0}/sm_lid", b"0x0\n"),
    (f"{PORT0}/counters/link_downed", b"1\n"),
    (f"{PORT0}/counters/symbol_error", b"7\n"),
    (f"{PORT0}/counters/port_rcv_errors", b"3\n"),
    ("sys/class/infiniband/mlx5_1/ports/1/state", b"4: ACTIVE\n"),
]


@pytest.mark.parametrize("path,expected", DOWN_TABLE, ids=[p for p, _ in DOWN_TABLE])
def test_downed_port_bytes(path, expected):
    node = make_node()
    for cmd in (b"down\n", b"errors 7", b"errors port_rcv_errors 3\n"):
        node.apply(parse_write(hca(0), "port", cmd), 1.0)
    assert read(node, path) == expected


def test_rates_and_models_per_profile():
    assert read(make_node("a100"), f"{PORT0}/rate") == b"200 Gb/sec (4X HDR)\n"
    assert read(make_node("a100"), f"{IB0}/hca_type") == b"MT4123\n"
    assert read(make_node("gb300"), f"{PORT0}/rate") == b"800 Gb/sec (4X XDR)\n"
    assert listdir(make_node("l40s"), "sys/class/infiniband") == []  # an Ethernet-only node


def test_class_links_point_into_the_hca_device():
    node = make_node()
    target = entry(node, IB0).resolve(None)
    assert target == "../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0/infiniband/mlx5_0"
    assert read(node, f"{IB0}/device/vendor") == b"0x15b3\n"
    assert listdir(node, "sys/class/infiniband") == [f"mlx5_{j}" for j in range(8)]


BAD = [b"", b"\n", b"DOWN", b"down now", b"errors", b"errors -1", b"errors 0", b"errors 99999999",
       b"errors bogus 1", b"errors symbol_error", b" down", b"down\n\n", b"up\x00", b"\xffup", b"errors  1",
       b"x" * 300]


@pytest.mark.parametrize("data", BAD)
def test_bad_port_writes_are_einval_and_change_nothing(data):
    node = make_node()
    ctl = entry(node, "ib/mlx5_0/port1")
    assert isinstance(ctl, File)
    before = read(node, "ib/mlx5_0/port1")
    with pytest.raises(InvalidCommand):
        node.apply(ctl.write(data), 1.0)
    assert read(node, "ib/mlx5_0/port1") == before
    assert node.generation == 0


def test_event_validation():
    node = make_node(hcas=2)
    with pytest.raises(InvalidCommand):
        node.apply(IbPortCommand(None, 5, 1, "down"), 1.0)
    with pytest.raises(InvalidCommand):
        IbPortCommand(0, 0, 1, "down")  # belongs to the node, not a GPU
    with pytest.raises(InvalidCommand):
        IbPortCommand(None, 0, 2, "down")
    assert all(not h.port_down for h in node.hcas)


def test_control_file_reads_state_and_counters():
    node = make_node()
    node.apply(parse_write(hca(1), "port", b"down"), 1.0)
    text = read(node, "ib/mlx5_1/port1").decode()
    assert text.startswith("state 1: DOWN\nphys_state 3: Disabled\nrate 10 Gb/sec (4X SDR)\nsymbol_error 0\n")
    assert "link_downed 1\n" in text
    node.apply(parse_write(hca(1), "port", b"up"), 2.0)
    assert read(node, "sys/class/infiniband/mlx5_1/ports/1/state") == b"4: ACTIVE\n"
    assert read(node, "sys/class/infiniband/mlx5_1/ports/1/counters/link_downed") == b"1\n"
    node.apply(Reset(None), 3.0)
    assert read(node, "sys/class/infiniband/mlx5_1/ports/1/counters/link_downed") == b"0\n"


def test_hca_state_survives_a_restart(tmp_path):
    node = make_node()
    state = StateDir(tmp_path)
    state.open(node)
    node.apply(parse_write(hca(2), "port", b"down"), 1.0)
    node.apply(parse_write(hca(2), "port", b"errors 4"), 1.0)
    state.save_hcas(node)
    again = make_node()
    assert StateDir(tmp_path).open(again) is True
    assert again.hcas[2].port_down and again.hcas[2].counters["symbol_error"] == 4
    assert read(again, "sys/class/infiniband/mlx5_2/ports/1/phys_state") == b"3: Disabled\n"


def test_corrupt_hca_state_is_refused(tmp_path):
    from mokkafs.daemon.persist import StateError

    StateDir(tmp_path).open(make_node())
    (tmp_path / "hcas.json").write_text('[{"port_down": "maybe"}]')
    with pytest.raises(StateError, match="hcas.json"):
        StateDir(tmp_path).open(make_node())
