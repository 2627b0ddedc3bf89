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


def test_links_and_ecc_read_as_the_model_has_them_through_down_errors_up_and_clears(setup):
    """An event's publish writes only the NVLinks and ECC rows that differ from a fresh GPU's
    (the rest come from the record's static part): a link taken down, given errors and brought
    back reads exactly so, every other link stays up without errors, and cleared ECC reads 0."""
    from mokkafs.daemon.shm.publisher import NVLINK_COUNTERS
    from mokkafs.model.events import ClearEcc

    node, pub, clock = setup
    links = node.profile.nvlink.links
    assert links == 18

    def check(down: set[int], errored: set[int], dram_sbe: int) -> None:
        g, st = pub._st.gpus[0], node.gpus[0]
        assert [g.nvlink[k].state for k in range(links)] == [0 if k in down else 1 for k in range(links)]
        for k in range(links):
            counts = list(g.nvlink[k].errors)
            assert (sum(counts) > 0) == (k in errored), k
            assert counts == [st.nvlink_errors[k][c] for c in NVLINK_COUNTERS] if k in errored else [0] * 4
        assert g.nvlink_count == links
        assert sum(g.ecc[0][0]) == dram_sbe  # volatile, corrected: by location
        assert published(pub, 0) == whole(node, 0, clock())

    check(set(), set(), 0)
    for event, down, errored, sbe in (
        (NvLinkCommand(0, 4, "down"), {4}, set(), 0),
        (NvLinkCommand(0, 17, "errors", 9), {4}, {17}, 0),
        (InjectEcc(0, "sbe", 3, "dram"), {4}, {17}, 3),
        (NvLinkCommand(0, 4, "up"), set(), {17}, 3),
        (NvLinkCommand(0, 17, "reset_errors"), set(), set(), 3),
        (ClearEcc(0, "volatile"), set(), set(), 0),
    ):
        clock.now += 1.0
        pub(node, node.apply(event, clock()))
        check(down, errored, sbe)
