"""libcuda.so.1 and CUDA process accounting: the shim over a published state (ctypes, one
subprocess per scenario, since the driver's state is per process), the daemon's process table,
and real consumers (cuda-python, numba, pynvml, nvitop) against a mounted node."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import world_readable_node
from helpers_nvml import consumer_env
from mokkafs.render import native
from mokkafs.daemon.controller import Controller
from mokkafs.model.events import SetLost, SetProcesses
from mokkafs.model import InvalidCommand
from helpers import killed_at_end, mount_env, run_py, wait_for

pytestmark = pytest.mark.level("shims")

GIB = 1 << 30

PRELUDE = """
import ctypes, json, os, sys
cu = ctypes.CDLL(os.environ["MOKKA_CUDA_LIB"])
def dev_names(n):
    out = []
    for i in range(n):
        d = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(d), i)
        b = ctypes.create_string_buffer(16); cu.cuDeviceGetPCIBusId(b, 16, d)
        out.append(b.value.decode())
    return out
"""


def cuda_lib() -> Path:
    try:
        return native.cuda_library()
    except FileNotFoundError as e:
        pytest.skip(f"libcuda.so.1 not built ({e}); run `pip install -e .`")


def run_c(state: Path, code: str, **env) -> dict:
    e = consumer_env(state)
    e["MOKKA_CUDA_LIB"] = str(cuda_lib())
    e.pop("CUDA_VISIBLE_DEVICES", None)
    e.update(env)
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_no_driver_is_no_device(tmp_path):
    code = """
        n = ctypes.c_int(-1)
        r = cu.cuInit(0)
        print(json.dumps([r, cu.cuDeviceGetCount(ctypes.byref(n)), n.value, cu.cuInit(1)]))
    """
    assert run_c(tmp_path / "missing", code) == [100, 3, -1, 1]
    (tmp_path / "short").write_bytes(b"MKASTATE")
    assert run_c(tmp_path / "short", code)[0] == 100
    (tmp_path / "dir").mkdir()
    assert run_c(tmp_path / "dir", code)[0] == 100
    from mokkafs.daemon.shm.layout import STATE_SIZE

    (tmp_path / "foreign").write_bytes(b"\x01" * STATE_SIZE)
    assert run_c(tmp_path / "foreign", code)[0] == 803


def test_enumeration_matches_the_profile(pub):
    out = run_c(pub.path, """
        assert cu.cuInit(0) == 0
        n, v = ctypes.c_int(), ctypes.c_int()
        cu.cuDeviceGetCount(ctypes.byref(n)); cu.cuDriverGetVersion(ctypes.byref(v))
        name = ctypes.create_string_buffer(96); cu.cuDeviceGetName(name, 96, 2)
        mem = ctypes.c_size_t(); cu.cuDeviceTotalMem_v2(ctypes.byref(mem), 2)
        uuid = ctypes.create_string_buffer(16); cu.cuDeviceGetUuid_v2(uuid, 2)
        attrs = {}
        for a in (75, 76, 16, 13, 36, 37, 38, 10, 50, 33, 34, 41, 39, 1, 161):
            x = ctypes.c_int(-7); r = cu.cuDeviceGetAttribute(ctypes.byref(x), a, 2); attrs[a] = [r, x.value]
        d = ctypes.c_int(-1)
        by_bus = [cu.cuDeviceGetByPCIBusId(ctypes.byref(d), b) for b in (b"0000:24:00.0", b"00000000:24:00.0", b"24:00.0")]
        bad = [cu.cuDeviceGetByPCIBusId(ctypes.byref(d), b) for b in (b"zz", b"0000:99:00.0", b"")]
        small = ctypes.create_string_buffer(5); cu.cuDeviceGetName(small, 5, 0)
        print(json.dumps(dict(n=n.value, v=v.value, name=name.value.decode(), mem=mem.value, uuid=uuid.raw.hex(),
                              attrs=attrs, buses=dev_names(n.value), by_bus=by_bus, dev=d.value, bad=bad,
                              small=small.value.decode(), badname=cu.cuDeviceGetName(name, 96, 4),
                              neg=cu.cuDeviceGet(ctypes.byref(d), -1))))
    """)
    ident, prof = pub.node.identities[2], pub.node.profile
    assert out["n"] == 4 and out["v"] == 13000
    assert out["name"] == prof.product_name and out["small"] == "NVID"
    assert out["mem"] == prof.memory.total_mib << 20
    assert out["uuid"] == ident.uuid.removeprefix("GPU-").replace("-", "")
    a = {int(k): v for k, v in out["attrs"].items()}
    assert a[75] == [0, 9] and a[76] == [0, 0] and a[16] == [0, prof.sm_count]
    assert a[13] == [0, prof.clocks.max_sm * 1000] and a[36] == [0, prof.clocks.max_mem * 1000]
    assert a[37] == [0, prof.memory.bus_width_bits] and a[38] == [0, prof.l2_cache_bytes]
    assert a[10] == [0, 32] and a[41] == [0, 1] and a[39] == [0, 2048] and a[1] == [0, 1024]
    assert a[50] == [0, ident.bdf.domain] and a[33] == [0, ident.bdf.bus] and a[34] == [0, ident.bdf.device]
    assert a[161][0] == 0
    assert out["buses"] == [i.bdf.legacy.upper().replace("0000:", "0000:", 1) for i in pub.node.identities]
    assert out["by_bus"] == [0, 0, 0] and out["dev"] == 2
    assert out["bad"] == [1, 101, 1] and out["badname"] == 101 and out["neg"] == 101


def test_get_proc_address_returns_the_versioned_variant(pub):
    out = run_c(pub.path, """
        def addr(name):
            return ctypes.cast(getattr(cu, name), ctypes.c_void_p).value
        def lookup(name, version, flags=0):
            p, st = ctypes.c_void_p(), ctypes.c_int(-1)
            r = cu.cuGetProcAddress_v2(name.encode(), ctypes.byref(p), version, ctypes.c_uint64(flags), ctypes.byref(st))
            return [r, st.value, p.value]
        cases = {
            "uuid9020": (lookup("cuDeviceGetUuid", 9020), "cuDeviceGetUuid"),
            "uuid11040": (lookup("cuDeviceGetUuid", 11040), "cuDeviceGetUuid_v2"),
            "totalmem": (lookup("cuDeviceTotalMem", 13000), "cuDeviceTotalMem_v2"),
            "totalmem2000": (lookup("cuDeviceTotalMem", 2000), "cuDeviceTotalMem"),
            "ctx3020": (lookup("cuCtxCreate", 3020), "cuCtxCreate_v2"),
            "ctx12050": (lookup("cuCtxCreate", 13000), "cuCtxCreate_v4"),
            "release": (lookup("cuDevicePrimaryCtxRelease", 11000), "cuDevicePrimaryCtxRelease_v2"),
            "htod_ptds": (lookup("cuMemcpyHtoD", 7000, 2), "cuMemcpyHtoD_v2_ptds"),
            "htod": (lookup("cuMemcpyHtoD", 7000, 0), "cuMemcpyHtoD_v2"),
            "init": (lookup("cuInit", 13000), "cuInit"),
            "v1": ([cu.cuGetProcAddress(b"cuMemAlloc", ctypes.byref(ctypes.c_void_p()), 12000, ctypes.c_uint64(0)), 0, 0], None),
        }
        res = {k: [v, addr(s) if s else None] for k, (v, s) in cases.items()}
        res["unknown"] = lookup("cuNoSuchThing", 13000)
        res["tooold"] = lookup("cuDeviceGetUuid", 9000)
        res["null"] = cu.cuGetProcAddress_v2(None, None, 13000, ctypes.c_uint64(0), None)
        print(json.dumps(res))
    """)
    for key, value in out.items():
        if key in ("unknown", "tooold", "null", "v1"):
            continue
        got, want = value
        assert got[:2] == [0, 0] and got[2] == want, key
    assert out["v1"][0][0] == 0
    assert out["unknown"] == [500, 1, None] and out["tooold"] == [500, 2, None] and out["null"] == 1


def test_every_other_function_is_not_supported(pub):
    exports = [line.strip().rstrip(";") for line in (Path(__file__).parents[1] / "shims/libcuda/libcuda.map")
               .read_text().splitlines() if line.startswith("    cu")]
    assert len(exports) > 700
    out = run_c(pub.path, f"""
        names = {exports!r}
        missing = [n for n in names if not hasattr(cu, n)]
        cu.cuInit(0)
        print(json.dumps([missing, cu.cuGraphCreate(None, 0), cu.cuArrayCreate_v2(None, None),
                          cu.cuTexObjectCreate(None, None, None, None)]))
    """)
    assert out == [[], 801, 801, 801]


@pytest.mark.parametrize("visible, expected", [
    (None, [0, 1, 2, 3]),
    ("2,0", [2, 0]),
    ("1, 3", [1, 3]),
    ("2,x,3", [2]),
    ("3,9,1", [3]),
    ("1,1,2", [1]),
    ("", []),
    ("-1", []),
    ("uuid3", [3]),
    ("uuid3-bare,0", [3, 0]),
    ("uuid1-prefix", [1]),
    ("GPU-", []),
])
def test_cuda_visible_devices(pub, visible, expected):
    ids = pub.node.identities
    if visible and visible.startswith("uuid"):
        u = ids[int(visible[4])].uuid
        visible = {"": u, "-bare": u.removeprefix("GPU-"), "-prefix": u[:12]}[visible[5:].split(",")[0]] + \
            ("," + visible.split(",")[1] if "," in visible else "")
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    out = run_c(pub.path, """
        r = cu.cuInit(0); n = ctypes.c_int(0); cu.cuDeviceGetCount(ctypes.byref(n))
        print(json.dumps([r, dev_names(n.value)]))
    """, **env)
    assert out[0] == (0 if expected else 100)
    assert out[1] == [ids[i].bdf.legacy.upper() for i in expected]


ALLOC = textwrap.dedent("""
    assert cu.cuInit(0) == 0
    P = ctypes.c_uint64
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(P), ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [P]
    def alloc(n):
        p = P(0); r = cu.cuMemAlloc_v2(ctypes.byref(p), n); return r, p.value
    def info():
        f, t = ctypes.c_size_t(), ctypes.c_size_t(); r = cu.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
        return [r, f.value, t.value]
