"""mount -> ready: `mokka mount` returning with the tree answering, 8 x H100 and 64 x H100 NVL
(an HGX H100 board sits at most 8 to a node; 64 GPUs are PCIe H100 NVLs, bench/_node.py).
Targets: <= 0.3 s for 8 GPUs, <= 0.5 s for 64.

Two floors, measured in the same run: the same CLI's start-up (`mokka --help`), and the least
any pyfuse3 daemon pays to be mounted and answering (bench/_floor_fs.py started the same way:
a fresh interpreter importing trio and pyfuse3, mounting one file, the file read). The second
is the floor the figure is reported against: what is above it is mokkafs's own start."""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _node import PREFIX, WIDE_GPUS, WIDE_PROFILE, BenchNode, force_unmount, report


def cli_start_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mokkafs.cli", "--help"], capture_output=True, check=True)
    return time.perf_counter() - t0


def bare_mount_s() -> float:
    """Seconds from starting bench/_floor_fs.py to its one file read back through the mount."""
    mnt, daemon = None, None
    try:
        mnt = Path(tempfile.mkdtemp(prefix=PREFIX + "floor-"))
        r, w = os.pipe()
        t0 = time.perf_counter()
        # Its own output goes nowhere: a daemon that outlived this bench must not hold the
        # caller's pipes open (the caller would wait for their end forever).
        daemon = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_floor_fs.py")), str(mnt), str(w)],
                                  pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        os.close(w)
        with os.fdopen(r, "rb") as pipe:
            if pipe.read(6) != b"ready\n":
                raise RuntimeError("the floor file system did not start")
        (mnt / "temperature").read_bytes()
        return time.perf_counter() - t0
    finally:
        # The floor lives a fifth of a second, so an interrupt (Ctrl-C, SIGTERM) often lands in
        # this clean-up: it is held until the clean-up is done, then raised as usual.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            _stop_floor(mnt, daemon)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _stop_floor(mnt: Path | None, daemon: subprocess.Popen | None) -> None:
    """Unmount, stop the daemon, detach whatever mount is left, remove the directory."""
    if mnt is None:
        return
    subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
    if daemon is not None:
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    force_unmount(mnt)
    os.rmdir(mnt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"{'node':>14} {'median s':>9} {'max s':>7} {'CLI start s':>12} {'bare pyfuse3 s':>15} "
          f"{'target s':>9} {'median/bare':>12} {'median/target':>14}")
    for profile, gpus, target in (("h100", 8, 0.3), (WIDE_PROFILE, WIDE_GPUS, 0.5)):
        times, clis, bares = [], [], []
        for _ in range(args.runs):
            # Interleaved, so machine noise hits all three alike.
            clis.append(cli_start_s())
            bares.append(bare_mount_s())
            node = BenchNode(profile, gpus)
            try:
                times.append(node.mount())
            finally:
                node.close()
        med, cli, bare = statistics.median(times), statistics.median(clis), statistics.median(bares)
        name = f"{gpus} x {profile}"
        print(f"{name:>14} {med:>9.3f} {max(times):>7.3f} {cli:>12.3f} {bare:>15.3f} {target:>9.1f} "
              f"{med / bare:>12.2f} {med / target:>14.2f}")
        report(f"mount -> ready, {name}, median", med, "s", floor=bare, target=target,
               floor_is="a bare pyfuse3 daemon mounted", note=f"mokka --help {cli:.3f} s")


if __name__ == "__main__":
    main()
