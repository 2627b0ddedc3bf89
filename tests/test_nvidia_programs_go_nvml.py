"""go-nvml's own examples (github.com/NVIDIA/go-nvml/examples, the version scripts/go-tools.txt
pins), unmodified, against a mounted node's NVML: `devices` (each GPU's UUID and addressing mode),
`compute-processes` (a CUDA process made with our libcuda, its memory on its GPU, and on a MIG
device its GPU and compute instance) and `gpm-metrics` (GPM's graphics utilization between two
samples a second apart)."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from helpers_go import go_tool, node_env, node_info

pytestmark = pytest.mark.level("tools")

ALLOC = """
import sys, time
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
err, ctx = d.cuCtxCreate(None, 0, d.cuDeviceGet(0)[1])
assert err == 0, err
err, ptr = d.cuMemAlloc(int(sys.argv[1]))
assert err == 0, err
print("ready", flush=True)
time.sleep(60)
"""
GIB = 1 << 30
NONE = 0xFFFFFFFF  # no GPU or compute instance: a process on a whole GPU


def example(node, name: str, env: dict | None = None) -> str:
    r = subprocess.run([str(go_tool(name))], env=env or node_env(node), capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_devices(node_factory):
    node = node_factory("h100", gpus=4)
    out = example(node, "nvml-devices")
    uuids = re.findall(r"^uuid=(\S+)$", out, re.M)
    assert uuids == [node_info(node, i)["uuid"] for i in range(4)]
    # {version value}: NVML_DEVICE_ADDRESSING_MODE_HMM (1), as the H100 capture says (ATS, 2, is Grace's)
    assert re.findall(r"^mode=\{\S+ (\d+)\}$", out, re.M) == ["1"] * 4, out


def processes(out: str) -> dict[int, list[dict]]:
    """compute-processes' output: device index -> each process's ProcessInfo fields."""
    by_dev: dict[int, list[dict]] = {}
    dev = None
    for line in out.splitlines():
        if m := re.match(r"Found (\d+) processes on device (\d+)", line):
            dev = int(m.group(2))
            by_dev[dev] = []
        elif m := re.search(r"ProcessInfo: \{(.*)\}", line):
            by_dev[dev].append({k: int(v) for k, v in re.findall(r"(\w+):(\d+)", m.group(1))})
    return by_dev


def hold(node, size: int, visible: str) -> subprocess.Popen:
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    env = dict(node_env(node), CUDA_VISIBLE_DEVICES=visible)
    proc = subprocess.Popen([sys.executable, "-c", ALLOC, str(size)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def wait_listed(node, pid: int) -> dict[int, list[dict]]:
    deadline = time.monotonic() + 10
    while True:
        got = processes(example(node, "nvml-compute-processes"))
        if any(p["Pid"] == pid for procs in got.values() for p in procs) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_compute_processes_shows_a_cuda_process_on_its_gpu(node_factory):
    node = node_factory("h100", gpus=3)
    idle = processes(example(node, "nvml-compute-processes"))
    assert idle == {0: [], 1: [], 2: []}
    proc = hold(node, 3 * GIB, "1")
    try:
        got = wait_listed(node, proc.pid)
        assert got[0] == [] and got[2] == []
        assert got[1] == [{"Pid": proc.pid, "UsedGpuMemory": 3 * GIB,
                           "GpuInstanceId": NONE, "ComputeInstanceId": NONE}]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    deadline = time.monotonic() + 10
    while processes(example(node, "nvml-compute-processes"))[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes(example(node, "nvml-compute-processes"))[1] == []


def test_compute_processes_shows_a_mig_process_s_instance(node_factory):
    node = node_factory("h100", gpus=2)
    for args in (("enable",), ("create", "3g.40gb,1g.10gb")):
        assert node.cli("inject", "--root", str(node.mnt), "0", "mig", *args).returncode == 0
    gis = [line.split() for line in node.read("gpu0/mig").splitlines()]
    target = next(f for f in gis if f[:1] == ["ci"] and "1g.10gb" in f)
    gi = next(int(f[1]) for f in gis if f[:1] == ["gi"] and "1g.10gb" in f)
    proc = hold(node, GIB, target[target.index("uuid") + 1])
    try:
        got = wait_listed(node, proc.pid)
        assert got[0] == [{"Pid": proc.pid, "UsedGpuMemory": GIB, "GpuInstanceId": gi, "ComputeInstanceId": 0}]
        assert got[1] == []
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_gpm_metrics_follow_the_load(node_factory):
    node = node_factory("h100", gpus=2)
    assert node.write("gpu1/utilization", b"90 40\n") == 0
    out = example(node, "nvml-gpm-metrics")
    # "1: VALUE": metric 1, NVML_GPM_METRIC_GRAPHICS_UTIL, one line per GPU in index order
    values = [float(v) for v in re.findall(r"^1: (\S+)$", out, re.M)]
    assert values == [0.0, 90.0], out


def test_gpm_is_unsupported_before_hopper(node_factory):
    node = node_factory("a100", gpus=1)
    r = subprocess.run([str(go_tool("nvml-gpm-metrics"))], env=node_env(node), capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0 and "1: " not in r.stdout
    assert "GPM queries are not supported" in r.stderr
