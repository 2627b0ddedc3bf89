"""A node's mutable, persisted records (per GPU, per HCA, the event log) and reading them back:
each record's strict reader, the widths its counters saturate at, and the checks a restore makes
against the node's profile, so that whatever the daemon saved it can load, and nothing else.

Pure: `Node` (model/node.py) holds these records; persistence (daemon/persist.py) writes them.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ConfigDict, ValidationError, create_model

from mokkafs.model.commands import command, gpu
from mokkafs.model.config import SETTINGS
from mokkafs.model.counters import (
    EccCounter,
    NvLinkCounter,
    link_from_key,
    zero_ecc,
    zero_nvlink,
)
from mokkafs.model.events import IB_ERROR_COUNTERS, PIN_SIGNALS, Event, InvalidCommand
from mokkafs.model import mig
from mokkafs.model.mig import MigState
from mokkafs.model.schema import GpuProfile
from mokkafs.model.xid import RecoveryAction

LOG_LIMIT = 4096  # node event-log lines kept (and persisted)

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


@dataclass(frozen=True)
class LogEntry:
    time: float
    gpu: int | None
    text: str



_ECC_KEYS = {counter: counter.key for counter in zero_ecc()}  # their stored spellings, made once
_PAIRS = ("locked_clocks", "applications_clocks", "locked_memory_clocks")  # tuples, stored as JSON lists

@dataclass
class GpuState:
    """The mutable, persisted part of one GPU. Identity lives in GpuIdentity."""

    t0: float
    temp0: float
    energy0_mj: float = 0.0
    lost: bool = False
    needs_reset: bool = False
    # What the driver says the GPU needs (model/xid.py RecoveryAction, by its spelling): set by
    # Xids as the catalogue says, cleared by the reset that answers it (model/faults.py).
    recovery_action: str = "none"
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

    def copy(self) -> "GpuState":
        """A copy that no later change to this state shows through (nor to it): the containers
        an event changes in place are copied, their keys and values are immutable (`mig` is
        frozen). For the controller's rollback, taken before every event: a tenth of
        copy.deepcopy's cost."""
        new = copy.copy(self)
        new.pins = dict(self.pins)
        new.ecc = dict(self.ecc)
        new.nvlink_down = list(self.nvlink_down)
        new.nvlink_errors = {link: dict(errs) for link, errs in self.nvlink_errors.items()}
        new.xid_counts = dict(self.xid_counts)
        return new

    @classmethod
    def from_dict(cls, data: dict) -> "GpuState":
        """Raises ValueError (pydantic's, naming the field) on a record of the wrong shape."""
        if not isinstance(data, dict):
            raise ValueError(f"a GPU record must be a mapping, got {type(data).__name__}")
        _require(data, _GPU_KEYS_SINCE_V1)
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


# The keys every GPU record has held since the first state format (tests/fixtures/state-v1 is
# one): a record without one has lost it (an edit, a rewrite cut short), and restoring it as zeros
# would silently clear counters, pins or faults, so it is refused. Keys added since (the settings,
# MIG) may be absent: a record from before them, which takes their defaults.
_GPU_KEYS_SINCE_V1 = (
    "t0", "temp0", "energy0_mj", "lost", "needs_reset", "pins", "power_limit_w", "ecc", "retired_sbe", "retired_dbe",
    "retired_pending", "remapped_corr", "remapped_unc", "remap_pending", "remap_failure", "nvlink_down",
    "nvlink_errors", "pcie_replay", "last_xid", "last_xid_time", "xid_counts",
)


