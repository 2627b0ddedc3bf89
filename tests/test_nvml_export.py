"""Shims loaded by ctypes: nvmlInternalGetExportTable (the table NVIDIA's nvidia-smi asks for,
sized per driver branch) and the entries identified so far, each against a published state;
and the field values the real tool reads (per-link NVLink, per-scope power). The real binaries
themselves run in test_real_nvidia_smi.py."""
from __future__ import annotations

import ctypes as C
import os
from pathlib import Path

import pytest

from helpers_nvml import (INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, SUCCESS, UNINITIALIZED, UNKNOWN,
                          Published)
from mokkafs.model.events import NvLinkCommand, SetProcesses
from mokkafs.daemon.shm.layout import ffi

pytestmark = pytest.mark.level("shims")

SMI_TABLE = bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4")
SIZES = {"470.256.02": 0x6A8, "525.147.05": 0x770, "535.261.03": 0x7A8, "550.163.01": 0x7D8}


class FieldValue(C.Structure):
    _fields_ = [("fieldId", C.c_uint), ("scopeId", C.c_uint), ("timestamp", C.c_longlong),
                ("latencyUsec", C.c_longlong), ("valueType", C.c_uint), ("nvmlReturn", C.c_uint),
                ("value", C.c_ulonglong)]


@pytest.fixture
def node(tmp_path, monkeypatch):
    def make(profile: str = "h100", driver: str = "535.261.03") -> Published:
        pub = Published(tmp_path, profile, gpus=2, driver_version=driver)
        monkeypatch.setenv("MOKKA_STATE", str(pub.path))
        made.append(pub)
        return pub

    made: list[Published] = []
    yield make
    for pub in made:
        pub.publisher.close()