""")


def test_alloc_free_and_out_of_memory(pub):
    out = run_c(pub.path, ALLOC + textwrap.dedent("""
        res = {"noctx": alloc(1)[0], "noctx_info": info()[0]}
        ctx = ctypes.c_void_p(); res["ctx"] = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 1)
        cur = ctypes.c_void_p(); cu.cuCtxGetCurrent(ctypes.byref(cur)); res["current"] = cur.value == ctx.value
        d = ctypes.c_int(-1); cu.cuCtxGetDevice(ctypes.byref(d)); res["dev"] = d.value
        res["before"] = info()
        a, b, c = alloc(10 << 30), alloc(1), alloc(3 << 20)
        res["ptrs"] = [a, b, c]
        res["after"] = info()
        res["oom"] = alloc(res["after"][1] + 1)[0]
        res["zero"] = alloc(0)[0]
        res["free"] = [cu.cuMemFree_v2(a[1]), cu.cuMemFree_v2(a[1]), cu.cuMemFree_v2(12345), cu.cuMemFree_v2(0)]
        res["freed"] = info()
        res["last"] = alloc(res["freed"][1])
        res["full"] = info()
        res["destroy"] = [cu.cuCtxDestroy_v2(ctx), cu.cuCtxDestroy_v2(ctx)]
        print(json.dumps(res))
    """))
    prof = pub.node.profile
    total, usable = prof.memory.total_mib << 20, (prof.memory.total_mib - prof.memory.reserved_mib) << 20
    assert out["noctx"] == 201 and out["noctx_info"] == 201
    assert out["ctx"] == 0 and out["current"] and out["dev"] == 1
    assert out["before"] == [0, usable, total]
    ptrs = [p for r, p in out["ptrs"]]
    assert [r for r, _ in out["ptrs"]] == [0, 0, 0] and len(set(ptrs)) == 3 and all(ptrs)
    assert out["after"][1] == usable - (10 << 30) - 512 - (3 << 20)
    assert out["oom"] == 2 and out["zero"] == 1
    assert out["free"] == [0, 1, 1, 0]
    assert out["freed"][1] == usable - 512 - (3 << 20)
    assert out["last"][0] == 0 and out["full"][1] == 0
    assert out["destroy"] == [0, 201]


def test_pinned_memory_leaves_less_to_allocate(pub):
    from mokkafs.model.events import Pin

    pub.apply(Pin(0, "memory_used", (80000,)))
    out = run_c(pub.path, ALLOC + textwrap.dedent("""
        ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0); cu.cuCtxSetCurrent(ctx)
        print(json.dumps([info(), alloc(2 << 30)[0], alloc(512 << 20)[0]]))
    """))
    usable = (pub.node.profile.memory.total_mib - pub.node.profile.memory.reserved_mib) << 20
    assert out[0][1] == usable - (80000 << 20)
    assert out[1:] == [2, 0]


def test_a_lost_gpu_fails_like_after_xid_79(pub):
    pub.apply(SetLost(0, True))
    out = run_c(pub.path, ALLOC + textwrap.dedent("""
        ctx = ctypes.c_void_p()
        name = ctypes.create_string_buffer(96)
        r = [cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0), cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0),
             cu.cuDeviceGetName(name, 96, 0), cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 1)]
        print(json.dumps(r + [alloc(1 << 20)[0]]))
    """))
    assert out == [999, 999, 0, 0, 0]


HOLDER = """
import ctypes, os, sys, time
cu = ctypes.CDLL(os.environ["MOKKA_CUDA_LIB"])
assert cu.cuInit(0) == 0
ctx, p = ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, int(sys.argv[1])) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[2]))) == 0
print("ready", flush=True)
time.sleep(float(sys.argv[3]))
"""


def start_holder(state: Path, gpu: int, size: int, seconds: float, lib: Path | None = None,
                 **env) -> subprocess.Popen:
    e = consumer_env(state)
    e["MOKKA_CUDA_LIB"] = str(lib or cuda_lib())
    e.update(env)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(gpu), str(size), str(seconds)], env=e,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_process_table_folds_into_the_model(pub):
    controller = Controller(pub.node, None, time.time)
    controller.subscribers.append(pub.publisher)
    holder = start_holder(pub.path, 1, 3 * GIB, 60)
    try:
        pub.table.fold(controller)
        assert pub.node.processes[1] == ((holder.pid, 3 * GIB),)
        assert pub.node.processes[0] == ()
        assert pub.node.readings(1, time.time()).memory_used_mib == 3 * 1024
        g = pub.publisher._st.gpus[1]
        assert (g.process_count, g.processes[0].pid, g.processes[0].used_memory) == (1, holder.pid, 3 * GIB)
        assert g.mem_used == 3 * GIB
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    pub.table.fold(controller)
    assert pub.node.processes[1] == ()
    assert pub.publisher._st.gpus[1].process_count == 0 and pub.publisher._st.gpus[1].mem_used == 0
    assert pub.table.records == {}  # its record went with it


def test_set_processes_is_validated():
    for bad in [((0, 1),), ((1, -1),), ((5, 1), (5, 2)), (("x", 1),), ((1, 1 << 60),)]:
        with pytest.raises(InvalidCommand):
            SetProcesses(0, bad)
    with pytest.raises(InvalidCommand):
        SetProcesses(None, ())
    assert SetProcesses(1, ((9, 1), (3, 2))).processes == ((3, 2), (9, 1))


# ---- real consumers against a mounted node ---------------------------------------------------


@pytest.mark.parametrize("profile", ["h100", "l40s"])
def test_cuda_python_enumerates_the_node(node_factory, profile):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    node = node_factory(profile=profile, gpus=3)
    out = json.loads(run_py(mount_env(node), """
        import json
        from cuda.bindings import driver as d
        assert d.cuInit(0)[0] == 0
        n = d.cuDeviceGetCount()[1]
        devs = []
        for i in range(n):
            dev = d.cuDeviceGet(i)[1]
            A = d.CUdevice_attribute
            devs.append(dict(
                name=d.cuDeviceGetName(96, dev)[1].split(b"\\0")[0].decode(),
                cc=[d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)[1],
                    d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)[1]],
                sms=d.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)[1],
                mem=d.cuDeviceTotalMem(dev)[1]))
        print(json.dumps(dict(version=d.cuDriverGetVersion()[1], devs=devs)))
    """))
    from mokkafs.model.profiles import load_profile

    prof = load_profile(profile)
    major, minor = (int(x) for x in prof.compute_capability.split("."))
    assert out["version"] == int(prof.node.cuda_version.split(".")[0]) * 1000 + int(prof.node.cuda_version.split(".")[1]) * 10
    assert out["devs"] == [dict(name=prof.product_name, cc=[major, minor], sms=prof.sm_count,
                                mem=prof.memory.total_mib << 20)] * 3


def test_numba_finds_every_gpu(node_factory):
    pytest.importorskip("numba.cuda", reason="numba-cuda is in the test extra")
    node = node_factory(gpus=4)
    out = json.loads(run_py(mount_env(node), """
        import json
        from numba import cuda
        print(json.dumps([cuda.is_available(), [(g.name.decode() if isinstance(g.name, bytes) else g.name,
                          list(g.compute_capability)) for g in cuda.gpus]]))
    """, timeout=300))
    assert out == [True, [["NVIDIA H100 80GB HBM3", [9, 0]]] * 4]


ALLOC_10G = """
import os, sys, time
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
err, ctx = d.cuCtxCreate(None, 0, d.cuDeviceGet(1)[1])
assert err == 0, err
err, ptr = d.cuMemAlloc(10 << 30)
assert err == 0, err
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""

