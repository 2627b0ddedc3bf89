"""The daemon's side of the shared state file: maps `<state-dir>/state` (its layout in
`mokkafs.daemon.shm.layout`) and publishes the node into it under
the seqlock, on every event and on a short tick, appending events and waking futex waiters."""
from __future__ import annotations

import contextlib
import logging
import mmap
import os
import platform
import stat
from collections.abc import Sequence
from pathlib import Path

import trio

from mokkafs.daemon.clock import Clock, WallClock
from mokkafs.model import Node, Notification, Outcome
from mokkafs.model.config import COMPUTE_MODES
from mokkafs.model.counters import ECC_ROWS, NVLINK_COUNTERS
from mokkafs.model.mig import ci_span
from mokkafs.model.dynamics import Readings
from mokkafs.model.nvml_consts import NVLINK_DEVICE_TYPES
from mokkafs.model.xid import RecoveryAction
from mokkafs.daemon.shm.layout import (
    ACCOUNTING_RECORDS,
    MAGIC,
    MAX_GPU_PROCS,
    MAX_GPUS,
    NO_MIG,
    RETIRED,
    RING,
    STATE_SIZE,
    VERSION,
    fence,
    ffi,
    libc,
)

log = logging.getLogger(__name__)

TICK_S = 0.1

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAKE = 1
_INT_MAX = 0x7FFFFFFF

CPU_WORD_BITS = 64


def cuda_version_int(version: str) -> int:
    major, minor = version.split(".")[:2]
    return int(major) * 1000 + int(minor) * 10


def _put(field, value: str) -> None:
    raw = value.encode()[: len(field) - 1]
    ffi.memmove(field, raw, len(raw))


