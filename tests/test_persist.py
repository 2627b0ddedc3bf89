"""The state directory: round trips, and every way a state directory can be wrong."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mokkafs.daemon.controller import Controller
from mokkafs.model import Node, compose
from mokkafs.model.events import InjectEcc, InjectXid, NvLinkCommand, Pin
from mokkafs.daemon.persist import StateDir, StateError
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("daemon")

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
    import mokkafs.daemon.persist as persist_mod

    monkeypatch.setattr(node_mod, "LOG_LIMIT", 10)
    monkeypatch.setattr(persist_mod, "LOG_LIMIT", 10)
    node, state, _ = make(tmp_path)
    ctl = Controller(node, state, clock=lambda: T0)
    for _ in range(100):
        ctl.apply(InjectXid(0, 13))
    lines = (tmp_path / "state" / "events.log").read_bytes().splitlines()
    assert len(lines) <= 20
    assert json.loads(lines[-1])[2] == node.log[-1].text


# --- counters saturate, restore validates, no links followed -------------------------

import os

from mokkafs.model.counters import EccCounter
from mokkafs.model.events import IbPortCommand
from mokkafs.model.state import counter_max


def test_ten_thousand_big_ecc_writes_saturate_and_restore(tmp_path, expect_log):
    expect_log(r"saturated at its maximum")
    node, state, _ = make(tmp_path)
    ctl = Controller(node, state, clock=lambda: T0)
    for _ in range(10_000):
        ctl.apply(InjectEcc(0, "sbe", 1_000_000))
        ctl.apply(NvLinkCommand(1, 2, "errors", 1_000_000))
    for _ in range(300):
        ctl.apply(IbPortCommand(None, 0, 1, "errors", "symbol_error", 1_000_000))
    again, _, restored = make(tmp_path)
    assert restored
    assert again.gpus[0].ecc[EccCounter.from_key("aggregate.corrected.dram")] == 10_000 * 1_000_000  # under 2^64
    assert again.hcas[0].counters["symbol_error"] == counter_max("ib.symbol_error") == 0xFFFF


def test_a_saturated_counter_is_logged_once(tmp_path, caplog, expect_log):
    expect_log(r"saturated at its maximum")
    node, state, _ = make(tmp_path)
    ctl = Controller(node, state, clock=lambda: T0)
    for _ in range(500):
        ctl.apply(IbPortCommand(None, 0, 1, "errors", "link_downed", 1))
    lines = [r for r in caplog.records if "saturated" in r.getMessage()]
    assert len(lines) == 1 and "link_downed" in lines[0].getMessage()
    assert node.hcas[0].counters["link_downed"] == 255
    again, _, _ = make(tmp_path)
    assert again.hcas[0].counters["link_downed"] == 255


def test_counter_widths_fit_the_shared_state_fields():
    """Every counter published in the shared state holds its saturated value in its C field
    (cffi raises OverflowError where a value does not fit)."""
    from mokkafs.daemon.shm.layout import make_ffi

    gpu = make_ffi().new("struct mokka_gpu *")
    gpu.pcie_replay = counter_max("pcie_replay")
    gpu.retired_sbe = gpu.retired_dbe = counter_max("retired_pages")
    gpu.remapped_corr = gpu.remapped_unc = counter_max("remapped_rows")
    gpu.ecc[1][1][7] = counter_max("ecc")
    gpu.nvlink[17].errors[3] = counter_max("nvlink_errors")


def test_a_restored_energy_at_its_cap_still_publishes(tmp_path):
    """The largest energy restore accepts keeps growing without overflowing energy_mj."""
    from mokkafs.model.state import MAX_ENERGY_MJ
    from mokkafs.daemon.shm.layout import make_ffi
    from mokkafs.daemon.shm.publisher import fill_gpu

    make(tmp_path)
    (tmp_path / "state" / "gpu0.json").write_bytes(_gpu1(energy0_mj=MAX_ENERGY_MJ))
    node, _, _ = make(tmp_path)
    fill_gpu(make_ffi().new("struct mokka_gpu *"), node, 0, T0 + 86400 * 365)


def _gpu1(**changes):
    """A fresh GPU's whole record (a restore refuses one that lacks a key) with `changes`."""
    from mokkafs.model.state import GpuState

    base = GpuState(t0=T0, temp0=29.0).to_dict()
    base.update(changes)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    "name,content,words",
    [
        ("gpu1.json", _gpu1(last_xid=79, last_xid_time=float("nan")), "NaN"),
        ("gpu1.json", _gpu1(last_xid=79, last_xid_time=1e300), "last_xid_time"),
        ("gpu1.json", _gpu1(t0=float("inf")), "Infinity"),
        ("gpu1.json", _gpu1(energy0_mj=float(1 << 64)), "energy0_mj"),
        ("gpu1.json", _gpu1(power_limit_w=1e9), "power_limit_w"),
        ("gpu1.json", _gpu1(last_xid=79, last_xid_time=-1.0), "last_xid_time"),
        ("gpu1.json", _gpu1(power_limit_w=1.0), "power_limit_w"),
        ("gpu1.json", _gpu1(power_limit_w=True), "power_limit_w"),
        ("gpu1.json", _gpu1(persistence_mode="yes"), "persistence_mode"),
        ("gpu1.json", _gpu1(persistence_mode=1), "persistence_mode"),
        ("gpu1.json", _gpu1(compute_mode="turbo"), "compute_mode: compute mode must be one of"),
        ("gpu1.json", _gpu1(compute_mode="exclusive_thread"), "compute_mode: compute mode exclusive_thread"),
        ("gpu1.json", _gpu1(compute_mode=3), "compute_mode"),
        ("gpu1.json", _gpu1(pins={"clocks": [0, 0]}), "pins.clocks"),
        ("gpu1.json", _gpu1(pcie_replay="5"), "pcie_replay"),
        ("gpu1.json", _gpu1(lost=1), "lost"),
        ("gpu1.json", _gpu1(retired_sbe=1 << 32), "retired_sbe"),
        ("gpu1.json", _gpu1(ecc={"volatile.corrected.moon": 1}), "ecc: unknown ECC counter 'volatile.corrected.moon'"),
        ("gpu1.json", _gpu1(ecc={"volatile.corrected": 1}), "ecc: unknown ECC counter"),
        ("gpu1.json", _gpu1(ecc={"volatile.corrected.dram": -1}), "ecc.volatile.corrected.dram: -1 is outside"),
        ("gpu1.json", _gpu1(ecc={"aggregate.uncorrected.l2": 1 << 64}), "ecc.aggregate.uncorrected.l2"),
        ("gpu1.json", _gpu1(ecc={"volatile.corrected.dram": "5"}), "ecc.volatile.corrected.dram"),
        ("gpu1.json", _gpu1(ecc=[1, 2]), "ecc"),
        ("gpu1.json", _gpu1(nvlink_errors={"18": {"replay": 1}}), "nvlink_errors: '18' is not a link 0..17"),
        ("gpu1.json", _gpu1(nvlink_errors={"07": {"replay": 1}}), "nvlink_errors: '07' is not a link 0..17"),
        ("gpu1.json", _gpu1(nvlink_errors={"x": {"replay": 1}}), "nvlink_errors: 'x' is not a link"),
        ("gpu1.json", _gpu1(nvlink_errors={"3": {"warp": 1}}), "nvlink_errors.3: unknown counter 'warp'"),
        ("gpu1.json", _gpu1(nvlink_errors={"3": {"replay": -1}}), "nvlink_errors.3.replay: -1 is outside"),
        ("gpu1.json", _gpu1(nvlink_errors={"3": {"replay": True}}), "nvlink_errors.3.replay"),
        ("gpu1.json", _gpu1(nvlink_errors={"3": 5}), "nvlink_errors.3"),
        ("gpu1.json", _gpu1(xid_counts={"\u00b2": 1}), "xid_counts: '\u00b2' is not an Xid"),
        ("gpu1.json", b'"' + b"x" * (50 << 20) + b'"', "bytes"),
        ("hcas.json", json.dumps([{"port_down": False, "counters": {"symbol_error": -1}}] * 8).encode(), "symbol_error"),
        ("hcas.json", json.dumps([{"port_down": False, "counters": {"symbol_error": 1 << 70}}] * 8).encode(), "symbol_error"),
        ("events.log", b'[NaN, 0, "x"]\n', "line 1"),
        ("events.log", b'[1e300, 0, "x"]\n', "line 1"),
        ("events.log", b'[1800000000.0, 99, "x"]\n', "line 1"),
        ("events.log", b"garbage\n", "line 1"),
    ],
)
def test_restore_refuses_what_no_event_could_make(tmp_path, name, content, words):
    make(tmp_path)
    (tmp_path / "state" / name).write_bytes(content)
    with pytest.raises(StateError) as err:
        make(tmp_path)
    msg = str(err.value)
    assert name in msg and words in msg and "\n" not in msg and len(msg) < 500, msg


