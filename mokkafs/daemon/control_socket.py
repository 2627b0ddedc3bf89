"""The daemon's control socket `<state path>.ctl.sock`: the write channel of NVML's setters, `mokka
inject` and the agent. One command of the vocabulary per connection, from a caller the kernel
names (SO_PEERCRED), with the control files' rule (root or `--control-group`); applied through the
controller like every event, and answered once it is published, so when a setter returns every
process sees the change. Bounded: a request's size, a timeout, connections per uid; refusals
logged once per kind and counted (docs/setters.md)."""
from __future__ import annotations

import errno
import logging
import os
import select
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from mokkafs.daemon.caller import administrator
from mokkafs.daemon.clock import Clock
from mokkafs.daemon.control_protocol import (
    BUSY,
    ERROR,
    GPU_IS_LOST,
    IN_USE,
    INSUFFICIENT_RESOURCES,
    INVALID_ARGUMENT,
    MAX_REQUEST,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    OK,
    TIMEOUT_S,
    Reply,
    control_path,
)
from mokkafs.daemon.controller import Controller
from mokkafs.model import InvalidCommand
from mokkafs.model.commands import parse_line
from mokkafs.model.config import GpuIsLost, NotSupported
from mokkafs.model.mig import InsufficientResources, InUse, NotFound
from mokkafs.daemon.ratelimit import RateLimiter, RefusalLog, Summary
from mokkafs.daemon.unix_listener import serve_unix

log = logging.getLogger(__name__)

# Open connections per uid other than root (root is not capped: it can stop the daemon anyway).
# A setter holds one for well under a millisecond; a few threads of a few tools setting at once
# fit, a flood does not pin descriptors.
CONNECTIONS_PER_UID = 8
MAX_REASON = 200  # a reply or log line quotes at most this much of a reason (it may echo input)


@dataclass(frozen=True)
class Caller:
    """Who is on the other end, by the kernel's word (attribute names as pyfuse3's context)."""

    pid: int
    uid: int
    gid: int


def peer(sock) -> Caller:
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return Caller(pid, uid, gid)


def _printable(text: str) -> str:
    text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _gave_up(conn) -> bool:
    """Has the caller closed its end? A client keeps its connection open until it has the
    reply, so a hang-up after a whole request means it stopped waiting for one."""
    p = select.poll()
    p.register(conn.fileno(), select.POLLRDHUP)
    return any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in p.poll(0))


def status_of(e: InvalidCommand) -> str:
    if isinstance(e, NotSupported):
        return NOT_SUPPORTED
    if isinstance(e, GpuIsLost):
        return GPU_IS_LOST
    if isinstance(e, InsufficientResources):
        return INSUFFICIENT_RESOURCES
    if isinstance(e, InUse):
        return IN_USE
    if isinstance(e, NotFound):
        return NOT_FOUND
    return INVALID_ARGUMENT


