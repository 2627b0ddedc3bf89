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

from _node import nvml_link_flags, run_c_bench  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_c_bench("bench_nvml", nvml_link_flags() + ["-pthread"], lambda node: [str(node.mnt)]))
