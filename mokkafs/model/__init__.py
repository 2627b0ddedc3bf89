"""The pure node model: composition, events, state and readings. No I/O, no clock."""

from mokkafs.model.events import Event, InvalidCommand
from mokkafs.model.identity import Bdf, GpuIdentity, NodeConfig, compose, gpu_identities
from mokkafs.model.node import LogEntry, Node, Notification, Readings

__all__ = [
    "Bdf",
    "Event",
    "GpuIdentity",
    "InvalidCommand",
    "LogEntry",
    "Node",
    "NodeConfig",
    "Notification",
    "Readings",
    "compose",
    "gpu_identities",
]
