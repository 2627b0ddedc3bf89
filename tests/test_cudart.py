"""The CUDA runtime on our libcuda.so.1 (level: real consumers against a mounted node): NVIDIA's
libcudart 12 and 13 from PyPI (shared, and linked statically into the project's own deviceQuery,
tests/fixtures/cudart_query.c), through ctypes and CuPy, see the node's GPUs as NVML does,
allocate, copy and free with the memory accounted to the process, and launch nothing."""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import world_readable_node

pytestmark = pytest.mark.level("shims")

GIB, MIB = 1 << 30, 1 << 20
FIXTURE = Path(__file__).parent / "fixtures" / "cudart_query.c"
# The wheels (the test extra pins them): where each runtime's library and headers are.
RUNTIMES = {"12": ("cuda_runtime", "libcudart.so.12"), "13": ("cu13", "libcudart.so.13")}


def nvidia_dir() -> Path:
    try:
        import nvidia
    except ImportError:
        pytest.skip("the nvidia-cuda-runtime wheels are in the test extra")
    for base in nvidia.__path__:
        if (Path(base) / "cu13").is_dir():
            return Path(base)
    pytest.skip("nvidia-cuda-runtime (13) is in the test extra")


def runtime(version: str) -> tuple[Path, Path]:
    """(include dir, libcudart path) of the runtime wheel of that major version."""
    sub, lib = RUNTIMES[version]
    root = nvidia_dir() / sub
    if not (root / "lib" / lib).is_file():
        pytest.skip(f"{lib} missing: nvidia-cuda-runtime{'-cu12' if version == '12' else ''} is in the test extra")
    return root / "include", root / "lib" / lib


@pytest.fixture(scope="module")
def node():
    """An 8 x H100 node, mounted once for the module."""
    yield from world_readable_node(gpus=8)


