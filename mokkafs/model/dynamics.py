"""Readings over time: what one GPU shows at `now` (temperature, power, energy, clocks,
utilization, throttle reasons, memory used), and pins, the inputs that hold a signal still.

Closed form: every signal is a function of the GPU's checkpoint (time, temperature, energy, the
event-reason counters) and the inputs that hold since it (pins, settings, the CUDA processes), so
sampling an hour later costs the same as sampling now. When an event changes an input,
`Node.apply` moves the checkpoint to `now` with the readings the old inputs gave there
(`checkpoint`), which keeps temperature continuous and energy exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mokkafs.model.events import THROTTLE_REASONS, InvalidCommand, Pin
from mokkafs.model.outcome import Outcome
from mokkafs.model.schema import GpuProfile
from mokkafs.model.state import GpuState, LogEntry

if TYPE_CHECKING:
    from mokkafs.model.node import Node

THERMAL_TAU_S = 40.0  # first-order lag of die temperature behind power

# The reasons whose time the driver counts, in NVML's field order: SW power cap (244), sync
# boost (245), SW thermal (269), HW thermal (270), HW power brake (271).
EVENT_COUNTERS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                  "hw_power_brake_slowdown")

# Clock factors while a slowdown reason is active (the driver steps clocks down; these are
# plausible, not measured).
_SLOWDOWN_FACTOR = {"hw_slowdown": 0.5, "sw_thermal_slowdown": 0.8, "sw_power_cap": 0.9}


# The framebuffer as the driver reports it (nvmlDeviceGetMemoryInfo, nvidia-smi's FB Memory Usage,
# cuMemGetInfo's total). From R510, the branch that added nvmlMemory_v2_t, the total is the board's
# and the share the driver reserves for itself is reported apart: v2's `reserved`, and counted in
# v1's `used` (the v1 header's "Sum of Reserved and Allocated"). Before R510 the reserved share is
# not part of the total at all and nothing is reported reserved: v1's used is what was allocated,
# total = free + used with nothing held back (a real idle A100-SXM4-40GB at 470.42.01 shows
# "0MiB / 40536MiB", mbforbes/beaker-docker; V100 32GB and A16 -q at 470.129: Used 0 MiB, Free =
# Total, no Reserved row; at 510.47.03 an idle A100 80GB shows "0MiB / 81920MiB", NVIDIA/gpu-operator#348).
REPORTED_RESERVED_BRANCH = 510


@dataclass(frozen=True)
class Framebuffer:
    """A GPU's framebuffer under one driver branch: the total and reserved the driver reports
    (MiB); usable, what allocations may take, is the same on every branch."""

    total_mib: int
    reserved_mib: int

    @property
    def usable_mib(self) -> int:
        return self.total_mib - self.reserved_mib


def framebuffer(profile: GpuProfile, branch: int) -> Framebuffer:
    """The framebuffer `profile`'s board reports under driver branch `branch` (the rule above).
    The share held back differs by branch too: before R510 the board's `reserved_before_510_mib`
    where its profile knows it (A100 40GB: 424 MiB, the 40536 MiB of every 460-470 capture,
    against 518 at 570), else its `reserved_mib`."""
    m = profile.memory
    if branch >= REPORTED_RESERVED_BRANCH:
        return Framebuffer(m.total_mib, m.reserved_mib)
    held = m.reserved_mib if m.reserved_before_510_mib is None else m.reserved_before_510_mib
    return Framebuffer(m.total_mib - held, 0)


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


def power_limit(profile: GpuProfile, g: GpuState) -> float:
    return g.power_limit_w or profile.power.default_limit_w


def utilization(g: GpuState) -> tuple[int, int]:
    pinned = g.pins.get("utilization")
    return (pinned[0], pinned[1]) if pinned else (0, 0)


def power_demand(profile: GpuProfile, g: GpuState) -> float:
    """Watts the board would draw with no cap: pinned, or idle..default limit with
    utilization (the work asks for what it asks for; a lower limit caps it, `readings`)."""
    pinned = g.pins.get("power")
    if pinned:
        return float(pinned[0])
    p = profile.power
    return p.idle_w + (p.default_limit_w - p.idle_w) * utilization(g)[0] / 100.0


def target_temperature(profile: GpuProfile, power: float) -> float:
    t, p = profile.thermal, profile.power
    frac = (power - p.idle_w) / max(p.default_limit_w - p.idle_w, 1.0)
    return t.idle_c + (t.max_load_c - t.idle_c) * frac


def energy_mj(energy0_mj: float, t0: float, power_w: float, now: float) -> float:
    """The energy counter at `now`, from its checkpoint (`energy0_mj` at `t0`) and the power drawn
    since, which holds until the next event."""
    return energy0_mj + power_w * 1000.0 * max(0.0, now - t0)


def power_drawn(profile: GpuProfile, g: GpuState) -> float:
    """Watts drawn: the demand, capped by the power limit; it holds until the next event."""
    return min(power_demand(profile, g), power_limit(profile, g))


def temperature(profile: GpuProfile, g: GpuState, power: float, now: float) -> float:
    """The die temperature at `now` drawing `power`: pinned, or lagging behind the target that
    power drives it to, from the checkpoint's."""
    pinned = g.pins.get("temperature")
    if pinned:
        return float(pinned[0])
    target = target_temperature(profile, power)
    return target + (g.temp0 - target) * math.exp(-max(0.0, now - g.t0) / THERMAL_TAU_S)