def test_a_missing_node_json_beside_gpu_files_is_refused(tmp_path):
    make(tmp_path)
    (tmp_path / "state" / "node.json").unlink()
    before = (tmp_path / "state" / "gpu0.json").read_bytes()
    with pytest.raises(StateError, match="node.json: missing beside events.log, gpu0.json"):
        make(tmp_path)
    assert (tmp_path / "state" / "gpu0.json").read_bytes() == before


def test_an_interrupted_first_start_is_redone(tmp_path):
    make(tmp_path)
    (tmp_path / "state" / "node.json").unlink()
    (tmp_path / "state" / ".creating").write_bytes(b"")
    _, _, restored = make(tmp_path)
    assert not restored and not (tmp_path / "state" / ".creating").exists()


@pytest.mark.parametrize("name", ["gpu1.json", "events.log", "hcas.json", "node.json"])
def test_a_symlink_or_fifo_state_file_is_refused_at_once(tmp_path, name):
    make(tmp_path)
    target = tmp_path / "passwd-copy"
    target.write_bytes(b"root:x:0:0\n")
    path = tmp_path / "state" / name
    path.unlink()
    path.symlink_to(target)
    with pytest.raises(StateError, match="symbolic link"):
        make(tmp_path)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(StateError, match="not a regular file"):
        make(tmp_path)  # no hang: O_NONBLOCK
    assert target.read_bytes() == b"root:x:0:0\n"