def node_env(node, **extra) -> dict[str, str]:
    env = dict(os.environ, MOKKA_STATE=str(node.state_dir / "state"))
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver/usr/lib64")  # the node's served libcuda.so.1
    for k in ("CUDA_VISIBLE_DEVICES", "MOKKA_CUDA_LAUNCH", "MOKKA_CUDA_TRACE"):
        env.pop(k, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    """The deviceQuery, built against each runtime, shared and static."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        pytest.skip("a C compiler is needed to build tests/fixtures/cudart_query.c")
    out = tmp_path_factory.mktemp("cudart")
    crt = nvidia_dir() / "cu13" / "include"  # crt/host_defines.h (nvidia-cuda-crt), for either runtime
    if not (crt / "crt" / "host_defines.h").is_file():
        pytest.skip("nvidia-cuda-crt is in the test extra")
    built = {}
    for version in RUNTIMES:
        include, lib = runtime(version)
        common = [cc, "-O1", "-I", str(include), "-idirafter", str(crt), str(FIXTURE)]
        for kind, link in (("shared", [f"-L{lib.parent}", f"-l:{lib.name}", f"-Wl,-rpath,{lib.parent}"]),
                           ("static", [str(lib.parent / "libcudart_static.a"), "-ldl", "-lpthread", "-lrt"])):
            exe = out / f"query{version}-{kind}"
            subprocess.run([*common, "-o", str(exe), *link], check=True, capture_output=True, timeout=120)
            built[f"{version}-{kind}"] = exe
    return built


def query(exe: Path, env: dict[str, str], device: int = 0) -> dict:
    r = subprocess.run([str(exe), str(device)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "error" not in out, out
    return out


NVML_FACTS = """
import json, pynvml as p
p.nvmlInit()
out = []
for i in range(p.nvmlDeviceGetCount()):
    h = p.nvmlDeviceGetHandleByIndex(i)
    out.append(dict(name=p.nvmlDeviceGetName(h), uuid=p.nvmlDeviceGetUUID(h),
                    total=p.nvmlDeviceGetMemoryInfo(h).total, bus=p.nvmlDeviceGetPciInfo(h).busId,
                    cc=list(p.nvmlDeviceGetCudaComputeCapability(h)),
                    sm_mhz=p.nvmlDeviceGetMaxClockInfo(h, p.NVML_CLOCK_SM),
                    mem_mhz=p.nvmlDeviceGetMaxClockInfo(h, p.NVML_CLOCK_MEM),
                    bus_width=p.nvmlDeviceGetMemoryBusWidth(h), ecc=p.nvmlDeviceGetEccMode(h)[0],
                    procs=[[x.pid, x.usedGpuMemory] for x in p.nvmlDeviceGetComputeRunningProcesses(h)]))
print(json.dumps(out))
"""


def run_py(env, code: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def nvml(env) -> list[dict]:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    return json.loads(run_py(env, NVML_FACTS).stdout)


def as_cudart(gpu: dict) -> dict:
    """What cudaGetDeviceProperties must say of a GPU NVML describes so."""
    bus = gpu["bus"].split(":")  # 00000000:18:00.0
    return dict(name=gpu["name"], uuid=gpu["uuid"].removeprefix("GPU-").replace("-", ""), total_mem=gpu["total"],
                major=gpu["cc"][0], minor=gpu["cc"][1], pci_domain=int(bus[0], 16), pci_bus=int(bus[1], 16),
                pci_device=int(bus[2].split(".")[0], 16), bus_id=f"{bus[0][-4:]}:{bus[1]}:{bus[2]}".upper(),
                clock_khz=gpu["sm_mhz"] * 1000, mem_clock_khz=gpu["mem_mhz"] * 1000, bus_width=gpu["bus_width"],
                ecc=gpu["ecc"])


@pytest.mark.parametrize("variant", ["12-shared", "12-static", "13-shared", "13-static"])
def test_the_runtime_sees_every_gpu_as_nvml_does_and_its_memory_works(node, programs, variant):
    env = node_env(node)
    out = query(programs[variant], env, device=3)
    from mokkafs.model.profiles import load_profile

    prof = load_profile("h100")
    assert out["driver"] == 13000 and out["runtime"] // 1000 == int(variant[:2])
    assert out["count_error"] == 0 and out["count"] == 8
    facts = nvml(env)
    for i, (dev, gpu) in enumerate(zip(out["devices"], facts)):
        assert {k: dev[k] for k in as_cudart(gpu)} == as_cudart(gpu), i
        assert dev["sms"] == prof.sm_count and dev["l2"] == prof.l2_cache_bytes and dev["warp"] == 32
        assert dev["unified"] == dev["managed"] == 1 and dev["compute_mode"] == 0
    # memory on device 3: 1 GiB + 1 MiB taken and given back, bytes intact through every direction
    assert out["device"] == 3 and out["total"] == prof.memory.total_mib * MIB
    assert out["free0"] - out["free1"] == GIB + MIB and out["free2"] == out["free0"]
    assert out["roundtrip"] == out["memset"] == out["async"] == 1
    assert out["elapsed_ms"] >= 0 and out["stream_query"] == 0
    assert out["ptr_types"] == [2, 1, 3, 0]  # device, host, managed, unregistered
    assert out["ptr_devices"] == [3, 3]
    assert out["oom"] == 2 and out["after_oom"] == 2  # cudaErrorMemoryAllocation, not sticky
    assert out["bad_copy"] == 1 and out["double_free"] == 1  # cudaErrorInvalidValue


def test_cuda_visible_devices_picks_and_orders_the_gpus(node, programs):
    facts = nvml(node_env(node))
    out = query(programs["13-shared"], node_env(node, CUDA_VISIBLE_DEVICES=f"5,{facts[2]['uuid']}"))
    assert out["count"] == 2
    assert [d["uuid"] for d in out["devices"]] == [as_cudart(facts[i])["uuid"] for i in (5, 2)]
    out = query(programs["12-shared"], node_env(node, CUDA_VISIBLE_DEVICES=""))
    assert out["count_error"] == 100 and out["devices"] == []  # cudaErrorNoDevice


HOLD = """
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1])
assert rt.cudaSetDevice(1) == 0
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 30)) == 0
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("version", ["12", "13"])
def test_a_runtime_allocation_is_listed_in_nvml_and_nvidia_smi_at_once(node, version):
    env = node_env(node)
    _, lib = runtime(version)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lib)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        facts = nvml(env)  # no wait: the first allocation is folded before cudaMalloc returns
        assert facts[1]["procs"] == [[proc.pid, GIB]]
        assert all(not f["procs"] for i, f in enumerate(facts) if i != 1)
        smi = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "--query-compute-apps=pid,used_gpu_memory",
                              "--format=csv,noheader"], env=env, capture_output=True, text=True, timeout=30)
        assert smi.stdout.splitlines() == [f"{proc.pid}, 1024 MiB"]
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_device_memory_costs_only_what_is_touched(node):
    _, lib = runtime("12")
    out = json.loads(run_py(node_env(node), f"""
        import ctypes, json
        rt = ctypes.CDLL({str(lib)!r})
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        assert rt.cudaSetDevice(0) == 0
        before = rss()
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(60 << 30)) == 0
        buf = ctypes.create_string_buffer(b"x" * (8 << 20))
        assert rt.cudaMemcpy(ctypes.c_void_p(p.value + (50 << 30)), buf, ctypes.c_size_t(8 << 20), 1) == 0
        grown = rss() - before
        assert rt.cudaFree(p) == 0
        print(json.dumps([grown, rss() - before]))
    """).stdout)
    assert 8 * MIB <= out[0] < 64 * MIB  # 60 GiB allocated, 8 MiB written
    assert out[1] < out[0]  # freed pages go back


