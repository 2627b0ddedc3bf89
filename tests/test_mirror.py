"""The plain-directory mirror of sys/, proc/ and dev/ that `mokka run` binds: after any sequence
of events it holds exactly what the renderers produce, entry for entry."""
from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import mokka_cmd
from mokkafs.daemon.controller import Controller
from mokkafs.daemon.mirror import Mirror, _create as _real_create, render
from mokkafs.model import Node, compose
from mokkafs.model.events import (
    IbPortCommand,
    InjectEcc,
    InjectXid,
    NvLinkCommand,
    Pin,
    Reset,
    SetLost,
    SetProcesses,
)
from mokkafs.model.profiles import load_profile
from mokkafs.render.tree import root
from mokkafs.render.vfs import Ctx, Tree

pytestmark = pytest.mark.level("daemon")

T0 = 1_800_000_000.0


def on_disk(base: Path) -> dict[str, tuple]:
    """The mirror as `render` describes a tree."""
    out = {}
    for top in ("sys", "proc", "dev"):
        for dirpath, dirnames, filenames in os.walk(base / top):
            rel_dir = os.path.relpath(dirpath, base)
            out[rel_dir] = ("d", stat.S_IMODE(os.lstat(dirpath).st_mode))
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                rel = os.path.join(rel_dir, name)
                st_ = os.lstat(p)
                if stat.S_ISLNK(st_.st_mode):
                    out[rel] = ("l", os.readlink(p))
                    dirnames[:] = [d for d in dirnames if d != name]  # os.walk does not follow them
                elif stat.S_ISREG(st_.st_mode):
                    out[rel] = ("f", stat.S_IMODE(st_.st_mode), Path(p).read_bytes())
                elif stat.S_ISCHR(st_.st_mode):
                    out[rel] = ("c", stat.S_IMODE(st_.st_mode), st_.st_rdev)
    return out


@pytest.fixture
def node_and_mirror(tmp_path):
    config = compose(load_profile("h100"), gpus=4, hostname="mirror")
    node = Node(config, T0)
    tree = Tree(root(config))
    mirror = Mirror(tree, tmp_path / "mirror", lambda: T0)
    ctl = Controller(node, None, lambda: T0)
    ctl.subscribers.append(mirror)
    return node, tree, mirror, ctl


def test_start_writes_every_entry_and_clears_leftovers(node_and_mirror):
    node, tree, mirror, _ = node_and_mirror
    (mirror.path / "sys" / "stale").mkdir(parents=True)
    (mirror.path / "junk").write_text("left by a dead daemon")
    mirror.start(node)
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    assert not (mirror.path / "junk").exists()
    assert os.readlink(mirror.path / "sys/bus/pci/devices/0000:24:00.0").startswith("../../../devices/pci")
    assert (mirror.path / "proc/driver/nvidia/gpus/0000:24:00.0/information").is_file()
    assert os.major(os.lstat(mirror.path / "dev/nvidia2").st_rdev) == 195


def test_a_lost_gpu_leaves_the_mirror_and_comes_back(node_and_mirror):
    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    dev = mirror.path / "sys/bus/pci/devices/0000:24:00.0"
    assert dev.is_symlink()
    ctl.apply(InjectXid(2, 79))
    assert not dev.is_symlink() and not (mirror.path / "proc/driver/nvidia/gpus/0000:24:00.0").exists()
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    ctl.apply(Reset(2))
    assert dev.is_symlink()
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))


def test_an_ib_port_going_down_shows_in_the_mirror(node_and_mirror):
    node, _, mirror, ctl = node_and_mirror
    mirror.start(node)
    state = mirror.path / "sys/class/infiniband/mlx5_1/ports/1/state"
    assert state.read_text() == "4: ACTIVE\n"
    ctl.apply(IbPortCommand(None, hca=1, action="down"))
    assert state.read_text() == "1: DOWN\n"


def test_events_that_touch_no_file_rewrite_nothing(node_and_mirror):
    node, _, mirror, ctl = node_and_mirror
    mirror.start(node)
    vendor = mirror.path / "sys/bus/pci/devices/0000:18:00.0/vendor"
    before = os.stat(vendor).st_ino
    ctl.apply(Pin(0, "temperature", (90,)))
    assert os.stat(vendor).st_ino == before


