"""The shared state's declarations parsed at build time (mokkafs/daemon/shm/ffi_module.py): the
daemon uses the build's module, which agrees with a parse of the header on every type, size,
offset and constant, and a module made from any other declarations is never used."""
from __future__ import annotations

import pytest

from mokkafs.daemon.shm import ffi_module, layout

pytestmark = pytest.mark.level("daemon")


def _shape(ffi) -> dict:
    """Every type the FFI knows (sizes, fields with their offsets, bit fields and types) and
    every integer constant of the header, as plain data."""
    typedefs, structs, unions = ffi.list_types()
    out = {}
    for name in typedefs:
        out[name] = (ffi.sizeof(name), ffi.typeof(name).cname)
    for kind, names in (("struct", structs), ("union", unions)):
        for name in names:
            t = ffi.typeof(f"{kind} {name}")
            out[f"{kind} {name}"] = (ffi.sizeof(t), ffi.alignof(t), [
                (field, f.type.cname, f.offset, f.bitshift, f.bitsize) for field, f in t.fields])
    lib = ffi.dlopen(None)
    for name in dir(lib):
        if name not in ("syscall", "mokka_fence"):  # functions (mokka_fence is not libc's)
            out[name] = getattr(lib, name)
    return out


def test_the_daemon_uses_the_builds_parse_and_it_matches_the_header():
    decls = ffi_module.declarations(layout._HEADER_TEXT)
    built = ffi_module.load(layout.BUILT_FFI, decls)
    assert built is not None, f"{layout.BUILT_FFI}: missing or stale; rerun `pip install -e .`"
    assert type(layout.ffi) is type(built)  # the build's module, not cffi.FFI's parse
    parsed = _shape(layout.make_ffi())
    assert len(parsed) > 20 and "struct mokka_state" in parsed and "MOKKA_MAX_GPUS" in parsed
    assert _shape(built) == parsed
    assert layout.STATE_SIZE == parsed["struct mokka_state"][0]
    assert layout.libc.syscall  # the futex wake's function resolves through the build's module too


def test_a_module_of_other_declarations_is_never_used(tmp_path):
    header = tmp_path / "mokka_state.h"
    text = layout.header_path().read_text()
    edited = text.replace("/* END CDEF */", "struct mokka_later { int added; };\n/* END CDEF */")
    assert edited != text
    header.write_text(edited)
    module = ffi_module.write(header, tmp_path / "native")
    assert ffi_module.load(module, ffi_module.declarations(edited)) is not None  # its own header's
    assert ffi_module.load(module, ffi_module.declarations(text)) is None  # not the one we have
    module.write_text(module.read_text().replace("_version = 0x", "_version = 0x7"))  # a later cffi's
    assert ffi_module.load(module, ffi_module.declarations(edited)) is None
    assert ffi_module.load(tmp_path / "absent.py", ffi_module.declarations(text)) is None
