"""The shared state's layout as Python sees it: cffi (ABI mode) over the CDEF region of
shims/include/mokka_state.h, the one definition the shims compile against (parsed when the package
was built where that build's module matches the header, `ffi_module.py`; else here); the header's
constants; where the state file lies; and the store fence the writer needs on weakly ordered CPUs."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from mokkafs.daemon.shm import ffi_module

STATE_FILE = "state"  # in the state directory (the driver root's run/mokka links to it)

_PACKAGE = Path(__file__).resolve().parents[2]  # mokkafs/
HEADER_CANDIDATES = [
    _PACKAGE.parent / "shims" / "include" / "mokka_state.h",  # a source checkout or editable install
    _PACKAGE / "_native" / "include" / "mokka_state.h",  # a wheel (setup.py copies it there)
]


def header_path() -> Path:
    for p in HEADER_CANDIDATES:
        if p.is_file():
            return p
    raise FileNotFoundError(f"mokka_state.h not found in {', '.join(map(str, HEADER_CANDIDATES))}")


_HEADER_TEXT = header_path().read_text()  # read once, at import: the layout never changes under a process


def cdef_source(text: str = _HEADER_TEXT) -> str:
    """The part of the header `text` between the CDEF markers: what cffi parses."""
    return ffi_module.cdef_source(text)


def make_ffi():
    """An FFI parsed from the header now (pycparser: some 45 ms)."""
    from cffi import FFI

    ffi = FFI()
    for decl in ffi_module.declarations(_HEADER_TEXT):
        ffi.cdef(decl)
    return ffi


# Where setup.py writes the build's parse (ffi_module.write); a wheel and a checkout alike.
BUILT_FFI = _PACKAGE / "_native" / f"{ffi_module.MODULE_NAME}.py"


def string_defines(text: str = _HEADER_TEXT) -> dict[str, str]:
    """The header's `#define MOKKA_X "text"` lines (paths, names and suffixes the shims use)."""
    return dict(re.findall(r'^#define (MOKKA_\w+) "([^"]*)"', text, re.M))


ffi = ffi_module.load(BUILT_FFI, ffi_module.declarations(_HEADER_TEXT)) or make_ffi()
libc = ffi.dlopen(None)  # the header's constants, and libc's syscall for the futex wake
_STRINGS = string_defines()
STATE_ENV = _STRINGS["MOKKA_STATE_ENV"]
NODE_SOCKET = _STRINGS["MOKKA_NODE_SOCKET"]  # where a CDI container finds the node (docs/containers.md)
PROCS_SOCK_SUFFIX = _STRINGS["MOKKA_PROCS_SOCK_SUFFIX"]
PROCS_LOCK_SUFFIX = _STRINGS["MOKKA_PROCS_LOCK_SUFFIX"]
MAGIC = libc.MOKKA_STATE_MAGIC
RETIRED = libc.MOKKA_STATE_RETIRED  # the magic of a file the daemon left for a new one
VERSION = libc.MOKKA_STATE_VERSION
MAX_GPUS = libc.MOKKA_MAX_GPUS
MAX_GPU_PROCS = libc.MOKKA_MAX_GPU_PROCS
ACCOUNTING_RECORDS = libc.MOKKA_ACCOUNTING_RECORDS
RING = libc.MOKKA_EVENT_RING
MAX_GPU_INSTANCES = libc.MOKKA_MAX_GPU_INSTANCES
MAX_MIG_DEVICES = libc.MOKKA_MAX_MIG_DEVICES
MAX_MIG_PROFILES = libc.MOKKA_MAX_MIG_PROFILES
MAX_CI_PROFILES = libc.MOKKA_MAX_CI_PROFILES
MAX_MIG_PLACEMENTS = libc.MOKKA_MAX_MIG_PLACEMENTS
NO_MIG = libc.MOKKA_NO_MIG
STATE_SIZE = ffi.sizeof("struct mokka_state")
TSO = platform.machine() in ("x86_64", "AMD64", "i386", "i686")


def load_fence(tso: bool = TSO):
    """Order the daemon's stores into shared memory as other CPUs see them. On x86 (TSO) they
    already are, and this is a no-op; elsewhere it is a full barrier from libmokka-fence.so,
    without which a reader could see a seqlock's even count before the records it covers."""
    if tso:
        return lambda: None
    from mokkafs.render import native

    # The library object is kept with the function: an out-of-line FFI (ffi_module.py) closes a
    # library once nothing refers to it, which would leave the function pointing at nothing.
    lib = ffi.dlopen(str(native.fence_library()))
    _KEPT_OPEN.append(lib)
    return lib.mokka_fence


_KEPT_OPEN: list = []


fence = load_fence()


def state_path(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / STATE_FILE
