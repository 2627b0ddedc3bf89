#!/usr/bin/env python3
"""Write tests/fixtures/render_digests.json: for every shipped profile, a digest of every entry of
its whole rendered tree (sys/, proc/, dev/, node/, gpuN/, ib/, driver/) and of every record the
shims read (each GPU's state record, the MIG tables, the driver strings), for a node built with
the profile's default composition at a fixed instant. The fixture was first written by the code
before node compositions were split out of the profiles; tests/test_compositions.py checks that
every shipped profile still renders to it. `--check` fails where the committed file differs.

    python scripts/gen_render_digests.py [--check]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mokkafs.model import Node, compose  # noqa: E402
from mokkafs.model.profiles import available_profiles, load_profile  # noqa: E402
from mokkafs.render.tree import root  # noqa: E402
from mokkafs.render.vfs import CharDev, Ctx, Dir, File, Symlink  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "render_digests.json.gz"  # gzip of sorted JSON, mtime 0
BORN = 1_700_000_000.0
NOW = BORN + 3600.0  # an hour in: drifted readings, energy, counters
HOSTNAME = "digest-host"
# The shipped profiles when the fixture was first written; a profile added later has no "before".
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4")
# The built shims' bytes and sizes depend on the C build, not on the node: only their presence
# and mode count.
BUILT = ("driver/usr/lib64/", "driver/usr/bin/")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:20]


def tree_digests(node: Node, now: float = NOW) -> dict[str, str]:
    """path -> digest of what that entry is (kind, mode, content, target, device numbers)."""
    ctx = Ctx(node, now)
    out: dict[str, str] = {}

    def walk(path: str, entry) -> None:
        if isinstance(entry, Dir):
            children = entry.children(ctx)
            out[path or "."] = _digest(f"d {entry.mode:o} {' '.join(sorted(children))}".encode())
            for name, child in children.items():
                walk(f"{path}/{name}" if path else name, child)
        elif isinstance(entry, Symlink):
            out[path] = _digest(f"l {entry.resolve(ctx)}".encode())
        elif isinstance(entry, CharDev):
            out[path] = _digest(f"c {entry.major} {entry.minor} {entry.mode:o}".encode())
        elif isinstance(entry, File):
            if path.startswith(BUILT):
                out[path] = _digest(f"f {entry.perm:o} built".encode())
            else:
                out[path] = _digest(f"f {entry.perm:o} {entry.size} ".encode() + entry.read(ctx))
        else:
            raise TypeError(f"{path}: {entry!r}")

    walk("", root(node.config))
    return out


def state_digests(node: Node, now: float = NOW) -> dict[str, str]:
    """What the publisher writes for this node, record by record (the shims' only input)."""
    from mokkafs.daemon.shm.layout import ffi
    from mokkafs.daemon.shm.publisher import cuda_version_int, fill_gpu, fill_mig_tables

    cfg = node.config
    out = {
        "state/header": _digest(
            f"{len(node.gpus)} {cuda_version_int(cfg.cuda_version)} {cfg.driver_version} {cfg.hostname}".encode()
        )
    }
    for i in range(len(node.gpus)):
        g = ffi.new("struct mokka_gpu *")
        fill_gpu(g[0], node, i, now)
        out[f"state/gpu{i}"] = _digest(bytes(ffi.buffer(g)))
    st = ffi.new("struct mokka_state *")
    fill_mig_tables(st, node)
    start = ffi.offsetof("struct mokka_state", "mig_memory_slices")
    out["state/mig_tables"] = _digest(bytes(ffi.buffer(st))[start:])
    return out


def digests(profile: str) -> dict[str, str]:
    node = Node(compose(load_profile(profile), hostname=HOSTNAME), BORN)
    return {**tree_digests(node), **state_digests(node)}


def generate() -> dict[str, dict[str, str]]:
    missing = [p for p in PROFILES if p not in available_profiles()]
    if missing:
        raise SystemExit(f"profiles gone: {missing}")
    return {p: digests(p) for p in PROFILES}


def load_fixture() -> dict[str, dict[str, str]]:
    return json.loads(gzip.decompress(FIXTURE.read_bytes()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed fixture is stale")
    args = ap.parse_args()
    body = generate()
    if args.check:
        if not FIXTURE.is_file() or load_fixture() != body:
            print(f"{FIXTURE.relative_to(ROOT)} is stale; run scripts/gen_render_digests.py", file=sys.stderr)
            return 1
        return 0
    text = json.dumps(body, indent=0, sort_keys=True) + "\n"
    FIXTURE.write_bytes(gzip.compress(text.encode(), mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
