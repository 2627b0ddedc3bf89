"""Real, unmodified NVML consumers (pynvml, gpustat, nvitop) against a mounted node."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers_nvml import consumer_env
from helpers import run_py

pytestmark = pytest.mark.level("shims")

pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")


def tool(name: str) -> str:
    path = shutil.which(name, path=str(__import__("pathlib").Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} not installed (test extra)")
    return path


@pytest.mark.parametrize("profile", ["a100", "b200", "gb200", "gb300", "h100", "h200", "l40s", "t4"])
def test_pynvml_sees_the_profile(node_factory, profile):
    node = node_factory(profile=profile, gpus=2)
    env = consumer_env(node.state_dir / "state")
    out = json.loads(run_py(env, """
        import json, pynvml as p
        p.nvmlInit()
        h = p.nvmlDeviceGetHandleByIndex(1)
        m = p.nvmlDeviceGetMemoryInfo(h, version=p.nvmlMemory_v2)
        def opt(f, *a):
            try:
                return f(*a)
            except p.NVMLError as e:
                return str(e)
        print(json.dumps(dict(
            count=p.nvmlDeviceGetCount(), driver=p.nvmlSystemGetDriverVersion(),
            cuda=p.nvmlSystemGetCudaDriverVersion(), name=p.nvmlDeviceGetName(h), uuid=p.nvmlDeviceGetUUID(h),
            bus=p.nvmlDeviceGetPciInfo_v3(h).busId, total=m.total, reserved=m.reserved,
            temp=p.nvmlDeviceGetTemperature(h, 0), limit=p.nvmlDeviceGetPowerManagementLimit(h),
            cc=list(p.nvmlDeviceGetCudaComputeCapability(h)), minor=p.nvmlDeviceGetMinorNumber(h),
            vbios=p.nvmlDeviceGetVbiosVersion(h), serial=p.nvmlDeviceGetSerial(h),
            clocks=[p.nvmlDeviceGetMaxClockInfo(h, c) for c in range(4)],
            procs=len(p.nvmlDeviceGetComputeRunningProcesses(h)), util=p.nvmlDeviceGetUtilizationRates(h).gpu,
            ecc=opt(p.nvmlDeviceGetTotalEccErrors, h, 1, 0), mig=opt(p.nvmlDeviceGetMigMode, h),
            remap=opt(p.nvmlDeviceGetRemappedRows, h), nvlinks=opt(p.nvmlDeviceGetNvLinkState, h, 0),
            fabric=opt(lambda: (lambda f: (p.nvmlDeviceGetGpuFabricInfo(h, p.byref(f)), f.cliqueId)[1])(p.c_nvmlGpuFabricInfo_t())),
            throttle=p.nvmlDeviceGetCurrentClocksEventReasons(h),
            bar1=p.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total, board=p.nvmlDeviceGetBoardPartNumber(h),
            inforom=p.nvmlDeviceGetInforomImageVersion(h), arch=p.nvmlDeviceGetArchitecture(h),
            gen=p.nvmlDeviceGetMaxPcieLinkGeneration(h), width=p.nvmlDeviceGetMaxPcieLinkWidth(h),
            power=p.nvmlDeviceGetPowerUsage(h), pstate=p.nvmlDeviceGetPerformanceState(h),
            pci_ids=[p.nvmlDeviceGetPciInfo_v3(h).pciDeviceId, p.nvmlDeviceGetPciInfo_v3(h).pciSubSystemId],
        )))
        p.nvmlShutdown()
    """))
    from mokkafs.model import compose, gpu_identities
    from mokkafs.model.profiles import load_profile

    prof = load_profile(profile)
    ident = gpu_identities(compose(prof, gpus=2, hostname=__import__("socket").gethostname()))[1]
    assert out["count"] == 2
    assert out["driver"] == prof.node.driver_version
    assert out["name"] == prof.product_name
    assert out["uuid"] == ident.uuid and out["bus"] == ident.bdf.nvml and out["minor"] == ident.minor
    assert out["total"] == prof.memory.total_mib << 20 and out["reserved"] == prof.memory.reserved_mib << 20
    assert out["temp"] == prof.thermal.idle_c
    assert out["limit"] == int(prof.power.default_limit_w * 1000)
    assert out["cc"] == [int(x) for x in prof.compute_capability.split(".")]
    assert out["vbios"] == prof.vbios_version and out["serial"] == ident.serial
    assert out["clocks"] == [prof.clocks.max_graphics, prof.clocks.max_sm, prof.clocks.max_mem, prof.clocks.max_video]
    assert out["procs"] == 0 and out["util"] == 0
    assert out["mig"] == ([0, 0] if prof.mig_capable else "Not Supported")
    assert out["nvlinks"] == (1 if prof.nvlink.links else "Not Supported")
    assert out["fabric"] == (prof.fabric.clique_id if prof.fabric else "Not Supported")
    assert out["bar1"] == prof.memory.bar1_mib << 20
    assert out["board"] == prof.board_part_number and out["inforom"] == prof.inforom.image
    arch = {"Turing": 6, "Ampere": 7, "Ada Lovelace": 8, "Hopper": 9, "Blackwell": 10}[prof.architecture]
    assert out["arch"] == arch
    assert (out["gen"], out["width"]) == (prof.pci.max_link_gen, prof.pci.max_link_width)
    assert out["power"] == round(prof.power.idle_w * 1000) and out["pstate"] == 0
    assert out["pci_ids"] == [prof.pci.device_id << 16 | 0x10DE, prof.pci.subsystem_device_id << 16 | 0x10DE]


def test_gpustat_and_nvitop_show_the_gpus_and_a_lost_one(node_factory):
    node = node_factory(profile="h100", gpus=4)
    env = consumer_env(node.state_dir / "state")
    gpustat, nvitop = tool("gpustat"), tool("nvitop")
    out = subprocess.run([gpustat, "--no-color"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert out.count("NVIDIA H100 80GB HBM3") == 4 and "/ 81559 MB" in out and "29°C" in out, out
    out = subprocess.run([nvitop, "-1"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert out.count("H100 80GB HBM3") == 4 and "700W" in out and "79.65GiB" in out, out
    node.expect_warning(r"Xid")
    assert node.write("gpu3/inject_xid", b"79\n") == 0
    out = subprocess.run([gpustat, "--no-color"], env=env, capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert "GPU is lost" in lines[4] and "GPU is lost" not in "".join(lines[1:4]), out


def test_a_blocked_event_wait_receives_xid_48(node_factory):
    node = node_factory(profile="h100", gpus=4)
    env = consumer_env(node.state_dir / "state")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import threading, pynvml as p
        p.nvmlInit()
        s = p.nvmlEventSetCreate()
        h = p.nvmlDeviceGetHandleByIndex(3)
        p.nvmlDeviceRegisterEvents(h, p.nvmlEventTypeXidCriticalError, s)
        got = []
        def wait():
            d = p.nvmlEventSetWait_v2(s, 10000)
            got.append((d.eventType, d.eventData, p.nvmlDeviceGetUUID(d.device)))
        t = threading.Thread(target=wait)
        t.start()
        print("waiting", flush=True)
        t.join()
        print(*got[0], flush=True)
    """)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        node.expect_warning(r"Xid")
        assert node.write("gpu3/inject_xid", b"48\n") == 0
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    uuid = node.read("gpu3/info").split("uuid:")[1].split()[0] if "uuid:" in node.read("gpu3/info") else None
    event_type, data, got_uuid = out.split()
    assert (event_type, data) == ("8", "48")
    if uuid:
        assert got_uuid == uuid