def table(nvml) -> C.Array:
    p = C.c_void_p()
    assert nvml.nvmlInternalGetExportTable(C.byref(p), SMI_TABLE) == SUCCESS
    size = C.c_uint64.from_address(p.value).value
    return (C.c_void_p * (size // 8)).from_address(p.value)


def entry(words, index: int, *argtypes):
    return C.CFUNCTYPE(C.c_int, *argtypes)(words[index])


def handle(nvml, i: int) -> C.c_void_p:
    h = C.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(i, C.byref(h)) == SUCCESS
    return h


@pytest.mark.parametrize("driver", sorted(SIZES))
def test_the_table_is_sized_as_the_branch_s_own(nvml, node, driver):
    node("a100", driver)  # 470 cannot drive Hopper (docs/profiles.md)
    assert nvml.nvmlInit_v2() == SUCCESS
    words = table(nvml)
    assert words[0] == SIZES[driver]
    # an entry nobody identified fails safely, whatever it is given
    assert entry(words, 26, C.c_void_p, C.c_void_p)(None, None) == NOT_SUPPORTED


def test_bad_requests(nvml, node):
    p = C.c_void_p()
    node("h100", "535.261.03")
    assert nvml.nvmlInternalGetExportTable(C.byref(p), SMI_TABLE) == UNINITIALIZED
    assert nvml.nvmlInit_v2() == SUCCESS
    assert nvml.nvmlInternalGetExportTable(None, SMI_TABLE) == INVALID_ARGUMENT
    assert nvml.nvmlInternalGetExportTable(C.byref(p), None) == INVALID_ARGUMENT
    assert nvml.nvmlInternalGetExportTable(C.byref(p), bytes(16)) == NOT_SUPPORTED
    assert nvml.nvmlInternalGetExportTable(C.byref(p), SMI_TABLE[:15] + b"\0") == NOT_SUPPORTED


def test_an_untraced_branch_gets_no_table(nvml, node):
    node("h100", "580.105.08")  # the table of 580 has not been traced: its binary prints a mismatch
    assert nvml.nvmlInit_v2() == SUCCESS
    p = C.c_void_p()
    assert nvml.nvmlInternalGetExportTable(C.byref(p), SMI_TABLE) == NOT_SUPPORTED


def test_identified_entries(nvml, node):
    pub = node("h100", "550.163.01")
    assert nvml.nvmlInit_v2() == SUCCESS
    words = table(nvml)
    h0 = handle(nvml, 0)
    out = C.c_void_p()
    by_index = entry(words, 81, C.c_uint, C.POINTER(C.c_void_p), C.c_uint)
    assert by_index(1, C.byref(out), 0x22) == SUCCESS and out.value == handle(nvml, 1).value
    assert by_index(2, C.byref(out), 0x22) == INVALID_ARGUMENT  # a 2-GPU node
    a, b = C.c_uint(7), C.c_uint(7)
    primary = entry(words, 20, C.c_void_p, C.POINTER(C.c_uint), C.POINTER(C.c_uint))
    assert primary(h0, C.byref(a), C.byref(b)) == SUCCESS and (a.value, b.value) == (0, 0)
    assert primary(C.c_void_p(h0.value + 1), C.byref(a), C.byref(b)) == INVALID_ARGUMENT
    assert entry(words, 72, C.c_void_p, C.POINTER(C.c_uint))(h0, C.byref(a)) == SUCCESS and a.value == 1
    assert entry(words, 108, C.c_void_p, C.POINTER(C.c_uint))(h0, C.byref(a)) == SUCCESS
    assert a.value == pub.publisher._st.gpus[0].power_enforced_limit > 0
    part = C.create_string_buffer(0x50)
    assert entry(words, 231, C.c_void_p, C.c_char_p, C.c_uint)(h0, part, 0x50) == SUCCESS
    assert part.value == ffi.string(pub.publisher._st.gpus[0].gpu_part_number) != b""
    assert entry(words, 231, C.c_void_p, C.c_char_p, C.c_uint)(h0, part, 3) == INSUFFICIENT_SIZE
    margin = C.c_int()
    assert entry(words, 240, C.c_void_p, C.POINTER(C.c_int))(h0, C.byref(margin)) == SUCCESS
    st = pub.publisher._st.gpus[0]
    assert margin.value == st.temp_tlimit - st.temp_gpu
    # 237 is the FRU part number in 550 (not identified: the model has none)
    assert entry(words, 237, C.c_void_p, C.c_char_p, C.c_uint)(h0, part, 0x14) == NOT_SUPPORTED
    # topo -m's cell: an HGX H100's GPUs reach each other through 18 NVLinks each (NV18 = 4 + 18)
    topo = entry(words, 23, C.c_char_p, C.c_char_p, C.POINTER(C.c_uint))
    bus = [ffi.string(pub.publisher._st.gpus[i].bus_id) for i in (0, 1)]
    assert topo(bus[0], bus[1], C.byref(a)) == SUCCESS and a.value == 22
    assert topo(bus[0], b"0000:99:00.0", C.byref(a)) == NOT_FOUND
    assert topo(b"not a bus id", bus[1], C.byref(a)) == NOT_FOUND
    assert topo(bus[0], bus[1], None) == INVALID_ARGUMENT
    # with every link of GPU 0 down the pair falls back to the PCIe level
    for link in range(18):
        pub.apply(NvLinkCommand(gpu=0, link=link, action="down"))
    assert topo(bus[0], bus[1], C.byref(a)) == SUCCESS and a.value <= 4


def test_process_list_entries(nvml, node):
    pub = node("h100", "535.261.03")
    pub.apply(SetProcesses(gpu=1, processes=((os.getpid(), 3 << 30),)))
    assert nvml.nvmlInit_v2() == SUCCESS
    words = table(nvml)
    compute = entry(words, 213, C.c_void_p, C.POINTER(C.c_uint), C.c_void_p)
    graphics = entry(words, 214, C.c_void_p, C.POINTER(C.c_uint), C.c_void_p)
    element = 32 + 4096  # 535's element: nvmlProcessDetail_v1_t's numbers, then the name
    buf = (C.c_ubyte * (4 * element))()
    n = C.c_uint(4)
    assert compute(handle(nvml, 1), C.byref(n), buf) == SUCCESS and n.value == 1
    pid, used = C.c_uint32.from_buffer(buf, 0).value, C.c_uint64.from_buffer(buf, 8).value
    gi, ci = C.c_uint32.from_buffer(buf, 16).value, C.c_uint32.from_buffer(buf, 20).value
    name = bytes(buf[32:32 + 4096]).split(b"\0")[0].decode()
    assert (pid, used, gi, ci) == (os.getpid(), 3 << 30, 0xFFFFFFFF, 0xFFFFFFFF)
    assert name == Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    n = C.c_uint(0)
    assert compute(handle(nvml, 1), C.byref(n), None) == INSUFFICIENT_SIZE and n.value == 1
    n = C.c_uint(4)
    assert compute(handle(nvml, 0), C.byref(n), buf) == SUCCESS and n.value == 0
    assert graphics(handle(nvml, 1), C.byref(n), buf) == SUCCESS and n.value == 0
    assert compute(handle(nvml, 1), None, buf) == INVALID_ARGUMENT


def test_the_525_table_has_the_tlimit_margin_at_237(nvml, node):
    pub = node("h100", "525.147.05")
    assert nvml.nvmlInit_v2() == SUCCESS
    margin = C.c_int()
    words = table(nvml)
    assert entry(words, 237, C.c_void_p, C.POINTER(C.c_int))(handle(nvml, 0), C.byref(margin)) == SUCCESS
    st = pub.publisher._st.gpus[0]
    assert margin.value == st.temp_tlimit - st.temp_gpu


@pytest.mark.parametrize("profile,driver,sparse_entry,volt,sparse", [
    ("h100", "550.163.01", 249, 685000, 0), ("h100", "535.261.03", 243, 685000, 0),
    ("a100-80gb", "470.256.02", None, 706250, None), ("l40s", "550.163.01", 249, 875000, None),
    ("t4", "550.163.01", 249, None, None)])
def test_voltage_and_sparse_mode_entries(nvml, node, profile, driver, sparse_entry, volt, sparse):
    """Entry 209 answers the board's graphics voltage in microvolts (every traced branch), 243 in
    535 and 249 in 550 its sparse operation mode (0 Disabled); a board without one NOT_SUPPORTED."""
    node(profile, driver)
    assert nvml.nvmlInit_v2() == SUCCESS
    words, h0, v = table(nvml), handle(nvml, 0), C.c_uint(7)
    voltage = entry(words, 209, C.c_void_p, C.POINTER(C.c_uint), C.c_uint)
    assert voltage(h0, C.byref(v), 1) == (NOT_SUPPORTED if volt is None else SUCCESS)
    assert volt is None or v.value == volt
    assert voltage(h0, None, 1) == INVALID_ARGUMENT
    assert voltage(C.c_void_p(h0.value + 1), C.byref(v), 1) == INVALID_ARGUMENT
    if sparse_entry is None:
        return
    mode = entry(words, sparse_entry, C.c_void_p, C.POINTER(C.c_uint))
    assert mode(h0, C.byref(v)) == (NOT_SUPPORTED if sparse is None else SUCCESS)
    assert sparse is None or v.value == sparse


def test_the_525_process_element_has_no_protected_memory_word(nvml, node):
    pub = node("h100", "525.147.05")
    pub.apply(SetProcesses(gpu=0, processes=((os.getpid(), 5 << 20),)))
    assert nvml.nvmlInit_v2() == SUCCESS
    compute = entry(table(nvml), 213, C.c_void_p, C.POINTER(C.c_uint), C.c_void_p)
    buf = (C.c_ubyte * (2 * (24 + 4096)))()
    n = C.c_uint(2)
    assert compute(handle(nvml, 0), C.byref(n), buf) == SUCCESS and n.value == 1
    assert bytes(buf[24:28]) == Path("/proc/self/cmdline").read_bytes()[:4]


def fields(nvml, h, *pairs) -> list[tuple[int, int]]:
    values = (FieldValue * len(pairs))()
    for v, (fid, scope) in zip(values, pairs):
        v.fieldId, v.scopeId = fid, scope
    assert nvml.nvmlDeviceGetFieldValues(h, len(pairs), values) == SUCCESS
    return [(v.nvmlReturn, v.value) for v in values]


def test_nvlink_fields_per_link(nvml, node):
    pub = node("h100", "535.261.03")
    pub.apply(NvLinkCommand(gpu=0, link=3, action="down"))
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 0)
    state, speed, version, l0, l11, common, past = 165, 164, 166, 84, 137, 90, 18
    assert fields(nvml, h, (state, 0), (state, 3), (state, past)) == [(SUCCESS, 1), (SUCCESS, 0), (NOT_SUPPORTED, 0)]
    assert fields(nvml, h, (speed, 0), (speed, 3)) == [(SUCCESS, 26562), (SUCCESS, 0)]
    assert fields(nvml, h, (version, 0)) == [(SUCCESS, 6)]  # NVML_NVLINK_VERSION_4_0
    assert fields(nvml, h, (l0, 0), (l11, 0), (common, 0)) == [(SUCCESS, 26562)] * 3


def test_nvlink_fields_without_nvlink(nvml, node):
    node("l40s", "535.261.03")
    assert nvml.nvmlInit_v2() == SUCCESS
    assert fields(nvml, handle(nvml, 0), (165, 0), (84, 0), (90, 0)) == [(NOT_SUPPORTED, 0)] * 3


def test_power_fields_by_scope(nvml, node):
    pub = node("h100", "535.261.03")
    assert nvml.nvmlInit_v2() == SUCCESS
    h = handle(nvml, 0)
    g = pub.publisher._st.gpus[0]
    gpu, module, memory = 0, 1, 2
    got = fields(nvml, h, (185, gpu), (186, gpu), (187, gpu), (188, gpu), (189, gpu), (190, gpu), (192, gpu))
    assert got == [(SUCCESS, g.power_usage), (SUCCESS, g.power_usage), (SUCCESS, g.power_min_limit),
                   (SUCCESS, g.power_max_limit), (SUCCESS, g.power_default_limit),
                   (SUCCESS, g.power_enforced_limit), (SUCCESS, g.power_limit)]
    assert [r for r, _ in fields(nvml, h, (186, module), (186, memory), (190, module))] == [NOT_SUPPORTED] * 3
    assert fields(nvml, h, (95, 0), (226, 0), (227, 0)) == [(SUCCESS, 0)] * 3


def test_no_average_power_before_ada(nvml, node):
    node("a100", "535.261.03")
    assert nvml.nvmlInit_v2() == SUCCESS
    assert fields(nvml, handle(nvml, 0), (185, 0))[0][0] == NOT_SUPPORTED


@pytest.mark.parametrize("driver, engines", [("535.261.03", 4), ("550.163.01", 6)])
def test_process_utilization_entry(nvml, node, driver, engines):
    """Entry 145 (pmon): one element per process, an 8-byte head and a 0x50-byte block per engine
    with the percentage at +0 and the pid at +8; idle: NOT_FOUND (the tool prints `-`)."""
    from mokkafs.model.events import Pin

    pub = node("h100", driver)
    pub.apply(SetProcesses(gpu=1, processes=((os.getpid(), 1 << 30),)))
    assert nvml.nvmlInit_v2() == SUCCESS
    util = entry(table(nvml), 145, C.c_void_p, C.c_ulonglong, C.POINTER(C.c_uint), C.POINTER(C.c_uint), C.c_void_p)
    stride = 8 + engines * 0x50
    buf, x, n = (C.c_ubyte * (100 * stride))(), C.c_uint(), C.c_uint(100)
    assert util(handle(nvml, 1), 0, C.byref(x), C.byref(n), buf) == NOT_FOUND and n.value == 0
    pub.apply(Pin(1, "utilization", (70, 30)))
    n = C.c_uint(100)
    assert util(handle(nvml, 1), 0, C.byref(x), C.byref(n), buf) == SUCCESS and n.value == 1
    blocks = [(C.c_uint32.from_buffer(buf, 8 + b * 0x50).value, C.c_uint32.from_buffer(buf, 16 + b * 0x50).value)
              for b in range(engines)]
    assert blocks == [(70, os.getpid()), (30, os.getpid())] + [(0, os.getpid())] * (engines - 2)
    n = C.c_uint(0)
    assert util(handle(nvml, 1), 0, C.byref(x), C.byref(n), buf) == INSUFFICIENT_SIZE and n.value == 1


def test_reset_entries(nvml, node):
    """Entry 169 (fabric state) answers 0; entry 168 (the reset) asks the node, which alone
    decides whether a GPU is in use (mounted: test_smi_setters): here no daemon answers, so a
    GPU's reset is UNKNOWN even with a process on it, and a handle that is not a GPU's is
    INVALID_ARGUMENT, each in its result slot."""
    pub = node("h100", "535.261.03")
    pub.apply(SetProcesses(gpu=1, processes=((os.getpid(), 1 << 30),)))
    assert nvml.nvmlInit_v2() == SUCCESS
    words = table(nvml)
    state = C.c_uint(7)
    assert entry(words, 169, C.POINTER(C.c_uint))(C.byref(state)) == SUCCESS and state.value == 0
    reset = entry(words, 168, C.c_uint, C.POINTER(C.c_void_p), C.POINTER(C.c_int))
    devices = (C.c_void_p * 2)(handle(nvml, 1).value, 12345)
    results = (C.c_int * 2)(-1, -1)
    assert reset(2, devices, results) == UNKNOWN
    assert list(results) == [UNKNOWN, INVALID_ARGUMENT]
    assert reset(1, None, results) == INVALID_ARGUMENT