NVML_PROCS = """
import json, pynvml as p
p.nvmlInit()
out = []
for i in range(p.nvmlDeviceGetCount()):
    h = p.nvmlDeviceGetHandleByIndex(i)
    out.append([[x.pid, x.usedGpuMemory] for x in p.nvmlDeviceGetComputeRunningProcesses(h)]
               + [p.nvmlDeviceGetMemoryInfo(h, version=p.nvmlMemory_v2).used])
print(json.dumps(out))
"""


@pytest.mark.parametrize("ending", ["exit", "kill -9"])
def test_an_allocation_shows_in_nvml_and_memory_used(node_factory, ending):
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    env = mount_env(node)
    proc = subprocess.Popen([sys.executable, "-c", ALLOC_10G, "2" if ending == "exit" else "60"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"

        def listed():
            procs = json.loads(run_py(env, NVML_PROCS))
            return procs if procs[1][:-1] else None

        procs = wait_for(listed)
        assert procs is not None, "the process never appeared in NVML"
        assert procs[1] == [[proc.pid, 10 << 30], 10 << 30]
        assert procs[0] == [0]  # GPU 0: no processes, nothing used
        assert node.read("gpu1/memory_used").strip() == str(10 * 1024)
        smi = [str(node.mnt / "driver/usr/bin/nvidia-smi")]
        apps = subprocess.run(smi + ["--query-compute-apps=gpu_bus_id,pid,used_gpu_memory", "--format=csv,noheader"],
                              env=env, capture_output=True, text=True, timeout=30)
        bus = subprocess.run(smi + ["--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "1"], env=env,
                             capture_output=True, text=True, timeout=30).stdout.strip()
        assert apps.stdout.splitlines() == [f"{bus}, {proc.pid}, 10240 MiB"]
        table = subprocess.run(smi, env=env, capture_output=True, text=True, timeout=30).stdout
        rows = [line.split() for line in table.splitlines() if f" {proc.pid} " in line]
        assert len(rows) == 1 and rows[0][1] == "1" and rows[0][-2] == "10240MiB", table
        stat = json.loads(subprocess.run([sys.executable, "-m", "gpustat", "--json"], env=env, capture_output=True,
                                         text=True, timeout=60).stdout)
        listed = [(p["pid"], p["gpu_memory_usage"]) for g in stat["gpus"] for p in g["processes"]]
        assert listed == [(proc.pid, 10240)] and stat["gpus"][1]["processes"][0]["pid"] == proc.pid
        if ending == "kill -9":
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert wait_for(lambda: json.loads(run_py(env, NVML_PROCS))[1] == [0] and node.read("gpu1/memory_used").strip() == "0")


def test_a_node_under_a_path_past_sun_path_accounts_its_cuda_processes(node_factory):
    """sun_path holds 108 bytes: libcuda reaches the process-table socket beside a long state
    path through its directory's descriptor (mokka_unix_address), as the daemon binds it, so the
    allocation is accounted and listed, not lost."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2, name="n" * 120)
    sock = Path(str(node.state_dir / "state") + ".procs.sock")
    assert len(os.fsencode(sock)) > 108 and sock.is_socket()
    env = mount_env(node)
    with killed_at_end(subprocess.Popen([sys.executable, "-c", ALLOC_10G, "60"], env=env, stdout=subprocess.PIPE,
                                        text=True)) as proc:
        assert proc.stdout.readline().strip() == "ready"

        def listed():
            procs = json.loads(run_py(env, NVML_PROCS))
            return procs if procs[1][:-1] else None

        assert wait_for(listed) == [[0], [[proc.pid, 10 << 30], 10 << 30]]
        assert node.read("gpu1/memory_used").strip() == str(10 * 1024)


def test_nvitop_maps_cuda_visible_devices_to_uuids(node_factory):
    pytest.importorskip("nvitop", reason="nvitop is in the test extra")
    node = node_factory(gpus=4)
    env = mount_env(node)
    uuids = [node.read(f"gpu{i}/info") for i in range(4)]
    uuids = [next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("uuid"))
             for info in uuids]
    for visible, want in [("2,0", [2, 0]), (uuids[3], [3]), (uuids[1][:10] + ",3", [1, 3]), ("1,x,2", [1])]:
        got = run_py(dict(env, CUDA_VISIBLE_DEVICES=visible), """
            from nvitop import Device
            print(Device.normalize_cuda_visible_devices())
        """).strip()
        assert got == ",".join(uuids[i] for i in want), visible


# ---- the process table from the shim's side -------------------------------------------------


def test_destroying_a_context_frees_what_was_allocated_in_it(pub):
    out = run_c(pub.path, ALLOC + textwrap.dedent("""
        ctx, prim = ctypes.c_void_p(), ctypes.c_void_p()
        assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
        full = info()[1]
        a = alloc(3 << 30)
        less = info()[1]
        assert cu.cuCtxDestroy_v2(ctx) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(prim), 0) == 0
        assert cu.cuCtxSetCurrent(prim) == 0
        back = info()[1]
        alloc(1 << 30)
        primary_less = info()[1]
        assert cu.cuDevicePrimaryCtxRelease_v2(0) == 0
        assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(prim), 0) == 0
        print(json.dumps([a[0], full - less, full - back, full - primary_less, full - info()[1],
                          cu.cuMemFree_v2(ctypes.c_uint64(a[1]))]))
    """))
    assert out == [0, 3 << 30, 0, 1 << 30, 0, 1]  # 1: CUDA_ERROR_INVALID_VALUE, freed already


def test_a_forked_child_is_its_own_process(pub):
    out = run_c(pub.path, ALLOC + textwrap.dedent("""
        ctx = ctypes.c_void_p()
        assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 2) == 0
        r, p = alloc(2 << 30)
        full = info()[2] - (%d << 20)
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rd)
            c2 = ctypes.c_void_p()
            res = [cu.cuMemFree_v2(ctypes.c_uint64(p)), cu.cuCtxCreate_v2(ctypes.byref(c2), 0, 2)]
            res += [full - info()[1], alloc(1 << 30)[0], full - info()[1]]
            os.write(wr, json.dumps(res).encode())
            os._exit(0)
        os.close(wr)
        child = json.loads(os.read(rd, 4096))
        os.waitpid(pid, 0)
        print(json.dumps(child))
    """ % pub.node.profile.memory.reserved_mib))
    # The child frees nothing of the parent's, sees the parent's 2 GiB and adds its own 1 GiB.
    assert out == [1, 0, 2 << 30, 0, 3 << 30]


def nvml_processes(env) -> list:
    return json.loads(run_py(env, NVML_PROCS))


RESIZER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
fd = socket.recv_fds(s, 1, 1)[1][0]
for size in (0, os.fstat(fd).st_size + 4096):
    try:
        os.ftruncate(fd, size)
        print("resized")
    except OSError as e:
        print(e.errno)
"""


