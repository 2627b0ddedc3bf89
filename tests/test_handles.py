"""Handles are validated, never dereferenced: every NVML and CUDA handle a
caller hands back, whatever it is (a random number, a pointer to readable garbage, a freed or
destroyed handle whose slot was reused, a pointer a few bytes into the device array), gets an
error code, and the host survives. Each scenario runs in a subprocess that must exit 0 with its
own assertions: a crash there is a SIGSEGV exit, not a test error in this process. NULL
out-pointers and sizes are swept through every hand-written function of both libraries."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers_nvml import Published, consumer_env, nvml_path
from mokkafs.render import native

pytestmark = pytest.mark.level("shims")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "shims"))
import gen_nvml  # noqa: E402

sys.path.pop(0)

INVALID_ARGUMENT, TIMEOUT = 2, 10
INVALID_CONTEXT, CONTEXT_IS_DESTROYED = 201, 709


@pytest.fixture
def state(tmp_path):
    pub = Published(tmp_path, "h100", gpus=4)
    yield pub.path
    pub.close()


def survive(state: Path, code: str, timeout: float = 120) -> dict:
    """Run `code` against the shims in a fresh process; it must exit 0 (not be killed by a
    signal) and print its findings as JSON on its last line."""
    env = consumer_env(state)
    env["MOKKA_NVML_LIB"] = str(nvml_path())
    try:
        env["MOKKA_CUDA_LIB"] = str(native.cuda_library())
    except FileNotFoundError as e:
        pytest.skip(f"libcuda.so.1 not built ({e})")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


PRELUDE = """
import ctypes as C, json, os, random, sys, threading, time
nv = C.CDLL(os.environ["MOKKA_NVML_LIB"])
cu = C.CDLL(os.environ["MOKKA_CUDA_LIB"])
rng = random.Random(12)

class EventData(C.Structure):
    _fields_ = [("device", C.c_void_p), ("eventType", C.c_ulonglong), ("eventData", C.c_ulonglong),
                ("gpuInstanceId", C.c_uint), ("computeInstanceId", C.c_uint)]

XID = 0x8
keep = []  # buffers whose addresses are handed in as handles stay alive

def readable(pattern):
    # A pointer to readable memory that starts with `pattern`, then random bytes.
    b = C.create_string_buffer(pattern + bytes(rng.getrandbits(8) for _ in range(4096 - len(pattern))), 4096)
    keep.append(b)
    return C.addressof(b)

def garbage(magic):
    # Random 64-bit values, small and kernel-half numbers, and pointers to readable memory
    # that starts with `magic` (the check main's shims made before dereferencing).
    vals = [rng.getrandbits(64) for _ in range(3000)] + [1, 8, 4095, 4096, 2**63, 2**64 - 1, 0xdeadbeef]
    vals += [readable(magic) for _ in range(20)] + [readable(b"") for _ in range(20)]
    return vals
