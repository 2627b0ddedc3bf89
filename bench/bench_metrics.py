"""A scrape of a 64-GPU node (64 x H100 NVL: an HGX H100 board sits at most 8 to a node): the pure renderer in this process, the
text the server keeps between model changes (`Exposition`) in this process, GET /metrics over loopback on a mounted node
started with --metrics, and the same GET right after an event (a control-file write, not timed, before each), which
composes the text again; interleaved in one run. Target: p99 <= 5 ms (at load 4). `--busy N` runs N processes that
only burn CPU beside the scrapes; the run prints how many tasks were runnable (sampled each round) and the load average."""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from _node import PREFIX, WIDE_GPUS, WIDE_PROFILE, BenchNode, BusyLoad, loadavg, percentile, report, runnable

from mokkafs.model import Node, compose
from mokkafs.model.profiles import load_profile
from mokkafs.render.metrics import Exposition, render

TARGET_MS = 5.0


class MetricsNode(BenchNode):
    def mount_args(self) -> list[str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        return ["--metrics", f"127.0.0.1:{self.port}"]


@contextmanager
def floor_server(body: bytes):
    """bench/_floor_http.py serving `body`; yields its URL."""
    with tempfile.NamedTemporaryFile(prefix=PREFIX) as f:
        f.write(body)
        f.flush()
        r, w = os.pipe()
        # Its output goes nowhere: were it to outlive the bench, it would hold no caller's pipe.
        server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_floor_http.py")), f.name, str(w)],
                                  pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        os.close(w)
        try:
            with os.fdopen(r) as pipe:
                port = int(pipe.readline())
            yield f"http://127.0.0.1:{port}/metrics"
        finally:
            server.kill()  # first, so that an interrupt landing here leaves no server behind
            server.wait()


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
    ap.add_argument("--profile", default=WIDE_PROFILE)
    ap.add_argument("--gpus", type=int, default=WIDE_GPUS)
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N processes burning CPU beside the scrapes (the target names load 4: on 2 CPUs, "
                         "2 busy processes with the bench and the daemon)")
    args = ap.parse_args()

    node = Node(compose(load_profile(args.profile), gpus=args.gpus), time.time())
    body = render(node, time.time())
    size = len(body)
    with MetricsNode(args.profile, args.gpus) as mounted, floor_server(body) as floor_url:
        mounted.settle()  # the mirror's first write (a thread, ~1 s at 64 GPUs) is start-up, not a scrape's
        url = f"http://127.0.0.1:{mounted.port}/metrics"

        def get(where: str) -> None:
            with urllib.request.urlopen(where, timeout=10) as r:
                r.read()

        def http() -> None:
            get(url)

        def bare() -> None:
            get(floor_url)

        def pure() -> None:
            render(node, time.time())

        exposition = Exposition()

        def served() -> None:
            exposition.render(node, time.time())

        pin = mounted.mnt / "gpu0" / "memory_used"

        def after_event(n: int) -> list[float]:
            out = []
            for k in range(n):
                fd = os.open(pin, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, f"{1000 + k % 2}\n".encode())  # an event: the text is composed again
                finally:
                    os.close(fd)
                out += time_ms(http, 1)
            return out

        http(), bare(), pure(), served()  # warm up
        rendered, kept, scraped, evented, floor = [], [], [], [], []
        queue = []
        with BusyLoad(args.busy):
            for _ in range(10):  # interleaved rounds, so machine noise hits all alike
                queue.append(runnable())
                rendered += time_ms(pure, args.n // 10)
                kept += time_ms(served, args.n // 10)
                scraped += time_ms(http, args.n // 10)
                floor += time_ms(bare, args.n // 10)
                evented += after_event(args.n // 10)
            load = loadavg()

    print(f"{args.gpus} x {args.profile}, {size} bytes per scrape, {len(rendered)} scrapes each; target {TARGET_MS:.0f} ms; "
          f"{args.busy} busy processes beside them: {statistics.mean(queue):.1f} tasks runnable, load average {load}")
    print(f"{'':<32}{'median ms':>10}{'p99 ms':>10}{'p99/target':>12}")
    rows = (("pure render", rendered), ("served text, in-process", kept), ("HTTP GET /metrics", scraped),
            ("HTTP GET after an event", evented), ("GET, bare trio server (floor)", floor))
    for name, values in rows:
        med, p99 = statistics.median(values), percentile(values, 0.99)
        print(f"{name:<32}{med:>10.2f}{p99:>10.2f}{p99 / TARGET_MS:>12.2f}")
    at = f", {args.busy} busy" if args.busy else ""
    report(f"GET /metrics, {args.gpus} x {args.profile}{at}, p99", percentile(scraped, 0.99), "ms",
           floor=percentile(floor, 0.99), floor_is="the same bytes from a bare trio server, p99", target=TARGET_MS,
           note=f"{statistics.mean(queue):.1f} runnable, load average {load}")
    report(f"GET /metrics after an event, {args.gpus} x {args.profile}{at}, p99", percentile(evented, 0.99), "ms",
           floor=percentile(rendered, 0.99), floor_is="pure render, p99", target=TARGET_MS,
           note=f"{statistics.mean(queue):.1f} runnable, load average {load}")
    print(f"HTTP / pure (median): {statistics.median(scraped) / statistics.median(rendered):.2f}")


if __name__ == "__main__":
    main()
