"""Reading gpu0/temperature through the mount (open, read, close) against the same loop over a
tmpfs file and over a do-nothing pyfuse3 file system (the FUSE floor on this machine), side by
side in one run. Targets: p50 <= 1.5x the FUSE floor (and <= 150 us), p99 <= 1 ms."""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from _node import PREFIX, SHM, BenchNode, FloorFs, percentile, report


def read_loop(path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=5000)
    args = ap.parse_args()
    shm = tempfile.NamedTemporaryFile(prefix=PREFIX, dir=SHM, delete=False)
    shm.write(b"29\n")
    shm.close()
    try:
        with FloorFs() as floor_mnt, BenchNode() as node:
            path = str(node.mnt / "gpu0" / "temperature")
            floor_path = str(floor_mnt / "temperature")
            for p in (path, shm.name, floor_path):
                read_loop(p, 200)  # warm up
            # Interleave in rounds so machine noise hits all alike.
            fuse, tmpfs, bare = [], [], []
            for _ in range(10):
                fuse += read_loop(path, args.n // 10)
                tmpfs += read_loop(shm.name, args.n // 10)
                bare += read_loop(floor_path, args.n // 10)
    finally:
        os.unlink(shm.name)
    print(f"{'file':<32} {'p50 us':>8} {'p99 us':>8}")
    rows = (("mokkafs gpu0/temperature", fuse), ("tmpfs", tmpfs), ("do-nothing pyfuse3 (FUSE floor)", bare))
    for name, vals in rows:
        print(f"{name:<32} {percentile(vals, 0.5):>8.1f} {percentile(vals, 0.99):>8.1f}")
    p50, p99 = percentile(fuse, 0.5), percentile(fuse, 0.99)
    print(f"ratio mokkafs/tmpfs p50 {p50 / percentile(tmpfs, 0.5):.1f}x, p99 {p99 / percentile(tmpfs, 0.99):.1f}x")
    print(f"ratio mokkafs/floor p50 {p50 / percentile(bare, 0.5):.2f}x, p99 {p99 / percentile(bare, 0.99):.2f}x")
    print(f"targets: p50 {p50:.0f}/150 us = {p50 / 150:.2f}, p99 {p99:.0f}/1000 us = {p99 / 1000:.2f}")
    report("control-file read gpu0/temperature, p50", p50, "us", floor=percentile(bare, 0.5),
           floor_is="do-nothing pyfuse3 file", target=min(150, 1.5 * percentile(bare, 0.5)),
           note="target: 1.5x the floor, at most 150 us")
    report("control-file read gpu0/temperature, p99", p99, "us", floor=percentile(bare, 0.99),
           floor_is="do-nothing pyfuse3 file", target=1000)


if __name__ == "__main__":
    main()
