"""The control socket's protocol `<state path>.ctl.sock` (docs/setters.md): its limits, a reply's
words and the reply itself. The daemon serves it (`control_socket`), the Python client
(`mokkafs.cli.control_client`) and the shims' C client (shims/common/mokka_control.c) speak it;
its words and limits are read from the one definition both sides share, the PROTOCOL region of
shims/common/mokka_control.h. Light: no trio, no model."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

def _protocol_text() -> str:
    """The PROTOCOL region of mokka_control.h: where the shims' client reads the same lines."""
    here = Path(__file__).resolve().parents[1]  # mokkafs/
    for header in (here.parent / "shims" / "common" / "mokka_control.h",  # a source checkout or editable install
                   here / "_native" / "include" / "mokka_control.h"):  # a wheel (setup.py copies it there)
        if header.is_file():
            text = header.read_text()
            return text[text.index("BEGIN PROTOCOL"):text.index("END PROTOCOL")]
    raise FileNotFoundError("mokka_control.h not found beside the package")


_TEXT = _protocol_text()
_DEFINES = dict(re.findall(r'^#define (MOKKA_CONTROL_\w+) +("[^"]*"|\d+)', _TEXT, re.M))

SUFFIX = _DEFINES["MOKKA_CONTROL_SUFFIX"].strip('"')
MAX_REQUEST = MAX_REPLY = int(_DEFINES["MOKKA_CONTROL_MAX"])  # bytes of a line, its newline included
TIMEOUT_S = int(_DEFINES["MOKKA_CONTROL_TIMEOUT_MS"]) / 1000  # what a caller waits, all told

# A reply's first word (MOKKA_CTL_REPLIES, in its order). Each shim maps it to its API's error.
REPLIES: dict[str, str] = dict(re.findall(r'X\((\w+), "(\w+)"\)', _TEXT))
STATUSES = tuple(REPLIES.values())
(OK, NO_PERMISSION, INVALID_ARGUMENT, NOT_SUPPORTED, GPU_IS_LOST, BUSY, ERROR, INSUFFICIENT_RESOURCES, IN_USE,
 NOT_FOUND) = (REPLIES[n] for n in ("OK", "NO_PERMISSION", "INVALID_ARGUMENT", "NOT_SUPPORTED", "GPU_IS_LOST", "BUSY",
                                   "ERROR", "INSUFFICIENT_RESOURCES", "IN_USE", "NOT_FOUND"))


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
