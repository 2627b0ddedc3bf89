"""mount -> ready: `mokka mount` returning with the tree answering, 8 x H100 and 64 x H100 NVL
(an HGX H100 board sits at most 8 to a node; 64 GPUs are PCIe H100 NVLs, bench/_node.py).
Targets: <= 0.3 s for 8 GPUs, <= 0.5 s for 64.

Two floors, measured in the same run: the same CLI's start-up (`mokka --help`), and the least
any pyfuse3 daemon pays to be mounted and answering (bench/_floor_fs.py started the same way:
a fresh interpreter importing trio and pyfuse3, mounting one file, the file read). The second
is the floor the figure is reported against: what is above it is mokkafs's own start."""
from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time

from _node import WIDE_GPUS, WIDE_PROFILE, BenchNode, FloorFs, report

import mokkafs


def cli_start_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mokkafs.cli", "--help"], capture_output=True, check=True)
    return time.perf_counter() - t0


def bare_mount_s() -> float:
    """Seconds from starting bench/_floor_fs.py to its one file read back through the mount."""
    t0 = time.perf_counter()
    with FloorFs() as mnt:
        (mnt / "temperature").read_bytes()
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    # A start from bytecode, as an installed daemon's is: a source edited since the last write
    # of its bytecode (never written where PYTHONDONTWRITEBYTECODE is set) would be compiled in
    # every start measured.
    compileall.compile_dir(os.path.dirname(mokkafs.__file__), quiet=1)
    print(f"{'node':>14} {'median s':>9} {'max s':>7} {'CLI start s':>12} {'bare pyfuse3 s':>15} "
          f"{'target s':>9} {'median/bare':>12} {'median/target':>14}")
    for profile, gpus, target in (("h100", 8, 0.3), (WIDE_PROFILE, WIDE_GPUS, 0.5)):
        times, clis, bares = [], [], []
        for _ in range(args.runs):
            # Interleaved, so machine noise hits all three alike.
            clis.append(cli_start_s())
            bares.append(bare_mount_s())
            node = BenchNode(profile, gpus)
            try:
                times.append(node.mount())
            finally:
                node.close()
        med, cli, bare = statistics.median(times), statistics.median(clis), statistics.median(bares)
        name = f"{gpus} x {profile}"
        print(f"{name:>14} {med:>9.3f} {max(times):>7.3f} {cli:>12.3f} {bare:>15.3f} {target:>9.1f} "
              f"{med / bare:>12.2f} {med / target:>14.2f}")
        report(f"mount -> ready, {name}, median", med, "s", floor=bare, target=target,
               floor_is="a bare pyfuse3 daemon mounted", note=f"mokka --help {cli:.3f} s")


if __name__ == "__main__":
    main()
