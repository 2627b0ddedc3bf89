"""The NVML shim's behaviour against a published state file, called through ctypes: init and
bad state files, handles, getters, faults and events."""
from __future__ import annotations

import ctypes as C
import os
import threading
import time
from pathlib import Path

import pytest

from helpers_nvml import INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, SUCCESS, UNINITIALIZED, Published
from mokkafs.model.commands import parse_line
from mokkafs.model.events import InjectEcc, InjectXid, NvLinkCommand, Pin, Reset

UNKNOWN = 999  # NVML_ERROR_UNKNOWN
from mokkafs.daemon.shm.layout import STATE_SIZE

pytestmark = pytest.mark.level("shims")

DRIVER_NOT_LOADED, TIMEOUT, GPU_IS_LOST, RM_MISMATCH, NO_DATA, VERSION_MISMATCH = 9, 10, 15, 18, 21, 25


class PciInfo(C.Structure):
    _fields_ = [("busIdLegacy", C.c_char * 16), ("domain", C.c_uint), ("bus", C.c_uint), ("device", C.c_uint),
                ("pciDeviceId", C.c_uint), ("pciSubSystemId", C.c_uint), ("busId", C.c_char * 32)]


class MemoryV2(C.Structure):
    _fields_ = [("version", C.c_uint), ("total", C.c_ulonglong), ("reserved", C.c_ulonglong),
                ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


class EventData(C.Structure):
    _fields_ = [("device", C.c_void_p), ("eventType", C.c_ulonglong), ("eventData", C.c_ulonglong),
                ("gpuInstanceId", C.c_uint), ("computeInstanceId", C.c_uint)]


def _stop(w) -> None:
    """End a consumer started with pipes, and close them."""
    w.kill()
    w.wait()
    w.stdin.close()
    w.stdout.close()


@pytest.fixture
def published(tmp_path, monkeypatch):
    pub = Published(tmp_path, "h100", gpus=4)
    monkeypatch.setenv("MOKKA_STATE", str(pub.path))
    yield pub
    pub.close()


def handle(nvml, i: int) -> C.c_void_p:
    h = C.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(i, C.byref(h)) == SUCCESS
    return h


def test_no_or_bad_state_file_is_an_error_code_never_a_crash(nvml, tmp_path, monkeypatch):
    path = tmp_path / "state"
    monkeypatch.setenv("MOKKA_STATE", str(path))
    assert nvml.nvmlInit_v2() == DRIVER_NOT_LOADED  # missing
    path.write_bytes(b"")
    assert nvml.nvmlInitWithFlags(0) == DRIVER_NOT_LOADED  # empty
    path.write_bytes(b"MKASTATE" + b"\x00" * 100)
    assert nvml.nvmlInit() == DRIVER_NOT_LOADED  # short: never mapped, so never SIGBUS
    os.mkdir(tmp_path / "dir")
    monkeypatch.setenv("MOKKA_STATE", str(tmp_path / "dir"))
    assert nvml.nvmlInit_v2() == DRIVER_NOT_LOADED  # not a regular file
    for name, head in [("magic", b"\xff" * 8 + (1).to_bytes(4, "little")),
                       ("version", (0x4554415453414B4D).to_bytes(8, "little") + (99).to_bytes(4, "little"))]:
        bad = tmp_path / name
        bad.write_bytes(head + b"\x00" * (STATE_SIZE - len(head)))
        monkeypatch.setenv("MOKKA_STATE", str(bad))
        assert nvml.nvmlInit_v2() == RM_MISMATCH, name
    count = C.c_uint()
    assert nvml.nvmlDeviceGetCount_v2(C.byref(count)) == UNINITIALIZED
    assert nvml.nvmlShutdown() == UNINITIALIZED


def test_errno_is_preserved(nvml, tmp_path, monkeypatch):
    monkeypatch.setenv("MOKKA_STATE", str(tmp_path / "missing"))
    C.set_errno(1234)
    lib = C.CDLL(nvml.lib._name, use_errno=True)
    C.set_errno(1234)
    assert lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    assert C.get_errno() == 1234


def test_init_refcount_counts_and_handles(nvml, published):
    assert nvml.nvmlInit_v2() == SUCCESS
    assert nvml.nvmlInitWithFlags(0) == SUCCESS
    assert nvml.nvmlShutdown() == SUCCESS
    count = C.c_uint()
    assert nvml.nvmlDeviceGetCount_v2(C.byref(count)) == SUCCESS and count.value == 4
    h = C.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(4, C.byref(h)) == INVALID_ARGUMENT
    ident = published.node.identities[2]
    h2 = handle(nvml, 2)
    for bus_id in (ident.bdf.nvml, ident.bdf.legacy, ident.bdf.sysfs, ident.bdf.nvml.lower()):
        assert nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), C.byref(h)) == SUCCESS, bus_id
        assert h.value == h2.value
    assert nvml.nvmlDeviceGetHandleByUUID(ident.uuid.encode(), C.byref(h)) == SUCCESS and h.value == h2.value
    assert nvml.nvmlDeviceGetHandleByUUID(b"GPU-nope", C.byref(h)) == NOT_FOUND
    assert nvml.nvmlDeviceGetHandleByPciBusId_v2(b"garbage", C.byref(h)) == INVALID_ARGUMENT
    assert nvml.nvmlDeviceGetName(C.c_void_p(12345), C.create_string_buffer(96), 96) == INVALID_ARGUMENT
    assert nvml.nvmlShutdown() == SUCCESS
    assert nvml.nvmlDeviceGetCount_v2(C.byref(count)) == UNINITIALIZED


