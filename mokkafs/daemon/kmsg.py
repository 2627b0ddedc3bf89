"""Xid lines to the kernel log (`--kmsg`), as the real driver's printk puts them there, so
node-problem-detector, gpud and journald-based health monitors see them."""
from __future__ import annotations

import logging
import os

from mokkafs.model import Node, Outcome

log = logging.getLogger(__name__)

KERN_WARNING = 4  # NVRM prints Xids at warning level


class KmsgWriter:
    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)

    def __call__(self, node: Node, outcome: Outcome) -> None:
        for entry in outcome.log:
            if not entry.text.startswith("NVRM: "):
                continue
            try:
                # One write() is one kmsg record; the <N> prefix sets its level.
                os.write(self.fd, f"<{KERN_WARNING}>{entry.text}\n".encode())
            except OSError as e:
                log.warning("cannot write to %s: %s", self.path, e.strerror)

    def close(self) -> None:
        os.close(self.fd)
