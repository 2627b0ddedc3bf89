"""The FUSE operations called directly, without a kernel mount."""
from __future__ import annotations

import errno
import os
import stat

import pyfuse3
import pytest

from mokkafs.daemon.controller import Controller
from mokkafs.daemon.fuse_ops import MokkaOperations
from mokkafs.model import Node, compose
from mokkafs.model.events import InjectXid
from mokkafs.model.profiles import load_profile
from mokkafs.render.tree import root
from mokkafs.render.vfs import ROOT_INO, Tree

pytestmark = pytest.mark.level("daemon")

T0 = 1_800_000_000.0
ROOT = pyfuse3.RequestContext()  # what the kernel says of a root caller: uid 0, gid 0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ops():
    clock = Clock()
    config = compose(load_profile("h100"), gpus=2, hostname="ops")
    node = Node(config, clock())
    return MokkaOperations(Tree(root(config)), Controller(node, None, clock), clock)


async def walk(ops, path: str) -> int:
    inode = ROOT_INO
    for part in path.split("/"):
        inode = (await ops.lookup(inode, part.encode(), None)).st_ino
    return inode


async def read_file(ops, path: str) -> bytes:
    inode = await walk(ops, path)
    info = await ops.open(inode, os.O_RDONLY, None)
    try:
        return await ops.read(info.fh, 0, 65536)
    finally:
        await ops.release(info.fh)


async def write_file(ops, path: str, data: bytes) -> int:
    inode = await walk(ops, path)
    info = await ops.open(inode, os.O_WRONLY, ROOT)
    try:
        return await ops.write(info.fh, 0, data)
    finally:
        await ops.release(info.fh)


async def test_lookup_gives_stable_inodes_and_types(ops):
    gpu0 = await ops.lookup(ROOT_INO, b"gpu0", None)
    assert stat.S_ISDIR(gpu0.st_mode)
    temp = await ops.lookup(gpu0.st_ino, b"temperature", None)
    assert stat.S_ISREG(temp.st_mode) and temp.st_mode & 0o777 == 0o644
    reset = await ops.lookup(gpu0.st_ino, b"reset", None)
    assert reset.st_mode & 0o777 == 0o200
    again = await ops.lookup(gpu0.st_ino, b"temperature", None)
    assert again.st_ino == temp.st_ino
    assert (await ops.getattr(temp.st_ino, None)).st_ino == temp.st_ino


async def test_what_the_kernel_may_keep(ops):
    """The root's own attributes a second (the kernel needs them on every path walk under
    default_permissions); a stable directory's children (the root's, gpuN/'s) for
    CACHE_TIMEOUT_S; a directory whose children an event changes (a lost GPU's PCI function
    leaves sys/bus/pci/devices), never."""
    from mokkafs.daemon.fuse_ops import CACHE_TIMEOUT_S, ROOT_ATTR_TIMEOUT_S

    root_attr = await ops.getattr(ROOT_INO, None)
    assert (root_attr.attr_timeout, ROOT_ATTR_TIMEOUT_S) == (1.0, 1.0)
    gpu0 = await ops.lookup(ROOT_INO, b"gpu0", None)
    temp = await ops.lookup(gpu0.st_ino, b"temperature", None)
    assert (temp.entry_timeout, temp.attr_timeout) == (CACHE_TIMEOUT_S, CACHE_TIMEOUT_S)
    info = dict(line.split(": ", 1) for line in (await read_file(ops, "gpu0/info")).decode().splitlines())
    function = await ops.lookup(await walk(ops, "sys/bus/pci/devices"), info["bus_id"][4:].lower().encode(), None)
    assert (function.entry_timeout, function.attr_timeout) == (0, 0)


