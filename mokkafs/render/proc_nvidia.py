"""`proc/driver/nvidia`, `proc/driver/nvidia-caps` and `proc/devices`, byte for byte in the
driver's formats (open-gpu-kernel-modules nv-procfs.c).

A lost GPU leaves `proc/driver/nvidia/gpus/`, as when the driver tears down a fallen-off device.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mokkafs.model import Node
from mokkafs.model.identity import NodeConfig
from mokkafs.model.mig import caps_minor
from mokkafs.model.topology import Layout
from mokkafs.render.vfs import Ctx, Dir, Entry, File, const, static_dir, text

# Character-device majors. 195 is fixed by the driver; the others are dynamic on a real host,
# and these are values seen on real nodes (contracts §5).
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
MODESET_MINOR = 254
UVM_MAJOR = 510
CAPS_MAJOR = 506
NVLINK_MAJOR = 507
NVSWITCH_MAJOR = 505
IMEX_CHANNELS_MAJOR = 504
IB_MAJOR = 231
MIG_CONFIG_MINOR = 1
MIG_MONITOR_MINOR = 2

# /proc/devices besides the NVIDIA and InfiniBand lines: a stock x86_64 kernel's.
_STOCK_CHAR = [
    (1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (4, "ttyS"), (5, "/dev/tty"), (5, "/dev/console"),
    (5, "/dev/ptmx"), (7, "vcs"), (10, "misc"), (13, "input"), (29, "fb"), (128, "ptm"), (136, "pts"),
    (180, "usb"), (189, "usb_device"), (226, "drm"), (240, "aux"), (241, "cec"), (242, "hidraw"),
    (243, "ttyDBC"), (244, "bsg"), (245, "watchdog"), (246, "ptp"), (247, "pps"), (248, "rtc"),
    (249, "dma_heap"), (250, "dax"), (251, "dimmctl"), (252, "ndctl"), (253, "tpm"), (254, "gpiochip"),
]
_STOCK_BLOCK = [
    (7, "loop"), (8, "sd"), (9, "md"), (11, "sr"), (65, "sd"), (66, "sd"), (67, "sd"), (68, "sd"),
    (69, "sd"), (70, "sd"), (71, "sd"), (128, "sd"), (129, "sd"), (130, "sd"), (131, "sd"), (132, "sd"),
    (133, "sd"), (134, "sd"), (135, "sd"), (253, "device-mapper"), (254, "mdp"), (259, "blkext"),
]

# Module parameters in the order nv-procfs prints them (driver 550-580 defaults, no NVreg_ prefix).
PARAMS = [
    ("ResmanDebugLevel", 4294967295), ("RmLogonRC", 1), ("ModifyDeviceFiles", 1), ("DeviceFileUID", 0),
    ("DeviceFileGID", 0), ("DeviceFileMode", 438), ("InitializeSystemMemoryAllocations", 1),
    ("UsePageAttributeTable", 4294967295), ("EnableMSI", 1), ("EnablePCIeGen3", 0), ("MemoryPoolSize", 0),
    ("KMallocHeapMaxSize", 0), ("VMallocHeapMaxSize", 0), ("IgnoreMMIOCheck", 0), ("TCEBypassMode", 0),
    ("EnableStreamMemOPs", 0), ("EnableUserNUMAManagement", 1), ("NvLinkDisable", 0),
    ("RmProfilingAdminOnly", 1), ("PreserveVideoMemoryAllocations", 0), ("EnableS0ixPowerManagement", 0),
    ("S0ixPowerManagementVideoMemoryThreshold", 256), ("DynamicPowerManagement", 3),
    ("DynamicPowerManagementVideoMemoryThreshold", 200), ("RegisterPCIDriver", 1),
    ("EnablePCIERelaxedOrderingMode", 0), ("EnableResizableBar", 0), ("EnableGpuFirmware", 18),
    ("EnableGpuFirmwareLogs", 2), ("RmNvlinkBandwidthLinkCount", 0), ("EnableDbgBreakpoint", 0),
    ("OpenRmEnableUnsupportedGpus", 1), ("DmaRemapPeerMmio", 1), ("ImexChannelCount", 2048),
    ("CreateImexChannel0", 0), ("GrdmaPciTopoCheckOverride", 0),
]
STRING_PARAMS = ["RegistryDwords", "RegistryDwordsPerDevice", "RmMsg", "GpuBlacklist", "TemporaryFilePath", "ExcludedGpus"]

BUILD = "Release Build  (dvs-builder@U16-A24-23-2)  Thu Oct 16 21:09:41 UTC 2025"
GCC = "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) "


def _arch(config: NodeConfig) -> str:
    return config.composition.cpu.arch


def render_version(config: NodeConfig) -> str:
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for {_arch(config)}  {config.driver_version}  {BUILD}\n"
        f"GCC version:  {GCC}\n"
    )


def render_params() -> str:
    lines = [f"{k}: {v}\n" for k, v in PARAMS]
    lines += [f'{k}: ""\n' for k in STRING_PARAMS]
    return "".join(lines)


def _dma(config: NodeConfig) -> tuple[int, int]:
    bits = 52 if config.profile.architecture in ("Hopper", "Blackwell") else 47
    return bits, (1 << bits) - 1


def render_information(ctx: Ctx, i: int, irq: int) -> str:
    node, ident = ctx.node, ctx.node.identities[i]
    bits, mask = _dma(node.config)
    return (
        f"Model: \t\t {node.profile.product_name}\n"
        f"IRQ:   \t\t {irq}\n"
        f"GPU UUID: \t {ident.uuid}\n"
        f"Video BIOS: \t {node.profile.vbios_version.lower()}\n"
        "Bus Type: \t PCIe\n"
        f"DMA Size: \t {bits} bits\n"
        f"DMA Mask: \t 0x{mask:x}\n"
        f"Bus Location: \t {ident.bdf.sysfs}\n"
        f"Device Minor: \t {ident.minor}\n"
        f"GPU Firmware: \t {node.config.driver_version}\n"
        "GPU Excluded:\t No\n"
    )


POWER = (
    "Runtime D3 status:          Disabled by default\n"
    "Video Memory:               Active\n"
    "\n"
    "GPU Hardware Support:\n"
    " Video Memory Self Refresh: Not Supported\n"
    " Video Memory Off:          Supported\n"
)


def capability(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


# The driver numbers every MIG capability in advance: 32 GPU minors x 15 GPU instances x 8
# compute instances, after config (1) and monitor (2); gpu31/gi14/ci7/access is 4322.
MIG_MAX_GPUS = 32
MIG_MAX_GIS = 15
MIG_MAX_CIS = 8


def mig_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor of `gpu<gpu>/gi<gi>/access` (ci None) or `.../ci<ci>/access`;
    `gpu` is the GPU's device minor, as in the driver's paths."""
    if not (0 <= gpu < MIG_MAX_GPUS and 0 <= gi < MIG_MAX_GIS and (ci is None or 0 <= ci < MIG_MAX_CIS)):
        raise ValueError(f"no MIG capability for gpu{gpu}/gi{gi}" + ("" if ci is None else f"/ci{ci}"))
    return caps_minor(gpu, gi, ci)