def test_another_user_gets_accounted_through_the_daemon(tmp_path):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    for node in world_readable_node():
        env = mount_env(node)
        sock = node.state_dir / "state.procs.sock"
        assert sock.stat().st_mode & 0o777 == 0o666
        e = dict(env, MOKKA_CUDA_LIB=str(cuda_lib()))
        holder = subprocess.Popen(["/usr/bin/python3", "-c", HOLDER, "1", str(GIB), "60"], env=e, user="nobody",
                                  stdout=subprocess.PIPE, text=True, cwd="/")
        with killed_at_end(holder):
            assert holder.stdout.readline().strip() == "ready"
            procs = wait_for(lambda: nvml_processes(env)[1][:-1])
            assert procs == [[holder.pid, GIB]]
            # nobody holds a writable descriptor now, and still cannot resize what others map
            r = subprocess.run(["/usr/bin/python3", "-c", RESIZER, str(sock)], user="nobody", capture_output=True,
                               text=True, timeout=30, cwd="/")
            assert r.stdout.split() == ["1", "1"], r.stderr  # EPERM for shrinking and for growing
        assert wait_for(lambda: nvml_processes(env)[1] == [0])


def test_a_process_in_a_container_is_accounted_with_its_pid_on_the_node(node_factory, tmp_path):
    """A container as CDI makes one: its own pid namespace, and the state directory bind-mounted
    read-only (the table cannot be opened for writing: the daemon's socket hands it over)."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if subprocess.run(["unshare", "--pid", "--mount", "--fork", "true"], capture_output=True).returncode:
        pytest.skip("unshare --pid --mount needs privileges this machine does not give")
    node = node_factory(gpus=2)
    env = mount_env(node)
    seen = tmp_path / "run-mokka"
    seen.mkdir()
    inside = (f"mount --bind {node.state_dir} {seen} && mount -o remount,ro,bind {seen} && "
              f'exec "$0" -c "$1" 0 {GIB} 60')
    e = dict(env, MOKKA_CUDA_LIB=str(cuda_lib()), MOKKA_STATE=str(seen / "state"))
    outer = subprocess.Popen(["unshare", "--pid", "--mount", "--fork", "--kill-child", "sh", "-c", inside,
                              sys.executable, HOLDER], env=e, stdout=subprocess.PIPE, text=True)
    with killed_at_end(outer):
        assert outer.stdout.readline().strip() == "ready"
        inner = int(Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()[0])
        procs = wait_for(lambda: nvml_processes(env)[0][:-1])
        assert procs == [[inner, GIB]]  # not 1, the pid it has in its own namespace
    assert wait_for(lambda: nvml_processes(env)[0] == [0])


def test_a_removed_or_replaced_socket_is_bound_again(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    node.expect_warning(r"state.procs.sock was removed or replaced; binding it again")
    env = mount_env(node)
    sock = node.state_dir / "state.procs.sock"
    def answers() -> bool:
        try:
            return own_record(node.state_dir).magic == 0x53434F5250414B4D
        except OSError:
            return False

    for damage in ("remove", "replace"):
        sock.unlink()
        if damage == "replace":
            sock.write_text("not a socket")
        assert not answers()
        assert wait_for(answers, timeout=15)
        with killed_at_end(start_holder(node.state_dir / "state", 1, GIB, 60)) as holder:
            assert wait_for(lambda: nvml_processes(env)[1][:-1]) == [[holder.pid, GIB]]
    assert node.read("gpu0/temperature").strip().isdigit()  # still serving


STEPPER = PRELUDE + ALLOC + """
import socket, stat
say = lambda *a: print(*a, flush=True)
wait = sys.stdin.readline
ctx = ctypes.c_void_p()
assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
assert alloc(1 << 30)[0] == 0
say("allocated")
wait()
fd = next(int(n) for n in os.listdir("/proc/self/fd")
          if int(n) > 2 and stat.S_ISSOCK(os.fstat(int(n)).st_mode))
