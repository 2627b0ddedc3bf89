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
    expect_log(r"scenario\.json: scenario left by the previous daemon aborted: start: 1e\+20 out of range")
    mock = trio.testing.MockClock()
    out = trio.run(_resume_far_start, tmp_path, mock, clock=mock)
    assert out.startswith("state: idle\nlast: aborted after a restart: start: 1e+20 out of range")
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


def _without(key):
    return lambda d: {k: v for k, v in d.items() if k != key}


@pytest.mark.parametrize("name, change, words", [
    ("hcas.json", lambda d: None, "hcas.json: not a list of HCA records"),
    # a GPU record without a key it has always held: the counters, pins or faults it held are
    # not there to restore; zeros would lose them silently
    ("gpu1.json", _without("ecc"), r"gpu1\.json: ecc: missing, where the daemon saves it in every record"),
    ("gpu0.json", _without("pins"), r"gpu0\.json: pins: missing"),
    ("gpu1.json", _without("xid_counts"), r"gpu1\.json: xid_counts: missing"),
    ("hcas.json", lambda d: [{"port_down": True}, *d[1:]], r"hcas\.json: HCA 0: counters: missing"),
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


def test_a_gpu_record_from_before_the_settings_and_mig_still_restores(tmp_path):
    """Keys added since the first state format (the settings, MIG) may be absent: a record from
    before them, which takes their defaults."""
    make = _saved(tmp_path)
    path = tmp_path / "state" / "gpu1.json"
    record = json.loads(path.read_text())
    for key in ("mig", "persistence_mode", "compute_mode", "locked_clocks", "ecc_mode", "ecc_mode_current",
                "accounting_mode", "applications_clocks", "locked_memory_clocks"):
        record.pop(key)
    path.write_text(json.dumps(record))
    node, state = make()
    assert state.open(node) and node.gpus[1].last_xid == 79


@pytest.mark.level("mount")
@pytest.mark.parametrize("name", ["scenario.json", "state", ".gpu0.json.tmp", "state.procs.id"])
def test_a_directory_in_place_of_a_state_file_is_named_not_an_errno(tmp_path, name):
    """`[Errno 21] Is a directory: 14` named neither the file nor the rule: a refusal names the
    file; the process table's id file (read once at start, for adoption) is passed over."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, MOKKA_RUNTIME_DIR=str(tmp_path / "pids"))
    cmd = [sys.executable, "-m", "mokkafs.cli"]
    state, mnt = tmp_path / "state", tmp_path / "mnt"
    state.mkdir(mode=0o755)
    (state / name).mkdir()
    try:
        out = subprocess.run([*cmd, "mount", str(mnt), "--gpus", "1", "--state-dir", str(state)], capture_output=True,
                             text=True, timeout=60, env=env)
    finally:
        if os.path.ismount(mnt):
            subprocess.run([*cmd, "umount", str(mnt)], capture_output=True, timeout=60, env=env)
    assert "Errno" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    if name == "state.procs.id":
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{state / name}: Is a directory" in lines[0], out.stderr