# After the MIG range: the system capabilities (nvidia-caps/sys-minors). The NVLink table comes
# first of all (nvlink-minors: fabric-mgmt 0), which is why MIG's config is 1.
FABRIC_MGMT_MINOR = 0
FABRIC_IMEX_MGMT_MINOR = 4323
FABRIC_IMEX_MGMT_MODE = 256  # 0400: root's, as the driver makes it


def nvlink_fabric(config: NodeConfig) -> bool:
    """A board in a multi-node NVLink domain (GB200/GB300 NVL): the driver has the IMEX and
    NVLink fabric-management capabilities there (the compute-domain plugin opens
    fabric-imex-mgmt to prepare its daemon's claim)."""
    fabric = config.profile.fabric
    return fabric is not None and fabric.multi_node


def render_mig_minors() -> str:
    """Every capability the driver pre-enumerates, in its order."""
    lines = [f"config {MIG_CONFIG_MINOR}\n", f"monitor {MIG_MONITOR_MINOR}\n"]
    for gpu in range(MIG_MAX_GPUS):
        for gi in range(MIG_MAX_GIS):
            lines.append(f"gpu{gpu}/gi{gi}/access {mig_minor(gpu, gi)}\n")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_minor(gpu, gi, ci)}\n" for ci in range(MIG_MAX_CIS)]
    return "".join(lines)