os.close(fd)  # a program that closes descriptors it does not own
other = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)  # and the number comes back as another file
if other != fd:
    os.dup2(other, fd)
    os.close(other)
    other = fd
say(json.dumps([fd, other]))
wait()
c2 = ctypes.c_void_p()
res = [alloc(1 << 30)[0], cu.cuCtxCreate_v2(ctypes.byref(c2), 0, 1), alloc(1 << 20)[0], info()]
os.fstat(fd)  # still open: the shim neither closed nor wrote the program's file
say(json.dumps(res))
wait()
"""


def test_a_program_that_closes_the_daemon_connection_stays_listed_and_right(pub, tmp_path):
    """The connection is only for pings: its record (still mapped) keeps the process listed,
    its next first-on-a-GPU reconnects, and the file that took the number is left alone."""
    e = consumer_env(pub.path)
    e["MOKKA_CUDA_LIB"] = str(cuda_lib())
    other = tmp_path / "other"
    p = subprocess.Popen([sys.executable, "-c", STEPPER, str(other)], env=e, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    with killed_at_end(p):
        assert p.stdout.readline().strip() == "allocated"
        assert pub.node.processes[0] == ((p.pid, GIB),)  # folded at once, no tick in this fixture
        p.stdin.write("\n")
        p.stdin.flush()
        fd, reused = json.loads(p.stdout.readline())
        assert fd == reused  # the case that matters: the shim's number now names another file
        pub.table.fold(pub.controller)
        assert pub.node.processes[0] == ((p.pid, GIB),)
        p.stdin.write("\n")
        p.stdin.flush()
        r, rc, r2, (ri, free, total) = json.loads(p.stdout.readline())
        usable = (pub.node.profile.memory.total_mib - pub.node.profile.memory.reserved_mib) << 20
        assert (r, rc, r2, ri, free) == (0, 0, 0, 0, usable - (1 << 20))  # GPU 1's, c2 is current
        assert pub.node.processes[1] == ((p.pid, 1 << 20),)  # reconnected: listed at once on GPU 1
        pub.table.fold(pub.controller)
        assert pub.node.processes[0] == ((p.pid, 2 * GIB),)
        assert other.read_bytes() == b""
        assert len(pub.table.records) == 1  # the reconnect got its own record back, not a second


class FakeDaemon:
    """A socket at `<state>.procs.sock` that answers every connection with `record` (a memfd
    made by `make`, or none), as a broken or hostile daemon would."""

    def __init__(self, state: Path, make) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(f"{state}.procs.sock")
        self.sock.listen(8)
        self.make, self.conns, self.fds = make, [], []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            fd = self.make()
            self.conns.append(conn)
            self.fds.append(fd)
            socket.send_fds(conn, [b"\1"], [fd] if fd >= 0 else [])

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def memfd(size: int, seals: int, others: int = 0) -> int:
    from mokkafs.daemon.shm.proctable import header, SEALS, _OTHERS

    fd = os.memfd_create("mokka-proc", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    os.pwrite(fd, header(1), 0)
    if others:
        os.pwrite(fd, others.to_bytes(8, "little"), _OTHERS)  # GPU 0
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


@pytest.mark.parametrize("record", ["missing", "declined", "unsealed", "wrong size", "hostile others", "valid"])
def test_cuda_works_on_whatever_the_daemon_hands_over(pub, record):
    """What comes over the socket is input: no daemon, a refusal, or a record that could fault
    (unsealed, the wrong size): CUDA works unaccounted; absurd counters fill the GPU but never
    wrap to free."""
    from mokkafs.daemon.shm.proctable import RECORD_SIZE

    state = pub.path.parent / "elsewhere" / "state"  # the state without the real daemon's socket
    state.parent.mkdir()
    state.write_bytes(pub.path.read_bytes())
    make = {"declined": lambda: -1, "unsealed": lambda: memfd(RECORD_SIZE, 0),
            "wrong size": lambda: memfd(RECORD_SIZE - 8, 1), "hostile others": lambda: memfd(RECORD_SIZE, 1, (1 << 64) - 1),
            "valid": lambda: memfd(RECORD_SIZE, 1)}
    fake = FakeDaemon(state, make[record]) if record in make else None
    try:
        out = run_c(state, ALLOC + textwrap.dedent("""
            ctx = ctypes.c_void_p()
            assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
            r1, _ = alloc(1 << 30)
            print(json.dumps([r1, info()]))
        """))
        # the shim stored into a record only where it may: a valid one (mem[0] at offset 32)
        written = [int.from_bytes(os.pread(fd, 8, 32), "little") for fd in fake.fds if fd >= 0] if fake else []
        assert written == {"valid": [GIB], "unsealed": [0], "wrong size": [0], "hostile others": [0]}.get(record, [])
    finally:
        if fake:
            fake.close()
    usable = (pub.node.profile.memory.total_mib - pub.node.profile.memory.reserved_mib) << 20
    if record == "hostile others":
        assert out == [2, [0, 0, pub.node.profile.memory.total_mib << 20]]  # OUT_OF_MEMORY, free 0
    else:
        assert out == [0, [0, usable - GIB, pub.node.profile.memory.total_mib << 20]]


def test_many_processes_come_and_go_and_leave_no_record_behind(node_factory):
    """Twenty CUDA processes at once, half killed with -9 and half exiting: each is listed with
    its own memory while alive, and afterwards no record is left and nothing is used."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    env = mount_env(node)
    e = dict(consumer_env(node.state_dir / "state"), MOKKA_CUDA_LIB=str(cuda_lib()))
    until_stdin_closes = HOLDER.replace("time.sleep(float(sys.argv[3]))", "sys.stdin.read()")
    holders = []
    try:
        for i in range(20):
            h = subprocess.Popen([sys.executable, "-c", until_stdin_closes, str(i % 2), str((i + 1) << 20), "0"],
                                 env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            holders.append(h)
            assert h.stdout.readline().strip() == "ready"
        want = [sorted([h.pid, (i + 1) << 20] for i, h in enumerate(holders) if i % 2 == g) for g in (0, 1)]
        seen = wait_for(lambda: [sorted(x[:-1]) for x in nvml_processes(env)] == want or None)
        assert seen, nvml_processes(env)
        for i, h in enumerate(holders):
            if i % 2:
                h.kill()
            else:
                h.stdin.close()  # exits on its own
        for h in holders:
            h.wait(timeout=30)
    finally:
        for h in holders:
            with killed_at_end(h):
                pass
    assert wait_for(lambda: nvml_processes(env) == [[0], [0]]), nvml_processes(env)
    # every record is gone: a restarted daemon would adopt none
    assert wait_for(lambda: (node.state_dir / "state.procs.id").read_text() == "")


def own_record(state_dir: Path):
    """A copy of the record the running daemon makes for this process, got the way a CUDA
    process gets it."""
    import socket

    from mokkafs.daemon.shm.layout import ffi as pffi
    from mokkafs.daemon.shm.proctable import RECORD_SIZE

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(state_dir / "state.procs.sock"))
        fd = socket.recv_fds(s, 1, 1)[1][0]
    try:
        return pffi.from_buffer("struct mokka_proc_record *", bytearray(os.pread(fd, RECORD_SIZE, 0)))
    finally:
        os.close(fd)


