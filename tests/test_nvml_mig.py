"""NVML's MIG calls against a mounted node (docs/mig.md, docs/nvml.md): pynvml walks the API end to
end as the issue's Done-when says, refusals come back as the driver's errors, a user other than
root gets NO_PERMISSION from every write and reads what root reads, the layout survives a daemon
restart, and a board without MIG refuses every MIG call."""
from __future__ import annotations

import os
import textwrap

import pytest

from conftest import force_unmount, world_readable_node
from mokkafs.model.mig import mig_uuid
from mokkafs.model.profiles import load_profile
from helpers import mount_env, run_py_json
from test_setters import SETTERS

pytestmark = pytest.mark.level("shims")

pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")

NVML_INVALID_ARGUMENT, NVML_NOT_SUPPORTED, NVML_NO_PERMISSION, NVML_NOT_FOUND = 2, 3, 4, 6
NVML_IN_USE, NVML_INSUFFICIENT_RESOURCES = 19, 23

MIG = textwrap.dedent(SETTERS) + textwrap.dedent("""
    def gi_profile(h, index):
        info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
        return info

    def walk(h):
        \"\"\"Every MIG device of parent h, as the device plugin lists them.\"\"\"
        out = []
        for k in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except n.NVMLError as e:
                assert e.value == n.NVML_ERROR_NOT_FOUND
                continue
            mem = n.nvmlDeviceGetMemoryInfo(m)
            a = n.nvmlDeviceGetAttributes_v2(m)
            parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            out.append(dict(
                index=k, mig=n.nvmlDeviceIsMigDeviceHandle(m), name=n.nvmlDeviceGetName(m),
                uuid=n.nvmlDeviceGetUUID(m), gi=n.nvmlDeviceGetGpuInstanceId(m),
                ci=n.nvmlDeviceGetComputeInstanceId(m), total_mib=mem.total >> 20, used=mem.used,
                sms=a.multiprocessorCount, gi_slices=a.gpuInstanceSliceCount, ci_slices=a.computeInstanceSliceCount,
                ce=a.sharedCopyEngineCount, dec=a.sharedDecoderCount, mem_mb=a.memorySizeMB,
                parent=n.nvmlDeviceGetUUID(parent), by_uuid=n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByUUID(
                    n.nvmlDeviceGetUUID(m)))))
        return out
""")


def mig_script(body: str) -> str:
    return MIG + textwrap.dedent(body)


