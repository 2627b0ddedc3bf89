"""Every mutation of the node as a small, frozen, self-validating event. The grammar that turns
a command's text into one is model/commands.py."""
from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mokkafs.model.counters import MemoryLocation
from mokkafs.model.nvml_consts import CLOCKS_EVENT_REASONS

if TYPE_CHECKING:  # the scenario schema is imported at the first scenario (model/scenario.py)
    from mokkafs.model.scenario import Loaded

# nvmlMemoryLocation_t order; names are what `inject_ecc` accepts.
MEMORY_LOCATIONS = tuple(loc.spelling for loc in MemoryLocation)

# The signals a `Pin` holds at fixed values (each a control file and a command of the same name).
PIN_SIGNALS = ("temperature", "power", "utilization", "clocks", "memory_used", "throttle")

# nvmlClocksEventReasons bits (nvml.h's values), by the names `throttle` accepts (nvidia-smi's
# spelling, snake case) in bit order.
THROTTLE_REASONS = {
    name: CLOCKS_EVENT_REASONS[nvml]
    for name, nvml in (
        ("gpu_idle", "GpuIdle"),
        ("applications_clocks_setting", "ApplicationsClocksSetting"),
        ("sw_power_cap", "SwPowerCap"),
        ("hw_slowdown", "HwSlowdown"),
        ("sync_boost", "SyncBoost"),
        ("sw_thermal_slowdown", "SwThermalSlowdown"),
        ("hw_thermal_slowdown", "HwThermalSlowdown"),
        ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
        ("display_clocks_setting", "DisplayClockSetting"),
    )
}
# hw_thermal_slowdown and hw_power_brake_slowdown also set hw_slowdown, as the driver does.
_IMPLIED = {"hw_thermal_slowdown": "hw_slowdown", "hw_power_brake_slowdown": "hw_slowdown"}

MAX_XID = 999  # NVML reports 999 for an unknown Xid; the catalog ends well below it
MAX_COUNT = 1_000_000  # one command adds at most this many errors


class InvalidCommand(ValueError):
    """A control write that is not a valid command; the FUSE edge turns it into EINVAL."""

    errno = errno.EINVAL


# The one rule for a number in a command (control files, the control socket, scenario lines,
# annotations): ASCII decimal digits, leading zeros allowed (`0000079` and `00000079` are both
# 79), at most MAX_NUMBER_CHARS characters in all, a decimal point and its digits included; the
# value is then held to its own range. Long enough for any value in range with generous
# padding, short enough that no text of digits is ever a problem to convert (docs/faults.md).
MAX_NUMBER_CHARS = 20
_WHOLE = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]{1,3})?")


def _number_text(word: str, what: str, pattern: re.Pattern, kind: str) -> None:
    if not pattern.fullmatch(word):
        raise InvalidCommand(f"{what} must be {kind}, got {word[:24]!r}")
    if len(word) > MAX_NUMBER_CHARS:
        raise InvalidCommand(f"{what}: {len(word)} characters, more than the {MAX_NUMBER_CHARS} a number may have")


def whole_number(word: str, what: str, high: int) -> int:
    """`word` as a whole number 0..high under the one rule; InvalidCommand saying why not."""
    _number_text(word, what, _WHOLE, "a decimal number")
    value = int(word)
    if value > high:
        raise InvalidCommand(f"{what} must be at most {high}, got {value}")
    return value


def decimal_number(word: str, what: str) -> float:
    """`word` as a number with at most three decimals under the one rule (its range is the caller's)."""
    _number_text(word, what, _DECIMAL, "a decimal number (at most 3 decimals)")
    return float(word)


@dataclass(frozen=True)
class Event:
    gpu: int | None  # None: the whole node

    def __post_init__(self) -> None:
        if self.gpu is not None and not (isinstance(self.gpu, int) and self.gpu >= 0):
            raise InvalidCommand(f"bad gpu index {self.gpu!r}")


@dataclass(frozen=True)
class InjectXid(Event):
    code: int
    # The MIG instance the driver attributes it to (docs/mig.md): a GPU instance id, and within
    # it a compute instance id; the node checks that they exist.
    gi: int | None = None
    ci: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.code <= MAX_XID:
            raise InvalidCommand(f"Xid must be 1..{MAX_XID}, got {self.code}")
        for name in ("gi", "ci"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0xFF):
                raise InvalidCommand(f"bad {name} {v!r}")
        if self.ci is not None and self.gi is None:
            raise InvalidCommand("a compute instance is named with its GPU instance (gi=G ci=C)")