CUPY = """
import json, sys, numpy as np, cupy
rt = cupy.cuda.runtime
n = rt.getDeviceCount()
props = []
for i in range(n):
    p = rt.getDeviceProperties(i)
    props.append(dict(name=p["name"].decode(), total=p["totalGlobalMem"], sms=p["multiProcessorCount"],
                      cc=[p["major"], p["minor"]], bus=p["pciBusID"], uuid=bytes(p["uuid"]).hex()))
with cupy.cuda.Device(n - 1):
    a = np.arange(1 << 20, dtype=np.float32)
    roundtrip = bool((cupy.asarray(a).get() == a).all())
    cupy.get_default_memory_pool().free_all_blocks()  # the pool gives the copy's 4 MiB back
    free, total = cupy.cuda.Device().mem_info
    held = cupy.empty(1 << 30, dtype=cupy.uint8)
    print(json.dumps(dict(n=n, props=props, roundtrip=roundtrip, free=free, total=total)), flush=True)
    sys.stdin.readline()
    try:
        cupy.empty(free, dtype=cupy.uint8)
        oom = None
    except cupy.cuda.memory.OutOfMemoryError as e:
        oom = str(e)
    print(json.dumps(dict(oom=oom)), flush=True)
"""


def test_cupy_finds_allocates_copies_and_runs_out_of_memory(node):
    pytest.importorskip("cupy", reason="cupy-cuda12x is in the test extra")
    env = node_env(node, CUDA_VISIBLE_DEVICES="0,6")
    facts = nvml(node_env(node))
    proc = subprocess.Popen([sys.executable, "-c", CUPY], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert first["n"] == 2 and first["roundtrip"] is True
        for got, gpu in zip(first["props"], (facts[0], facts[6])):
            want = as_cudart(gpu)
            assert got == dict(name=want["name"], total=want["total_mem"], sms=132, cc=[9, 0], bus=want["pci_bus"],
                               uuid=want["uuid"])
        assert first["total"] == facts[6]["total"]
        # the pool's 1 GiB, under this pid, on GPU 6 (the copy's 4 MiB were listed at once, the
        # change to 1 GiB shows on the daemon's next tick)
        deadline = time.monotonic() + 10
        while (listed := nvml(node_env(node))[6]["procs"]) != [[proc.pid, GIB]] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listed == [[proc.pid, GIB]]
        proc.stdin.write("\n")
        proc.stdin.flush()
        second = json.loads(proc.stdout.readline())
        assert second["oom"] and "Out of memory" in second["oom"]
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()


# ---- the driver side alone: export tables and launches (a published state, no mount) ----------


def libcuda() -> str:
    from mokkafs.render import native

    return str(native.cuda_library())


LAUNCH = """
import ctypes, json, os, sys
cu = ctypes.CDLL(sys.argv[1])
assert cu.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
table = ctypes.c_void_p(1)
unknown = cu.cuGetExportTable(ctypes.byref(table), (ctypes.c_ubyte * 16)(*range(16)))
known = ctypes.c_void_p()
null_args = [cu.cuGetExportTable(None, (ctypes.c_ubyte * 16)()), cu.cuGetExportTable(ctypes.byref(known), None)]
mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
load = cu.cuModuleLoadData(ctypes.byref(mod), b"not a cubin at all")
get = cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"_Z6kernelPf")
launch = cu.cuLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, None, None, None)
too_wide = cu.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, None, None, None)
unloaded = [cu.cuModuleUnload(mod), cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)]
print(json.dumps(dict(unknown=unknown, table=table.value, null_args=null_args, load=load, get=get, launch=launch,
                      too_wide=too_wide, unloaded=unloaded)))
"""


@pytest.mark.parametrize("refuse", [False, True])
def test_unknown_tables_are_refused_and_launches_do_nothing_or_fail_on_request(pub, refuse):
    from helpers_nvml import consumer_env

    env = consumer_env(pub.path)
    if refuse:
        env["MOKKA_CUDA_LAUNCH"] = "fail"
    r = subprocess.run([sys.executable, "-c", LAUNCH, libcuda()], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["unknown"] == 801 and out["table"] is None  # CUDA_ERROR_NOT_SUPPORTED, nothing handed out
    assert out["null_args"] == [1, 1]
    assert out["load"] == 0 and out["get"] == 0
    assert out["launch"] == (801 if refuse else 0)
    assert out["too_wide"] == 1  # 2048 threads per block: INVALID_VALUE before anything else
    assert out["unloaded"] == [0, 400]  # the function went with its module: INVALID_HANDLE
    refused = "kernel launch of _Z6kernelPf refused" in r.stderr
    assert refused == refuse


def test_a_mig_device_is_the_runtime_s_one_device_with_the_slice_s_properties(node_factory, programs):
    from test_cuda_mig import LAYOUT, mig_devices

    node = node_factory(gpus=2)
    for args in (("mig", "enable"), ("mig", "create", LAYOUT)):
        assert node.cli("inject", "--root", str(node.mnt), "1", *args).returncode == 0
    mig = mig_devices(node, 1)[2]  # a 1g.10gb slice
    out = query(programs["13-shared"], node_env(node, CUDA_VISIBLE_DEVICES=mig["uuid"]))
    assert out["count"] == 1
    dev = out["devices"][0]
    assert (dev["name"], dev["uuid"], dev["total_mem"], dev["sms"]) == (
        mig["name"], mig["uuid"][4:].replace("-", ""), mig["mem"], mig["sm"])
    assert out["free0"] - out["free1"] == GIB + MIB and out["roundtrip"] == 1


def test_a_lost_gpu_gives_the_runtime_s_unknown_error(pub, programs):
    from helpers_nvml import consumer_env
    from mokkafs.model.events import SetLost

    pub.apply(SetLost(1, True))
    env = consumer_env(pub.path)
    r = subprocess.run([str(programs["12-shared"]), "1"], env=env, capture_output=True, text=True, timeout=60)
    out = json.loads(r.stdout)
    assert out["count"] == 4  # still enumerated, as the driver probed it
    assert out["error"] == "cudaSetDevice(on)" and out["code"] == 999  # cudaErrorUnknown
