"""Soak: 16 concurrent readers over every file of the tree while a writer injects 100 faults/s.
Reports read errors, each read's latency (open, read, close) under the faults beside the same
readers' with no faults (a first phase, a quarter as long), the daemon's RSS growth, and its RSS
at 8 x H100 and 64 x H100 NVL (an HGX H100 board sits at most 8 to a node).
Targets: 0 errors, read p99 <= 5 ms under the faults, RSS growth <= 5 MB, RSS <= 80 MB at 8 GPUs
and <= 150 MB at 64."""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from pathlib import Path

from _node import WIDE_GPUS, WIDE_PROFILE, BenchNode, percentile, report

FAULTS = [
    ("inject_xid", b"13\n"), ("inject_xid", b"48\n"), ("inject_xid", b"79\n"), ("reset", b"1\n"),
    ("inject_ecc", b"sbe 3 l2\n"), ("temperature", b"88\n"), ("temperature", b"auto\n"),
    ("utilization", b"90 40\n"), ("utilization", b"auto\n"), ("inject_xid", b"74\n"),
    ("nvlink", b"2 down\n"), ("nvlink", b"2 up\n"), ("throttle", b"sw_power_cap\n"), ("throttle", b"auto\n"),
]


def all_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Skip device nodes and write-only files; readers read what a monitoring agent reads.
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if (st.st_mode & 0o170000) == 0o100000 and st.st_mode & 0o444:
                out.append(p)
    return out


def reader(files: list[str], seconds: float, q) -> None:
    reads = errors = 0
    first_error = ""
    latencies = []  # us per read: open, read to the end, close
    clock = time.perf_counter_ns
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for p in files:
            t0 = clock()
            try:
                with open(p, "rb") as f:
                    f.read()
                reads += 1
            except FileNotFoundError:
                reads += 1  # a lost GPU's sysfs entry vanishing mid-walk is the simulation, not an error
            except OSError as e:
                errors += 1
                first_error = first_error or f"{p}: {e}"
            latencies.append((clock() - t0) / 1000)
            if time.monotonic() >= end:
                break
    q.put((reads, errors, first_error, latencies))


def writer(root: Path, gpus: int, seconds: float, rate: float, q) -> None:
    n = errors = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        name, data = FAULTS[n % len(FAULTS)]
        gpu = n % gpus
        try:
            fd = os.open(root / f"gpu{gpu}" / name, os.O_WRONLY)
            os.write(fd, data)
            os.close(fd)
        except OSError:
            errors += 1
        n += 1
        delay = start + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    q.put((n, errors))


def read_only(files: list[str], seconds: float, readers: int) -> list[float]:
    """The same readers with no writer: the latency floor of the faults' phase."""
    q = mp.Queue()
    procs = [mp.Process(target=reader, args=(files, seconds, q)) for _ in range(readers)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return [v for r in results for v in r[3]]


def soak(gpus: int, seconds: float, readers: int, rate: float) -> None:
    with BenchNode(gpus=gpus) as node:
        files = all_files(node.mnt)
        node.settle()
        quiet = read_only(files, seconds / 4, readers)
        rss0 = node.rss_kib()
        q = mp.Queue()
        procs = [mp.Process(target=reader, args=(files, seconds, q)) for _ in range(readers)]
        wq = mp.Queue()
        w = mp.Process(target=writer, args=(node.mnt, gpus, seconds, rate, wq))
        for p in procs + [w]:
            p.start()
        results = [q.get() for _ in procs]
        injected, write_errors = wq.get()
        for p in procs + [w]:
            p.join()
        rss1 = node.rss_kib()
    reads = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    first = next((r[2] for r in results if r[2]), "")
    loaded = [v for r in results for v in r[3]]
    print(f"{gpus} GPUs, {len(files)} files, {readers} readers, {seconds:.0f} s: {reads} reads, {errors} read errors, "
          f"{injected} faults injected ({injected / seconds:.0f}/s), {write_errors} write errors")
    if first:
        print(f"  first error: {first}")
    print(f"  daemon RSS {rss0 / 1024:.1f} MB -> {rss1 / 1024:.1f} MB, growth {(rss1 - rss0) / 1024:.2f} MB (target <= 5)")
    print(f"  {'read latency, ms':<26} {'p50':>7} {'p99':>7} {'max':>7} {'reads':>7}")
    for name, vals in ((f"no faults ({seconds / 4:.0f} s)", quiet), (f"{rate:.0f} faults/s ({seconds:.0f} s)", loaded)):
        print(f"  {name:<26} {percentile(vals, 0.5) / 1000:>7.2f} {percentile(vals, 0.99) / 1000:>7.2f} "
              f"{max(vals) / 1000:>7.2f} {len(vals):>7}")
    print(f"  target: p99 under the faults <= 5 ms: {percentile(loaded, 0.99) / 1000:.2f}/5 = "
          f"{percentile(loaded, 0.99) / 5000:.2f}")
    report(f"file read under {rate:.0f} faults/s, {readers} readers, every file, p50", percentile(loaded, 0.5) / 1000,
           "ms", floor=percentile(quiet, 0.5) / 1000, floor_is="the same readers, no faults")
    report(f"file read under {rate:.0f} faults/s, {readers} readers, every file, p99", percentile(loaded, 0.99) / 1000,
           "ms", floor=percentile(quiet, 0.99) / 1000, floor_is="the same readers, no faults", target=5)
    report(f"soak {seconds:.0f} s, {rate:.0f} faults/s: read errors", errors, "errors", target=0)
    report(f"soak {seconds:.0f} s: daemon RSS growth", (rss1 - rss0) / 1024, "MB", target=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--rate", type=float, default=100)
    args = ap.parse_args()
    soak(8, args.seconds, args.readers, args.rate)
    print(f"{'node':>14} {'RSS MB':>7} {'target MB':>10} {'ratio':>6}")
    for profile, gpus, target in (("h100", 8, 80), (WIDE_PROFILE, WIDE_GPUS, 150)):
        with BenchNode(profile, gpus) as node:
            for p in all_files(node.mnt):  # touch every file once so the tree is fully resolved
                with open(p, "rb") as f:
                    f.read()
            rss = node.rss_kib() / 1024
        print(f"{f'{gpus} x {profile}':>14} {rss:>7.1f} {target:>10} {rss / target:>6.2f}")
        report(f"daemon RSS, {gpus} x {profile}, every file read", rss, "MB", target=target)


if __name__ == "__main__":
    main()