class ControlSocket:
    """Serves `path`; `may_write(caller)` is the control files' rule (MokkaOperations.may_write)."""

    def __init__(
        self,
        path: Path,
        controller: Controller,
        may_write: Callable[[Caller], bool],
        clock: Clock,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.path = Path(path)
        self.controller = controller
        self.may_write = may_write
        self.clock = clock
        self.refusals = RefusalLog(clock, self._log_summary, limiter)
        self._connections: dict[int, int] = {}
        self.answered: dict[str, int] = {}  # replies by status, for tests and metrics

    # -- one request ----------------------------------------------------------------------

    def handle(self, caller: Caller, request: bytes) -> Reply:
        """Decide and apply one request (a line, newline included); the reply to send."""
        if not self.may_write(caller):
            return self._refuse(caller, NO_PERMISSION, "root and the control group only", request)
        if caller.uid == 0 and not administrator(caller.pid):
            # The driver's own check for a privileged call is CAP_SYS_ADMIN, not uid 0: root in a
            # container (which drops that capability) is refused, as on a real node.
            return self._refuse(caller, NO_PERMISSION, "root without CAP_SYS_ADMIN (a container's root)", request)
        if not request.endswith(b"\n"):
            return self._refuse(caller, INVALID_ARGUMENT, f"a request is one line of at most {MAX_REQUEST} bytes",
                                request)
        try:
            line = request[:-1].decode("ascii")
        except UnicodeDecodeError:
            return self._refuse(caller, INVALID_ARGUMENT, "not ASCII", request)
        try:
            command = parse_line(line, gpus=len(self.controller.node.gpus))
            outcome = self.controller.apply(command.event)
        except InvalidCommand as e:
            return self._refuse(caller, status_of(e), str(e), request)
        except Exception:
            if self._first((ERROR, caller.uid)):
                log.exception("%s: internal error on %r", self.path.name, _printable(line))
            return self._count(Reply(ERROR, "internal error; see the daemon's log"))
        # A MIG create answers with what it made (docs/mig.md); other commands with nothing.
        return self._count(Reply(OK, outcome.reply))

    def _count(self, reply: Reply) -> Reply:
        self.answered[reply.status] = self.answered.get(reply.status, 0) + 1
        return reply

    def _first(self, key) -> bool:
        return self.refusals.first(key)

    def _log_summary(self, summary: Summary) -> None:
        status, uid = summary.key
        log.warning("%s: %s from uid %d: %s", self.path.name, status, uid, summary.line())

    def flush_refusals(self, everything: bool = False) -> None:
        self.refusals.flush(everything)

    def _refuse(self, caller: Caller, status: str, reason: str, request: bytes) -> Reply:
        reason = _printable(reason)
        if self._first((status, caller.uid)):
            shown = _printable(request.rstrip(b"\n").decode("ascii", "replace"))
            log.warning("%s: %s from uid %d pid %d: %r: %s", self.path.name, status, caller.uid, caller.pid,
                        shown, reason)
        return self._count(Reply(status, reason))

    # -- the socket -----------------------------------------------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Keep the socket bound and give each connection a task (`unix_listener`). Anyone may
        connect: a caller who may not write gets NO_PERMISSION, as from the real driver, rather
        than a refused connection. Without a socket (a directory it cannot bind in, say), setters
        fail with an error and the daemon runs on."""
        await serve_unix(self.path, self._connection, self.clock, "setters will fail",
                         on_idle=self.flush_refusals, task_status=task_status)

    async def _connection(self, conn) -> None:
        with conn:
            await self.converse(conn)

    async def converse(self, conn, prefix: bytes = b"") -> None:
        """One request on `conn` and its reply. `prefix`: what the caller already sent (the node's
        socket reads a request's first bytes before it hands the connection here)."""
        try:
            caller = peer(conn)
        except OSError as e:
            log.warning("%s: cannot identify a caller (%s)", self.path, e)
            return
        count = self._connections.get(caller.uid, 0)
        if caller.uid and count >= CONNECTIONS_PER_UID:
            reply = self._refuse(caller, BUSY, f"more than {CONNECTIONS_PER_UID} connections open", b"")
            await self._send(conn, reply)
            return
        self._connections[caller.uid] = count + 1
        try:
            request = await self._read(conn, prefix)
            if request is None:
                self._refuse(caller, INVALID_ARGUMENT, f"no request within {TIMEOUT_S:g} s", b"")
                return
            if request.endswith(b"\n") and _gave_up(conn):
                # Its 2 s ran out while the daemon was not serving (stopped, or far behind):
                # the caller was told the daemon did not answer, so nothing may change now.
                self._refuse(caller, ERROR, "the caller gave up waiting before the command was applied; "
                             "not applied", request)
                return
            await self._send(conn, self.handle(caller, request))
        finally:
            self._connections[caller.uid] -= 1
            if not self._connections[caller.uid]:
                del self._connections[caller.uid]

    # A setter's request is on the socket by the time its connection is served, and its reply
    # fits the socket's buffer: both are tried at once on the (non-blocking) descriptor, and the
    # loop is waited on only when the data is not there yet. trio's recv and send would each
    # yield to the loop even then, two scheduler passes on the way to every setter's answer.

    @staticmethod
    async def _read(conn, prefix: bytes = b"") -> bytes | None:
        """One line of at most MAX_REQUEST bytes (what came, if the caller stopped short or
        sent more); None if nothing whole came within the timeout."""
        data = prefix[:MAX_REQUEST]
        with trio.move_on_after(TIMEOUT_S):
            while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
                try:
                    chunk = os.read(conn.fileno(), MAX_REQUEST - len(data))
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(conn)
                    continue
                except OSError:
                    return None
                if not chunk:
                    return data
                data += chunk
            return data
        return None

    @staticmethod
    async def _send(conn, reply: Reply) -> None:
        data = memoryview((f"{reply.status} {reply.message}".rstrip() + "\n").encode("ascii"))
        try:
            with trio.move_on_after(TIMEOUT_S):  # a caller that does not read is not waited for
                while data:
                    try:
                        data = data[os.write(conn.fileno(), data):]
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(conn)
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.warning("%s", e)


__all__ = ["ControlSocket", "Caller", "control_path"]
