"""The state directory: round trips, and every way a state directory can be wrong."""
from __future__ import annotations

import json

import pytest

from mokkafs.controller import Controller
from mokkafs.model import Node, compose
from mokkafs.model.events import InjectEcc, InjectXid, NvLinkCommand, Pin
from mokkafs.persist import StateDir, StateError
from mokkafs.profiles import load_profile

T0 = 1_800_000_000.0


def make(tmp_path, gpus=4, profile="h100", host="persist"):
    node = Node(compose(load_profile(profile), gpus=gpus, hostname=host), T0)
    state = StateDir(tmp_path / "state")
    restored = state.open(node)
    return node, state, restored


def test_faults_counters_and_pins_survive_a_restart(tmp_path):
    node, state, restored = make(tmp_path)
    assert not restored
    ctl = Controller(node, state, clock=lambda: T0 + 1)
    for event in (
        InjectXid(1, 79),
        InjectXid(2, 48),
        InjectEcc(3, "sbe", 5, "l2"),
        Pin(0, "temperature", (88,)),
        NvLinkCommand(3, 4, "down"),
    ):
        ctl.apply(event)
    again, _, restored = make(tmp_path)
    assert restored
    assert [g.to_dict() for g in again.gpus] == [g.to_dict() for g in node.gpus]
    assert [e.text for e in again.log] == [e.text for e in node.log]
    assert again.readings(0, T0 + 50).temperature_c == 88


def test_a_state_dir_of_another_node_is_refused(tmp_path):
    make(tmp_path, gpus=4)
    with pytest.raises(StateError, match="holds node"):
        make(tmp_path, gpus=8)


@pytest.mark.parametrize(
    "name,content",
    [
        ("gpu1.json", b"{not json"),
        ("gpu1.json", b""),
        ("gpu1.json", b'{"lost": "perhaps"}'),
        ("gpu1.json", b"[1, 2, 3]"),
        ("gpu1.json", b'{"ecc": {"volatile.corrected.moon": 1}}'),
        ("gpu1.json", b'{"t0": 1, "temp0": 29, "pcie_replay": -1}'),
        ("gpu1.json", b'{"t0": 1, "temp0": 29, "last_xid": -1}'),
        ("gpu1.json", b'{"t0": 1, "temp0": 29, "pins": {"temperature": ["abc"]}}'),
        ("gpu1.json", b'{"t0": 1, "temp0": 29, "pins": {"warp": [1]}}'),
        ("gpu1.json", b'{"t0": 1, "temp0": 29, "power_limit_w": -5}'),
        ("gpu1.json", b'{"t0": 1, "temp0": 29, "nvlink_down": [40]}'),
        ("node.json", b"\x00\x00\x00"),
    ],
)
def test_a_corrupt_state_file_is_a_clear_error_and_changes_nothing(tmp_path, name, content):
    node, state, _ = make(tmp_path)
    Controller(node, state, clock=lambda: T0).apply(InjectXid(0, 79))
    (tmp_path / "state" / name).write_bytes(content)
    saved = {p.name: p.read_bytes() for p in (tmp_path / "state").iterdir()}
    with pytest.raises(StateError) as err:
        make(tmp_path)
    assert "state" in str(err.value)
    assert {p.name: p.read_bytes() for p in (tmp_path / "state").iterdir()} == saved


def test_a_missing_gpu_file_is_a_clear_error(tmp_path):
    make(tmp_path)
    (tmp_path / "state" / "gpu2.json").unlink()
    with pytest.raises(StateError, match="gpu2.json"):
        make(tmp_path)


def test_a_torn_last_log_line_is_skipped_with_a_warning(tmp_path, expect_log):
    expect_log(r"skipping unreadable event-log line")
    node, state, _ = make(tmp_path)
    Controller(node, state, clock=lambda: T0).apply(InjectXid(0, 13))
    with open(tmp_path / "state" / "events.log", "ab") as f:
        f.write(b'[1800000000.0, 0, "NVRM: Xid (PCI:0000:18:00): 4')
    again, _, _ = make(tmp_path)
    assert [e.text for e in again.log] == [e.text for e in node.log]


def test_the_event_log_is_bounded_on_disk(tmp_path, monkeypatch):
    import mokkafs.model.node as node_mod
    import mokkafs.persist as persist_mod

    monkeypatch.setattr(node_mod, "LOG_LIMIT", 10)
    monkeypatch.setattr(persist_mod, "LOG_LIMIT", 10)
    node, state, _ = make(tmp_path)
    ctl = Controller(node, state, clock=lambda: T0)
    for _ in range(100):
        ctl.apply(InjectXid(0, 13))
    lines = (tmp_path / "state" / "events.log").read_bytes().splitlines()
    assert len(lines) <= 20
    assert json.loads(lines[-1])[2] == node.log[-1].text
