"""Hypothesis against every control parser: random bytes never crash the daemon and never
change state unless they are a valid command."""
from __future__ import annotations

import errno
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mokkafs.daemon.controller import Controller
from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model.profiles import load_profile
from mokkafs.render.control import gpu_dir, node_dir
from mokkafs.render.vfs import File

pytestmark = pytest.mark.level("mount")

T0 = 1_800_000_000.0

CONTROL_FILES = sorted(name for name, e in gpu_dir(0).children(None).items() if isinstance(e, File) and e.write)

# Near-misses of real commands find more edges than uniform bytes alone.
WORDS = [b"79", b"48", b"0", b"1", b"auto", b"none", b"sbe", b"dbe", b"dram", b"l2", b"up", b"down",
         b"errors", b"hw_thermal_slowdown", b"100", b"99999999", b"-1", b" ", b"\n", b"\x00", b"\xff"]
payloads = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(WORDS), max_size=6).map(lambda ws: b" ".join(ws)),
    st.lists(st.sampled_from(WORDS), max_size=4).map(b"".join),
)


def snapshot(node: Node) -> list[dict]:
    return [g.to_dict() for g in node.gpus]


@pytest.fixture(scope="module")
def controller():
    node = Node(compose(load_profile("h100"), gpus=2, hostname="fuzz"), T0)
    return Controller(node, None, clock=lambda: T0)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(CONTROL_FILES + ["node/reset"]), data=payloads)
def test_random_writes_parse_to_a_valid_event_or_change_nothing(controller, name, data):
    node = controller.node
    entry = node_dir().children(None)["reset"] if name == "node/reset" else gpu_dir(1).children(None)[name]
    before = snapshot(node)
    try:
        event = entry.write(data)
    except InvalidCommand:
        assert snapshot(node) == before
        return
    try:
        controller.apply(event)
    except InvalidCommand:
        assert snapshot(node) == before


def test_random_writes_through_a_real_mount(mounted):
    """The same through the kernel: EINVAL or success, and the daemon keeps serving."""
    mounted.expect_warning("EINVAL write")

    @settings(max_examples=150, deadline=None)
    @given(name=st.sampled_from(CONTROL_FILES), data=payloads.filter(bool))
    def run(name, data):
        info_before = mounted.read("gpu0/info") if name in ("inject_xid", "lost", "reset") else None
        rc = mounted.write(f"gpu0/{name}", data)
        assert rc in (0, errno.EINVAL)
        if rc == errno.EINVAL and info_before is not None:
            assert mounted.read("gpu0/info") == info_before

    run()
    assert mounted.read("node/gpu_count") == "8\n"
    assert os.path.ismount(mounted.mnt)
