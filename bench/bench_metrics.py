"""A scrape of a 64-GPU node: the pure renderer in this process, and GET /metrics over loopback
on a mounted node started with --metrics, side by side in one run. Target: <= 20 ms."""
from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from _node import BenchNode, percentile

from mokkafs.model import Node, compose
from mokkafs.model.profiles import load_profile
from mokkafs.render.metrics import render

TARGET_MS = 20.0


class MetricsNode(BenchNode):
    def mount(self) -> float:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "mokkafs.cli", "mount", str(self.mnt), "--profile", self.profile,
             "--gpus", str(self.gpus), "--state-dir", str(self.state), "--metrics", f"127.0.0.1:{self.port}"],
            check=True, env=self.env, capture_output=True,
        )
        return time.perf_counter() - t0


def time_ms(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=200, help="scrapes per method")
    ap.add_argument("--gpus", type=int, default=64)
    args = ap.parse_args()

    node = Node(compose(load_profile("h100"), gpus=args.gpus), time.time())
    size = len(render(node, time.time()))
    with MetricsNode(gpus=args.gpus) as mounted:
        url = f"http://127.0.0.1:{mounted.port}/metrics"

        def http() -> None:
            with urllib.request.urlopen(url, timeout=10) as r:
                r.read()

        def pure() -> None:
            render(node, time.time())

        http(), pure()  # warm up
        rendered, scraped = [], []
        for _ in range(10):  # interleaved rounds, so machine noise hits both alike
            rendered += time_ms(pure, args.n // 10)
            scraped += time_ms(http, args.n // 10)

    print(f"{args.gpus} GPUs, {size} bytes per scrape, {len(rendered)} scrapes each; target {TARGET_MS:.0f} ms")
    print(f"{'':<22}{'median ms':>10}{'p99 ms':>10}{'p99/target':>12}")
    for name, values in (("pure render", rendered), ("HTTP GET /metrics", scraped)):
        med, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"{name:<22}{med:>10.2f}{p99:>10.2f}{p99 / TARGET_MS:>12.2f}")
    print(f"HTTP / pure (median): {statistics.median(scraped) / statistics.median(rendered):.2f}")


if __name__ == "__main__":
    main()
