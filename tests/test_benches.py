"""bench/ runs from a clean clone and leaves the machine as it found it: bench/run_all.py --quick
on two benches (one of them mounts the 64-GPU node the figures in docs/metrics.md come from),
and a bench interrupted mid-mount (Ctrl-C, SIGTERM), then nothing of theirs is left in /dev/shm,
the temporary directory, or mounted."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.level("mount")

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PREFIX = "mokka-bench-"


def bench_traces() -> set[str]:
    """Everything the benches name mokka-bench-*: entries in /dev/shm and the temporary
    directory, and mount points under them."""
    found = {str(p) for base in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(base)
             for p in Path(base).glob(PREFIX + "*")}
    with open("/proc/self/mountinfo") as f:
        found |= {f"mounted: {line.split()[4]}" for line in f if f"/{PREFIX}" in line.split()[4]}
    return found


def test_run_all_lists_every_bench():
    listed = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--list"], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = {line.split()[0] for line in listed if line.strip()}
    assert names == {p.stem for p in BENCH.glob("bench_*.py")}


def test_quick_run_prints_figures_and_leaves_nothing():
    before = bench_traces()
    r = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--quick", "--only", "mount,read"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # The table: each figure beside its floor and target, the 64-GPU node among them.
    rows = [line for line in r.stdout.splitlines() if line.startswith("| bench_")]
    assert any(re.match(r"\| bench_mount \| mount -> ready, 64 x h100-nvl, median \| [\d.]+ s \| [\d.]+ s "
                        r"\(a bare pyfuse3 daemon mounted\) \| 0\.5 s \| [\d.]+ \|$", line) for line in rows), r.stdout
    assert any(line.startswith("| bench_read | control-file read gpu0/temperature, p99 |") for line in rows), r.stdout
    assert "FAILED" not in r.stdout
    assert bench_traces() - before == set()


@pytest.mark.parametrize("cmd, sig, status", [
    (["bench_mount.py", "--runs", "50"], signal.SIGINT, None),
    (["bench_mount.py", "--runs", "50"], signal.SIGTERM, None),
    # run_all stops the running bench (the soak's readers and writer are processes too), then itself
    (["run_all.py", "--quick", "--only", "soak"], signal.SIGTERM, 130),
], ids=["bench-SIGINT", "bench-SIGTERM", "run_all-SIGTERM"])
def test_interrupted_bench_cleans_up(cmd, sig, status):
    before = bench_traces()
    proc = subprocess.Popen([sys.executable, str(BENCH / cmd[0]), *cmd[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(t.startswith("mounted: ") for t in bench_traces() - before):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"{cmd} never mounted a node"
            time.sleep(0.01)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # Something the bench started outlived it and holds its output open: a failure, not a
        # hang of the suite. Its whole session goes, then what it left is reported below.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        err += "\n(timed out: something the bench started still held its output)"
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
    left = bench_traces() - before
    for trace in left:  # not left for the next test to trip on
        path = trace.removeprefix("mounted: ")
        subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)
    assert proc.returncode != 0 if status is None else proc.returncode == status, out + err
    assert left == set(), out + err
