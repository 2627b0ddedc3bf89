"""The client side of the daemon's control socket `<state path>.ctl.sock` (protocol in
docs/setters.md), for `mokka inject`, the Kubernetes agent and tests; the shims have their own in
C (shims/common/mokka_control.c). Light: no trio, no model."""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from mokkafs.unix_path import unix_address

SUFFIX = ".ctl.sock"
MAX_REQUEST = 512  # bytes of one request line, its newline included
MAX_REPLY = 512
TIMEOUT_S = 2.0  # what a caller waits, all told, before it gives up on the daemon

# A reply's first word. Each shim maps it to its API's error (docs/setters.md).
OK = "ok"
NO_PERMISSION = "no_permission"  # the caller is neither root nor in the control group
INVALID_ARGUMENT = "invalid_argument"  # the command did not parse or does not fit; nothing changed
NOT_SUPPORTED = "not_supported"  # the board does not offer it
GPU_IS_LOST = "gpu_is_lost"  # the GPU fell off the bus
BUSY = "busy"  # the caller's uid has too many connections open
ERROR = "error"  # the daemon failed (its log says why)
INSUFFICIENT_RESOURCES = "insufficient_resources"  # no room for a MIG instance (docs/mig.md)
IN_USE = "in_use"  # MIG instances or processes are on what the command would change
NOT_FOUND = "not_found"  # no MIG instance of that id
STATUSES = (OK, NO_PERMISSION, INVALID_ARGUMENT, NOT_SUPPORTED, GPU_IS_LOST, BUSY, ERROR, INSUFFICIENT_RESOURCES,
            IN_USE, NOT_FOUND)


def control_path(state: str | os.PathLike) -> Path:
    """The control socket beside the state file `state`."""
    return Path(f"{os.fspath(state)}{SUFFIX}")


@dataclass(frozen=True)
class Reply:
    status: str  # one of STATUSES
    message: str = ""  # a refusal's reason; on success, what the command made (a MIG create's new ids)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def __str__(self) -> str:
        return f"{self.status}: {self.message}" if self.message else self.status


class NoDaemon(OSError):
    """Nobody answered on the socket within the timeout (no daemon, a dead one, a hung one)."""


def send(path: str | os.PathLike, line: str, timeout: float = TIMEOUT_S) -> Reply:
    """Send one command line (`gpu=1 power_limit 500`) and return the daemon's reply, which comes
    once the change is published. Raises NoDaemon when there is no answer within `timeout`."""
    request = line.encode("ascii") + b"\n"
    if len(request) > MAX_REQUEST:
        raise ValueError(f"a request is at most {MAX_REQUEST} bytes")
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.settimeout(timeout)
            with unix_address(path) as address:  # a node mounted under a long path, too
                s.connect(address)
            s.sendall(request)
            data = b""
            while not data.endswith(b"\n") and len(data) < MAX_REPLY:
                s.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = s.recv(MAX_REPLY - len(data))
                if not chunk:
                    break
                data += chunk
        except (OSError, socket.timeout) as e:
            raise NoDaemon(f"{path}: {e.strerror or e or 'no answer'}") from None
    if not data.endswith(b"\n"):
        raise NoDaemon(f"{path}: the daemon closed the connection without an answer")
    status, _, message = data[:-1].decode("ascii", "replace").partition(" ")
    return Reply(status if status in STATUSES else ERROR, message)
