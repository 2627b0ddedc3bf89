"""`node/events` and `gpuN/events`, served from lines formatted once (render/control.py's
EventLogText): after any sequence of events, a restore and a rolled-back event, every read is
exactly what rendering the whole log gives, and no line is formatted twice."""
from __future__ import annotations

import errno

import pytest

import mokkafs.render.control as control
from mokkafs.daemon.controller import Controller
from mokkafs.model import Node, compose
from mokkafs.model.profiles import load_profile
from mokkafs.model.state import LOG_LIMIT, LogEntry
from mokkafs.render.tree import root
from mokkafs.render.vfs import Ctx, Tree

pytestmark = pytest.mark.level("render")

T0 = 1_800_000_000.0
GPUS = 3
# Writes of every kind that logs: each Xid logs a line on its GPU, a reset one per GPU it resets.
WRITES = [("gpu{g}/inject_xid", b"13\n"), ("gpu{g}/inject_xid", b"79\n"), ("gpu{g}/reset", b"1\n"),
          ("gpu{g}/inject_ecc", b"dbe 1 dram\n"), ("node/reset", b"1\n"), ("gpu{g}/temperature", b"88\n"),
          ("gpu{g}/inject_xid", b"48\n"), ("gpu{g}/nvlink", b"2 down\n")]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


class FullDisk:
    """A state directory that refuses every save: the controller rolls the node back."""

    def save_change(self, *args) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def node_tree():
    clock = Clock()
    config = compose(load_profile("h100"), gpus=GPUS, hostname="events")
    node = Node(config, clock())
    return Controller(node, None, clock), Tree(root(config)), clock


def entry(tree: Tree, node: Node, path: str):
    return tree.entry(tree.ino(path), Ctx(node, T0))


def write(controller: Controller, tree: Tree, path: str, data: bytes) -> None:
    controller.apply(entry(tree, controller.node, path).write(data))


def check_reads(tree: Tree, node: Node) -> None:
    ctx = Ctx(node, T0)
    assert entry(tree, node, "node/events").read(ctx) == control._events(ctx, None).encode()
    for i in range(GPUS):
        assert entry(tree, node, f"gpu{i}/events").read(ctx) == control._events(ctx, i).encode()


def test_every_read_is_the_whole_log_rendered(node_tree):
    controller, tree, clock = node_tree
    check_reads(tree, controller.node)  # empty
    for n in range(40):
        path, data = WRITES[n % len(WRITES)]
        write(controller, tree, path.format(g=n % GPUS), data)
        if n % 3:  # reads after one event and after several
            check_reads(tree, controller.node)
    check_reads(tree, controller.node)


def test_the_log_dropping_its_oldest_lines(node_tree):
    controller, tree, clock = node_tree
    check_reads(tree, controller.node)
    while len(controller.node.log) < LOG_LIMIT:
        write(controller, tree, f"gpu{len(controller.node.log) % GPUS}/inject_xid", b"13\n")
    check_reads(tree, controller.node)
    first = controller.node.log[0]
    for n in range(2 * GPUS + 1):  # past the limit: the oldest lines leave the files
        write(controller, tree, f"gpu{n % GPUS}/inject_xid", b"48\n")
        check_reads(tree, controller.node)
    assert controller.node.log[0] is not first and len(controller.node.log) == LOG_LIMIT


def test_a_restored_log_and_another_node(node_tree):
    controller, tree, clock = node_tree
    for n in range(5):
        write(controller, tree, f"gpu{n % GPUS}/inject_xid", b"13\n")
    check_reads(tree, controller.node)
    # A restore replaces the log whole, with other lines than the cache formatted.
    node = controller.node
    saved = [g.to_dict() for g in node.gpus]
    node.restore(saved, [LogEntry(T0 + 1, 1, "restored line one"), LogEntry(T0 + 2, None, "restored two")])
    check_reads(tree, node)
    # The same tree over another node (tests render several nodes through one tree).
    other = Node(node.config, T0)
    check_reads(tree, other)
    check_reads(tree, node)


def test_a_rolled_back_event_leaves_no_line(node_tree, expect_log):
    expect_log(r"InjectXid not applied: cannot save the state")
    controller, tree, clock = node_tree
    write(controller, tree, "gpu0/inject_xid", b"13\n")
    check_reads(tree, controller.node)
    before = entry(tree, controller.node, "node/events").read(Ctx(controller.node, T0))
    controller.state = FullDisk()
    with pytest.raises(OSError):
        write(controller, tree, "gpu1/inject_xid", b"79\n")
    check_reads(tree, controller.node)
    assert entry(tree, controller.node, "node/events").read(Ctx(controller.node, T0)) == before
    controller.state = None
    write(controller, tree, "gpu1/inject_xid", b"48\n")
    check_reads(tree, controller.node)


def test_each_line_is_formatted_once(node_tree, monkeypatch):
    """The timestamp costs ~2 us a line: a full log rendered at every open and stat held the
    daemon ~8 ms per read of node/events. Reads format only the lines new since the last."""
    controller, tree, clock = node_tree
    calls = []
    real = control.log_line
    monkeypatch.setattr(control, "log_line", lambda e: calls.append(e) or real(e))
    for n in range(30):
        write(controller, tree, f"gpu{n % GPUS}/inject_xid", b"13\n")
    node = controller.node
    ctx = Ctx(node, T0)
    files = [entry(tree, node, "node/events")] + [entry(tree, node, f"gpu{i}/events") for i in range(GPUS)]
    for _ in range(3):  # an open, a stat, another reader
        for f in files:
            f.read(ctx)
    assert len(calls) == len(node.log) == 30
    write(controller, tree, "gpu2/inject_xid", b"48\n")
    for f in files:
        f.read(ctx)
    assert len(calls) == 31
