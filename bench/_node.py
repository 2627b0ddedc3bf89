"""Mount a node for a benchmark, through the real CLI, and take it down again.

Every bench leaves the machine as it found it: a node's directories (its mount point under the
temporary directory, its state directory under /dev/shm, each named `mokka-bench-*`) are removed
when it is taken down, and every node still up when the process ends (an exception, Ctrl-C,
SIGTERM, SIGHUP) is unmounted, its daemon stopped and its directories removed, by `cleanup_all`
at exit. `report()` hands a figure to bench/run_all.py beside its floor and target."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PREFIX = "mokka-bench-"
# 64 GPUs, the most a node holds (MAX_GPUS, mokkafs/model/state_limits.py), as H100s: an HGX
# H100 baseboard (profile h100) sits 8 to a node (its max_gpus_per_node), so the CLI refuses
# `--profile h100 --gpus 64`; the PCIe H100 NVL has no such limit and takes 64.
WIDE_PROFILE, WIDE_GPUS = "h100-nvl", 64
SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None
_LIVE: list["BenchNode"] = []


def shm_dir(prefix: str = PREFIX) -> Path:
    """A fresh directory on the tmpfs (/dev/shm where there is one), named `mokka-bench-*`."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SHM))


def mounted_under(path: Path) -> list[str]:
    """Mount points at or below `path`, from /proc/self/mountinfo."""
    base = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == base or point.startswith(base + "/"):
                out.append(point)
    return out


def force_unmount(path: Path) -> None:
    """Detach whatever is still mounted at or below `path` (lazily: a busy FUSE mount too)."""
    for point in sorted(mounted_under(path), key=len, reverse=True):
        if subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True)


def stop_process(pid: int | None, timeout: float = 5.0) -> None:
    """SIGTERM `pid`, then SIGKILL it if it is still there after `timeout` seconds."""
    if not pid:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 1.0)):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


def pids_running_in(path: Path) -> list[int]:
    """Processes (other than this one) whose command line names a path under `path`: a node's
    daemon is a fork of `mokka mount DIR --state-dir DIR`, whose argv it keeps, so this finds it
    even where the mount was interrupted before it wrote its pid file."""
    needle = os.path.join(str(path), "").encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except OSError:
            pass
    return out


class BenchNode:
    def __init__(self, profile: str = "h100", gpus: int = 8) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.mnt = self.tmp / "mnt"
        # The state directory on a tmpfs, as the daemon's default (/run/mokka) is: a busy disk
        # under the per-event persistence would be measured otherwise.
        self.state_base = shm_dir(PREFIX + "state-")
        self.state = self.state_base / "state"
        self.env = dict(os.environ, MOKKA_RUNTIME_DIR=str(self.tmp / "run"))
        self.profile, self.gpus = profile, gpus
        self.daemon_pid: int | None = None
        _LIVE.append(self)

    def mount_args(self) -> list[str]:
        return []

    def mount(self) -> float:
        """Mount; return seconds from the command's start to the tree answering."""
        t0 = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "mokkafs.cli", "mount", str(self.mnt), "--profile", self.profile,
             "--gpus", str(self.gpus), "--state-dir", str(self.state), *self.mount_args()],
            env=self.env, capture_output=True, text=True,
        )
        if r.returncode:
            self.close()
            raise RuntimeError(f"mokka mount --profile {self.profile} --gpus {self.gpus} refused "
                               f"(exit {r.returncode}): {(r.stderr or r.stdout).strip()}")
        (self.mnt / "node" / "gpu_count").read_text()
        elapsed = time.perf_counter() - t0
        try:
            self.daemon_pid = self.pid()
        except (OSError, ValueError):
            pass
        return elapsed

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
        """Take the node down and remove its directories (the node is done: mount a new one)."""
        self.close()

    def close(self) -> None:
        """Unmount (through the CLI, then by force), stop the daemon if it outlived its mount,
        remove the mount point's and the state's directories. Safe to call twice."""
        if self in _LIVE:
            _LIVE.remove(self)
        if mounted_under(self.mnt):
            try:
                subprocess.run([sys.executable, "-m", "mokkafs.cli", "umount", str(self.mnt)], env=self.env,
                               capture_output=True, timeout=60)
            except subprocess.TimeoutExpired:
                pass  # stopped and detached by force below
        for pid in {self.daemon_pid, *pids_running_in(self.tmp)} - {None}:
            stop_process(pid)
        self.daemon_pid = None
        force_unmount(self.tmp)
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.state_base, ignore_errors=True)

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
        self.close()