def test_an_event_log_symlink_is_never_appended_to(tmp_path, expect_log):
    node, state, _ = make(tmp_path)
    expect_log(r"InjectXid not applied: cannot save the state")
    target = tmp_path / "passwd-copy"
    target.write_bytes(b"root:x:0:0\n")
    (tmp_path / "state" / "events.log").unlink()
    (tmp_path / "state" / "events.log").symlink_to(target)
    with pytest.raises(OSError):
        Controller(node, state, clock=lambda: T0).apply(InjectXid(0, 13))
    assert target.read_bytes() == b"root:x:0:0\n"


def test_a_symlinked_state_dir_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "real")
    with pytest.raises(StateError, match="symbolic link"):
        make(tmp_path)
    assert list((tmp_path / "real").iterdir()) == []


def test_mokka_mount_refuses_a_corrupt_state_with_one_line(node_factory, tmp_path):
    node = node_factory(gpus=2, mount=False)
    node.state_dir.mkdir()
    node.state_dir.chmod(0o755)
    node.mount()
    node.umount()
    (node.state_dir / "gpu1.json").write_bytes(_gpu1(pins={"clocks": [0, 0]}))
    out = node.mount_result = node.cli("mount", str(node.mnt), "--profile", "h100", "--gpus", "2",
                                       "--state-dir", str(node.state_dir), check=False, timeout=30)
    node.expect_warning(r"gpu1.json: pins.clocks")
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "gpu1.json" in text and "pins.clocks" in text
    assert len(text.strip().splitlines()) == 1 and len(text) < 600


