"""Shared test machinery: a real mount in a subprocess, log discipline, and CI's no-skip rule."""
from __future__ import annotations

import errno
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI") == "true"


# --- in CI a skip is a failure (a skip names what is missing) ---------------------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped in CI, which must run everything: {reason}"


# --- tests in named levels ------------------------------------------------------------------------
#
# Each test file says its level with `pytestmark = pytest.mark.level("...")`; a test of another
# level inside it says its own. `pytest --level model,render` runs those levels alone (the inner
# loop: no mount, no subprocess of ours, well under a minute). A file without a level, or a fast
# level's test that mounts a node, stops the run with a message saying which.

LEVELS = {
    "model": "the pure model: profiles, events, state, readings, commands, MIG and scenario rules",
    "render": "the pure renderers: sysfs, procfs, /dev, control files, /metrics text, render digests",
    "daemon": "the daemon's operations in-process, in virtual time where time matters, no FUSE mount",
    "mount": "a real FUSE mount driven through the real CLI",
    "shims": "the native shims, loaded by real consumers (pynvml, cuda-python, our nvidia-smi)",
    "tools": "real tools on the node: NVIDIA's nvidia-smi, lspci, ibstat, NVIDIA's Go programs",
    "cross": "one fact, every surface: the cross-surface probe",
    "deploy": "deployment: the agent, kustomize, the unit and the images",
    "cluster": "a real Kubernetes from parts (scripts/cluster.py): API server, kubelet, containerd, pods",
}
FAST_LEVELS = ("model", "render")
_running_level: str | None = None


def pytest_configure(config):
    config.addinivalue_line("markers", "level(name): the test's level, one of " + ", ".join(LEVELS))


def pytest_addoption(parser):
    parser.addoption("--level", default="", help="run only these levels (comma-separated): " + ", ".join(LEVELS))


def _level(item) -> str | None:
    marker = item.get_closest_marker("level")
    return marker.args[0] if marker and marker.args else None


def pytest_collection_modifyitems(config, items):
    bad = sorted({item.nodeid.split("::")[0] for item in items if _level(item) not in LEVELS})
    if bad:
        raise pytest.UsageError(f"test files without a level (pytestmark = pytest.mark.level(...), one of "
                                f"{', '.join(LEVELS)}): {', '.join(bad)}")
    wanted = [w for w in config.getoption("--level").split(",") if w]
    unknown = [w for w in wanted if w not in LEVELS]
    if unknown:
        raise pytest.UsageError(f"--level: unknown level(s) {unknown}; the levels are {', '.join(LEVELS)}")
    if wanted:
        keep = [item for item in items if _level(item) in wanted]
        config.hook.pytest_deselected(items=[item for item in items if _level(item) not in wanted])
        items[:] = keep


_FILE_LEVEL = re.compile(r'^pytestmark = pytest\.mark\.level\("(\w+)"\)', re.M)
_TEST_LEVEL = re.compile(r'^@pytest\.mark\.level\("(\w+)"\)', re.M)


def pytest_ignore_collect(collection_path, config):
    """With --level, a file none of whose tests is of those levels is not even imported, so the
    inner loop does not pay for the whole suite's collection."""
    wanted = {w for w in config.getoption("--level").split(",") if w}
    if not wanted or not collection_path.name.startswith("test_") or collection_path.suffix != ".py":
        return None
    text = collection_path.read_text()
    levels = set(_FILE_LEVEL.findall(text)) | set(_TEST_LEVEL.findall(text))
    return True if levels and not levels & wanted else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    global _running_level
    _running_level = _level(item)


def _no_mount_at_a_fast_level() -> None:
    if _running_level in FAST_LEVELS:
        pytest.fail(f"a test of level {_running_level!r} mounts a node: mark it pytest.mark.level(\"mount\") "
                    f"(or the level it is), so `--level {','.join(FAST_LEVELS)}` stays fast", pytrace=False)


# --- a test that logs an unexpected warning fails (s3ql's pytest_checklogs) -------------------


class _LogCheck(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.expected: list[re.Pattern] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def unexpected(self) -> list[str]:
        out = []
        for r in self.records:
            msg = r.getMessage()
            if not any(p.search(msg) for p in self.expected):
                out.append(f"{r.levelname} {r.name}: {msg}")
        return out


@pytest.fixture(autouse=True)
def _check_logs():
    handler = _LogCheck()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)
    bad = handler.unexpected()
    if bad:
        pytest.fail("unexpected warnings logged:\n  " + "\n  ".join(bad))


@pytest.fixture
def expect_log(_check_logs):
    """`expect_log(r"regex")` declares a warning this test is meant to cause."""

    def expect(pattern: str) -> None:
        _check_logs.expected.append(re.compile(pattern))

    return expect


# --- a real mount, driven through the real CLI -------------------------------------------------


def mokka_cmd() -> list[str]:
    return [sys.executable, "-m", "mokkafs.cli"]


