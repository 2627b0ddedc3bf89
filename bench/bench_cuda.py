#!/usr/bin/env python3
"""Build bench/bench_cuda.c, mount a node and print the libcuda numbers beside their targets:
cuInit + enumeration <= 2 ms, a cuMemAlloc/cuMemFree pair <= 2 us.

    python bench/bench_cuda.py [--profile h100] [--gpus 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import re  # noqa: E402

from _node import report, run_c_bench  # noqa: E402
from mokkafs.render import native  # noqa: E402

ROW = re.compile(r"^\| (.+?) \| (?:p50 )?([\d.]+) (us|ns)\b[^|]*\| <= (\d+) (us|ns) \|$")


def parse(line: str) -> None:
    m = ROW.match(line)
    if m:
        report(m[1], float(m[2]), m[3], target=float(m[4]))


if __name__ == "__main__":
    lib = native.cuda_library()
    sys.exit(run_c_bench("bench_cuda", ["-ldl"], lambda node: [str(lib)],
                         header="| measure | result | target |\n|---|---|---|", parse=parse))
