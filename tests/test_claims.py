"""A process's memory claim, as the process table reports it, is bounded by the memory it could
be made in: a GPU instance's for a process on a MIG device, the GPU's otherwise."""
from __future__ import annotations

import pytest

from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model.commands import parse_line
from mokkafs.model.events import SetProcesses
from mokkafs.model.profiles import load_profile
from mokkafs.render.metrics import render

pytestmark = pytest.mark.level("model")

T0 = 1_800_000_000.0
MIB = 1 << 20


def mig_node() -> Node:
    node = Node(compose(load_profile("h100"), gpus=1, hostname="claims"), T0)
    for line in ("gpu=0 mig enable", "gpu=0 mig create 1g.10gb"):
        node.apply(parse_line(line).event, T0)
    return node


def test_a_claim_larger_than_its_instance_is_refused_and_changes_nothing():
    node = mig_node()
    (gi,), _ = node.mig_devices(0)
    room = gi.profile.memory_mib * MIB
    generation = node.generation
    with pytest.raises(InvalidCommand, match=f"more than the {room} of GPU instance {gi.id}"):
        node.apply(SetProcesses(0, ((77, 81_559 * MIB),), instances=((77, gi.id, 0),)), T0)
    with pytest.raises(InvalidCommand, match="more than"):  # an instance the GPU does not have
        node.apply(SetProcesses(0, ((77, MIB),), instances=((77, 99, 0),)), T0)
    with pytest.raises(InvalidCommand, match="of the GPU"):
        node.apply(SetProcesses(0, ((78, (node.profile.memory.total_mib + 1) * MIB),)), T0)
    assert node.processes[0] == () and node.generation == generation
    node.apply(SetProcesses(0, ((77, room),), instances=((77, gi.id, 0),)), T0)  # all of it is possible


def test_claims_that_add_up_past_an_instance_report_it_full_and_never_negative_free():
    node = mig_node()
    (gi,), (dev,) = node.mig_devices(0)
    room = gi.profile.memory_mib * MIB
    # Two users each claim nearly all of it: each claim alone is possible, together they are not.
    node.apply(SetProcesses(0, ((77, room - MIB), (78, room - MIB)),
                            instances=((77, gi.id, 0), (78, gi.id, 0))), T0)
    (gi,), _ = node.mig_devices(0)
    assert gi.memory_used_bytes == room
    text = render(node, T0).decode()
    free = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_FREE") and "GPU_I_ID" in line]
    assert free and all(float(line.rsplit(" ", 1)[1]) >= 0 for line in free), free