"""


# ---- NVML -----------------------------------------------------------------------------------


def test_garbage_event_sets_are_invalid_argument(state):
    out = survive(state, """
        import struct
        assert nv.nvmlInit_v2() == 0
        dev = C.c_void_p(); assert nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev)) == 0
        freed = C.c_void_p(); assert nv.nvmlEventSetCreate(C.byref(freed)) == 0
        assert nv.nvmlEventSetFree(freed) == 0
        magic = struct.pack("<I", 0x4d4b4553)  # main's event-set magic word
        bad = garbage(magic) + [freed.value, dev.value, dev.value + 1, dev.value - 1, dev.value + 64 * 4]
        d = EventData()
        res = set()
        for h in bad:
            h = C.c_void_p(h)
            res |= {nv.nvmlEventSetWait_v2(h, C.byref(d), 0), nv.nvmlEventSetWait(h, C.byref(d), 0),
                    nv.nvmlDeviceRegisterEvents(dev, C.c_ulonglong(XID), h), nv.nvmlEventSetFree(h)}
        res_null = [nv.nvmlEventSetWait_v2(None, C.byref(d), 0), nv.nvmlEventSetFree(None),
                    nv.nvmlDeviceRegisterEvents(dev, C.c_ulonglong(XID), None), nv.nvmlEventSetCreate(None)]
        live = C.c_void_p(); assert nv.nvmlEventSetCreate(C.byref(live)) == 0
        res_live = [nv.nvmlDeviceRegisterEvents(dev, C.c_ulonglong(XID), live),
                    nv.nvmlEventSetWait_v2(live, None, 0), nv.nvmlEventSetWait_v2(live, C.byref(d), 0),
                    nv.nvmlEventSetFree(live)]
        # The real consumer: pynvml's wrappers raise the error, the process carries on.
        import pynvml
        pynvml.nvmlInit()
        kinds = []
        for h in (freed.value, rng.getrandbits(64), readable(magic)):
            try:
                pynvml.nvmlEventSetWait_v2(C.c_void_p(h), 0)
            except pynvml.NVMLError as e:
                kinds.append(e.value)
        print(json.dumps(dict(res=sorted(res), null=res_null, live=res_live, kinds=kinds)))
    """)
    assert out["res"] == [INVALID_ARGUMENT]
    assert out["null"] == [INVALID_ARGUMENT] * 4
    assert out["live"] == [0, INVALID_ARGUMENT, TIMEOUT, 0]
    assert out["kinds"] == [INVALID_ARGUMENT] * 3


def test_a_freed_event_set_stays_refused_when_its_slot_is_reused(state):
    out = survive(state, """
        assert nv.nvmlInit_v2() == 0
        dev = C.c_void_p(); assert nv.nvmlDeviceGetHandleByIndex_v2(1, C.byref(dev)) == 0
        d, wrong, same = EventData(), [], 0
        for i in range(2000):
            a, b = C.c_void_p(), C.c_void_p()
            assert nv.nvmlEventSetCreate(C.byref(a)) == 0
            assert nv.nvmlEventSetFree(a) == 0
            assert nv.nvmlEventSetCreate(C.byref(b)) == 0
            same += a.value == b.value
            stale = [nv.nvmlEventSetFree(a), nv.nvmlDeviceRegisterEvents(dev, C.c_ulonglong(XID), a),
                     nv.nvmlEventSetWait_v2(a, C.byref(d), 0)]
            fresh = [nv.nvmlDeviceRegisterEvents(dev, C.c_ulonglong(XID), b), nv.nvmlEventSetWait_v2(b, C.byref(d), 0),
                     nv.nvmlEventSetFree(b)]
            if stale != [2, 2, 2] or fresh != [0, 10, 0]:
                wrong.append([i, stale, fresh])
        print(json.dumps(dict(wrong=wrong[:5], same=same)))
    """)
    assert out == {"wrong": [], "same": 0}


def test_waiting_on_a_set_another_thread_frees_returns_an_error(state):
    out = survive(state, """
        assert nv.nvmlInit_v2() == 0
        results = []
        def wait(s):
            d = EventData(); t0 = time.monotonic()
            results.append([nv.nvmlEventSetWait_v2(s, C.byref(d), 10000), time.monotonic() - t0])
        for _ in range(20):
            s = C.c_void_p(); assert nv.nvmlEventSetCreate(C.byref(s)) == 0
            threads = [threading.Thread(target=wait, args=(C.c_void_p(s.value),)) for _ in range(3)]
            for t in threads: t.start()
            time.sleep(0.02)
            assert nv.nvmlEventSetFree(s) == 0
            for t in threads: t.join(15)
        print(json.dumps(dict(codes=sorted({r[0] for r in results}), n=len(results),
                              slowest=max(r[1] for r in results))))
    """)
    assert out["codes"] == [INVALID_ARGUMENT] and out["n"] == 60
    assert out["slowest"] < 1.5  # at most one futex slice, never the 10 s timeout


def test_device_handles_must_be_exact_elements(state):
    """Every hand-written NVML function that takes a device, handed a pointer next to a real
    handle, inside the array off an element, or anything else: INVALID_ARGUMENT."""
    takes_device = sorted(n for n, p in gen_nvml.header_functions().items()
                          if n in gen_nvml.hand_written() and p.startswith("nvmlDevice_t "))
    assert len(takes_device) > 100
    out = survive(state, """
        names = %r
        assert nv.nvmlInit_v2() == 0
        dev = C.c_void_p(); assert nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev)) == 0
        last = C.c_void_p(); assert nv.nvmlDeviceGetHandleByIndex_v2(3, C.byref(last)) == 0
        room = C.create_string_buffer(1 << 16)  # every out-pointer, big enough for any struct
        C.memset(room, 0, 1 << 16)
        args = [C.c_void_p(C.addressof(room))] + [C.c_uint64(0)] * 3  # length 0 where one is asked for
        bad = [dev.value + k for k in (1, 2, 3, -1, -4)] + [last.value + 4, last.value + 4 * 61, last.value + 4 * 60]
        bad += [rng.getrandbits(64) for _ in range(50)] + [readable(b"") for _ in range(5)]
        wrong = {}
        for name in names:
            for h in bad:
                r = getattr(nv, name)(C.c_void_p(h), *args)
                if r != 2:
                    wrong.setdefault(name, []).append([hex(h - dev.value), r])
        print(json.dumps(dict(wrong=wrong)))
    """ % (takes_device,))
    assert out["wrong"] == {}


def _symbol_offset(lib: Path, name: str, base: str) -> int:
    """Where the library's (hidden) symbol `name` lies relative to `base`, from its symbol table."""
    out = subprocess.run(["nm", str(lib)], capture_output=True, text=True, check=True).stdout
    addr = {m[2]: int(m[0], 16) for m in re.findall(r"^([0-9a-f]+) (\w) (\S+)$", out, flags=re.M)}
    return addr[name] - addr[base]