def test_process_name_is_argv0_as_the_driver_reads_it(nvml, published):
    """nvmlSystemGetProcessName reads /proc/<pid>/cmdline as the real library does (one reader
    for it and nvidia-smi's lists, traced in 535's libnvidia-ml): argv[0] as started, not the
    15-byte comm; cropped to the buffer; NOT_FOUND for no process, NO_DATA for a zombie."""
    import subprocess

    argv0 = "/opt/jobs/a-training-job-with-a-long-name"
    child = subprocess.Popen(["bash", "-c", f"exec -a {argv0} sleep 30"])
    zombie = subprocess.Popen(["true"])
    try:
        assert nvml.nvmlInit_v2() == SUCCESS
        buf = C.create_string_buffer(256)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{child.pid}/comm").read_text() != "sleep\n" and time.monotonic() < deadline:
            time.sleep(0.01)  # until bash has exec'd
        assert nvml.nvmlSystemGetProcessName(child.pid, buf, 256) == SUCCESS
        assert buf.value == argv0.encode()  # comm would be "sleep"; the arguments follow the NUL
        small = C.create_string_buffer(b"x" * 12)
        assert nvml.nvmlSystemGetProcessName(child.pid, small, 8) == SUCCESS and small.value == argv0[:7].encode()
        assert nvml.nvmlSystemGetProcessName(child.pid, buf, 0) == INVALID_ARGUMENT
        assert nvml.nvmlSystemGetProcessName(child.pid, None, 256) == INVALID_ARGUMENT
        assert nvml.nvmlSystemGetProcessName(0x3FFFFFF0, buf, 256) == NOT_FOUND
        while not Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1].startswith("Z"):
            time.sleep(0.01)
        assert nvml.nvmlSystemGetProcessName(zombie.pid, buf, 256) == NO_DATA
        assert nvml.nvmlShutdown() == SUCCESS
        assert nvml.nvmlSystemGetProcessName(child.pid, buf, 256) == UNINITIALIZED
    finally:
        child.kill()
        child.wait()
        zombie.wait()