@dataclass(frozen=True)
class InjectEcc(Event):
    """ECC errors as the driver meets them. An uncorrectable (dbe) one comes with its Xid: on
    Ampere and later 95 (uncontained), or 94 with `contained`; 48 on older boards (docs/faults.md)."""

    kind: str  # "sbe" | "dbe"
    count: int
    location: str = "dram"
    contained: bool = False  # dbe: the driver contained it to the process that met it (Xid 94)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind not in ("sbe", "dbe"):
            raise InvalidCommand(f"ECC kind must be sbe or dbe, got {self.kind!r}")
        if self.contained and self.kind != "dbe":
            raise InvalidCommand("only an uncorrectable (dbe) error is contained")
        if not 1 <= self.count <= MAX_COUNT:
            raise InvalidCommand(f"ECC count must be 1..{MAX_COUNT}, got {self.count}")
        if self.location not in MEMORY_LOCATIONS:
            raise InvalidCommand(f"ECC location must be one of {', '.join(MEMORY_LOCATIONS)}")


@dataclass(frozen=True)
class Pin(Event):
    """Pin a signal to fixed values, or return it to the simulated curve (`values=None`)."""

    signal: str
    values: tuple | None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.signal not in PIN_SIGNALS:
            raise InvalidCommand(f"unknown signal {self.signal!r}")
        if self.signal == "throttle" and self.values is not None:
            unknown = [r for r in self.values if r not in THROTTLE_REASONS]
            if unknown:
                raise InvalidCommand(
                    f"unknown throttle reason {unknown[0]!r}; known: {', '.join(THROTTLE_REASONS)}, none, auto"
                )
            # The reasons the driver reports together, whoever built the event.
            reasons = set(self.values) | {_IMPLIED[r] for r in self.values if r in _IMPLIED}
            object.__setattr__(self, "values", tuple(sorted(reasons, key=THROTTLE_REASONS.__getitem__)))


@dataclass(frozen=True)
class SetLost(Event):
    lost: bool


@dataclass(frozen=True)
class NvLinkCommand(Event):
    link: int
    action: str  # "up" | "down" | "errors" | "reset_errors" (nvmlDeviceResetNvLinkErrorCounters)
    count: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.action not in ("up", "down", "errors", "reset_errors"):
            raise InvalidCommand(f"NVLink action must be up, down, errors or reset_errors, got {self.action!r}")
        if not 0 <= self.link < 18:
            raise InvalidCommand(f"NVLink link must be 0..17, got {self.link}")
        if self.action == "errors" and not 1 <= self.count <= MAX_COUNT:
            raise InvalidCommand(f"NVLink error count must be 1..{MAX_COUNT}, got {self.count}")


MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_PROCESS_BYTES = 1 << 50


@dataclass(frozen=True)
class SetProcesses(Event):
    """The CUDA processes holding a context on one GPU, as the daemon read them from the
    shims' process table: `(pid, used bytes)` pairs, unique pids. Replaces the GPU's list.
    `instances`: `(pid, GPU instance, compute instance)` of those that run on a MIG device."""

    processes: tuple = ()
    instances: tuple = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpu is None:
            raise InvalidCommand("a process list belongs to one GPU")
        try:
            procs = tuple((int(pid), int(used)) for pid, used in self.processes)
        except (TypeError, ValueError):
            raise InvalidCommand("processes must be (pid, used bytes) pairs") from None
        for pid, used in procs:
            if not 0 < pid < MAX_PID:
                raise InvalidCommand(f"bad pid {pid}")
            if not 0 <= used <= MAX_PROCESS_BYTES:
                raise InvalidCommand(f"bad used memory {used} for pid {pid}")
        if len({pid for pid, _ in procs}) != len(procs):
            raise InvalidCommand("a pid appears twice")
        object.__setattr__(self, "processes", tuple(sorted(procs)))
        try:
            placed = tuple((int(pid), int(gi), int(ci)) for pid, gi, ci in self.instances)
        except (TypeError, ValueError):
            raise InvalidCommand("instances must be (pid, GPU instance, compute instance) triples") from None
        if any(not (0 <= gi <= 0xFF and 0 <= ci <= 0xFF) for _, gi, ci in placed):
            raise InvalidCommand("bad instance id")
        if len({pid for pid, _, _ in placed}) != len(placed):
            raise InvalidCommand("a pid is on two instances")
        object.__setattr__(self, "instances", tuple(sorted(placed)))