@functools.cache
def _mig_minors_file() -> bytes:
    """mig-minors as served: the same 4,322 lines on every node, made at the first read (about
    15 ms at 2 cores, which every mount -> ready paid before), then kept for the process."""
    return render_mig_minors().encode()


@dataclass(frozen=True)
class MigCapability:
    path: str  # under proc/driver/nvidia/capabilities/
    minor: int  # dev/nvidia-caps/nvidia-cap<minor>, major CAPS_MAJOR
    mode: int  # DeviceFileMode, as in the file and on the node


# Instance capabilities are world-readable (0444), as config and monitor's siblings on real nodes.
MIG_ACCESS_MODE = 0o444


def mig_capabilities(instances: Iterable[tuple[int, int, int | None]]) -> list[MigCapability]:
    """The capability files and device nodes the driver creates for live MIG instances, given as
    (GPU device minor, GPU instance id, compute instance id; None for a GPU instance without
    compute instances): one `gpuN/mig/giX/access` per GPU instance and one
    `gpuN/mig/giX/ciY/access` per compute instance, sorted by minor. What
    `proc/driver/nvidia/capabilities/` and `dev/nvidia-caps/` are rendered from."""
    caps: dict[int, MigCapability] = {}
    for gpu, gi, ci in instances:
        gi_minor = mig_minor(gpu, gi)
        caps[gi_minor] = MigCapability(f"gpu{gpu}/mig/gi{gi}/access", gi_minor, MIG_ACCESS_MODE)
        if ci is None:
            continue
        ci_minor = mig_minor(gpu, gi, ci)
        caps[ci_minor] = MigCapability(f"gpu{gpu}/mig/gi{gi}/ci{ci}/access", ci_minor, MIG_ACCESS_MODE)
    return [caps[m] for m in sorted(caps)]


def live_mig_capabilities(node: Node) -> tuple[list[int], list[MigCapability]]:
    """The GPU minors in MIG mode (each has `capabilities/gpuN/mig/`, its instances' files in
    it), and the capabilities of the live instances. A GPU off the bus has neither."""
    on, triples = [], []
    for i, ident in enumerate(node.identities):
        if node.gpus[i].lost or not node.gpus[i].mig.enabled:
            continue
        on.append(ident.minor)
        for g in node.mig_instances(i):
            triples += [(ident.minor, g.id, c.id) for c in g.compute] or [(ident.minor, g.id, None)]
    return on, mig_capabilities(triples)


def _capabilities(ctx: Ctx) -> Mapping[str, Entry]:
    """`proc/driver/nvidia/capabilities`: mig/config and mig/monitor, and per GPU in MIG mode
    `gpuN/mig/giX/access` and `giX/ciY/access` for its instances (NVIDIA's device plugin and
    nvidia-container-toolkit read DeviceFileMinor there to find `dev/nvidia-caps/nvidia-capN`)."""
    on, caps = live_mig_capabilities(ctx.node)
    tree: dict = {f"gpu{m}": {"mig": {}} for m in on}
    for cap in caps:
        *dirs, name = cap.path.split("/")
        here = tree
        for d in dirs:
            here = here.setdefault(d, {})
        here[name] = const(capability(cap.minor, cap.mode), size=0, mode=cap.mode)

    def build(d: dict) -> Dir:
        # Not stable: `gpuN/mig/` and `giX/` are the same paths, with other children, after the
        # next MIG change; a name the kernel kept there would outlive a destroyed instance.
        kids = {k: build(v) if isinstance(v, dict) else v for k, v in d.items()}
        return Dir(lambda ctx: kids)

    return {"mig": _MIG_STATIC, **{k: build(v) for k, v in tree.items()}}


