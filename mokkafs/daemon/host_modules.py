"""The host's `/proc/modules`, read at each open of the mount's `proc/modules` (the renderer,
mokkafs/render/modules.py, validates it line by line). A kernel built without loadable-module
support has no such file: its node lists the driver's modules alone."""
from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger(__name__)

PROC_MODULES = "/proc/modules"
MAX_BYTES = 1 << 20  # a host with a few thousand modules prints about 200 KiB


class HostModules:
    """Callable: the text of `path`, or "" when it cannot be read. Never follows a link and never
    blocks on something planted in the file's place (O_NOFOLLOW, O_NONBLOCK, regular files only)."""

    def __init__(self, path: str = PROC_MODULES) -> None:
        self.path = path
        self._warned = False

    def __call__(self) -> str:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return ""  # no module support in this kernel: nothing to add
        except OSError as e:
            self._warn(e.strerror)
            return ""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self._warn("not a regular file")
                return ""
            chunks, total = [], 0
            while total < MAX_BYTES:
                chunk = os.read(fd, MAX_BYTES - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks).decode("ascii", errors="replace")
        except OSError as e:
            self._warn(e.strerror)
            return ""
        finally:
            os.close(fd)

    def _warn(self, why: str | None) -> None:
        if not self._warned:  # once: every open of proc/modules would repeat it
            log.warning("%s: %s; proc/modules lists the driver's modules only", self.path, why)
            self._warned = True
