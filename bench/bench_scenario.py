#!/usr/bin/env python3
"""Scheduled time -> the event seen by an NVML waiter, for a scenario's steps, beside a control
write's start -> the same waiter (what an `echo` costs), on one mounted node.

    python bench/bench_scenario.py [--steps 1000] [--gap-ms 10]

A pynvml process blocks in nvmlEventSetWait and stamps each Xid it receives; a step's scheduled
time is the scenario's start (node/scenario) plus its offset.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _node import BenchNode, percentile, report  # noqa: E402
from mokkafs.render import native  # noqa: E402
from mokkafs.model.scenario import request_bytes  # noqa: E402

WAITER = """
import sys, time, pynvml as p
p.nvmlInit()
s = p.nvmlEventSetCreate()
p.nvmlDeviceRegisterEvents(p.nvmlDeviceGetHandleByIndex(0), p.nvmlEventTypeXidCriticalError, s)
print("waiting", flush=True)
for _ in range(int(sys.argv[1])):
    p.nvmlEventSetWait_v2(s, 60000)
    print(time.time(), flush=True)
"""


def waiter(node: BenchNode, n: int) -> subprocess.Popen:
    lib = native.nvml_library().parent
    env = dict(os.environ, MOKKA_STATE=str(node.state / "state"), LD_LIBRARY_PATH=str(lib))
    proc = subprocess.Popen([sys.executable, "-c", WAITER, str(n)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "waiting\n"
    return proc


def percentiles(ms: list[float]) -> str:
    # Nearest rank: statistics.quantiles extrapolates past the largest sample when there are few.
    return f"p50 {statistics.median(ms):7.3f} ms  p99 {percentile(ms, 0.99):7.3f} ms  max {max(ms):7.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--gap-ms", type=float, default=10.0)
    ap.add_argument("--writes", type=int, default=200, help="direct control writes")
    args = ap.parse_args()
    node = BenchNode(gpus=1)
    try:
        node.mount()
        node.settle()
        # Direct control writes, one at a time, each waited for.
        direct = []
        w = waiter(node, args.writes)
        for _ in range(args.writes):
            t0 = time.time()
            with open(node.mnt / "gpu0" / "inject_xid", "wb", buffering=0) as f:
                f.write(b"13\n")
            direct.append((float(w.stdout.readline()) - t0) * 1000)
        w.wait()

        gap = args.gap_ms / 1000
        steps = "".join(f"  - at: {0.5 + k * gap:.3f}\n    gpu: 0\n    command: xid 13\n" for k in range(args.steps))
        text = f"name: bench\nsteps:\n{steps}"
        w = waiter(node, args.steps)
        with open(node.mnt / "node" / "scenario", "wb", buffering=0) as f:
            f.write(request_bytes(text))
        started = next(line for line in (node.mnt / "node" / "scenario").read_text().splitlines()
                       if line.startswith("started: "))
        start = datetime.fromisoformat(started.split(": ", 1)[1].replace("Z", "+00:00")).timestamp()
        seen = [float(w.stdout.readline()) for _ in range(args.steps)]
        w.wait()
        late = [(t - (start + 0.5 + k * gap)) * 1000 for k, t in enumerate(seen)]
    finally:
        node.umount()
    print(f"control write -> NVML waiter  ({len(direct)} writes):   {percentiles(direct)}")
    print(f"scheduled -> NVML waiter      ({args.steps} steps, {args.gap_ms:g} ms apart): {percentiles(late)}")
    print(f"ratio of p50s (scenario / write): {statistics.median(late) / statistics.median(direct):.2f}")
    p99 = percentile(direct, 0.99)
    report("control write -> pynvml waiter wakes, p99", p99, "ms", target=1.0)
    report("control write -> pynvml waiter wakes, max", max(direct), "ms", target=5.0)
    report("scenario step scheduled -> NVML waiter, p99", percentile(late, 0.99), "ms",
           floor=p99, floor_is="a direct control write, p99")


if __name__ == "__main__":
    main()
