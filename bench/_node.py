"""Mount a node for a benchmark, through the real CLI, and take it down again."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class BenchNode:
    def __init__(self, profile: str = "h100", gpus: int = 8) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="mokka-bench-"))
        self.mnt = self.tmp / "mnt"
        # The state directory on a tmpfs, as the daemon's default (/run/mokka) is: a busy disk
        # under the per-event persistence would be measured otherwise.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.state_base = Path(tempfile.mkdtemp(prefix="mokka-bench-state-", dir=shm))
        self.state = self.state_base / "state"
        self.env = dict(os.environ, MOKKA_RUNTIME_DIR=str(self.tmp / "run"))
        self.profile, self.gpus = profile, gpus

    def mount(self) -> float:
        """Mount; return seconds from the command's start to the tree answering."""
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "mokkafs.cli", "mount", str(self.mnt), "--profile", self.profile,
             "--gpus", str(self.gpus), "--state-dir", str(self.state)],
            check=True, env=self.env, capture_output=True,
        )
        (self.mnt / "node" / "gpu_count").read_text()
        return time.perf_counter() - t0

    def settle(self, timeout: float = 60.0) -> float:
        """Wait until start-up work is over (the mirror's first, whole write, thousands of files
        in a thread), so that what is measured next is the running daemon, not its start;
        return the seconds waited."""
        t0 = time.perf_counter()
        while not (self.state / "mirror").is_dir():
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{self.state}/mirror not written after {timeout:.0f} s")
            time.sleep(0.01)
        return time.perf_counter() - t0

    def umount(self) -> None:
        subprocess.run([sys.executable, "-m", "mokkafs.cli", "umount", str(self.mnt)], env=self.env,
                       capture_output=True)

    def pid(self) -> int:
        name = os.path.realpath(self.mnt).strip("/").replace("/", "_")
        return int((self.tmp / "run" / f"{name}.pid").read_text())

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid()}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def __enter__(self) -> "BenchNode":
        self.mount()
        return self

    def __exit__(self, *exc) -> None:
        self.umount()
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.state_base, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def nvml_link_flags() -> list[str]:
    """cc flags that compile a benchmark against our shim's headers and link it to the built
    libnvidia-ml.so.1 (found at run time through its rpath)."""
    from mokkafs.render import native

    lib = native.nvml_library()
    include = Path(__file__).resolve().parent.parent / "shims" / "include"
    return ["-I", str(include), f"-L{lib.parent}", f"-Wl,-rpath,{lib.parent}", "-l:libnvidia-ml.so.1"]


def run_c_bench(name: str, cc_flags: list[str], run_args, header: str | None = None) -> int:
    """The shape every C benchmark shares: parse --profile/--gpus, build bench/<name>.c with
    `cc_flags`, mount a node, print a header line, and run the binary with `run_args(node)`
    (the node's state file in MOKKA_STATE)."""
    import argparse

    main = sys.modules["__main__"]
    ap = argparse.ArgumentParser(description=(main.__doc__ or name).splitlines()[0])
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    bench = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        exe = Path(tmp) / name
        subprocess.run(["cc", "-O2", str(bench / f"{name}.c"), "-o", str(exe), *cc_flags], check=True)
        with BenchNode(args.profile, args.gpus) as node:
            settled = node.settle()
            load = os.getloadavg()[0]
            print(f"# {args.gpus} x {args.profile}, {os.cpu_count()} CPUs, load {load:.2f}, "
                  f"measured after start-up ({settled:.2f} s)")
            if header:
                print(header, flush=True)
            subprocess.run([str(exe), *run_args(node)], check=True,
                           env=dict(node.env, MOKKA_STATE=str(node.state / "state")))
    return 0