CUED_HOLDER = HOLDER.replace("time.sleep(float(sys.argv[3]))", """
sys.stdin.readline()
c2 = ctypes.c_void_p()
assert cu.cuCtxCreate_v2(ctypes.byref(c2), 0, 0) == 0
print("again", flush=True)
sys.stdin.read()
""")


def test_a_restarted_daemon_adopts_the_record_from_a_live_process(node_factory):
    """kill -9 the daemon under a running CUDA process and mount again: the new daemon finds
    the process's record through the process itself and lists it as before; the process,
    reconnecting on its next first context, is handed that same record back."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    node.expect_warning("clearing stale mount")
    env = mount_env(node)
    e = dict(consumer_env(node.state_dir / "state"), MOKKA_CUDA_LIB=str(cuda_lib()))
    holder = subprocess.Popen([sys.executable, "-c", CUED_HOLDER, "1", str(3 * GIB), "0"], env=e,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    id_file = node.state_dir / "state.procs.id"
    with killed_at_end(holder):
        assert holder.stdout.readline().strip() == "ready"
        assert wait_for(lambda: nvml_processes(env)[1][:-1]) == [[holder.pid, 3 * GIB]]
        before = id_file.read_text()
        assert before.split()[0] == str(holder.pid)
        node.kill9()
        node.mount()
        assert f"adopted the CUDA process record of pid {holder.pid}" in (node.state_dir / "daemon.log").read_text()
        assert wait_for(lambda: nvml_processes(env)[1][:-1]) == [[holder.pid, 3 * GIB]]
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "again"
        assert nvml_processes(env)[0][:-1] == [[holder.pid, 0]]  # its new context: listed at once
        assert id_file.read_text() == before  # the same record (pid, start time, dev, ino), not a second
    assert wait_for(lambda: nvml_processes(env)[1] == [0])


# ---- who may account for whom, and when NVML sees it ---------------------------------------

NVML_ON_CUE = """
import json, sys, pynvml as p
p.nvmlInit()
h = p.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps([[x.pid, x.usedGpuMemory] for x in p.nvmlDeviceGetComputeRunningProcesses(h)]), flush=True)
"""


def test_a_process_is_listed_on_the_first_call_after_its_first_allocation(pub):
    """No daemon tick runs here: only the process's own first-context and first-memory pings
    can get it listed, and NVML in another process must see it on its very next call."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    watcher = subprocess.Popen([sys.executable, "-c", NVML_ON_CUE, "2"], env=consumer_env(pub.path),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with killed_at_end(watcher):
        assert watcher.stdout.readline().strip() == "ready"
        with killed_at_end(start_holder(pub.path, 2, 3 * GIB, 60)) as holder:  # "ready" follows its cuMemAlloc
            watcher.stdin.write("\n")
            watcher.stdin.flush()
            assert json.loads(watcher.stdout.readline()) == [[holder.pid, 3 * GIB]]


