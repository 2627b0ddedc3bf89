#!/usr/bin/env python3
"""Run every bench in bench/, one after another, and print each figure beside its floor (what
the same work costs without mokkafs, measured in the same run) and its target.

    python bench/run_all.py [--quick] [--only NAME[,NAME...]] [--list]

--quick runs each bench a few iterations long (minutes in all, not the better part of an hour):
enough to show every bench works and leaves nothing behind, not enough for figures to quote.
The figures docs/ quote come from a full run on a quiet machine.

A bench leaves nothing behind: after each one, a new `mokka-bench-*` entry in /dev/shm or the
temporary directory, or a mount point under one, fails it (and is cleaned away). Ctrl-C or
SIGTERM stops the running bench through its own clean-up (bench/_node.py), then this script.
Exit status: 0 when every bench ran and left nothing; 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _node import PREFIX, SHM, force_unmount  # noqa: E402

# name, extra arguments in quick mode. Every bench_*.py is here (a test checks).
BENCHES: list[tuple[str, list[str]]] = [
    ("bench_mount", ["--runs", "1"]),
    ("bench_read", ["-n", "500"]),
    ("bench_scenario", ["--steps", "50", "--writes", "20"]),
    ("bench_setters", ["--n", "20"]),
    ("bench_metrics", ["-n", "20"]),
    ("bench_nvidia_smi", ["-n", "5"]),
    ("bench_soak", ["--seconds", "3", "--readers", "2", "--rate", "20"]),
    ("bench_nvml", []),
    ("bench_mig", []),
    ("bench_cuda", []),
    ("bench_cudart", ["--runs", "3"]),
    ("bench_lspci", ["--rounds", "2"]),
    ("bench_run_exec", ["-n", "20", "--smi-n", "3"]),
    ("bench_visibility", ["--runs", "1"]),
    ("bench_agent", ["--n", "10"]),
    ("bench_virtual_time", ["--runs", "1"]),
]
QUICK_TIMEOUT_S = 600


def leftovers() -> set[str]:
    """What benches name `mokka-bench-*` in /dev/shm and the temporary directory, and mount points
    under either."""
    found = set()
    for base in {SHM, tempfile.gettempdir()} - {None}:
        for entry in Path(base).glob(PREFIX + "*"):
            found.add(str(entry))
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            if f"/{PREFIX}" in point:
                found.add(f"mounted: {point}")
    return found


def clean(paths: set[str]) -> None:
    for p in sorted(paths, key=len, reverse=True):
        path = Path(p.removeprefix("mounted: "))
        force_unmount(path)
    for p in paths:
        if not p.startswith("mounted: "):
            path = Path(p)
            force_unmount(path)
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def run_one(name: str, args: list[str], results: Path, timeout: float | None) -> tuple[int, str]:
    """Run bench `name` in a session of its own; on Ctrl-C/SIGTERM (here) or past `timeout`,
    send its process group SIGTERM, which a bench's clean-up handles as it does Ctrl-C (SIGINT
    may be ignored where this runs in the background), then SIGKILL after 60 s."""
    env = dict(os.environ, MOKKA_BENCH_RESULTS=str(results), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(BENCH / f"{name}.py"), *args], env=env, cwd=BENCH.parent,
                            start_new_session=True)
    try:
        return proc.wait(timeout), ""
    except subprocess.TimeoutExpired:
        why = f"timed out after {timeout:.0f} s"
    except (KeyboardInterrupt, SystemExit):
        why = "interrupted"
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    if why == "interrupted":
        raise KeyboardInterrupt
    return proc.returncode or 1, why


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def table(rows: list[dict]) -> str:
    out = ["| bench | figure | measured | floor | target | measured/target |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = r["unit"]
        floor = f"{fmt(r['floor'])} {unit} ({r['floor_is']})" if r["floor"] is not None else "-"
        target = f"{fmt(r['target'])} {unit}" if r["target"] is not None else (r["note"] or "-")
        ratio = f"{r['value'] / r['target']:.2f}" if r["target"] else "-"
        out.append(f"| {r['bench']} | {r['figure']} | {fmt(r['value'])} {unit} | {floor} | {target} | {ratio} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few iterations each: shows they work, not figures")
    ap.add_argument("--only", help="comma-separated bench names (bench_mount or mount)")
    ap.add_argument("--list", action="store_true", help="print the benches and their quick arguments")
    args = ap.parse_args()
    known = dict(BENCHES)
    if args.list:
        for name, quick in BENCHES:
            print(name, " ".join(quick))
        return 0
    chosen = [name for name, _ in BENCHES]
    if args.only:
        chosen = [n if n.startswith("bench_") else f"bench_{n}" for n in args.only.split(",") if n]
        unknown = [n for n in chosen if n not in known]
        if unknown:
            ap.error(f"no bench {', '.join(unknown)} (known: {', '.join(known)})")

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    load = os.getloadavg()
    print(f"# {len(chosen)} benches{', quick' if args.quick else ''}; {os.cpu_count()} CPUs, load "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
          + ("; quick figures are a smoke run: noisy, not for quoting" if args.quick else ""), flush=True)
    rows: list[dict] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mokka-run-all-") as tmp:
        for name in chosen:
            results = Path(tmp) / f"{name}.jsonl"
            before = leftovers()
            print(f"\n## {name} {' '.join(known[name]) if args.quick else ''}".rstrip(), flush=True)
            t0 = time.monotonic()
            try:
                rc, why = run_one(name, known[name] if args.quick else [], results,
                                  QUICK_TIMEOUT_S if args.quick else None)
            except KeyboardInterrupt:
                clean(leftovers() - before)
                print(f"\ninterrupted in {name}", file=sys.stderr)
                return 130
            left = leftovers() - before
            if left:
                clean(left)
                failed.append(f"{name}: left behind {', '.join(sorted(left))}")
            if rc:
                failed.append(f"{name}: exit {rc}{', ' + why if why else ''}")
            got = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            rows += got
            print(f"## {name}: {'ok' if not rc and not left else 'FAILED'} in {time.monotonic() - t0:.1f} s, "
                  f"{len(got)} figures", flush=True)
    load = os.getloadavg()
    print(f"\n# load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end"
          + ("; quick run: noisy figures" if args.quick else ""))
    print(table(rows))
    without = [n for n in chosen if not any(r["bench"] == n for r in rows) and not any(f.startswith(n + ":") for f in failed)]
    if without:
        print(f"\nprinted above, no figure in the table: {', '.join(without)}")
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
