"""Reading gpu0/temperature through the mount (open, read, close) against the same loop over a
tmpfs file, side by side in one run. Targets (issue 2): p50 <= 150 us, p99 <= 1 ms."""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from _node import BenchNode, percentile


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
    shm = tempfile.NamedTemporaryFile(dir="/dev/shm", delete=False)
    shm.write(b"29\n")
    shm.close()
    with BenchNode() as node:
        path = str(node.mnt / "gpu0" / "temperature")
        read_loop(path, 200)  # warm up
        read_loop(shm.name, 200)
        # Interleave the two in rounds so machine noise hits both alike.
        fuse, tmpfs = [], []
        for _ in range(10):
            fuse += read_loop(path, args.n // 10)
            tmpfs += read_loop(shm.name, args.n // 10)
    os.unlink(shm.name)
    print(f"{'file':<22} {'p50 us':>8} {'p99 us':>8}")
    for name, vals in (("mokkafs gpu0/temperature", fuse), ("tmpfs", tmpfs)):
        print(f"{name:<22} {percentile(vals, 0.5):>8.1f} {percentile(vals, 0.99):>8.1f}")
    p50, p99 = percentile(fuse, 0.5), percentile(fuse, 0.99)
    print(f"ratio mokkafs/tmpfs p50 {p50 / percentile(tmpfs, 0.5):.1f}x, p99 {p99 / percentile(tmpfs, 0.99):.1f}x")
    print(f"targets: p50 {p50:.0f}/150 us = {p50 / 150:.2f}, p99 {p99:.0f}/1000 us = {p99 / 1000:.2f}")


if __name__ == "__main__":
    main()
