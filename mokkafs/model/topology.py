"""Where every PCI function of the node sits: the GPUs, the switch and root ports above them, the
InfiniBand HCAs and NVSwitches, with their ids, BARs, links, NUMA nodes and IRQs.

A pure, deterministic function of the node's composition (its slots say where each GPU and the
HCA beside it sit), shared by the sysfs, InfiniBand and
/proc renderers so that they agree on every address. See docs/sysfs.md for the layout.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from mokkafs.model.identity import Bdf, NodeConfig, gpu_identities
from mokkafs.model.nvml_consts import TOPOLOGY_LEVELS
from mokkafs.model.schema import MAX_CPUS, PLATFORM_ROOT_BUS

MIB = 1 << 20

# Ids of the parts a real HGX-style node has around its GPUs (pci.ids names in docs/sysfs.md).
ROOT_PORT_IDS = (0x8086, 0x352A, 0x8086, 0x0000, 0x04)  # Intel Sapphire Rapids PCIe root port
SWITCH_GEN5_IDS = (0x1000, 0xC030, 0x1000, 0x0144, 0xB0)  # Broadcom PEX890xx Gen 5 switch
SWITCH_GEN4_IDS = (0x1000, 0xC010, 0x1000, 0xA064, 0xB0)  # Broadcom PEX880xx Gen 4 switch
HCA_SUBSYSTEM = (0x15B3, 0x0026)
HCA_CLASS = 0x020700  # InfiniBand controller
NVSWITCH_CLASS = 0x068000  # Bridge: "other"
BRIDGE_CLASS = 0x060400  # PCI bridge, normal decode

# PCIe device/port types (PCIe capability register bits 7:4).
ENDPOINT, ROOT_PORT, UPSTREAM, DOWNSTREAM = 0x0, 0x4, 0x5, 0x6

# Each GPU has its own root complex: root bus B-3, root port (B-3):01.0, switch upstream port
# (B-2):00.0, downstream ports (B-1):00.0 (to the GPU, bus B) and (B-1):01.0 (to its HCA, bus
# B+1); a composition's slots say where B is and which HCA sits beside the GPU. Bus numbers from
# 0xd8 (PLATFORM_ROOT_BUS) in every domain are free for the "platform" complex that holds the
# NVSwitches and the HCAs that have no GPU beside them.
_PLATFORM_SLOTS = 32  # downstream ports (device numbers 0..31) per platform complex
_GPU_MMIO32 = 0x8000_0000
_PLATFORM_MMIO32 = 0xC000_0000
_MMIO64 = 0x2000_0000_0000
_PLATFORM_MMIO64 = 0x6000_0000_0000
_TIB = 1 << 40


@dataclass(frozen=True)
class Bar:
    index: int
    start: int
    size: int
    is64: bool
    prefetch: bool

    @property
    def end(self) -> int:
        return self.start + self.size - 1


@dataclass(frozen=True)
class Window:
    """A bridge's forwarding window; start > end means disabled."""

    start: int
    end: int

    @property
    def enabled(self) -> bool:
        return self.start <= self.end


NO_WINDOW = Window(1, 0)


@dataclass(frozen=True)
class PciFunction:
    bdf: Bdf
    kind: str  # root_port | switch_up | switch_down | gpu | hca | nvswitch
    index: int  # which GPU / HCA / NVSwitch (or the GPU a bridge serves); -1 for none
    parent: Bdf | None  # None: sits on the host bridge's root bus
    vendor: int
    device: int
    subsystem_vendor: int
    subsystem_device: int
    class_code: int
    revision: int
    port_type: int
    link_gen: int
    link_width: int
    port_number: int
    numa_node: int
    irq: int
    driver: str
    bars: tuple[Bar, ...] = ()
    secondary: int = 0
    subordinate: int = 0
    mem_window: Window = NO_WINDOW
    pref_window: Window = NO_WINDOW
    serves: tuple[str, int] | None = None  # (kind, index) of the endpoint below a downstream port

    @property
    def is_bridge(self) -> bool:
        return self.kind in ("root_port", "switch_up", "switch_down")

    root_bus: int = 0  # the host bridge's bus: the device lives under sys/devices/pciDDDD:BB

    @property
    def host_bridge(self) -> str:
        return f"pci{self.bdf.domain:04x}:{self.root_bus:02x}"


