"""`lspci -vvv` through `mokka run` (at the real /sys paths, which it binds from the daemon's
mirror, mokkafs/daemon/mirror.py) vs the same tree copied to tmpfs (`cp -a`, read with
`-A linux-sysfs -O sysfs.path=`), and, for reference, straight over the FUSE mount.
Target: ratio <= 2.

Both sides run alternately inside one `mokka run` namespace, so the ratio compares the file
systems only; the cost `mokka run` itself adds (Python start-up, namespace set-up) is printed
on its own line.  Usage: python bench/bench_lspci.py [--rounds 15] [--profile h100]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _node import PREFIX, SHM, BenchNode, report  # noqa: E402

LSPCI = ["lspci", "-vvv"]


def _timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, res.stdout


def inner(copy: str, mnt: str, rounds: int) -> None:
    """Runs inside the namespace: alternate the readers, print one line per round."""
    on_copy = [*LSPCI[:1], "-A", "linux-sysfs", "-O", f"sysfs.path={copy}/sys/bus/pci", *LSPCI[1:]]
    on_fuse = [*LSPCI[:1], "-A", "linux-sysfs", "-O", f"sysfs.path={mnt}/sys/bus/pci", *LSPCI[1:]]
    _timed(LSPCI), _timed(on_copy), _timed(on_fuse)  # warm all (pci.ids, page cache, dentries)
    for _ in range(rounds):
        t_run, out_run = _timed(LSPCI)
        t_copy, out_copy = _timed(on_copy)
        t_fuse, out_fuse = _timed(on_fuse)
        same = out_run == out_copy == out_fuse
        print(f"{t_run:.6f} {t_copy:.6f} {int(same)} {t_fuse:.6f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    ap.add_argument("--mnt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner(args.inner, args.mnt, args.rounds)
        return 0
    with BenchNode(args.profile) as node, tempfile.TemporaryDirectory(prefix=PREFIX + "lspci-", dir=SHM) as copy:
        deadline = time.monotonic() + 30  # the daemon writes its mirror in the background
        while not (node.state / "mirror" / "sys").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run(["cp", "-a", str(node.mnt / "sys"), copy], check=True)
        fstype = subprocess.run(["stat", "-f", "-c", "%T", copy], capture_output=True, text=True).stdout.strip()
        run = [sys.executable, "-m", "mokkafs.cli", "run", "--root", str(node.mnt), "--"]
        res = subprocess.run([*run, sys.executable, __file__, "--inner", copy, "--mnt", str(node.mnt),
                              "--rounds", str(args.rounds)],
                             capture_output=True, text=True, check=True, env=node.env)
        rows = [line.split() for line in res.stdout.splitlines()]
        mount_t = [float(r[0]) for r in rows]
        copy_t = [float(r[1]) for r in rows]
        fuse_t = [float(r[3]) for r in rows]
        same = all(r[2] == "1" for r in rows)
        # End to end, as a user types it: `mokka run -- lspci -vvv` vs lspci on the copy.
        e2e = [_timed([*run, *LSPCI])[0] for _ in range(5)]
        plain = [_timed(["lspci", "-A", "linux-sysfs", "-O", f"sysfs.path={copy}/sys/bus/pci", "-vvv"])[0]
                 for _ in range(5)]
    m_mount, m_copy = statistics.median(mount_t), statistics.median(copy_t)
    m_fuse = statistics.median(fuse_t)
    print(f"lspci -vvv, {args.profile} node, {args.rounds} rounds, copy on {fstype}; identical output: {same}")
    print(f"  {'mokka run (mirror)':>20} {'copy on tmpfs':>14} {'ratio':>7}   {'FUSE mount':>11} {'ratio':>7}")
    print(f"  {m_mount * 1e3:>17.1f} ms {m_copy * 1e3:>11.1f} ms {m_mount / m_copy:>7.2f}   "
          f"{m_fuse * 1e3:>8.1f} ms {m_fuse / m_copy:>7.2f}   (target <= 2 for mokka run)")
    print(f"  end to end: `mokka run -- lspci -vvv` {statistics.median(e2e) * 1e3:.0f} ms median "
          f"vs lspci on the copy {statistics.median(plain) * 1e3:.0f} ms "
          f"(the difference is mokka run's start-up: Python imports and namespace set-up)")
    report("lspci -vvv in mokka run, median", m_mount * 1e3, "ms", floor=m_copy * 1e3,
           floor_is="the same tree copied to tmpfs", target=2 * m_copy * 1e3, note="target: 2x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