# Forks COUNT children that each take whatever the daemon's socket hands them and overwrite all
# of it past the 24-byte header with 0xff (contexts on every GPU, 2^64-1 bytes everywhere), then
# ask to be folded; they hold on until stdin closes. Whatever the protocol, this is the most a
# caller of the socket can do with what it gets.
SCRIBBLERS = """
import os, socket, sys
path, count = sys.argv[1], int(sys.argv[2])
hold_r, hold_w = os.pipe()
done_r, done_w = os.pipe()
for _ in range(count):
    if os.fork() == 0:
        os.close(hold_w)
        os.close(done_r)
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        _, fds, _, _ = socket.recv_fds(s, 1, 1)
        for fd in fds:
            size = os.fstat(fd).st_size
            os.pwrite(fd, b"\\xff" * (size - 24), 24)
        try:
            s.send(b"?")
            s.settimeout(1)
            s.recv(1)
        except OSError:
            pass
        os.write(done_w, b"x")
        os.read(hold_r, 1)
        os._exit(0)
os.close(done_w)
for _ in range(count):  # every child has scribbled and pinged (or been refused)
    os.read(done_r, 1)
print("ready", flush=True)
sys.stdin.read()
"""


def test_nobody_cannot_touch_hide_or_starve_a_root_process(tmp_path):
    """As nobody, 100 processes take what the socket gives and scribble on all of it; a root
    process is still listed with its pid and 1 GiB by pynvml and nvidia-smi, and a new root
    process's 1 GiB allocation succeeds and is listed too."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    for node in world_readable_node():
        node.expect_warning(r"uid 65534 has \d+ CUDA processes accounted, its cap")
        env = mount_env(node)
        sock = str(node.state_dir / "state.procs.sock")
        with killed_at_end(start_holder(node.state_dir / "state", 1, GIB, 120)) as holder:
            assert wait_for(lambda: nvml_processes(env)[1][:-1]) == [[holder.pid, GIB]]
            flood = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                      "-c", SCRIBBLERS, sock, "100"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd="/")
            with killed_at_end(flood):
                assert flood.stdout.readline().strip() == "ready"
                time.sleep(0.5)  # two ticks: whatever the scribbling does, it has done
                with killed_at_end(start_holder(node.state_dir / "state", 1, GIB, 120)) as late:
                    for _ in range(3):  # and it stays so, tick after tick
                        on_gpu1 = dict(map(tuple, nvml_processes(env)[1][:-1]))
                        assert on_gpu1.get(holder.pid) == GIB and on_gpu1.get(late.pid) == GIB, on_gpu1
                        time.sleep(0.2)
                    smi = str(node.mnt / "driver/usr/bin/nvidia-smi")
                    apps = subprocess.run([smi, "--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader"],
                                          env=env, capture_output=True, text=True, timeout=30).stdout.splitlines()
                    assert f"{holder.pid}, 1024 MiB" in apps and f"{late.pid}, 1024 MiB" in apps, apps


def test_one_thread_holds_every_context_the_table_can_make(pub):
    """docs/cuda.md: 960 contexts made (each pushed on the creating thread's stack), then
    OUT_OF_MEMORY; the driver documents no depth for a thread's stack, so it holds them all (it
    held 32, and the 33rd cuCtxCreate on a thread was INVALID_VALUE). A push past 1024 is
    OUT_OF_MEMORY too, and the stack unwinds whole."""
    out = run_c(pub.path, """
        assert cu.cuInit(0) == 0
        made, r = [], 0
        while r == 0 and len(made) < 2000:
            c = ctypes.c_void_p(); r = cu.cuCtxCreate_v2(ctypes.byref(c), 0, 0)
            if r == 0:
                made.append(c.value)
        res = {"made": len(made), "then": r, "distinct": len(set(made))}
        top = ctypes.c_void_p(); cu.cuCtxGetCurrent(ctypes.byref(top)); res["top_is_last"] = top.value == made[-1]
        res["destroyed"] = sorted({cu.cuCtxDestroy_v2(ctypes.c_void_p(c)) for c in made})
        prim = ctypes.c_void_p(); assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(prim), 1) == 0
        pushes = [cu.cuCtxPushCurrent_v2(prim) for _ in range(1025)]
        res["pushed"], res["past"] = pushes.count(0), pushes[-1]
        pops = [cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p())) for _ in range(1025)]
        res["popped"], res["empty"] = pops.count(0), pops[-1]
        print(json.dumps(res))
    """)
    assert out == {"made": 960, "then": 2, "distinct": 960, "top_is_last": True, "destroyed": [0],
                   "pushed": 1024, "past": 2, "popped": 1024, "empty": 201}


TORN = """
import subprocess
assert cu.cuInit(0) == 0
d = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(d), 0) == 0
def total():
    b = ctypes.c_size_t(12345); r = cu.cuDeviceTotalMem_v2(ctypes.byref(b), d); return [r, b.value]