def fill_static(g, node: Node, i: int) -> None:
    """Write what never changes while the daemon runs (identity, limits, topology) into the
    zeroed cffi struct `g`. The publisher renders it once per GPU and copies it thereafter."""
    p, ident = node.profile, node.identities[i]
    mib = 1 << 20
    _put(g.name, p.product_name)
    _put(g.uuid, ident.uuid)
    _put(g.serial, ident.serial)
    _put(g.board_part_number, p.board_part_number)
    _put(g.gpu_part_number, p.gpu_part_number)
    _put(g.vbios_version, p.vbios_version)
    _put(g.inforom_image, p.inforom.image)
    _put(g.inforom_oem, p.inforom.oem)
    _put(g.inforom_ecc, p.inforom.ecc)
    _put(g.inforom_power, p.inforom.power)
    _put(g.bus_id, ident.bdf.nvml)
    _put(g.bus_id_legacy, ident.bdf.legacy)
    g.index, g.minor = ident.index, ident.minor
    g.brand = p.nvml_brand
    g.architecture = p.nvml_architecture
    g.cc_major, g.cc_minor = (int(x) for x in p.compute_capability.split("."))
    g.board_id = ident.bdf.board_id
    g.module_id = ident.module_id
    g.numa_node = ident.numa_node
    g.multiprocessor_count = p.sm_count
    g.pci_domain, g.pci_bus, g.pci_device = ident.bdf.domain, ident.bdf.bus, ident.bdf.device
    g.pci_device_id = (p.pci.device_id << 16) | p.pci.vendor_id
    g.pci_subsystem_id = (p.pci.subsystem_device_id << 16) | p.pci.subsystem_vendor_id
    g.pci_class = p.pci.class_code
    g.pcie_max_gen = g.pcie_cur_gen = p.pci.max_link_gen
    g.pcie_max_width = g.pcie_cur_width = p.pci.max_link_width
    g.has_fan = int(p.has_fan)
    g.fan_speed = p.fan_speed_pct or 0
    g.mig_capable = int(p.mig_capable)
    g.addressing_mode = node.addressing_mode
    g.pdi = ident.pdi
    g.c2c_mode = p.c2c_mode
    g.row_remap_banks = p.memory.row_remap_banks or 0
    g.voltage_uv = round(p.voltage_mv * 1000) if p.voltage_mv is not None else 0
    _put(g.sparse_operation_mode, p.sparse_operation_mode or "")
    g.has_row_remapper = int(node.has_row_remapper)
    g.has_fabric = int(p.fabric is not None)
    if p.fabric is not None:
        g.fabric_state = p.fabric.state_code
        g.fabric_clique_id = p.fabric.clique_id
        ffi.memmove(g.fabric_cluster_uuid, bytes.fromhex(p.fabric.cluster_uuid.replace("-", "")), 16)
        g.fabric_health_mask = p.fabric.health.mask
        g.fabric_health_summary = p.fabric.health.summary_code
    g.mem_total = node.framebuffer.total_mib * mib
    g.mem_reserved = node.framebuffer.reserved_mib * mib
    g.bar1_total = p.memory.bar1_mib * mib
    g.mem_bus_width = p.memory.bus_width_bits
    g.pstate = 0
    c = p.clocks
    g.clock_max = [c.max_graphics, c.max_sm, c.max_mem, c.max_video]
    g.clock_default_app = [c.default_app_graphics, c.default_app_graphics, c.default_app_mem, c.max_video]
    g.power_default_limit = int(round(p.power.default_limit_w * 1000))
    g.power_min_limit = int(round(p.power.min_limit_w * 1000))
    g.power_max_limit = int(round(p.power.max_limit_w * 1000))
    t = p.thermal
    thresholds = [-1] * 8  # by nvmlTemperatureThresholds_t; -1: not reported
    thresholds[0], thresholds[1], thresholds[3] = t.shutdown_c, t.slowdown_c, t.max_operating_c
    if t.memory_max_operating_c is not None:
        thresholds[2] = t.memory_max_operating_c
    g.temp_threshold = thresholds
    g.temp_tlimit = -1 if t.tlimit_c is None else t.tlimit_c
    g.nvlink_count = p.nvlink.links
    for link in range(p.nvlink.links):
        g.nvlink[link].state = 1  # up, no errors: fill_dynamic writes only the links that differ
    for link, remote in enumerate(node.layout.nvlinks[i]):
        nl = g.nvlink[link]
        nl.version = p.nvlink.version
        nl.remote_type = NVLINK_DEVICE_TYPES[remote.kind.upper()]
        if remote.bdf is not None:
            nl.remote_has_pci = 1
            nl.remote_domain, nl.remote_bus, nl.remote_device = remote.bdf.domain, remote.bdf.bus, remote.bdf.device
            nl.remote_pci_device_id = (remote.device << 16) | remote.vendor
    g.l2_cache_bytes = p.l2_cache_bytes
    mask = [0] * len(g.cpu_affinity)
    for cpu in node.layout.gpu_cpus(i):
        mask[cpu // CPU_WORD_BITS] |= 1 << (cpu % CPU_WORD_BITS)
    g.cpu_affinity = mask
    levels = node.layout.levels[i][:MAX_GPUS]
    ffi.memmove(g.topo_level, bytes(levels), len(levels))
    limits = node.compute
    g.max_threads_per_sm = limits.max_threads_per_sm
    g.shared_memory_per_sm = limits.shared_memory_per_sm
    g.shared_memory_per_block_optin = limits.shared_memory_per_block_optin
    g.max_blocks_per_sm = limits.max_blocks_per_sm
    g.fp32_to_fp64_ratio = limits.fp32_to_fp64_ratio
    f = node.features
    g.generic_compression = int(f.generic_compression)
    g.max_persisting_l2_bytes = f.max_persisting_l2_bytes
    g.max_access_policy_window_bytes = f.max_access_policy_window_bytes
    g.reserved_shared_memory_per_block = f.reserved_shared_memory_per_block
    g.rdma_writes_ordering = f.rdma_writes_ordering
    g.cluster_launch = int(f.cluster_launch)
    g.mem_sync_domain_count = f.mem_sync_domain_count
    g.tensor_map_access = int(f.tensor_map_access)
    g.multicast = int(f.multicast)
    nv = node.nvml_support
    g.nvml_sram_ecc_status = int(nv.sram_ecc_status)
    g.nvml_repair_status = int(nv.repair_status)
    g.nvml_unrepairable_flag = int(nv.unrepairable_memory_flag)
    g.nvml_power_average = int(nv.power_average)
    g.nvml_edpp_multiplier = int(nv.edpp_multiplier)
    g.nvml_gpm = int(nv.gpm)


def fill_readings(g, r: Readings) -> None:
    """Write the readings `r` into `g`: what time changes, and all that it changes (the tick
    rewrites only this while no event has come)."""
    mib = 1 << 20
    g.mem_used = r.memory_used_mib * mib
    g.mem_free = r.memory_free_mib * mib
    g.clock_cur = [r.clock_graphics, r.clock_sm, r.clock_mem, r.clock_video]
    g.power_usage = int(round(r.power_w * 1000))
    g.power_limit = g.power_enforced_limit = int(round(r.power_limit_w * 1000))
    g.energy_mj = int(r.energy_mj)
    g.temp_gpu = int(round(r.temperature_c))
    g.temp_mem = -1 if r.memory_temperature_c is None else int(round(r.memory_temperature_c))
    g.util_gpu, g.util_mem = r.util_gpu, r.util_mem
    g.throttle_mask = r.throttle_mask
    g.event_ns = list(r.event_ns)


def fill_dynamic(g, node: Node, i: int, now: float) -> None:
    """Write what events and time change into `g`, which already holds `fill_static`'s part."""
    st = node.gpus[i]
    g.pcie_replay = st.pcie_replay
    g.persistence_mode = int(node.setting(i, "persistence"))
    g.compute_mode = COMPUTE_MODES[node.setting(i, "compute_mode")]
    g.ecc_enabled = int(node.ecc_enabled(i))
    g.ecc_pending = int(node.setting(i, "ecc_mode"))
    g.accounting_mode = int(node.setting(i, "accounting"))
    app_mem, app_graphics = node.setting(i, "applications_clocks")
    g.clock_app = [app_graphics, app_graphics, app_mem, node.profile.clocks.max_video]
    fill_readings(g, node.readings(i, now))
    # `g` holds fill_static's part: no ECC errors and every NVLink up without errors. Only what
    # differs from that is written (the 18 links of a Hopper board were 18 us of each GPU's
    # publish, on the way to every nvmlEventSetWait waiter).
    if any(st.ecc.values()):
        for scope, kind, row in ECC_ROWS:
            g.ecc[scope][kind] = [st.ecc[c] for c in row]
    g.retired_sbe, g.retired_dbe = st.retired_sbe, st.retired_dbe
    g.retired_pending = int(st.retired_pending)
    g.remapped_corr, g.remapped_unc = st.remapped_corr, st.remapped_unc
    g.remap_pending, g.remap_failure = int(st.remap_pending), int(st.remap_failure)
    links = node.profile.nvlink.links
    for link in st.nvlink_down:
        if link < links:
            g.nvlink[link].state = 0
    for link, errs in st.nvlink_errors.items():
        if errs and link < links:
            g.nvlink[link].errors = [errs[c] for c in NVLINK_COUNTERS]
    g.lost = int(st.lost)
    g.needs_reset = int(st.needs_reset)
    g.recovery_action = int(RecoveryAction.from_spelling(st.recovery_action))
    g.last_xid = st.last_xid or 0
    g.mem_used_pinned = int("memory_used" in st.pins)
    g.bar1_used = node.bar1_used_bytes(i)
    procs = node.processes[i][:MAX_GPU_PROCS]
    on = node.process_instances[i]
    g.process_count = len(procs)
    for k, (pid, used) in enumerate(procs):
        rec = g.processes[k]
        rec.pid, rec.used_memory = pid, used
        rec.mig_gi, rec.mig_ci = on.get(pid, (NO_MIG, NO_MIG))
    fill_mig(g, node, i)


def fill_mig(g, node: Node, i: int) -> None:
    """GPU `i`'s MIG mode, GPU instances and MIG devices, as the model describes them
    (`Node.mig_devices`); `g`'s MIG section is zero, from `fill_static`."""
    st = node.gpus[i].mig
    g.mig_mode, g.mig_pending = int(st.enabled), int(st.pending)
    gis, devices = node.mig_devices(i)
    g.mig_gi_count, g.mig_device_count = len(gis), len(devices)
    for k, n in enumerate(node.mig_capacity(i)):
        g.mig_gi_remaining[k] = n
    slot = {}
    for k, v in enumerate(gis):
        r, p = g.mig_gi[k], v.profile
        slot[v.id] = k
        r.id, r.profile, r.profile_id, r.start, r.size = v.id, p.profile, p.id, v.start, v.size
        r.slice_count, r.multiprocessor_count = p.slices, p.sm
        r.copy_engine_count, r.decoder_count, r.encoder_count = p.copy_engines, p.decoders, p.encoders
        r.jpeg_count, r.ofa_count = p.jpegs, p.ofas
        r.minor, r.ci_count = v.minor, len(v.compute)
        for j, n in enumerate(v.remaining):
            r.ci_remaining[j] = n
        r.memory_total, r.memory_used, r.bar1_total = p.memory_mib << 20, v.memory_used_bytes, v.bar1_bytes
        _put(r.profile_name, p.name)
    for k, d in enumerate(devices):
        r = g.mig_devices[k]
        r.gi_slot, r.gi_id, r.ci_id, r.profile = slot[d.gi.id], d.gi.id, d.ci.id, d.profile.profile
        r.start, r.size, r.multiprocessor_count, r.minor = d.ci.start, d.ci.size, d.profile.sm, d.minor
        _put(r.name, d.name)
        _put(r.uuid, d.uuid)
        _put(r.profile_name, d.profile.name)


def fill_mig_tables(st, node: Node) -> None:
    """The board's MIG profile tables into the state's node-wide section (none: count 0)."""
    mig = node.profile.mig
    if mig is None:
        st.mig_memory_slices = st.mig_compute_slices = st.mig_profile_count = 0
        return
    st.mig_memory_slices, st.mig_compute_slices = mig.memory_slices, mig.compute_slices
    st.mig_profile_count = len(mig.gpu_instance_profiles)
    for k, p in enumerate(mig.gpu_instance_profiles):
        r = st.mig_profiles[k]
        r.index, r.id, r.slice_count, r.instance_count = p.profile, p.id, p.slices, p.instances
        r.multiprocessor_count, r.copy_engine_count = p.sm, p.copy_engines
        r.decoder_count, r.encoder_count, r.jpeg_count, r.ofa_count = p.decoders, p.encoders, p.jpegs, p.ofas
        r.p2p, r.placement_size, r.memory_mib = int(p.p2p), p.placement_size, p.memory_mib
        r.placement_count = len(p.placements)
        r.placements = list(p.placements) + [0] * (len(r.placements) - len(p.placements))
        _put(r.name, p.name + "\0")
        r.ci_profile_count = len(p.compute_profiles)
        for j, c in enumerate(p.compute_profiles):
            rc = r.ci_profiles[j]
            rc.id, rc.slice_count, rc.instance_count, rc.multiprocessor_count = c.profile, c.slices, c.instances, c.sm
            rc.span = ci_span(c)
            rc.placement_count = len(c.placements)
            rc.placements = list(c.placements) + [0] * (len(rc.placements) - len(c.placements))
            _put(rc.name, c.name + "\0")


def fill_supported_clocks(st, node: Node) -> None:
    """The board's supported clocks, as the model lists them, into the node-wide section."""
    clocks = node.profile.clocks
    st.supported_clock_count = len(clocks.supported)
    for k, entry in enumerate(clocks.supported):
        r, graphics = st.supported_clocks[k], clocks.graphics_clocks(entry)
        r.memory_mhz, r.graphics_count = entry.memory_mhz, len(graphics)
        r.graphics_mhz[0:len(graphics)] = graphics


def fill_accounting(a, node: Node, i: int) -> None:
    """Write GPU `i`'s accounting records, oldest first, into the cffi struct `a`."""
    records = list(node.accounting[i].values())[-ACCOUNTING_RECORDS:]
    a.count = len(records)
    for k, rec in enumerate(records):
        r = a.records[k]
        r.pid, r.is_running = rec.pid, int(rec.end is None)
        r.gpu_utilization, r.memory_utilization = rec.utilization()
        r.max_memory_usage, r.time_ms = rec.max_memory, rec.time_ms
        r.start_time_us = int(rec.start * 1e6)


def fill_gpu(g, node: Node, i: int, now: float) -> None:
    """Write GPU `i`'s whole record at `now` into the zeroed cffi struct `g`."""
    fill_static(g, node, i)
    fill_dynamic(g, node, i, now)


class Publisher:
    """Owns `<state-dir>/state`. Call `publish(node)` after any change; `run` ticks every
    `tick_s` of `clock`."""

    def __init__(self, path: Path, clock: Clock | None = None, tick_s: float = TICK_S) -> None:
        self.path = Path(path)
        self.clock = WallClock() if clock is None else clock
        self.tick_s = tick_s
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._st = None
        self._scratch = ffi.new("struct mokka_gpu[]", MAX_GPUS)
        self._statics: dict[tuple[int, int], bytes] = {}
        # Per (node, GPU): the node's generation at which its record was last known whole;
        # per node: its generation at the last publish.
        self._written: dict[tuple[int, int], int] = {}
        self._seen: dict[int, int] = {}
        self._accounted: dict[tuple[int, int], int] = {}  # (node, GPU): accounting version written
        self._last_node: Node | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we write
        self._counters = (0, 0, 0)
        self._unrepaired: str | None = None  # damage whose repair failed, said once
        self._wake_args: tuple | None = None  # (the mapping's struct, the futex wake's arguments)

    def _static(self, node: Node, i: int) -> bytes:
        """GPU `i`'s record with only `fill_static`'s part, rendered once: an event's publish
        then writes only what can change, which keeps it off the waiters' critical path."""
        key = (id(node), i)
        if key not in self._statics:
            g = ffi.new("struct mokka_gpu *")
            fill_static(g[0], node, i)
            self._statics[key] = bytes(ffi.buffer(g))
        return self._statics[key]

    # --- lifetime ------------------------------------------------------------------------------

    def open(self) -> None:
        """Adopt our previous file, or put a new one in place. A valid file of this version
        keeps its event counters, so consumers that mapped it under a previous daemon keep
        receiving events. Anything else at the path (a wrong size or version, a link, a FIFO)
        is replaced with a rename, never truncated under a reader (a shrink would SIGBUS it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open_existing()
        if fd is None:
            fd, mm = self._new_file(None)
        else:
            try:
                mm = mmap.mmap(fd, STATE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except BaseException:
                os.close(fd)
                raise
        self._take(fd, mm)
        st = self._st
        if st.seq & 1:
            st.seq += 1  # a previous daemon died mid-publish
        st.magic, st.version, st.size = MAGIC, VERSION, STATE_SIZE
        self._remember()

    def _open_existing(self) -> int | None:
        """The descriptor of a state file of this layout at the path, opened without following a
        link (or blocking on a FIFO); None when there is none to adopt."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("%s: replacing what is there, not a state file (%s)", self.path, e.strerror)
            return None
        st = os.fstat(fd)
        # A hard link (another name of a file elsewhere) or another user's file is never
        # written through: it is replaced with a rename, like anything else that is not ours.
        ours = st.st_nlink == 1 and st.st_uid == os.geteuid()
        if stat.S_ISREG(st.st_mode) and ours and st.st_size == STATE_SIZE and self._valid(fd):
            return fd
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            log.warning("%s: replacing what is there, not a regular file", self.path)
        elif not ours:
            log.warning("%s: replacing a hard link or another user's file (links %d, uid %d)", self.path,
                        st.st_nlink, st.st_uid)
        elif st.st_size:
            log.warning("%s: replacing an incompatible state file (%d bytes)", self.path, st.st_size)
        return None

    def _new_file(self, content: bytes | None) -> tuple[int, mmap.mmap]:
        """A whole file, zeroed or holding `content`, with a valid header, renamed into place
        only once it is complete: no reader ever maps it short or unwritten."""
        tmp = self.path.with_name(f".{self.path.name}.new")
        try:
            os.unlink(tmp)  # a leftover of a daemon that died here; unlink never follows a link
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            _allocate(fd, self.path)
            mm = mmap.mmap(fd, STATE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                if content is not None:
                    mm[:] = content
                st = ffi.from_buffer("struct mokka_state *", mm)
                st.magic, st.version, st.size = MAGIC, VERSION, STATE_SIZE
                ffi.release(st)
                os.replace(tmp, self.path)
            except BaseException:
                mm.close()
                raise
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return fd, mm

    def _take(self, fd: int, mm: mmap.mmap) -> None:
        """Make (fd, mm) the file the daemon writes."""
        st = os.fstat(fd)
        self._wake_args = None  # made for the mapping they point into
        self._fd, self._mm, self._ident = fd, mm, (st.st_dev, st.st_ino)
        self._st = ffi.from_buffer("struct mokka_state *", mm)

    def _remember(self) -> None:
        """Keep the header as written, the counters consumers hold cursors into included, to
        tell an overwritten header and to put it back."""
        st = self._st
        self._counters = (st.event_head, st.event_wake, st.generation)

    # What can happen to the file under the daemon, checked on every publish (and so every tick),
    # cheapest first; the truncation check must come before any access to the mapping.
    _REPLACED = "the state file was replaced by another file; putting a new one in its place"
    _REMOVED = "the state file was removed; putting a new one in its place"
    _TRUNCATED = "the state file was truncated under the daemon; restoring it"
    _GROWN = "the state file was extended under the daemon; restoring its size"
    _HEADER = "the state file's header was overwritten; restoring it"

    def _damage(self) -> str | None:
        try:
            at_path = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return self._REMOVED
        except OSError:
            return self._REPLACED  # a path component that is no longer a directory
        if (at_path.st_dev, at_path.st_ino) != self._ident:
            return self._REPLACED
        size = os.fstat(self._fd).st_size
        if size != STATE_SIZE:
            return self._TRUNCATED if size < STATE_SIZE else self._GROWN
        st = self._st
        if (st.magic, st.version, st.size, st.seq & 1, (st.event_head, st.event_wake, st.generation)) != \
                (MAGIC, VERSION, STATE_SIZE, 0, self._counters):
            return self._HEADER
        return None

    def _guard(self) -> bool:
        """Is the path still our whole file, as we wrote it? Root can remove it, rename another
        file over it, truncate or extend it, or write into its header; each breaks every new
        consumer (and a store into truncated pages would SIGBUS the daemon). Repair it, say so in
        one line, and tell consumers of a superseded file to move (docs/nvml.md). True when a
        full republish is due."""
        damage = self._damage()
        if damage is None:
            return False
        if damage != self._unrepaired:
            log.warning("%s: %s", self.path, damage)
        try:
            if damage in (self._REPLACED, self._REMOVED):
                self._supersede()
            else:
                self._restore()
        except OSError as e:
            if damage != self._unrepaired:
                log.warning("%s: cannot repair the state file yet (%s); trying again every tick", self.path,
                            e.strerror or e)
            self._unrepaired = damage
            return False
        self._unrepaired = None
        return True

    def _restore(self) -> None:
        """Our file, changed in place: its size, then its header and counters."""
        if os.fstat(self._fd).st_size != STATE_SIZE:
            try:
                _allocate(self._fd, self.path)
            except OSError:
                os.ftruncate(self._fd, STATE_SIZE)  # sparse, then: a full disk may fault a page later
        self._put_header(self._st)
        self._futex_wake()  # waiters asleep on an overwritten word look again

    def _put_header(self, st) -> None:
        st.magic, st.version, st.size = MAGIC, VERSION, STATE_SIZE
        # Event sets keep cursors into the ring: counters back at 0 would starve them.
        st.event_head, st.event_wake, st.generation = self._counters
        if st.seq & 1:
            st.seq += 1

    def _supersede(self) -> None:
        """The path no longer names our file: put a new one there with all ours holds (records,
        ring, counters), then retire ours, which its readers see and leave for the new one."""
        if os.fstat(self._fd).st_size != STATE_SIZE:
            self._restore()  # truncated too: its lost pages would SIGBUS the copy
        old_fd, old_mm, old_st = self._fd, self._mm, self._st
        self._put_header(old_st)
        fd, mm = self._new_file(bytes(old_mm))
        self._take(fd, mm)
        old_st.magic = RETIRED
        fence()
        old_st.event_wake = (old_st.event_wake + 1) & 0xFFFFFFFF
        self._futex_wake(old_st)  # nvmlEventSetWait sleepers move to the new file now
        ffi.release(old_st)
        old_mm.close()
        os.close(old_fd)

    @staticmethod
    def _valid(fd: int) -> bool:
        head = os.pread(fd, 16, 0)
        return int.from_bytes(head[:8], "little") == MAGIC and int.from_bytes(head[8:12], "little") == VERSION

    def close(self) -> None:
        self._wake_args = None
        if self._st is not None:
            ffi.release(self._st)
            self._st = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # --- publishing ----------------------------------------------------------------------------

    def publish(self, node: Node, only: set[int] | None = None, tick: bool = False) -> None:
        """Write every record (or only the GPUs in `only`: an event's targets, the tick
        refreshes the rest within `tick_s`) under the seqlock, at once. A `tick` rewrites only
        the readings of a record that no event has changed since it was last written whole."""
        if self._guard():
            only, tick = None, False
        self._last_node = node
        st, now = self._st, self.clock()
        count = min(len(node.gpus), MAX_GPUS)
        targets = range(count) if only is None else sorted(i for i in only if 0 <= i < count)
        scratch, rec = self._scratch, ffi.sizeof("struct mokka_gpu")
        whole, readings = [], []
        for i in targets:
            key = (id(node), i)
            if tick and self._written.get(key) == node.generation:
                readings.append((i, node.readings(i, now)))
                continue
            ffi.memmove(scratch + i, self._static(node, i), rec)  # `+ i`: addressof is slow Python
            fill_dynamic(scratch[i], node, i, now)
            self._written[key] = node.generation
            whole.append(i)
        if only is not None and not tick and self._seen.get(id(node)) == node.generation - 1:
            # One event since the last publish, and it changed only the GPUs in `only` (the
            # subscriber's contract): the other records that were whole are whole still.
            for i in range(count):
                if i not in only and self._written.get((id(node), i)) == node.generation - 1:
                    self._written[(id(node), i)] = node.generation
        self._seen[id(node)] = node.generation
        cfg = node.config
        st.seq += 1  # odd: records are changing
        fence()  # the odd count before any record (a no-op on x86, which keeps store order)
        if not tick:
            st.gpu_count = count
            st.daemon_pid = os.getpid()
            st.cuda_version = cuda_version_int(cfg.cuda_version)
            _put(st.driver_version, cfg.driver_version + "\0")
            _put(st.nvml_version, f"{cfg.cuda_version.split('.')[0]}.{cfg.driver_version}" + "\0")
            _put(st.hostname, cfg.hostname + "\0")
            if only is None:  # static: every full publish (a new or repaired file gets one first)
                fill_mig_tables(st, node)
                fill_supported_clocks(st, node)
        if len(whole) == count:
            ffi.memmove(st.gpus, scratch, rec * count)
        else:
            for i in whole:
                ffi.memmove(st.gpus + i, scratch + i, rec)
        for i, r in readings:
            fill_readings(st.gpus[i], r)
        for i in targets:
            # Accounting records only when they changed: a full buffer is 4000 of them.
            key = (id(node), i)
            if self._accounted.get(key) != node.accounting_version[i]:
                fill_accounting(st.accounting[i], node, i)
                self._accounted[key] = node.accounting_version[i]
        st.publish_time_ns = int(now * 1e9)
        st.generation += 1
        fence()  # every record before the even count
        st.seq += 1
        self._remember()

    def append_events(self, notes: Sequence[Notification], now: float | None = None) -> None:
        """Append to the ring, then wake every waiter once."""
        if not notes:
            return
        if self._guard() and self._last_node is not None:
            self.publish(self._last_node)  # the restored file has no records yet
        self._append(notes, now)

    def _append(self, notes: Sequence[Notification], now: float | None = None) -> None:
        """`append_events` on the file as it is: right after a publish, which has just checked
        it (a damage done meanwhile is repaired at the next publish, the ring with the rest)."""
        st = self._st
        t_ns = int((self.clock() if now is None else now) * 1e9)
        for note in notes:
            n = st.event_head
            slot = st.ring[n % RING]
            slot.seq = 0  # a reader that sees 0 (or another number) skips the slot as torn
            fence()
            slot.type, slot.data, slot.gpu, slot.time_ns = note.event_type, note.data, note.gpu, t_ns
            slot.mig_gi = NO_MIG if note.gi is None else note.gi
            slot.mig_ci = NO_MIG if note.ci is None else note.ci
            fence()
            slot.seq = n + 1
            fence()
            st.event_head = n + 1
        fence()
        st.event_wake = (st.event_wake + 1) & 0xFFFFFFFF
        self._remember()
        self._futex_wake()

    def _futex_wake(self, st=None) -> None:
        if _SYS_FUTEX is None:
            return  # waiters fall back to their timeout slices
        st = self._st if st is None else st
        args = self._wake_args if self._wake_args is not None and self._wake_args[0] is st else None
        if args is None:
            # The syscall's arguments as cffi values, made once per mapping: casting them on
            # every event cost each wake ~10 us of Python before the syscall.
            addr = ffi.cast("uint32_t *", ffi.addressof(st, "event_wake"))
            args = (st, ffi.cast("long", _SYS_FUTEX), ffi.cast("void *", addr), ffi.cast("int", _FUTEX_WAKE),
                    ffi.cast("int", _INT_MAX), ffi.NULL, ffi.NULL, ffi.cast("int", 0))
            if st is self._st:
                self._wake_args = args
        libc.syscall(*args[1:])

    def __call__(self, node: Node, outcome: Outcome) -> None:
        """Controller subscriber: the new state first, then its events. Only the GPUs the
        event touched (the outcome says which) are rewritten, so the event reaches waiters
        sooner; a node-wide event rewrites everything."""
        node_wide = len(outcome.gpus) >= len(node.gpus)
        self.publish(node, None if node_wide else set(outcome.gpus))
        if outcome.notifications:
            # publish() has just checked the file (two stats): not again before the wake.
            self._append(outcome.notifications)

    async def run(self, node: Node, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Publish now, report started, then republish every `tick_s` for time-varying values:
        their readings only, so that the tick keeps the event loop (and a control write that
        arrives meanwhile) for tens of microseconds, not a whole node's records (~350 us at 8 GPUs)."""
        self.publish(node)
        task_status.started()
        while True:
            await self.clock.sleep(self.tick_s)
            self.publish(node, tick=True)


def _allocate(fd: int, path) -> None:
    """Size the file and back every page of it: a store into a hole on a full filesystem is a
    SIGBUS, where posix_fallocate's ENOSPC is an error we can report."""
    try:
        os.ftruncate(fd, STATE_SIZE)
        os.posix_fallocate(fd, 0, STATE_SIZE)
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot allocate the state file ({STATE_SIZE} bytes): {e.strerror}") from None