def test_mig_handle_table_holds_no_live_handle_yet(state):
    """The handle layer has a table for MIG device handles, but the state publishes no MIG
    device: every slot of that table is garbage to every hand-written function (INVALID_ARGUMENT,
    not NOT_SUPPORTED, which a live MIG handle will get where a function does not take one), and
    a GPU handle is not a MIG device handle."""
    takes_device = sorted(n for n, p in gen_nvml.header_functions().items()
                          if n in gen_nvml.hand_written() and p.startswith("nvmlDevice_t "))
    lib = nvml_path()
    mig_table = _symbol_offset(lib, "g_mig_handles", "g_gpu_handles")
    out = survive(state, """
        names, mig_table = %r, %d
        assert nv.nvmlInit_v2() == 0
        dev = C.c_void_p(); assert nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev)) == 0
        room = C.create_string_buffer(1 << 16)
        args = [C.c_void_p(C.addressof(room))] + [C.c_uint64(0)] * 3
        slots = [dev.value + mig_table + 4 * k for k in range(64 * 8)]  # every GPU's every MIG slot
        wrong = {}
        for name in names:
            for h in slots:
                r = getattr(nv, name)(C.c_void_p(h), *args)
                if r != 2:
                    wrong.setdefault(name, []).append([hex(h - dev.value), r])
        is_mig = C.c_uint(7)
        print(json.dumps(dict(wrong=wrong, gpu=[nv.nvmlDeviceIsMigDeviceHandle(dev, C.byref(is_mig)), is_mig.value])))
    """ % (takes_device, mig_table))
    assert out["wrong"] == {}
    assert out["gpu"] == [0, 0]


def _nvml_calls() -> list[tuple[str, list[str]]]:
    out = []
    for name, params in gen_nvml.header_functions().items():
        if name not in gen_nvml.hand_written() or name.startswith(("nvmlInit", "nvmlShutdown")):
            continue
        kinds = []
        for p in filter(None, (x.strip() for x in params.split(","))):
            if p == "void":
                continue
            typ = p.rsplit(" ", 1)[0] if "*" not in p.rsplit(" ", 1)[-1] else p
            kinds.append("device" if typ.startswith("nvmlDevice_t") and "*" not in p
                         else "set" if typ.startswith("nvmlEventSet_t") and "*" not in p
                         else "ptr" if "*" in p else "int")
        out.append((name, kinds))
    return out