def temperature_holds(profile: GpuProfile, g: GpuState, now: float) -> bool:
    """Whether `g`'s temperature reads at `now` what it will read at every later instant until
    the next event: pinned, or at the target its power drives it to (exactly, in floating point:
    some 25 minutes of the 40 s lag after the event that moved it; at once if nothing did). Then
    nothing `readings` reports moves with time but the energy and the event-reason counters,
    which grow: the throttle reasons and clocks follow the temperature, and the rest follows
    inputs only an event changes."""
    if g.pins.get("temperature"):
        return True
    power = power_drawn(profile, g)
    return temperature(profile, g, power, now) == target_temperature(profile, power)


def readings(profile: GpuProfile, g: GpuState, processes: tuple[tuple[int, int], ...],
             event0_ns: tuple[int, ...], now: float, fb: Framebuffer, driver_bytes: int = 0) -> Readings:
    """GPU state `g` at `now`, with `processes` ((pid, used bytes) of its CUDA processes),
    `event0_ns` (the event-reason counters at its checkpoint), `fb` (the framebuffer as the
    driver reports it) and `driver_bytes` (memory the driver holds besides them: its MIG
    instances' idle bytes)."""
    p = profile
    limit = power_limit(p, g)
    demand = power_demand(p, g)
    power = min(demand, limit)
    dt = max(0.0, now - g.t0)
    temp = temperature(p, g, power, now)
    util_gpu, util_mem = utilization(g)
    mask = throttle_mask(p, g, util_gpu, demand, limit, temp)
    gr, mem = clocks(p, g, util_gpu, mask)
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
        mem_temp = p.thermal.memory_idle_c + (temp - p.thermal.idle_c) * 0.8
    pinned_mem = g.pins.get("memory_used")
    if pinned_mem:
        used_mib = pinned_mem[0]
    else:  # what the CUDA processes allocated, rounded up to whole MiB, at most what exists
        used_bytes = driver_bytes + sum(used for _, used in processes)
        used_mib = min(-(-used_bytes // (1 << 20)), fb.usable_mib)
    return Readings(
        temperature_c=temp,
        memory_temperature_c=mem_temp,
        power_w=power,
        power_limit_w=limit,
        energy_mj=energy_mj(g.energy0_mj, g.t0, power, now),
        util_gpu=util_gpu,
        util_mem=util_mem,
        clock_graphics=gr,
        clock_sm=gr,
        clock_mem=mem,
        clock_video=p.clocks.max_video if util_gpu else p.clocks.idle_video,
        throttle_mask=mask,
        memory_total_mib=fb.total_mib,
        memory_reserved_mib=fb.reserved_mib,
        memory_used_mib=used_mib,
        # a reason counts the time since the checkpoint when it holds now (the mask is
        # constant between checkpoints but for a temperature crossing a threshold)
        event_ns=tuple(base + (int(dt * 1e9) if mask & THROTTLE_REASONS[name] else 0)
                       for base, name in zip(event0_ns, EVENT_COUNTERS)),
    )


def checkpoint(g: GpuState, at: Readings, now: float) -> tuple[int, ...]:
    """Move `g`'s checkpoint to `now`, where it reads `at` (its readings at `now` under the
    inputs that held until now); returns the event-reason counters at the new checkpoint."""
    g.energy0_mj, g.temp0, g.t0 = at.energy_mj, at.temperature_c, now
    return at.event_ns


def throttle_mask(profile: GpuProfile, g: GpuState, util: int, demand: float, limit: float, temp: float) -> int:
    pinned = g.pins.get("throttle")
    if pinned is not None:
        return sum(THROTTLE_REASONS[r] for r in pinned)
    t = profile.thermal
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


def clocks(profile: GpuProfile, g: GpuState, util: int, mask: int) -> tuple[int, int]:
    c = profile.clocks
    pinned = g.pins.get("clocks")
    if pinned:
        return pinned[0], pinned[1]
    if util == 0:
        return c.idle_graphics, c.max_mem
    factor = min(
        [f for reason, f in _SLOWDOWN_FACTOR.items() if mask & THROTTLE_REASONS[reason]], default=1.0
    )
    return max(c.idle_graphics, int(c.max_graphics * factor)), c.max_mem


# --- pins: the inputs a control write holds still ---------------------------------------------


def validate_pin(node: Node, pin: Pin) -> None:
    if not pin.values:
        return
    p = node.profile
    if pin.signal == "memory_used" and pin.values[0] > node.framebuffer.usable_mib:
        raise InvalidCommand(f"memory_used at most {node.framebuffer.usable_mib} MiB")
    if pin.signal == "clocks":
        sm, mem = pin.values
        if not (0 < sm <= p.clocks.max_sm and 0 < mem <= p.clocks.max_mem):
            raise InvalidCommand(f"clocks must be 1..{p.clocks.max_sm} (sm) and 1..{p.clocks.max_mem} (mem) MHz")


def pin(node: Node, e: Pin, now: float) -> Outcome:
    g = node.gpus[e.gpu]
    if e.values is None:
        g.pins.pop(e.signal, None)
        text = f"mokka: gpu{e.gpu} {e.signal} auto"
    else:
        g.pins[e.signal] = e.values
        shown = " ".join(str(v) for v in e.values) or "none"
        text = f"mokka: gpu{e.gpu} {e.signal} pinned {shown}"
    return Outcome(log=(LogEntry(now, e.gpu, text),))
