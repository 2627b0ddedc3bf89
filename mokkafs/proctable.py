"""The daemon's side of the CUDA process table `<state path>.procs` (layout and protocol in
shims/include/mokka_state.h): create it, hand a read-write descriptor to consumers that may not
open it themselves, free the slots of processes that are gone (their lock is gone with them),
and fold the live ones into the model as validated `SetProcesses` events on a short tick.

The daemon never maps the file: it reads it with pread and frees slots with pwrite, so a table
that someone truncates or replaces costs a warning and a fresh table, never a SIGBUS."""
from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import socket
import struct
from pathlib import Path

import trio

from mokkafs.controller import Controller
from mokkafs.model import InvalidCommand
from mokkafs.model.events import MAX_PID, MAX_PROCESS_BYTES, SetProcesses
from mokkafs.publisher import MAX_GPUS, _libc, ffi

log = logging.getLogger(__name__)

TICK_S = 0.1
SUFFIX = ".procs"
MAGIC = 0x53434F5250414B4D
VERSION = _libc.MOKKA_PROCS_VERSION
SLOTS = _libc.MOKKA_PROC_SLOTS
PROCS_SIZE = ffi.sizeof("struct mokka_procs")
HEADER = MAGIC.to_bytes(8, "little") + VERSION.to_bytes(4, "little") + SLOTS.to_bytes(4, "little")
HEADER += PROCS_SIZE.to_bytes(8, "little")
LIVE = 2
_SLOT = ffi.sizeof("struct mokka_proc_slot")
_SLOT0 = ffi.offsetof("struct mokka_procs", "slot")
_STATE = ffi.offsetof("struct mokka_proc_slot", "state")
_FLOCK = "@hhqqi4x"  # struct flock on Linux (x86_64 and aarch64 alike)


def procs_path(state: str | os.PathLike) -> Path:
    """Where the process table of the state file `state` lives (the shims derive it alike)."""
    return Path(f"{os.fspath(state)}{SUFFIX}")


def sock_path(table: str | os.PathLike) -> Path:
    """The unix socket that hands out descriptors of the table at `table`."""
    return Path(f"{os.fspath(table)}.sock")


def lock_owner(fd: int, s: int) -> int | None:
    """The pid (in our pid namespace; 0 if it is not visible from here) that holds the lock on
    slot `s`, or None when nobody does: the slot's process is gone."""
    probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, s, 1, 0)
    l_type, _, _, _, l_pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    return None if l_type == fcntl.F_UNLCK else l_pid


