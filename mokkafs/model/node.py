"""The live node, as one facade: its composition's facts, its mutable records, and the two
doors through which it changes, `validate` and `apply`, which read the table of transitions
(model/transitions.py). What each part means lives with it: the records and their restore in
model/state.py, readings over time in dynamics.py, faults in faults.py, processes and accounting
in accounting.py, what an event did in outcome.py.

Pure: no I/O, no clock; time is the `now` every caller passes.
"""
from __future__ import annotations

import itertools
from collections import deque

from mokkafs.model import dynamics, faults, mig, state
from mokkafs.model.accounting import AccountingRecord
from mokkafs.model.compute import (ComputeFeatures, ComputeLimits, NvmlSupport, compute_features, compute_limits,
                                   nvml_support)
from mokkafs.model.config import SETTINGS
from mokkafs.model.dynamics import EVENT_COUNTERS, Readings
from mokkafs.model.events import Event, InvalidCommand
from mokkafs.model.identity import GpuIdentity, NodeConfig, gpu_identities
from mokkafs.model.nvml_consts import ADDRESSING_MODES
from mokkafs.model.schema import driver_branch
from mokkafs.model.mig import GpuInstance
from mokkafs.model.outcome import Outcome
from mokkafs.model.schema import driver_branch
from mokkafs.model.state import LOG_LIMIT, GpuState, HcaState, LogEntry
from mokkafs.model.topology import Layout, pci_layout
from mokkafs.model.transitions import transition