def test_null_out_pointers_never_crash_nvml(state):
    """Every hand-written NVML function with every pointer NULL and every number 0, then 1,
    then huge (a length that promises a big buffer): an error code, never a fault. Where a
    pointer is NULL that the function needs, the answer is INVALID_ARGUMENT."""
    calls = _nvml_calls()
    assert len(calls) > 120
    out = survive(state, """
        calls = %r
        assert nv.nvmlInit_v2() == 0
        dev = C.c_void_p(); assert nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev)) == 0
        results = {}
        for name, kinds in calls:
            for n in (0, 1, 2**31, 2**32 - 1):
                s = C.c_void_p(); assert nv.nvmlEventSetCreate(C.byref(s)) == 0
                args = [dev if k == "device" else s if k == "set" else None if k == "ptr" else C.c_uint64(n)
                        for k in kinds]
                results.setdefault(name, set()).add(getattr(nv, name)(*args))
                nv.nvmlEventSetFree(s)
        print(json.dumps({k: sorted(v) for k, v in results.items()}))
    """ % (calls,))
    with_pointers = [name for name, kinds in calls if "ptr" in kinds]
    wrong = {n: out[n] for n in with_pointers if out[n] != [INVALID_ARGUMENT]}
    # No values asked for (a count of 0) is an empty request, NULL or not; any other count is 2.
    assert wrong == {"nvmlDeviceGetFieldValues": [0, INVALID_ARGUMENT]}


# ---- CUDA -----------------------------------------------------------------------------------


def test_garbage_contexts_are_invalid_context(state):
    out = survive(state, """
        import struct
        assert cu.cuInit(0) == 0
        ctx = C.c_void_p(); assert cu.cuCtxCreate_v2(C.byref(ctx), 0, 0) == 0
        prim = C.c_void_p(); assert cu.cuDevicePrimaryCtxRetain(C.byref(prim), 1) == 0
        magic = struct.pack("<QiiI", 0x6d6f6b6b61637478, 0, 0, 0)  # main's context magic, device 0
        bad = garbage(magic) + [ctx.value + k for k in (1, -1, 1 << 16, 1 << 48)] + [prim.value + 1]
        v = C.c_uint(); res = set()
        for h in bad:
            h = C.c_void_p(h)
            res |= {cu.cuCtxDestroy_v2(h), cu.cuCtxDestroy(h), cu.cuCtxPushCurrent_v2(h), cu.cuCtxSetCurrent(h),
                    cu.cuCtxGetApiVersion(h, C.byref(v))}
        # The real contexts are untouched by all of that.
        cur = C.c_void_p(); cu.cuCtxGetCurrent(C.byref(cur))
        d = C.c_int(-1); p = C.c_uint64()
        ok = [cur.value == ctx.value, cu.cuCtxGetDevice(C.byref(d)), d.value, cu.cuMemAlloc_v2(C.byref(p), 1 << 20),
              cu.cuMemFree_v2(p), cu.cuCtxGetApiVersion(prim, C.byref(v)), cu.cuCtxDestroy_v2(prim),
              cu.cuCtxDestroy_v2(ctx), cu.cuCtxDestroy_v2(None)]
        print(json.dumps(dict(res=sorted(res), ok=ok)))
    """)
    assert out["res"] == [INVALID_CONTEXT]
    # A primary context is not cuCtxDestroy's to destroy.
    assert out["ok"] == [True, 0, 0, 0, 0, 0, INVALID_CONTEXT, 0, INVALID_CONTEXT]


