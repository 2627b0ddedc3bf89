"""nvidia-smi wall time on a mounted node, side by side with /bin/true in one run (process start
is most of it). Targets: the 5-field --query-gpu CSV on 8 x H100, median <= 10 ms; the
default table on 64 GPUs (H100 NVL: an HGX H100 board sits at most 8 to a node), median <= 50 ms."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from _node import WIDE_GPUS, WIDE_PROFILE, BenchNode, report

from mokkafs.render import native

QUERY = ["--query-gpu=index,name,temperature.gpu,utilization.gpu,memory.used", "--format=csv"]


def wall_ms(cmd: list[str], env: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(profile: str, gpus: int, args: list[str], n: int, target_ms: float, label: str) -> None:
    node = BenchNode(profile, gpus)
    try:
        node.mount()
        env = dict(os.environ, MOKKA_STATE=str(node.state / "state"), LD_LIBRARY_PATH=str(native.LIB_DIR))
        smi = str(native.LIB_DIR.parent / "bin" / "nvidia-smi")
        wall_ms([smi, *args], env, 3)  # warm the page cache
        true, ours = [], []
        for _ in range(n):  # interleaved, so both see the same machine load
            true += wall_ms(["/bin/true"], env, 1)
            ours += wall_ms([smi, *args], env, 1)
        t, o = statistics.median(true), statistics.median(ours)
        verdict = "ok" if o <= target_ms else "OVER"
        print(f"{label:44s} median {o:6.2f} ms  /bin/true {t:5.2f} ms  ratio {o / t:5.2f}x  "
              f"target <= {target_ms:g} ms: {verdict}")
        report(f"nvidia-smi {label}, median", o, "ms", floor=t, floor_is="/bin/true", target=target_ms)
    finally:
        node.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=200)
    a = ap.parse_args()
    measure("h100", 8, QUERY, a.n, 10, "--query-gpu (5 fields) csv, 8 x h100")
    measure(WIDE_PROFILE, WIDE_GPUS, [], a.n, 50, f"default table, {WIDE_GPUS} x {WIDE_PROFILE}")


if __name__ == "__main__":
    main()
