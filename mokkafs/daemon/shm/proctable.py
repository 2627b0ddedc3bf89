"""The daemon's side of CUDA process accounting (layout and protocol in
shims/include/mokka_state.h): one sealed memfd record per CUDA process, made for and sent to that
process alone over `<state path>.procs.sock`, which it identifies by the kernel's word
(SO_PEERCRED, a pidfd), never by what it sends; folded into the model as validated
`SetProcesses` events on a short tick and at once when a process asks; re-opened by a restarted
daemon through /proc/<pid>/fd. The daemon never maps a record: pread and pwrite only."""
from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import resource
import select
import socket
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

import trio

from mokkafs.daemon.clock import Clock, WallClock
from mokkafs.daemon.controller import Controller
from mokkafs.model import InvalidCommand
from mokkafs.model.events import MAX_PID, MAX_PROCESS_BYTES, SetProcesses
from mokkafs.daemon.shm.layout import MAX_GPU_PROCS, MAX_GPUS, PROCS_LOCK_SUFFIX, PROCS_SOCK_SUFFIX, ffi, libc
from mokkafs.daemon.unix_listener import serve_unix

log = logging.getLogger(__name__)

TICK_S = 0.1
# `<state>.procs` is the stem of the accounting files: `.sock` and `.lock<N>` after it, as the
# header names them for the shims.
SUFFIX = PROCS_SOCK_SUFFIX.removesuffix(".sock")
assert PROCS_LOCK_SUFFIX == f"{SUFFIX}.lock", "mokka_state.h's process-table suffixes share one stem"
MAGIC = libc.MOKKA_PROCS_MAGIC
VERSION = libc.MOKKA_PROCS_VERSION
# Live records per uid. A node of 8 GPUs runs a few CUDA processes per GPU per user (a
# DataLoader's workers do not take contexts); 64 leaves room for that and bounds what one user
# can make the daemon hold (a record is 1 KiB of memory and two descriptors). Root is not capped:
# it can stop the daemon anyway, and a cap on it would only let others' usage matter to it.
PER_UID = libc.MOKKA_PROCS_PER_UID
CONNECTIONS_PER_UID = 2 * PER_UID  # reconnects after a daemon restart overlap old connections
FOLDS_PER_CONNECTION = 2 * MAX_GPUS + 8
RECORD_SIZE = ffi.sizeof("struct mokka_proc_record")
_CONTEXTS = ffi.offsetof("struct mokka_proc_record", "contexts")
_OTHERS = ffi.offsetof("struct mokka_proc_record", "others")
_PID = ffi.offsetof("struct mokka_proc_record", "pid")
MEMFD_NAME = "mokka-proc"
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
SO_PEERPIDFD = 77  # Linux 6.5+; older kernels: pidfd_open(pid), which a pid reuse could fool
MAX_ID_FILE = 1 << 20
ON_MIG = libc.MOKKA_PROC_ON_MIG  # mokka_proc_record.mig: the process is on a MIG device
Mig = tuple[int, int] | None  # (GPU instance id, compute instance id) of a process on a MIG device


def procs_path(state: str | os.PathLike) -> Path:
    """The stem of the process-accounting files of the state file `state` (the shims derive
    the socket's name alike)."""
    return Path(f"{os.fspath(state)}{SUFFIX}")


def sock_path(table: str | os.PathLike) -> Path:
    """The unix socket that hands each CUDA process its record."""
    return Path(f"{os.fspath(table)}.sock")


def lock_path(table: str | os.PathLike, gpu: int) -> Path:
    """GPU index `gpu`'s context lock: a CUDA process holds a flock on it while it has a context
    on that GPU, exclusive in EXCLUSIVE_PROCESS mode (docs/cuda.md, "Compute modes")."""
    return Path(f"{os.fspath(table)}.lock{gpu}")