def test_getters_return_the_profile(nvml, published):
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 1)
    buf = C.create_string_buffer(96)
    assert nvml.nvmlDeviceGetName(h, buf, 96) == SUCCESS and buf.value == b"NVIDIA H100 80GB HBM3"
    assert nvml.nvmlDeviceGetName(h, buf, 5) == INSUFFICIENT_SIZE
    pci = PciInfo()
    assert nvml.nvmlDeviceGetPciInfo_v3(h, C.byref(pci)) == SUCCESS
    bdf = published.node.identities[1].bdf
    assert (pci.busId, pci.busIdLegacy, pci.bus) == (bdf.nvml.encode(), bdf.legacy.encode(), bdf.bus)
    assert pci.pciDeviceId == 0x233010DE and pci.pciSubSystemId == 0x16C110DE
    mem = MemoryV2(version=0x02000028)
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, C.byref(mem)) == SUCCESS
    assert (mem.total, mem.reserved, mem.used) == (81559 << 20, 480 << 20, 0)
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, C.byref(MemoryV2(version=1))) == VERSION_MISMATCH
    v = C.c_uint()
    assert nvml.nvmlDeviceGetTemperature(h, 0, C.byref(v)) == SUCCESS and v.value == 29
    assert nvml.nvmlDeviceGetTemperatureThreshold(h, 1, C.byref(v)) == SUCCESS and v.value == 89
    assert nvml.nvmlDeviceGetPowerManagementLimit(h, C.byref(v)) == SUCCESS and v.value == 700000
    assert nvml.nvmlDeviceGetMaxClockInfo(h, 2, C.byref(v)) == SUCCESS and v.value == 2619
    assert nvml.nvmlDeviceGetFanSpeed(h, C.byref(v)) == NOT_SUPPORTED  # H100 SXM has no fan
    major, minor = C.c_int(), C.c_int()
    assert nvml.nvmlDeviceGetCudaComputeCapability(h, C.byref(major), C.byref(minor)) == SUCCESS
    assert (major.value, minor.value) == (9, 0)
    cnt = C.c_uint(0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(h, C.byref(cnt), None) == SUCCESS and cnt.value == 0
    published.apply(Pin(gpu=1, signal="temperature", values=(83,)))
    assert nvml.nvmlDeviceGetTemperature(h, 0, C.byref(v)) == SUCCESS and v.value == 83


def test_faults_lost_gpu_and_counters(nvml, published):
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 3)
    n = C.c_ulonglong()
    published.apply(InjectEcc(gpu=3, kind="dbe", count=2))
    assert nvml.nvmlDeviceGetTotalEccErrors(h, 1, 0, C.byref(n)) == SUCCESS and n.value == 2
    rows = [C.c_uint() for _ in range(4)]
    assert nvml.nvmlDeviceGetRemappedRows(h, *map(C.byref, rows)) == SUCCESS
    assert rows[1].value == 1 and rows[2].value == 1
    published.apply(NvLinkCommand(gpu=3, link=2, action="down"))
    state = C.c_int()
    assert nvml.nvmlDeviceGetNvLinkState(h, 2, C.byref(state)) == SUCCESS and state.value == 0
    assert nvml.nvmlDeviceGetNvLinkState(h, 18, C.byref(state)) == INVALID_ARGUMENT
    published.apply(InjectXid(gpu=3, code=79))
    v = C.c_uint()
    assert nvml.nvmlDeviceGetTemperature(h, 0, C.byref(v)) == GPU_IS_LOST
    assert nvml.nvmlDeviceGetHandleByIndex_v2(3, C.byref(C.c_void_p())) == GPU_IS_LOST
    buf = C.create_string_buffer(96)
    assert nvml.nvmlDeviceGetUUID(h, buf, 96) == SUCCESS  # identity stays, for health checkers