def test_driver_root_and_mokka_env(node_factory):
    node = node_factory(profile="h100", gpus=1)
    lib64 = node.path("driver/usr/lib64")
    from mokkafs.render import native

    versioned = lib64 / "libnvidia-ml.so.580.105.08"
    # A self-contained driver root: the versioned file holds the library's bytes, the soname is
    # a relative link to it, so a container that mounts only driver/ can load it.
    assert os.readlink(lib64 / "libnvidia-ml.so.1") == versioned.name
    assert versioned.read_bytes() == native.nvml_library().read_bytes()
    assert sorted(os.listdir(node.path("driver/dev"))) == sorted(os.listdir(node.path("dev")))
    # ...and the loader maps it straight from the mount.
    probe = (
        "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "print(pynvml.nvmlDeviceGetName(h))"
    )
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib64), MOKKA_STATE=str(node.state_dir / "state"))
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert res.stdout.strip() == "NVIDIA H100 80GB HBM3", res.stderr
    smi = subprocess.run([str(node.path("driver/usr/bin/nvidia-smi")), "-L"], env=env, capture_output=True, text=True)
    assert smi.stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-"), smi.stderr
    out = node.cli("env", "--root", str(node.mnt)).stdout
    assert f"export LD_LIBRARY_PATH={native.LIB_DIR}" in out and "export MOKKA_STATE=" in out
    # nvidia-smi on PATH is the package's (no FUSE reads, no FUSE misses for a shell's other
    # commands), and reads this node through MOKKA_STATE.
    assert f"export PATH={native.LIB_DIR.parent / 'bin'}:$PATH" in out
    served = smi.stdout.splitlines()
    smi = subprocess.run(["sh", "-c", f'{out}\ncommand -v nvidia-smi; nvidia-smi -L'], capture_output=True, text=True,
                         timeout=30, env={k: v for k, v in os.environ.items() if k != "MOKKA_STATE"})
    lines = smi.stdout.splitlines()
    assert lines[0] == str(native.LIB_DIR.parent / "bin" / "nvidia-smi"), smi.stderr
    assert lines[1:] == served, smi.stderr


