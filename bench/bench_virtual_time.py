#!/usr/bin/env python3
"""An hour of a whole daemon in virtual time (tests/test_virtual_time.py's hour: ticks, reads
of every surface, Xids, refused writes, a CUDA process, /metrics), timed: wall and CPU seconds
per run, beside a floor, the same trio MockClock stepping an empty loop through the same hour at
the daemon's tick. Target: the hour costs under 1 s of CPU.

    python bench/bench_virtual_time.py [--runs 5]
"""
from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import time
from pathlib import Path

import trio
import trio.testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _node import report, shm_dir  # noqa: E402
from test_virtual_time import HOUR, TICK_S, an_hour  # noqa: E402

TARGET_CPU_S = 1.0


async def empty_hour(mock: trio.testing.MockClock) -> None:
    mock.autojump_threshold = 0
    for _ in range(int(HOUR / TICK_S)):
        await trio.sleep(TICK_S)


def timed(fn) -> tuple[float, float]:
    gc.collect()
    gc.freeze()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        gc.unfreeze()


def daemon_hour() -> None:
    base = shm_dir("mokka-bench-vt-")
    try:
        mock = trio.testing.MockClock()
        trio.run(an_hour, base, mock, clock=mock)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def floor_hour() -> None:
    mock = trio.testing.MockClock()
    trio.run(empty_hour, mock, clock=mock)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    rows = {"daemon hour": [timed(daemon_hour) for _ in range(args.runs)],
            "floor (empty loop, same ticks)": [timed(floor_hour) for _ in range(args.runs)]}
    for name, runs in rows.items():
        cpu = sorted(c for _, c in runs)
        wall = sorted(w for w, _ in runs)
        print(f"{name:<32} CPU s: min {cpu[0]:.3f} median {statistics.median(cpu):.3f} max {cpu[-1]:.3f}   "
              f"wall s: median {statistics.median(wall):.3f}")
    med = statistics.median(c for _, c in rows["daemon hour"])
    floor = statistics.median(c for _, c in rows["floor (empty loop, same ticks)"])
    print(f"ratio to floor: {med / floor:.1f}x; target: daemon hour < {TARGET_CPU_S:.1f} s of CPU: "
          f"{'met' if med < TARGET_CPU_S else 'NOT met'}")
    report("a virtual hour of a whole daemon, CPU, median", med, "s", floor=floor,
           floor_is="empty trio loop, same ticks", target=TARGET_CPU_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