def test_a_destroyed_context_never_reaches_the_next_one(state):
    """malloc hands a destroyed context's address to the next cuCtxCreate; on main a destroy
    of the stale handle then destroyed the newer context. Looped, so that every slot reuse
    and address reuse pattern comes round."""
    out = survive(state, """
        assert cu.cuInit(0) == 0
        def free_bytes():
            f, t = C.c_size_t(), C.c_size_t(); r = cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)); return [r, f.value]
        wrong, v, reused = [], C.c_uint(), 0
        seen = set()
        for i in range(1500):
            a, b = C.c_void_p(), C.c_void_p()
            assert cu.cuCtxCreate_v2(C.byref(a), 0, i %% 4) == 0
            assert cu.cuCtxDestroy_v2(a) == 0
            assert cu.cuCtxCreate_v2(C.byref(b), 0, (i + 1) %% 4) == 0
            reused += b.value in seen
            seen.add(a.value)
            p = C.c_uint64(); assert cu.cuMemAlloc_v2(C.byref(p), 1 << 30) == 0
            before = free_bytes()
            stale = [cu.cuCtxDestroy_v2(a), cu.cuCtxPushCurrent_v2(a), cu.cuCtxSetCurrent(a),
                     cu.cuCtxGetApiVersion(a, C.byref(v))]
            d = C.c_int(-1); cu.cuCtxGetDevice(C.byref(d))
            intact = [free_bytes() == before, d.value, cu.cuCtxGetApiVersion(b, C.byref(v))]
            end = [cu.cuMemFree_v2(p), cu.cuCtxDestroy_v2(b), cu.cuCtxDestroy_v2(b)]
            if stale != [201] * 4 or intact != [True, (i + 1) %% 4, 0] or end != [0, 0, 201]:
                wrong.append([i, stale, intact, end])
        print(json.dumps(dict(wrong=wrong[:5], reused=reused)))
    """ % (), timeout=180)
    assert out["wrong"] == [] and out["reused"] == 0


def test_a_context_destroyed_while_current_elsewhere_is_destroyed_there(state):
    out = survive(state, """
        assert cu.cuInit(0) == 0
        ctx = C.c_void_p(); assert cu.cuCtxCreate_v2(C.byref(ctx), 0, 2) == 0
        step, res = threading.Event(), {}
        def other():
            assert cu.cuCtxSetCurrent(ctx) == 0
            step.wait(10)
            p, d, f = C.c_uint64(), C.c_int(), C.c_uint()
            res["other"] = [cu.cuMemAlloc_v2(C.byref(p), 4096), cu.cuCtxGetDevice(C.byref(d)),
                            cu.cuCtxGetFlags(C.byref(f)), cu.cuCtxSynchronize(), cu.cuCtxPushCurrent_v2(ctx)]
            popped = C.c_void_p(); res["pop"] = [cu.cuCtxPopCurrent_v2(C.byref(popped)), popped.value == ctx.value]
        t = threading.Thread(target=other); t.start()
        time.sleep(0.05)
        assert cu.cuCtxDestroy_v2(ctx) == 0
        step.set(); t.join(10)
        # A primary context released for the last time while current: the same answer, and the
        # next retain brings the same handle back to life, as the driver's one primary context.
        prim, again = C.c_void_p(), C.c_void_p()
        assert cu.cuDevicePrimaryCtxRetain(C.byref(prim), 0) == 0 and cu.cuCtxSetCurrent(prim) == 0
        assert cu.cuDevicePrimaryCtxRelease_v2(0) == 0
        p = C.c_uint64(); released = [cu.cuMemAlloc_v2(C.byref(p), 4096), cu.cuCtxPushCurrent_v2(prim)]
        assert cu.cuDevicePrimaryCtxRetain(C.byref(again), 0) == 0
        back = [again.value == prim.value, cu.cuMemAlloc_v2(C.byref(p), 4096)]
        print(json.dumps(dict(res, released=released, back=back)))
    """)
    assert out["other"] == [CONTEXT_IS_DESTROYED] * 4 + [INVALID_CONTEXT]
    assert out["pop"] == [0, True]
    assert out["released"] == [CONTEXT_IS_DESTROYED, INVALID_CONTEXT]
    assert out["back"] == [True, 0]