# nvmlGpuTopologyLevel_t: how far apart two GPUs are on the PCI tree (nvidia-smi topo -m).
TOPOLOGY_INTERNAL, TOPOLOGY_SINGLE, TOPOLOGY_MULTIPLE, TOPOLOGY_HOSTBRIDGE, TOPOLOGY_NODE, TOPOLOGY_SYSTEM = (
    TOPOLOGY_LEVELS[k] for k in ("INTERNAL", "SINGLE", "MULTIPLE", "HOSTBRIDGE", "NODE", "SYSTEM"))


@dataclass(frozen=True)
class CpuLayout:
    numa_nodes: int
    cores_per_node: int
    threads: int  # hardware threads per core

    def __post_init__(self) -> None:
        if self.total > MAX_CPUS:
            raise ValueError(f"{self.total} CPUs: NVML's CPU masks carry at most {MAX_CPUS}")

    @property
    def total(self) -> int:
        return self.numa_nodes * self.cores_per_node * self.threads

    def cpus(self, numa: int) -> list[int]:
        """Linux numbers the first thread of every core first, then the siblings."""
        if numa < 0:
            return list(range(self.total))
        per_thread = self.numa_nodes * self.cores_per_node
        base = numa * self.cores_per_node
        return [t * per_thread + base + c for t in range(self.threads) for c in range(self.cores_per_node)]


def cpu_layout(config: NodeConfig) -> CpuLayout:
    cpu = config.composition.cpu
    return CpuLayout(cpu.numa_nodes, cpu.cores_per_numa_node, cpu.threads_per_core)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def hca_link(rate_gbps: int) -> int:
    """PCIe generation of the HCA: HDR cards are Gen4, NDR Gen5, XDR (ConnectX-8) Gen6."""
    return {100: 3, 200: 4, 400: 5, 800: 6}[rate_gbps]


@dataclass(frozen=True)
class NvLinkRemote:
    """What is at the far end of one NVLink: a GPU or an NVSwitch, and the PCI function that
    sysfs shows for it; `bdf` is None where the host enumerates none (the switches of HGX B200
    have no PCI id, those of a GB200/GB300 NVL72 sit in other trays)."""

    kind: str  # gpu | switch
    bdf: Bdf | None
    vendor: int = 0
    device: int = 0


@dataclass(frozen=True)
class Layout:
    functions: tuple[PciFunction, ...]
    cpus: CpuLayout
    # Per GPU index: the far end of each NVLink, and the nvmlGpuTopologyLevel_t to every GPU.
    nvlinks: tuple[tuple[NvLinkRemote, ...], ...] = ()
    levels: tuple[tuple[int, ...], ...] = ()

    def by_bdf(self) -> dict[Bdf, PciFunction]:
        return dict(self._by_bdf)

    @cached_property
    def _by_bdf(self) -> dict[Bdf, PciFunction]:
        # Made once: `chain` looks bridges up in it for every PCI entry a render resolves
        # (thousands per render of sys/), and every Bdf key hashes through its dataclass.
        return {f.bdf: f for f in self.functions}

    def of(self, kind: str, index: int) -> PciFunction:
        for f in self.functions:
            if f.kind == kind and f.index == index:
                return f
        raise KeyError((kind, index))

    def chain(self, fn: PciFunction) -> list[PciFunction]:
        """`fn` and its bridges, root port first."""
        table = self._by_bdf
        out = [fn]
        while out[0].parent is not None:
            out.insert(0, table[out[0].parent])
        return out

    def gpu_cpus(self, gpu: int) -> list[int]:
        """The CPUs local to GPU `gpu`: sysfs local_cpulist, NVML's CPU affinity, topo -m."""
        return self.cpus.cpus(self.of("gpu", gpu).numa_node)


