"""The live node: per-GPU state, how events change it, and what it reads at time `now`.

Pure: no I/O, no clock. Time-varying signals are closed-form functions of a per-GPU checkpoint
(time, temperature, energy) and the inputs that hold since it (utilization, pins, limits), so
sampling an hour later costs the same as sampling now. Every event first moves the checkpoint
to `now`, then changes inputs; that keeps temperature continuous and energy exact.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import typing

from pydantic import ConfigDict, ValidationError, create_model

from mokkafs.model.commands import command, gpu
from mokkafs.model.counters import (
    EccCounter,
    EccKind,
    EccScope,
    MemoryLocation,
    NvLinkCounter,
    ecc_total,
    link_from_key,
    zero_ecc,
    zero_nvlink,
)
from mokkafs.model.events import (
    PIN_SIGNALS,
    THROTTLE_REASONS,
    ClearAccounting,
    ClearEcc,
    Event,
    IB_ERROR_COUNTERS,
    IbPortCommand,
    InjectEcc,
    InjectXid,
    InvalidCommand,
    NvLinkCommand,
    Pin,
    Reset,
    SetLost,
    SetProcesses,
)
from mokkafs.model.compute import ComputeLimits, compute_limits
from mokkafs.model.config import SETTINGS, Configure, GpuIsLost, NotSupported
from mokkafs.model.identity import GpuIdentity, NodeConfig, gpu_identities
from mokkafs.model import mig
from mokkafs.model.mig import GpuInstance, MigEvent, MigState
from mokkafs.model.topology import Layout, pci_layout
from mokkafs.model.xid import Remap, kernel_log_line, xid_rule

THERMAL_TAU_S = 40.0  # first-order lag of die temperature behind power
# Accounting records a GPU keeps, running and exited (nvmlDeviceGetAccountingBufferSize); the
# real driver's buffer holds 4000, and the oldest goes first when it is full.
ACCOUNTING_BUFFER = 4000
LOG_LIMIT = 4096  # node event-log lines kept (and persisted)

# NVML event type bits (nvml.h nvmlEventType*), delivered to nvmlEventSetWait callers.
EVENT_SBE = 0x1
EVENT_DBE = 0x2
EVENT_XID = 0x8

# The width, in bits, of each counter as the real surface reports it; a counter stops at
# all-ones there (saturates) instead of wrapping or growing past what its reader can hold.
# Saturation and restore validation both read this table, so whatever the daemon counted it
# can restore. The shared state's C fields (mokka_state.h) are at least this wide
# (tests/test_model.py checks it against the header).
COUNTER_BITS = {
    "ecc": 64,  # nvmlDeviceGetMemoryErrorCounter: unsigned long long
    "retired_pages": 32,  # nvmlDeviceGetRetiredPages: unsigned int *pageCount
    "remapped_rows": 32,  # nvmlDeviceGetRemappedRows: unsigned int corrRows, uncRows
    "nvlink_errors": 64,  # nvmlDeviceGetNvLinkErrorCounter: unsigned long long
    "pcie_replay": 32,  # nvmlDeviceGetPcieReplayCounter: unsigned int
    "xid_counts": 64,  # mokkafs' own count; no NVML surface
    # InfiniBand PortCounters (IBA spec, PMA attribute 0x0012): the kernel's ports/1/counters
    # files show these fields, which stop at all-ones.
    "ib.symbol_error": 16,
    "ib.link_error_recovery": 8,
    "ib.link_downed": 8,
    "ib.port_rcv_errors": 16,
    "ib.port_rcv_remote_physical_errors": 16,
    "ib.port_rcv_switch_relay_errors": 16,
    "ib.port_xmit_discards": 16,
    "ib.port_xmit_constraint_errors": 8,
    "ib.port_rcv_constraint_errors": 8,
    "ib.local_link_integrity_errors": 4,
    "ib.excessive_buffer_overrun_errors": 4,
    "ib.VL15_dropped": 16,
}


def counter_max(family: str) -> int:
    return (1 << COUNTER_BITS[family]) - 1


# Times a saved state may hold: after the epoch, before the year 10000 (what the event files
# render as ISO 8601). A NaN or 1e300 would pass a type check and fail every later read.
MAX_TIME = 253_402_300_799.0
# mokka_state.h energy_mj is a uint64_t, and energy keeps growing after a restore: half its
# range leaves millennia of headroom (2^62 mJ is 14,000 years at 10 kW).
MAX_ENERGY_MJ = float(1 << 62)
MAX_LOG_TEXT = 1024  # no line the model writes is near this

# Clock factors while a slowdown reason is active (the driver steps clocks down; these are
# plausible, not measured).
_SLOWDOWN_FACTOR = {"hw_slowdown": 0.5, "sw_thermal_slowdown": 0.8, "sw_power_cap": 0.9}


@dataclass(frozen=True)
class Notification:
    """Something that happened, for subscribers (NVML event sets, metrics, kmsg)."""

    gpu: int
    event_type: int
    data: int
    gi: int | None = None  # the MIG instance an Xid names (nvmlEventData_t.gpuInstanceId)
    ci: int | None = None


@dataclass(frozen=True)
class LogEntry:
    time: float
    gpu: int | None
    text: str


@dataclass(frozen=True)
class Readings:
    """One GPU's observable values at one instant; every surface renders from this."""

    temperature_c: float
    memory_temperature_c: float | None
    power_w: float
    power_limit_w: float
    energy_mj: float
    util_gpu: int
    util_mem: int
    clock_graphics: int
    clock_sm: int
    clock_mem: int
    clock_video: int
    throttle_mask: int
    memory_total_mib: int
    memory_reserved_mib: int
    memory_used_mib: int
    # nanoseconds each of EVENT_COUNTERS' reasons has held the clocks down since the daemon
    # started (nvidia-smi's "Clocks Event Reasons Counters"; NVML fields 244/245/269-271)
    event_ns: tuple[int, ...] = (0, 0, 0, 0, 0)

    @property
    def memory_free_mib(self) -> int:
        return self.memory_total_mib - self.memory_reserved_mib - self.memory_used_mib

    @property
    def throttle_reasons(self) -> list[str]:
        return [name for name, bit in THROTTLE_REASONS.items() if self.throttle_mask & bit]


_ECC_KEYS = {counter: counter.key for counter in zero_ecc()}  # their stored spellings, made once
_PAIRS = ("locked_clocks", "applications_clocks", "locked_memory_clocks")  # tuples, stored as JSON lists


