"""The metrics edge: a small trio HTTP/1.x server answering `GET /metrics` with the live node's
text, in the daemon's own trio loop (so it reads the model between events, never during one). The
text is made once per model change and served again until something it shows has changed
(`Exposition`, render/metrics.py; docs/metrics.md).
"""
from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from mokkafs.daemon.controller import Controller
from mokkafs.daemon.ratelimit import RefusalLog, Summary
from mokkafs.render.metrics import CONTENT_TYPE, DEFAULT_HOSTNAME_LABEL, Exposition

log = logging.getLogger(__name__)

DEFAULT_PORT = 9400  # dcgm-exporter's
DEFAULT_HOST = "127.0.0.1"  # loopback unless asked: a simulator should not appear on the network
DEFAULT_LISTEN = f"{DEFAULT_HOST}:{DEFAULT_PORT}"

MAX_REQUEST_BYTES = 16 * 1024  # request line and headers; a scraper sends a few hundred
# A connection's whole life (request in, response out): a scraper needs milliseconds; a client
# that sends nothing, or reads nothing, is dropped, not waited on.
REQUEST_TIMEOUT_S = 5.0
# Connections served at once. Prometheus and dcgm-exporter's consumers scrape one at a time per
# target; any local user can connect, so this bounds the descriptors and memory they can make
# the daemon (which also serves the FUSE edge and the control socket) hold. Over it, a new
# connection is closed at once.
MAX_CONNECTIONS = 32


def parse_listen(spec: str) -> tuple[str | None, int]:
    """`[HOST:]PORT` -> (host, port). `PORT` alone binds loopback; `:PORT` (Go's spelling, as in
    dcgm-exporter's `-a :9400`) binds every interface, returned as host None; `[::1]:PORT` is
    IPv6. Raises ValueError naming what is wrong."""
    spec = spec.strip()
    if not spec:
        raise ValueError("empty address; expected [HOST:]PORT")
    if spec.startswith("["):
        host, sep, port = spec[1:].partition("]:")
        if not sep or not host:
            raise ValueError(f"{spec!r}: expected [IPV6]:PORT")
    elif ":" in spec:
        host, _, port = spec.rpartition(":")
        if ":" in host:
            raise ValueError(f"{spec!r}: an IPv6 address goes in brackets, [ADDR]:PORT")
    else:
        host, port = DEFAULT_HOST, spec
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{spec!r}: port must be a number 0..65535")
    return (host or None), int(port)


@dataclass
class Response:
    status: int
    reason: str
    body: bytes | list[bytes]  # or the byte strings it is made of, in order (a scrape's parts)
    content_type: str = "text/plain; charset=utf-8"

    def encode(self, head_only: bool = False) -> bytes:
        parts = [self.body] if isinstance(self.body, bytes) else self.body
        head = (
            f"HTTP/1.1 {self.status} {self.reason}\r\n"
            f"Content-Type: {self.content_type}\r\n"
            f"Content-Length: {sum(map(len, parts))}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        # One copy of a 600 KB scrape, not two (the parts joined, then the head prepended).
        return head if head_only else b"".join([head, *parts])


class MetricsServer:
    """Answers scrapes from the model that `controller` holds; `fuse_counters` returns
    (operations, errors) of the FUSE edge, or is None when there is none."""

    def __init__(
        self,
        controller: Controller,
        fuse_counters: Callable[[], tuple[int, int]] | None = None,
        clock: Callable[[], float] = time.time,
        hostname_label: str = DEFAULT_HOSTNAME_LABEL,
    ) -> None:
        self.controller = controller
        self.fuse_counters = fuse_counters
        self.clock = clock
        self.hostname_label = hostname_label
        self.exposition = Exposition(hostname_label=hostname_label)
        self.scrapes = 0
        self.connections = 0  # being served now
        self.refused = 0  # connections closed at once: MAX_CONNECTIONS were being served
        # One line per kind of trouble, its repeats summarised: any local user can reset
        # connections as fast as it likes, and each line would otherwise rotate history away.
        self.refusals = RefusalLog(clock, self._log_summary)

    @staticmethod
    def _log_summary(summary: Summary) -> None:
        log.info("metrics: %s: %s", summary.key, summary.line())

    def _note(self, kind: str, detail: object) -> None:
        if self.refusals.first(kind):
            log.info("metrics: %s: %s", kind, detail)

    def respond(self, request_line: str) -> tuple[Response, bool]:
        """The response to one request line, and whether it is a HEAD (no body sent)."""
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return Response(400, "Bad Request", b"bad request\n"), False
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if path != "/metrics":
            return Response(404, "Not Found", b"404 page not found\n"), method == "HEAD"
        if method not in ("GET", "HEAD"):
            return Response(405, "Method Not Allowed", b"method not allowed\n"), False
        ops, errs = self.fuse_counters() if self.fuse_counters else (0, 0)
        body = self.exposition.parts(self.controller.node, self.clock(), ops, errs)
        self.scrapes += 1
        return Response(200, "OK", body, CONTENT_TYPE), method == "HEAD"

    async def handle(self, stream: trio.SocketStream) -> None:
        """One connection, one request, within REQUEST_TIMEOUT_S. Never raises: a bad client
        must not stop the daemon."""
        if self.connections >= MAX_CONNECTIONS:
            self.refused += 1
            self._note("connection refused", f"{MAX_CONNECTIONS} connections are being served")
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            return
        self.connections += 1
        try:
            async with stream:
                with trio.move_on_after(REQUEST_TIMEOUT_S) as scope:
                    await self._serve_one(stream)
                if scope.cancelled_caught:
                    self._note("client timed out", f"no complete exchange in {REQUEST_TIMEOUT_S:.0f} s")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._note("client went away", e)
        finally:
            self.connections -= 1

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        request_line = await self._read_request(stream)
        if request_line is None:
            return
        try:
            response, head_only = self.respond(request_line)
        except Exception:
            log.exception("metrics: rendering %r failed", request_line)
            response, head_only = Response(500, "Internal Server Error", b"internal error\n"), False
        await stream.send_all(response.encode(head_only))

    async def _read_request(self, stream: trio.SocketStream) -> str | None:
        buf = bytearray()
        while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_REQUEST_BYTES:
                self._note("request too large", f"headers over {MAX_REQUEST_BYTES} bytes")
                await stream.send_all(Response(431, "Request Header Fields Too Large", b"too large\n").encode())
                return None
        line = bytes(buf).split(b"\n", 1)[0].rstrip(b"\r")
        if not line:
            return None
        return line.decode("latin-1")


async def serve(
    listen: str,
    server: MetricsServer,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind `listen` ([HOST:]PORT) and serve until cancelled. Reports the bound (host, port)
    through `task_status`, so a bind failure surfaces before the daemon says it is ready."""
    host, port = parse_listen(listen)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as e:
        raise OSError(e.errno or errno.EADDRINUSE, f"metrics on {listen}: {e.strerror or e}") from None
    bound = listeners[0].socket.getsockname()[:2]
    log.info("metrics: serving http://%s:%d/metrics", *bound)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, server.handle, listeners)
            task_status.started(bound)
    finally:
        # Close the listening sockets ourselves: left to the garbage collector they surface as
        # ResourceWarnings at some unrelated later moment.
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()
