"""The InfiniBand fabric a node's HCAs are cabled into (docs/infiniband.md), a pure function of
the composition's `fabric:` section, the profile and the hostname.

Rail-optimised, as GPU clusters are cabled: HCA j of every node of the rail group sits on leaf
switch j ("rail j"), each leaf has one cable to each spine, and one switch runs the subnet
manager (LID 1, the `sm_lid` every HCA's sysfs shows). Switches take LIDs from 1 (the SM's
switch first), the HCAs from 0x12 (node n, HCA j: 0x12 + n*hcas + j), so a node alone keeps the
LIDs it always had. Every GUID is derived from names only (the fabric's name for switches, the
hostname and profile for HCAs), so nodes that declare the same fabric agree on all of them.

`render()` writes it as the text file `ib/fabric` that our libibumad reads (shims/libibumad);
what moves (an HCA port's state, its counters) the library reads from the HCA's sysfs."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mokkafs.model.identity import NodeConfig
from mokkafs.model.schema import IbFabric

MELLANOX_VENDOR = 0x02C9
HCA_OUI = 0xA088C2  # Mellanox, as ConnectX node GUIDs carry it
SWITCH_OUI = 0xB0CF0E  # Mellanox, as captured Quantum-2 switch GUIDs carry it
FIRST_HCA_LID = 0x12
# By the HCAs' rate: the switch of that generation (model, cabled ports, NodeInfo DeviceID).
# NodeInfo's NumPorts is one more: the last port reaches the switch's SHARP aggregation node
# (captures show 41 for an MQM8700, 65 for an MQM9700), which this fabric leaves uncabled.
SWITCHES = {
    100: ("MSB7800", 36, 0xCF08),  # Switch-IB 2, EDR
    200: ("MQM8700", 40, 0xD2F0),  # Quantum, HDR
    400: ("MQM9700", 64, 0xD2F2),  # Quantum-2, NDR
    800: ("Q3400", 144, 0xD2F4),  # Quantum-X800, XDR (device id and port count not seen in a capture)
}


@dataclass(frozen=True)
class FabricNode:
    kind: str  # "switch" or "ca"
    name: str  # spine-1, leaf-3, node-a/mlx5_2
    guid: int
    lid: int
    ports: int
    device_id: int
    desc: str
    host: str | None = None  # a CA's hostname
    hca: int | None = None  # a CA's HCA index on its host


@dataclass(frozen=True)
class Fabric:
    name: str
    nodes: tuple[FabricNode, ...]
    links: tuple[tuple[int, int, int, int], ...]  # (node a, port a, node b, port b)
    sm: int  # index of the switch running the SM
    sm_priority: int
    rate_gbps: int


def spec(config: NodeConfig) -> IbFabric:
    return config.composition.fabric or IbFabric()


def _hash24(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:3], "big")


def hca_guid(hostname: str, profile_name: str, j: int) -> int:
    """A stable GUID under Mellanox's OUI, derived from the hostname, profile and HCA index."""
    digest = hashlib.sha256(f"{hostname}/{profile_name}/hca{j}".encode()).digest()
    return (HCA_OUI << 40) | (0x03 << 32) | int.from_bytes(digest[:3], "big")


def switch_guid(fabric_name: str, switch: str) -> int:
    return (SWITCH_OUI << 40) | (0x03 << 32) | _hash24(f"{fabric_name}/{switch}")


def hosts(config: NodeConfig) -> tuple[str, ...]:
    """The rail group in LID order; a node its fabric does not list comes last."""
    listed = spec(config).nodes or (config.hostname,)
    return listed if config.hostname in listed else (*listed, config.hostname)


def switch_names(config: NodeConfig) -> list[str]:
    """Switches in LID order: the SM's switch first (LID 1), then spines, then leaves."""
    s = spec(config)
    names = [f"spine-{i + 1}" for i in range(s.spines)] + [f"leaf-{j + 1}" for j in range(config.hcas)]
    sm = s.sm or names[0]
    if sm not in names:
        raise ValueError(f"fabric.sm: {sm}, but the fabric's switches are {names[0]}..{names[-1]}")
    return [sm] + [n for n in names if n != sm]


