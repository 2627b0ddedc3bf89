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