# Every kind of event, so a renderer that starts reading state the mirror does not watch
# (Node.device_tree_state) fails here.
EVENTS = st.sampled_from(
    [InjectXid(1, 79), InjectXid(3, 79), SetLost(1, False), SetLost(2, True), Reset(None), Reset(3),
     InjectXid(0, 48), InjectXid(0, 63), InjectXid(2, 64), InjectXid(1, 74), InjectXid(0, 95), InjectXid(3, 119),
     InjectEcc(1, "sbe", 3, "l2"), InjectEcc(2, "dbe", 1), NvLinkCommand(2, 5, "down"),
     NvLinkCommand(2, 5, "errors", 4), Pin(0, "utilization", (50, 20)), Pin(1, "temperature", (95,)),
     Pin(2, "throttle", ("hw_slowdown",)), Pin(3, "memory_used", (1000,)), Pin(0, "power", (900,)),
     Pin(1, "clocks", (1000, 2619)), IbPortCommand(None, hca=2, action="down"),
     IbPortCommand(None, hca=2, action="errors", count=7), SetProcesses(1, processes=((os.getpid(), 1 << 30),))]
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(EVENTS, max_size=8))
def test_any_sequence_of_events_leaves_an_exact_mirror(node_and_mirror, events):
    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    for event in events:
        ctl.apply(event)
    # A fresh tree's rendering: the daemon's made its lazy directories at other states.
    assert on_disk(mirror.path) == render(Tree(root(node.config)), Ctx(node, T0))
    ctl.apply(Reset(None))


async def test_the_background_first_write_catches_up_with_events(node_and_mirror):
    node, tree, mirror, ctl = node_and_mirror
    async with trio.open_nursery() as nursery:
        await nursery.start(mirror.run, node)
        ctl.apply(InjectXid(1, 79))  # while the worker thread may still be writing
    assert not (mirror.path.with_name("mirror.new")).exists()
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    assert not (mirror.path / "sys/bus/pci/devices/0000:1e:00.0").exists()


async def test_the_first_write_waits_until_the_node_is_ready(node_and_mirror, monkeypatch):
    """The daemon says "ready" before the mirror's first rendering (every file of sys/, proc/
    and dev/: 25-50 ms of the event loop) starts; events meanwhile are caught up after."""
    from mokkafs.daemon import mirror as mirror_module

    node, tree, mirror, ctl = node_and_mirror
    renders = []
    monkeypatch.setattr(mirror_module, "render", lambda *a, **kw: renders.append(1) or render(*a, **kw))
    served = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(mirror.run, node, served)
        for _ in range(10):
            await trio.lowlevel.checkpoint()
        assert renders == [] and not mirror.ready.is_set()
        ctl.apply(InjectXid(1, 79))
        served.set()
    assert renders and mirror.ready.is_set()
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    assert not (mirror.path / "sys/bus/pci/devices/0000:1e:00.0").exists()


def test_mokka_run_reads_the_mirror_and_sees_events_live(node_factory):
    """A command started in `mokka run` before a fault sees it, through the bound mirror."""
    node = node_factory(gpus=4)
    mirror = node.state_dir / "mirror" / "sys"
    deadline = time.monotonic() + 10
    while not mirror.is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mirror.is_dir()
    script = "stat -f -c %T /sys/bus/pci/devices/; ls /sys/bus/pci/devices | wc -l; read go; " \
             "ls /sys/bus/pci/devices | wc -l"
    proc = subprocess.Popen([*mokka_cmd(), "run", "--root", str(node.mnt), "--", "sh", "-c", script],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=node.env)
    fstype = proc.stdout.readline().strip()
    before = int(proc.stdout.readline())
    assert node.write("gpu2/inject_xid", b"79\n") == 0
    out, _ = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0
    assert fstype != "fuseblk" and not fstype.startswith("fuse")  # the mirror, not the mount
    assert int(out) == before - 1


