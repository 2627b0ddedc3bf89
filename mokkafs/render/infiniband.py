"""`sys/class/infiniband{,_mad,_verbs}` and the HCAs' device entries, as rdma-core's libibumad
and infiniband-diags read them (formats: rdma-core's libibumad and the kernel's
drivers/infiniband/core/sysfs.c), plus `ib/mlx5_N/port1`, the
control file that takes a port down or up and adds error counts.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from mokkafs.model import commands, ibfabric
from mokkafs.model.events import IB_ERROR_COUNTERS
from mokkafs.model.identity import NodeConfig
from mokkafs.model.topology import Layout, PciFunction
from mokkafs.render.vfs import Ctx, Dir, Entry, Symlink, const, static_dir, text

UMAD_MAJOR = 231
UVERBS_MINOR_BASE = 192
ISSM_MINOR_BASE = 64
# Capability mask of a ConnectX-7 port on an InfiniBand fabric (real ibstat).
CAP_MASK = 0xA751E848
RATE_NAMES = {100: "EDR", 200: "HDR", 400: "NDR", 800: "XDR"}
# Traffic counters that exist beside the error counters; nothing flows in a simulation.
TRAFFIC_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
    "port_xmit_wait",
)
HW_COUNTERS = ("out_of_buffer", "out_of_sequence", "rnr_nak_retry_err", "local_ack_timeout_err", "duplicate_request")


def hca_name(j: int) -> str:
    return f"mlx5_{j}"


def node_guid(config: NodeConfig, j: int) -> int:
    """A stable GUID under Mellanox's OUI (a0:88:c2), derived from the hostname and HCA index."""
    return ibfabric.hca_guid(config.hostname, config.profile.name, j)


