"""The fabric model (model/ibfabric.py): rails on leaves, leaves on spines, the SM's LID, LIDs and
GUIDs every node of a declared rail group agrees on, and the `fabric:` section's errors."""
from __future__ import annotations

import pytest

from mokkafs.model import ibfabric
from mokkafs.model.identity import compose
from mokkafs.model.profiles import ProfileError, load_composition, load_profile
from mokkafs.render import infiniband

pytestmark = pytest.mark.level("model")


def node(profile: str = "h100", hostname: str = "gpu-a", **fabric):
    comp = load_composition(load_profile(profile).composition.name)
    if fabric:
        comp = comp.model_validate({**comp.model_dump(), "fabric": fabric})
    return compose(load_profile(profile), node=comp, hostname=hostname)


def test_default_fabric_is_a_leaf_per_rail_under_two_spines():
    config = node()
    fab = ibfabric.build(config)
    switches = [n for n in fab.nodes if n.kind == "switch"]
    assert [s.name for s in switches] == ["spine-1", "spine-2"] + [f"leaf-{j}" for j in range(1, 9)]
    assert [s.lid for s in switches] == list(range(1, 11)) and fab.nodes[fab.sm].name == "spine-1"
    assert all(s.ports == 65 and s.device_id == 0xD2F2 for s in switches)  # MQM9700
    cas = [n for n in fab.nodes if n.kind == "ca"]
    # LIDs and GUIDs as sysfs has always shown them for a node alone
    assert [c.lid for c in cas] == [0x12 + j for j in range(8)]
    assert [c.guid for c in cas] == [infiniband.node_guid(config, j) for j in range(8)]
    by_name = {n.name: i for i, n in enumerate(fab.nodes)}
    assert (by_name["gpu-a/mlx5_3"], 1, by_name["leaf-4"], 1) in fab.links
    assert (by_name["leaf-4"], 33, by_name["spine-1"], 4) in fab.links
    assert len(fab.links) == 8 + 8 * 2


def test_nodes_declaring_one_fabric_agree_on_it():
    a = node(hostname="gpu-a", name="pod1", nodes=["gpu-a", "gpu-b"], spines=1, sm="leaf-2")
    b = node(hostname="gpu-b", name="pod1", nodes=["gpu-a", "gpu-b"], spines=1, sm="leaf-2")
    fa, fb = ibfabric.build(a), ibfabric.build(b)
    assert fa == fb
    assert fa.nodes[fa.sm].name == "leaf-2" and fa.nodes[fa.sm].lid == 1
    # each node answers for its own HCAs only; its LIDs follow the group's order
    assert ibfabric.hca_lid(b, 0) == 0x12 + 8 and ibfabric.hca_lid(a, 0) == 0x12
    local_a = [line.split()[8] for line in ibfabric.render(a).splitlines() if line.startswith("node ")]
    local_b = [line.split()[8] for line in ibfabric.render(b).splitlines() if line.startswith("node ")]
    assert local_a[9:17] == [str(j) for j in range(8)] and set(local_a[17:]) == {"-1"}
    assert local_b[17:] == [str(j) for j in range(8)] and set(local_b[9:17]) == {"-1"}


def test_a_host_the_fabric_does_not_list_comes_last():
    config = node(hostname="gpu-z", nodes=["gpu-a"])
    assert ibfabric.hosts(config) == ("gpu-a", "gpu-z")
    assert ibfabric.hca_lid(config, 0) == 0x12 + 8


@pytest.mark.parametrize("fabric, message", [
    ({"sm": "spine-3"}, "fabric.sm: spine-3, but the fabric has 2 spines"),
    ({"sm": "leaf-9"}, "fabric.sm: leaf-9, but the fabric's switches are"),
    ({"nodes": ["a", "a"]}, "fabric.nodes lists a hostname twice"),
    ({"spines": 17}, "less than or equal to 16"),
    ({"sm": "core-1"}, "String should match pattern"),
    ({"name": "no spaces"}, "String should match pattern"),
])
def test_bad_fabric_sections_say_what_is_wrong(fabric, message):
    with pytest.raises((ProfileError, ValueError)) as err:
        node(**fabric)
    assert message in str(err.value)


def test_hdr_and_edr_pick_their_switches():
    a100 = ibfabric.build(node("a100"))
    assert {(n.ports, n.device_id) for n in a100.nodes if n.kind == "switch"} == {(41, 0xD2F0)}  # MQM8700
    assert "rate 200" in ibfabric.render(node("a100"))