def test_a_forked_child_has_none_of_its_parents_contexts(state):
    out = survive(state, """
        assert cu.cuInit(0) == 0
        ctx, prim = C.c_void_p(), C.c_void_p()
        assert cu.cuCtxCreate_v2(C.byref(ctx), 0, 0) == 0
        assert cu.cuDevicePrimaryCtxRetain(C.byref(prim), 1) == 0
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            v = C.c_uint(); mine = C.c_void_p()
            res = [cu.cuCtxPushCurrent_v2(ctx), cu.cuCtxPushCurrent_v2(prim), cu.cuCtxDestroy_v2(ctx),
                   cu.cuCtxCreate_v2(C.byref(mine), 0, 0), cu.cuCtxGetApiVersion(mine, C.byref(v)),
                   cu.cuCtxDestroy_v2(mine)]
            os.write(wr, json.dumps(res).encode()); os._exit(0)
        os.close(wr)
        child = json.loads(os.read(rd, 4096)); os.waitpid(pid, 0)
        v = C.c_uint()
        print(json.dumps(dict(child=child, parent=[cu.cuCtxGetApiVersion(ctx, C.byref(v)), cu.cuCtxDestroy_v2(ctx)])))
    """)
    assert out["child"] == [INVALID_CONTEXT] * 3 + [0, 0, 0]
    assert out["parent"] == [0, 0]


_CUDA_DEF = re.compile(r"^CUresult (cu\w+)\(([^)]*)\)\s*\{", re.M)


def _cuda_calls() -> list[tuple[str, list[str]]]:
    """Every hand-written function of libcuda (shims/libcuda/*.c but the generated stubs) and the
    kinds of its parameters; a callback's (CUhostFn, CUstreamCallback) is a pointer."""
    out = []
    for source in sorted((ROOT / "shims" / "libcuda").glob("*.c")):
        if source.name == "cuda_gen.c":
            continue
        for name, params in _CUDA_DEF.findall(source.read_text()):
            kinds = []
            for p in filter(None, (x.strip() for x in " ".join(params.split()).split(","))):
                if p == "void":
                    continue
                callback = p.split()[-2].endswith(("Fn", "Callback"))
                kinds.append("ptr" if "*" in p or callback else "ctx" if p.startswith("CUcontext ") else "int")
            out.append((name, kinds))
    return out


def test_null_out_pointers_never_crash_cuda(state):
    """Every hand-written CUDA function, under a live context, with every pointer NULL and
    every number 0, 1 or huge: an error code, never a fault."""
    calls = _cuda_calls()
    assert len(calls) > 45
    out = survive(state, """
        calls = %r
        assert cu.cuInit(0) == 0
        ctx = C.c_void_p(); assert cu.cuCtxCreate_v2(C.byref(ctx), 0, 0) == 0
        results = {}
        for name, kinds in calls:
            if name.startswith(("cuCtxDestroy", "cuCtxPopCurrent")):
                continue  # they would take down the context this sweep runs under: below
            for n in (0, 1, 2**31 - 1, 2**32 - 1):
                args = [ctx if k == "ctx" else None if k == "ptr" else C.c_uint64(n) for k in kinds]
                results.setdefault(name, set()).add(getattr(cu, name)(*args))
        # NULL is "do not tell me" to a pop (the driver's contract), and no context to destroy.
        results["pop"] = {cu.cuCtxPopCurrent_v2(None), cu.cuCtxPopCurrent(None), cu.cuCtxDestroy_v2(None)}
        print(json.dumps({k: sorted(v) for k, v in results.items()}))
    """ % (calls,))
    # cuda.h: "A NULL may be passed in for *leastPriority or *greatestPriority"
    optional = ("cuCtxDestroy", "cuCtxPop", "cuCtxGetStreamPriorityRange")
    with_pointers = [name for name, kinds in calls if "ptr" in kinds and not name.startswith(optional)]
    assert len(with_pointers) > 30
    # Every one of them needs its pointer (none takes NULL for "none"), whatever the numbers.
    assert {n: out[n] for n in with_pointers if 0 in out[n]} == {}
    assert out["pop"] == [0, INVALID_CONTEXT]  # popped ctx, then the empty stack (either order)