def guid_groups(guid: int) -> str:
    """`a088:c203:00e3:142a`: the kernel's node_guid spelling."""
    return ":".join(f"{(guid >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0))


def base_lid(config: NodeConfig, j: int) -> int:
    """The LID the fabric's subnet manager gave HCA j (model/ibfabric.py)."""
    return ibfabric.hca_lid(config, j)


def port_state(ctx: Ctx, j: int) -> str:
    return "1: DOWN" if ctx.node.hcas[j].port_down else "4: ACTIVE"


def phys_state(ctx: Ctx, j: int) -> str:
    return "3: Disabled" if ctx.node.hcas[j].port_down else "5: LinkUp"


def rate(ctx: Ctx, j: int) -> str:
    # A disabled port reports the slowest rate, as mlx5 does for a link that is not trained.
    if ctx.node.hcas[j].port_down:
        return "10 Gb/sec (4X SDR)"
    gbps = ctx.node.config.composition.hca.rate_gbps
    return f"{gbps} Gb/sec (4X {RATE_NAMES[gbps]})"


def _lid(ctx: Ctx, j: int) -> str:
    return "0xffff" if ctx.node.hcas[j].port_down else f"0x{base_lid(ctx.node.config, j):x}"


def _sm_lid(ctx: Ctx, j: int) -> str:
    return "0x0" if ctx.node.hcas[j].port_down else "0x1"


def port_dir(config: NodeConfig, j: int) -> Dir:
    guid = node_guid(config, j)
    counters: dict[str, Entry] = {
        name: text(lambda ctx, name=name: f"{ctx.node.hcas[j].counters[name]}\n") for name in IB_ERROR_COUNTERS
    }
    counters.update({name: const("0\n") for name in TRAFFIC_COUNTERS})
    return static_dir(
        {
            "state": text(lambda ctx: port_state(ctx, j) + "\n"),
            "phys_state": text(lambda ctx: phys_state(ctx, j) + "\n"),
            "rate": text(lambda ctx: rate(ctx, j) + "\n"),
            "lid": text(lambda ctx: _lid(ctx, j) + "\n"),
            "sm_lid": text(lambda ctx: _sm_lid(ctx, j) + "\n"),
            "lid_mask_count": const("0\n"),
            "sm_sl": const("0\n"),
            "cap_mask": const(f"0x{CAP_MASK:08x}\n"),
            "link_layer": const("InfiniBand\n"),
            "gids": static_dir({"0": const(f"fe80:0000:0000:0000:{guid_groups(guid)}\n")}),
            "pkeys": static_dir({"0": const("0xffff\n")}),
            "counters": static_dir(counters),
            "hw_counters": static_dir({name: const("0\n") for name in HW_COUNTERS}),
        }
    )


def hca_dir(config: NodeConfig, j: int, bdf: str) -> Dir:
    """`.../<hca bdf>/infiniband/mlx5_N`, what `sys/class/infiniband/mlx5_N` points at."""
    hca = config.composition.hca
    guid = guid_groups(node_guid(config, j))
    return static_dir(
        {
            "node_type": const("1: CA\n"),
            "node_guid": const(f"{guid}\n"),
            "sys_image_guid": const(f"{guid}\n"),
            "fw_ver": const(f"{hca.fw_ver}\n"),
            "hw_rev": const("0\n"),
            "hca_type": const(f"{hca.hca_type}\n"),
            "board_id": const(f"{hca.board_id}\n"),
            "node_desc": const(f"{config.hostname} {hca_name(j)}\n"),
            "device": Symlink(f"../../../{bdf}"),
            "ports": static_dir({"1": port_dir(config, j)}),
        },
        mode=0o755,
    )


def device_children(config: NodeConfig, fn: PciFunction) -> Mapping[str, Entry]:
    """What an HCA's PCI device directory holds besides its PCI attributes."""
    if fn.kind != "hca":
        return {}
    j = fn.index
    return {
        "infiniband": static_dir({hca_name(j): hca_dir(config, j, fn.bdf.sysfs)}, mode=0o755),
        "infiniband_mad": static_dir({f"umad{j}": _umad(j), f"issm{j}": _issm(j)}, mode=0o755),
        "infiniband_verbs": static_dir({f"uverbs{j}": _uverbs(j)}, mode=0o755),
    }


def _umad(j: int) -> Dir:
    return static_dir(
        {"ibdev": const(f"{hca_name(j)}\n"), "port": const("1\n"), "dev": const(f"{UMAD_MAJOR}:{j}\n")}, mode=0o755
    )


def _issm(j: int) -> Dir:
    return static_dir(
        {
            "ibdev": const(f"{hca_name(j)}\n"),
            "port": const("1\n"),
            "dev": const(f"{UMAD_MAJOR}:{ISSM_MINOR_BASE + j}\n"),
        },
        mode=0o755,
    )


def _uverbs(j: int) -> Dir:
    return static_dir(
        {
            "ibdev": const(f"{hca_name(j)}\n"),
            "abi_version": const("1\n"),
            "dev": const(f"{UMAD_MAJOR}:{UVERBS_MINOR_BASE + j}\n"),
        },
        mode=0o755,
    )


def class_dirs(layout: Layout, rel_path) -> dict[str, Dir]:
    """sys/class/infiniband, infiniband_mad and infiniband_verbs: links into the device tree.
    `rel_path(fn)` is the HCA's directory relative to sys/ (`devices/pci.../0000:19:00.0`)."""
    hcas = [fn for fn in layout.functions if fn.kind == "hca"]
    ib = {hca_name(fn.index): Symlink(f"../../{rel_path(fn)}/infiniband/{hca_name(fn.index)}") for fn in hcas}
    mad: dict[str, Entry] = {"abi_version": const("5\n")}
    verbs: dict[str, Entry] = {"abi_version": const("6\n")}
    for fn in hcas:
        j = fn.index
        mad[f"umad{j}"] = Symlink(f"../../{rel_path(fn)}/infiniband_mad/umad{j}")
        mad[f"issm{j}"] = Symlink(f"../../{rel_path(fn)}/infiniband_mad/issm{j}")
        verbs[f"uverbs{j}"] = Symlink(f"../../{rel_path(fn)}/infiniband_verbs/uverbs{j}")
    return {
        "infiniband": static_dir(ib, mode=0o755),
        "infiniband_mad": static_dir(mad, mode=0o755),
        "infiniband_verbs": static_dir(verbs, mode=0o755),
    }


def render_port_control(ctx: Ctx, j: int) -> str:
    h = ctx.node.hcas[j]
    lines = [
        f"state {port_state(ctx, j)}",
        f"phys_state {phys_state(ctx, j)}",
        f"rate {rate(ctx, j)}",
    ]
    lines += [f"{name} {h.counters[name]}" for name in IB_ERROR_COUNTERS]
    return "".join(f"{line}\n" for line in lines)


def _port_writer(j: int):
    return commands.control_writer(commands.hca(j), "port")


def control_dir(config: NodeConfig) -> Dir:
    """`ib/mlx5_N/port1`: read the port's state and counters; write `down`, `up`, `errors N`
    or `errors COUNTER N`. `ib/fabric`: the fabric the HCAs are cabled into, as our libibumad
    reads it (model/ibfabric.py)."""
    children: dict[str, Entry] = {
        hca_name(j): static_dir({"port1": text(partial(render_port_control, j=j), write=_port_writer(j))})
        for j in range(config.hcas)
    }
    if config.hcas:
        children["fabric"] = const(ibfabric.render(config))
    return static_dir(children)
