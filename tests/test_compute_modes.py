"""Compute modes enforced by libcuda.so.1 on a mounted node, with cuda-python processes: a
setting made through `mokka inject` or NVML's setter decides whether another process may take a
context (docs/cuda.md, "Compute modes")."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import mount_env, run_py

pytestmark = pytest.mark.level("shims")

UNAVAILABLE = [46, "CUDA_ERROR_DEVICE_UNAVAILABLE"]
OK = [0, "CUDA_SUCCESS"]

# One CUDA process driven line by line: "<op> <gpu>" in, "[code, name]" out.
DRIVER = """
import json, sys
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
made = []
for line in sys.stdin:
    op, gpu = line.split()
    dev = d.cuDeviceGet(int(gpu))[1]
    if op == "create":
        err, c = d.cuCtxCreate(None, 0, dev)
        if err == 0:
            made.append(c)
    elif op == "destroy":
        err, = d.cuCtxDestroy(made.pop())
    elif op == "retain":
        err, c = d.cuDevicePrimaryCtxRetain(dev)
    elif op == "release":
        err, = d.cuDevicePrimaryCtxRelease(dev)
    elif op == "alloc":  # into the current context
        err, p = d.cuMemAlloc(1 << 20)
    elif op == "mode":
        err, v = d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev)
        print(json.dumps([int(err), v]), flush=True)
        continue
    print(json.dumps([int(err), err.name]), flush=True)
"""


class Cuda:
    """A cuda-python process that holds what it was told to take until it is stopped."""

    def __init__(self, env):
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, op: str, gpu: int = 0) -> list:
        self.proc.stdin.write(f"{op} {gpu}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the CUDA process died on {op} {gpu}"
        return json.loads(line)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def cuda(node_factory):
    """A mounted 2-GPU node and a maker of CUDA processes on it, all stopped at the end."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    node = node_factory(gpus=2)
    env = mount_env(node)
    made: list[Cuda] = []

    def make() -> Cuda:
        made.append(Cuda(env))
        return made[-1]

    make.node, make.env = node, env
    yield make
    for p in made:
        p.stop(signal.SIGKILL)


def inject(node, gpu: int, mode: str) -> None:
    node.cli("inject", "--root", str(node.mnt), str(gpu), "compute_mode", mode)


@pytest.mark.parametrize("ending", ["destroy", "exit", "kill -9"])
def test_exclusive_process_lets_one_process_hold_the_gpu(cuda, ending):
    inject(cuda.node, 0, "exclusive_process")
    first, second = cuda(), cuda()
    assert first("mode") == [0, 3]
    assert first("create") == OK and first("retain") == OK and first("create") == OK  # one process, many contexts
    assert second("create") == UNAVAILABLE and second("retain") == UNAVAILABLE
    assert second("create", 1) == OK and second("alloc", 1) == OK  # GPU 1 is DEFAULT
    assert second("create") == UNAVAILABLE  # still, after failing once
    if ending == "destroy":
        assert first("destroy") == OK and first("release") == OK
        assert second("create") == UNAVAILABLE  # one context left
        assert first("destroy") == OK
    else:
        first.stop(signal.SIGKILL if ending == "kill -9" else signal.SIGTERM)
    assert second("create") == OK and second("retain") == OK
    third = cuda()
    assert third("retain") == UNAVAILABLE and third("create", 1) == OK
    if ending == "destroy":
        assert first("retain") == UNAVAILABLE  # the first one's turn is over


def test_prohibited_refuses_every_context_and_default_allows_many(cuda):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    set_mode = """
        import pynvml as n
        n.nvmlInit()
        n.nvmlDeviceSetComputeMode(n.nvmlDeviceGetHandleByIndex({gpu}), {mode})
    """
    run_py(cuda.env, set_mode.format(gpu=0, mode=2))  # NVML_COMPUTEMODE_PROHIBITED
    a, b = cuda(), cuda()
    assert a("mode") == [0, 2]
    assert a("create") == UNAVAILABLE and a("retain") == UNAVAILABLE and b("create") == UNAVAILABLE
    assert a("create", 1) == OK and a("retain", 1) == OK
    # Changed while contexts exist, a mode kills none of them; it only refuses new ones.
    run_py(cuda.env, set_mode.format(gpu=1, mode=2))
    assert a("alloc", 1) == OK
    assert a("create", 1) == UNAVAILABLE and b("retain", 1) == UNAVAILABLE
    assert a("retain", 1) == OK  # the primary context is active: nothing new is made
    run_py(cuda.env, set_mode.format(gpu=0, mode=0))
    assert [p("create") for p in (a, b, cuda())] == [OK] * 3
    assert [p("retain") for p in (a, b)] == [OK] * 2


def test_a_context_from_before_exclusive_mode_keeps_others_out(cuda):
    a, b = cuda(), cuda()
    assert a("create") == OK and b("create") == OK  # DEFAULT: many processes
    inject(cuda.node, 0, "exclusive_process")
    c = cuda()
    assert c("create") == UNAVAILABLE  # the GPU is busy, as on a real board
    assert a("create") == OK  # a holder may make more
    assert a("destroy") == OK and a("destroy") == OK
    assert c("create") == UNAVAILABLE  # b still holds one
    b.stop(signal.SIGKILL)
    assert c("create") == OK and a("create") == UNAVAILABLE
    inject(cuda.node, 0, "default")
    assert a("create") == OK


def test_processes_racing_for_an_exclusive_gpu_get_it_once(cuda):
    inject(cuda.node, 0, "exclusive_process")
    racers = [cuda() for _ in range(6)]
    for p in racers:  # all asked before any answer is read
        p.proc.stdin.write("retain 0\n")
        p.proc.stdin.flush()
    answers = [json.loads(p.proc.stdout.readline()) for p in racers]
    assert sorted(answers) == [OK] + [UNAVAILABLE] * 5


def test_a_holder_keeps_the_gpu_across_a_daemon_restart_and_a_fifo_lock_does_not_hang(node_factory):
    """kill -9 the daemon under an exclusive holder and mount again: the lock file is kept, not
    replaced, so the holder still keeps everyone out. A lock file that root replaced with a FIFO
    arbitrates nothing, and never hangs a context creation."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    from test_cuda import cuda_lib

    node = node_factory(gpus=2)
    node.expect_warning("clearing stale mount")
    env = dict(mount_env(node), LD_LIBRARY_PATH=str(cuda_lib().parent))  # off the mount, which restarts
    inject(node, 0, "exclusive_process")
    holder, other = Cuda(env), Cuda(env)
    try:
        assert holder("create") == OK
        node.kill9()
        node.mount()
        assert other("mode") == [0, 3]  # the setting survived the restart
        assert other("create") == UNAVAILABLE
        holder.stop(signal.SIGKILL)
        assert other("create") == OK
        inject(node, 1, "exclusive_process")
        lock1 = node.state_dir / "state.procs.lock1"
        lock1.unlink()
        os.mkfifo(lock1)
        third = Cuda(env)
        try:
            assert other("create", 1) == OK and third("create", 1) == OK  # unarbitrated (docs/cuda.md)
        finally:
            third.stop(signal.SIGKILL)
    finally:
        holder.stop(signal.SIGKILL)
        other.stop(signal.SIGKILL)
