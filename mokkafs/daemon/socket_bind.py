"""The node's socket bound over the driver root's run/nvidia-persistenced/socket.

A link there to `<state dir>/node.sock` dangles wherever the driver root is bound alone: NVIDIA's
device plugin, as its Helm chart runs it, is given the host's driver root at /driver-root and
loads our libnvidia-ml.so.1 from there, which then finds no node. A daemon that may mount (root
with CAP_SYS_ADMIN: the agent's DaemonSet, the test suite) renders a socket placeholder there
and binds the real socket over it, so the name is that socket in any bind of the driver root, as
on a node where nvidia-persistenced runs (docs/containers.md).

Every path lookup inside the mount is a request to this daemon: `bind` must run in a worker
thread while the mount serves, never on the event loop nor before pyfuse3.main. `unbind` looks
nothing up (it unmounts through a descriptor of the bind), so it is safe at teardown."""
from __future__ import annotations

import ctypes
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

MS_BIND = 0x1000
MNT_DETACH = 2
CAP_SYS_ADMIN = 21

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def may_bind() -> bool:
    """Whether this process may bind-mount: effective root with CAP_SYS_ADMIN. An unprivileged
    `mokka mount` (through fusermount3) may not, and keeps the link."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class SocketBind:
    """`source` (a socket) bound over `target` (the placeholder in the mount), again on request."""

    def __init__(self, source: Path, target: Path) -> None:
        self.source, self.target = source, target
        self.fd: int | None = None  # an O_PATH descriptor of the bind, to unmount it by

    def bind(self) -> None:
        """Bind the socket now at `source` over `target`, replacing an earlier bind. Raises
        OSError saying which. Runs in a worker thread while the mount serves."""
        self.unbind()
        src = os.stat(self.source)
        if not stat.S_ISSOCK(src.st_mode):
            raise OSError(f"{self.source}: not a socket")
        if _libc.mount(os.fsencode(self.source), os.fsencode(self.target), None, MS_BIND, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot bind {self.source} over {self.target}: {os.strerror(err)}")
        fd = os.open(self.target, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.fd = fd
        got = os.fstat(fd)
        if (got.st_dev, got.st_ino) != (src.st_dev, src.st_ino):
            self.unbind()
            raise OSError(f"{self.target}: the bind of {self.source} does not show there")

    def unbind(self) -> None:
        """Detach the bind, if any, without a lookup in the mount (through /proc/self/fd)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            if _libc.umount2(f"/proc/self/fd/{fd}".encode(), MNT_DETACH) != 0:
                err = ctypes.get_errno()
                log.warning("%s: cannot unmount the node's socket bound there: %s", self.target, os.strerror(err))
        finally:
            os.close(fd)
