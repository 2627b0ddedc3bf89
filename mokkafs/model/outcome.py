"""What one applied event did, as one value: the notifications for subscribers, the log lines,
the sender's reply, the counters it saturated and the GPUs (and HCAs) whose state it touched.
Every transition (model/transitions.py) returns an `Outcome`; `Node.apply` completes it and the
controller hands it to every edge (persistence, the shared state, the mirror, kmsg, the sockets).
"""
from __future__ import annotations

from dataclasses import dataclass

from mokkafs.model.nvml_consts import EVENT_TYPES, SYSTEM_EVENT_TYPES
from mokkafs.model.state_limits import EVENT_SYSTEM
from mokkafs.model.state import LogEntry, counter_max

# The NVML event types the model raises (nvml.h's nvmlEventType* bits), delivered to
# nvmlEventSetWait callers.
EVENT_SBE = EVENT_TYPES["SingleBitEccError"]
EVENT_DBE = EVENT_TYPES["DoubleBitEccError"]
EVENT_XID = EVENT_TYPES["XidCriticalError"]
EVENT_RECOVERY = EVENT_TYPES["GpuRecoveryAction"]  # data: the new nvmlDeviceGpuRecoveryAction_t
# System events (nvmlSystemEventSetWait), marked apart from the device events in the same ring;
# data: the GPU's PCI location (`pci_gpu_id`).
SYSTEM_UNBIND = EVENT_SYSTEM | SYSTEM_EVENT_TYPES["GpuDriverUnbind"]
SYSTEM_BIND = EVENT_SYSTEM | SYSTEM_EVENT_TYPES["GpuDriverBind"]


@dataclass(frozen=True)
class Notification:
    """Something that happened, for subscribers (NVML event sets, metrics, kmsg)."""

    gpu: int
    event_type: int
    data: int
    gi: int | None = None  # the MIG instance an Xid names (nvmlEventData_t.gpuInstanceId)
    ci: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What one applied event did. A transition fills in what it knows (notifications, log
    lines, reply, saturated counters); `Node.apply` adds the sender's note to `log` and the
    GPUs and HCAs the event touched, which are what persistence saves and the publisher rewrites."""

    notifications: tuple[Notification, ...] = ()
    log: tuple[LogEntry, ...] = ()  # the lines the event appended to the node's log, in order
    reply: str = ""  # what the sender is answered (a MIG create's new ids); "" for most events
    # Counters the event brought to their maximum (COUNTER_BITS), by name: the controller logs
    # each once. A counter that stays saturated is not named again.
    saturated: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()  # GPUs whose state the event may have changed: its GPU, or all of them
    hcas: bool = False  # the HCAs' state may have changed (node-wide events)


class Change:
    """An `Outcome` being built by one transition: its lines, notifications and saturating
    counts, at the event's time `now`."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.notifications: list[Notification] = []
        self.lines: list[LogEntry] = []
        self.saturated: list[str] = []

    def log(self, gpu: int | None, text: str) -> None:
        self.lines.append(LogEntry(self.now, gpu, text))

    def notify(self, gpu: int, event_type: int, data: int, gi: int | None = None, ci: int | None = None) -> None:
        self.notifications.append(Notification(gpu, event_type, data, gi, ci))

    def add(self, name: str, family: str, value: int, n: int) -> int:
        """`value + n`, stopping at the counter's maximum as the real counter does; a counter
        that reaches it now is named in the outcome's `saturated`."""
        cap = counter_max(family)
        if value < cap <= value + n:
            self.saturated.append(name)
        return min(value + n, cap)

    def outcome(self, reply: str = "") -> Outcome:
        return Outcome(tuple(self.notifications), tuple(self.lines), reply, tuple(self.saturated))

