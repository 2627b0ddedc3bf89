"""Transitions as a table: for each kind of event, what it is checked against before anything
changes and what it does to the node, as the Xid catalogue (`XIDS`) and the command vocabulary
(`VERBS`) are tables. `Node.validate` and `Node.apply` read only this table; a new event is a row.

The handlers live with what they change (model/faults.py, dynamics.py, accounting.py); the two
whose rules are tables of their own, settings (model/config.py) and MIG (model/mig.py), are here.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mokkafs.model import accounting, dynamics, faults, mig
from mokkafs.model.config import SETTINGS, Configure
from mokkafs.model.events import (
    ClearAccounting,
    ClearEcc,
    Event,
    IbPortCommand,
    InjectEcc,
    InjectXid,
    NvLinkCommand,
    Pin,
    Reset,
    SetLost,
    SetProcesses,
)
from mokkafs.model.mig import MigEvent
from mokkafs.model.outcome import Outcome
from mokkafs.model.state import LogEntry

if TYPE_CHECKING:
    from mokkafs.model.node import Node


@dataclass(frozen=True)
class Transition:
    """One row. `apply(node, event, now)` changes the node and returns what it did; it refuses
    (raises InvalidCommand) before it changes anything, for what only the state at `now` can say
    (a MIG layout, an instance an Xid names). `validate(node, event)` is what the board and the
    state allow, checked without changing anything, also for scenarios before they run."""

    apply: Callable[[Node, Event, float], Outcome]
    validate: Callable[[Node, Event], None] | None = None
    counted: bool = True  # counted in `Node.injections` (bookkeeping, such as process lists, is not)


# --- settings (model/config.py) ------------------------------------------------------------------


def validate_configure(node: Node, e: Configure) -> None:
    faults.require_on_bus(node, e.gpu)
    if e.value is not None:
        SETTINGS[e.setting].check_board(node.profile, e.value)


def configure(node: Node, e: Configure, now: float) -> Outcome:
    s = SETTINGS[e.setting]
    default = s.default(node.profile)
    # A value equal to the default is stored as the default: a reset or a new default
    # (another driver) then has nothing to undo.
    setattr(node.gpus[e.gpu], s.field, None if e.value == default else e.value)
    value = default if e.value is None else e.value
    line = LogEntry(now, e.gpu, f"mokka: gpu{e.gpu} {s.name} {s.spell(value)}{' (default)' if value == default else ''}")
    if s.name == "accounting":
        accounting.switched(node, e.gpu, bool(value))
    return Outcome(log=(line,))


# --- MIG (model/mig.py) -------------------------------------------------------------------------


def validate_mig(node: Node, e: MigEvent) -> None:
    # What the board allows; what the GPU's MIG state allows is apply's to say (a scenario's
    # `mig create` after its `mig enable` is checked at load, before either).
    mig.check_board(node.profile, e)


def apply_mig(node: Node, e: MigEvent, now: float) -> Outcome:
    """The GPU's MIG state by the driver's rules, or NVML's error before anything changes."""
    faults.require_on_bus(node, e.gpu)
    result = mig.apply(node.profile, node.gpus[e.gpu].mig, e, gpu_busy=bool(node.processes[e.gpu]),
                       processes_on=node.process_instances[e.gpu])
    node.gpus[e.gpu].mig = result.state
    return Outcome(log=(LogEntry(now, e.gpu, f"mokka: gpu{e.gpu} {result.log}"),), reply=result.reply)


TRANSITIONS: dict[type[Event], Transition] = {
    InjectXid: Transition(faults.inject_xid),
    InjectEcc: Transition(faults.inject_ecc),
    SetLost: Transition(faults.set_lost),
    NvLinkCommand: Transition(faults.nvlink, faults.validate_nvlink),
    ClearEcc: Transition(faults.clear_ecc, faults.validate_clear_ecc),
    Reset: Transition(faults.reset, faults.validate_reset),
    IbPortCommand: Transition(faults.ib_port, faults.validate_ib_port),
    Pin: Transition(dynamics.pin, dynamics.validate_pin),
    Configure: Transition(configure, validate_configure),
    SetProcesses: Transition(accounting.set_processes, accounting.validate_processes, counted=False),
    ClearAccounting: Transition(accounting.clear, accounting.validate_clear),
    MigEvent: Transition(apply_mig, validate_mig),  # every MIG event (model/mig.py) is one
}


@functools.cache
def transition(event_type: type) -> Transition | None:
    """The row of `event_type`, or of the kind it is one of (each MIG event's is MigEvent's)."""
    for cls in event_type.__mro__:
        row = TRANSITIONS.get(cls)
        if row is not None:
            return row
    return None