_FABRIC_IMEX_MGMT = const(capability(FABRIC_IMEX_MGMT_MINOR, FABRIC_IMEX_MGMT_MODE), size=0, mode=0o400)


def _fabric_capabilities(ctx: Ctx) -> Mapping[str, Entry]:
    return {**_capabilities(ctx), "fabric-imex-mgmt": _FABRIC_IMEX_MGMT}


_MIG_STATIC = static_dir(
    {
        "config": const(capability(MIG_CONFIG_MINOR, 256), size=0, mode=0o400),
        "monitor": const(capability(MIG_MONITOR_MINOR, 292), size=0),
    }
)


def render_devices(config: NodeConfig, nvswitches: bool) -> str:
    char = list(_STOCK_CHAR)
    char += [(NVIDIA_MAJOR, "nvidia-frontend"), (NVIDIA_MAJOR, "nvidia-modeset")]
    char += [(UVM_MAJOR, "nvidia-uvm"), (CAPS_MAJOR, "nvidia-caps"), (NVLINK_MAJOR, "nvidia-nvlink")]
    char += [(IMEX_CHANNELS_MAJOR, "nvidia-caps-imex-channels")]
    if nvswitches:
        char.append((NVSWITCH_MAJOR, "nvidia-nvswitch"))
    if config.hcas:
        char += [(IB_MAJOR, "infiniband_mad"), (IB_MAJOR, "infiniband_verbs")]
    char.sort(key=lambda row: row[0])  # stable: same-major lines keep registration order
    body = "".join(f"{major:3d} {name}\n" for major, name in char)
    block = "".join(f"{major:3d} {name}\n" for major, name in _STOCK_BLOCK)
    return f"Character devices:\n{body}\nBlock devices:\n{block}"


def proc_tree(config: NodeConfig, layout: Layout, extra: Mapping[str, Entry] | None = None) -> Dir:
    """`extra`: entries of proc/ other renderers own (proc/modules)."""
    irqs = {fn.index: fn.irq for fn in layout.functions if fn.kind == "gpu"}
    nvswitches = any(fn.kind == "nvswitch" for fn in layout.functions)

    def gpu_dir(i: int) -> Dir:
        return static_dir(
            {
                "information": text(lambda ctx: render_information(ctx, i, irqs[i]), size=0),
                "power": const(POWER, size=0),
                "registry": const('Binary: ""\n', size=0),
            }
        )

    gpu_dirs = {i: gpu_dir(i) for i in range(config.gpus)}

    def gpus(ctx: Ctx) -> Mapping[str, Entry]:
        return {
            ctx.node.identities[i].bdf.sysfs: d for i, d in gpu_dirs.items() if not ctx.node.gpus[i].lost
        }

    nvidia = static_dir(
        {
            "version": const(render_version(config), size=0),
            "params": const(render_params(), size=0),
            "registry": const('Binary: ""\n', size=0),
            "gpus": Dir(gpus),
            "capabilities": Dir(_capabilities if not nvlink_fabric(config) else _fabric_capabilities),
            "warnings": static_dir({}),
            "patches": static_dir({"README": const("", size=0)}),
            "suspend_depth": const("default\n", size=0),
        }
    )
    caps_files = {"mig-minors": File(lambda ctx: _mig_minors_file(), size=0)}
    if nvlink_fabric(config):
        caps_files["nvlink-minors"] = const(f"fabric-mgmt {FABRIC_MGMT_MINOR}\n", size=0)
        caps_files["sys-minors"] = const(f"fabric-imex-mgmt {FABRIC_IMEX_MGMT_MINOR}\n", size=0)
    caps = static_dir(caps_files)
    return static_dir(
        {
            "driver": static_dir({"nvidia": nvidia, "nvidia-caps": caps}),
            "devices": const(render_devices(config, nvswitches), size=0),
            **(extra or {}),
        }
    )
