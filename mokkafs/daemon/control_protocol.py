"""The control socket's protocol `<state path>.ctl.sock` (docs/setters.md): its limits, a reply's
words and the reply itself. The daemon serves it (`control_socket`), the Python client
(`mokkafs.cli.control_client`) and the shims' C client (shims/common/mokka_control.c) speak it.
Light: no trio, no model."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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
