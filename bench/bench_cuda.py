#!/usr/bin/env python3
"""Build bench/bench_cuda.c, mount a node and print the libcuda numbers beside their targets:
cuInit + enumeration <= 2 ms, a cuMemAlloc/cuMemFree pair <= 2 us.

    python bench/bench_cuda.py [--profile h100] [--gpus 8]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _node import BenchNode  # noqa: E402
from mokkafs import native  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    lib = native.cuda_library()
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        tmp = Path(tmp)
        exe = tmp / "bench_cuda"
        subprocess.run(["cc", "-O2", str(ROOT / "bench" / "bench_cuda.c"), "-o", str(exe), "-ldl"], check=True)
        with BenchNode(args.profile, args.gpus) as node:
            print(f"# {args.gpus} x {args.profile}, {os.cpu_count()} CPUs")
            print("| measure | result | target |\n|---|---|---|", flush=True)
            subprocess.run([str(exe), str(lib)], check=True, env=dict(node.env, MOKKA_STATE=str(node.state / "state")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