def test_big_writes_through_a_mount_leave_a_state_that_mounts_again(node_factory):
    node = node_factory(gpus=2)
    for _ in range(300):
        assert node.write("gpu0/inject_ecc", b"sbe 1000000\n") == 0
        assert node.write("gpu0/nvlink", b"1 errors 1000000\n") == 0
    node.umount()
    again = node.mount()
    assert again.returncode == 0
    assert "300000000" in node.read("gpu0/inject_ecc")


# --- typed counters: a state directory written before them restores unchanged -----------------

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "state-v1"


def test_a_state_dir_written_with_string_counter_keys_restores_unchanged(tmp_path):
    """tests/fixtures/state-v1 was written by the daemon when GPU state kept ECC counters as
    "volatile.corrected.dram" keys and NVLink errors as {"3": {"replay": N}}; beside it, what
    that daemon rendered from it. It restores, renders the same, and is saved in the same format."""
    from mokkafs.daemon.shm.layout import make_ffi
    from mokkafs.daemon.shm.publisher import fill_gpu
    from mokkafs.render.control import render_ecc, render_info, render_nvlink
    from mokkafs.render.metrics import render_dcgm
    from mokkafs.render.vfs import Ctx

    shutil.copytree(FIXTURE, tmp_path / "state")
    node = Node(compose(load_profile("h100"), gpus=2, hostname="fixture-v1"), T0)
    state = StateDir(tmp_path / "state")
    assert state.open(node)
    ctx, now = Ctx(node, T0 + 100), T0 + 100
    def info(i: int) -> str:  # the lines that daemon rendered (the recovery action came later)
        return "".join(line for line in render_info(ctx, i).splitlines(True) if not line.startswith("recovery_action:"))

    rendered = "".join(
        f"== gpu{i}/info\n{info(i)}== gpu{i}/inject_ecc\n{render_ecc(ctx, i)}"
        f"== gpu{i}/nvlink\n{render_nvlink(ctx, i)}"
        for i in range(2)
    )
    rendered += "== metrics\n" + "".join(
        f"{m[1]} gpu={m[2]} {m[3]}\n"
        for m in re.finditer(r'^(DCGM_\w+)\{gpu="(\d+)".*\} (\S+)$', render_dcgm(node, now), re.M)
        # The counters that daemon rendered (the ECC mode gauges came later).
        if ("ECC" in m[1] or "NVLINK" in m[1]) and m[1] not in ("DCGM_FI_DEV_ECC_CURRENT", "DCGM_FI_DEV_ECC_PENDING")
    )
    g = make_ffi().new("struct mokka_gpu *")
    fill_gpu(g, node, 0, now)
    rendered += "== shared state gpu0\n"
    rendered += "".join(
        f"ecc[{s}][{k}] {' '.join(str(g.ecc[s][k][loc]) for loc in range(8))}\n" for s in range(2) for k in range(2)
    )
    rendered += "".join(
        f"nvlink[{link}] {g.nvlink[link].state} {' '.join(str(g.nvlink[link].errors[c]) for c in range(4))}\n"
        for link in range(18)
    )
    assert rendered == (FIXTURE.parent / "state-v1.renders.txt").read_text()
    for i in range(2):
        old = json.loads((FIXTURE / f"gpu{i}.json").read_bytes())
        state.save_gpu(node, i)
        new = json.loads((tmp_path / "state" / f"gpu{i}.json").read_bytes())
        assert {k: new[k] for k in old} == old, "saved in the format it was read in"
    assert StateDir(tmp_path / "state").open(Node(compose(load_profile("h100"), gpus=2, hostname="fixture-v1"), T0))
