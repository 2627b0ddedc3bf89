"""NVML answers real boards give that go beyond the basic getters: addressing mode, GPM samples
and metrics, SRAM ECC status and the field values, through pynvml on a mounted node."""
from __future__ import annotations


import pytest

from helpers_nvml import consumer_env
from mokkafs.model.profiles import load_profile
from helpers import run_py_json
from mokkafs.model.schema import driver_branch

pytestmark = pytest.mark.level("shims")

pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")

PROFILES = ["a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4"]


@pytest.mark.parametrize("profile", PROFILES)
def test_addressing_mode_is_the_boards(node_factory, profile):
    node = node_factory(profile=profile, gpus=1)
    out = run_py_json(consumer_env(node.state_dir / "state"), """
        import json, ctypes, pynvml as p
        p.nvmlInit()
        h = p.nvmlDeviceGetHandleByIndex(0)
        bad = p.c_nvmlDeviceAddressingMode_t()
        bad.version = 0
        r = p._nvmlGetFunctionPointer("nvmlDeviceGetAddressingMode")(h, ctypes.byref(bad))
        print(json.dumps(dict(mode=p.nvmlDeviceGetAddressingMode(h), wrong_version=r)))
    """)
    # the board's from branch 570; None before (the h200 profile's 550.90.12: its capture says None)
    board = load_profile(profile)
    want = board.addressing_mode if driver_branch(board.default_composition().driver_version) >= 570 else "None"
    assert out["mode"] == {"None": 0, "HMM": 1, "ATS": 2}[want]
    assert out["wrong_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


GPM_PROBE = """
    import json, time, pynvml as p
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(1)
    out = dict(supported=p.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    if out["supported"]:
        s1, s2 = p.nvmlGpmSampleAlloc(), p.nvmlGpmSampleAlloc()
        p.nvmlGpmSampleGet(h, s1)
        time.sleep(0.15)
        p.nvmlGpmSampleGet(h, s2)
        ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 21, 30, 40, 50, 60, 61, 62, 63, 96, 97, 100, 248,
               0, 1000]
        mg = p.c_nvmlGpmMetricsGet_t()
        mg.version = p.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(ids)
        mg.sample1, mg.sample2 = s1, s2
        for i, m in enumerate(ids):
            mg.metrics[i].metricId = m
        p.nvmlGpmMetricsGet(mg)
        out["metrics"] = {m: [mg.metrics[i].nvmlReturn, mg.metrics[i].value] for i, m in enumerate(ids)}
        # the samples swapped (the second is older): refused, as is a freed sample
        mg.sample1, mg.sample2 = s2, s1
        try:
            p.nvmlGpmMetricsGet(mg)
            out["swapped"] = 0
        except p.NVMLError as e:
            out["swapped"] = e.value
        p.nvmlGpmSampleFree(s1)
        try:
            p.nvmlGpmSampleGet(h, s1)
            out["freed"] = 0
        except p.NVMLError as e:
            out["freed"] = e.value
        p.nvmlGpmSampleFree(s2)
        out["pcie"] = [p.nvmlDeviceGetPcieThroughput(h, 0), p.nvmlDeviceGetPcieThroughput(h, 1)]
    else:
        try:
            p.nvmlGpmSampleGet(h, p.nvmlGpmSampleAlloc())
        except p.NVMLError as e:
            out["sample"] = e.value
    out["util"] = p.nvmlDeviceGetUtilizationRates(h).gpu
    out["mem_util"] = p.nvmlDeviceGetUtilizationRates(h).memory
    print(json.dumps(out))
"""


@pytest.mark.parametrize("profile", PROFILES)
def test_gpm_metrics_follow_the_load(node_factory, profile):
    node = node_factory(profile=profile, gpus=2)
    assert node.write("gpu1/utilization", b"90 40\n") == 0
    out = run_py_json(consumer_env(node.state_dir / "state"), GPM_PROBE)
    prof = load_profile(profile)
    assert out["util"] == 90 and out["mem_util"] == 40
    if prof.architecture not in ("Hopper", "Blackwell"):
        assert out["supported"] == 0 and out["sample"] == 3  # NOT_SUPPORTED, as before Hopper
        return
    assert out["supported"] == 1
    m = {int(k): v for k, v in out["metrics"].items()}
    ok = {k: v[1] for k, v in m.items() if v[0] == 0}
    assert ok[1] == pytest.approx(90) and ok[2] == pytest.approx(90)  # graphics and SM activity
    assert 0 < ok[3] < 90 and 0 < ok[5] < 90 and ok[7] == pytest.approx(ok[5])  # occupancy, tensor, HMMA
    assert ok[6] == ok[8] == ok[9] == ok[11] == 0  # no double or integer tensor, no FP64 in the workload
    assert ok[10] == pytest.approx(40)  # DRAM bandwidth: the memory utilization
    assert ok[20] == pytest.approx(out["pcie"][0] * 1000 / 2**20) and ok[21] == pytest.approx(out["pcie"][1] * 1000 / 2**20)
    # no per-engine numbers, no C2C, no cumulative counters: unsupported, per metric
    for unsupported in (30, 40, 50, 100, 248):
        assert m[unsupported][0] == 3
    # the model carries no NVLink traffic
    for link_metric in (60, 61, 62, 63, 96, 97):
        assert m[link_metric][0] == 3
    assert m[0][0] == 2 and m[1000][0] == 2  # not a metric id: INVALID_ARGUMENT
    assert out["swapped"] == 2 and out["freed"] == 2


def test_gpm_metrics_at_idle_are_zero(node_factory):
    node = node_factory(profile="h100", gpus=2)
    out = run_py_json(consumer_env(node.state_dir / "state"), GPM_PROBE)
    ok = {int(k): v[1] for k, v in out["metrics"].items() if v[0] == 0}
    assert ok[1] == ok[2] == ok[5] == 0


SRAM_PROBE = """
    import json, ctypes, pynvml as p
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(0)
    st = p.c_nvmlEccSramErrorStatus_v1_t()
    r = p._nvmlGetFunctionPointer("nvmlDeviceGetSramEccErrorStatus")(h, ctypes.byref(st))
    fields = [n for n, _ in st._fields_ if n != "version"]
    print(json.dumps(dict(r=r, status={n: getattr(st, n) for n in fields})))
"""


@pytest.mark.parametrize("profile", PROFILES)
def test_sram_ecc_status_is_zero_on_a_healthy_board(node_factory, profile):
    node = node_factory(profile=profile, gpus=1)
    out = run_py_json(consumer_env(node.state_dir / "state"), SRAM_PROBE)
    prof = load_profile(profile)
    if prof.architecture == "Turing" or not prof.memory.ecc:
        assert out["r"] == 3
        return
    assert out["r"] == 0 and set(out["status"].values()) == {0}


def test_sram_ecc_status_counts_the_models_sram_and_unit_errors(node_factory):
    node = node_factory(profile="h100", gpus=1)
    for cmd in (b"sbe 3 sram\n", b"dbe 2 sram\n", b"dbe 4 l2\n", b"dbe 1 register\n", b"dbe 5 dram\n"):
        assert node.write("gpu0/inject_ecc", cmd) == 0
    out = run_py_json(consumer_env(node.state_dir / "state"), SRAM_PROBE)
    assert out["r"] == 0
    st = out["status"]
    assert st["volatileCor"] == st["aggregateCor"] == 3
    assert st["volatileUncSecDed"] == st["aggregateUncSecDed"] == 2
    assert st["volatileUncParity"] == st["aggregateUncParity"] == 0
    assert st["aggregateUncBucketL2"] == 4 and st["aggregateUncBucketSm"] == 1  # DRAM's 5 are not SRAM
    assert st["aggregateUncBucketPcie"] == st["aggregateUncBucketMcu"] == st["aggregateUncBucketOther"] == 0
    assert st["bThresholdExceeded"] == 0


FIELDS_PROBE = """
    import json, pynvml as p
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(0)

    def field(fid, scope=0):
        v = p.nvmlDeviceGetFieldValues(h, [(fid, scope)])[0]
        if v.nvmlReturn:
            return ["err", v.nvmlReturn]
        kind = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}[v.valueType]
        return getattr(v.value, kind)

    def opt(f, *a):
        try:
            return f(*a)
        except p.NVMLError as e:
            return ["err", e.value]

    links = opt(lambda: p.nvmlDeviceGetFieldValues(h, [91])[0].value.ullVal)
    nlinks = links if isinstance(links, int) else 0
    mode = p.nvmlDeviceGetEccMode(h)
    out = dict(
        ecc=[field(1), field(2)], ecc_getter=list(mode),
        tlimit=[field(f) for f in (193, 194, 195, 196)],
        thresholds=[opt(p.nvmlDeviceGetTemperatureThreshold, h, t) for t in (0, 1, 2, 3)],
        margin=opt(p.nvmlDeviceGetMarginTemperature, h),
        temp=[field(308), p.nvmlDeviceGetTemperature(h, 0)],
        per_link=[[field(f) for f in ids] for ids in ((47, 54, 33, 40), (109, 115, 97, 103))],
        dl=[[field(f, l) for f in (161, 162, 163)] for l in range(max(nlinks, 1))],
        counters=[[opt(p.nvmlDeviceGetNvLinkErrorCounter, h, l, c) for c in range(4)] for l in range(max(nlinks, 1))],
        switch_links=field(147),
        remote_types=[opt(p.nvmlDeviceGetNvLinkRemoteDeviceType, h, l) for l in range(nlinks)],
        recovery=[field(230), field(226)],
        nlinks=nlinks,
    )
    if out["ecc_getter"][0]:
        p.nvmlDeviceSetEccMode(h, 0)
        out["ecc_after_set"] = [field(1), field(2), list(p.nvmlDeviceGetEccMode(h))]
    print(json.dumps(out))
"""


@pytest.mark.parametrize("profile", PROFILES)
def test_field_values_equal_the_getters(node_factory, profile):
    node = node_factory(profile=profile, gpus=1)
    prof = load_profile(profile)
    if prof.nvlink.links:
        assert node.write("gpu0/nvlink", b"1 errors 5\n") == 0
        assert node.write("gpu0/nvlink", b"7 errors 2\n") == 0
    out = run_py_json(consumer_env(node.state_dir / "state"), FIELDS_PROBE)
    assert out["ecc"] == out["ecc_getter"]
    if "ecc_after_set" in out:  # ECC off is pending until a reset: field 2 is the pending mode
        assert out["ecc_after_set"] == [1, 0, [1, 0]]
    t = prof.thermal
    if t.tlimit_c is None:
        assert all(v == ["err", 3] for v in out["tlimit"])
    else:
        shutdown, slowdown, mem_max, gpu_max = out["thresholds"]
        assert out["tlimit"][0] == t.tlimit_c - shutdown and out["tlimit"][1] == t.tlimit_c - slowdown
        assert out["tlimit"][3] == t.tlimit_c - gpu_max
        assert out["tlimit"][2] == (0 if t.memory_max_operating_c is not None else ["err", 3])
    assert out["temp"][0] == out["temp"][1]
    n = out["nlinks"]
    assert n == prof.nvlink.links
    if not n:
        assert out["switch_links"] == ["err", 3]
        assert all(v == ["err", 3] for row in out["per_link"] for v in row)
        return
    # per-link fields of links 1 (L0-L5 ids) and 7 (L6-L11 ids), by counter: replay, recovery, flit, data
    assert out["per_link"][0] == out["counters"][1] and out["per_link"][1] == out["counters"][7]
    assert out["counters"][1] != [0] * 4 and out["counters"][7] != [0] * 4 and out["counters"][2] == [0] * 4
    for link in range(n):
        assert out["dl"][link] == out["counters"][link][:3]
    assert out["switch_links"] == sum(1 for r in out["remote_types"] if r == 2)
    assert out["recovery"] == [0, 0]


def test_field_recovery_action_follows_a_reset_needing_xid(node_factory):
    node = node_factory(profile="h100", gpus=1)
    assert node.write("gpu0/inject_xid", b"62\n") == 0
    out = run_py_json(consumer_env(node.state_dir / "state"), FIELDS_PROBE)
    assert out["recovery"] == [1, 1]  # NVML_GPU_RECOVERY_ACTION_GPU_RESET; reset required


PROC_UTIL_PROBE = """
    import json, sys, time, pynvml as p
    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(1)
    deadline = time.time() + 20
    while not p.nvmlDeviceGetComputeRunningProcesses(h) and time.time() < deadline:
        time.sleep(0.05)
    def opt(f, *a):
        try:
            return [[s.pid, s.smUtil, s.memUtil, s.timeStamp] for s in f(*a)]
        except p.NVMLError as e:
            return e.value
    first = opt(p.nvmlDeviceGetProcessUtilization, h, 0)
    later = opt(p.nvmlDeviceGetProcessUtilization, h, first[0][3] + 10**9) if isinstance(first, list) else None
    print(json.dumps(dict(first=first, later=later, idle_gpu=opt(p.nvmlDeviceGetProcessUtilization,
                                                                 p.nvmlDeviceGetHandleByIndex(0), 0))))
"""


def test_process_utilization_follows_the_load(node_factory):
    from test_cuda import start_holder

    node = node_factory(profile="h100", gpus=2)
    env_state = node.state_dir / "state"
    holder = start_holder(env_state, 1, 1 << 30, 60)
    try:
        idle = run_py_json(consumer_env(env_state), PROC_UTIL_PROBE)
        assert idle["first"] == 6  # NOT_FOUND: an idle GPU has no process with utilization
        assert node.write("gpu1/utilization", b"90 40\n") == 0
        out = run_py_json(consumer_env(env_state), PROC_UTIL_PROBE)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert [row[:3] for row in out["first"]] == [[holder.pid, 90, 40]]
    assert out["later"] == 6  # nothing newer than a timestamp in the future
    assert out["idle_gpu"] == 6  # no process on GPU 0