def test_event_wait_wakes_on_the_write_and_every_set_gets_each_event(nvml, published):
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 3)
    sets = [C.c_void_p(), C.c_void_p()]
    for s in sets:
        assert nvml.nvmlEventSetCreate(C.byref(s)) == SUCCESS
        assert nvml.nvmlDeviceRegisterEvents(h, 0x8 | 0x2 | 0x1, s) == SUCCESS
    data = EventData()
    t0 = time.monotonic()
    assert nvml.nvmlEventSetWait_v2(sets[0], C.byref(data), 50) == TIMEOUT
    assert 0.045 < time.monotonic() - t0 < 0.5
    got: list[tuple[int, int, float]] = []

    def waiter(s):
        d = EventData()
        while nvml.nvmlEventSetWait_v2(s, C.byref(d), 5000) == SUCCESS:
            got.append((d.eventType, d.eventData, time.monotonic()))
            if d.eventType == 0x2:
                return

    threads = [threading.Thread(target=waiter, args=(s,)) for s in sets]
    for t in threads:
        t.start()
    time.sleep(0.2)  # both are blocked in FUTEX_WAIT now
    t_inject = time.monotonic()
    published.apply(InjectXid(gpu=3, code=48))
    for t in threads:
        t.join(10)
    assert sorted((t, d) for t, d, _ in got) == [(0x2, 0), (0x2, 0), (0x8, 48), (0x8, 48)]
    # woken by the write, not by a tick or the 5 s wait's end; bench/bench_nvml.c measures how fast
    assert max(at for _, _, at in got) - t_inject < 0.5
    assert nvml.nvmlEventSetWait_v2(sets[0], C.byref(data), 0) == TIMEOUT  # each event once
    for s in sets:
        assert nvml.nvmlEventSetFree(s) == SUCCESS


class PciInfoExt(C.Structure):
    _fields_ = [("version", C.c_uint), ("domain", C.c_uint), ("bus", C.c_uint), ("device", C.c_uint),
                ("pciDeviceId", C.c_uint), ("pciSubSystemId", C.c_uint), ("baseClass", C.c_uint),
                ("subClass", C.c_uint), ("busId", C.c_char * 32)]


def test_pci_class_and_gsp_firmware(nvml, published):
    """nvidia-smi -q reads the PCI class (PciInfoExt) and the GSP firmware version, which must be
    the driver version, as on a real node."""
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 1)
    ext = PciInfoExt(version=C.sizeof(PciInfoExt) | (1 << 24))
    assert nvml.nvmlDeviceGetPciInfoExt(h, C.byref(ext)) == SUCCESS
    assert (ext.baseClass, ext.subClass) == (0x03, 0x02)
    assert ext.pciDeviceId == 0x233010DE and ext.busId == b"00000000:1E:00.0"
    stale = PciInfoExt(version=1)
    assert nvml.nvmlDeviceGetPciInfoExt(h, C.byref(stale)) == VERSION_MISMATCH
    buf = C.create_string_buffer(64)
    assert nvml.nvmlDeviceGetGspFirmwareVersion(h, buf) == SUCCESS
    assert buf.value == b"580.105.08"
    enabled, default = C.c_uint(), C.c_uint()
    assert nvml.nvmlDeviceGetGspFirmwareMode(h, C.byref(enabled), C.byref(default)) == SUCCESS
    assert (enabled.value, default.value) == (1, 1)


