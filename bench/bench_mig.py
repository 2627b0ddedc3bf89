#!/usr/bin/env python3
"""Build bench/bench_mig.c against the shim, mount a node and print MIG's numbers: a getter on a
MIG device handle beside the same getter on a GPU handle, and creating and destroying a full
7-instance layout, side by side in one run.

    python bench/bench_mig.py [--profile h100] [--gpus 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _node import nvml_link_flags, run_c_bench  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_c_bench("bench_mig", nvml_link_flags(), lambda node: []))
