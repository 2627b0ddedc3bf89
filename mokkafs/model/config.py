"""A GPU's configuration as data: each setting NVML's setters and the `config` file know, its
spelling in the command vocabulary, its default, its range, and whether a GPU reset keeps it;
and `Configure`, the one event that changes a setting. The node reads this table to validate,
apply, reset and restore settings, `gpuN/config` to show them (docs/setters.md).
"""
from __future__ import annotations

import errno
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from mokkafs.model.events import Event, InvalidCommand, decimal_number, whole_number
from mokkafs.model.schema import GpuProfile

# nvmlComputeMode_t, by the names the vocabulary takes (nvidia-smi's, lower case), in NVML's order.
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
MAX_POWER_LIMIT_W = 100_000.0  # beyond any board; the profile's own range is checked by the node
MAX_MHZ = 99_999  # beyond any board's clocks; the profile's own range is checked by the node
# A node whose nvidia-persistenced runs has persistence mode on after every driver load; the
# captured nodes but one (b200) show it Enabled, and so did mokkafs before settings existed.
DEFAULT_PERSISTENCE = True


class NotSupported(InvalidCommand):
    """A setting this board or driver does not offer: NVML_ERROR_NOT_SUPPORTED."""

    errno = errno.EOPNOTSUPP


class GpuIsLost(InvalidCommand):
    """A setting sent to a GPU that fell off the bus: NVML_ERROR_GPU_IS_LOST."""

    errno = errno.ENODEV


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise InvalidCommand("expected 0 or 1")
    return text == "1"


