"""The daemon's unix-socket listeners (the process table's and the control socket): bound where
clients look for them, at any path length (unix_path), any user may connect (the server decides
what a caller may do), and bound again when someone removes or replaces the socket file."""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from mokkafs.daemon.clock import Clock
from mokkafs.daemon.unix_path import unix_address

log = logging.getLogger(__name__)

RECHECK_S = 1.0  # how often a quiet listener checks its socket is still where clients look for it


async def serve_unix(
    path: Path,
    on_connection: Callable[[trio.socket.SocketType], Awaitable[None]],
    clock: Clock,
    without: str,
    on_idle: Callable[[], None] | None = None,
    on_rebound: Callable[[], Awaitable[None]] | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep `path` bound (one removed or replaced is bound again within RECHECK_S) and run
    `on_connection(conn)` in a task of its own for each caller. Reports started once bound, or
    once binding failed: then it logs one line saying what the daemon goes `without` and returns,
    and the daemon runs on. `on_idle` runs after each quiet RECHECK_S, `on_rebound` after each
    bind but the first."""
    started = False
    accept_error: str | None = None
    async with trio.open_nursery() as nursery:
        while True:
            listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with listener:
                try:
                    path.unlink(missing_ok=True)
                    with unix_address(path) as address:  # a path past sun_path, through its directory
                        await listener.bind(address)
                    os.chmod(path, 0o666)
                    listener.listen(64)
                    bound = os.stat(path).st_ino
                except OSError as e:
                    log.warning("%s: cannot listen (%s): %s", path, e, without)
                    if not started:
                        task_status.started()
                    return
                if not started:
                    task_status.started()
                    started = True
                elif on_rebound is not None:
                    await on_rebound()
                while True:
                    conn = None
                    with trio.move_on_after(RECHECK_S):
                        try:
                            conn, _ = await listener.accept()
                        except OSError as e:  # out of descriptors, say: this caller gets no answer
                            if str(e) != accept_error:  # once, not ten times a second
                                log.warning("%s: %s", path, e)
                                accept_error = str(e)
                            await clock.sleep(0.1)
                            continue
                    accept_error = None
                    if conn is not None:
                        nursery.start_soon(on_connection, conn)
                        continue
                    if on_idle is not None:
                        on_idle()
                    try:  # a quiet while: is our socket still where clients look for it?
                        if os.stat(path).st_ino == bound:
                            continue
                    except FileNotFoundError:
                        pass
                    log.warning("%s was removed or replaced; binding it again", path)
                    break