def topology_level(a: list[PciFunction], b: list[PciFunction]) -> int:
    """nvmlGpuTopologyLevel_t of two endpoints given as their `Layout.chain`s: below one
    switch's upstream port the path crosses that switch only (SINGLE), below a common bridge
    higher up it crosses several (MULTIPLE); without one, the host bridge (HOSTBRIDGE), the
    host bridges of one NUMA node (NODE) or the CPUs' interconnect (SYSTEM)."""
    if a[-1].bdf == b[-1].bdf:
        return TOPOLOGY_INTERNAL
    # Two chains share bridges only below a common root port: most pairs of a node do not
    # (a GPU per root port), and need no walk.
    if a[0].bdf == b[0].bdf:
        common = [x for x, y in zip(a[:-1], b[:-1]) if x.bdf == y.bdf]
        if common:
            return TOPOLOGY_SINGLE if common[-1].kind == "switch_up" else TOPOLOGY_MULTIPLE
    if a[-1].host_bridge == b[-1].host_bridge:
        return TOPOLOGY_HOSTBRIDGE
    return TOPOLOGY_NODE if a[-1].numa_node == b[-1].numa_node else TOPOLOGY_SYSTEM


def _nvlink_remotes(config: NodeConfig, fns: list[PciFunction]) -> tuple[tuple[NvLinkRemote, ...], ...]:
    """Where each GPU's NVLinks go: round robin over the node's NVSwitches; to switches outside
    the host where the node has none but sits in a multi-node NVLink domain; else to the GPU of
    its bridged pair (0-1, 2-3, ...), where there is one."""
    p = config.profile
    switches = sorted((f for f in fns if f.kind == "nvswitch"), key=lambda f: f.index)
    gpus = {f.index: f for f in fns if f.kind == "gpu"}
    out = []
    for i in range(config.gpus):
        links = []
        for link in range(p.nvlink.links):
            if switches:
                sw = switches[link % len(switches)]
                links.append(NvLinkRemote("switch", sw.bdf, sw.vendor, sw.device))
            elif config.nvswitches or (p.fabric is not None and p.fabric.multi_node):
                links.append(NvLinkRemote("switch", None))
            elif (i ^ 1) in gpus:
                peer = gpus[i ^ 1]
                links.append(NvLinkRemote("gpu", peer.bdf, peer.vendor, peer.device))
            else:
                links.append(NvLinkRemote("gpu", None))
        out.append(tuple(links))
    return tuple(out)


