#!/usr/bin/env python3
"""Write tests/fixtures/render/<profile>.txt, readable golden files: for every shipped profile,
every entry of its whole rendered tree (sys/, proc/, dev/, node/, gpuN/, ib/, driver/) with its
kind, mode and content (text up to 512 bytes as one escaped line, anything larger or binary as a
digest), and every field of every record the shims read (each GPU's state record, the MIG tables,
the driver strings) that is not zero, for a node built with the profile's default composition at a
fixed instant. One line per entry or field, so an intended render change reads as a diff.
tests/test_compositions.py checks that every shipped profile still renders to it. `--check` fails
where a committed file differs.

    python scripts/gen_render_digests.py [--check]
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mokkafs.daemon.shm.layout import ffi  # noqa: E402
from mokkafs.model import Node, compose  # noqa: E402
from mokkafs.model.profiles import available_profiles, load_profile  # noqa: E402
from mokkafs.render.tree import root  # noqa: E402
from mokkafs.render.vfs import CharDev, Ctx, Dir, File, Symlink  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "render"  # <profile>.txt: `key<TAB>what it is`, sorted
BORN = 1_700_000_000.0
NOW = BORN + 3600.0  # an hour in: drifted readings, energy, counters
HOSTNAME = "digest-host"
# The shipped profiles when the fixture was first written; a profile added later has no "before".
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4")
# The built shims' bytes and sizes depend on the C build, not on the node: only their presence
# and mode count.
BUILT = ("driver/usr/lib64/", "driver/usr/bin/")


TEXT_LIMIT = 512  # bytes of content a golden line shows; past it, a digest


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:20]


def _content(data: bytes) -> str:
    """Short text as one escaped line; larger or binary content as its digest."""
    if len(data) <= TEXT_LIMIT:
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            return _digest(data)
        if text.isprintable() or all(c.isprintable() or c in "\n\t" for c in text):
            return repr(text)
    return _digest(data)


def tree_digests(node: Node, now: float = NOW) -> dict[str, str]:
    """path -> what that entry is (kind, mode, content or its digest, target, device numbers)."""
    ctx = Ctx(node, now)
    out: dict[str, str] = {}

    def walk(path: str, entry) -> None:
        if isinstance(entry, Dir):
            children = entry.children(ctx)
            out[path or "."] = f"d {entry.mode:o} {' '.join(sorted(children))}"
            for name, child in children.items():
                walk(f"{path}/{name}" if path else name, child)
        elif isinstance(entry, Symlink):
            out[path] = f"l {entry.resolve(ctx)}"
        elif isinstance(entry, CharDev):
            out[path] = f"c {entry.major}:{entry.minor} {entry.mode:o}"
        elif isinstance(entry, File):
            if path.startswith(BUILT):
                out[path] = f"f {entry.perm:o} built"
            else:
                out[path] = f"f {entry.perm:o} {entry.size} {_content(entry.read(ctx))}"
        else:
            raise TypeError(f"{path}: {entry!r}")

    walk("", root(node.config))
    return out


def _fields(cdata, prefix: str, out: dict[str, str]) -> None:
    """Every non-zero primitive under the cffi struct `cdata`, as `prefix.field[i]...`; char
    arrays as their string."""
    for name, field in ffi.typeof(cdata).fields:
        _value(getattr(cdata, name), field.type, f"{prefix}.{name}", out)


def _value(value, ctype, key: str, out: dict[str, str]) -> None:
    if ctype.kind == "struct":
        _fields(value, key, out)
    elif ctype.kind == "array" and ctype.item.cname == "char":
        if text := ffi.string(value).decode("latin-1"):
            out[key] = repr(text)
    elif ctype.kind == "array":
        for i in range(ctype.length):
            _value(value[i], ctype.item, f"{key}[{i}]", out)
    elif value:
        out[key] = str(value)


def state_digests(node: Node, now: float = NOW) -> dict[str, str]:
    """What the publisher writes for this node, field by field (the shims' only input)."""
    from mokkafs.daemon.shm.publisher import cuda_version_int, fill_gpu, fill_mig_tables

    cfg = node.config
    out = {"state/header": f"{len(node.gpus)} {cuda_version_int(cfg.cuda_version)} {cfg.driver_version} {cfg.hostname}"}
    for i in range(len(node.gpus)):
        g = ffi.new("struct mokka_gpu *")
        fill_gpu(g[0], node, i, now)
        _fields(g[0], f"state/gpu{i}", out)
    st = ffi.new("struct mokka_state *")
    fill_mig_tables(st, node)
    start = ffi.offsetof("struct mokka_state", "mig_memory_slices")
    # the MIG tables: the fields from mig_memory_slices on (the GPUs are above, the header apart)
    for name, field in ffi.typeof("struct mokka_state").fields:
        if field.offset >= start:
            _value(getattr(st[0], name), field.type, f"state/mig_tables.{name}", out)
    return out


def digests(profile: str) -> dict[str, str]:
    node = Node(compose(load_profile(profile), hostname=HOSTNAME), BORN)
    return {**tree_digests(node), **state_digests(node)}


def generate() -> dict[str, dict[str, str]]:
    missing = [p for p in PROFILES if p not in available_profiles()]
    if missing:
        raise SystemExit(f"profiles gone: {missing}")
    return {p: digests(p) for p in PROFILES}


def _text(body: dict[str, str]) -> str:
    return "".join(f"{key}\t{value}\n" for key, value in sorted(body.items()))


def load_fixture() -> dict[str, dict[str, str]]:
    return {p.stem: dict(line.split("\t", 1) for line in p.read_text().splitlines())
            for p in sorted(FIXTURES.glob("*.txt"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a committed golden file is stale")
    args = ap.parse_args()
    body = generate()
    if args.check:
        stale = [p for p, d in body.items() if not (FIXTURES / f"{p}.txt").is_file()
                 or (FIXTURES / f"{p}.txt").read_text() != _text(d)]
        if stale:
            print(f"{FIXTURES.relative_to(ROOT)}/{{{','.join(stale)}}}.txt stale; run scripts/gen_render_digests.py",
                  file=sys.stderr)
            return 1
        return 0
    FIXTURES.mkdir(exist_ok=True)
    for p, d in body.items():
        (FIXTURES / f"{p}.txt").write_text(_text(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