def first_hca_lid(config: NodeConfig) -> int:
    return max(FIRST_HCA_LID, spec(config).spines + config.hcas + 1)


def hca_lid(config: NodeConfig, j: int) -> int:
    """The LID the SM gave this node's HCA j (what sysfs `lid` shows while the port is up)."""
    n = hosts(config).index(config.hostname)
    return first_hca_lid(config) + n * config.hcas + j


def build(config: NodeConfig) -> Fabric | None:
    """The fabric, or None for a node without HCAs."""
    if not config.hcas or config.composition.hca is None:
        return None
    s = spec(config)
    rate = config.composition.hca.rate_gbps
    model, cabled, devid = SWITCHES[rate]
    nports = cabled + 1
    if config.hcas > cabled:
        raise ValueError(f"{config.hcas} HCAs need {config.hcas} leaves, but a {model} spine has {cabled} ports")
    if len(hosts(config)) > cabled // 2:
        raise ValueError(f"fabric.nodes: {len(hosts(config))} nodes, but a {model} leaf has {cabled // 2} downlinks")
    hca_devid = int("".join(c for c in config.composition.hca.hca_type if c.isdigit()) or "0") & 0xFFFF
    nodes: list[FabricNode] = []
    index: dict[str, int] = {}
    for lid, name in enumerate(switch_names(config), start=1):
        index[name] = len(nodes)
        nodes.append(FabricNode("switch", name, switch_guid(s.name, name), lid, nports, devid,
                                f"MF0;{s.name}-{name}:{model}/U1"))
    base = first_hca_lid(config)
    for n, host in enumerate(hosts(config)):
        for j in range(config.hcas):
            name = f"{host}/mlx5_{j}"
            index[name] = len(nodes)
            nodes.append(FabricNode("ca", name, hca_guid(host, config.profile.name, j), base + n * config.hcas + j,
                                    1, hca_devid, f"{host} mlx5_{j}", host=host, hca=j))
    links: list[tuple[int, int, int, int]] = []
    for j in range(config.hcas):
        leaf = index[f"leaf-{j + 1}"]
        for n, host in enumerate(hosts(config)):
            links.append((index[f"{host}/mlx5_{j}"], 1, leaf, n + 1))
        for i in range(s.spines):
            links.append((leaf, cabled // 2 + 1 + i, index[f"spine-{i + 1}"], j + 1))
    return Fabric(s.name, tuple(nodes), tuple(links), 0, s.sm_priority, rate)


def render(config: NodeConfig) -> str:
    """`ib/fabric`: one line per fact, parsed by shims/libibumad/umad_fabric.c.

        mokka-fabric 1
        rate GBPS
        sm INDEX PRIORITY
        node INDEX TYPE PORTS GUID LID DEVICE_ID VENDOR_ID HCA DESCRIPTION
        link A PORT_A B PORT_B

    TYPE is the NodeInfo node type (1 CA, 2 switch); HCA is the HCA index of a CA of this node
    (its port state and counters are read from sysfs), -1 for every other node."""
    fabric = build(config)
    if fabric is None:
        return "mokka-fabric 1\n"
    lines = ["mokka-fabric 1", f"rate {fabric.rate_gbps}", f"sm {fabric.sm} {fabric.sm_priority}"]
    for i, n in enumerate(fabric.nodes):
        local = n.hca if n.kind == "ca" and n.host == config.hostname else -1
        lines.append(f"node {i} {1 if n.kind == 'ca' else 2} {n.ports} 0x{n.guid:016x} {n.lid} 0x{n.device_id:04x} "
                     f"0x{MELLANOX_VENDOR:06x} {local} {n.desc}")
    lines += [f"link {a} {pa} {b} {pb}" for a, pa, b, pb in fabric.links]
    return "".join(f"{line}\n" for line in lines)
