#!/usr/bin/env python3
"""Visibility's cost (docs/containers.md): getters and nvmlInit of this tree's libnvidia-ml beside
a baseline revision's (default main), side by side on one mounted node, on a host /dev (no
nvidiactl: the whole node, no decision) and in a namespace whose /dev holds nvidiactl, every GPU's
node and the MIG monitor capability (the decision at its most work) or nvidiactl and one GPU
(nodes bound from the daemon's mirror, as `mokka run` binds them).

    python bench/bench_visibility.py [--baseline main] [--profile h100] [--gpus 8] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import runpy
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _node import PREFIX, BenchNode, report  # noqa: E402

# The /dev of each case, as `unshare -m` gives it (names are the mount's dev/ entries).
SETUP = r"""
set -e
S=$(mktemp -d); mount --bind /dev/shm "$S"   # the node's state directory lives there
mount -t tmpfs -o mode=755 dev /dev
mknod -m 666 /dev/null c 1 3
mkdir /dev/shm; mount --move "$S" /dev/shm; rmdir "$S"
M="$1"; shift
while [ "$1" != "--" ]; do
  mkdir -p "$(dirname /dev/$1)"; touch "/dev/$1"; mount --bind "$M/dev/$1" "/dev/$1"; shift
done
shift
exec "$@"
"""


def build_nvml(revision: str | None, out: Path) -> Path:
    """libnvidia-ml.so.1 of `revision` (None: this tree), built by that revision's own setup.py."""
    src = ROOT
    if revision:
        src = out / "src"
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "setup.py", "shims"],
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(src)
    import setuptools

    real_setup, setuptools.setup = setuptools.setup, lambda **kw: None
    try:
        here = os.getcwd()
        os.chdir(src)
        funcs = runpy.run_path(str(src / "setup.py"))
    finally:
        os.chdir(here)
        setuptools.setup = real_setup
    native = out / "native"
    funcs["build_nvml"](native)
    return native / "lib" / "libnvidia-ml.so.1"


def measure(exe: Path, lib: Path, node: BenchNode, dev: list[str] | None) -> dict[str, float]:
    cmd = [str(exe), str(lib)]
    if dev is not None:
        # The nodes from the daemon's mirror (plain files), as `mokka run` binds them and as a
        # runtime's mknod makes them: a node on the FUSE mount costs a round trip to the daemon.
        cmd = ["unshare", "-m", "sh", "-c", SETUP, "sh", str(node.state / "mirror"), *dev, "--", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(node.env, MOKKA_STATE=str(node.state / "state")))
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[-2:])} in /dev {dev}: {r.stderr.strip()}")
    out = r.stdout
    return {k: float(v) for k, v in (w.split("=") for w in out.split())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="main")
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{args.baseline}^{{commit}}"],
                      capture_output=True).returncode:
        print(f"# no revision {args.baseline!r} in this clone: the baseline is HEAD (committed, not this tree)")
        args.baseline = "HEAD"
    with tempfile.TemporaryDirectory(prefix=PREFIX + "visibility-") as tmp:
        tmp = Path(tmp)
        (tmp / "base").mkdir()
        (tmp / "this").mkdir()
        libs = {args.baseline: build_nvml(args.baseline, tmp / "base"), "this": build_nvml(None, tmp / "this")}
        exe = tmp / "bench_visibility"
        subprocess.run(["cc", "-O2", "-I", str(ROOT / "shims" / "include"), str(ROOT / "bench" / "bench_visibility.c"),
                        "-o", str(exe), "-ldl"], check=True)
        with BenchNode(args.profile, args.gpus) as node:
            settled = node.settle()
            every = ["nvidiactl", *(f"nvidia{i}" for i in range(args.gpus)), "nvidia-caps/nvidia-cap2"]
            cases = [("host /dev (no nvidiactl)", None), (f"nvidiactl + {args.gpus} GPUs + monitor", every),
                     ("nvidiactl + nvidia2", ["nvidiactl", "nvidia2"])]
            print(f"# {args.gpus} x {args.profile}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
                  f"after start-up ({settled:.2f} s); medians of {args.runs} interleaved runs, best of 5 rounds each")
            keys = ("temperature_ns", "power_ns", "memory_ns", "init_p50_us", "init_p99_us")
            print(f"{'case':34} {'library':8} {'gpus':>4} " + " ".join(f"{k:>15}" for k in keys))
            for label, dev in cases:
                runs: dict[str, list[dict]] = {name: [] for name in libs}
                for _ in range(args.runs):
                    for name, lib in libs.items():
                        runs[name].append(measure(exe, lib, node, dev))
                med = {name: {k: statistics.median(r[k] for r in rs) for k in (*keys, "gpus")}
                       for name, rs in runs.items()}
                for name in libs:
                    m = med[name]
                    print(f"{label:34} {name:8} {m['gpus']:4.0f} " + " ".join(f"{m[k]:15.2f}" for k in keys))
                ratio = {k: med["this"][k] / med[args.baseline][k] for k in keys}
                print(f"{'':34} {'ratio':8} {'':4} " + " ".join(f"{ratio[k]:15.2f}" for k in keys))
                report(f"nvmlInit, {label}, p50", med["this"]["init_p50_us"], "us",
                       floor=med[args.baseline]["init_p50_us"], floor_is=f"the {args.baseline} library")
    return 0


if __name__ == "__main__":
    sys.exit(main())