def test_mig_capabilities_come_and_go_in_the_mirror(node_and_mirror):
    from mokkafs.model.commands import parse_line

    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    caps = mirror.path / "proc/driver/nvidia/capabilities"
    for line in ("gpu=1 mig enable", "gpu=1 mig create 3g.40gb,1g.10gb"):
        ctl.apply(parse_line(line).event)
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    assert (caps / "gpu1/mig/gi2/ci0/access").read_text().startswith("DeviceFileMinor: 157\n")
    assert os.stat(mirror.path / "dev/nvidia-caps/nvidia-cap157").st_rdev == os.makedev(506, 157)
    ctl.apply(parse_line("gpu=1 mig clear").event)
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    assert sorted(os.listdir(caps / "gpu1/mig")) == [] and sorted(os.listdir(mirror.path / "dev/nvidia-caps")) == [
        "nvidia-cap1", "nvidia-cap2"]


def test_mokka_run_sees_mig_instances_come_and_go(node_factory):
    node = node_factory(gpus=2)
    mirror = node.state_dir / "mirror" / "sys"
    deadline = time.monotonic() + 10
    while not mirror.is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    script = "ls /proc/driver/nvidia/capabilities; read go; ls /proc/driver/nvidia/capabilities/gpu1/mig; " \
             "cat /proc/driver/nvidia/capabilities/gpu1/mig/gi2/ci0/access; ls /dev/nvidia-caps | tr '\\n' ' '"
    proc = subprocess.Popen([*mokka_cmd(), "run", "--root", str(node.mnt), "--", "sh", "-c", script],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=node.env)
    assert proc.stdout.readline().strip() == "mig"
    for args in (("mig", "enable"), ("mig", "create", "3g.40gb")):
        assert node.cli("inject", "--root", str(node.mnt), "1", *args).returncode == 0
    out, _ = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0
    assert out.splitlines() == ["gi2", "DeviceFileMinor: 157", "DeviceFileMode: 292", "DeviceFileModify: 1",
                                "nvidia-cap1 nvidia-cap156 nvidia-cap157 nvidia-cap2 "]


# MIG commands (some refused: MIG off, no room, nothing to destroy) mixed with what takes a GPU's
# capability files away and gives them back, so an incremental MIG update that misses an entry, or
# a full one that loses the MIG part, leaves a mirror that differs from a fresh render.
MIG_EVENTS = st.sampled_from(
    ["gpu=1 mig enable", "gpu=2 mig enable", "gpu=1 mig disable", "gpu=1 mig create 3g.40gb,1g.10gb",
     "gpu=2 mig create_gi 2g.20gb", "gpu=2 mig create_ci 3 1c.2g.20gb", "gpu=1 mig create 7g.80gb",
     "gpu=1 mig destroy_ci all all", "gpu=2 mig destroy_gi all", "gpu=1 mig clear", "gpu=2 mig clear",
     InjectXid(1, 79), SetLost(1, False), Reset(2), Pin(0, "temperature", (90,))]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(MIG_EVENTS, min_size=1, max_size=10))
def test_mig_changes_update_only_their_trees_and_leave_an_exact_mirror(node_and_mirror, events):
    from mokkafs.model.commands import parse_line
    from mokkafs.model.events import InvalidCommand

    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    vendor = mirror.path / "sys/bus/pci/devices/0000:18:00.0/vendor"
    for event in events:
        inode = os.stat(vendor).st_ino
        try:
            ctl.apply(parse_line(event).event if isinstance(event, str) else event)
        except InvalidCommand:
            continue
        if isinstance(event, str):  # a MIG change rewrites nothing outside the MIG trees
            assert os.stat(vendor).st_ino == inode
        assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    ctl.apply(Reset(None))
    assert on_disk(mirror.path) == render(Tree(root(node.config)), Ctx(node, T0))


def test_a_mig_change_renders_only_the_mig_trees(node_and_mirror, monkeypatch):
    import mokkafs.daemon.mirror as mirror_module
    from mokkafs.model.commands import parse_line

    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    rendered = []

    def recording(tree_, ctx, tops=mirror_module.TREES):
        rendered.append(tops)
        return render(tree_, ctx, tops)

    monkeypatch.setattr(mirror_module, "render", recording)
    for line in ("gpu=1 mig enable", "gpu=1 mig create 3g.40gb,1g.10gb", "gpu=1 mig destroy_ci 2 0"):
        ctl.apply(parse_line(line).event)
    ctl.apply(InjectXid(1, 79))  # a GPU off the bus: its host bridge's tree, the bus's links, the MIG trees
    assert rendered == [mirror_module.MIG_TREES] * 3 + [mirror_module.lost_trees(node, {1})]
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))