@dataclass
class AccountingRecord:
    """One process's accounting on one GPU (nvmlAccountingStats_t), kept after it exits. The
    utilizations are the GPU's, averaged over the process's life from what the model knew at
    each fold of the process table (the real driver samples; the model has no per-process split)."""

    pid: int
    start: float  # when the daemon first saw it on this GPU
    max_memory: int = 0  # bytes, the most it ever held
    end: float | None = None  # when it was gone; None while it runs
    last: float = 0.0  # the last sample's time
    last_util: tuple[int, int] = (0, 0)  # GPU and memory utilization since `last`
    util_s: tuple[float, float] = (0.0, 0.0)  # percent-seconds until `last`

    def sample(self, now: float, util: tuple[int, int]) -> None:
        dt = max(0.0, now - self.last)
        self.util_s = (self.util_s[0] + self.last_util[0] * dt, self.util_s[1] + self.last_util[1] * dt)
        self.last, self.last_util = max(now, self.last), util

    def utilization(self) -> tuple[int, int]:
        life = self.last - self.start
        if life <= 0:
            return self.last_util
        return round(self.util_s[0] / life), round(self.util_s[1] / life)

    @property
    def time_ms(self) -> int:
        """What NVML reports as `time`: the process's life in ms once it exited, 0 while it runs
        (real drivers fill it in at exit)."""
        return 0 if self.end is None else int(round((self.end - self.start) * 1000))

# The reasons whose time the driver counts, in NVML's field order: SW power cap (244), sync
# boost (245), SW thermal (269), HW thermal (270), HW power brake (271).
EVENT_COUNTERS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                  "hw_power_brake_slowdown")


@dataclass
class GpuState:
    """The mutable, persisted part of one GPU. Identity lives in GpuIdentity."""

    t0: float
    temp0: float
    energy0_mj: float = 0.0
    lost: bool = False
    needs_reset: bool = False
    pins: dict[str, tuple] = field(default_factory=dict)
    # Settings (model/config.py): None is the default, what a driver load sets.
    power_limit_w: float | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None
    locked_clocks: tuple[int, int] | None = None
    ecc_mode: bool | None = None  # pending: what the next reset brings
    ecc_mode_current: bool | None = None  # in effect since the last reset
    accounting_mode: bool | None = None
    applications_clocks: tuple[int, int] | None = None  # (memory, graphics) MHz
    locked_memory_clocks: tuple[int, int] | None = None
    ecc: dict[EccCounter, int] = field(default_factory=zero_ecc)
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: bool = False
    remapped_corr: int = 0
    remapped_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    nvlink_down: list[int] = field(default_factory=list)
    nvlink_errors: dict[int, dict[NvLinkCounter, int]] = field(default_factory=dict)  # links with errors
    pcie_replay: int = 0
    last_xid: int | None = None
    last_xid_time: float | None = None
    xid_counts: dict[str, int] = field(default_factory=dict)
    mig: MigState = field(default_factory=MigState)  # MIG mode and instances (model/mig.py)

    def to_dict(self) -> dict:
        """A deep copy, JSON-ready: later changes to this state never show through it. Counter
        keys take their stored spellings (`"volatile.corrected.dram"`, link `"3"`, `"replay"`).
        Every event persists its GPU's record through here, before its writer hears back: each
        container is copied by hand (copy.deepcopy of the 32 ECC counters cost ~0.5 ms)."""
        data = dict(self.__dict__)  # the scalars; the containers are replaced below
        data["pins"] = {k: list(v) for k, v in self.pins.items()}
        for key in _PAIRS:
            data[key] = None if data[key] is None else list(data[key])
        data["ecc"] = {_ECC_KEYS[counter]: n for counter, n in self.ecc.items()}
        data["nvlink_down"] = list(self.nvlink_down)
        data["nvlink_errors"] = {
            str(link): {counter.spelling: n for counter, n in errs.items()} for link, errs in self.nvlink_errors.items()
        }
        data["xid_counts"] = dict(self.xid_counts)
        data["mig"] = self.mig.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "GpuState":
        """Raises ValueError (pydantic's, naming the field) on a record of the wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"a GPU record must be a mapping, got {type(data).__name__}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        # MIG's record has its own reader; absent (a record from before MIG): MIG off.
        mig_record = known.pop("mig", None)
        if isinstance(known.get("pins"), dict):  # JSON has no tuples
            known["pins"] = {k: tuple(v) if isinstance(v, list) else v for k, v in known["pins"].items()}
        for key in _PAIRS:
            if isinstance(known.get(key), list):
                known[key] = tuple(known[key])
        # Counters absent from the record are zero (stored spellings until _typed_counters).
        known.setdefault("ecc", {})
        known.setdefault("nvlink_errors", {})
        # Strict: a "5" or a true where a number belongs is a corrupt file, not a number.
        state = _validate(cls, _GPU_RECORD, known)
        _typed_counters(state)
        _check_ranges(state)
        if mig_record is not None:
            state.mig = MigState.from_dict(mig_record)
        return state


class RestoreError(ValueError):
    """A saved record that does not fit this node: `part` ("gpu", "hca" or "log") and `index`
    say which record (the log's index counts lines from 1), the message says which key and why."""

    def __init__(self, part: str, index: int, message: str) -> None:
        super().__init__(message)
        self.part, self.index = part, index


def _strict_record(cls, **stored):
    """A strict pydantic model of dataclass `cls`'s fields: a "5" or a true where a number
    belongs is a corrupt file, not a number (pydantic's lax mode would take both). `stored`
    gives the JSON type of a field whose in-memory type differs (typed counter keys)."""
    hints = {**typing.get_type_hints(cls), **stored}
    fields = {name: (hints[name], ...) for name in cls.__dataclass_fields__}
    return create_model(f"{cls.__name__}Record", __config__=ConfigDict(strict=True, extra="ignore"), **fields)


def _validate(cls, record, data: dict):
    """`cls(**data)` checked by `record`, or pydantic's verdict as one short line,
    `key: problem`, without echoing the input. Missing keys take the dataclass defaults."""
    for name, f in cls.__dataclass_fields__.items():
        if name not in data:
            if f.default_factory is not dataclasses.MISSING:
                data[name] = f.default_factory()
            elif f.default is not dataclasses.MISSING:
                data[name] = f.default
    try:
        checked = record.model_validate(data)
        return cls(**{name: getattr(checked, name) for name in cls.__dataclass_fields__})
    except ValidationError as e:
        first = e.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part)[:40] for part in first["loc"]) or "record"
        raise ValueError(f"{where}: {first['msg'][:120]}") from None


