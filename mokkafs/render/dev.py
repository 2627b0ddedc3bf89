"""`dev/`: the NVIDIA (and InfiniBand) character nodes with the driver's majors and minors.

The nodes only carry numbers: opening one through the mount reaches no driver (ENXIO), which is
what consumers that `stat` them (nvidia-ctk, the device plugin, Slurm) need.
"""
from __future__ import annotations

from collections.abc import Mapping

from mokkafs.model.identity import NodeConfig, gpu_identities
from mokkafs.model.topology import Layout
from mokkafs.render.proc_nvidia import (
    CAPS_MAJOR,
    FABRIC_IMEX_MGMT_MINOR,
    IB_MAJOR,
    MIG_CONFIG_MINOR,
    MIG_MONITOR_MINOR,
    MODESET_MINOR,
    NVIDIA_MAJOR,
    NVIDIACTL_MINOR,
    NVSWITCH_MAJOR,
    UVM_MAJOR,
    live_mig_capabilities,
    nvlink_fabric,
)
from mokkafs.render.infiniband import ISSM_MINOR_BASE, UVERBS_MINOR_BASE
from mokkafs.render.vfs import CharDev, Ctx, Dir, Entry, static_dir

NVSWITCHCTL_MINOR = 255


def dev_tree(config: NodeConfig, layout: Layout) -> Dir:
    top: dict[str, Entry] = {
        f"nvidia{ident.minor}": CharDev(NVIDIA_MAJOR, ident.minor) for ident in gpu_identities(config)
    }
    top["nvidiactl"] = CharDev(NVIDIA_MAJOR, NVIDIACTL_MINOR)
    top["nvidia-modeset"] = CharDev(NVIDIA_MAJOR, MODESET_MINOR)
    top["nvidia-uvm"] = CharDev(UVM_MAJOR, 0)
    top["nvidia-uvm-tools"] = CharDev(UVM_MAJOR, 1)
    # Modes follow each capability's DeviceFileMode: config 0400, monitor 0444; the live MIG
    # instances' nodes come and go with them.
    fixed = {
        f"nvidia-cap{MIG_CONFIG_MINOR}": CharDev(CAPS_MAJOR, MIG_CONFIG_MINOR, 0o400),
        f"nvidia-cap{MIG_MONITOR_MINOR}": CharDev(CAPS_MAJOR, MIG_MONITOR_MINOR, 0o444),
    }

    def caps(ctx: Ctx) -> Mapping[str, Entry]:
        _, live = live_mig_capabilities(ctx.node)
        return {**fixed, **{f"nvidia-cap{c.minor}": CharDev(CAPS_MAJOR, c.minor, c.mode) for c in live}}

    if nvlink_fabric(config):  # nvidia-modprobe -f .../capabilities/fabric-imex-mgmt makes it
        fixed[f"nvidia-cap{FABRIC_IMEX_MGMT_MINOR}"] = CharDev(CAPS_MAJOR, FABRIC_IMEX_MGMT_MINOR, 0o400)
    top["nvidia-caps"] = Dir(caps, mode=0o755)
    switches = [fn for fn in layout.functions if fn.kind == "nvswitch"]
    if switches:
        top["nvidia-nvswitchctl"] = CharDev(NVSWITCH_MAJOR, NVSWITCHCTL_MINOR)
        top.update({f"nvidia-nvswitch{fn.index}": CharDev(NVSWITCH_MAJOR, fn.index) for fn in switches})
    if config.hcas:
        ib: dict[str, Entry] = {}
        for j in range(config.hcas):
            ib[f"umad{j}"] = CharDev(IB_MAJOR, j)
            ib[f"issm{j}"] = CharDev(IB_MAJOR, ISSM_MINOR_BASE + j, 0o600)
            ib[f"uverbs{j}"] = CharDev(IB_MAJOR, UVERBS_MINOR_BASE + j)
        top["infiniband"] = static_dir(ib, mode=0o755)
    return static_dir(top, mode=0o755)
