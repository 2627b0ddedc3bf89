"""Accounting of CUDA processes: each GPU's process list (pid, memory used, MIG instance), as the
daemon's process table folds it in (`SetProcesses`), and the accounting records NVML reports
(nvmlDeviceGetAccountingStats), kept after a process exits, cleared on request.

Live, never persisted, as the driver keeps them in memory: the processes of a previous daemon's
lifetime are read again from the process table. On `Node`: `processes`, `process_instances`,
`accounting`, `accounting_version` and `unaccounted`, one entry per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mokkafs.model.config import GpuIsLost
from mokkafs.model.dynamics import utilization
from mokkafs.model.events import ClearAccounting, InvalidCommand, SetProcesses
from mokkafs.model.outcome import Outcome
from mokkafs.model.state import LogEntry
from mokkafs.model.state_limits import ACCOUNTING_RECORDS

if TYPE_CHECKING:
    from mokkafs.model.node import Node

# Accounting records a GPU keeps, running and exited (nvmlDeviceGetAccountingBufferSize): the
# real driver's buffer (4000), which the shared state holds whole; the oldest goes first when full.
ACCOUNTING_BUFFER = ACCOUNTING_RECORDS


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


# --- the process list -------------------------------------------------------------------------


def validate_processes(node: Node, e: SetProcesses) -> None:
    pids = {pid for pid, _ in e.processes}
    if any(pid not in pids for pid, _, _ in e.instances):
        raise InvalidCommand("an instance names a pid that is not in the process list")
    # No real allocation is larger than the memory it is made in: the GPU's, or, for a process
    # on a MIG device, its GPU instance's.
    room = node.gi_memory_bytes(e.gpu)
    on = {pid: gi for pid, gi, _ in e.instances}
    whole = node.profile.memory.total_mib << 20
    for pid, used in e.processes:
        cap = room.get(on[pid], 0) if pid in on else whole
        if used > cap:
            where = f"GPU instance {on[pid]}" if pid in on else "the GPU"
            raise InvalidCommand(f"pid {pid} claims {used} bytes, more than the {cap} of {where}")


def set_processes(node: Node, e: SetProcesses, now: float) -> Outcome:
    """Bookkeeping, not a fault: neither logged nor counted as an injection."""
    fold(node, e.gpu, e.processes, now)
    node.processes[e.gpu] = e.processes
    node.process_instances[e.gpu] = {pid: (gi, ci) for pid, gi, ci in e.instances}
    return Outcome()


# --- accounting records -----------------------------------------------------------------------


def fold(node: Node, i: int, procs: tuple[tuple[int, int], ...], now: float) -> None:
    """Fold GPU `i`'s new process list into its accounting records: a new pid starts one, a
    running one's peak memory grows, a pid no longer listed has exited."""
    if not node.setting(i, "accounting"):
        return
    book, util = node.accounting[i], utilization(node.gpus[i])
    live = dict(procs)
    node.unaccounted[i] &= set(live)  # a pid running at the switch-on, once gone, is a new process
    changed = False
    for pid, rec in list(book.items()):
        if rec.end is None and pid not in live:
            rec.sample(now, util)
            rec.end = now
            changed = True
    for pid, used in live.items():
        if pid in node.unaccounted[i]:
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
        node.accounting_version[i] += 1


def switched(node: Node, i: int, on: bool) -> None:
    """Accounting switched on GPU `i`: on, the processes already running are not accounted (as
    the driver does); off, every record goes (nvml.h: disabling clears the accounting pids)."""
    if on:
        node.unaccounted[i] = {pid for pid, _ in node.processes[i]}
    else:
        node.unaccounted[i] = set()
        if node.accounting[i]:
            node.accounting[i] = {}
            node.accounting_version[i] += 1


def validate_clear(node: Node, e: ClearAccounting) -> None:
    if node.gpus[e.gpu].lost:
        raise GpuIsLost(f"gpu{e.gpu} has fallen off the bus")


def clear(node: Node, e: ClearAccounting, now: float) -> Outcome:
    """The records of exited processes go; the running ones' stay."""
    i = e.gpu
    book = node.accounting[i]
    kept = {pid: rec for pid, rec in book.items() if rec.end is None}
    if len(kept) != len(book):
        node.accounting[i] = kept
        node.accounting_version[i] += 1
    return Outcome(log=(LogEntry(now, i, f"mokka: gpu{i} accounting records of exited processes cleared"),))
