"""What many test files need: a consumer's environment on a mounted node, a Python consumer in a
process of its own, waiting for a condition, a free loopback port, a process killed at the end."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time


def mount_env(node, from_mount: bool = True) -> dict[str, str]:
    """A consumer's environment on `node` (a MountedNode): its state, and the shims from the
    mount's driver root (or, for a test that stops the daemon, the built ones, which a stopped FUSE
    daemon cannot hold up). CUDA_VISIBLE_DEVICES of the caller is dropped."""
    from mokkafs.render import native

    env = dict(os.environ, MOKKA_STATE=str(node.state_dir / "state"))
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver/usr/lib64") if from_mount else str(native.nvml_library().parent)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_py(env, code: str, python: str = sys.executable, user: bool = False, timeout: float = 120) -> str:
    """`code` (dedented) in a process of its own; what it printed. `user`: as nobody (65534), from
    `/` (nobody may not enter the test's directory)."""
    pre = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if user else []
    r = subprocess.run([*pre, python, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd="/" if user else None)
    assert r.returncode == 0, r.stderr
    return r.stdout


def run_py_json(env, code: str, **kw) -> dict:
    """run_py, and what it printed read as JSON."""
    return json.loads(run_py(env, code, **kw))


def wait_for(predicate, timeout: float = 10.0):
    """The predicate's first true value, polled every 50 ms; its last value at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def wait_until(predicate, what: str, timeout: float = 15.0):
    """wait_for, failing with `what` at the timeout."""
    value = wait_for(predicate, timeout)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


@contextlib.contextmanager
def killed_at_end(proc: subprocess.Popen):
    """The process, killed (kill -9), reaped and its pipes closed when the block ends."""
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