class FloorFs:
    """bench/_floor_fs.py, the floor under any pyfuse3 file system, mounted on a fresh
    mokka-bench-floor-* directory: `with FloorFs() as mnt:` reads of mnt/temperature are served.
    Its output goes to /dev/null: were it to outlive its bench, it would hold none of the
    caller's pipes. Its clean-up (unmount, stop, detach what is left, remove the directory)
    holds SIGINT, SIGTERM and SIGHUP until done: a floor lives a fraction of a second, and an
    interrupt that cut the clean-up short would leave it running and mounted."""

    def __init__(self) -> None:
        self.mnt: Path | None = None
        self.daemon: subprocess.Popen | None = None

    def __enter__(self) -> Path:
        try:
            self.mnt = Path(tempfile.mkdtemp(prefix=PREFIX + "floor-"))
            r, w = os.pipe()
            self.daemon = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("_floor_fs.py")), str(self.mnt), str(w)],
                pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.close(w)
            with os.fdopen(r, "rb") as pipe:
                if pipe.read(6) != b"ready\n":
                    raise RuntimeError("the floor file system did not start")
        except BaseException:
            self.__exit__()
            raise
        return self.mnt

    def __exit__(self, *exc) -> None:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            if self.mnt is None:
                return
            subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
            if self.daemon is not None:
                try:
                    self.daemon.wait(10)
                except subprocess.TimeoutExpired:
                    self.daemon.kill()
                    self.daemon.wait()
            force_unmount(self.mnt)
            os.rmdir(self.mnt)
            self.mnt = None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


class BusyLoad:
    """`n` processes that only burn CPU, beside a measurement whose target names a load (the
    issue's "at load 4": on a machine with few CPUs the load average is mostly the bench's own).
    A context manager; the processes end with it, and with this process however it ends (they
    stay in its process group, which run_all.py and the tests signal whole)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "BusyLoad":
        for _ in range(self.n):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", "while True: pass"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        _BUSY.extend(self.procs)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
            _BUSY.remove(p)


_BUSY: list[subprocess.Popen] = []


def loadavg() -> str:
    """The 1-minute load average."""
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def runnable() -> int:
    """Tasks running or waiting for a CPU right now (the instant the load average averages)."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


def cleanup_all() -> None:
    """Take down every node this process still has (at exit, however it exits)."""
    if os.getpid() != _OWNER:  # a forked worker (multiprocessing) does not own the nodes
        return
    for p in list(_BUSY):
        p.kill()
    for node in list(reversed(_LIVE)):
        try:
            node.close()
        except Exception as e:  # noqa: BLE001 - keep cleaning the others
            print(f"cleanup of {node.mnt}: {e}", file=sys.stderr)


def _exit_on_signal(signum, frame) -> None:
    # Unwind through every finally and with block, then atexit: the same path as Ctrl-C.
    raise SystemExit(128 + signum)


_OWNER = os.getpid()
atexit.register(cleanup_all)
if threading.current_thread() is threading.main_thread():
    for _sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(_sig) in (signal.SIG_DFL, None):
            signal.signal(_sig, _exit_on_signal)


def report(figure: str, value: float, unit: str, *, floor: float | None = None, target: float | None = None,
           floor_is: str = "", note: str = "") -> None:
    """Hand one figure to bench/run_all.py (a JSON line appended to $MOKKA_BENCH_RESULTS; nothing
    when run alone): the measured value, its floor measured in the same run (what the same work
    costs without mokkafs, named by `floor_is`) and its target, all in `unit`."""
    path = os.environ.get("MOKKA_BENCH_RESULTS")
    if not path:
        return
    row = {"bench": Path(sys.argv[0]).stem, "figure": figure, "value": value, "unit": unit, "floor": floor,
           "floor_is": floor_is, "target": target, "note": note}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


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


def run_c_bench(name: str, cc_flags: list[str], run_args, header: str | None = None, parse=None) -> int:
    """The shape every C benchmark shares: parse --profile/--gpus, build bench/<name>.c with
    `cc_flags`, mount a node, print a header line, and run the binary with `run_args(node)`
    (the node's state file in MOKKA_STATE); `parse(line)` sees each line it prints (to `report`)."""
    import argparse

    main = sys.modules["__main__"]
    ap = argparse.ArgumentParser(description=(main.__doc__ or name).splitlines()[0])
    ap.add_argument("--profile", default="h100")
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    bench = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{name}-") as tmp:
        exe = Path(tmp) / name
        subprocess.run(["cc", "-O2", str(bench / f"{name}.c"), "-o", str(exe), *cc_flags], check=True)
        with BenchNode(args.profile, args.gpus) as node:
            settled = node.settle()
            load = os.getloadavg()[0]
            print(f"# {args.gpus} x {args.profile}, {os.cpu_count()} CPUs, load {load:.2f}, "
                  f"measured after start-up ({settled:.2f} s)")
            if header:
                print(header, flush=True)
            r = subprocess.run([str(exe), *run_args(node)], stdout=subprocess.PIPE, text=True,
                               env=dict(node.env, MOKKA_STATE=str(node.state / "state")))
            for line in r.stdout.splitlines():
                print(line, flush=True)
                if parse:
                    parse(line)
            if r.returncode:
                raise SystemExit(f"{name}: exit {r.returncode}")
    return 0
