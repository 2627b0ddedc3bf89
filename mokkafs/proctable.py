"""The daemon's side of the CUDA process table (layout and protocol in
shims/include/mokka_state.h): a sealed memfd that nobody can resize, so no mapping of it can
fault; handed to every CUDA process over `<state path>.procs.sock`; adopted by a restarted
daemon from a process that still holds it. The daemon frees the slots of processes that are gone
(their lock is gone with them) and folds the live ones into the model as validated
`SetProcesses` events on a short tick. It never maps the table: pread and pwrite only."""
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
from mokkafs.publisher import MAX_GPUS, _libc, fence, ffi

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


MEMFD_NAME = "mokka-procs"
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class ProcessTable:
    """Owns the table. `path` (`<state path>.procs`) names its companions: `<path>.sock`, the
    descriptor service, and `<path>.id`, which identifies the memfd for a successor."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = -1
        self._complaint: str | None = None  # the last warning, so a lasting fault logs once
        self._refused: dict[int, str] = {}
        self._blind = False  # warned once that a lock owner's pid was not visible
        self._accept_error: str | None = None

    # -- the table -------------------------------------------------------------------------

    def open(self) -> None:
        """Adopt a predecessor's table from a process still holding it (processes that outlive
        a daemon restart keep their slots), or make a new one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._recover()
        if fd < 0:
            fd = self._create()
        self._fd = fd
        st = os.fstat(fd)
        id_file = Path(f"{self.path}.id")
        tmp = id_file.with_name(f".{id_file.name}.new")
        tmp.write_text(f"{st.st_dev} {st.st_ino}\n")
        tmp.replace(id_file)

    @staticmethod
    def _create() -> int:
        fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, PROCS_SIZE)
            os.posix_fallocate(fd, 0, PROCS_SIZE)  # memory now, not a fault on a first store
            os.pwrite(fd, HEADER, 0)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)  # a holder may write it, never resize it
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _recover(self) -> int:
        """The table `<path>.id` names, opened through /proc/<pid>/fd of a process holding it
        (a CUDA process that outlived the last daemon); -1 if there is none, or we may not."""
        try:
            dev, ino = map(int, Path(f"{self.path}.id").read_text().split())
        except (OSError, ValueError):
            return -1
        with os.scandir("/proc") as entries:
            pids = [e.name for e in entries if e.name.isdigit()]
        for pid in pids:
            fds = f"/proc/{pid}/fd"
            try:
                names = os.listdir(fds)
            except OSError:
                continue
            for n in names:
                link = f"{fds}/{n}"
                try:
                    if not os.readlink(link).startswith(f"/memfd:{MEMFD_NAME}"):
                        continue
                    st = os.stat(link)
                    if (st.st_dev, st.st_ino) != (dev, ino):
                        continue
                    fd = os.open(link, os.O_RDWR | os.O_CLOEXEC)
                except OSError:
                    continue
                if self._valid(fd):
                    log.info("adopted the process table held by pid %s", pid)
                    return fd
                os.close(fd)
        return -1

    @staticmethod
    def _valid(fd: int) -> bool:
        st = os.fstat(fd)
        return (st.st_size == PROCS_SIZE and fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
                and os.pread(fd, len(HEADER), 0) == HEADER)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _ensure_header(self, snapshot: bytes) -> None:
        """Every holder may write the table; one that scribbles over the header gets it
        rewritten (the size is sealed, so nothing else can go wrong with the file)."""
        if snapshot[: len(HEADER)] == HEADER:
            self._complaint = None
            return
        os.pwrite(self._fd, HEADER, 0)
        complaint = "the process table's header was overwritten by a consumer; rewrote it"
        if complaint != self._complaint:
            log.warning("%s", complaint)
            self._complaint = complaint

    # -- reaping and folding -----------------------------------------------------------------

    def read(self, snapshot: bytes | None = None):
        """A private snapshot of the table (a `struct mokka_procs *` over a copy)."""
        if snapshot is None:
            snapshot = os.pread(self._fd, PROCS_SIZE, 0)
        return ffi.from_buffer("struct mokka_procs *", bytearray(snapshot))

    def scan(self, caps: list[int]) -> list[tuple[tuple[int, int], ...]]:
        """Free the slots of dead processes; return, per GPU, the (pid, bytes) of every live
        process with a context or an allocation there. `caps[g]` is GPU g's memory in bytes:
        counters are the shims' untrusted input, so each is clamped to it."""
        per_gpu: list[dict[int, int]] = [{} for _ in caps]
        snapshot = os.pread(self._fd, PROCS_SIZE, 0)
        self._ensure_header(snapshot)
        t = self.read(snapshot)
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
        fence()  # a syscall is no barrier on Arm
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

    # -- descriptors for consumers ---------------------------------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer each connection on `<path>.sock` with one byte and a read-write descriptor of
        the table, then close it. A socket someone removed or replaced is bound again within a
        second. Without a socket (a path too long for sun_path, say) CUDA processes run
        unaccounted; the daemon runs on."""
        path = sock_path(self.path)
        started = False
        while True:
            listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with listener:
                try:
                    path.unlink(missing_ok=True)
                    await listener.bind(os.fspath(path))
                    os.chmod(path, 0o666)  # any user's CUDA process may ask
                    listener.listen(64)
                    bound = os.stat(path).st_ino
                except OSError as e:
                    log.warning("%s: no descriptor service (%s): CUDA processes go unaccounted", path, e)
                    if not started:
                        task_status.started()
                    return
                if not started:
                    task_status.started()
                    started = True
                while True:
                    conn = None
                    with trio.move_on_after(1):
                        try:
                            conn, _ = await listener.accept()
                        except OSError as e:  # out of descriptors, say: this one goes unaccounted
                            if str(e) != self._accept_error:  # once, not ten times a second
                                log.warning("%s: %s", path, e)
                                self._accept_error = str(e)
                            await trio.sleep(0.1)
                            continue
                    self._accept_error = None
                    if conn is not None:
                        await self._answer(conn, path)
                        continue
                    try:  # a quiet second: is our socket still where consumers look for it?
                        if os.stat(path).st_ino == bound:
                            continue
                    except FileNotFoundError:
                        pass
                    log.warning("%s was removed or replaced; binding it again", path)
                    break

    async def _answer(self, conn, path: Path) -> None:
        with conn:
            try:
                fds = array.array("i", [self._fd])
                await conn.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            except OSError as e:
                if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                    log.warning("%s: %s", path, e)
