"""PyTorch with a CUDA build on our libcuda.so.1 (level: real consumers against a mounted node):
torch 2.14.1 from PyPI (CUDA 13, installed once by scripts/fetch_torch.sh into the cache) finds
an 8 x H100 node's GPUs, reports their properties and free memory, allocates memory that NVML and
nvidia-smi list under the process at once, raises its own OutOfMemoryError past free memory,
copies tensors to a GPU and back intact, and honours CUDA_VISIBLE_DEVICES."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import world_readable_node
from helpers import wait_for

pytestmark = pytest.mark.level("shims")

GIB = 1 << 30


def torch_dir() -> Path:
    d = Path(os.environ.get("MOKKA_CACHE", Path.home() / ".cache" / "mokkafs")) / "torch-2.14.1"
    if not (d / ".complete").is_file():
        pytest.skip(f"PyTorch is not in {d}: run scripts/fetch_torch.sh (scripts/test.sh does)")
    return d


@pytest.fixture(scope="module")
def node():
    yield from world_readable_node(gpus=8)


def torch_env(node, **extra) -> dict[str, str]:
    env = dict(os.environ, MOKKA_STATE=str(node.state_dir / "state"), PYTHONPATH=str(torch_dir()))
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver/usr/lib64")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


TORCH = """
import json, sys, torch
out = dict(available=torch.cuda.is_available(), count=torch.cuda.device_count(), props=[])
for i in range(out["count"]):
    p = torch.cuda.get_device_properties(i)
    out["props"].append(dict(name=p.name, total=p.total_memory, sms=p.multi_processor_count,
                             cc=[p.major, p.minor], uuid=str(p.uuid).replace("-", "")))
dev = out["count"] - 1
free, total = torch.cuda.mem_get_info(dev)
a = torch.arange(1 << 20, dtype=torch.float32)
out["roundtrip"] = bool(torch.equal(a.to(f"cuda:{dev}").cpu(), a))
held = torch.empty(1 << 30, dtype=torch.uint8, device=f"cuda:{dev}")
out.update(free=free, total=total)
print(json.dumps(out), flush=True)
sys.stdin.readline()
try:
    torch.empty(free, dtype=torch.uint8, device=f"cuda:{dev}")
    print(json.dumps(dict(oom=None)), flush=True)
except torch.cuda.OutOfMemoryError as e:
    print(json.dumps(dict(oom=str(e).splitlines()[0])), flush=True)
"""

NVML = """
import json, pynvml as p
p.nvmlInit()
print(json.dumps([dict(name=p.nvmlDeviceGetName(h), uuid=p.nvmlDeviceGetUUID(h), total=p.nvmlDeviceGetMemoryInfo(h).total,
                       procs=[[x.pid, x.usedGpuMemory] for x in p.nvmlDeviceGetComputeRunningProcesses(h)])
                  for h in (p.nvmlDeviceGetHandleByIndex(i) for i in range(p.nvmlDeviceGetCount()))]))
"""


def nvml(env) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", NVML], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("visible", [None, "6,2"])
def test_pytorch_finds_allocates_copies_and_runs_out_of_memory(node, visible):
    torch_dir()
    extra = {"CUDA_VISIBLE_DEVICES": visible} if visible else {}
    env = torch_env(node, **extra)
    facts = nvml(torch_env(node))
    gpus = [6, 2] if visible else list(range(8))
    proc = subprocess.Popen([sys.executable, "-c", TORCH], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        out = json.loads(line)
        assert out["available"] is True and out["count"] == len(gpus)
        from mokkafs.model.profiles import load_profile

        prof = load_profile("h100")
        assert out["props"] == [dict(name=facts[g]["name"], total=facts[g]["total"], sms=prof.sm_count, cc=[9, 0],
                                     uuid=facts[g]["uuid"].removeprefix("GPU-").replace("-", "")) for g in gpus]
        assert out["roundtrip"] is True and out["total"] == facts[gpus[-1]]["total"]
        # The process table folds a process's first context into the model at once, and what it
        # allocates after on the daemon's tick, which a loaded machine delays: wait for the tick.
        def listed_with_memory():
            listed = nvml(torch_env(node))[gpus[-1]]["procs"]
            return listed if len(listed) == 1 and listed[0][1] >= GIB else None

        listed = wait_for(listed_with_memory, timeout=15) or nvml(torch_env(node))[gpus[-1]]["procs"]
        assert len(listed) == 1 and listed[0][0] == proc.pid and listed[0][1] >= GIB
        smi = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "--query-compute-apps=pid,used_gpu_memory",
                              "--format=csv,noheader"], env=env, capture_output=True, text=True, timeout=30)
        assert f"{proc.pid}, " in smi.stdout
        proc.stdin.write("\n")
        proc.stdin.flush()
        second = json.loads(proc.stdout.readline())
        assert second["oom"] and "out of memory" in second["oom"].lower()
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


LAUNCH = """
import torch
try:
    y = (torch.ones(4, device="cuda:1") * 2).sum()
    torch.cuda.synchronize()
    print("ran")
except Exception as e:
    print(type(e).__name__, str(e).splitlines()[0])
"""


@pytest.mark.parametrize("refuse", [False, True])
def test_pytorch_kernels_do_nothing_or_fail_on_request(node, refuse):
    env = torch_env(node, **({"MOKKA_CUDA_LAUNCH": "fail"} if refuse else {}))
    r = subprocess.run([sys.executable, "-c", LAUNCH], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    if refuse:
        assert "CUDA error: operation not supported" in r.stdout
        assert "kernel launch of" in r.stderr and "MOKKA_CUDA_LAUNCH=fail" in r.stderr
    else:
        assert r.stdout.strip() == "ran"  # the launches complete; what they computed is undefined