class ProcessTable:
    """Owns `<state path>.procs`. `scan()` reaps and returns each GPU's (pid, bytes) list."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = -1
        self._id: tuple[int, int] | None = None  # (st_dev, st_ino) of the table we own
        self._complaint: str | None = None  # the last warning, so a lasting fault logs once
        self._refused: dict[int, str] = {}
        self._blind = False  # warned once that a lock owner's pid was not visible

    # -- the file --------------------------------------------------------------------------

    def open(self) -> None:
        """Create the table, or adopt a valid one: processes that outlive a daemon restart keep
        their slots. Anything else is replaced by a rename, never truncated under a writer."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = -1
        if fd >= 0 and not self._valid(fd):
            if os.fstat(fd).st_size:
                log.warning("%s: replacing an incompatible process table", self.path)
            os.close(fd)
            fd = -1
        if fd < 0:
            fd = self._create()
        self._adopt(fd)

    def _create(self) -> int:
        tmp = self.path.with_name(f".{self.path.name}.new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            # Allocated, not sparse: a consumer's first store into a page must not meet a full disk.
            os.posix_fallocate(fd, 0, PROCS_SIZE)
            os.pwrite(fd, HEADER, 0)
            os.fchmod(fd, 0o644)  # writers that are not the owner get a descriptor from serve()
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd

    def _adopt(self, fd: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        st = os.fstat(fd)
        self._fd, self._id = fd, (st.st_dev, st.st_ino)

    @staticmethod
    def _valid(fd: int) -> bool:
        st = os.fstat(fd)
        return st.st_size == PROCS_SIZE and os.pread(fd, len(HEADER), 0) == HEADER

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _ensure(self) -> bool:
        """Is the table at our path still the intact file we made? If someone removed, replaced,
        truncated or scribbled over it, put a fresh one in its place (processes still mapping
        the old one go unlisted) and say so once."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self._id and self._valid(self._fd):
                self._complaint = None
                return True
            what = "damaged or replaced"
        except FileNotFoundError:
            what = "removed"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._adopt(self._create())
            complaint = f"{self.path}: the process table was {what}; made a new one"
        except OSError as e:
            complaint = f"{self.path}: the process table was {what} and cannot be made again: {e}"
        if complaint != self._complaint:
            log.warning("%s", complaint)
            self._complaint = complaint
        return self._fd >= 0 and self._valid(self._fd)

    # -- reaping and folding -----------------------------------------------------------------

    def read(self):
        """A private snapshot of the table (a `struct mokka_procs *` over a copy)."""
        return ffi.from_buffer("struct mokka_procs *", bytearray(os.pread(self._fd, PROCS_SIZE, 0)))

    def scan(self, caps: list[int]) -> list[tuple[tuple[int, int], ...]]:
        """Free the slots of dead processes; return, per GPU, the (pid, bytes) of every live
        process with a context or an allocation there. `caps[g]` is GPU g's memory in bytes:
        counters are the shims' untrusted input, so each is clamped to it."""
        per_gpu: list[dict[int, int]] = [{} for _ in caps]
        if not self._ensure():
            return [()] * len(caps)
        t = self.read()
        gpus = range(min(len(caps), MAX_GPUS))
        for s in range(SLOTS):  # every slot: a claimer may die before it raises `high`
            slot = t.slot[s]
            if slot.state == 0:
                continue
            owner = lock_owner(self._fd, s)
            if owner is None:
                self._free(s)
                if slot.state == LIVE:
                    log.info("process %d is gone: freed its GPU memory", slot.pid)
                continue
            pid = owner or slot.pid  # 0: the owner is in a pid namespace we cannot see
            if not owner and not self._blind:
                self._blind = True
                log.warning("a CUDA process in a pid namespace this daemon cannot see is listed with "
                            "its own pid %d; run the daemon in the host's pid namespace (hostPID)", slot.pid)
            if slot.state != LIVE or not 0 < pid < MAX_PID:
                continue
            for g in gpus:
                used = min(t.mem[g][s], caps[g], MAX_PROCESS_BYTES)
                if slot.contexts >> g & 1 or used:
                    per_gpu[g][pid] = min(per_gpu[g].get(pid, 0) + used, caps[g], MAX_PROCESS_BYTES)
        return [tuple(sorted(d.items())) for d in per_gpu]

    def _free(self, s: int) -> None:
        """Only the daemon frees, and only slots whose owner is gone: nobody else writes them.
        The state goes last, in its own write, so a claimer never sees a half-cleared slot."""
        base = _SLOT0 + s * _SLOT
        os.pwrite(self._fd, bytes(_SLOT - _STATE - 4), base + _STATE + 4)
        os.pwrite(self._fd, bytes(4), base + _STATE)

    def fold(self, controller: Controller) -> None:
        """One tick: a SetProcesses event for each GPU whose list changed."""
        node = controller.node
        cap = node.profile.memory.total_mib << 20
        for i, procs in enumerate(self.scan([cap] * len(node.gpus))):
            if procs == node.processes[i]:
                continue
            try:
                controller.apply(SetProcesses(i, procs))
                self._refused.pop(i, None)
            except InvalidCommand as e:
                if self._refused.get(i) != str(e):  # once per distinct reason, not every tick
                    log.warning("gpu%d: ignoring the process table: %s", i, e)
                    self._refused[i] = str(e)

    async def run(self, controller: Controller) -> None:
        while True:
            self.fold(controller)
            await trio.sleep(TICK_S)

    # -- descriptors for consumers that may not open the file ------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer each connection on `<state path>.procs.sock` with one byte and a read-write
        descriptor of the table, then close it. Without the socket (a path too long for
        sun_path, say) only the table's owner gets accounted; the daemon runs on."""
        path = sock_path(self.path)
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                path.unlink(missing_ok=True)
                await listener.bind(os.fspath(path))
                os.chmod(path, 0o666)  # any user's CUDA process may ask
                listener.listen(64)
            except OSError as e:
                log.warning("%s: no descriptor service (%s): only the table's owner is accounted", path, e)
                task_status.started()
                return
            task_status.started()
            while True:
                try:
                    conn, _ = await listener.accept()
                except OSError as e:  # out of descriptors, say: this consumer goes unaccounted
                    log.warning("%s: %s", path, e)
                    await trio.sleep(0.1)
                    continue
                with conn:
                    try:
                        fds = array.array("i", [self._fd])
                        await conn.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                    except OSError as e:
                        if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                            log.warning("%s: %s", path, e)
        finally:
            listener.close()
