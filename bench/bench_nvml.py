#!/usr/bin/env python3
"""Build bench/bench_nvml.c against the shim, mount a node and print the NVML numbers.

    python bench/bench_nvml.py [--profile h100] [--gpus 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import re  # noqa: E402

from _node import nvml_link_flags, report, run_c_bench  # noqa: E402

PERCENTILES = re.compile(r"^(.+?)\s+p50\s+([\d.]+) (\w+)\s+p99\s+([\d.]+) \w+\s+max\s+([\d.]+) \w+$")
# Targets of the latency lines (the unit printed, us): the NVML event's wake after a fault write.
TARGETS = {"write inject_xid -> nvmlEventSetWait_v2": (1000, 5000)}


def parse(line: str) -> None:
    m = PERCENTILES.match(line)
    if m:
        name, unit = m[1].strip(), m[3]
        p99_target, max_target = TARGETS.get(name, (None, None))
        report(f"{name}, p99", float(m[4]), unit, target=p99_target)
        report(f"{name}, max", float(m[5]), unit, target=max_target)


if __name__ == "__main__":
    sys.exit(run_c_bench("bench_nvml", nvml_link_flags() + ["-pthread"], lambda node: [str(node.mnt)], parse=parse))
