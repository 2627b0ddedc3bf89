"""The client side of the daemon's control socket `<state path>.ctl.sock` (protocol in
docs/setters.md), for `mokka inject`, the Kubernetes agent and tests; the shims have their own in
C (shims/common/mokka_control.c). Light: no trio, no model."""
from __future__ import annotations

import os
import socket
import time

from mokkafs.daemon.control_protocol import ERROR, MAX_REPLY, MAX_REQUEST, STATUSES, TIMEOUT_S, Reply
from mokkafs.daemon.unix_path import unix_address


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