def make_locks(table: str | os.PathLike, count: int) -> None:
    """Create the context locks of GPUs 0..count-1 where they are missing. One that exists is
    kept, never replaced: live processes hold their locks on it."""
    for i in range(min(count, MAX_GPUS)):
        path = lock_path(table, i)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o444)
        except OSError as e:
            log.warning("%s: %s: compute modes are not enforced on gpu%d", path, e, i)
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                log.warning("%s is not a regular file: compute modes are not enforced on gpu%d", path, i)
        finally:
            os.close(fd)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, names a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited. (poll, not select: with many records
    the daemon's descriptors go past select's 1024.)"""
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


def header(pid: int) -> bytes:
    return struct.pack("<QIIQ", MAGIC, VERSION, pid, RECORD_SIZE)


@dataclass(eq=False)
class Record:
    pid: int       # in the daemon's pid namespace: what NVML lists
    uid: int
    start: int
    pidfd: int
    fd: int        # the memfd
    dev: int = 0
    ino: int = 0
    others: tuple[int, ...] = ()  # what was last written into the record's `others`
    connections: int = 0

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.pidfd)


@dataclass(eq=False)
class _Limits:
    refused: dict[int, str] = field(default_factory=dict)  # per GPU: the last refusal's reason
    capped: set[int] = field(default_factory=set)          # uids told about being at their cap
    flooding: set[int] = field(default_factory=set)        # uids told about too many connections


class ProcessTable:
    """The live records. `path` (`<state path>.procs`) names their companions: `<path>.sock`,
    where processes connect, and `<path>.id`, which identifies the records for a successor."""

    def __init__(self, path: Path, clock: Clock | None = None, tick_s: float = TICK_S) -> None:
        self.path = Path(path)
        self.clock = WallClock() if clock is None else clock
        self.tick_s = tick_s
        self._first_record: trio.Event | None = None  # set by record_for while `run` idles
        # Pings received, and the last ping a fold has covered: one fold answers every ping
        # that came before it, so many processes asking at once cost one fold, not one each.
        self._pings = 0
        self._folded_upto = 0
        self.records: dict[int, Record] = {}
        self._connections: dict[int, int] = {}  # per uid
        self._limits = _Limits()
        self._complaints: set[str] = set()
        self.on_mig: list[dict[int, tuple[int, int]]] = []  # the last scan's, per GPU

    # -- records ---------------------------------------------------------------------------

    def open(self) -> None:
        """Adopt the live records a predecessor left (processes that outlive a daemon restart
        stay listed), and get descriptors enough for every uid's records."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1 << 20), hard))
        self._adopt()
        self._write_id()

    def close(self) -> None:
        for r in self.records.values():
            r.close()
        self.records.clear()

    def _make(self, pid: int, uid: int, start: int, pidfd: int) -> Record:
        fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, RECORD_SIZE)
            os.posix_fallocate(fd, 0, RECORD_SIZE)  # memory now, not a fault on a first store
            os.pwrite(fd, header(pid), 0)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)  # its holder may write it, never resize it
        except BaseException:
            os.close(fd)
            raise
        st = os.fstat(fd)
        return Record(pid, uid, start, pidfd, fd, st.st_dev, st.st_ino)

    @staticmethod
    def _valid(fd: int) -> bool:
        st = os.fstat(fd)
        return (st.st_size == RECORD_SIZE and fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
                and os.pread(fd, 8, 0) == MAGIC.to_bytes(8, "little"))

    def _write_id(self) -> None:
        """`<path>.id`: "pid start_time dev ino" per live record, replaced whole (tmp and
        rename), never following a link someone put in our way."""
        id_file = Path(f"{self.path}.id")
        tmp = id_file.with_name(f".{id_file.name}.new")
        text = "".join(f"{r.pid} {r.start} {r.dev} {r.ino}\n" for r in self.records.values())
        try:
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            tmp.replace(id_file)
        except OSError as e:
            self._complain(f"{id_file}: {e}: a restarted daemon will not find the live CUDA processes")

    def _read_id(self) -> list[tuple[int, int, int, int]]:
        id_file = Path(f"{self.path}.id")
        try:
            fd = os.open(id_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return []
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory by its fd number
            os.close(fd)
            log.warning("%s is not a regular file: adopting no CUDA processes", id_file)
            return []
        with os.fdopen(fd, "rb") as f:
            text = f.read(MAX_ID_FILE)
        rows = []
        for line in text.splitlines():
            try:
                pid, start, dev, ino = map(int, line.split())
            except ValueError:
                continue
            if 0 < pid < MAX_PID:
                rows.append((pid, start, dev, ino))
        return rows

    def _adopt(self) -> None:
        """Each record `<path>.id` names, re-opened through /proc/<pid>/fd of the process that
        still holds it, once its start time says the pid is still that process."""
        for pid, start, dev, ino in self._read_id():
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            fd = self._find(pid, dev, ino) if start_time(pid) == start else -1
            if fd < 0 or exited(pidfd):
                if fd >= 0:
                    os.close(fd)
                os.close(pidfd)
                continue
            try:
                uid = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                os.close(fd)
                os.close(pidfd)
                continue
            self.records[pid] = Record(pid, uid, start, pidfd, fd, dev, ino)
            log.info("adopted the CUDA process record of pid %d", pid)

    def _find(self, pid: int, dev: int, ino: int) -> int:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            return -1
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
                return fd
            os.close(fd)
        return -1

    def _complain(self, complaint: str) -> None:
        if complaint not in self._complaints:
            self._complaints.add(complaint)
            log.warning("%s", complaint)

    # -- folding ---------------------------------------------------------------------------

    def reap(self) -> None:
        """Drop the records of processes that exited (their pidfd says so)."""
        gone = [r for r in self.records.values() if exited(r.pidfd)]
        for r in gone:
            del self.records[r.pid]
            r.close()
            log.info("process %d is gone: freed its GPU memory", r.pid)
        if gone:
            self._write_id()

    def usage(self, caps: list[int]) -> tuple[dict[int, list[int]], dict[int, list[Mig]]]:
        """Per live record's pid, the bytes on each GPU (-1: no context and nothing there), and
        the MIG device it says it uses on each GPU ((GPU instance, compute instance), or None).
        Both are the process's own untrusted input: each counter is clamped to its GPU's memory,
        and an instance is only believed where the model has it (`fold`)."""
        gpus = min(len(caps), MAX_GPUS)
        out: dict[int, list[int]] = {}
        migs: dict[int, list[Mig]] = {}
        for r in self.records.values():
            t = ffi.from_buffer("struct mokka_proc_record *", bytearray(os.pread(r.fd, RECORD_SIZE, 0)))
            row, on = [], []
            for g in range(gpus):
                used = min(t.mem[g], caps[g], MAX_PROCESS_BYTES)
                row.append(used if used or t.contexts >> g & 1 else -1)
                m = t.mig[g]
                on.append((m >> 8 & 0xFF, m & 0xFF) if m & ON_MIG else None)
            out[r.pid] = row
            migs[r.pid] = on
        return out, migs

    def scan(self, caps: list[int]) -> list[tuple[tuple[int, int], ...]]:
        """Reap, then, per GPU, the (pid, bytes) of every live process with a context or an
        allocation there; and tell each record what counts against it. The MIG device each
        listed process is on is left in `self.on_mig` (per GPU, pid -> (gi, ci))."""
        self.reap()
        usage, migs = self.usage(caps)
        per_gpu: list[list[tuple[int, int]]] = [[] for _ in caps]
        for pid, row in usage.items():
            for g, used in enumerate(row):
                if used >= 0:
                    per_gpu[g].append((pid, used))
        self._tell_others(usage, migs, caps)
        listed = [tuple(sorted(self._fair(p))) for p in per_gpu]
        self.on_mig = [{pid: migs[pid][g] for pid, _ in procs if migs[pid][g] is not None}
                       for g, procs in enumerate(listed)]
        return listed

    def _fair(self, procs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """At most MAX_GPU_PROCS of one GPU's processes (what the state file lists), chosen so
        that one user's many processes cannot push anyone else's out: root's first, then each
        uid's first, second, ... process in turn."""
        if len(procs) <= MAX_GPU_PROCS:
            return procs
        rank: dict[int, int] = {}
        keyed = []
        for pid, used in sorted(procs):
            uid = self.records[pid].uid
            rank[uid] = rank.get(uid, 0) + 1
            keyed.append(((uid != 0, rank[uid], pid), (pid, used)))
        return [p for _, p in sorted(keyed)[:MAX_GPU_PROCS]]

    def _tell_others(self, usage: dict[int, list[int]], migs: dict[int, list[Mig]], caps: list[int]) -> None:
        """Write each record's `others`: its uid's other processes' and root's bytes per GPU,
        or, for a process on a MIG device, on that GPU instance (its memory is the instance's).
        Other users' claims are listed but refuse nobody: a claim is not an allocation."""
        gpus = min(len(caps), MAX_GPUS)
        # (uid, GPU, GPU instance or None) -> bytes
        by_uid: dict[tuple[int, int, int | None], int] = {}
        for r in self.records.values():
            for g, used in enumerate(usage[r.pid]):
                where = migs[r.pid][g]
                key = (r.uid, g, None if where is None else where[0])
                by_uid[key] = by_uid.get(key, 0) + max(used, 0)
        for r in self.records.values():
            mine, on = usage[r.pid], migs[r.pid]

            def other(g: int) -> int:
                gi = None if on[g] is None else on[g][0]
                same = by_uid.get((r.uid, g, gi), 0) - max(mine[g], 0)
                root = by_uid.get((0, g, gi), 0) if r.uid else 0
                return min(same + root, caps[g])

            others = tuple(other(g) for g in range(gpus))
            if others != r.others:
                os.pwrite(r.fd, struct.pack(f"<{gpus}Q", *others), _OTHERS)
                r.others = others

    def fold(self, controller: Controller) -> None:
        """A SetProcesses event for each GPU whose list changed."""
        node = controller.node
        cap = node.profile.memory.total_mib << 20
        for i, procs in enumerate(self.scan([cap] * len(node.gpus))):
            # Only an instance the GPU has: a record naming another lies about itself, and is
            # listed on the parent GPU alone.
            live = {(g.id, c.id) for g in node.mig_instances(i) for c in g.compute}
            instances = tuple(sorted((pid, gi, ci) for pid, (gi, ci) in self.on_mig[i].items() if (gi, ci) in live))
            # A process on a MIG device cannot hold more than its GPU instance has: its counter
            # is clamped there, as a GPU's is to the GPU (a claim is not an allocation).
            room = node.gi_memory_bytes(i)
            gi_of = {pid: gi for pid, gi, _ in instances}
            procs = tuple((pid, min(used, room[gi_of[pid]]) if pid in gi_of else used) for pid, used in procs)
            if procs == node.processes[i] and dict(node.process_instances[i]) == {p: (g, c) for p, g, c in instances}:
                continue
            try:
                controller.apply(SetProcesses(i, procs, instances))
                self._limits.refused.pop(i, None)
            except InvalidCommand as e:
                if self._limits.refused.get(i) != str(e):  # once per distinct reason, not every tick
                    log.warning("gpu%d: ignoring the process records: %s", i, e)
                    self._limits.refused[i] = str(e)

    async def _fold_for_ping(self, controller: Controller) -> None:
        """Fold so that this ping's record is in the model: a ping sent after its record was
        written is covered by any fold that starts after it was received. Yield once first, so
        the pings that arrived together are all received and one fold answers them all."""
        self._pings += 1
        mine = self._pings
        await trio.lowlevel.checkpoint()
        if self._folded_upto < mine:
            self._folded_upto = self._pings
            self.fold(controller)

    async def run(self, controller: Controller) -> None:
        """Fold every `tick_s` while there is anything to fold. With no record and no process
        listed, nothing can change until a process connects: wait for that instead of waking
        the daemon ten times a second for nothing."""
        while True:
            self.fold(controller)
            if self.records or any(controller.node.processes):
                await self.clock.sleep(self.tick_s)
                continue
            self._first_record = trio.Event()
            try:
                await self._first_record.wait()
            finally:
                self._first_record = None

    # -- connections -----------------------------------------------------------------------

    def record_for(self, pid: int, uid: int, pidfd: int) -> Record | None:
        """The record of the process (pid, uid, pidfd): its own from before (a reconnect, or
        one adopted after a restart, if the start time matches), else a new one; None when the
        uid is at its cap. Takes ownership of pidfd."""
        start = start_time(pid)
        old = self.records.get(pid)
        if start is None or exited(pidfd):
            os.close(pidfd)
            return None
        if old is not None and old.start == start and old.uid == uid:
            os.close(pidfd)
            return old
        if old is not None:  # the pid was reused before the tick noticed the old one exit
            del self.records[pid]
            old.close()
        if uid and sum(r.uid == uid for r in self.records.values()) >= PER_UID:
            if uid not in self._limits.capped:
                self._limits.capped.add(uid)
                log.warning("uid %d has %d CUDA processes accounted, its cap: pid %d and later ones run "
                            "unaccounted", uid, PER_UID, pid)
            os.close(pidfd)
            return None
        self._limits.capped.discard(uid)
        r = self._make(pid, uid, start, pidfd)
        self.records[pid] = r
        self._write_id()
        if self._first_record is not None:
            self._first_record.set()
        return r

    async def serve(self, controller: Controller | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Keep `<path>.sock` bound, any user's CUDA process may ask (`unix_listener`), and give
        each connection a task of its own. A path past sun_path's 108 bytes is bound through its
        directory (unix_path), and libcuda connects the same way. Without a socket (one that
        cannot be bound) CUDA processes run unaccounted; the daemon runs on."""
        if controller is not None:
            make_locks(self.path, len(controller.node.gpus))
        await serve_unix(sock_path(self.path), lambda conn: self._connection(conn, controller), self.clock,
                         "CUDA processes go unaccounted", task_status=task_status)

    @staticmethod
    def _peer(conn) -> tuple[int, int, int]:
        """(pid, uid, pidfd) of the connecting process, from the kernel."""
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        try:
            pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError:
            pidfd = os.pidfd_open(pid) if pid > 0 else -1
        return pid, uid, pidfd

    async def _connection(self, conn, controller: Controller | None) -> None:
        """One process's connection, for its life: its record, then a reply to each byte it
        sends, after its record was folded and published."""
        with conn:
            try:
                pid, uid, pidfd = self._peer(conn)
            except OSError as e:
                log.warning("%s: cannot identify a CUDA process (%s): it runs unaccounted", self.path, e)
                return
            if not 0 < pid < MAX_PID or pidfd < 0:
                if pidfd >= 0:
                    os.close(pidfd)
                self._complain("a CUDA process in a pid namespace this daemon cannot see runs unaccounted; "
                               "run the daemon in the host's pid namespace (hostPID)")
                return
            if uid and self._connections.get(uid, 0) >= CONNECTIONS_PER_UID:
                os.close(pidfd)
                if uid not in self._limits.flooding:
                    self._limits.flooding.add(uid)
                    log.warning("uid %d has %d connections open to %s: refusing more", uid, CONNECTIONS_PER_UID,
                                sock_path(self.path))
                return
            self._connections[uid] = self._connections.get(uid, 0) + 1
            try:
                r = self.record_for(pid, uid, pidfd)
                try:
                    if r is None:
                        await conn.send(b"\0")  # unaccounted: no descriptor
                        return
                    await conn.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r.fd]))])
                    folds = 0
                    while await conn.recv(64):
                        # A shim asks at most twice per GPU (a first context, first memory) and
                        # after a reconnect: past that budget a connection's pings are answered
                        # without a fold, so pinging in a loop cannot keep the daemon busy.
                        if controller is not None and folds < FOLDS_PER_CONNECTION:
                            folds += 1
                            await self._fold_for_ping(controller)
                        await conn.send(b"\1")
                except OSError as e:
                    if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                        log.warning("%s: %s", sock_path(self.path), e)
            finally:
                self._connections[uid] -= 1
                if self._connections[uid] < CONNECTIONS_PER_UID:
                    self._limits.flooding.discard(uid)