class Node:
    def __init__(self, config: NodeConfig, now: float) -> None:
        self.config = config
        self.profile = config.profile
        self.identities: list[GpuIdentity] = gpu_identities(config)
        # Facts of the composition, computed once: where every PCI function sits, what each
        # NVLink reaches, the topology levels and CPU masks, the SM limits and the features CUDA
        # reports, the queries NVML answers on this architecture.
        self.layout: Layout = pci_layout(config)
        self.compute: ComputeLimits = compute_limits(self.profile.compute_capability)
        self.features: ComputeFeatures = compute_features(
            self.profile.compute_capability, self.profile.l2_cache_bytes, self.profile.fabric is not None)
        self.nvml_support: NvmlSupport = nvml_support(self.profile.nvml_architecture)
        # nvmlDeviceGetAddressingMode: the board's from branch 570; before it the driver reports
        # None (every capture of 535-565 says None, the A100's at 555 too, whose 570 capture says HMM).
        self.addressing_mode: int = (self.profile.nvml_addressing_mode
                                     if driver_branch(config.composition.driver_version) >= 570
                                     else ADDRESSING_MODES["NONE"])
        # The framebuffer's total and reserved as this driver branch reports them (dynamics.py).
        self.framebuffer: dynamics.Framebuffer = dynamics.framebuffer(
            self.profile, driver_branch(config.composition.driver_version))
        # The persisted records (model/state.py).
        self.gpus: list[GpuState] = [
            GpuState(t0=now, temp0=float(self.profile.thermal.idle_c)) for _ in self.identities
        ]
        self.hcas: list[HcaState] = [HcaState() for _ in range(config.hcas)]
        # The event-reason counters at each GPU's last checkpoint (EVENT_COUNTERS order, ns):
        # live, never persisted, as the driver's own restart from zero at a driver load.
        self._event0_ns: list[tuple[int, ...]] = [(0,) * len(EVENT_COUNTERS) for _ in self.identities]
        # Processes and accounting (model/accounting.py), live, never persisted: (pid, used bytes)
        # of the CUDA processes on each GPU; which MIG instance each runs on, pid -> (GPU
        # instance, compute instance); accounting records by pid, oldest first, and a version per
        # GPU that moves when they change (the publisher rewrites them then); the pids that were
        # running when accounting was switched on, which the driver never accounts.
        self.processes: list[tuple[tuple[int, int], ...]] = [() for _ in self.identities]
        self.process_instances: list[dict[int, tuple[int, int]]] = [{} for _ in self.identities]
        self.accounting: list[dict[int, AccountingRecord]] = [{} for _ in self.identities]
        self.accounting_version: list[int] = [0 for _ in self.identities]
        self.unaccounted: list[set[int]] = [set() for _ in self.identities]
        # Per GPU, the last MIG view computed and what it was computed from (the publisher and the
        # renderers ask on every publish and read; the layout changes far less often).
        self._mig_views: dict[int, tuple] = {}
        self.log: deque[LogEntry] = deque(maxlen=LOG_LIMIT)
        self.generation = 0  # bumped on every applied event; caches key on it
        # Per GPU, bumped on every applied event that targets it (one GPU's, or the node's): what
        # a cache of one GPU's views keys on (only an event's targets change).
        self.gpu_generations: list[int] = [0 for _ in self.identities]
        self.log_seq = 0  # log lines ever appended (the deque keeps the last LOG_LIMIT)
        self.injections: dict[str, int] = {}  # applied events by kind, for metrics

    # --- events -------------------------------------------------------------------------------

    def validate(self, event: Event) -> None:
        """Raise InvalidCommand if `event` cannot apply to this node; never changes state."""
        if event.gpu is not None and event.gpu >= len(self.gpus):
            raise InvalidCommand(f"no GPU {event.gpu} (node has {len(self.gpus)})")
        row = transition(type(event))
        if row is not None and row.validate is not None:
            row.validate(self, event)

    def apply(self, event: Event, now: float, note: str | None = None) -> Outcome:
        """Validate, then apply `event` in one step, by its row of the transitions table, and
        say what it did. `note` (who sent it: `scenario NAME step K: COMMAND`) is logged first, on
        the event's GPU. Refused (InvalidCommand), the node is as it was."""
        self.validate(event)
        row = transition(type(event))
        if row is None:
            raise InvalidCommand(f"unknown event {event!r}")
        targets = tuple(range(len(self.gpus))) if event.gpu is None else (event.gpu,)
        # Readings move on from the inputs that held until now: read each target's at `now`
        # before the handler changes them, and keep them as its checkpoint once it has applied.
        moved = [(i, self.readings(i, now)) for i in targets if now > self.gpus[i].t0]
        outcome = row.apply(self, event, now)
        for i, at in moved:
            self._event0_ns[i] = dynamics.checkpoint(self.gpus[i], at, now)
        lines = outcome.log if note is None else (LogEntry(now, event.gpu, note), *outcome.log)
        self.log.extend(lines)
        self.log_seq += len(lines)
        if row.counted:
            kind = type(event).__name__
            self.injections[kind] = self.injections.get(kind, 0) + 1
        self.generation += 1
        for i in targets:
            self.gpu_generations[i] += 1
        return Outcome(outcome.notifications, lines, outcome.reply, outcome.saturated, targets, event.gpu is None)

    def device_tree_state(self) -> tuple:
        """Everything the sys/, proc/ and dev/ renderers read from the mutable state: which GPUs
        are on the bus, the HCA ports, and each GPU's MIG instances (their capability files and
        device nodes). Those trees are a function of this (and the fixed
        composition), never of time; the mirror re-renders only when it changes, and only the
        capability files and nvidia-caps nodes when only the MIG part (the last) changed.
        tests/test_mirror.py checks the mirror against a fresh render after every event kind."""
        return (
            tuple(g.lost for g in self.gpus),
            tuple((h.port_down, tuple(h.counters.values())) for h in self.hcas),
            tuple((g.mig.enabled, tuple((gi.id, tuple(ci.id for ci in gi.compute)) for gi in g.mig.instances))
                  for g in self.gpus),
        )

    def log_since(self, seq: int) -> list[LogEntry]:
        """The log lines appended after `log_seq` was `seq`."""
        n = min(self.log_seq - seq, len(self.log))
        # From the end: copying the whole log (4096 lines) would cost every event ~25 us.
        return list(itertools.islice(reversed(self.log), n))[::-1] if n > 0 else []

    # --- readings (model/dynamics.py) ---------------------------------------------------------

    def readings(self, i: int, now: float) -> Readings:
        return dynamics.readings(self.profile, self.gpus[i], self.processes[i], self._event0_ns[i], now,
                                 self.framebuffer, driver_bytes=self.mig_idle_bytes(i))

    def temperature_holds(self, i: int, now: float) -> bool:
        """Whether GPU `i`'s readings hold from `now` until the next event but for the counters
        that grow with time (energy, event reasons): its temperature is pinned or at its target."""
        return dynamics.temperature_holds(self.profile, self.gpus[i], now)

    @property
    def driver_branch(self) -> int:
        return driver_branch(self.config.driver_version)

    def mig_idle_bytes(self, i: int) -> int:
        """What GPU `i`'s GPU instances hold at idle together (counted to the GPU's memory used)."""
        tables = self.profile.mig
        return sum(mig.idle_bytes(mig.gi_profile_by_index(tables, g.profile)) for g in self.mig_instances(i))

    def bar1_used_bytes(self, i: int) -> int:
        """GPU `i`'s BAR1 in use: the idle board's mapping, or with MIG on what the driver maps
        then (mig.mig_bar1_used_mib)."""
        mib = (mig.mig_bar1_used_mib(self.profile, self.driver_branch) if self.gpus[i].mig.enabled
               else self.profile.memory.bar1_used_mib)
        return mib << 20

    def power_limit(self, i: int) -> float:
        return dynamics.power_limit(self.profile, self.gpus[i])

    # --- settings (model/config.py) -----------------------------------------------------------

    def setting(self, i: int, name: str) -> object:
        """The value of GPU `i`'s setting `name` (model/config.py) in effect."""
        s = SETTINGS[name]
        value = getattr(self.gpus[i], s.field)
        return s.default(self.profile) if value is None else value

    def ecc_enabled(self, i: int) -> bool:
        """Whether GPU `i` runs with ECC now (the mode of its last reset; `ecc_mode` is pending)."""
        current = self.gpus[i].ecc_mode_current
        return SETTINGS["ecc_mode"].default(self.profile) if current is None else current

    # --- faults (model/faults.py) -------------------------------------------------------------

    @property
    def has_row_remapper(self) -> bool:
        """Ampere and later remap rows; Turing and earlier retire pages (nvidia-smi -q shows which)."""
        return faults.has_row_remapper(self.profile)

    def active_faults(self, i: int) -> list[str]:
        return faults.active_faults(self.gpus[i])

    def health(self, i: int) -> str:
        return faults.health(self.gpus[i])

    # --- MIG (model/mig.py) -------------------------------------------------------------------

    def mig_instances(self, i: int) -> tuple[GpuInstance, ...]:
        """GPU `i`'s GPU instances as every surface lists them: none while the GPU is off the
        bus (they come back with it)."""
        g = self.gpus[i]
        return () if g.lost or not g.mig.enabled else g.mig.instances

    def gi_memory_bytes(self, i: int) -> dict[int, int]:
        """The memory of each of GPU `i`'s GPU instances, by instance id."""
        tables = self.profile.mig
        return {g.id: mig.gi_profile_by_index(tables, g.profile).memory_mib << 20 for g in self.mig_instances(i)}

    def mig_capacity(self, i: int) -> tuple[int, ...]:
        """GPU instances of each profile of the board's table (in its order) that still fit on
        GPU `i`; all zero while MIG is off or the GPU is lost."""
        tables = self.profile.mig
        if tables is None:
            return ()
        st = self.gpus[i].mig
        if not st.enabled or self.gpus[i].lost:
            return (0,) * len(tables.gpu_instance_profiles)
        return self._mig_view(i, ("capacity", st), lambda: tuple(
            mig.remaining_gpu_instances(tables, st, gp) for gp in tables.gpu_instance_profiles))

    def _mig_view(self, i: int, key: tuple, compute):
        cached = self._mig_views.get((i, key[0]))
        if cached is None or cached[0] != key:
            cached = (key, compute())
            self._mig_views[(i, key[0])] = cached
        return cached[1]

    def mig_devices(self, i: int) -> tuple[tuple[mig.GpuInstanceView, ...], tuple[mig.MigDevice, ...]]:
        """GPU `i`'s GPU instances and MIG devices with all their facts (model/mig.py), the
        memory its processes use counted to the instance each runs on."""
        instances = self.mig_instances(i)
        if not instances:
            return (), ()
        # Each instance holds its idle bytes (mig.idle_bytes) besides what its processes use.
        tables = self.profile.mig
        used: dict[int, int] = {g.id: mig.idle_bytes(mig.gi_profile_by_index(tables, g.profile)) for g in instances}
        on = self.process_instances[i]
        for pid, nbytes in self.processes[i]:
            if pid in on:
                used[on[pid][0]] = used.get(on[pid][0], 0) + nbytes
        # Claims from several users may add up past the instance; what it reports used never
        # exceeds what it has (nor its free memory goes below zero).
        room = self.gi_memory_bytes(i)
        used = {gi: min(nbytes, room.get(gi, 0)) for gi, nbytes in used.items()}
        ident = self.identities[i]
        return self._mig_view(i, ("devices", instances, tuple(sorted(used.items()))),
                              lambda: mig.describe(self.profile, ident.uuid, ident.minor, instances, used,
                                                                   self.driver_branch))

    # --- restore (model/state.py) -------------------------------------------------------------

    def check_log_entry(self, entry: LogEntry) -> None:
        """Raise ValueError unless `entry` could have been written by this node."""
        state.check_log_entry(entry, len(self.gpus))

    def restore(self, gpus: list[dict], log: list[LogEntry]) -> None:
        """Load saved per-GPU states (`GpuState.to_dict`) and log lines into this node. Raises
        ValueError on anything that does not fit; either all of it loads or nothing changes."""
        states = state.restored_gpus(self.profile, gpus, len(self.gpus), self.validate)
        state.check_log(log, len(self.gpus))
        self.gpus = states
        self.log = deque(log, maxlen=LOG_LIMIT)
        self.generation += 1
        self.gpu_generations = [n + 1 for n in self.gpu_generations]

    def restore_hcas(self, hcas: list[dict]) -> None:
        """Load saved HCA states (`HcaState.to_dict`); all or nothing, ValueError on a misfit."""
        self.hcas = state.restored_hcas(hcas, len(self.hcas))
        self.generation += 1