def test_supported_clocks_as_the_board_lists_them(nvml, published):
    """nvmlDeviceGetSupportedMemoryClocks / GetSupportedGraphicsClocks: the H100 capture's lists
    (2619 and 1593 MHz memory, each with 1980 down to 345 MHz by 15), nvml.h's size protocol."""
    import xml.etree.ElementTree as ET

    from helpers_smi import CAPTURES

    real = ET.parse(CAPTURES / "nvidia-smi-q-x.h100.xml").getroot().find("gpu/supported_clocks")
    want = {int(m.findtext("value").split()[0]): [int(c.text.split()[0]) for c in m.findall("supported_graphics_clock")]
            for m in real.findall("supported_mem_clock")}
    assert nvml.nvmlInit_v2() == SUCCESS
    h, n = handle(nvml, 1), C.c_uint(1)
    mems = (C.c_uint * 8)()
    assert nvml.nvmlDeviceGetSupportedMemoryClocks(h, C.byref(n), mems) == INSUFFICIENT_SIZE and n.value == 2
    assert nvml.nvmlDeviceGetSupportedMemoryClocks(h, None, mems) == INVALID_ARGUMENT
    n.value = 8
    assert nvml.nvmlDeviceGetSupportedMemoryClocks(h, C.byref(n), mems) == SUCCESS
    assert list(mems[:n.value]) == list(want) == [2619, 1593]
    for mem, graphics in want.items():
        gr, n.value = (C.c_uint * 512)(), 0
        assert nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem, C.byref(n), gr) == INSUFFICIENT_SIZE
        assert n.value == len(graphics) == 110
        assert nvml.nvmlDeviceGetSupportedGraphicsClocks(h, mem, C.byref(n), gr) == SUCCESS
        assert list(gr[:n.value]) == graphics
    n.value = 512
    assert nvml.nvmlDeviceGetSupportedGraphicsClocks(h, 2600, C.byref(n), (C.c_uint * 512)()) == NOT_FOUND


def test_a_writer_that_died_mid_publish_costs_one_wait_not_one_per_call(nvml, published):
    """A daemon killed between the two seq increments leaves seq odd forever, the record it was
    writing half-written. The first read waits a bounded time; then every read answers UNKNOWN
    (never the torn value) without waiting again, and a writer that finishes ends it."""
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 0)
    st = published.publisher._st
    st.seq += 1  # as if the writer died mid-publish
    st.gpus[0].temp_gpu = 77  # half of what it was writing
    temp = C.c_uint(12345)
    assert nvml.nvmlDeviceGetTemperature(h, 0, C.byref(temp)) == UNKNOWN  # the one bounded wait
    t0 = time.perf_counter()
    for _ in range(200):
        assert nvml.nvmlDeviceGetTemperature(h, 0, C.byref(temp)) == UNKNOWN
    assert time.perf_counter() - t0 < 1.0  # 200 calls: microseconds each, not a 50 ms wait each (10 s)
    assert temp.value == 12345  # the torn value never reached the caller
    st.seq += 1  # the writer finished
    assert nvml.nvmlDeviceGetTemperature(h, 0, C.byref(temp)) == SUCCESS and temp.value == 77


WAITER = """
import sys, pynvml as p
p.nvmlInit()
s = p.nvmlEventSetCreate()
p.nvmlDeviceRegisterEvents(p.nvmlDeviceGetHandleByIndex(1), p.nvmlEventTypeXidCriticalError, s)
print("ready", flush=True)
sys.stdin.readline()  # the state file is truncated and restored meanwhile; we touch nothing
d = p.nvmlEventSetWait_v2(s, 5000)
print(d.eventData, flush=True)
"""


