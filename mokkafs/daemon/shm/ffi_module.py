"""The shared state's cffi declarations, parsed when the package is built instead of at every
start. cffi's out-of-line ABI mode writes the parsed types as a Python module
(`mokkafs/_native/mokka_state_ffi.py`, which setup.py makes beside the shims); it loads in a few
ms, where parsing the header with pycparser costs some 45 ms of every daemon's start and of every
command that reads the state. The module carries the digest of the declarations it was made from,
and one made from other declarations (the header edited since the build, a module from another
checkout) is never used: `load` returns None and the caller parses the header as before.

Standard library only at import (setup.py loads this file by its path, before the package is
importable); cffi is imported by `write` alone."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

MODULE_NAME = "mokka_state_ffi"
# What the daemon calls besides the header's declarations: libc's syscall (the futex wake) and
# libmokka-fence.so's fence (mokkafs/daemon/shm/layout.py).
EXTRA = ("long syscall(long number, ...);", "void mokka_fence(void);")


def cdef_source(text: str) -> str:
    """The part of mokka_state.h's `text` between the CDEF markers: what cffi parses."""
    m = re.search(r"/\* BEGIN CDEF[^\n]*\n(.*?)/\* END CDEF \*/", text, re.S)
    if not m:
        raise ValueError("mokka_state.h has no BEGIN CDEF / END CDEF region")
    return m.group(1)


def declarations(text: str) -> list[str]:
    """Everything cffi is given, in order, for the header `text`."""
    return [cdef_source(text), *EXTRA]


def digest(decls: list[str]) -> str:
    return hashlib.sha256("\0".join(decls).encode()).hexdigest()


def write(header: Path, out_dir: Path) -> Path:
    """Parse `header` once and write the out-of-line module into `out_dir`; return its path."""
    from cffi import FFI

    decls = declarations(header.read_text())
    ffi = FFI()
    for d in decls:
        ffi.cdef(d)
    ffi.set_source(MODULE_NAME, None)  # None: ABI mode, a pure Python module, nothing compiled
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{MODULE_NAME}.py"
    tmp = target.with_suffix(".tmp")
    ffi.emit_python_code(str(tmp))
    body = tmp.read_text()
    tmp.write_text(f"# made by setup.py from {header.name} (mokkafs/daemon/shm/ffi_module.py)\n"
                   f"DIGEST = {digest(decls)!r}\n{body}")
    tmp.replace(target)
    return target


def load(path: Path, decls: list[str]):
    """The FFI of the module at `path` if it was made from exactly `decls`, else None (no
    module, another header's, or one this cffi cannot load)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    made_from = re.search(r"^DIGEST = '([0-9a-f]{64})'$", text, re.M)
    if made_from is None or made_from[1] != digest(decls):
        return None
    namespace: dict = {}
    try:
        exec(compile(text, str(path), "exec"), namespace)  # noqa: S102 - our own build's output
    except Exception:  # noqa: BLE001 - written by a cffi this one cannot load: parse instead
        return None
    return namespace.get("ffi")
