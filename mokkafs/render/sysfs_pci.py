"""`sys/bus/pci`, `sys/devices/pciDDDD:BB/...` and `sys/module/nvidia`: the node's PCI functions as
the kernel's sysfs shows them (formats: pciutils' lib/sysfs.c and the kernel's
pci-sysfs.c; layout: model/topology.py).

A lost GPU (Xid 79, `lost`) leaves its device directory, its bus link and its driver link, and the
switch port above it reports the link down, as after a real fall off the bus.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping

from mokkafs.model.topology import (
    DOWNSTREAM,
    ENDPOINT,
    ROOT_PORT,
    Layout,
    PciFunction,
)
from mokkafs.render.vfs import Ctx, Dir, Entry, File, Symlink, const, lazy_static_dir, static_dir, text

CONFIG_SIZE = 4096  # PCIe: the extended space is there, lspci -vvv reads past 0x100
PM_CAP, MSI_CAP, PCIE_CAP = 0x40, 0x48, 0x60

# Kernel `struct resource` flags, as real `resource` files show them.
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000
IORESOURCE_SIZEALIGN = 0x40000
_BAR_FLAGS_32 = IORESOURCE_SIZEALIGN | IORESOURCE_MEM
_BAR_FLAGS_64P = IORESOURCE_MEM_64 | IORESOURCE_SIZEALIGN | IORESOURCE_PREFETCH | IORESOURCE_MEM | 0xC
_WINDOW_MEM = IORESOURCE_MEM
_WINDOW_PREF = IORESOURCE_MEM_64 | IORESOURCE_PREFETCH | IORESOURCE_MEM | 0x1

_SPEEDS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0", 6: "64.0"}


def link_speed(gen: int) -> str:
    """`current_link_speed` / `max_link_speed` (kernel pci_speed_string)."""
    return f"{_SPEEDS[gen]} GT/s PCIe"


def cpulist(cpus: list[int]) -> str:
    """`0-55,112-167`: ranges of consecutive CPUs, the kernel's `%*pbl`."""
    out, start = [], None
    for n, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if n + 1 == len(cpus) or cpus[n + 1] != cpu + 1:
            out.append(f"{start}" if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(out)


def cpumask(cpus: list[int], total: int) -> str:
    """`local_cpus`: the kernel's `%*pb`, 32-bit hex groups, most significant first."""
    mask = sum(1 << c for c in cpus)
    groups = max(1, (total + 31) // 32)
    return ",".join(f"{(mask >> (32 * g)) & 0xFFFFFFFF:08x}" for g in reversed(range(groups)))


# --- config space ----------------------------------------------------------------------------


def _link_state(fn: PciFunction, present: bool) -> tuple[int, int]:
    """(current gen, current width); a downstream port whose device fell off trains to nothing."""
    if fn.port_type == DOWNSTREAM and not present:
        return 1, 0
    return fn.link_gen, fn.link_width


def config_space(fn: PciFunction, present: bool = True) -> bytes:
    """The 4096-byte config space: header, BARs matching `resource`, PM, MSI and PCIe capabilities.

    `present` is False for a downstream port whose endpoint fell off the bus."""
    c = bytearray(CONFIG_SIZE)

    def w8(off, v):
        c[off] = v & 0xFF

    def w16(off, v):
        struct.pack_into("<H", c, off, v & 0xFFFF)

    def w32(off, v):
        struct.pack_into("<I", c, off, v & 0xFFFFFFFF)

    w16(0x00, fn.vendor)
    w16(0x02, fn.device)
    w16(0x04, 0x0406 if not fn.is_bridge else 0x0406 | 0x0100)  # mem, bus master, INTx off (+SERR)
    w16(0x06, 0x0010)  # capability list
    w32(0x08, (fn.class_code << 8) | fn.revision)
    w8(0x0C, 0x10 if fn.is_bridge else 0)  # cache line 64 bytes
    w8(0x0E, 0x01 if fn.is_bridge else 0x00)
    if fn.is_bridge:
        w8(0x18, fn.bdf.bus)
        w8(0x19, fn.secondary)
        w8(0x1A, fn.subordinate)
        w8(0x1C, 0xF0)  # I/O window disabled (base > limit)
        w8(0x1D, 0x00)
        mem, pref = fn.mem_window, fn.pref_window
        if mem.enabled:
            w16(0x20, (mem.start >> 16) & 0xFFF0)
            w16(0x22, (mem.end >> 16) & 0xFFF0)
        else:
            w16(0x20, 0xFFF0)
            w16(0x22, 0x0000)
        if pref.enabled:
            w16(0x24, ((pref.start >> 16) & 0xFFF0) | 0x1)
            w16(0x26, ((pref.end >> 16) & 0xFFF0) | 0x1)
            w32(0x28, pref.start >> 32)
            w32(0x2C, pref.end >> 32)
        else:
            w16(0x24, 0xFFF1)
            w16(0x26, 0x0001)
        w16(0x3E, 0x0012)  # bridge control: SERR# forwarding, ISA off
    else:
        for bar in fn.bars:
            low = (bar.start & 0xFFFFFFF0) | (0x4 if bar.is64 else 0) | (0x8 if bar.prefetch else 0)
            w32(0x10 + 4 * bar.index, low)
            if bar.is64:
                w32(0x14 + 4 * bar.index, bar.start >> 32)
        w16(0x2C, fn.subsystem_vendor)
        w16(0x2E, fn.subsystem_device)
    w8(0x34, PM_CAP)
    w8(0x3C, fn.irq if fn.irq < 0xFF else 0xFF)
    w8(0x3D, 0x01)  # INTA#

    # Power Management, version 3, D0.
    w8(PM_CAP, 0x01)
    w8(PM_CAP + 1, MSI_CAP)
    w16(PM_CAP + 2, 0x0003)
    w16(PM_CAP + 4, 0x0008)  # NoSoftRst+
    # MSI: 64-bit, maskable, 16 vectors capable, enabled (the driver uses MSI).
    w8(MSI_CAP, 0x05)
    w8(MSI_CAP + 1, PCIE_CAP)
    w16(MSI_CAP + 2, 0x0188 | 0x1)  # per-vector masking, 64-bit, 16 vectors, enabled
    w32(MSI_CAP + 4, 0xFEE00000)
    w16(MSI_CAP + 12, 0x4020 + fn.irq)

    # PCI Express capability, version 2.
    cur_gen, cur_width = _link_state(fn, present)
    has_slot = fn.port_type in (ROOT_PORT, DOWNSTREAM)
    p = PCIE_CAP
    w8(p, 0x10)
    w8(p + 1, 0x00)
    w16(p + 0x02, 0x2 | (fn.port_type << 4) | (0x100 if has_slot else 0))
    devcap = 0x1 | 0x20 | 0x8000  # MaxPayload 256, ExtTag, role-based error reporting
    if fn.port_type == ENDPOINT:
        devcap |= 0x10000000 | (0x7 << 6) | (0x7 << 9)  # FLReset, unlimited L0s/L1 latency
    w32(p + 0x04, devcap)
    w16(p + 0x08, 0x2930 if fn.port_type == ENDPOINT else 0x0030)  # RlxdOrd, MPS 256, ExtTag, NoSnoop, MRRS 512
    lnkcap = fn.link_gen | (fn.link_width << 4) | (0x2 << 10) | (0x4 << 15) | (fn.port_number << 24)
    if has_slot:
        lnkcap |= (1 << 19) | (1 << 20)  # surprise-down and data-link-active reporting
    w32(p + 0x0C, lnkcap)
    w16(p + 0x10, 0x0040)  # common clock
    lnksta = cur_gen | (cur_width << 4) | (1 << 12)  # slot clock
    if has_slot and present:
        lnksta |= 1 << 13  # DLActive
    w16(p + 0x12, lnksta)
    if has_slot:
        w32(p + 0x14, ((fn.port_number + 1) << 19) | (0x19 << 7) | 0x60)  # slot #, 25 W, hot-plug surprise
        w16(p + 0x1A, 0x0040 if present else 0x0000)  # presence detect
    w32(p + 0x24, 0x0070001F)  # completion timeout ranges A-D, 10-bit tags
    speeds = ((1 << fn.link_gen) - 1) << 1
    w32(p + 0x2C, speeds)
    w16(p + 0x30, fn.link_gen)  # target link speed
    w16(p + 0x32, 0x001E if fn.link_gen >= 3 else 0)  # equalization complete, phases 1-3
    return bytes(c)


def resource_file(fn: PciFunction) -> str:
    """13 lines for an endpoint (6 BARs, ROM, 6 IOV), 17 for a bridge (plus 4 windows)."""
    rows = [(0, 0, 0)] * (17 if fn.is_bridge else 13)
    for bar in fn.bars:
        rows[bar.index] = (bar.start, bar.end, _BAR_FLAGS_64P if bar.is64 else _BAR_FLAGS_32)
    if fn.is_bridge:
        if fn.mem_window.enabled:
            rows[14] = (fn.mem_window.start, fn.mem_window.end, _WINDOW_MEM)
        if fn.pref_window.enabled:
            rows[15] = (fn.pref_window.start, fn.pref_window.end, _WINDOW_PREF)
    return "".join(f"0x{a:016x} 0x{b:016x} 0x{f:016x}\n" for a, b, f in rows)


def modalias(fn: PciFunction) -> str:
    cls = fn.class_code
    return (
        f"pci:v{fn.vendor:08X}d{fn.device:08X}sv{fn.subsystem_vendor:08X}sd{fn.subsystem_device:08X}"
        f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
    )


def uevent(fn: PciFunction) -> str:
    return (
        f"DRIVER={fn.driver}\nPCI_CLASS={fn.class_code:X}\nPCI_ID={fn.vendor:04X}:{fn.device:04X}\n"
        f"PCI_SUBSYS_ID={fn.subsystem_vendor:04X}:{fn.subsystem_device:04X}\n"
        f"PCI_SLOT_NAME={fn.bdf.sysfs}\nMODALIAS={modalias(fn)}\n"
    )


# --- the tree ----------------------------------------------------------------------------------


def gpu_present(ctx: Ctx, kind: str, index: int) -> bool:
    return not (kind == "gpu" and ctx.node.gpus[index].lost)


class PciTree:
    """Builds the PCI part of `sys/` from a layout. `extra_children(fn)` lets the InfiniBand
    renderer hang `infiniband/mlx5_N` (and friends) under an HCA's device directory."""

    def __init__(self, layout: Layout, extra_children: Callable[[PciFunction], Mapping[str, Entry]] | None = None):
        self.layout = layout
        self.extra = extra_children or (lambda fn: {})
        self._children: dict = {}
        for fn in layout.functions:
            self._children.setdefault(fn.parent, []).append(fn)
        self._dirs: dict = {}
        # Deepest first: a bridge's directory refers to its children's.
        for fn in sorted(layout.functions, key=lambda f: -len(layout.chain(f))):
            self._dirs[fn.bdf] = self._device_dir(fn)

    def rel_path(self, fn: PciFunction) -> str:
        """`devices/pci0000:15/0000:15:01.0/.../0000:18:00.0`, relative to sys/."""
        return "/".join(["devices", fn.host_bridge] + [f.bdf.sysfs for f in self.layout.chain(fn)])

    def depth(self, fn: PciFunction) -> int:
        """How many `..` lead from the device directory back to sys/."""
        return 2 + len(self.layout.chain(fn))

    def present(self, ctx: Ctx, fn: PciFunction) -> bool:
        return fn.kind != "gpu" or not ctx.node.gpus[fn.index].lost

    def _device_dir(self, fn: PciFunction) -> Dir:
        """The device's directory; its files are made at its first lookup."""
        kids = self._children.get(fn.bdf, [])
        if not any(kid.kind == "gpu" for kid in kids):
            # Children that never leave the bus: a stable directory the kernel may cache.
            return lazy_static_dir(
                lambda: {**self._device_files(fn), **{kid.bdf.sysfs: self._dirs[kid.bdf] for kid in kids}},
                mode=0o755)
        files = functools.cache(lambda: self._device_files(fn))  # made once, listed with the GPUs present

        def children(ctx: Ctx) -> Mapping[str, Entry]:
            out = dict(files())
            for kid in kids:
                if self.present(ctx, kid):
                    out[kid.bdf.sysfs] = self._dirs[kid.bdf]
            return out

        return Dir(children, mode=0o755)

    def _device_files(self, fn: PciFunction) -> dict[str, Entry]:
        layout = self.layout
        cpus = layout.cpus.cpus(fn.numa_node)
        up = "../" * self.depth(fn)
        files: dict[str, Entry] = {
            "vendor": const(f"0x{fn.vendor:04x}\n"),
            "device": const(f"0x{fn.device:04x}\n"),
            "subsystem_vendor": const(f"0x{fn.subsystem_vendor:04x}\n"),
            "subsystem_device": const(f"0x{fn.subsystem_device:04x}\n"),
            "class": const(f"0x{fn.class_code:06x}\n"),
            "revision": const(f"0x{fn.revision:02x}\n"),
            "irq": const(f"{fn.irq}\n"),
            "numa_node": const(f"{fn.numa_node}\n"),
            "local_cpulist": const(cpulist(cpus) + "\n"),
            "local_cpus": const(cpumask(cpus, layout.cpus.total) + "\n"),
            "enable": const("1\n"),
            "max_link_speed": const(link_speed(fn.link_gen) + "\n"),
            "max_link_width": const(f"{fn.link_width}\n"),
            "resource": const(resource_file(fn)),
            "modalias": const(modalias(fn) + "\n"),
            "uevent": const(uevent(fn)),
            "driver": Symlink(f"{up}bus/pci/drivers/{fn.driver}"),
            "subsystem": Symlink(f"{up}bus/pci"),
        }
        if fn.serves is not None:
            kind, index = fn.serves
            files["config"] = File(
                lambda ctx: config_space(fn, gpu_present(ctx, kind, index)), size=CONFIG_SIZE, exact_size=True
            )
            files["current_link_speed"] = text(
                lambda ctx: link_speed(_link_state(fn, gpu_present(ctx, kind, index))[0]) + "\n"
            )
            files["current_link_width"] = text(lambda ctx: f"{_link_state(fn, gpu_present(ctx, kind, index))[1]}\n")
        else:
            raw = config_space(fn)
            files["config"] = File(lambda ctx: raw, size=CONFIG_SIZE, exact_size=True)
            files["current_link_speed"] = const(link_speed(fn.link_gen) + "\n")
            files["current_link_width"] = const(f"{fn.link_width}\n")
        files.update(self.extra(fn))
        return files

    def devices_children(self) -> dict[str, Dir]:
        """The host bridges `pciDDDD:BB` for sys/devices."""
        bridges: dict[str, list[PciFunction]] = {}
        for fn in self._children.get(None, []):
            bridges.setdefault(fn.host_bridge, []).append(fn)
        out = {}
        for name, roots in bridges.items():
            kids: dict[str, Entry] = {fn.bdf.sysfs: self._dirs[fn.bdf] for fn in roots}
            kids["uevent"] = const("")
            out[name] = static_dir(kids, mode=0o755)
        return out

    def bus_pci(self) -> Dir:
        """sys/bus/pci: devices/ and drivers/."""
        fns = self.layout.functions

        def devices(ctx: Ctx) -> Mapping[str, Entry]:
            return {fn.bdf.sysfs: Symlink(f"../../../{self.rel_path(fn)}") for fn in fns if self.present(ctx, fn)}

        def driver_dir(name: str) -> Dir:
            bound = [fn for fn in fns if fn.driver == name]
            fixed: dict[str, Entry] = {"uevent": const("", mode=0o200)}
            if name == "nvidia":
                fixed["module"] = Symlink("../../../../module/nvidia")

            def children(ctx: Ctx) -> Mapping[str, Entry]:
                out = dict(fixed)
                for fn in bound:
                    if self.present(ctx, fn):
                        out[fn.bdf.sysfs] = Symlink(f"../../../../{self.rel_path(fn)}")
                return out

            return Dir(children, mode=0o755)

        drivers = sorted({fn.driver for fn in fns})
        return static_dir(
            {
                "devices": Dir(devices, mode=0o755),
                "drivers": static_dir({d: driver_dir(d) for d in drivers}, mode=0o755),
            },
            mode=0o755,
        )
