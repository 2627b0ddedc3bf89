"""Hard links and foreign files in the state directory: refused (events.log, daemon.log, the
records) or replaced (the shared state file), never written through."""
from __future__ import annotations

import os

import pytest

from mokkafs.daemon.controller import Controller
from mokkafs.daemon.persist import StateDir, StateError
from mokkafs.daemon.shm.publisher import Publisher
from mokkafs.model import Node, compose
from mokkafs.model.events import InjectXid
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("daemon")

T0 = 1_800_000_000.0


def make(tmp_path):
    node = Node(compose(load_profile("h100"), gpus=2, hostname="links"), T0)
    state = StateDir(tmp_path / "state")
    state.open(node)
    return node, state


def test_an_event_log_hard_link_is_never_appended_to(tmp_path, expect_log):
    node, state = make(tmp_path)
    target = tmp_path / "precious"
    target.write_bytes(b"root:x:0:0\n")
    (tmp_path / "state" / "events.log").unlink()
    os.link(target, tmp_path / "state" / "events.log")
    expect_log(r"not applied: cannot save the state")
    with pytest.raises(OSError, match="hard links"):
        Controller(node, state, clock=lambda: T0).apply(InjectXid(0, 13))
    assert target.read_bytes() == b"root:x:0:0\n"
    assert node.gpus[0].last_xid is None  # and nothing changed


@pytest.mark.parametrize("name", ["gpu1.json", "events.log", "node.json"])
def test_a_hard_linked_or_foreign_record_is_refused_at_restore(tmp_path, name):
    make(tmp_path)
    path = tmp_path / "state" / name
    os.link(path, tmp_path / "other-name")
    with pytest.raises(StateError, match=f"{name}: has 2 hard links"):
        make(tmp_path)
    os.unlink(tmp_path / "other-name")
    os.chown(path, 65534, 65534)
    with pytest.raises(StateError, match=f"{name}: is owned by uid 65534"):
        make(tmp_path)


def test_a_hard_linked_state_file_is_replaced_not_written_through(tmp_path, expect_log):
    first = Publisher(tmp_path / "state", clock=lambda: T0)
    first.open()
    first.close()
    os.link(tmp_path / "state", tmp_path / "elsewhere")
    before = (tmp_path / "elsewhere").read_bytes()
    expect_log(r"replacing a hard link")
    pub = Publisher(tmp_path / "state", clock=lambda: T0)
    pub.open()
    try:
        pub.publish(Node(compose(load_profile("h100"), gpus=2, hostname="links"), T0))
    finally:
        pub.close()
    assert (tmp_path / "elsewhere").read_bytes() == before
    assert os.stat(tmp_path / "state").st_nlink == 1


def test_mount_refuses_a_hard_linked_or_fifo_daemon_log(node_factory, tmp_path):
    node = node_factory(gpus=2, mount=False)
    node.state_dir.mkdir(mode=0o755)
    target = tmp_path / "precious"
    target.write_bytes(b"keep\n")
    os.link(target, node.state_dir / "daemon.log")
    out = node.cli("mount", str(node.mnt), "--profile", "h100", "--gpus", "2", "--state-dir", str(node.state_dir),
                   check=False, timeout=30)
    assert out.returncode != 0 and "daemon.log" in out.stderr + out.stdout and "hard links" in out.stderr
    assert target.read_bytes() == b"keep\n"
    os.unlink(node.state_dir / "daemon.log")
    os.mkfifo(node.state_dir / "daemon.log")
    out = node.cli("mount", str(node.mnt), "--profile", "h100", "--gpus", "2", "--state-dir", str(node.state_dir),
                   check=False, timeout=30)
    os.unlink(node.state_dir / "daemon.log")  # before the fixture reads the log
    assert out.returncode != 0 and "daemon.log" in out.stderr, out