@dataclass(frozen=True)
class Reset(Event):
    """`gpu=None` resets the whole node. `idle`: NVIDIA's reset (nvidia-smi -r, NVML's reset),
    which the driver refuses (IN_USE) while a process is on a GPU it names; without it, the
    fault-clearing reset of the control files, which resets whatever runs. `gpus` (with
    `gpu=None`): a GPU reset of those GPUs together, all or none, as `nvidia-smi -r -i A,B`."""

    idle: bool = False
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpus and self.gpu is not None:
            raise InvalidCommand("a reset names one GPU or a set of them, not both")
        if len(set(self.gpus)) != len(self.gpus) or any(not isinstance(i, int) or i < 0 for i in self.gpus):
            raise InvalidCommand(f"bad GPU set {self.gpus!r}")


ECC_CLEAR_SCOPES = ("volatile", "aggregate")  # nvmlEccCounterType_t order


@dataclass(frozen=True)
class ClearEcc(Event):
    """Zero one GPU's ECC counters of one scope (nvmlDeviceClearEccErrorCounts): the volatile
    ones, or the aggregate (InfoROM) ones. The node refuses it while ECC is off."""

    scope: str = "volatile"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpu is None:
            raise InvalidCommand("ECC counters belong to one GPU")
        if self.scope not in ECC_CLEAR_SCOPES:
            raise InvalidCommand(f"ECC counter scope must be volatile or aggregate, got {self.scope!r}")


@dataclass(frozen=True)
class ClearAccounting(Event):
    """Forget the accounting records of a GPU's processes that have exited
    (nvmlDeviceClearAccountingPids); those of running processes stay."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpu is None:
            raise InvalidCommand("accounting records belong to one GPU")


# InfiniBand port counters a control write may raise (kernel ports/N/counters/ names).
IB_ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)


@dataclass(frozen=True)
class IbPortCommand(Event):
    """Take an HCA port down or up, or add to one of its error counters. A node-level event
    (`gpu` is None); the node checks that the HCA exists."""

    hca: int = 0
    port: int = 1
    action: str = "up"  # "up" | "down" | "errors"
    counter: str = "symbol_error"
    count: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpu is not None:
            raise InvalidCommand("an InfiniBand port command belongs to the node, not a GPU")
        if not (isinstance(self.hca, int) and 0 <= self.hca < 64):
            raise InvalidCommand(f"bad HCA index {self.hca!r}")
        if self.port != 1:
            raise InvalidCommand(f"HCAs have one port, port 1; got {self.port!r}")
        if self.action not in ("up", "down", "errors"):
            raise InvalidCommand(f"port action must be up, down or errors, got {self.action!r}")
        if self.counter not in IB_ERROR_COUNTERS:
            raise InvalidCommand(f"unknown counter {self.counter!r}; known: {', '.join(IB_ERROR_COUNTERS)}")
        if self.action == "errors" and not 1 <= self.count <= MAX_COUNT:
            raise InvalidCommand(f"error count must be 1..{MAX_COUNT}, got {self.count}")


# --- requests to the daemon's scenario runner (node/scenario, model/scenario.py) ------------------


@dataclass(frozen=True)
class RunScenario(Event):
    """A write of `run [seed=N] [speed=X] [start=T] [file=NAME]` followed by the scenario's YAML
    on the next lines. Not a node event: the controller hands it to the daemon's scenario runner.
    `start`: the timeline's zero as seconds since the epoch (a node pool's shared start), else
    when the daemon accepts it."""

    loaded: Loaded = field(default=None, compare=False)
    seed: int | None = None
    speed: float = 1.0
    start: float | None = None


@dataclass(frozen=True)
class StopScenario(Event):
    """A write of `stop`."""
