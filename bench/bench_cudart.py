#!/usr/bin/env python3
"""The CUDA runtime (libcudart 12 and 13 from PyPI) beside the driver API on a mounted node, side
by side in one run: init in a fresh process (cudaGetDeviceCount against cuInit + cuDeviceGetCount;
target: within 2x) and an allocate/free pair (cudaMalloc + cudaFree against cuMemAlloc_v2 +
cuMemFree_v2; target: under 2 us).

    python bench/bench_cudart.py [--profile h100] [--gpus 8] [--runs 40]
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

from _node import BenchNode, percentile, report  # noqa: E402
from mokkafs.render import native  # noqa: E402


def runtimes() -> dict[str, Path]:
    import nvidia

    found = {}
    for base in nvidia.__path__:
        for sub, lib, name in (("cuda_runtime", "libcudart.so.12", "cudart 12"), ("cu13", "libcudart.so.13", "cudart 13")):
            if (Path(base) / sub / "lib" / lib).is_file():
                found[name] = Path(base) / sub / "lib" / lib
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    libcuda = native.cuda_library()
    rts = runtimes()
    with tempfile.TemporaryDirectory(prefix="bench_cudart-") as tmp:
        exe = Path(tmp) / "bench_cudart"
        subprocess.run(["cc", "-O2", str(ROOT / "bench" / "bench_cudart.c"), "-o", str(exe), "-ldl"], check=True)
        with BenchNode(args.profile, args.gpus) as node:
            settled = node.settle()
            # libcuda.so.1 from the build, as bench_cuda.py loads it: the node's copy under the mount
            # pays FUSE reads for its page faults, which would swamp what is measured here
            env = dict(node.env, MOKKA_STATE=str(node.state / "state"), LD_LIBRARY_PATH=str(libcuda.parent))
            print(f"# {args.gpus} x {args.profile}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
                  f"measured after start-up ({settled:.2f} s), {args.runs} fresh processes per init figure")

            def run(mode: str, lib: Path) -> list[str]:
                out = subprocess.run([str(exe), mode, str(lib)], env=env, capture_output=True, text=True, timeout=120)
                if out.returncode:
                    raise SystemExit(f"{mode} {lib}: exit {out.returncode} {out.stderr}")
                return out.stdout.split()

            rows = [("driver API (cuInit + cuDeviceGetCount)", "driver-init", "driver-pair", libcuda)]
            rows += [(f"{name} (cudaGetDeviceCount)", "runtime-init", "runtime-pair", lib) for name, lib in rts.items()]
            print("| API | init p50 | of which dlopen p50 | init p99 | init vs driver | alloc+free pair (1 MiB) "
                  "| targets |")
            print("|---|---|---|---|---|---|---|")
            base = None
            for label, init_mode, pair_mode, lib in rows:
                samples = [run(init_mode, lib) for _ in range(args.runs)]
                inits = [float(x[0]) for x in samples]
                loads = [float(x[1]) for x in samples]
                p50 = percentile(inits, 0.5)
                base = base or p50
                pair = float(run(pair_mode, lib)[0])
                print(f"| {label} | {p50 / 1e3:.0f} us | {percentile(loads, 0.5) / 1e3:.0f} us "
                      f"| {percentile(inits, 0.99) / 1e3:.0f} us | {p50 / base:.2f}x "
                      f"| {pair:.0f} ns | init <= 2x, pair <= 2000 ns |", flush=True)
                report(f"{label.split(' (')[0]} init, p50", p50 / 1e3, "us", floor=base / 1e3,
                       floor_is="driver API init, p50", target=2 * base / 1e3, note="target: 2x the driver's")
                report(f"{label.split(' (')[0]} alloc+free pair (1 MiB)", pair, "ns", target=2000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
