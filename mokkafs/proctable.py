"""The daemon's side of the CUDA process table `<state path>.procs` (layout and protocol in
shims/include/mokka_state.h): create it writable by every consumer, free the slots of processes
that are gone (exit, kill -9, pid reuse), and fold the live ones into the model as validated
`SetProcesses` events on a short tick."""
from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import trio

from mokkafs.controller import Controller
from mokkafs.model import InvalidCommand
from mokkafs.model.events import SetProcesses
from mokkafs.publisher import MAX_GPUS, _libc, ffi

log = logging.getLogger(__name__)

TICK_S = 0.1
SUFFIX = ".procs"
MAGIC = 0x53434F5250414B4D
VERSION = _libc.MOKKA_PROCS_VERSION
SLOTS = _libc.MOKKA_PROC_SLOTS
PROCS_SIZE = ffi.sizeof("struct mokka_procs")
LIVE = 2


def procs_path(state: str | os.PathLike) -> Path:
    """Where the process table of the state file `state` lives (the shims derive it alike)."""
    return Path(f"{os.fspath(state)}{SUFFIX}")


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when the process is gone. A zombie counts as
    gone: the driver releases a process's GPU memory when its files close, before it is reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


class ProcessTable:
    """Owns `<state path>.procs`. `scan()` reaps and returns each GPU's (pid, bytes) list."""

    def __init__(self, path: Path, alive: Callable[[int], int | None] = start_time) -> None:
        self.path = Path(path)
        self.alive = alive
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._t = None

    def open(self) -> None:
        """Create the table, or adopt a valid one: processes that outlive a daemon restart keep
        their slots. Anything else is replaced by a rename, never truncated under a writer."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            if not self._valid(fd):
                if os.fstat(fd).st_size:
                    log.warning("%s: replacing an incompatible process table", self.path)
                os.close(fd)
                tmp = self.path.with_name(f".{self.path.name}.new")
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
                os.ftruncate(fd, PROCS_SIZE)
                head = MAGIC.to_bytes(8, "little") + VERSION.to_bytes(4, "little")
                os.pwrite(fd, head + SLOTS.to_bytes(4, "little") + PROCS_SIZE.to_bytes(8, "little"), 0)
                os.replace(tmp, self.path)
            os.fchmod(fd, 0o666)  # every CUDA consumer, whoever runs it, claims a slot here
            self._mm = mmap.mmap(fd, PROCS_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._t = ffi.from_buffer("struct mokka_procs *", self._mm)

    @staticmethod
    def _valid(fd: int) -> bool:
        if os.fstat(fd).st_size != PROCS_SIZE:
            return False
        head = os.pread(fd, 24, 0)
        return (
            int.from_bytes(head[:8], "little") == MAGIC
            and int.from_bytes(head[8:12], "little") == VERSION
            and int.from_bytes(head[16:24], "little") == PROCS_SIZE
        )

    def close(self) -> None:
        if self._t is not None:
            ffi.release(self._t)
            self._t = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def scan(self, gpu_count: int) -> list[tuple[tuple[int, int], ...]]:
        """Free the slots of dead processes; return, per GPU, the (pid, bytes) of every live
        process with a context or an allocation there."""
        t = self._t
        per_gpu: list[dict[int, int]] = [{} for _ in range(gpu_count)]
        gpus = range(min(gpu_count, MAX_GPUS))
        for s in range(min(t.high, SLOTS)):
            slot = t.slot[s]
            if slot.state != LIVE:
                continue
            pid, started, contexts = slot.pid, slot.start_time, slot.contexts
            if self.alive(pid) != started:
                self._free(s)
                log.info("process %d is gone: freed its GPU memory", pid)
                continue
            for g in gpus:
                used = t.mem[g][s]
                if contexts >> g & 1 or used:
                    # A wrapped (negative) count is a shim bug; report it as nothing allocated.
                    per_gpu[g][pid] = per_gpu[g].get(pid, 0) + (used if used < 1 << 63 else 0)
        return [tuple(sorted(d.items())) for d in per_gpu]

    def _free(self, s: int) -> None:
        """Only the daemon frees, and only slots whose owner is gone: nobody else writes them."""
        t = self._t
        t.slot[s].contexts = 0
        for g in range(MAX_GPUS):
            t.mem[g][s] = 0
        t.slot[s].pid = 0
        t.slot[s].start_time = 0
        t.slot[s].state = 0  # last: a claimer sees a clean slot (x86 keeps stores in order)

    def fold(self, controller: Controller) -> None:
        """One tick: a SetProcesses event for each GPU whose list changed."""
        node = controller.node
        for i, procs in enumerate(self.scan(len(node.gpus))):
            if procs == node.processes[i]:
                continue
            try:
                controller.apply(SetProcesses(i, procs))
            except InvalidCommand as e:
                log.warning("gpu%d: ignoring the process table: %s", i, e)

    async def run(self, controller: Controller) -> None:
        while True:
            self.fold(controller)
            await trio.sleep(TICK_S)