async def _kept(ops, tops=("gpu0", "gpu1", "node", "sys", "proc", "dev", "ib")) -> dict[str, tuple]:
    """What the kernel may keep of every entry under `tops`, by path, as lookups answer now:
    (inode, type) while its name may be kept, plus (mode, size) while its attributes may."""
    kept: dict[str, tuple] = {}

    async def visit(inode: int, path: str) -> None:
        for name in sorted(ops.tree.children(inode, ops._ctx()) or ()):
            attr = await ops.lookup(inode, name.encode(), None)
            child = f"{path}/{name}" if path else name
            if attr.entry_timeout:
                mode = stat.S_IFMT(attr.st_mode)
                kept[child] = (attr.st_ino, mode) + ((attr.st_mode, attr.st_size) if attr.attr_timeout else ())
            if stat.S_ISDIR(attr.st_mode):
                await visit(attr.st_ino, child)

    for top in tops:
        await visit(await walk(ops, top), top)
    return kept


async def test_what_the_kernel_keeps_stays_true_after_any_event(ops):
    """A name the kernel may keep (entry_timeout) must be there, the same inode and type, after
    any event, and attributes it may keep (attr_timeout) the same: its invalidation notices are
    asynchronous, so a kept name outlives the entry for CACHE_TIMEOUT_S. A MIG instance's
    capability directory (`gpu1/mig/gi2` kept by `stat` after `mig clear`) and an event log's
    size (stat kept the length at the last look, and `tail -f` waited for it to grow) did not."""
    from mokkafs.model.commands import parse_line

    events = ["gpu=1 mig enable", "gpu=1 mig create 3g.40gb,1g.10gb", "gpu=1 mig destroy_ci all all",
              "gpu=1 mig clear", "gpu=0 xid 79", "gpu=0 reset", "gpu=1 mig disable", "gpu=0 lost 1",
              "gpu=0 temperature 80", "gpu=0 ecc dbe 1", "gpu=1 nvlink 2 down", "hca=0 port down",
              "gpu=1 power_limit 500", "gpu=1 ecc_mode 0", "node reset"]
    before = await _kept(ops)
    for line in events:
        ops.controller.apply(parse_line(line).event)
        for path, was in before.items():
            parent, _, name = path.rpartition("/")
            try:
                parent_inode = await walk(ops, parent)
            except pyfuse3.FUSEError:
                continue  # the kernel asks again for the directory it kept the name in (a lost GPU's)
            try:
                attr = await ops.lookup(parent_inode, name.encode(), None)
            except pyfuse3.FUSEError:
                pytest.fail(f"after {line!r}: {path} was kept, and is gone")
            now = (attr.st_ino, stat.S_IFMT(attr.st_mode)) + ((attr.st_mode, attr.st_size) if len(was) > 2 else ())
            assert now == was, f"after {line!r}: {path}"
        before = await _kept(ops)


async def test_missing_names_are_enoent(ops):
    with pytest.raises(pyfuse3.FUSEError) as err:
        await ops.lookup(ROOT_INO, b"gpu2", None)
    assert err.value.errno == errno.ENOENT
    with pytest.raises(pyfuse3.FUSEError) as err:
        await ops.getattr(999_999, None)
    assert err.value.errno == errno.ENOENT


async def test_read_renders_at_open_and_slices_the_snapshot(ops):
    inode = await walk(ops, "gpu0/info")
    info = await ops.open(inode, os.O_RDONLY, None)
    first = await ops.read(info.fh, 0, 10)
    await write_file(ops, "gpu0/inject_xid", b"79\n")  # the model changes while the file is open
    rest = await ops.read(info.fh, 10, 65536)
    await ops.release(info.fh)
    snapshot = first + rest
    assert b"health: healthy" in snapshot  # one consistent render, not a torn mix
    assert b"health: lost" in await read_file(ops, "gpu0/info")


