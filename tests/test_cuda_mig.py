"""CUDA on MIG (docs/mig.md, "CUDA").
libcuda.so.1 enumerates MIG devices as the driver does, honours CUDA_VISIBLE_DEVICES=MIG-<uuid>
(and the MIG-GPU-<uuid>/gi/ci form of drivers before R470), reports the slice's name, UUID, memory
and SMs, and accounts allocations to the instance, so the process is listed on it. Consumers:
cuda-python, numba, pynvml."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import killed_at_end, mount_env, run_py, wait_for

pytestmark = pytest.mark.level("shims")

LAYOUT = "3g.40gb,2g.20gb,1g.10gb,1g.10gb"
GIB = 1 << 30

DEVICES = """
import json
from cuda.bindings import driver as d
err = d.cuInit(0)[0]
out = dict(init=int(err), devs=[])
if err == 0:
    A = d.CUdevice_attribute
    for i in range(d.cuDeviceGetCount()[1]):
        dev = d.cuDeviceGet(i)[1]
        out["devs"].append(dict(
            name=d.cuDeviceGetName(96, dev)[1].split(b"\\0")[0].decode(),
            uuid=bytes(d.cuDeviceGetUuid(dev)[1].bytes).hex(),
            sms=d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)[1],
            mem=d.cuDeviceTotalMem(dev)[1]))
print(json.dumps(out))
"""

ALLOC_1G = """
import sys, time
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
err, ctx = d.cuCtxCreate(None, 0, d.cuDeviceGet(0)[1])
assert err == 0, err
err, ptr = d.cuMemAlloc(1 << 30)
assert err == 0, err
err, free, total = d.cuMemGetInfo()
print(free, total, flush=True)
time.sleep(60)
"""


def mig_devices(node, gpu: int) -> list[dict]:
    """`gpuN/mig`'s compute instances: gi, ci, sm, uuid, name."""
    out = []
    for line in node.read(f"gpu{gpu}/mig").splitlines():
        if line.startswith("  ci "):
            w = line.split()
            gi = out_gi
            out.append(dict(gi=gi, ci=int(w[1]), sm=int(w[w.index("sm") + 1]), uuid=w[w.index("uuid") + 1],
                            name=line.split(" name ", 1)[1]))
        elif line.startswith("gi "):
            w = line.split()
            out_gi = int(w[1])
            mem = int(w[w.index("memory_mib") + 1])
        if out and "mem" not in out[-1]:
            out[-1]["mem"] = mem << 20
    return out


