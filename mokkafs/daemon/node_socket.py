"""The node's socket: how a shim in a container built from NVIDIA's own CDI spec finds the node.
The spec mounts the driver root's `run/nvidia-persistenced/socket` at
`/run/nvidia-persistenced/socket`; in a mount's driver root that name is this socket (bound there
by a daemon that may mount, mokkafs/daemon/socket_bind.py) or links to it, and
each connection is answered with one byte and a read-only descriptor of the state file
(SCM_RIGHTS), which the shim maps: its reads stay plain loads (docs/containers.md).

A caller that then sends a line is a setter or a MIG command from a container that has this socket
and not the control socket beside the state file (NVIDIA's DRA plugin, given the driver root,
creating MIG devices): the line goes to the control socket's handler, with the caller the kernel
names, under the control socket's rules (root or the control group, and CAP_SYS_ADMIN for root:
a privileged container, as the driver asks of a process that configures MIG)."""
from __future__ import annotations

import array
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from mokkafs.daemon.clock import Clock
from mokkafs.daemon.control_protocol import MAX_REQUEST
from mokkafs.daemon.control_socket import ControlSocket
from mokkafs.render.driver import NODE_SOCKET
from mokkafs.daemon.unix_listener import serve_unix

log = logging.getLogger(__name__)


def node_socket_path(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / NODE_SOCKET


class NodeSocket:
    """Hands the state file at `state` to whoever connects (everyone may read the node)."""

    def __init__(self, path: Path, state: Path, clock: Clock, control: ControlSocket | None = None) -> None:
        self.path, self.state, self.clock, self.control = path, state, clock, control
        # Run after the socket is bound again (someone removed it): what was bound over the
        # driver root's name holds the old one.
        self.rebound: Callable[[], Awaitable[None]] | None = None

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve_unix(self.path, self._connection, self.clock,
                         "containers made from NVIDIA's CDI specs find no node", on_rebound=self._rebound,
                         task_status=task_status)

    async def _rebound(self) -> None:
        if self.rebound is not None:
            await self.rebound()

    async def _connection(self, conn) -> None:
        with conn:
            try:
                # Opened per connection: a state file the daemon replaced is the new one.
                fd = os.open(self.state, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError as e:
                log.warning("%s: cannot open the state for a caller: %s", self.state, e.strerror)
                return
            try:
                with trio.move_on_after(1.0):  # a caller that does not read costs a second, once
                    await conn.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            except OSError:
                return  # the caller went away
            finally:
                os.close(fd)
            if self.control is None:
                return
            first = b""
            with trio.move_on_after(1.0):  # a reader closes at once; one that does neither, a second
                try:
                    first = await conn.recv(MAX_REQUEST)
                except OSError:
                    return
            if first:
                await self.control.converse(conn, first)