print(json.dumps(total()), flush=True)
for _ in range(2):  # torn, then finished: the parent says when
    sys.stdin.readline()
    print(json.dumps(total()), flush=True)
"""


def test_libcuda_answers_unknown_never_a_torn_value_while_the_writer_is_stuck(pub):
    """As NVML does: a daemon killed between the two seq increments leaves seq odd and a record
    half-written; libcuda answers CUDA_ERROR_UNKNOWN (999) after the bounded wait, never the
    torn value, and reads again once the writer finishes."""
    e = consumer_env(pub.path)
    e["MOKKA_CUDA_LIB"] = str(cuda_lib())
    e.pop("CUDA_VISIBLE_DEVICES", None)
    child = subprocess.Popen([sys.executable, "-c", PRELUDE + TORN], env=e, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    with killed_at_end(child):
        total = pub.node.profile.memory.total_mib << 20
        assert json.loads(child.stdout.readline()) == [0, total]
        st = pub.publisher._st
        st.seq += 1  # as if the writer died mid-publish
        st.gpus[0].mem_total = 7  # half of what it was writing
        child.stdin.write("\n"); child.stdin.flush()
        torn = json.loads(child.stdout.readline())
        st.seq += 1  # the writer finished
        child.stdin.write("\n"); child.stdin.flush()
        finished = json.loads(child.stdout.readline())
    assert torn == [999, 12345], torn
    assert finished == [0, 7]
