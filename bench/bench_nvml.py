#!/usr/bin/env python3
"""Build bench/bench_nvml.c against the shim, mount a node and print the NVML numbers.

    python bench/bench_nvml.py [--profile h100] [--gpus 8]
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
    lib = native.nvml_library()
    with tempfile.TemporaryDirectory(prefix="bench-nvml-") as tmp:
        tmp = Path(tmp)
        exe = tmp / "bench_nvml"
        subprocess.run(["cc", "-O2", "-I", str(ROOT / "shims" / "include"), str(ROOT / "bench" / "bench_nvml.c"),
                        "-o", str(exe), f"-L{lib.parent}", f"-Wl,-rpath,{lib.parent}", "-l:libnvidia-ml.so.1",
                        "-pthread"], check=True)
        with BenchNode(args.profile, args.gpus) as node:
            print(f"# {args.gpus} x {args.profile}, {os.cpu_count()} CPUs")
            subprocess.run([str(exe), str(node.mnt)], check=True,
                           env=dict(node.env, MOKKA_STATE=str(node.state / "state")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