def test_a_consumer_survives_a_daemon_kill_and_sees_the_restarted_one(node_factory):
    """DESIGN §5: a crashed daemon leaves consumers answering from the last published state;
    a restarted daemon publishes into the same file, and the consumer, never reloaded, sees it."""
    node = node_factory(gpus=2)
    node.expect_warning("clearing stale mount")
    assert node.write("gpu1/temperature", b"61\n") == 0
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, pynvml as p
            p.nvmlInit()
            h = p.nvmlDeviceGetHandleByIndex(1)
            for line in sys.stdin:
                print(p.nvmlDeviceGetTemperature(h, 0), p.nvmlDeviceGetName(h), flush=True)
        """)],
        env=consumer_env(node.state_dir / "state"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as consumer:

        def ask() -> str:
            consumer.stdin.write("?\n")
            consumer.stdin.flush()
            return consumer.stdout.readline().strip()

        assert ask() == "61 NVIDIA H100 80GB HBM3"
        node.kill9()
        assert ask() == "61 NVIDIA H100 80GB HBM3"  # stale, not a crash
        node.mount()
        assert node.read("gpu1/temperature") == "61\n"  # the pin was persisted
        assert node.write("gpu1/temperature", b"77\n") == 0
        assert ask() == "77 NVIDIA H100 80GB HBM3"
        consumer.stdin.close()
        assert consumer.wait(timeout=30) == 0


def test_nvitop_lists_mig_devices_with_their_memory_and_bar1(node_factory):
    """nvitop formats a MIG device's BAR1 share, which real boards report on a MIG handle (an
    unanswered BAR1 made nvitop 1.7 stop with a KeyError)."""
    node = node_factory(profile="h100", gpus=2)
    for args in (("mig", "enable"), ("mig", "create", "3g.40gb,2g.20gb,1g.10gb,1g.10gb")):
        assert node.cli("inject", "--root", str(node.mnt), "1", *args).returncode == 0
    env = consumer_env(node.state_dir / "state")
    r = subprocess.run([tool("nvitop"), "-1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if "@ GI/CI:" in line]
    assert [row.split("│")[1].split() for row in rows] == [
        ["1:0", "3g.40gb", "@", "GI/CI:", "2/0"], ["1:1", "2g.20gb", "@", "GI/CI:", "3/0"],
        ["1:2", "1g.10gb", "@", "GI/CI:", "9/0"], ["1:3", "1g.10gb", "@", "GI/CI:10/0"]], r.stdout
    assert "/ 39.50GiB" in rows[0] and "/  9984MiB" in rows[2] and all("BAR1:" in row for row in rows)
    bar1 = run_py(env, """
        import pynvml as n
        n.nvmlInit()
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(1), 0)
        b = n.nvmlDeviceGetBAR1MemoryInfo(m)
        print(b.bar1Total >> 20, b.bar1Used)
    """)
    # the 3g.40gb's 4 of 8 slices of what the framebuffer leaves of the aperture, less 513 MiB
    # (the h100 node's 580 driver; docs/mig.md, "BAR1")
    assert bar1.split() == [str((131072 - (81559 - 480) - 513) * 4 // 8), "0"]