def test_an_event_set_made_before_a_truncation_still_gets_events(tmp_path, expect_log):
    """Restoring a truncated state file puts the event counters back where consumers' cursors
    are (the shim would also resynchronise a cursor ahead of the ring), and events flow on."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    import subprocess
    import sys

    from helpers_nvml import consumer_env

    expect_log(r"the state file was truncated under the daemon; restoring it")
    pub = Published(tmp_path, "h100", 2)
    try:
        for _ in range(3):
            pub.apply(InjectXid(0, 13))  # events before: the counters are not at 0
        w = subprocess.Popen([sys.executable, "-c", WAITER], env=consumer_env(pub.path), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        try:
            assert w.stdout.readline().strip() == "ready"
            os.truncate(pub.path, 0)
            pub.publisher.publish(pub.node)  # the daemon's next tick
            assert pub.path.stat().st_size == STATE_SIZE
            assert pub.publisher._st.event_head == 3  # the counters, not zeros
            w.stdin.write("\n")
            w.stdin.flush()
            time.sleep(0.2)
            pub.apply(InjectXid(1, 48))
            assert w.stdout.readline().strip() == "48"
        finally:
            _stop(w)
    finally:
        pub.close()


def test_a_board_with_a_fan_reports_the_profiles_speed(nvml, tmp_path, monkeypatch):
    """No shipped board has a fan; one that has reports the speed its profile gives, not a
    number the publisher picks."""
    import json

    from mokkafs.model.profiles import load_profile

    data = load_profile("l40s").model_dump(mode="json") | {"has_fan": True, "fan_speed_pct": 42}
    path = tmp_path / "fan.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    pub = Published(tmp_path, str(path), gpus=1)
    monkeypatch.setenv("MOKKA_STATE", str(pub.path))
    try:
        assert nvml.nvmlInit_v2() == SUCCESS
        h, v = handle(nvml, 0), C.c_uint()
        assert nvml.nvmlDeviceGetFanSpeed(h, C.byref(v)) == SUCCESS and v.value == 42
        assert nvml.nvmlDeviceGetNumFans(h, C.byref(v)) == SUCCESS and v.value == 1
    finally:
        pub.close()


# The system event API (nvml.h's nvmlSystemEventSet*), through ctypes: pynvml has no bindings for it.
SYSTEM_EVENTS = """
import ctypes as C, json, sys
class Create(C.Structure): _fields_ = [("version", C.c_uint), ("set", C.c_void_p)]
class Register(C.Structure): _fields_ = [("version", C.c_uint), ("eventTypes", C.c_ulonglong), ("set", C.c_void_p)]
class Data(C.Structure): _fields_ = [("eventType", C.c_ulonglong), ("gpuId", C.c_uint)]
class Wait(C.Structure):
    _fields_ = [("version", C.c_uint), ("timeoutms", C.c_uint), ("set", C.c_void_p), ("data", C.POINTER(Data)),
                ("dataSize", C.c_uint), ("numEvent", C.c_uint)]
def version(t): return C.sizeof(t) | 1 << 24  # NVML_STRUCT_VERSION(..., 1)
n = C.CDLL("libnvidia-ml.so.1")
assert n.nvmlInit_v2() == 0
out = {"early": n.nvmlSystemEventSetCreate(C.byref(Create(version(Create) + 1)))}
ds, h = C.c_void_p(), C.c_void_p()
assert n.nvmlEventSetCreate(C.byref(ds)) == 0 and n.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h)) == 0
assert n.nvmlDeviceRegisterEvents(h, C.c_ulonglong(0xB), ds) == 0  # SBE, DBE, Xid: bits the system types share
c = Create(version(Create))
assert n.nvmlSystemEventSetCreate(C.byref(c)) == 0
out["unsupported"] = n.nvmlSystemRegisterEvents(C.byref(Register(version(Register), 4, c.set)))
out["register"] = n.nvmlSystemRegisterEvents(C.byref(Register(version(Register), 3, c.set)))
# a system set is no device set, and a device set no system set
out["as_device_set"] = n.nvmlEventSetWait_v2(C.c_void_p(c.set), C.byref(C.create_string_buffer(64)), 0)
buf = (Data * 8)()
w = Wait(version(Wait), 0, c.set, buf, 8, 0)
out["empty"] = [n.nvmlSystemEventSetWait(C.byref(w)), w.numEvent]
print(json.dumps(out), flush=True)
sys.stdin.readline()  # the node resets now
got = []
while len(got) < 4:
    w = Wait(version(Wait), 5000, c.set, buf, 3, 0)
    r = n.nvmlSystemEventSetWait(C.byref(w))
    assert r == 0, r
    got += [[buf[k].eventType, buf[k].gpuId] for k in range(w.numEvent)]
w = Wait(version(Wait), 50, c.set, buf, 8, 0)
rest = n.nvmlSystemEventSetWait(C.byref(w))
class EventData(C.Structure):
    _fields_ = [("device", C.c_void_p), ("eventType", C.c_ulonglong), ("eventData", C.c_ulonglong),
                ("gi", C.c_uint), ("ci", C.c_uint)]