class MountedNode:
    """A mokkafs daemon started with `mokka mount` (a real subprocess and a real FUSE mount)."""

    def __init__(self, tmp: Path, profile: str = "h100", gpus: int | None = None, name: str = "mnt") -> None:
        self.mnt = tmp / name
        self.state_dir = tmp / f"{name}-state"
        self.profile = profile
        self.gpus = gpus
        self.expected_warnings: list[re.Pattern] = [re.compile(r"signal \d+: unmounting")]
        self.env = dict(os.environ, MOKKA_RUNTIME_DIR=str(tmp / "run"))

    def cli(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*mokka_cmd(), *args], capture_output=True, text=True, env=self.env, timeout=timeout, check=check
        )

    def mount(self, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        _no_mount_at_a_fast_level()
        args = ["mount", str(self.mnt), "--profile", self.profile, "--state-dir", str(self.state_dir)]
        if self.gpus is not None:
            args += ["--gpus", str(self.gpus)]
        return self.cli(*args, *extra)

    def umount(self) -> None:
        self.cli("umount", str(self.mnt), check=False)

    def path(self, rel: str) -> Path:
        return self.mnt / rel

    def read(self, rel: str) -> str:
        return self.path(rel).read_text()

    def write(self, rel: str, data: bytes) -> int:
        """One write() to a control file, as `echo` does it; returns 0 or the errno."""
        fd = os.open(self.path(rel), os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
            return 0
        except OSError as e:
            return e.errno
        finally:
            os.close(fd)

    def expect_warning(self, pattern: str) -> None:
        self.expected_warnings.append(re.compile(pattern))

    def daemon_pid(self) -> int:
        name = os.path.realpath(self.mnt).strip("/").replace("/", "_")
        return int((Path(self.env["MOKKA_RUNTIME_DIR"]) / f"{name}.pid").read_text())

    def kill9(self) -> None:
        pid = self.daemon_pid()
        os.kill(pid, signal.SIGKILL)
        from mokkafs.cli.main import _alive

        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def unexpected_log_lines(self) -> list[str]:
        log = self.state_dir / "daemon.log"
        if not log.exists():
            return []
        bad = []
        for line in log.read_text().splitlines():
            if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                if not any(p.search(line) for p in self.expected_warnings):
                    bad.append(line)
        return bad


def force_unmount(mnt: Path) -> None:
    try:
        os.statvfs(mnt)  # never cached: a dead daemon's mount answers ENOTCONN at once
    except OSError as e:
        if e.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
            return
    subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def world_readable_node(profile: str = "h100", gpus: int = 2, extra: tuple[str, ...] = (),
                        runtime_dir: bool = False):
    """A mounted node under a directory every user may enter (pytest's tmp_path is 0700), for
    tests that act as another user or outlive one test (module fixtures): yields the node once,
    unmounts it and fails on unexpected log lines after. `extra`: more `mokka mount` arguments;
    `runtime_dir`: the node's own MOKKA_RUNTIME_DIR under that directory."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mokka-"))
    base.chmod(0o755)
    node = MountedNode(base, profile, gpus)
    if runtime_dir:
        node.env["MOKKA_RUNTIME_DIR"] = str(base / "run")
    node.mount(extra)
    try:
        yield node
    finally:
        node.umount()
        force_unmount(node.mnt)
        problems = node.unexpected_log_lines()
        shutil.rmtree(base, ignore_errors=True)
        assert not problems, problems


@pytest.fixture
def node_factory(tmp_path):
    nodes: list[MountedNode] = []

    def make(profile: str = "h100", gpus: int | None = None, name: str = "mnt", mount: bool = True) -> MountedNode:
        node = MountedNode(tmp_path, profile, gpus, name)
        nodes.append(node)
        if mount:
            node.mount()
        return node

    yield make
    problems = []
    for node in nodes:
        node.umount()
        force_unmount(node.mnt)
        problems += node.unexpected_log_lines()
    if problems:
        pytest.fail("daemon logged unexpected warnings:\n  " + "\n  ".join(problems))


@pytest.fixture
def mounted(node_factory) -> MountedNode:
    """A mounted 8 x H100 node."""
    return node_factory()


# --- a published state with its process table, no mount (test_cuda, test_proctable) -----------


class _Service:
    """The table's descriptor service (ProcessTable.serve) in a thread of its own, as the
    daemon runs it in its trio loop, so that CUDA processes of a test find the table."""

    def __init__(self, table, controller=None) -> None:
        import threading

        import trio

        ready = threading.Event()

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(table.serve, controller)
                    ready.set()
                    await trio.sleep_forever()

        self.thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the descriptor service did not start"

    def stop(self) -> None:
        import trio

        trio.from_thread.run_sync(self.scope.cancel, trio_token=self.token)
        self.thread.join(10)


class ServedInThread:
    """`serve(task_status=...)`, an async service of the daemon's (ControlSocket.serve, say), in
    a trio loop of its own thread, as the daemon runs it in its loop; `stop()` ends it."""

    def __init__(self, serve) -> None:
        import threading

        import trio

        ready = threading.Event()

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve)
                    ready.set()
                    await trio.sleep_forever()

        self.thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
        self.thread.start()
        assert ready.wait(10), "the service did not start"

    def stop(self) -> None:
        import trio

        trio.from_thread.run_sync(self.scope.cancel, trio_token=self.token)
        self.thread.join(10)


@pytest.fixture
def nvml():
    """The built libnvidia-ml loaded into this process (ctypes), shut down as often as the test
    initialised it."""
    from helpers_nvml import SUCCESS, Nvml

    lib = Nvml()
    yield lib
    while lib.nvmlShutdown() == SUCCESS:
        pass


@pytest.fixture
def pub(tmp_path):
    """An h100 x 4 node's state published at tmp_path/state, and the daemon's process table
    with its descriptor service."""
    from helpers_nvml import Published
    from mokkafs.daemon.shm.proctable import ProcessTable, procs_path

    from mokkafs.daemon.controller import Controller

    p = Published(tmp_path, "h100", 4)
    p.table = ProcessTable(procs_path(p.path))
    p.table.open()
    p.controller = Controller(p.node, None, time.time)  # a process's first context folds at once
    p.controller.subscribers.append(p.publisher)
    service = _Service(p.table, p.controller)
    yield p
    service.stop()
    p.table.close()
    p.close()
