"""mount -> ready: `mokka mount` returning with the tree answering, 8 and 64 GPUs.
Targets: <= 1 s for 8 GPUs, <= 3 s for 64."""
from __future__ import annotations

import argparse
import statistics

from _node import BenchNode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{'GPUs':>5} {'median s':>9} {'max s':>7} {'target s':>9} {'median/target':>14}")
    for gpus, target in ((8, 1.0), (64, 3.0)):
        times = []
        for _ in range(args.runs):
            node = BenchNode(gpus=gpus)
            times.append(node.mount())
            node.umount()
        med = statistics.median(times)
        print(f"{gpus:>5} {med:>9.3f} {max(times):>7.3f} {target:>9.1f} {med / target:>14.2f}")


if __name__ == "__main__":
    main()