dev_events = []
e = EventData()
while n.nvmlEventSetWait_v2(C.c_void_p(ds.value), C.byref(e), 50) == 0:
    dev_events.append([e.eventType, e.eventData])
free = n.nvmlSystemEventSetFree(C.byref(Create(version(Create), c.set)))
again = n.nvmlSystemEventSetFree(C.byref(Create(version(Create), c.set)))
print(json.dumps({"events": got, "then": rest, "free": [free, again], "device": dev_events}), flush=True)
"""


def test_system_event_sets_report_a_driver_reload_as_unbind_then_bind(tmp_path):
    """nvmlSystemEventSetCreate/RegisterEvents/Wait/Free as nvml.h describes them: versioned
    requests, the two system event types (GPU driver unbind 0x1, bind 0x2) and no other, nothing
    before an event, then what a node reset (the driver reloaded) does, batched up to dataSize, each
    GPU named by its PCI location (domain << 16 | bus << 8 | device)."""
    import json
    import subprocess
    import sys

    from helpers_nvml import consumer_env

    pub = Published(tmp_path, "h100", 2)
    try:
        w = subprocess.Popen([sys.executable, "-c", SYSTEM_EVENTS], env=consumer_env(pub.path),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            first = json.loads(w.stdout.readline())
            assert first == {"early": 25, "unsupported": 3, "register": 0, "as_device_set": 2, "empty": [10, 0]}
            pub.apply(InjectXid(0, 13))  # device events are no system events
            pub.apply(Reset(None))
            w.stdin.write("\n")
            w.stdin.flush()
            second = json.loads(w.stdout.readline())
        finally:
            _stop(w)
    finally:
        pub.close()
    assert second == {"events": [[1, 0x1800], [1, 0x1E00], [2, 0x1800], [2, 0x1E00]], "then": 10, "free": [0, 2],
                      "device": [[8, 13]]}  # a device set sees the Xid, and no system event


class Memory(C.Structure):  # nvmlMemory_t (v1)
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


@pytest.mark.parametrize("driver, total, reserved", [("470.256.02", 40536, 0), ("535.261.03", 40960, 518)])
def test_memory_info_v1_is_the_branch_s(nvml, tmp_path, monkeypatch, driver, total, reserved):
    """nvmlDeviceGetMemoryInfo (v1) of an idle A100 40GB: at 470 what the driver holds back is
    left out of the total and nothing is used ("0MiB / 40536MiB" on a real 470 node); from R510
    the total is the board's and v1's used counts the reserved share. On both, total = used +
    free, and v2 says the same (its reserved apart), MIG mode too."""
    pub = Published(tmp_path, "a100", gpus=2, driver_version=driver)
    monkeypatch.setenv("MOKKA_STATE", str(pub.path))
    try:
        assert nvml.nvmlInit_v2() == SUCCESS
        mib = 1 << 20

        def both(i: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
            v1, v2 = Memory(), MemoryV2(version=0x02000028)
            assert nvml.nvmlDeviceGetMemoryInfo(handle(nvml, i), C.byref(v1)) == SUCCESS
            assert nvml.nvmlDeviceGetMemoryInfo_v2(handle(nvml, i), C.byref(v2)) == SUCCESS
            assert v1.total == v1.used + v1.free and (v1.total, v1.free) == (v2.total, v2.free)
            return (v1.total // mib, v1.used // mib, v1.free // mib), (v2.reserved // mib, v2.used // mib)

        assert both(0) == ((total, reserved, total - reserved), (reserved, 0))
        for line in ("gpu=1 mig enable", "gpu=1 mig create 9,14,19"):
            pub.apply(parse_line(line).event)
        assert both(1) == ((total, reserved + 52, total - reserved - 52), (reserved, 52))
    finally:
        pub.close()