def test_a_gpu_off_the_bus_renders_only_its_trees(node_and_mirror, monkeypatch):
    """A GPU falling off the bus (or coming back) re-renders its host bridge's subtree, the bus's
    links, proc/driver/nvidia/gpus and the MIG trees: a few hundred entries, where the whole
    tree (thousands, ~7 ms of the loop at 8 GPUs) was rendered and compared before. Anything
    else that changes with it (an InfiniBand port) still renders the whole tree."""
    import mokkafs.daemon.mirror as mirror_module

    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    rendered = []

    def recording(tree_, ctx, tops=mirror_module.TREES):
        out = render(tree_, ctx, tops)
        rendered.append((tops, len(out)))
        return out

    monkeypatch.setattr(mirror_module, "render", recording)
    whole = len(render(tree, Ctx(node, T0)))
    for event in (InjectXid(2, 79), Reset(2), SetLost(0, True), SetLost(3, True), Reset(None)):
        ctl.apply(event)
        assert on_disk(mirror.path) == render(tree, Ctx(node, T0))
    gpu2 = next(fn.host_bridge for fn in node.layout.functions if fn.kind == "gpu" and fn.index == 2)
    assert rendered[0][0] == (f"sys/devices/{gpu2}", *mirror_module.BUS_TREES)
    assert [tops for tops, _ in rendered] == [mirror_module.lost_trees(node, s) for s in ({2}, {2}, {0}, {3}, {0, 3})]
    assert all(n < whole / 3 for _, n in rendered), (rendered, whole)
    ctl.apply(IbPortCommand(None, hca=1, action="down"))  # not a GPU's presence: the whole tree
    assert rendered[-1][0] == mirror_module.TREES
    assert on_disk(mirror.path) == render(tree, Ctx(node, T0))


def failing_after(monkeypatch, n: int, err: int = 28):
    """Make the mirror's `n`-th file creation from now on, and every one after it, fail with `err`
    (ENOSPC: a disk that filled up)."""
    import errno as errno_module

    import mokkafs.daemon.mirror as mirror_module

    real, calls = mirror_module._create, [0]

    def create(path, item):
        calls[0] += 1
        if calls[0] >= n:
            raise OSError(err, errno_module.errorcode.get(err, "") and os.strerror(err), str(path))
        return real(path, item)

    monkeypatch.setattr(mirror_module, "_create", create)
    return lambda: monkeypatch.setattr(mirror_module, "_create", real)


def test_an_update_cut_short_is_finished_by_the_next_event(node_and_mirror, monkeypatch, expect_log):
    """A write that fails half way through an update (a full disk) leaves some entries new and
    some old; the next event, whatever it changes, finishes the job rather than taking the
    half-written mirror for the last rendering (a GPU lost and reset before the disk had room
    again left its half-removed tree in the mirror for good)."""
    expect_log(r"subscriber .* failed on (InjectXid|SetMigMode)")
    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    restore = failing_after(monkeypatch, 3)
    ctl.apply(InjectXid(1, 79))  # applied; the mirror's update fails after a few entries
    restore()
    ctl.apply(Pin(0, "temperature", (90,)))  # no change of the trees: the mirror catches up anyway
    assert on_disk(mirror.path) == render(Tree(root(node.config)), Ctx(node, T0))
    restore = failing_after(monkeypatch, 3)
    ctl.apply(InjectXid(2, 79))
    restore()
    ctl.apply(Reset(2))  # back to what the mirror last rendered whole
    assert on_disk(mirror.path) == render(Tree(root(node.config)), Ctx(node, T0))
    from mokkafs.model.commands import parse_line

    restore = failing_after(monkeypatch, 2)
    ctl.apply(parse_line("gpu=3 mig enable").event)
    restore()
    ctl.apply(parse_line("gpu=3 mig disable").event)
    assert on_disk(mirror.path) == render(Tree(root(node.config)), Ctx(node, T0))