def _require(data: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in data]
    if missing:
        more = "" if len(missing) == 1 else f" ({len(missing) - 1} more keys too)"
        raise ValueError(f"{missing[0]}: missing, where the daemon saves it in every record{more}")


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
    message starts with the key. Pins and the power limit need the profile: `check_profile_ranges`."""
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
    if state.recovery_action not in {a.spelling for a in RecoveryAction}:
        raise ValueError(f"recovery_action: {state.recovery_action[:40]!r} is not a recovery action")
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

    def copy(self) -> "HcaState":
        return HcaState(self.port_down, dict(self.counters))

    @classmethod
    def from_dict(cls, data: dict) -> "HcaState":
        if not isinstance(data, dict):
            raise ValueError(f"an HCA record must be a mapping, got {type(data).__name__}")
        _require(data, tuple(cls.__dataclass_fields__))
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


# --- restore: saved records read back for this node ----------------------------------------------


def check_profile_ranges(profile: GpuProfile, state: GpuState, i: int, validate: Callable[[Event], None]) -> None:
    """What only the node's profile can judge of GPU `i`'s record: the settings, through exactly the checks a
    `Configure` gets, and pins through exactly the checks a control write gets (its parser,
    then the node's `validate`); MIG by re-placing every instance by the board's rules."""
    if state.mig != MigState():
        if profile.mig is None:
            raise ValueError(f"mig: {profile.name} does not support MIG")
        mig.check(profile.mig, state.mig, i)
    for s in SETTINGS.values():
        value = getattr(state, s.field)
        if value is not None:
            try:
                s.check_value(value)
                s.check_board(profile, value)
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
            validate(command(gpu(0), signal, text).event)
        except InvalidCommand as e:
            raise ValueError(f"pins.{signal}: {e}") from None


def check_log_entry(entry: LogEntry, gpu_count: int) -> None:
    """Raise ValueError unless `entry` could have been written by a node of `gpu_count` GPUs."""
    if not valid_time(entry.time):
        raise ValueError(f"time: {entry.time} is not between 1970 and 9999")
    if entry.gpu is not None and not (
        isinstance(entry.gpu, int) and not isinstance(entry.gpu, bool) and 0 <= entry.gpu < gpu_count
    ):
        raise ValueError(f"gpu: {str(entry.gpu)[:20]} is not a GPU of this node")
    if not isinstance(entry.text, str) or len(entry.text) > MAX_LOG_TEXT:
        raise ValueError(f"text: not a string of at most {MAX_LOG_TEXT} characters")


def restored_gpus(profile: GpuProfile, records: list[dict], gpu_count: int,
                  validate: Callable[[Event], None]) -> list[GpuState]:
    """Saved per-GPU records (`GpuState.to_dict`) read back for a node of `gpu_count` GPUs of
    `profile`; ValueError (a RestoreError naming the record) on anything that does not fit."""
    if len(records) != gpu_count:
        raise ValueError(f"saved state has {len(records)} GPUs, node has {gpu_count}")
    states = []
    for i, data in enumerate(records):
        try:
            states.append(GpuState.from_dict(data))
            if profile.mig is not None:  # a layout saved with the older compute instance sizes
                states[-1].mig = mig.upgrade(profile.mig, states[-1].mig)
            check_profile_ranges(profile, states[-1], i, validate)
        except ValueError as e:
            raise RestoreError("gpu", i, str(e)) from None
    return states


def check_log(log: list[LogEntry], gpu_count: int) -> None:
    """Every saved log line could have been written by this node; RestoreError names the first that could not."""
    for n, entry in enumerate(log, 1):
        try:
            check_log_entry(entry, gpu_count)
        except ValueError as e:
            raise RestoreError("log", n, str(e)) from None


def restored_hcas(records: list[dict], hca_count: int) -> list[HcaState]:
    """Saved HCA records (`HcaState.to_dict`) read back; ValueError on a misfit."""
    if not isinstance(records, list) or len(records) != hca_count:
        raise ValueError(f"saved state is not a list of {hca_count} HCA records")
    states = []
    for j, data in enumerate(records):
        try:
            states.append(HcaState.from_dict(data))
        except ValueError as e:
            raise RestoreError("hca", j, str(e)) from None
    return states