@pytest.fixture
def mig_node(node_factory):
    """An h100 x 2 node with GPU 1 partitioned as the issue asks."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    node = node_factory(gpus=2)
    for args in (("mig", "enable"), ("mig", "create", LAYOUT)):
        assert node.cli("inject", "--root", str(node.mnt), "1", *args).returncode == 0
    return node


def devices(node, visible: str | None) -> dict:
    env = mount_env(node)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return json.loads(run_py(env, DEVICES))


def test_a_mig_uuid_is_one_device_with_the_slice_s_name_uuid_memory_and_sms(mig_node):
    migs = mig_devices(mig_node, 1)
    assert [(m["gi"], m["ci"]) for m in migs] == [(2, 0), (3, 0), (9, 0), (10, 0)]
    for m in (migs[0], migs[2]):
        got = devices(mig_node, m["uuid"])
        assert got["devs"] == [dict(name=m["name"], uuid=m["uuid"][4:].replace("-", ""), sms=m["sm"], mem=m["mem"])]
    assert migs[2]["name"] == "NVIDIA H100 80GB HBM3 MIG 1g.10gb" and migs[2]["mem"] < 11 * GIB
    # a unique prefix names it too, as a GPU UUID's does; and the form of drivers before R470
    gpu_uuid = next(line.split(":", 1)[1].strip() for line in mig_node.read("gpu1/info").splitlines()
                    if line.startswith("uuid"))
    assert devices(mig_node, migs[1]["uuid"][:12])["devs"][0]["name"] == migs[1]["name"]
    assert devices(mig_node, f"MIG-{gpu_uuid}/9/0")["devs"][0]["uuid"] == migs[2]["uuid"][4:].replace("-", "")


def test_enumeration_shows_one_mig_device_and_no_parent(mig_node):
    migs = mig_devices(mig_node, 1)
    whole = devices(mig_node, "0")["devs"][0]
    first = dict(name=migs[0]["name"], uuid=migs[0]["uuid"][4:].replace("-", ""), sms=migs[0]["sm"], mem=migs[0]["mem"])
    # unset: GPU 0 whole, then GPU 1's first MIG device (CUDA uses a single MIG device)
    assert devices(mig_node, None)["devs"] == [whole, first]
    assert devices(mig_node, "1")["devs"] == [first]
    # a second MIG device is left out; a name that matches nothing ends the list
    assert devices(mig_node, f"{migs[3]['uuid']},{migs[0]['uuid']},0")["devs"][0]["uuid"] == \
        migs[3]["uuid"][4:].replace("-", "")
    assert len(devices(mig_node, f"{migs[3]['uuid']},{migs[0]['uuid']},0")["devs"]) == 2
    assert devices(mig_node, "MIG-ffffffff,0")["init"] == 100  # CUDA_ERROR_NO_DEVICE


def test_a_mig_gpu_without_instances_is_no_device(node_factory):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    node = node_factory(gpus=2)
    assert node.cli("inject", "--root", str(node.mnt), "1", "mig", "enable").returncode == 0
    assert devices(node, "1")["init"] == 100
    assert len(devices(node, None)["devs"]) == 1


def test_an_allocation_on_a_mig_device_is_accounted_to_its_instance(mig_node):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    migs = mig_devices(mig_node, 1)
    target = migs[2]  # gi 9, a 1g.10gb
    env = dict(mount_env(mig_node), CUDA_VISIBLE_DEVICES=target["uuid"])
    proc = subprocess.Popen([sys.executable, "-c", ALLOC_1G], env=env, stdout=subprocess.PIPE, text=True)
    with killed_at_end(proc):
        free, total = map(int, proc.stdout.readline().split())
        assert (free, total) == (target["mem"] - GIB, target["mem"])

        shown = wait_for(lambda: proc.pid in mig_processes(mig_node) and mig_processes(mig_node))
        assert shown[proc.pid] == (9, 0, GIB)
        # NVML lists it on the parent, and the GPU instance's memory used counts it
        assert nvml_parent_procs(env, 1) == [[proc.pid, GIB]]
        # (over each instance's idle bytes: 9 MiB on a 1g, 26 on a 3g; docs/mig.md)
        assert mig_gi_used(mig_node, 9) == GIB + (9 << 20) and mig_gi_used(mig_node, 2) == 26 << 20
        # and nvidia-smi's processes table shows it on that instance: GPU 1, GI 9, CI 0, 1024MiB
        smi = subprocess.run([str(mig_node.mnt / "driver/usr/bin/nvidia-smi")], env=env, capture_output=True,
                             text=True, timeout=60)
        assert smi.returncode == 0, smi.stderr
        row = next(line for line in smi.stdout.splitlines() if f" {proc.pid} " in line)
        assert row.split()[1:4] == ["1", "9", "0"] and "1024MiB" in row, smi.stdout
    assert wait_for(lambda: proc.pid not in mig_processes(mig_node))


def mig_processes(node) -> dict[int, tuple[int, int, int]]:
    """pid -> (gi, ci, bytes) from the shared state, as NVML and nvidia-smi read it."""
    from mokkafs.daemon.shm.layout import ffi

    data = bytearray((node.state_dir / "state").read_bytes())
    s = ffi.from_buffer("struct mokka_state *", data)
    g = s.gpus[1]
    return {g.processes[k].pid: (g.processes[k].mig_gi, g.processes[k].mig_ci, g.processes[k].used_memory)
            for k in range(g.process_count)}


def mig_gi_used(node, gi_id: int) -> int:
    from mokkafs.daemon.shm.layout import ffi

    data = bytearray((node.state_dir / "state").read_bytes())
    g = ffi.from_buffer("struct mokka_state *", data).gpus[1]
    return next(g.mig_gi[k].memory_used for k in range(g.mig_gi_count) if g.mig_gi[k].id == gi_id)


def test_numba_sees_the_mig_device_and_its_memory(mig_node):
    pytest.importorskip("numba.cuda", reason="numba-cuda is in the test extra")
    target = mig_devices(mig_node, 1)[1]
    env = dict(mount_env(mig_node), CUDA_VISIBLE_DEVICES=target["uuid"])
    out = json.loads(run_py(env, """
        import json
        from numba import cuda
        gpus = list(cuda.gpus)
        with gpus[0]:
            free, total = cuda.current_context().get_memory_info()
        name = gpus[0].name
        print(json.dumps([len(gpus), name.decode() if isinstance(name, bytes) else name, free, total]))
    """, timeout=300))
    assert out == [1, target["name"], target["mem"], target["mem"]]


def nvml_parent_procs(env, gpu: int) -> list:
    return json.loads(run_py(env, f"""
        import json, pynvml as p
        p.nvmlInit()
        h = p.nvmlDeviceGetHandleByIndex({gpu})
        print(json.dumps([[x.pid, x.usedGpuMemory] for x in p.nvmlDeviceGetComputeRunningProcesses(h)]))
    """))


MEMINFO = """
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
err, ctx = d.cuCtxCreate(None, 0, d.cuDeviceGet(0)[1])
assert err == 0, err
err, free, total = d.cuMemGetInfo()
print(free, total)
"""


def test_what_counts_against_a_mig_process_is_its_own_instance_s(mig_node):
    """The same user's 1 GiB on GPU instance 7 leaves 1 GiB less on 7 and nothing less on 8, whose
    memory is its own."""
    migs = mig_devices(mig_node, 1)
    env = mount_env(mig_node)
    holder = subprocess.Popen([sys.executable, "-c", ALLOC_1G], env=dict(env, CUDA_VISIBLE_DEVICES=migs[2]["uuid"]),
                              stdout=subprocess.PIPE, text=True)
    with killed_at_end(holder):
        holder.stdout.readline()
        assert wait_for(lambda: holder.pid in mig_processes(mig_node))
        same = run_py(dict(env, CUDA_VISIBLE_DEVICES=migs[2]["uuid"]), MEMINFO).split()
        other = run_py(dict(env, CUDA_VISIBLE_DEVICES=migs[3]["uuid"]), MEMINFO).split()
        assert [int(x) for x in same] == [migs[2]["mem"] - GIB, migs[2]["mem"]]
        assert [int(x) for x in other] == [migs[3]["mem"], migs[3]["mem"]]