async def test_a_first_write_that_finds_the_disk_full_leaves_the_daemon_serving(node_and_mirror, monkeypatch,
                                                                                 expect_log):
    """The daemon has said "ready" before the mirror's first write: a state disk with room for the
    state but not for the mirror (thousands of files) must not stop it there. It says why, frees
    what it wrote, and runs on without a mirror (`mokka run` binds the mount itself)."""
    expect_log(r"mirror: cannot write it .*No space left on device.*`mokka run` reads the mount")
    node, tree, mirror, ctl = node_and_mirror
    failing_after(monkeypatch, 100)
    async with trio.open_nursery() as nursery:
        await nursery.start(mirror.run, node)
    assert mirror.ready.is_set()
    assert not mirror.path.exists() and not mirror.path.with_name("mirror.new").exists()
    ctl.apply(InjectXid(1, 79))  # no mirror to update, and nothing said
    assert not mirror.path.exists()


async def test_a_daemon_stopped_during_the_first_write_stops_there(node_and_mirror, monkeypatch):
    """SIGTERM while the worker thread writes the first mirror: the daemon leaves at once (it
    waited for the whole write, seconds at 64 GPUs, after it had unmounted), and does not put a
    mirror in place for a node that no longer serves."""
    import threading

    import mokkafs.daemon.mirror as mirror_module

    node, tree, mirror, ctl = node_and_mirror
    started, release = threading.Event(), threading.Event()
    real = mirror_module._create

    def create(path, item):
        started.set()
        release.wait(10)
        return real(path, item)

    monkeypatch.setattr(mirror_module, "_create", create)
    timer = threading.Timer(1.5, release.set)  # the thread's first file takes 1.5 s
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(mirror.run, node)
            await trio.to_thread.run_sync(started.wait, 5)
            timer.start()
            t0 = time.monotonic()
            nursery.cancel_scope.cancel()
        waited = time.monotonic() - t0
    finally:
        timer.cancel()
        release.set()
    assert waited < 1, waited
    assert not mirror.ready.is_set() and not mirror.path.exists()


@pytest.mark.parametrize("replace", ["link", "removed"])
def test_a_mirror_replaced_behind_the_daemon_is_never_written_through(node_and_mirror, tmp_path, expect_log,
                                                                     replace):
    """Someone replaced the mirror's directory with a link (or removed it): the daemon, root,
    wrote the next update through the link into wherever it pointed (removing files there too),
    or failed at every event. It removes the link, not its target, and runs on without a mirror."""
    expect_log(r"mirror: replaced or removed since the daemon wrote it")
    node, tree, mirror, ctl = node_and_mirror
    mirror.start(node)
    elsewhere = tmp_path / "elsewhere"
    os.rename(mirror.path, elsewhere)
    if replace == "link":
        os.symlink(elsewhere, mirror.path)
    before = on_disk(elsewhere)
    ctl.apply(InjectXid(1, 79))
    ctl.apply(IbPortCommand(None, hca=1, action="down"))
    assert on_disk(elsewhere) == before
    assert not os.path.lexists(mirror.path)
    ctl.apply(Reset(None))  # no mirror, nothing more said
    assert not os.path.lexists(mirror.path)


async def test_catching_up_after_the_first_write_on_a_full_disk_leaves_the_daemon_serving(
        node_and_mirror, monkeypatch, expect_log):
    """Events while the first write ran are caught up on the event loop once it is done: a full
    disk there is said, not raised out of the daemon; the next event's update finishes it."""
    import mokkafs.daemon.mirror as mirror_module

    expect_log(r"mirror: cannot bring it up to date .*No space left on device.*the next event does")
    node, tree, mirror, ctl = node_and_mirror
    real_write_all = mirror_module.Mirror._write_all

    def write_all(base, items, stop=None):
        real_write_all(base, items, stop)
        failing_after(monkeypatch, 1)  # the disk fills up as the thread finishes

    monkeypatch.setattr(mirror_module.Mirror, "_write_all", staticmethod(write_all))
    async with trio.open_nursery() as nursery:
        await nursery.start(mirror.run, node)
        ctl.apply(InjectXid(1, 79))  # while the worker thread writes
    assert mirror.ready.is_set()
    monkeypatch.setattr(mirror_module, "_create", _real_create)
    ctl.apply(Pin(0, "temperature", (90,)))
    assert on_disk(mirror.path) == render(Tree(root(node.config)), Ctx(node, T0))