@lru_cache(maxsize=16)
def pci_layout(config: NodeConfig) -> Layout:
    p = config.profile
    fns: list[PciFunction] = []
    switch_ids = SWITCH_GEN5_IDS if p.pci.max_link_gen >= 5 else SWITCH_GEN4_IDS
    node = config.composition
    hca = node.hca
    hca_gen = hca_link(hca.rate_gbps) if hca else 0

    def bridge(bdf, kind, index, parent, ids, ptype, gen, width, port, numa, sec, sub, mem, pref, root_bus, serves=None):
        v, d, sv, sd, rev = ids
        return PciFunction(
            bdf=bdf, kind=kind, index=index, parent=parent, vendor=v, device=d, subsystem_vendor=sv,
            subsystem_device=sd, class_code=BRIDGE_CLASS, revision=rev, port_type=ptype, link_gen=gen,
            link_width=width, port_number=port, numa_node=numa, irq=0, driver="pcieport", secondary=sec,
            subordinate=sub, mem_window=mem, pref_window=pref, serves=serves, root_bus=root_bus,
        )

    bar1 = _pow2(p.memory.bar1_mib * MIB)
    for ident, slot in zip(gpu_identities(config), config.slots):
        i, b = ident.index, ident.bdf
        root_bus = b.bus - 3
        has_hca = hca is not None and slot.hca is not None
        numa = ident.numa_node
        w32 = _GPU_MMIO32 + (i % 32) * 32 * MIB
        w64 = _MMIO64 + i * _TIB
        gpu_mem = Window(w32, w32 + 16 * MIB - 1)
        gpu_pref = Window(w64, w64 + bar1 + 32 * MIB - 1)
        hca_pref = Window(w64 + bar1 + 32 * MIB, w64 + bar1 + 64 * MIB - 1)
        all_pref = Window(w64, (hca_pref if has_hca else gpu_pref).end)
        last_bus = b.bus + (1 if has_hca else 0)
        gen, width = p.pci.max_link_gen, p.pci.max_link_width
        rp = Bdf(b.domain, root_bus, 1, 0)
        up = Bdf(b.domain, root_bus + 1, 0, 0)
        fns.append(bridge(rp, "root_port", i, None, ROOT_PORT_IDS, ROOT_PORT, gen, 16, 1 + i % 8, numa,
                          up.bus, last_bus, gpu_mem, all_pref, root_bus))
        fns.append(bridge(up, "switch_up", i, rp, switch_ids, UPSTREAM, gen, 16, 0, numa,
                          b.bus - 1, last_bus, gpu_mem, all_pref, root_bus))
        down = Bdf(b.domain, b.bus - 1, 0, 0)
        fns.append(bridge(down, "switch_down", i, up, switch_ids, DOWNSTREAM, gen, width, 0, numa,
                          b.bus, b.bus, gpu_mem, gpu_pref, root_bus, serves=("gpu", i)))
        if has_hca:
            fns.append(bridge(Bdf(b.domain, b.bus - 1, 1, 0), "switch_down", i, up, switch_ids, DOWNSTREAM,
                              hca_gen, 16, 1, numa, b.bus + 1, b.bus + 1, NO_WINDOW, hca_pref, root_bus,
                              serves=("hca", slot.hca)))
        fns.append(PciFunction(
            bdf=b, kind="gpu", index=i, parent=down, vendor=p.pci.vendor_id, device=p.pci.device_id,
            subsystem_vendor=p.pci.subsystem_vendor_id, subsystem_device=p.pci.subsystem_device_id,
            class_code=p.pci.class_code, revision=p.pci.revision, port_type=ENDPOINT, link_gen=gen,
            link_width=width, port_number=0, numa_node=numa, irq=0, driver="nvidia",
            bars=(Bar(0, w32, 16 * MIB, False, False), Bar(1, w64, bar1, True, True),
                  Bar(3, w64 + bar1, 32 * MIB, True, True)),
            root_bus=root_bus,
        ))
        if has_hca:
            fns.append(_hca(config, slot.hca, Bdf(b.domain, b.bus + 1), Bdf(b.domain, b.bus - 1, 1, 0),
                            hca_pref.start, hca_gen, numa, root_bus))

    # The platform complex(es): NVSwitches, then the HCAs beside no GPU.
    platform: list[tuple[str, int]] = []
    if node.nvswitch_device_id is not None:
        platform += [("nvswitch", k) for k in range(config.nvswitches)]
    if hca is not None:
        beside = {slot.hca for slot in config.slots}
        platform += [("hca", j) for j in range(config.hcas) if j not in beside]
    base_domain = node.pci_domain
    for chunk in range(0, len(platform), _PLATFORM_SLOTS):
        members = platform[chunk : chunk + _PLATFORM_SLOTS]
        c = chunk // _PLATFORM_SLOTS
        domain = base_domain + c
        rb = PLATFORM_ROOT_BUS
        rp, up = Bdf(domain, rb, 1, 0), Bdf(domain, rb + 1, 0, 0)
        last_bus = rb + 3 + len(members) - 1
        w64 = _PLATFORM_MMIO64 + c * _TIB
        n_switch = sum(1 for kind, _ in members if kind == "nvswitch")
        mem = Window(_PLATFORM_MMIO32, _PLATFORM_MMIO32 + n_switch * 32 * MIB - 1) if n_switch else NO_WINDOW
        pref_end = w64 + len(members) * (1 << 32) - 1
        pref = Window(w64, pref_end) if any(kind == "hca" for kind, _ in members) else NO_WINDOW
        gen = max([5 if p.pci.max_link_gen >= 5 else 4] + ([hca_gen] if hca else []))
        fns.append(bridge(rp, "root_port", -1, None, ROOT_PORT_IDS, ROOT_PORT, gen, 16, 9 + c, 0,
                          up.bus, last_bus, mem, pref, rb))
        fns.append(bridge(up, "switch_up", -1, rp, switch_ids, UPSTREAM, gen, 16, 0, 0,
                          rb + 2, last_bus, mem, pref, rb))
        for k, (kind, index) in enumerate(members):
            down = Bdf(domain, rb + 2, k, 0)
            bus = rb + 3 + k
            if kind == "nvswitch":
                start = _PLATFORM_MMIO32 + k * 32 * MIB
                nv_gen = min(4, p.pci.max_link_gen)
                fns.append(bridge(down, "switch_down", -1, up, switch_ids, DOWNSTREAM, nv_gen, 2, k, 0,
                                  bus, bus, Window(start, start + 32 * MIB - 1), NO_WINDOW, rb,
                                  serves=(kind, index)))
                fns.append(PciFunction(
                    bdf=Bdf(domain, bus), kind="nvswitch", index=index, parent=down, vendor=0x10DE,
                    device=node.nvswitch_device_id, subsystem_vendor=0x10DE,
                    subsystem_device=node.nvswitch_device_id, class_code=NVSWITCH_CLASS, revision=0xA1,
                    port_type=ENDPOINT, link_gen=nv_gen, link_width=2, port_number=0, numa_node=0, irq=0,
                    driver="nvidia-nvswitch", bars=(Bar(0, start, 32 * MIB, False, False),), root_bus=rb,
                ))
            else:
                start = w64 + k * (1 << 32)
                fns.append(bridge(down, "switch_down", -1, up, switch_ids, DOWNSTREAM, hca_gen, 16, k, 0,
                                  bus, bus, NO_WINDOW, Window(start, start + 32 * MIB - 1), rb,
                                  serves=(kind, index)))
                fns.append(_hca(config, index, Bdf(domain, bus), down, start, hca_gen, 0, rb))

    fns.sort(key=lambda f: (f.bdf.domain, f.bdf.bus, f.bdf.device, f.bdf.function))
    # IRQ numbers in probe order, as the kernel hands out MSI vectors (values are illustrative).
    fns = [replace(f, irq=(24 + n) if f.is_bridge else (128 + 16 * n)) for n, f in enumerate(fns)]
    layout = Layout(tuple(fns), cpu_layout(config))
    chains = [layout.chain(layout.of("gpu", i)) for i in range(config.gpus)]
    # A pair's level is the same either way round: each pair is worked out once (2,080 pairs of
    # 64 GPUs, not 4,096: ~10 ms of a 64-GPU daemon's start).
    rows = [[0] * len(chains) for _ in chains]
    for i, a in enumerate(chains):
        for j in range(i, len(chains)):
            rows[i][j] = rows[j][i] = topology_level(a, chains[j])
    levels = tuple(map(tuple, rows))
    return replace(layout, nvlinks=_nvlink_remotes(config, fns), levels=levels)


def _hca(config: NodeConfig, index: int, bdf: Bdf, parent: Bdf, start: int, gen: int, numa: int, root_bus: int):
    hca = config.composition.hca
    assert hca is not None
    return PciFunction(
        bdf=bdf, kind="hca", index=index, parent=parent, vendor=0x15B3, device=hca.pci_device_id,
        subsystem_vendor=HCA_SUBSYSTEM[0], subsystem_device=HCA_SUBSYSTEM[1], class_code=HCA_CLASS,
        revision=0x00, port_type=ENDPOINT, link_gen=gen, link_width=16, port_number=0, numa_node=numa,
        irq=0, driver="mlx5_core", bars=(Bar(0, start, 32 * MIB, True, True),), root_bus=root_bus,
    )