def _check_flag(value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidCommand(f"expected a boolean, got {type(value).__name__}")


def _compute_mode(text: str) -> str:
    if text not in COMPUTE_MODES:
        raise InvalidCommand(f"compute mode must be one of {', '.join(COMPUTE_MODES)}, got {text!r}")
    return text


def _check_compute_mode(value: object) -> None:
    if not (isinstance(value, str) and value in COMPUTE_MODES):
        raise InvalidCommand(f"compute mode must be one of {', '.join(COMPUTE_MODES)}")


def _supported_compute_mode(profile: GpuProfile, value: object) -> None:
    if value == "exclusive_thread":
        # nvml.h: "Support Removed" (CUDA 8 dropped it); the value is a mode no driver takes.
        raise NotSupported("compute mode exclusive_thread is no longer supported")


def _watts(text: str) -> float:
    """Watts with at most three decimals (NVML's unit is the milliwatt)."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]{1,3})?", text):
        raise InvalidCommand(f"power limit must be watts (at most 3 decimals) or 'default', got {text[:24]!r}")
    value = decimal_number(text, "power limit")
    _check_watts(value)
    return value


def _check_watts(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidCommand("power limit must be a number of watts")
    if not 0 < value <= MAX_POWER_LIMIT_W:
        raise InvalidCommand(f"power limit must be above 0 and at most {MAX_POWER_LIMIT_W:.0f} W, got {value}")


def _in_power_range(profile: GpuProfile, value: object) -> None:
    p = profile.power
    if p.min_limit_w == p.max_limit_w:
        raise NotSupported(f"{profile.name}'s power limit is fixed at {p.max_limit_w:g} W")
    if not p.min_limit_w <= value <= p.max_limit_w:
        raise InvalidCommand(
            f"power limit {value:g} W is outside {profile.name}'s {p.min_limit_w:g}..{p.max_limit_w:g} W"
        )


def _clock_range(text: str) -> tuple[int, int]:
    words = text.split(" ")
    if len(words) != 2:
        raise InvalidCommand(f"locked clocks must be 'MIN_MHZ MAX_MHZ' or 'default', got {text[:40]!r}")
    value = (whole_number(words[0], "locked clocks' MIN_MHZ", MAX_MHZ), whole_number(words[1], "locked clocks' MAX_MHZ", MAX_MHZ))
    _check_clock_range(value)
    return value


def _check_clock_range(value: object) -> None:
    if not (
        isinstance(value, tuple) and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise InvalidCommand("locked clocks must be a pair of whole MHz")
    if not 0 < value[0] <= value[1]:
        raise InvalidCommand(f"locked clocks need 0 < min <= max, got {value[0]} {value[1]}")


def _in_clock_range(profile: GpuProfile, value: object) -> None:
    c = profile.clocks
    low, high = value
    if not c.idle_graphics <= low <= high <= c.max_graphics:
        raise InvalidCommand(
            f"locked clocks {low} {high} MHz are outside {profile.name}'s {c.idle_graphics}..{c.max_graphics} MHz"
        )


def _anything(profile: GpuProfile, value: object) -> None:
    pass


def _app_clocks(text: str) -> tuple[int, int]:
    words = text.split(" ")
    if len(words) != 2:
        raise InvalidCommand(f"applications clocks must be 'MEM_MHZ GRAPHICS_MHZ' or 'default', got {text[:40]!r}")
    value = (whole_number(words[0], "applications clocks' MEM_MHZ", MAX_MHZ),
             whole_number(words[1], "applications clocks' GRAPHICS_MHZ", MAX_MHZ))
    _check_app_clocks(value)
    return value


def _check_app_clocks(value: object) -> None:
    if not (
        isinstance(value, tuple) and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise InvalidCommand("applications clocks must be a pair of whole MHz above 0 (memory, graphics)")


def supported_memory_clocks(profile: GpuProfile) -> tuple[int, ...]:
    """The memory clocks the board supports, lowest first: those its profile lists
    (nvmlDeviceGetSupportedMemoryClocks, -q -d SUPPORTED_CLOCKS), or, where it lists none, its
    default applications and boost memory clocks (one and the same on every captured board)."""
    listed = {e.memory_mhz for e in profile.clocks.supported}
    return tuple(sorted(listed or {profile.clocks.default_app_mem, profile.clocks.max_mem}))


def _supported_app_clocks(profile: GpuProfile, value: object) -> None:
    """A supported pair, as the driver's nvmlDeviceSetApplicationsClocks takes: a memory clock
    the board lists, with one of the graphics clocks listed for it (every step from its top:
    what nvmlDeviceGetSupportedGraphicsClocks answers). A board whose profile lists no clocks
    takes any graphics clock in its range with its memory clock."""
    c = profile.clocks
    mem, graphics = value
    if c.supported:
        if c.allows(mem, graphics):
            return
        entry = c.listed(mem)
        if entry is None:
            allowed = "memory " + " or ".join(str(e.memory_mhz) for e in c.supported)
        else:
            listed = c.graphics_clocks(entry)
            allowed = f"with {mem}: every {c.graphics_step_mhz:g} MHz from {listed[0]} down to {listed[-1]}"
    else:
        if mem in supported_memory_clocks(profile) and c.idle_graphics <= graphics <= c.max_graphics:
            return
        allowed = (f"memory {' or '.join(map(str, supported_memory_clocks(profile)))}, graphics "
                   f"{c.idle_graphics}..{c.max_graphics}")
    raise InvalidCommand(f"applications clocks {mem} {graphics} MHz are not a supported pair on {profile.name} "
                         f"({allowed}; nvidia-smi -q -d SUPPORTED_CLOCKS lists them)")


def _in_memory_clocks(profile: GpuProfile, value: object) -> None:
    low, high = value
    supported = supported_memory_clocks(profile)
    if not (low in supported and high in supported):
        raise InvalidCommand(
            f"locked memory clocks {low} {high} MHz are not {profile.name}'s memory clocks "
            f"({', '.join(map(str, supported))} MHz)"
        )


def _spell_watts(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class Setting:
    """One setting. Its value lives in `GpuState.<field>`, where None stands for the default."""

    name: str  # the vocabulary's verb and the key in gpuN/config
    field: str
    usage: str
    parse: Callable[[str], object]  # argument text -> value; InvalidCommand with the reason
    check_value: Callable[[object], None]  # the value's type and profile-free range (events, restore)
    check_board: Callable[[GpuProfile, object], None]  # what the board allows; InvalidCommand or NotSupported
    spell: Callable[[object], str]  # value -> argument text, which `parse` reads back
    default: Callable[[GpuProfile], object]  # after a driver load
    kept_by_gpu_reset: bool  # a GPU reset keeps it (the driver's state), or returns it to the default
    nvml: str  # the NVML setter that changes it
    # A node reset (a driver reload) keeps it too: it lives on the board (InfoROM), not in the driver.
    kept_by_node_reset: bool = False
    # Takes effect at the next GPU or node reset, as ECC mode does; until then the GPU runs with
    # the value `GpuState.<field>_current` holds (None: the default).
    pending_until_reset: bool = False


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "persistence", "persistence_mode", "0|1|default", _flag, _check_flag, _anything,
            lambda v: "1" if v else "0", lambda p: DEFAULT_PERSISTENCE,
            kept_by_gpu_reset=True, nvml="nvmlDeviceSetPersistenceMode",
        ),
        Setting(
            "compute_mode", "compute_mode", "|".join(m for m in COMPUTE_MODES if m != "default") + "|default",
            _compute_mode, _check_compute_mode, _supported_compute_mode, str, lambda p: "default",
            kept_by_gpu_reset=False, nvml="nvmlDeviceSetComputeMode",
        ),
        Setting(
            "power_limit", "power_limit_w", "W|default", _watts, _check_watts, _in_power_range, _spell_watts,
            lambda p: p.power.default_limit_w,
            kept_by_gpu_reset=False, nvml="nvmlDeviceSetPowerManagementLimit",
        ),
        # The range the graphics clock may take; the default, the board's whole range, is no lock.
        Setting(
            "locked_clocks", "locked_clocks", "MIN_MHZ MAX_MHZ|default", _clock_range, _check_clock_range,
            _in_clock_range, lambda v: f"{v[0]} {v[1]}", lambda p: (p.clocks.idle_graphics, p.clocks.max_graphics),
            kept_by_gpu_reset=False, nvml="nvmlDeviceSetGpuLockedClocks",
        ),
        # The pending mode: the board's InfoROM keeps it, and it takes effect at a reset.
        Setting(
            "ecc_mode", "ecc_mode", "0|1|default", _flag, _check_flag, _anything,
            lambda v: "1" if v else "0", lambda p: p.memory.ecc,
            kept_by_gpu_reset=True, nvml="nvmlDeviceSetEccMode", kept_by_node_reset=True,
            pending_until_reset=True,
        ),
        Setting(
            "accounting", "accounting_mode", "0|1|default", _flag, _check_flag, _anything,
            lambda v: "1" if v else "0", lambda p: False,
            kept_by_gpu_reset=True, nvml="nvmlDeviceSetAccountingMode",
        ),
        # (memory, graphics), nvidia-smi -ac's order; the default is the board's default pair.
        Setting(
            "applications_clocks", "applications_clocks", "MEM_MHZ GRAPHICS_MHZ|default", _app_clocks,
            _check_app_clocks, _supported_app_clocks, lambda v: f"{v[0]} {v[1]}",
            lambda p: (p.clocks.default_app_mem, p.clocks.default_app_graphics),
            kept_by_gpu_reset=False, nvml="nvmlDeviceSetApplicationsClocks",
        ),
        Setting(
            "locked_memory_clocks", "locked_memory_clocks", "MIN_MHZ MAX_MHZ|default", _clock_range,
            _check_clock_range, _in_memory_clocks, lambda v: f"{v[0]} {v[1]}",
            lambda p: (min(supported_memory_clocks(p)), max(supported_memory_clocks(p))),
            kept_by_gpu_reset=False, nvml="nvmlDeviceSetMemoryLockedClocks",
        ),
    )
}


@dataclass(frozen=True)
class Configure(Event):
    """Set one of a GPU's settings (SETTINGS) to `value`, or return it to its default (None).
    Whether the board allows the value is the node's to say (`Node.validate`)."""

    setting: str
    value: object = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gpu is None:
            raise InvalidCommand("a setting belongs to one GPU")
        if self.setting not in SETTINGS:
            raise InvalidCommand(f"unknown setting {self.setting!r}; known: {', '.join(SETTINGS)}")
        if self.value is not None:
            SETTINGS[self.setting].check_value(self.value)


def parse_setting(name: str) -> Callable[[int, str], Configure]:
    """The vocabulary's parser for setting `name`: its value, or `default`."""
    setting = SETTINGS[name]

    def parse(i: int, text: str) -> Configure:
        return Configure(i, name, None if text == "default" else setting.parse(text))

    return parse
