"""A state disk that fills up: a change that cannot be saved is not applied (the writer hears of
it, the node stays exactly as it was on every surface and after a restart), and a daemon that
cannot write its state at start says so instead of "ready"."""
from __future__ import annotations

import contextlib
import copy
import errno
import os
import subprocess
from pathlib import Path

import pytest

from mokkafs.daemon.controller import Controller
from mokkafs.daemon.persist import StateDir
from mokkafs.model import Node, compose
from mokkafs.model.events import InjectEcc, InjectXid, Reset, SetProcesses
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("daemon")

T0 = 1_800_000_000.0


@contextlib.contextmanager
def small_disk(where: Path, size: str = "1m"):
    """A tmpfs of `size` at `where` (a disk that can fill up), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def make(state_dir: Path) -> tuple[Node, StateDir]:
    node = Node(compose(load_profile("h100"), gpus=4, hostname="full"), T0)
    state = StateDir(state_dir)
    state.open(node)
    return node, state


@pytest.mark.parametrize("event", [InjectXid(1, 79), InjectEcc(2, "dbe", 3, "dram"), Reset(None)],
                         ids=["xid", "ecc", "node-reset"])
def test_a_change_that_cannot_be_saved_is_refused_and_leaves_the_node_as_it_was(tmp_path, event, expect_log):
    with small_disk(tmp_path / "disk") as disk:
        node, state = make(disk / "state")
        heard = []
        ctl = Controller(node, state, clock=lambda: T0 + 1)
        ctl.subscribers.append(lambda n, outcome: heard.append(outcome))
        ctl.apply(InjectXid(0, 48))  # a change before the disk fills is saved and heard
        assert len(heard) == 1
        before_files = files(disk / "state")
        before = ([g.to_dict() for g in node.gpus], [h.to_dict() for h in node.hcas], list(node.log),
                  node.generation, dict(node.injections))
        fill(disk)
        expect_log(r"not applied: cannot save the state")
        with pytest.raises(OSError) as e:
            ctl.apply(event)
        assert e.value.errno == errno.ENOSPC
        assert len(heard) == 1  # no surface was told
        assert ([g.to_dict() for g in node.gpus], [h.to_dict() for h in node.hcas], list(node.log),
                node.generation, dict(node.injections)) == before
        assert files(disk / "state") == before_files  # nor a half-written file left behind
        assert not [p for p in (disk / "state").iterdir() if p.name.endswith(".tmp")]
        os.unlink(disk / "filler")
        again, _ = make(disk / "state")
        assert [g.to_dict() for g in again.gpus] == before[0]
        ctl.apply(event)  # with room again, the same change goes through
        assert len(heard) == 2


def test_mokka_mount_with_a_full_state_disk_fails_with_the_reason(node_factory, tmp_path):
    node = node_factory(gpus=2, mount=False)
    with small_disk(tmp_path / "disk", "4m") as disk:
        fill(disk)
        state_dir = disk / "state"
        out = node.cli("mount", str(node.mnt), "--profile", "h100", "--gpus", "2", "--state-dir", str(state_dir),
                       check=False, timeout=60)
        text = out.stdout + out.stderr
        assert out.returncode != 0, text
        assert "ready" not in text and "Traceback" not in text
        assert "No space left on device" in text and str(disk) in text, text
        assert not os.path.ismount(node.mnt)


class _FullDisk(StateDir):
    """A state directory whose every save fails as a full disk's does."""

    def save_change(self, *args) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


# Commands that change each kind of record an event reaches in place (counters inside dicts, the
# nested NVLink counters, lists, pins, settings, MIG, HCA ports, accounting), each after a prefix
# that leaves those containers non-empty, so a rollback sharing one with the live node would show.
_PREFIX = ["gpu=1 xid 48", "gpu=1 ecc sbe 3 l2", "gpu=1 nvlink 2 errors 5", "gpu=1 nvlink 3 down",
           "gpu=1 temperature 70", "gpu=1 accounting 1", "gpu=2 mig enable", "hca=0 port errors 4"]
_REFUSED = ["gpu=1 xid 48", "gpu=1 xid 79", "gpu=1 ecc dbe 2 dram", "gpu=1 ecc sbe 3 l2", "gpu=1 nvlink 2 errors 7",
            "gpu=1 nvlink 2 reset_errors", "gpu=1 nvlink 3 up", "gpu=1 nvlink 0 down", "gpu=1 temperature 80",
            "gpu=1 temperature auto", "gpu=1 power_limit 500", "gpu=1 clear_ecc volatile", "gpu=1 reset 1",
            "gpu=2 mig create 1g.10gb", "hca=0 port errors 9", "hca=0 port down", "node reset 1",
            "processes: more memory", "processes: none"]
_PROCESSES = {"processes: more memory": ((4242, 2 << 30),), "processes: none": ()}  # the process table's folds


@pytest.mark.parametrize("line", _REFUSED)
def test_a_refused_save_rolls_back_every_record_the_event_touched(tmp_path, line, expect_log):
    """The rollback copies only what an event can change, by hand (daemon/controller.py): after
    a save that fails, every mutable part of the node equals what it was, deep down."""
    from mokkafs.model.commands import parse_line

    node, _ = make(tmp_path / "state")
    ok = Controller(node, StateDir(tmp_path / "state"), clock=lambda: T0 + 1)
    for prefix in _PREFIX:
        ok.apply(parse_line(prefix, gpus=4).event)
    ok.apply(SetProcesses(1, ((4242, 1 << 30),)))  # a process, accounted
    fixed = {"config", "profile", "identities", "layout", "compute", "features", "nvml_support"}
    before = {k: copy.deepcopy(v) for k, v in vars(node).items() if k not in fixed}
    failing = Controller(node, _FullDisk(tmp_path / "state"), clock=lambda: T0 + 2)
    expect_log(r"not applied: cannot save the state")
    with pytest.raises(OSError):
        failing.apply(SetProcesses(1, _PROCESSES[line]) if line in _PROCESSES else parse_line(line, gpus=4).event)
    after = {k: v for k, v in vars(node).items() if k not in fixed}
    assert after == before


@pytest.mark.parametrize("cls", ["GpuState", "HcaState"])
def test_a_record_copy_shares_no_container_with_the_record(cls):
    """The rollback's copy of a record (GpuState.copy, HcaState.copy) is written by hand: a
    mutable container added to the record later and not copied there would be shared with the
    live record, and an event's change to it would survive its rollback."""
    import dataclasses

    from mokkafs.model.state import GpuState, HcaState

    record = GpuState(t0=T0, temp0=30.0) if cls == "GpuState" else HcaState()
    copied = record.copy()
    assert copied == record
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, (dict, list, set, bytearray)):
            assert getattr(copied, f.name) is not value, f"{cls}.copy shares {f.name}"
        else:  # everything else in a record is immutable (numbers, strings, tuples, frozen MIG state)
            assert dataclasses.is_dataclass(value) is False or type(value).__dataclass_params__.frozen, f.name
