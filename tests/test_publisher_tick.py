"""The tick rewrites only what time changes,
and every record it leaves is the record a whole publish would write at that moment."""
from __future__ import annotations

import pytest

from mokkafs.model import Node, compose
from mokkafs.model.events import InjectEcc, InjectXid, NvLinkCommand, Pin, SetProcesses
from mokkafs.model.profiles import load_profile
from mokkafs.daemon.shm.layout import ffi
from mokkafs.daemon.shm.publisher import Publisher, fill_gpu

pytestmark = pytest.mark.level("daemon")

RECORD = ffi.sizeof("struct mokka_gpu")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def whole(node: Node, i: int, now: float) -> bytes:
    g = ffi.new("struct mokka_gpu *")
    fill_gpu(g[0], node, i, now)
    return bytes(ffi.buffer(g))


def published(pub: Publisher, i: int) -> bytes:
    return bytes(ffi.buffer(ffi.addressof(pub._st.gpus, i), RECORD))


@pytest.fixture
def setup(tmp_path):
    clock = Clock()
    node = Node(compose(load_profile("h100"), gpus=3, hostname="tick"), clock())
    pub = Publisher(tmp_path / "state", clock)
    pub.open()
    pub.publish(node)
    yield node, pub, clock
    pub.close()


# Each step: advance the clock, change the node (told to the publisher as the controller
# would, or not told at all), then tick.
STEPS = [
    (40.0, Pin(0, "utilization", (100, 80)), True),
    (0.1, None, False),
    (7.5, InjectXid(1, 79), True),
    (0.1, InjectEcc(2, "sbe", 3, "dram"), False),  # changed without a publish: the tick must see it
    (30.0, NvLinkCommand(0, 4, "errors", 9), False),
    (0.1, SetProcesses(1, ((4242, 1 << 30),)), True),
    (600.0, Pin(2, "temperature", (91,)), False),
    (0.1, None, False),
]


def test_after_each_tick_every_record_is_what_a_whole_publish_writes(setup):
    node, pub, clock = setup
    for advance, event, told in STEPS:
        clock.now += advance
        if event is not None:
            outcome = node.apply(event, clock())
            if told:
                pub(node, outcome)
        clock.now += 0.05
        pub.publish(node, tick=True)
        for i in range(len(node.gpus)):
            assert published(pub, i) == whole(node, i, clock()), (event, i)


def test_a_tick_moves_temperature_and_energy_with_time(setup):
    node, pub, clock = setup
    pub(node, node.apply(Pin(0, "utilization", (100, 100)), clock()))
    before = pub._st.gpus[0].energy_mj, pub._st.gpus[0].temp_gpu, pub._st.generation
    clock.now += 40.0
    pub.publish(node, tick=True)
    g = pub._st.gpus[0]
    assert g.energy_mj - before[0] == pytest.approx(700.0 * 40 * 1000, abs=1)  # 700 W for 40 s, in mJ
    assert g.temp_gpu > before[1]
    assert pub._st.generation == before[2] + 1
    assert pub._st.publish_time_ns == int(clock() * 1e9)