def valid_time(t: object) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= MAX_TIME


def _check_counter(key: str, family: str, value: int) -> None:
    if not 0 <= value <= counter_max(family):
        raise ValueError(f"{key}: {value} is outside 0..{counter_max(family)} ({COUNTER_BITS[family]} bits)")


def _check_ranges(state: "GpuState") -> None:
    """A record of the right types can still hold what no event could make (a negative
    counter, a NaN time); refuse it here, not in a renderer or the publisher later. Each
    message starts with the key. Pins and the power limit need the profile: `Node.restore`."""
    for key in ("retired_sbe", "retired_dbe"):
        _check_counter(key, "retired_pages", getattr(state, key))
    for key in ("remapped_corr", "remapped_unc"):
        _check_counter(key, "remapped_rows", getattr(state, key))
    _check_counter("pcie_replay", "pcie_replay", state.pcie_replay)
    for counter, value in state.ecc.items():
        _check_counter(f"ecc.{counter.key}", "ecc", value)
    for code, value in state.xid_counts.items():
        if not (code.isascii() and code.isdigit() and 1 <= int(code) <= 999):
            raise ValueError(f"xid_counts: {code[:20]!r} is not an Xid")
        _check_counter(f"xid_counts.{code}", "xid_counts", value)
    for link, errs in state.nvlink_errors.items():
        for counter, value in errs.items():
            _check_counter(f"nvlink_errors.{link}.{counter.spelling}", "nvlink_errors", value)
    if state.last_xid is not None and not 1 <= state.last_xid <= 999:
        raise ValueError(f"last_xid: {state.last_xid} is not an Xid")
    if (state.last_xid is None) != (state.last_xid_time is None):
        raise ValueError("last_xid_time: set without last_xid, or missing beside it")
    for key in ("t0", "last_xid_time"):
        t = getattr(state, key)
        if t is not None and not valid_time(t):
            raise ValueError(f"{key}: {t} is not a time between 1970 and 9999")
    if not (math.isfinite(state.temp0) and -100 <= state.temp0 <= 1000):
        raise ValueError(f"temp0: {state.temp0} is not a plausible temperature")
    if not (math.isfinite(state.energy0_mj) and 0 <= state.energy0_mj <= MAX_ENERGY_MJ):
        raise ValueError(f"energy0_mj: {state.energy0_mj} is outside 0..2^62")
    if any(not 0 <= link < 18 for link in state.nvlink_down):
        raise ValueError("nvlink_down: names a link beyond 17")
    if len(set(state.nvlink_down)) != len(state.nvlink_down):
        raise ValueError("nvlink_down: names a link twice")


def _typed_counters(state: "GpuState") -> None:
    """Turn the stored spellings of the ECC and NVLink counters into typed keys, each counter
    that is not there zero; ValueError (key first) on a spelling no counter has."""
    ecc = zero_ecc()
    for key, value in state.ecc.items():
        try:
            ecc[EccCounter.from_key(key)] = value
        except ValueError:
            raise ValueError(f"ecc: unknown ECC counter {key[:40]!r}") from None
    nvlink: dict[int, dict[NvLinkCounter, int]] = {}
    for key, errs in state.nvlink_errors.items():
        try:
            link = link_from_key(key)
        except ValueError:
            raise ValueError(f"nvlink_errors: {key[:20]!r} is not a link 0..17") from None
        nvlink[link] = zero_nvlink()
        for name, value in errs.items():
            try:
                nvlink[link][NvLinkCounter.from_spelling(name)] = value
            except ValueError:
                raise ValueError(f"nvlink_errors.{key}: unknown counter {name[:40]!r}") from None
    state.ecc, state.nvlink_errors = ecc, nvlink


_GPU_RECORD = _strict_record(GpuState, ecc=dict[str, int], nvlink_errors=dict[str, dict[str, int]], mig=object)