async def test_an_event_log_read_at_its_end_gives_what_was_appended_since_the_open(ops):
    """`tail -f` keeps its descriptor and reads on from where it was: an event log's handle read
    past its snapshot gives the lines appended since the open (it gave nothing, ever). Only
    growth: once the log is full and drops its oldest line, the text is not the snapshot with
    more at its end, and the snapshot is served whole rather than a torn mix."""
    from mokkafs.model.state import LOG_LIMIT

    inode = await walk(ops, "node/events")
    info = await ops.open(inode, os.O_RDONLY, None)
    assert await ops.read(info.fh, 0, 65536) == b""
    await write_file(ops, "gpu1/inject_xid", b"13\n")
    line = await ops.read(info.fh, 0, 65536)
    assert b"): 13, pid='<unknown>'" in line and line.count(b"\n") == 1
    await write_file(ops, "gpu0/inject_xid", b"48\n")
    more = await ops.read(info.fh, len(line), 65536)
    assert b": 48, " in more and await read_file(ops, "node/events") == line + more
    await ops.release(info.fh)

    node = ops.controller.node
    while len(node.log) < LOG_LIMIT:
        ops.controller.apply(InjectXid(len(node.log) % 2, 13))
    info = await ops.open(inode, os.O_RDONLY, None)
    whole = await ops.read(info.fh, 0, 1 << 20)
    ops.controller.apply(InjectXid(1, 48))  # the oldest line leaves the log
    assert await ops.read(info.fh, len(whole), 65536) == b""
    assert await ops.read(info.fh, 0, 1 << 20) == whole
    await ops.release(info.fh)


async def test_a_control_write_applies_one_event(ops):
    assert await write_file(ops, "gpu1/temperature", b"85\n") == 3
    assert await read_file(ops, "gpu1/temperature") == b"85\n"
    assert await write_file(ops, "gpu1/temperature", b"auto") == 4
    assert await read_file(ops, "gpu1/temperature") == b"29\n"


@pytest.mark.parametrize(
    "path,data",
    [
        ("gpu0/inject_xid", b"banana\n"),
        ("gpu0/inject_xid", b"0\n"),
        ("gpu0/utilization", b"90\n"),
        ("gpu0/clocks", b"99999 1\n"),
        ("gpu0/lost", b"2\n"),
        ("node/reset", b"yes\n"),
    ],
)
async def test_a_bad_write_is_einval_and_changes_nothing(ops, expect_log, path, data):
    expect_log("^EINVAL write")
    node = ops.controller.node
    before = [g.to_dict() for g in node.gpus]
    with pytest.raises(pyfuse3.FUSEError) as err:
        await write_file(ops, path, data)
    assert err.value.errno == errno.EINVAL
    assert [g.to_dict() for g in node.gpus] == before


async def test_read_only_files_refuse_writers(ops, expect_log):
    expect_log(r"^EACCES open gpu0/info: not writable")
    inode = await walk(ops, "gpu0/info")
    with pytest.raises(pyfuse3.FUSEError) as err:
        await ops.open(inode, os.O_WRONLY, ROOT)
    assert err.value.errno == errno.EACCES


async def test_an_internal_error_is_eio_not_a_dead_daemon(ops, expect_log, monkeypatch):
    expect_log("internal error in open")
    monkeypatch.setattr(ops.controller.node, "readings", lambda *a: 1 / 0)
    inode = await walk(ops, "gpu0/temperature")
    with pytest.raises(pyfuse3.FUSEError) as err:
        await ops.open(inode, os.O_RDONLY, None)
    assert err.value.errno == errno.EIO


@pytest.mark.parametrize("bind", [True, False])
async def test_the_persistenced_socket_is_a_placeholder_where_the_daemon_binds_else_a_link(bind):
    """A daemon that binds the node's socket over driver/run/nvidia-persistenced/socket shows a
    socket there (srw-rw-rw-, never opened: the bind covers it); one that cannot, a link to it."""
    clock = Clock()
    config = compose(load_profile("h100"), gpus=1, hostname="ops")
    tree = Tree(root(config, state_dir="/run/st", bind_node_socket=bind))
    ops = MokkaOperations(tree, Controller(Node(config, clock()), None, clock), clock)
    inode = await walk(ops, "driver/run/nvidia-persistenced/socket")
    mode = (await ops.getattr(inode, None)).st_mode
    if bind:
        assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o666
        with pytest.raises(pyfuse3.FUSEError) as err:
            await ops.open(inode, os.O_RDWR, ROOT)
        assert err.value.errno == errno.ENXIO
    else:
        assert stat.S_ISLNK(mode)
        assert await ops.readlink(inode, None) == b"/run/st/node.sock"
    assert await ops.readlink(await walk(ops, "driver/run/mokka"), None) == b"/run/st"
