"""What a restarted daemon finds in its state directory and refuses by name instead of losing
silently or failing forever: a scenario record whose start no clock can show."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from mokkafs.model.scenario import request_bytes
from test_scenarios import RESUMED, daemon
from test_virtual_time import read, write

pytestmark = pytest.mark.level("daemon")


async def _resume_far_start(base: Path, mock) -> str:
    async with daemon(base, mock) as d:
        assert not await write(d.ops, "node/scenario", request_bytes(RESUMED))
    record = json.loads((base / "state" / "scenario.json").read_text())
    record["start"] = 1e20
    (base / "state" / "scenario.json").write_text(json.dumps(record))
    async with daemon(base, mock) as d:
        return await read(d.ops, "node/scenario")


def test_a_restored_scenario_starting_past_any_clock_is_aborted_not_eio_forever(tmp_path, expect_log):
    expect_log(r"scenario\.json: scenario left by the previous daemon aborted: seed, speed or start out of range")
    mock = trio.testing.MockClock()
    out = trio.run(_resume_far_start, tmp_path, mock, clock=mock)
    assert out.startswith("state: idle\nlast: aborted after a restart: seed, speed or start out of range")
    assert not (tmp_path / "state" / "scenario.json").exists()


def _saved(tmp_path):
    from mokkafs.daemon.controller import Controller
    from mokkafs.daemon.persist import StateDir
    from mokkafs.model import Node, compose
    from mokkafs.model.events import InjectXid, Pin
    from mokkafs.model.profiles import load_profile

    def make():
        node = Node(compose(load_profile("h100"), gpus=2, hostname="restore"), 1_800_000_000.0)
        return node, StateDir(tmp_path / "state")

    node, state = make()
    state.open(node)
    ctl = Controller(node, state, clock=lambda: 1_800_000_001.0)
    ctl.apply(InjectXid(1, 79))
    ctl.apply(Pin(0, "temperature", (88,)))
    return make


@pytest.mark.parametrize("name, change, words", [
    ("hcas.json", lambda d: None, "hcas.json: not a list of HCA records"),
])
def test_a_damaged_record_is_refused_by_name_not_restored_as_zeros(tmp_path, name, change, words):
    from mokkafs.daemon.persist import StateError

    make = _saved(tmp_path)
    path = tmp_path / "state" / name
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    node, state = make()
    with pytest.raises(StateError, match=words):
        state.open(node)


def test_an_emptied_event_log_is_warned_about(tmp_path, expect_log):
    make = _saved(tmp_path)
    (tmp_path / "state" / "events.log").write_bytes(b"")
    expect_log(r"events\.log: empty, yet the GPU records show past events")
    node, state = make()
    assert state.open(node)
    assert node.gpus[1].last_xid == 79
