"""The pure node model: composition, events, state and readings. No I/O, no clock."""

from mokkafs.model.events import Event, InvalidCommand
from mokkafs.model.identity import Bdf, GpuIdentity, NodeConfig, compose, gpu_identities
from mokkafs.model.dynamics import Readings
from mokkafs.model.node import Node
from mokkafs.model.outcome import Notification, Outcome
from mokkafs.model.state import LogEntry

__all__ = [
    "Bdf",
    "Event",
    "GpuIdentity",
    "InvalidCommand",
    "LogEntry",
    "Node",
    "NodeConfig",
    "Notification",
    "Outcome",
    "Readings",
    "compose",
    "gpu_identities",
]
