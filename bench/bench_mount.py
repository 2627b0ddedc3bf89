"""mount -> ready: `mokka mount` returning with the tree answering, 8 x H100 and 64 x H100 NVL
(an HGX H100 board sits at most 8 to a node; 64 GPUs are PCIe H100 NVLs, bench/_node.py).
Targets: <= 0.3 s for 8 GPUs, <= 0.5 s for 64. Floor: the same CLI's start-up, `mokka --help`."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _node import WIDE_GPUS, WIDE_PROFILE, BenchNode, report


def cli_start_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mokkafs.cli", "--help"], capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{'node':>14} {'median s':>9} {'max s':>7} {'CLI start s':>12} {'target s':>9} {'median/target':>14}")
    for profile, gpus, target in (("h100", 8, 0.3), (WIDE_PROFILE, WIDE_GPUS, 0.5)):
        times, floors = [], []
        for _ in range(args.runs):
            floors.append(cli_start_s())
            node = BenchNode(profile, gpus)
            try:
                times.append(node.mount())
            finally:
                node.close()
        med, floor = statistics.median(times), statistics.median(floors)
        name = f"{gpus} x {profile}"
        print(f"{name:>14} {med:>9.3f} {max(times):>7.3f} {floor:>12.3f} {target:>9.1f} {med / target:>14.2f}")
        report(f"mount -> ready, {name}, median", med, "s", floor=floor, floor_is="mokka --help", target=target)


if __name__ == "__main__":
    main()
