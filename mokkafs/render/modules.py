"""`proc/modules` and `sys/module/nvidia*`: the driver's kernel modules as a node with the driver
loaded lists them, after the host's own (docs/sysfs.md gives the captures the numbers come from).

`proc/modules` is the one file here that is not a function of the model alone: the host's lines are
passed in, read at each open by the daemon (mokkafs/daemon/host_modules.py), validated here line by line.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from mokkafs.model.identity import NodeConfig
from mokkafs.render.vfs import Dir, Entry, File, Symlink, const, static_dir, text

# What a reader without CAP_SYSLOG sees (kptr_restrict), and what we show every reader: the
# daemon reads the host's list as root and must not hand kernel addresses to anyone.
ADDRESS = "0x0000000000000000"
# Out-of-tree (O) and unsigned (E): the open modules built by DKMS, as most fleets install them.
TAINT = "OE"

# Module sizes in bytes by driver branch (the first at or below the node's branch applies), from
# real /proc/modules and lsmod captures cited in docs/sysfs.md.
SIZES: dict[int, dict[str, int]] = {
    580: {"nvidia": 111489024, "nvidia_uvm": 2232320, "nvidia_modeset": 1908736, "nvidia_drm": 151552,
          "nvidia_peermem": 16384},
    0: {"nvidia": 56623104, "nvidia_uvm": 1605632, "nvidia_modeset": 1286144, "nvidia_drm": 69632,
        "nvidia_peermem": 16384},
}
# Open descriptors the driver's services hold on each GPU (persistence daemon, fabric manager,
# DCGM), counted in nvidia's use count as the kernel counts them: 8 GPUs give 96 + dependents,
# as on a captured 8-GPU node.
REFS_PER_GPU = 12

# Parameters readable in sysfs, with the driver's defaults. nvidia.ko declares its NVreg_
# options with permission 0, so sysfs shows none of them (they are in proc/driver/nvidia/params).
_UVM_PARAMS = {"uvm_ats_mode": "1", "uvm_global_oversubscription": "1"}  # 0444
_MODESET_PARAMS = {  # 0400
    "opportunistic_display_sync": "Y", "enable_overlay_layers": "Y", "fail_malloc": "-1",
    "malloc_verbose": "N", "conceal_vrr_caps": "N",
}
_DRM_PARAMS = {"modeset": "N", "fbdev": "N"}  # 0400; a headless node does not set modeset=1


@dataclass(frozen=True)
class KernelModule:
    name: str
    size: int
    refcnt: int
    holders: tuple[str, ...]  # the modules that use this one ("Used by"), most recently loaded first
    params: tuple[tuple[str, str, int], ...] = ()  # (name, value, mode) in sys/module/<name>/parameters


def _branch(config: NodeConfig) -> int:
    try:
        return int(config.driver_version.split(".", 1)[0])
    except ValueError:
        return 0


def nvidia_modules(config: NodeConfig) -> list[KernelModule]:
    """The driver's modules in /proc/modules order (most recently loaded first). nvidia_peermem
    is loaded on RDMA fabric nodes only (it needs the InfiniBand stack): where the node has HCAs."""
    branch = _branch(config)
    sizes = SIZES[max(b for b in SIZES if b <= branch)]
    peermem = config.hcas > 0
    # From 580 nvidia_drm uses nvidia directly, and nvidia_modeset carries one more reference.
    direct_drm = branch >= 580
    nvidia_holders = ("nvidia_uvm",) + (("nvidia_peermem",) if peermem else ()) \
        + (("nvidia_drm",) if direct_drm else ()) + ("nvidia_modeset",)
    hmm_off = "Y" if config.composition.grace else "N"  # HMM stays off by default on aarch64
    uvm_params = tuple((k, v, 0o444) for k, v in {**_UVM_PARAMS, "uvm_disable_hmm": hmm_off}.items())
    mods = [
        KernelModule("nvidia_uvm", sizes["nvidia_uvm"], 0, (), uvm_params),
        KernelModule("nvidia_drm", sizes["nvidia_drm"], 0, (), tuple((k, v, 0o400) for k, v in _DRM_PARAMS.items())),
        KernelModule("nvidia_modeset", sizes["nvidia_modeset"], 1 + (1 if direct_drm else 0), ("nvidia_drm",),
                     tuple((k, v, 0o400) for k, v in _MODESET_PARAMS.items())),
        KernelModule("nvidia", sizes["nvidia"], len(nvidia_holders) + REFS_PER_GPU * config.gpus, nvidia_holders),
    ]
    if peermem:
        mods.insert(0, KernelModule("nvidia_peermem", sizes["nvidia_peermem"], 0, ()))
    return mods


def module_line(m: KernelModule) -> str:
    used_by = "".join(f"{h}," for h in m.holders) or "-"
    return f"{m.name} {m.size} {m.refcnt} {used_by} Live {ADDRESS} ({TAINT})\n"


# One /proc/modules line as the kernel prints it (kernel/module/procfs.c): name, size, use count
# ("-" without unload support), users each followed by a comma (or "-"), state, address, taints.
_HOST_LINE = re.compile(
    r"(?P<name>[A-Za-z0-9_]{1,56}) (?P<size>[0-9]{1,12}) (?:-?[0-9]{1,10}|-) "
    r"(?:-|(?:(?:[A-Za-z0-9_]{1,56}|\[permanent\]|\[unsafe\]),)+) (?:Live|Loading|Unloading) "
    r"0x[0-9a-f]{1,16}(?: \([A-Z+]{1,26}\))?"
)
_ADDRESS_RE = re.compile(r" 0x[0-9a-f]{1,16}( |$)")
MAX_HOST_LINES = 8192


def host_lines(raw: str) -> list[str]:
    """The host's lines that are well-formed /proc/modules lines, addresses zeroed. The host's own
    nvidia* modules give way to the node's, as `mokka run` hides the host's /sys/module/nvidia*."""
    out: list[str] = []
    for line in raw.splitlines()[:MAX_HOST_LINES]:
        m = _HOST_LINE.fullmatch(line)
        if m is None or m["name"].startswith("nvidia"):
            continue
        out.append(_ADDRESS_RE.sub(lambda a: f" {ADDRESS}{a[1]}", line, count=1) + "\n")
    return out


def render_proc_modules(config: NodeConfig, host: str) -> str:
    """The driver's modules first (loaded last, as after boot), then the host's."""
    return "".join(module_line(m) for m in nvidia_modules(config)) + "".join(host_lines(host))


def proc_modules_file(config: NodeConfig, read_host: Callable[[], str]) -> File:
    return text(lambda ctx: render_proc_modules(config, read_host()), size=0)


def _module_dir(config: NodeConfig, m: KernelModule) -> Dir:
    children: dict[str, Entry] = {
        "version": const(f"{config.driver_version}\n"),
        "initstate": const("live\n"),
        "refcnt": const(f"{m.refcnt}\n"),
        "coresize": const(f"{m.size}\n"),
        "taint": const(f"{TAINT}\n"),
        "holders": static_dir({h: Symlink(f"../../{h}") for h in m.holders}, mode=0o755),
    }
    if m.params:
        children["parameters"] = static_dir({k: const(f"{v}\n", mode=mode) for k, v, mode in m.params}, mode=0o755)
    if m.name == "nvidia":
        children["drivers"] = static_dir({"pci:nvidia": Symlink("../../../bus/pci/drivers/nvidia")}, mode=0o755)
    return static_dir(children, mode=0o755)


def sys_module_children(config: NodeConfig) -> dict[str, Entry]:
    """sys/module/<name> for each of the driver's modules: what lsmod (coresize, refcnt,
    holders/), nvidia-container-toolkit and the GPU Operator's validators (version, initstate) read."""
    return {m.name: _module_dir(config, m) for m in nvidia_modules(config)}
