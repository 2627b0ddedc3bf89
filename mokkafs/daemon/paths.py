"""Where things are: default mount point and state directory, the daemons' pid files, and whether
a path is a mount point. Light on purpose: every `mokka` command imports it, the daemon's
heavy modules (trio, pyfuse3, pydantic) only where a command needs them."""
from __future__ import annotations

import errno
import os
from pathlib import Path

# What the kernel answers on a FUSE mount whose daemon died: ENOTCONN, or ECONNABORTED when the
# connection was aborted while a request was in flight.
DEAD_MOUNT_ERRNOS = frozenset({errno.ENOTCONN, errno.ECONNABORTED})

DEFAULT_MOUNTPOINT = "/mokka"
DEFAULT_STATE_DIR = "/run/mokka"
RUNTIME_DIR = Path(os.environ.get("MOKKA_RUNTIME_DIR", "/run/mokka/mounts"))


def pid_file(mountpoint: str) -> Path:
    """Where the daemon serving `mountpoint` records its pid, for `mokka umount`."""
    name = os.path.realpath(mountpoint).strip("/").replace("/", "_") or "root"
    return RUNTIME_DIR / f"{name}.pid"


def is_mounted(mountpoint: str) -> bool:
    real = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == real for line in f if len(line.split()) > 1)