def test_pynvml_walks_the_mig_api_end_to_end(node_factory):
    node = node_factory(gpus=2)
    env = mount_env(node)
    out = run_py_json(env, mig_script("""
        h = n.nvmlDeviceGetHandleByIndex(0)
        before = n.nvmlDeviceGetMigMode(h)
        # MIG off: v1 answers on a board with MIG (every index the MIG-on loop below finds, the same
        # values), the versioned calls need MIG on (docs/mig.md, "Profile info with MIG off")
        def v1(index):
            i = n.nvmlDeviceGetGpuInstanceProfileInfo(h, index, version=1)
            return [i.id, i.sliceCount, i.instanceCount, i.multiprocessorCount, i.memorySizeMB]
        v1_before = {}
        for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
            try:
                v1_before[index] = v1(index)
            except n.NVMLError as e:
                v1_before[index] = e.value
        profile_before = [code(n.nvmlDeviceGetGpuInstanceProfileInfo, h, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1),
                          code(n.nvmlDeviceGetGpuInstanceProfileInfo, h, n.NVML_GPU_INSTANCE_PROFILE_1_SLICE),  # V
                          code(n.nvmlDeviceGetGpuInstanceProfileInfoById, h, 19)]
        status = n.nvmlDeviceSetMigMode(h, n.NVML_DEVICE_MIG_ENABLE)
        status = getattr(status, "value", status)  # pynvml returns the activation status as a c_uint
        after = n.nvmlDeviceGetMigMode(h)
        profiles = {}
        for index in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, index)
            except n.NVMLError as e:
                assert e.value == n.NVML_ERROR_NOT_SUPPORTED, e
                continue
            profiles[info.name.decode() if isinstance(info.name, bytes) else info.name] = dict(
                index=index, id=info.id, slices=info.sliceCount, instances=info.instanceCount,
                sms=info.multiprocessorCount, mib=info.memorySizeMB,
                free=n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id))
        ids = {name: p["id"] for name, p in profiles.items()}
        placements = (n.c_nvmlGpuInstancePlacement_t * 8)()
        count = n.c_uint(8)
        n.nvmlDeviceGetGpuInstancePossiblePlacements(h, ids["MIG 3g.40gb"], placements, n.byref(count))
        placements_3g = [(placements[k].start, placements[k].size) for k in range(count.value)]

        gis = []
        for name in ("MIG 3g.40gb", "MIG 2g.20gb", "MIG 1g.10gb", "MIG 1g.10gb"):
            gi = n.nvmlDeviceCreateGpuInstance(h, ids[name])
            info = n.nvmlGpuInstanceGetInfo(gi)
            ci_profile = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, {
                "MIG 3g.40gb": n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, "MIG 2g.20gb": n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
                "MIG 1g.10gb": n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE}[name], n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            ci = n.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            ci_info = n.nvmlComputeInstanceGetInfo(ci)
            gis.append(dict(id=info.id, profile=info.profileId, placement=[info.placement.start, info.placement.size],
                            ci=ci_info.id, ci_profile=ci_info.profileId, ci_name=ci_profile.name.decode()
                            if isinstance(ci_profile.name, bytes) else ci_profile.name,
                            same=n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(h, info.id)).id))
        listed = walk(h)
        full = code(n.nvmlDeviceCreateGpuInstance, h, ids["MIG 1g.10gb"])
        conflict = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, ids["MIG 4g.40gb"],
                        n.byref(n.c_nvmlGpuInstancePlacement_t(0, 4)))
        bad_place = code(n.nvmlDeviceCreateGpuInstanceWithPlacement, h, ids["MIG 3g.40gb"],
                         n.byref(n.c_nvmlGpuInstancePlacement_t(2, 4)))
        gi0 = n.nvmlDeviceGetGpuInstanceById(h, gis[0]["id"])
        busy = code(n.nvmlGpuInstanceDestroy, gi0)
        missing = code(n.nvmlDeviceGetGpuInstanceById, h, 13)
        util = code(n.nvmlDeviceGetUtilizationRates, h)

        # destroy: compute instances, then GPU instances, by profile as mig-parted does
        for name in ("MIG 3g.40gb", "MIG 2g.20gb", "MIG 1g.10gb"):
            instances = (n.c_nvmlGpuInstance_t * 7)()
            count = n.c_uint(0)
            n.nvmlDeviceGetGpuInstances(h, ids[name], instances, n.byref(count))
            for k in range(count.value):
                gi = instances[k]
                for ci_index in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                    try:
                        p = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_index, 0)
                    except n.NVMLError:
                        continue
                    cis = (n.c_nvmlComputeInstance_t * 8)()
                    c = n.c_uint(0)
                    n.nvmlGpuInstanceGetComputeInstances(gi, p.id, cis, n.byref(c))
                    for j in range(c.value):
                        n.nvmlComputeInstanceDestroy(cis[j])
                n.nvmlGpuInstanceDestroy(gi)
        gone = walk(h)
        stale = code(n.nvmlDeviceGetName, n.nvmlDeviceGetHandleByUUID(listed[0]["uuid"])) if False else \\
            code(n.nvmlDeviceGetHandleByUUID, listed[0]["uuid"])
        v1_after = {index: v1(index) for index, r in v1_before.items() if not isinstance(r, int)}
        print(json.dumps(dict(before=list(before), profile_before=profile_before, v1_before=v1_before, v1_after=v1_after, status=status, after=list(after),
                              profiles=profiles, placements_3g=placements_3g, gis=gis, listed=listed, full=full,
                              conflict=conflict, bad_place=bad_place, busy=busy, missing=missing, util=util,
                              gone=gone, stale=stale), default=lambda o: o.value))  # pynvml returns some as c_uint
    """))
    assert out["before"] == [0, 0] and out["profile_before"] == [0, NVML_NOT_SUPPORTED, NVML_NOT_SUPPORTED]
    v1_before = {int(k): v for k, v in out["v1_before"].items()}
    assert v1_before[0] == [19, 1, 7, 16, 9984]  # 1g.10gb, as MIG on reports it below
    assert v1_before[len(v1_before) - 1] == NVML_INVALID_ARGUMENT  # past NVML_GPU_INSTANCE_PROFILE_COUNT
    assert {k for k, v in v1_before.items() if isinstance(v, list)} == {p["index"] for p in out["profiles"].values()}
    assert {int(k): v for k, v in out["v1_after"].items()} == {k: v for k, v in v1_before.items() if isinstance(v, list)}
    assert out["status"] == 0 and out["after"] == [1, 1]
    assert out["profiles"]["MIG 1g.10gb"] == dict(index=0, id=19, slices=1, instances=7, sms=16, mib=9984, free=7)
    assert out["profiles"]["MIG 3g.40gb"]["id"] == 9 and out["profiles"]["MIG 7g.80gb"]["free"] == 1
    assert sorted(out["profiles"]) == sorted(f"MIG {g.name}" for g in load_profile("h100").mig.gpu_instance_profiles)
    assert out["placements_3g"] == [[0, 4], [4, 4]]
    assert out["gis"] == [
        dict(id=2, profile=9, placement=[4, 4], ci=0, ci_profile=2, ci_name="MIG 3g.40gb", same=2),
        dict(id=3, profile=14, placement=[0, 2], ci=0, ci_profile=1, ci_name="MIG 2g.20gb", same=3),
        dict(id=9, profile=19, placement=[2, 1], ci=0, ci_profile=0, ci_name="MIG 1g.10gb", same=9),
        dict(id=10, profile=19, placement=[3, 1], ci=0, ci_profile=0, ci_name="MIG 1g.10gb", same=10),
    ]
    listed = out["listed"]
    assert [(d["index"], d["gi"], d["ci"], d["name"]) for d in listed] == [
        (0, 2, 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb"), (1, 3, 0, "NVIDIA H100 80GB HBM3 MIG 2g.20gb"),
        (2, 9, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb"), (3, 10, 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb")]
    assert [d["total_mib"] for d in listed] == [40448, 20096, 9984, 9984]
    assert [(d["sms"], d["gi_slices"], d["ci_slices"], d["ce"], d["dec"], d["mem_mb"]) for d in listed] == [
        (60, 3, 3, 3, 3, 40448), (32, 2, 2, 2, 2, 20096), (16, 1, 1, 1, 1, 9984), (16, 1, 1, 1, 1, 9984)]
    assert all(d["mig"] == 1 and d["by_uuid"] == d["name"] for d in listed)
    # nothing runs: each instance shows what it holds at idle (26, 17, 9, 9 MiB: docs/mig.md)
    assert [d["used"] >> 20 for d in listed] == [26, 17, 9, 9]
    assert all(d["uuid"].startswith("MIG-") and len(d["uuid"]) == 40 for d in listed)
    assert len({d["parent"] for d in listed}) == 1 and listed[0]["parent"].startswith("GPU-")
    assert [d["uuid"] for d in listed] == [mig_uuid(d["parent"], d["gi"], d["ci"]) for d in listed], "the model's"
    assert out["full"] == NVML_INSUFFICIENT_RESOURCES
    assert out["conflict"] == NVML_INSUFFICIENT_RESOURCES  # 4g.40gb at 0:4 over the 2g and 1g instances
    assert out["bad_place"] == NVML_INVALID_ARGUMENT  # 3g.40gb does not start at 2
    assert out["busy"] == NVML_IN_USE  # a GPU instance with a compute instance
    assert out["missing"] == NVML_NOT_FOUND
    assert out["util"] == NVML_NOT_SUPPORTED  # utilization of a MIG-enabled parent
    assert out["gone"] == [] and out["stale"] == NVML_NOT_FOUND
    assert node.read("gpu0/mig") == "mode: enabled\npending: enabled\n"
    for pattern in (r"ctl\.sock: insufficient_resources from uid 0", r"ctl\.sock: in_use from uid 0",
                    r"ctl\.sock: invalid_argument from uid 0"):
        node.expect_warning(pattern)


def test_compute_instances_with_placement_capacity_and_their_own_names(node_factory):
    node = node_factory(gpus=1)
    out = run_py_json(mount_env(node), mig_script("""
        h = n.nvmlDeviceGetHandleByIndex(0)
        n.nvmlDeviceSetMigMode(h, 1)
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, n.byref(n.c_nvmlGpuInstancePlacement_t(0, 4)))
        one = n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        p = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, one, 0)
        placements = (n.c_nvmlComputeInstancePlacement_t * 8)()
        count = n.c_uint(8)
        n.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, p.id, placements, n.byref(count))
        possible = [(placements[k].start, placements[k].size) for k in range(count.value)]
        free = [n.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, p.id)]
        ci = n.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, p.id, n.byref(n.c_nvmlComputeInstancePlacement_t(2, 1)))
        free.append(n.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, p.id))
        second = n.nvmlGpuInstanceCreateComputeInstance(gi, p.id)
        info = [n.nvmlComputeInstanceGetInfo(c) for c in (ci, second)]
        overlap = code(n.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, p.id,
                       n.byref(n.c_nvmlComputeInstancePlacement_t(2, 1)))
        wrong_size = code(n.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, p.id,
                          n.byref(n.c_nvmlComputeInstancePlacement_t(1, 2)))
        unknown = code(n.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, n.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE, 0)
        devices = walk(h)
        by_id = n.nvmlComputeInstanceGetInfo(n.nvmlGpuInstanceGetComputeInstanceById(gi, 0)).placement.start
        print(json.dumps(dict(name=p.name.decode() if isinstance(p.name, bytes) else p.name, possible=possible,
                              free=free, info=[(i.id, i.profileId, i.placement.start, i.placement.size) for i in info],
                              overlap=overlap, wrong_size=wrong_size, unknown=unknown, by_id=by_id,
                              devices=[(d["gi"], d["ci"], d["name"], d["sms"], d["ci_slices"], d["total_mib"])
                                       for d in devices]), default=lambda o: o.value))
    """))
    assert out["name"] == "MIG 1c.3g.40gb" and out["possible"] == [[0, 1], [1, 1], [2, 1]]
    assert out["free"] == [3, 2]
    assert out["info"] == [[0, 0, 2, 1], [1, 0, 0, 1]]  # the lowest free placement, the lowest free id
    assert (out["overlap"], out["wrong_size"], out["unknown"]) == (
        NVML_INSUFFICIENT_RESOURCES, NVML_INVALID_ARGUMENT, NVML_NOT_SUPPORTED)
    assert out["by_id"] == 2
    assert out["devices"] == [[1, 0, "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 16, 1, 40448],
                              [1, 1, "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", 16, 1, 40448]]
    node.expect_warning(r"ctl\.sock: insufficient_resources from uid 0")


def test_processes_on_a_mig_device_are_listed_there_and_on_its_gpu_with_their_instance(tmp_path):
    from helpers_nvml import Published, consumer_env
    from mokkafs.model.commands import parse_line
    from mokkafs.model.events import SetLost, SetProcesses

    p = Published(tmp_path, "h100", 2)
    try:
        for line in ("gpu=1 mig enable", "gpu=1 mig create 3g.40gb,1g.10gb"):
            p.apply(parse_line(line).event)
        p.apply(SetProcesses(1, ((55, 3 << 20), (56, 1 << 20)), instances=((55, 2, 0),)))
        code = mig_script("""
            h = n.nvmlDeviceGetHandleByIndex(1)
            def procs(d):
                return sorted((q.pid, q.usedGpuMemory, q.gpuInstanceId, q.computeInstanceId)
                              for q in n.nvmlDeviceGetComputeRunningProcesses(d))
            devices = [n.nvmlDeviceGetMigDeviceHandleByIndex(h, k) for k in range(2)]
            print(json.dumps(dict(parent=procs(h), mig=[procs(d) for d in devices],
                                  used=[n.nvmlDeviceGetMemoryInfo(d).used for d in devices],
                                  ecc=list(n.nvmlDeviceGetEccMode(devices[0])),
                                  ecc_counter=code(n.nvmlDeviceGetTotalEccErrors, devices[0], 0, 0),
                                  power=code(n.nvmlDeviceGetPowerUsage, devices[0]),
                                  index=code(n.nvmlDeviceGetMigDeviceHandleByIndex, h, 2),
                                  past=code(n.nvmlDeviceGetMigDeviceHandleByIndex, h, 7),
                                  of_mig=code(n.nvmlDeviceGetMigDeviceHandleByIndex, devices[0], 0),
                                  gi_of_gpu=code(n.nvmlDeviceGetGpuInstanceId, h),
                                  parent_of_gpu=code(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, h),
                                  uuids=[n.nvmlDeviceGetUUID(d) for d in devices]), default=lambda o: o.value))
        """)
        out = run_py_json(consumer_env(p.path), code)
        none = 0xFFFFFFFF
        assert out["parent"] == [[55, 3 << 20, 2, 0], [56, 1 << 20, none, none]]
        assert out["mig"] == [[[55, 3 << 20, 2, 0]], []]
        assert out["used"] == [(3 + 26) << 20, 9 << 20]  # the process's 3 MiB over each instance's idle bytes
        assert out["ecc"] == [1, 1] and out["ecc_counter"] == NVML_NOT_SUPPORTED and out["power"] == NVML_NOT_SUPPORTED
        assert (out["index"], out["past"], out["of_mig"]) == (NVML_NOT_FOUND, NVML_INVALID_ARGUMENT, NVML_NOT_SUPPORTED)
        assert (out["gi_of_gpu"], out["parent_of_gpu"]) == (NVML_NOT_SUPPORTED, NVML_INVALID_ARGUMENT)

        p.apply(SetLost(1, True))  # the GPU takes its instances with it
        lost = run_py_json(consumer_env(p.path), mig_script(f"""
            print(json.dumps([code(n.nvmlDeviceGetHandleByUUID, u) for u in {out["uuids"]!r}]))
        """))
        assert lost == [NVML_NOT_FOUND, NVML_NOT_FOUND]
    finally:
        p.close()


def test_a_board_without_mig_refuses_every_mig_call(tmp_path):
    from helpers_nvml import Published, consumer_env

    p = Published(tmp_path, "l40s", 1)
    try:
        out = run_py_json(consumer_env(p.path), mig_script("""
            h = n.nvmlDeviceGetHandleByIndex(0)
            placements = (n.c_nvmlGpuInstancePlacement_t * 8)()
            count = n.c_uint(8)
            print(json.dumps([code(n.nvmlDeviceGetMigMode, h), code(n.nvmlDeviceSetMigMode, h, 1),
                              code(n.nvmlDeviceGetGpuInstanceProfileInfo, h, 0),
                              code(n.nvmlDeviceGetGpuInstanceProfileInfo, h, 0, 1),
                              code(n.nvmlDeviceGetGpuInstancePossiblePlacements, h, 19, placements, n.byref(count)),
                              code(n.nvmlDeviceCreateGpuInstance, h, 19),
                              code(n.nvmlDeviceGetGpuInstanceById, h, 0),
                              code(n.nvmlDeviceGetMigDeviceHandleByIndex, h, 0),
                              n.nvmlDeviceGetMaxMigDeviceCount(h), n.nvmlDeviceIsMigDeviceHandle(h)],
                             default=lambda o: o.value))
        """))
        assert out == [NVML_NOT_SUPPORTED] * 8 + [0, 0]
    finally:
        p.close()


@pytest.fixture
def open_node():
    """A mounted 2 x H100 node under a directory every user may enter (pytest's tmp_path is 0700)."""
    yield from world_readable_node("h100", 2)


def test_nobody_gets_no_permission_from_every_mig_write_and_reads_what_root_reads(open_node):
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    node = open_node
    node.expect_warning(r"ctl\.sock: no_permission from uid 65534")
    assert node.cli("inject", "--root", str(node.mnt), "1", "mig", "enable").returncode == 0
    assert node.cli("inject", "--root", str(node.mnt), "1", "mig", "create", "3g.40gb").returncode == 0
    before = node.read("gpu1/mig")
    reads = """
        h = n.nvmlDeviceGetHandleByIndex(1)
        gi = n.nvmlDeviceGetGpuInstanceById(h, 2)
        ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
        seen = dict(devices=walk(h), mode=list(n.nvmlDeviceGetMigMode(h)),
                    free=n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19))
    """
    writes = """
        seen["codes"] = [code(n.nvmlDeviceSetMigMode, h, 0), code(n.nvmlDeviceSetMigMode, n.nvmlDeviceGetHandleByIndex(0), 1),
                         code(n.nvmlDeviceCreateGpuInstance, h, 19), code(n.nvmlGpuInstanceCreateComputeInstance, gi, 0),
                         code(n.nvmlComputeInstanceDestroy, ci), code(n.nvmlGpuInstanceDestroy, gi)]
    """
    show = "print(json.dumps(seen, default=lambda o: o.value))"
    reads, writes = textwrap.dedent(reads), textwrap.dedent(writes)
    code = f"import sys; sys.path.insert(0, {os.path.dirname(pynvml.__file__)!r})\n" + mig_script(reads + writes + show)
    nobody = run_py_json(mount_env(node), code, python="/usr/bin/python3", user=True)
    assert nobody["codes"] == [NVML_NO_PERMISSION] * 6
    assert node.read("gpu1/mig") == before
    root = run_py_json(mount_env(node), mig_script(reads + show))
    assert nobody["devices"] == root["devices"] and len(root["devices"]) == 1
    assert nobody["mode"] == root["mode"] == [1, 1] and nobody["free"] == root["free"] == 4


def test_a_layout_made_through_nvml_survives_a_daemon_restart_and_a_kill(node_factory):
    node = node_factory(gpus=2)
    env = mount_env(node)
    make = mig_script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        n.nvmlDeviceSetMigMode(h, 1)
        for profile in (9, 14, 19, 19):
            gi = n.nvmlDeviceCreateGpuInstance(h, profile)
            n.nvmlGpuInstanceCreateComputeInstance(gi, n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, {9: 2, 14: 1, 19: 0}[profile], 0).id)
        print(json.dumps(walk(h), default=lambda o: o.value))
    """)
    read = mig_script("print(json.dumps(walk(n.nvmlDeviceGetHandleByIndex(1)), default=lambda o: o.value))")
    made = run_py_json(env, make)
    assert len(made) == 4
    node.umount()
    assert node.mount().returncode == 0
    assert run_py_json(env, read) == made
    node.kill9()
    force_unmount(node.mnt)
    assert node.mount().returncode == 0
    assert run_py_json(env, read) == made


def test_an_xid_naming_an_instance_reaches_nvml_events_and_the_kernel_log_with_it(node_factory):
    node = node_factory(gpus=1)
    assert node.cli("inject", "--root", str(node.mnt), "0", "mig", "enable").returncode == 0
    assert node.cli("inject", "--root", str(node.mnt), "0", "mig", "create", "3g.40gb").returncode == 0
    out = run_py_json(mount_env(node), mig_script(f"""
        h = n.nvmlDeviceGetHandleByIndex(0)
        s = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
        with open({str(node.mnt / "gpu0/inject_xid")!r}, "w") as f:
            f.write("31 gi=2 ci=0\\n")
        e = n.nvmlEventSetWait_v2(s, 5000)
        print(json.dumps([e.eventData, e.gpuInstanceId, e.computeInstanceId]))
    """))
    assert out == [31, 2, 0]
    assert "NVRM: Xid (PCI:0000:18:00 GPU-I:02 GPU-CI:00): 31," in node.read("node/events")
    bad = node.cli("inject", "--root", str(node.mnt), "0", "xid", "31", "gi=9", check=False)
    assert bad.returncode == 2 and "No such file or directory" in bad.stderr  # ENOENT: no such instance
    node.expect_warning(r"ENOENT write gpu0/inject_xid: b'31 gi=9\\n': gpu0 has no GPU instance 9")


def test_a_compute_placement_listed_is_one_that_creates_and_reads_back(node_factory):
    """Possible placements, create-with-placement and the instance's info speak one unit: the
    span a compute instance takes (a 3-slice one spans 4, as `-lci` shows 0:4 on a real H100)."""
    node = node_factory(gpus=1)
    out = run_py_json(mount_env(node), mig_script("""
        h = n.nvmlDeviceGetHandleByIndex(0)
        n.nvmlDeviceSetMigMode(h, 1)
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, n.byref(n.c_nvmlGpuInstancePlacement_t(0, 4)))
        rows = []
        for index in (n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, n.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
                      n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE):
            p = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, 0)
            placements = (n.c_nvmlComputeInstancePlacement_t * 8)()
            count = n.c_uint(8)
            n.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, p.id, placements, n.byref(count))
            possible = [(placements[k].start, placements[k].size) for k in range(count.value)]
            last = placements[count.value - 1]
            ci = n.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, p.id, n.byref(last))
            i = n.nvmlComputeInstanceGetInfo(ci)
            rows.append(dict(slices=p.sliceCount, possible=possible, got=(i.placement.start, i.placement.size)))
            n.nvmlComputeInstanceDestroy(ci)
        print(json.dumps(rows))
    """))
    assert [r["slices"] for r in out] == [1, 2, 3]
    for r, span in zip(out, (1, 2, 4)):
        assert r["possible"] and all(size == span for _, size in r["possible"]), r
        assert r["got"] == r["possible"][-1], r