@dataclass
class HcaState:
    """The mutable, persisted part of one InfiniBand HCA (one port, port 1)."""

    port_down: bool = False
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(IB_ERROR_COUNTERS, 0))

    def to_dict(self) -> dict:
        return {"port_down": self.port_down, "counters": dict(self.counters)}

    @classmethod
    def from_dict(cls, data: dict) -> "HcaState":
        if not isinstance(data, dict):
            raise ValueError(f"an HCA record must be a mapping, got {type(data).__name__}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        state = _validate(cls, _HCA_RECORD, known)
        unknown = set(state.counters) - set(IB_ERROR_COUNTERS)
        if unknown:
            raise ValueError(f"counters: unknown InfiniBand counter {sorted(unknown)[0][:40]!r}")
        state.counters = {**dict.fromkeys(IB_ERROR_COUNTERS, 0), **state.counters}
        for name, value in state.counters.items():
            _check_counter(f"counters.{name}", f"ib.{name}", value)
        return state


_HCA_RECORD = _strict_record(HcaState)


class Node:
    def __init__(self, config: NodeConfig, now: float) -> None:
        self.config = config
        self.profile = config.profile
        self.identities: list[GpuIdentity] = gpu_identities(config)
        # Facts of the composition, computed once: where every PCI function sits, what each
        # NVLink reaches, the topology levels and CPU masks, the SM limits CUDA reports.
        self.layout: Layout = pci_layout(config)
        self.compute: ComputeLimits = compute_limits(self.profile.compute_capability)
        self.gpus: list[GpuState] = [
            GpuState(t0=now, temp0=float(self.profile.thermal.idle_c)) for _ in self.identities
        ]
        self.hcas: list[HcaState] = [HcaState() for _ in range(config.hcas)]
        # The event-reason counters at each GPU's last checkpoint (EVENT_COUNTERS order, ns):
        # live, never persisted, as the driver's own restart from zero at a driver load.
        self._event0_ns: list[tuple[int, ...]] = [(0,) * len(EVENT_COUNTERS) for _ in self.identities]
        # (pid, used bytes) of the CUDA processes on each GPU: live, never persisted (the
        # processes of a previous daemon's lifetime are read again from the process table).
        self.processes: list[tuple[tuple[int, int], ...]] = [() for _ in self.identities]
        # Accounting records by pid, oldest first (live, never persisted: the driver keeps them
        # in memory), a version per GPU that moves when they change (the publisher rewrites
        # them then), and the pids that were running when accounting was switched on, which
        # the driver never accounts.
        self.accounting: list[dict[int, AccountingRecord]] = [{} for _ in self.identities]
        self.accounting_version: list[int] = [0 for _ in self.identities]
        self._unaccounted: list[set[int]] = [set() for _ in self.identities]
        # Which MIG instance each of those processes runs on: pid -> (GPU instance, compute instance).
        self.process_instances: list[dict[int, tuple[int, int]]] = [{} for _ in self.identities]
        self.reply = ""  # what the last applied event answers its sender (a MIG create's new ids)
        # Per GPU, the last MIG view computed and what it was computed from (the publisher and the
        # renderers ask on every publish and read; the layout changes far less often).
        self._mig_views: dict[int, tuple] = {}
        self.log: deque[LogEntry] = deque(maxlen=LOG_LIMIT)
        self.generation = 0  # bumped on every applied event; caches key on it
        self.log_seq = 0  # log lines ever appended (the deque keeps the last LOG_LIMIT)
        self.injections: dict[str, int] = {}  # applied events by kind, for metrics
        # Counters the last `apply` brought to their maximum (COUNTER_BITS), by name: the
        # controller logs each once. A counter that stays saturated is not named again.
        self.saturated: list[str] = []

    # --- events -------------------------------------------------------------------------------

    def validate(self, event: Event) -> None:
        """Raise InvalidCommand if `event` cannot apply to this node; never changes state."""
        if event.gpu is not None and event.gpu >= len(self.gpus):
            raise InvalidCommand(f"no GPU {event.gpu} (node has {len(self.gpus)})")
        if isinstance(event, Pin) and event.values:
            self._validate_pin(event)
        if isinstance(event, NvLinkCommand) and event.link >= self.profile.nvlink.links:
            if event.action == "reset_errors" and not self.profile.nvlink.links:
                # nvmlDeviceResetNvLinkErrorCounters on a board without NVLink: NOT_SUPPORTED.
                raise NotSupported(f"{self.profile.name} has no NVLinks")
            raise InvalidCommand(f"{self.profile.name} has {self.profile.nvlink.links} NVLinks, no link {event.link}")
        if isinstance(event, Reset) and event.idle:
            # NVIDIA's reset: the driver refuses a GPU a client holds (nvidia-smi -r: "In use by
            # another client"); the control files' reset (not idle) resets under processes.
            for i in range(len(self.gpus)) if event.gpu is None else [event.gpu]:
                if self.processes[i]:
                    raise mig.InUse(f"GPU {i} is in use: {len(self.processes[i])} process(es) on it")
        if isinstance(event, IbPortCommand) and event.hca >= len(self.hcas):
            raise InvalidCommand(f"no HCA mlx5_{event.hca} (node has {len(self.hcas)})")
        if isinstance(event, (Configure, ClearEcc, ClearAccounting)) and self.gpus[event.gpu].lost:
            raise GpuIsLost(f"gpu{event.gpu} has fallen off the bus")
        if isinstance(event, Configure) and event.value is not None:
            SETTINGS[event.setting].check_board(self.profile, event.value)
        if isinstance(event, ClearEcc) and not self.ecc_enabled(event.gpu):
            # nvml.h: clearing "requires ECC Mode to be enabled".
            raise NotSupported(f"gpu{event.gpu} runs with ECC off: there are no ECC counters to clear")
        if isinstance(event, MigEvent):
            # What the board allows; what the GPU's MIG state allows is apply's to say (a
            # scenario's `mig create` after its `mig enable` is checked at load, before either).
            mig.check_board(self.profile, event)
        if isinstance(event, SetProcesses):
            pids = {pid for pid, _ in event.processes}
            if any(pid not in pids for pid, _, _ in event.instances):
                raise InvalidCommand("an instance names a pid that is not in the process list")

    def _mig_outcome(self, event: MigEvent) -> mig.Outcome:
        """What `event` would do to its GPU's MIG state now; raises with NVML's error."""
        if self.gpus[event.gpu].lost:
            raise GpuIsLost(f"gpu{event.gpu} has fallen off the bus")
        return mig.apply(self.profile, self.gpus[event.gpu].mig, event, gpu_busy=bool(self.processes[event.gpu]),
                         processes_on=self.process_instances[event.gpu])

    def _validate_pin(self, pin: Pin) -> None:
        p = self.profile
        if pin.signal == "memory_used" and pin.values[0] > p.memory.total_mib - p.memory.reserved_mib:
            raise InvalidCommand(f"memory_used at most {p.memory.total_mib - p.memory.reserved_mib} MiB")
        if pin.signal == "clocks":
            sm, mem = pin.values
            if not (0 < sm <= p.clocks.max_sm and 0 < mem <= p.clocks.max_mem):
                raise InvalidCommand(f"clocks must be 1..{p.clocks.max_sm} (sm) and 1..{p.clocks.max_mem} (mem) MHz")

    def apply(self, event: Event, now: float, note: str | None = None) -> list[Notification]:
        """Validate, then apply `event` in one step. Returns what subscribers must be told.
        `note` (who sent it: `scenario NAME step K: COMMAND`) is logged first, on the event's GPU.
        A MIG event is also refused here, before anything changes, when the GPU's MIG state does
        not allow it (model/mig.py)."""
        self.validate(event)
        outcome = self._mig_outcome(event) if isinstance(event, MigEvent) else None
        if isinstance(event, InjectXid) and event.gi is not None:
            self._check_instance(event.gpu, event.gi, event.ci)
        if note is not None:
            self._log(now, event.gpu, note)
        self.saturated = []
        self.reply = ""
        targets = range(len(self.gpus)) if event.gpu is None else [event.gpu]
        for i in targets:
            self._checkpoint(i, now)
        notes: list[Notification] = []
        if isinstance(event, InjectXid):
            notes = self._xid(event.gpu, event.code, now, event.gi, event.ci)
        elif isinstance(event, InjectEcc):
            notes = self._ecc(event, now)
        elif isinstance(event, Pin):
            self._pin(event, now)
        elif isinstance(event, SetLost):
            self._set_lost(event.gpu, event.lost, now)
        elif isinstance(event, NvLinkCommand):
            self._nvlink(event, now)
        elif isinstance(event, Configure):
            self._configure(event, now)
        elif isinstance(event, ClearEcc):
            self._clear_ecc(event, now)
        elif isinstance(event, ClearAccounting):
            self._clear_accounting(event.gpu, now)
        elif isinstance(event, Reset):
            for i in targets:
                self._reset(i, now, driver_reload=event.gpu is None)
            if event.gpu is None:
                self._reset_hcas(now)
        elif isinstance(event, IbPortCommand):
            self._ib_port(event, now)
        elif isinstance(event, SetProcesses):
            # Bookkeeping, not a fault: neither logged nor counted as an injection.
            self._account(event.gpu, event.processes, now)
            self.processes[event.gpu] = event.processes
            self.process_instances[event.gpu] = {pid: (gi, ci) for pid, gi, ci in event.instances}
        elif isinstance(event, MigEvent):
            self.gpus[event.gpu].mig = outcome.state
            self.reply = outcome.reply
            self._log(now, event.gpu, f"mokka: gpu{event.gpu} {outcome.log}")
        else:  # pragma: no cover - every event class is handled above
            raise InvalidCommand(f"unknown event {event!r}")
        if not isinstance(event, SetProcesses):
            kind = type(event).__name__
            self.injections[kind] = self.injections.get(kind, 0) + 1
        self.generation += 1
        return notes

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

    def _add(self, name: str, family: str, value: int, n: int) -> int:
        """`value + n`, stopping at the counter's maximum as the real counter does."""
        cap = counter_max(family)
        if value < cap <= value + n:
            self.saturated.append(name)
        return min(value + n, cap)

    def log_since(self, seq: int) -> list[LogEntry]:
        """The log lines appended after `log_seq` was `seq`."""
        n = min(self.log_seq - seq, len(self.log))
        # From the end: copying the whole log (4096 lines) would cost every event ~25 us.
        return list(itertools.islice(reversed(self.log), n))[::-1] if n > 0 else []

    def _log(self, now: float, gpu: int | None, text: str) -> None:
        self.log.append(LogEntry(now, gpu, text))
        self.log_seq += 1

    def _check_instance(self, i: int, gi: int, ci: int | None) -> None:
        """An Xid names a MIG instance of GPU i that exists now (NotFound otherwise)."""
        for g in self.mig_instances(i):
            if g.id == gi:
                if ci is not None:
                    g.ci(ci)
                return
        raise mig.NotFound(f"gpu{i} has no GPU instance {gi}")

    def _xid(self, i: int, code: int, now: float, gi: int | None = None, ci: int | None = None) -> list[Notification]:
        g, ident = self.gpus[i], self.identities[i]
        rule = xid_rule(code)  # what this Xid does: a row of the catalogue (model/xid.py)
        details: dict = {}
        notes = [Notification(i, EVENT_XID, code, gi, ci)]
        if rule.ecc is not None:
            self._count_ecc(i, rule.ecc.kind, rule.ecc.location, rule.ecc.count)
            event = EVENT_DBE if rule.ecc.kind is EccKind.UNCORRECTED else EVENT_SBE
            notes.append(Notification(i, event, rule.ecc.count))
        if rule.remap is Remap.PENDING:
            self._record_remap_or_retire(i, uncorrectable=True)
        elif rule.remap is Remap.FAILED:
            if self.has_row_remapper:
                g.remap_failure = True
            else:
                g.retired_pending = True
        if rule.nvlink_errors:
            link = self._first_up_link(g)
            details["link"] = link
            self._count_nvlink(i, link, rule.nvlink_errors, 1)
        if rule.lost:
            g.lost = True
        if rule.needs_reset:
            g.needs_reset = True
        g.last_xid, g.last_xid_time = code, now
        g.xid_counts[str(code)] = self._add(f"gpu{i} xid_counts.{code}", "xid_counts", g.xid_counts.get(str(code), 0), 1)
        self._log(now, i, kernel_log_line(ident.bdf.xid, code, gi, ci, **details))
        return notes

    @property
    def has_row_remapper(self) -> bool:
        """Ampere and later remap rows; Turing and earlier retire pages (nvidia-smi -q shows which)."""
        return self.profile.architecture not in ("Turing",)

    def _record_remap_or_retire(self, i: int, uncorrectable: bool) -> None:
        g = self.gpus[i]
        if self.has_row_remapper:
            key = "remapped_unc" if uncorrectable else "remapped_corr"
            setattr(g, key, self._add(f"gpu{i} {key}", "remapped_rows", getattr(g, key), 1))
            g.remap_pending = True
        else:
            key = "retired_dbe" if uncorrectable else "retired_sbe"
            setattr(g, key, self._add(f"gpu{i} {key}", "retired_pages", getattr(g, key), 1))
            g.retired_pending = True

    def _first_up_link(self, g: GpuState) -> int:
        for link in range(self.profile.nvlink.links):
            if link not in g.nvlink_down:
                return link
        return 0

    def _count_ecc(self, i: int, kind: EccKind, location: MemoryLocation, count: int) -> None:
        ecc = self.gpus[i].ecc
        for scope in EccScope:
            key = EccCounter(scope, kind, location)
            ecc[key] = self._add(f"gpu{i} ecc.{key.key}", "ecc", ecc[key], count)

    def _count_nvlink(self, i: int, link: int, counters: tuple[NvLinkCounter, ...], count: int) -> None:
        errs = self.gpus[i].nvlink_errors.setdefault(link, zero_nvlink())
        for c in counters:
            errs[c] = self._add(f"gpu{i} nvlink_errors.{link}.{c.spelling}", "nvlink_errors", errs[c], count)

    def _ecc(self, e: InjectEcc, now: float) -> list[Notification]:
        self._count_ecc(e.gpu, EccKind.from_short(e.kind), MemoryLocation.from_spelling(e.location), e.count)
        self._log(now, e.gpu, f"mokka: gpu{e.gpu} {e.count} {e.kind.upper()} ECC error(s) in {e.location}")
        if e.kind == "dbe":
            if e.location == "dram":
                self._record_remap_or_retire(e.gpu, uncorrectable=True)
            return [Notification(e.gpu, EVENT_DBE, e.count)]
        return [Notification(e.gpu, EVENT_SBE, e.count)]

    def _pin(self, e: Pin, now: float) -> None:
        g = self.gpus[e.gpu]
        if e.values is None:
            g.pins.pop(e.signal, None)
            self._log(now, e.gpu, f"mokka: gpu{e.gpu} {e.signal} auto")
        else:
            g.pins[e.signal] = e.values
            shown = " ".join(str(v) for v in e.values) or "none"
            self._log(now, e.gpu, f"mokka: gpu{e.gpu} {e.signal} pinned {shown}")

    def _set_lost(self, i: int, lost: bool, now: float) -> None:
        g = self.gpus[i]
        if lost and not g.lost:
            # Writing `lost` is the same fault as Xid 79, with the same consequences and log line.
            self._xid(i, 79, now)
        elif not lost and g.lost:
            g.lost = False
            self._log(now, i, f"mokka: gpu{i} back on the bus")

    def _nvlink(self, e: NvLinkCommand, now: float) -> None:
        g = self.gpus[e.gpu]
        if e.action == "down" and e.link not in g.nvlink_down:
            g.nvlink_down = sorted(g.nvlink_down + [e.link])
        elif e.action == "up" and e.link in g.nvlink_down:
            g.nvlink_down = [link for link in g.nvlink_down if link != e.link]
        elif e.action == "errors":
            self._count_nvlink(e.gpu, e.link, (NvLinkCounter.REPLAY, NvLinkCounter.CRC_FLIT), e.count)
        elif e.action == "reset_errors":
            g.nvlink_errors.pop(e.link, None)
        self._log(now, e.gpu, f"mokka: gpu{e.gpu} nvlink {e.link} {e.action}{f' {e.count}' if e.count else ''}")

    def setting(self, i: int, name: str) -> object:
        """The value of GPU `i`'s setting `name` (model/config.py) in effect."""
        s = SETTINGS[name]
        value = getattr(self.gpus[i], s.field)
        return s.default(self.profile) if value is None else value

    def _configure(self, e: Configure, now: float) -> None:
        s = SETTINGS[e.setting]
        default = s.default(self.profile)
        # A value equal to the default is stored as the default: a reset or a new default
        # (another driver) then has nothing to undo.
        setattr(self.gpus[e.gpu], s.field, None if e.value == default else e.value)
        value = default if e.value is None else e.value
        self._log(now, e.gpu, f"mokka: gpu{e.gpu} {s.name} {s.spell(value)}{' (default)' if value == default else ''}")
        if s.name == "accounting":
            self._accounting_switched(e.gpu, bool(value))

    def ecc_enabled(self, i: int) -> bool:
        """Whether GPU `i` runs with ECC now (the mode of its last reset; `ecc_mode` is pending)."""
        current = self.gpus[i].ecc_mode_current
        return SETTINGS["ecc_mode"].default(self.profile) if current is None else current

    def _clear_ecc(self, e: ClearEcc, now: float) -> None:
        ecc = self.gpus[e.gpu].ecc
        scope = EccScope.VOLATILE if e.scope == "volatile" else EccScope.AGGREGATE
        for counter in ecc:
            if counter.scope is scope:
                ecc[counter] = 0
        self._log(now, e.gpu, f"mokka: gpu{e.gpu} {e.scope} ECC counts cleared")

    # --- accounting ---------------------------------------------------------------------------

    def _account(self, i: int, procs: tuple[tuple[int, int], ...], now: float) -> None:
        """Fold GPU `i`'s new process list into its accounting records: a new pid starts one, a
        running one's peak memory grows, a pid no longer listed has exited."""
        if not self.setting(i, "accounting"):
            return
        book, util = self.accounting[i], self._utilization(self.gpus[i])
        live = dict(procs)
        self._unaccounted[i] &= set(live)  # a pid running at the switch-on, once gone, is a new process
        changed = False
        for pid, rec in list(book.items()):
            if rec.end is None and pid not in live:
                rec.sample(now, util)
                rec.end = now
                changed = True
        for pid, used in live.items():
            if pid in self._unaccounted[i]:
                continue
            rec = book.get(pid)
            if rec is None or rec.end is not None:
                book.pop(pid, None)  # a pid reused after its first process exited
                rec = book[pid] = AccountingRecord(pid, start=now, last=now, last_util=util)
                changed = True
            else:
                rec.sample(now, util)
            if used > rec.max_memory:
                rec.max_memory = used
                changed = True
        while len(book) > ACCOUNTING_BUFFER:
            del book[next(iter(book))]
        if changed:
            self.accounting_version[i] += 1

    def _accounting_switched(self, i: int, on: bool) -> None:
        """Switched on, the processes already running are not accounted (as the driver does);
        switched off, every record goes (nvml.h: disabling clears the accounting pids)."""
        if on:
            self._unaccounted[i] = {pid for pid, _ in self.processes[i]}
        else:
            self._unaccounted[i] = set()
            if self.accounting[i]:
                self.accounting[i] = {}
                self.accounting_version[i] += 1

    def _clear_accounting(self, i: int, now: float) -> None:
        book = self.accounting[i]
        kept = {pid: rec for pid, rec in book.items() if rec.end is None}
        if len(kept) != len(book):
            self.accounting[i] = kept
            self.accounting_version[i] += 1
        self._log(now, i, f"mokka: gpu{i} accounting records of exited processes cleared")

    def _reset(self, i: int, now: float, driver_reload: bool = False) -> None:
        """What a GPU reset does: the GPU comes back, volatile counters clear, pending row remaps
        and page retirements take effect, links retrain, pins return to the simulated curves,
        settings return to their defaults but those the driver keeps (on a node reset, a driver
        reload, only those the board keeps), a pending ECC mode takes effect. Aggregate (InfoROM) counters, remapped rows and a remap
        failure stay, as on a real board."""
        g = self.gpus[i]
        # A pending setting (ECC mode) takes effect: the board comes up with it.
        g.ecc_mode_current = g.ecc_mode
        for s in SETTINGS.values():
            if not (s.kept_by_node_reset or (not driver_reload and s.kept_by_gpu_reset)):
                setattr(g, s.field, None)
        if not self.setting(i, "accounting"):  # a driver reload switches it off, and the records go
            self._accounting_switched(i, False)
        g.lost = False
        g.needs_reset = False
        g.pins.clear()
        for counter in g.ecc:
            if counter.scope is EccScope.VOLATILE:
                g.ecc[counter] = 0
        g.remap_pending = False
        g.retired_pending = False
        g.nvlink_down = []
        g.nvlink_errors = {}
        g.last_xid = None
        g.last_xid_time = None
        # A reset is the activation a pending MIG mode waits for; instances do not survive it.
        if g.mig.instances or g.mig.pending != g.mig.enabled:
            g.mig = MigState(g.mig.pending, g.mig.pending)
        self._log(now, i, f"mokka: gpu{i} reset")

    def _ib_port(self, e: IbPortCommand, now: float) -> None:
        h = self.hcas[e.hca]
        name = f"mlx5_{e.hca} port {e.port}"
        if e.action == "down" and not h.port_down:
            h.port_down = True
            # The port counts each time its link goes down.
            h.counters["link_downed"] = self._add(f"{name} link_downed", "ib.link_downed", h.counters["link_downed"], 1)
            self._log(now, None, f"mokka: {name} down")
        elif e.action == "up" and h.port_down:
            h.port_down = False
            self._log(now, None, f"mokka: {name} up")
        elif e.action == "errors":
            h.counters[e.counter] = self._add(f"{name} {e.counter}", f"ib.{e.counter}", h.counters[e.counter], e.count)
            self._log(now, None, f"mokka: {name} {e.count} {e.counter}")

    def _reset_hcas(self, now: float) -> None:
        """A node reset brings every port up and clears its counters (as `perfquery -R` would)."""
        if any(h.port_down or any(h.counters.values()) for h in self.hcas):
            self.hcas = [HcaState() for _ in self.hcas]
            self._log(now, None, "mokka: InfiniBand ports reset")

    def restore_hcas(self, hcas: list[dict]) -> None:
        """Load saved HCA states (`HcaState.to_dict`); all or nothing, ValueError on a misfit."""
        if not isinstance(hcas, list) or len(hcas) != len(self.hcas):
            raise ValueError(f"saved state is not a list of {len(self.hcas)} HCA records")
        states = []
        for j, data in enumerate(hcas):
            try:
                states.append(HcaState.from_dict(data))
            except ValueError as e:
                raise RestoreError("hca", j, str(e)) from None
        self.hcas = states
        self.generation += 1

    # --- readings -----------------------------------------------------------------------------

    def _checkpoint(self, i: int, now: float) -> None:
        g = self.gpus[i]
        if now <= g.t0:
            return
        r = self.readings(i, now)
        g.energy0_mj, g.temp0, g.t0 = r.energy_mj, r.temperature_c, now
        self._event0_ns[i] = r.event_ns

    def power_limit(self, i: int) -> float:
        return self.gpus[i].power_limit_w or self.profile.power.default_limit_w

    def _utilization(self, g: GpuState) -> tuple[int, int]:
        pinned = g.pins.get("utilization")
        return (pinned[0], pinned[1]) if pinned else (0, 0)

    def _power_demand(self, g: GpuState) -> float:
        """Watts the board would draw with no cap: pinned, or idle..default limit with
        utilization (the work asks for what it asks for; a lower limit caps it, `readings`)."""
        pinned = g.pins.get("power")
        if pinned:
            return float(pinned[0])
        p = self.profile.power
        return p.idle_w + (p.default_limit_w - p.idle_w) * self._utilization(g)[0] / 100.0

    def _target_temperature(self, power: float) -> float:
        t, p = self.profile.thermal, self.profile.power
        frac = (power - p.idle_w) / max(p.default_limit_w - p.idle_w, 1.0)
        return t.idle_c + (t.max_load_c - t.idle_c) * frac

    def readings(self, i: int, now: float) -> Readings:
        g, p = self.gpus[i], self.profile
        limit = self.power_limit(i)
        demand = self._power_demand(g)
        power = min(demand, limit)
        dt = max(0.0, now - g.t0)
        pinned_temp = g.pins.get("temperature")
        if pinned_temp:
            temperature = float(pinned_temp[0])
        else:
            target = self._target_temperature(power)
            temperature = target + (g.temp0 - target) * math.exp(-dt / THERMAL_TAU_S)
        util_gpu, util_mem = self._utilization(g)
        mask = self._throttle_mask(g, util_gpu, demand, limit, temperature)
        gr, mem = self._clocks(g, util_gpu, mask)
        if g.applications_clocks is not None and "clocks" not in g.pins and util_gpu:
            # Applications clocks are the clocks work runs at; set below the boost clock, they
            # hold it there, and the driver says the setting limits it.
            app_mem, app_graphics = g.applications_clocks
            if gr > app_graphics and "throttle" not in g.pins:
                mask |= THROTTLE_REASONS["applications_clocks_setting"]
            gr, mem = min(gr, app_graphics), app_mem
        if g.locked_clocks is not None and "clocks" not in g.pins:
            # Locked clocks hold the graphics clock in their range; held below what it would run
            # at, the driver says the applications-clocks setting limits it.
            low, high = g.locked_clocks
            if gr > high and "throttle" not in g.pins:
                mask |= THROTTLE_REASONS["applications_clocks_setting"]
            gr = min(max(gr, low), high)
        if g.locked_memory_clocks is not None and "clocks" not in g.pins:
            mem = min(max(mem, g.locked_memory_clocks[0]), g.locked_memory_clocks[1])
        mem_temp = None
        if p.thermal.memory_idle_c is not None:
            mem_temp = p.thermal.memory_idle_c + (temperature - p.thermal.idle_c) * 0.8
        pinned_mem = g.pins.get("memory_used")
        if pinned_mem:
            used_mib = pinned_mem[0]
        else:  # what the CUDA processes allocated, rounded up to whole MiB, at most what exists
            used_bytes = sum(used for _, used in self.processes[i])
            used_mib = min(-(-used_bytes // (1 << 20)), p.memory.total_mib - p.memory.reserved_mib)
        return Readings(
            temperature_c=temperature,
            memory_temperature_c=mem_temp,
            power_w=power,
            power_limit_w=limit,
            energy_mj=g.energy0_mj + power * 1000.0 * dt,
            util_gpu=util_gpu,
            util_mem=util_mem,
            clock_graphics=gr,
            clock_sm=gr,
            clock_mem=mem,
            clock_video=p.clocks.max_video if util_gpu else p.clocks.idle_video,
            throttle_mask=mask,
            memory_total_mib=p.memory.total_mib,
            memory_reserved_mib=p.memory.reserved_mib,
            memory_used_mib=used_mib,
            # a reason counts the time since the checkpoint when it holds now (the mask is
            # constant between checkpoints but for a temperature crossing a threshold)
            event_ns=tuple(base + (int(dt * 1e9) if mask & THROTTLE_REASONS[name] else 0)
                           for base, name in zip(self._event0_ns[i], EVENT_COUNTERS)),
        )

    def _throttle_mask(self, g: GpuState, util: int, demand: float, limit: float, temp: float) -> int:
        pinned = g.pins.get("throttle")
        if pinned is not None:
            return sum(THROTTLE_REASONS[r] for r in pinned)
        t = self.profile.thermal
        mask = 0
        if util == 0 and "power" not in g.pins:
            mask |= THROTTLE_REASONS["gpu_idle"]
        if demand >= limit:
            mask |= THROTTLE_REASONS["sw_power_cap"]
        if temp >= t.max_operating_c:
            mask |= THROTTLE_REASONS["sw_thermal_slowdown"]
        if temp >= t.slowdown_c:
            mask |= THROTTLE_REASONS["hw_thermal_slowdown"] | THROTTLE_REASONS["hw_slowdown"]
        return mask

    def _clocks(self, g: GpuState, util: int, mask: int) -> tuple[int, int]:
        c = self.profile.clocks
        pinned = g.pins.get("clocks")
        if pinned:
            return pinned[0], pinned[1]
        if util == 0:
            return c.idle_graphics, c.max_mem
        factor = min(
            [f for reason, f in _SLOWDOWN_FACTOR.items() if mask & THROTTLE_REASONS[reason]], default=1.0
        )
        return max(c.idle_graphics, int(c.max_graphics * factor)), c.max_mem

    # --- queries ------------------------------------------------------------------------------

    def mig_instances(self, i: int) -> tuple[GpuInstance, ...]:
        """GPU `i`'s GPU instances as every surface lists them: none while the GPU is off the
        bus (they come back with it)."""
        g = self.gpus[i]
        return () if g.lost or not g.mig.enabled else g.mig.instances

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
        used: dict[int, int] = {}
        on = self.process_instances[i]
        for pid, nbytes in self.processes[i]:
            if pid in on:
                used[on[pid][0]] = used.get(on[pid][0], 0) + nbytes
        ident = self.identities[i]
        return self._mig_view(i, ("devices", instances, tuple(sorted(used.items()))),
                              lambda: mig.describe(self.profile, ident.uuid, ident.minor, instances, used))

    def active_faults(self, i: int) -> list[str]:
        g = self.gpus[i]
        faults = []
        if g.lost:
            faults.append("lost")
        if g.needs_reset:
            faults.append("reset_required")
        if g.remap_pending:
            faults.append("row_remap_pending")
        if g.remap_failure:
            faults.append("row_remap_failure")
        if g.retired_pending:
            faults.append("page_retirement_pending")
        if ecc_total(g.ecc, EccScope.VOLATILE, EccKind.UNCORRECTED):
            faults.append("uncorrectable_ecc")
        faults += [f"nvlink{link}_down" for link in g.nvlink_down]
        faults += [f"pinned_{signal}" for signal in sorted(g.pins)]
        return faults

    def health(self, i: int) -> str:
        g = self.gpus[i]
        if g.lost:
            return "lost"
        if g.needs_reset or g.remap_failure or g.remap_pending or g.retired_pending:
            return "unhealthy"
        if g.last_xid is not None or g.nvlink_down:
            return "degraded"
        return "healthy"

    # --- persistence --------------------------------------------------------------------------

    def _check_profile_ranges(self, state: GpuState, i: int) -> None:
        """What only this node's profile can judge: the settings, through exactly the checks a
        `Configure` gets, and pins through exactly the checks a control write gets (its parser,
        then `validate`); MIG by re-placing every instance by the board's rules."""
        if state.mig != MigState():
            if self.profile.mig is None:
                raise ValueError(f"mig: {self.profile.name} does not support MIG")
            mig.check(self.profile.mig, state.mig, i)
        for s in SETTINGS.values():
            value = getattr(state, s.field)
            if value is not None:
                try:
                    s.check_value(value)
                    s.check_board(self.profile, value)
                except InvalidCommand as e:
                    raise ValueError(f"{s.field}: {e}") from None
        for signal, values in state.pins.items():
            if signal not in PIN_SIGNALS:
                raise ValueError(f"pins: unknown signal {signal[:40]!r}")
            try:
                # The text a control write would carry; ints only (str(88.0) is refused).
                if not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in values):
                    raise InvalidCommand("values must be whole numbers or throttle reasons")
                text = " ".join(str(v) for v in values) if values else "none"
                self.validate(command(gpu(0), signal, text).event)
            except InvalidCommand as e:
                raise ValueError(f"pins.{signal}: {e}") from None

    def check_log_entry(self, entry: LogEntry) -> None:
        """Raise ValueError unless `entry` could have been written by this node."""
        if not valid_time(entry.time):
            raise ValueError(f"time: {entry.time} is not between 1970 and 9999")
        if entry.gpu is not None and not (
            isinstance(entry.gpu, int) and not isinstance(entry.gpu, bool) and 0 <= entry.gpu < len(self.gpus)
        ):
            raise ValueError(f"gpu: {str(entry.gpu)[:20]} is not a GPU of this node")
        if not isinstance(entry.text, str) or len(entry.text) > MAX_LOG_TEXT:
            raise ValueError(f"text: not a string of at most {MAX_LOG_TEXT} characters")

    def restore(self, gpus: list[dict], log: list[LogEntry]) -> None:
        """Load saved per-GPU states (`GpuState.to_dict`) and log lines into this node. Raises
        ValueError on anything that does not fit; either all of it loads or nothing changes."""
        if len(gpus) != len(self.gpus):
            raise ValueError(f"saved state has {len(gpus)} GPUs, node has {len(self.gpus)}")
        states = []
        for i, data in enumerate(gpus):
            try:
                states.append(GpuState.from_dict(data))
                if self.profile.mig is not None:  # a layout saved with the older compute instance sizes
                    states[-1].mig = mig.upgrade(self.profile.mig, states[-1].mig)
                self._check_profile_ranges(states[-1], i)
            except ValueError as e:
                raise RestoreError("gpu", i, str(e)) from None
        for n, entry in enumerate(log, 1):
            try:
                self.check_log_entry(entry)
            except ValueError as e:
                raise RestoreError("log", n, str(e)) from None
        self.gpus = states
        self.log = deque(log, maxlen=LOG_LIMIT)
        self.generation += 1
