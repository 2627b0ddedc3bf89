"""Level t4/t5: visibility follows device access (docs/containers.md). A process whose /dev holds
only some of the node's device nodes sees only those GPUs and MIG devices, through NVIDIA's
nvidia-smi-compatible tool, pynvml and cuda-python, numbered from 0; handles of the others are
NOT_FOUND; CUDA_VISIBLE_DEVICES picks among what is visible. Each test runs the consumer in a
private mount namespace (unshare -m) whose /dev is a fresh tmpfs holding bind mounts of the mount's
own device nodes, as a container runtime makes one; `mokka run --gpus` does the same for a shell."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import mokka_cmd, world_readable_node
from test_real_nvidia_smi import driver_version, real_smi

pytestmark = pytest.mark.level("shims")

SETUP = r"""
set -e
mount -t tmpfs -o mode=755 dev /dev
mknod -m 666 /dev/null c 1 3
M="$1"; shift
while [ "$1" != "--" ]; do
  case "$1" in
    mknod:*) # mknod:NAME:MAJOR:MINOR:MODE -- a node of our own making
      IFS=: read -r _ name major minor mode <<EOF
$1
EOF
      mkdir -p "$(dirname /dev/$name)"; mknod -m "$mode" "/dev/$name" c "$major" "$minor";;
    *) mkdir -p "$(dirname /dev/$1)"; touch "/dev/$1"; mount --bind "$M/dev/$1" "/dev/$1";;
  esac
  shift
done
shift
exec "$@"
"""


@pytest.fixture(scope="module")
def node():
    assert shutil.which("unshare") and shutil.which("mknod"), "util-linux and coreutils are needed"
    for mounted in world_readable_node("h100", 8):
        mounted.uuids = [mounted.read(f"gpu{i}/info").split("uuid: ")[1].split()[0] for i in range(8)]
        yield mounted


def env_for(node, **extra) -> dict[str, str]:
    """The driver root's libraries, found by where they are loaded from, as in a container."""
    env = {k: v for k, v in os.environ.items() if k not in ("MOKKA_STATE", "CUDA_VISIBLE_DEVICES")}
    env["LD_LIBRARY_PATH"] = str(node.mnt / "driver/usr/lib64")
    env.update(extra)
    return env


def in_dev(node, names, *cmd, env=None, check=True) -> subprocess.CompletedProcess:
    """CMD in a private mount namespace whose /dev holds only `names` (the mount's own nodes, or
    `mknod:NAME:MAJOR:MINOR:MODE` ones)."""
    r = subprocess.run(["unshare", "-m", "sh", "-c", SETUP, "sh", str(node.mnt), *names, "--", *cmd],
                       capture_output=True, text=True, env=env or env_for(node), timeout=60)
    if check:
        assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def smi(node, names, *args, check=True) -> subprocess.CompletedProcess:
    return in_dev(node, names, str(node.mnt / "driver/usr/bin/nvidia-smi"), *args, check=check)


def py(node, names, code, env=None):
    r = in_dev(node, names, sys.executable, "-c", textwrap.dedent(code), env=env)
    return json.loads(r.stdout.strip().splitlines()[-1])


NVML_PROBE = """
import json, pynvml as N
N.nvmlInit()
out = {"count": N.nvmlDeviceGetCount(), "gpus": []}
for i in range(out["count"]):
    h = N.nvmlDeviceGetHandleByIndex(i)
    out["gpus"].append({"uuid": N.nvmlDeviceGetUUID(h), "minor": N.nvmlDeviceGetMinorNumber(h),
                        "index": N.nvmlDeviceGetIndex(h), "bus": N.nvmlDeviceGetPciInfo(h).busId})
def found(fn, key):
    try:
        fn(key)
        return "found"
    except N.NVMLError as e:
        return str(e)
out["by_uuid"] = {u: found(N.nvmlDeviceGetHandleByUUID, u) for u in %(uuids)r}
out["by_bus"] = {b: found(N.nvmlDeviceGetHandleByPciBusId, b) for b in %(buses)r}
print(json.dumps(out))
"""

CUDA_PROBE = """
import json
from cuda.bindings import driver as d
(err,) = d.cuInit(0)
out = {"init": int(err), "uuids": []}
if int(err) == 0:
    err, n = d.cuDeviceGetCount()
    for i in range(n):
        _, dev = d.cuDeviceGet(i)
        _, u = d.cuDeviceGetUuid(dev)
        out["uuids"].append(bytes(u.bytes).hex())
print(json.dumps(out))
"""


def cuda_hex(uuid: str) -> str:
    return uuid.split("-", 1)[1].replace("-", "")


def bus_of(node, i: int) -> str:
    return node.read(f"gpu{i}/info").split("bus_id: ")[1].split()[0]


def test_one_gpu_is_gpu_0_with_its_own_uuid_and_minor(node):
    out = smi(node, ["nvidiactl", "nvidia2"], "-L").stdout
    assert out == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {node.uuids[2]})\n"
    probe = py(node, ["nvidiactl", "nvidia2"], NVML_PROBE % {"uuids": [node.uuids[2], node.uuids[0]],
                                                             "buses": [bus_of(node, 2), bus_of(node, 0)]})
    assert probe["count"] == 1
    assert probe["gpus"] == [{"uuid": node.uuids[2], "minor": 2, "index": 0, "bus": bus_of(node, 2)}]
    assert probe["by_uuid"] == {node.uuids[2]: "found", node.uuids[0]: "Not Found"}
    assert probe["by_bus"] == {bus_of(node, 2): "found", bus_of(node, 0): "Not Found"}
    cuda = py(node, ["nvidiactl", "nvidia2"], CUDA_PROBE)
    assert cuda == {"init": 0, "uuids": [cuda_hex(node.uuids[2])]}


def test_the_host_without_nvidiactl_sees_the_whole_node(node):
    """No /dev/nvidiactl at all: a host where nothing made the nodes; every GPU, as before."""
    lines = smi(node, [], "-L").stdout.splitlines()
    assert [line.split("UUID: ")[1].rstrip(")") for line in lines] == node.uuids
    assert py(node, [], CUDA_PROBE)["uuids"] == [cuda_hex(u) for u in node.uuids]


def test_indexes_count_from_zero_in_pci_order_and_cuda_visible_devices_picks_among_them(node):
    names = ["nvidiactl", "nvidia6", "nvidia1"]
    out = smi(node, names, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader").stdout
    assert out.splitlines() == [f"0, {node.uuids[1]}, {bus_of(node, 1)}", f"1, {node.uuids[6]}, {bus_of(node, 6)}"]
    for cvd, want in (("1", [6]), ("1,0", [6, 1]), (node.uuids[6], [6]), ("2", None), (node.uuids[0], None)):
        got = py(node, names, CUDA_PROBE, env=env_for(node, CUDA_VISIBLE_DEVICES=cvd))
        if want is None:
            assert got == {"init": 100, "uuids": []}, cvd  # CUDA_ERROR_NO_DEVICE
        else:
            assert got == {"init": 0, "uuids": [cuda_hex(node.uuids[i]) for i in want]}, cvd


def test_nvidiactl_alone_shows_no_gpu(node):
    r = smi(node, ["nvidiactl"], "-L", check=False)
    assert (r.returncode, r.stdout.strip()) == (6, "No devices were found")
    assert py(node, ["nvidiactl"], CUDA_PROBE)["init"] == 100


def test_a_node_the_process_may_not_open_or_of_another_minor_is_not_its_gpu(node):
    ctl = "mknod:nvidiactl:195:255:666"
    # mode 0600 root: root sees it, nobody does not.
    names = [ctl, "mknod:nvidia3:195:3:600", "mknod:nvidia4:195:5:666"]  # nvidia4's minor is GPU 5's
    root = in_dev(node, names, str(node.mnt / "driver/usr/bin/nvidia-smi"), "-L").stdout
    assert root == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {node.uuids[3]})\n"
    nobody = in_dev(node, names, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    str(node.mnt / "driver/usr/bin/nvidia-smi"), "-L", check=False)
    assert (nobody.returncode, nobody.stdout.strip()) == (6, "No devices were found")


def test_a_setting_made_through_a_renumbered_gpu_lands_on_that_gpu(node):
    """NVML's index 0 here is the node's GPU 4: the daemon is told GPU 4."""
    def modes():
        return node.cli("run", "--root", str(node.mnt), "--", "nvidia-smi", "--query-gpu=compute_mode",
                        "--format=csv,noheader").stdout.splitlines()

    assert modes() == ["Default"] * 8
    try:
        smi(node, ["nvidiactl", "nvidia4"], "-i", "0", "-c", "PROHIBITED")
        assert modes() == ["Default"] * 4 + ["Prohibited"] + ["Default"] * 3
    finally:
        node.cli("inject", "--root", str(node.mnt), "4", "compute_mode", "default", check=False)


@pytest.fixture(scope="module")
def mig_node():
    """GPU 0 in MIG mode with two 1g instances, GPU 1 whole."""
    for mounted in world_readable_node("h100", 2):
        assert mounted.cli("inject", "--root", str(mounted.mnt), "0", "mig", "enable").returncode == 0
        assert mounted.cli("inject", "--root", str(mounted.mnt), "0", "mig", "create", "19,19").returncode == 0
        from mokkafs.cli.allocation import parse_mig

        mounted.migs = parse_mig(mounted.read("gpu0/mig"))
        assert len(mounted.migs) == 2
        yield mounted


def caps(m) -> list[str]:
    return [f"nvidia-caps/nvidia-cap{m.gi_minor}", f"nvidia-caps/nvidia-cap{m.ci_minor}"]


MIG_PROBE = """
import json, pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
out = {"count": N.nvmlDeviceGetCount(), "migs": []}
for k in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
    try:
        m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
    except N.NVMLError:
        continue
    out["migs"].append([k, N.nvmlDeviceGetUUID(m), N.nvmlDeviceGetIndex(m)])
out["by_uuid"] = {}
for u in %(uuids)r:
    try:
        N.nvmlDeviceGetHandleByUUID(u)
        out["by_uuid"][u] = "found"
    except N.NVMLError as e:
        out["by_uuid"][u] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("which", [0, 1])
def test_only_the_mig_device_whose_capabilities_are_there(mig_node, which):
    m, other = mig_node.migs[which], mig_node.migs[1 - which]
    names = ["nvidiactl", "nvidia0", *caps(m)]
    lines = smi(mig_node, names, "-L").stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("GPU 0: ")
    assert re.fullmatch(rf"  MIG 1g\.10gb +Device +0: \(UUID: {m.uuid}\)", lines[1]), lines
    probe = py(mig_node, names, MIG_PROBE % {"uuids": [m.uuid, other.uuid]})
    assert probe == {"count": 1, "migs": [[0, m.uuid, 0]], "by_uuid": {m.uuid: "found", other.uuid: "Not Found"}}
    cuda = py(mig_node, names, CUDA_PROBE)
    assert cuda == {"init": 0, "uuids": [cuda_hex(m.uuid)]}
    # Only one of the two capabilities is not enough.
    lines = smi(mig_node, ["nvidiactl", "nvidia0", caps(m)[0]], "-L").stdout.splitlines()
    assert len(lines) == 1


def test_the_monitor_capability_shows_every_mig_device(mig_node):
    names = ["nvidiactl", "nvidia0", "nvidia-caps/nvidia-cap2"]
    lines = smi(mig_node, names, "-L").stdout.splitlines()
    assert [line.split("UUID: ")[1].rstrip(")") for line in lines[1:]] == [m.uuid for m in mig_node.migs]


def test_mokka_run_gpus_binds_only_those_nodes(mig_node):
    gpu1 = mig_node.read("gpu1/info").split("uuid: ")[1].split()[0]

    def run(spec):
        return subprocess.run([*mokka_cmd(), "run", "--root", str(mig_node.mnt), "--gpus", spec, "--", "sh", "-c",
                               "ls /dev /dev/nvidia-caps 2>/dev/null | grep nvidia; nvidia-smi -L"],
                              capture_output=True, text=True, env=mig_node.env, timeout=60)

    out = run("1").stdout
    assert "nvidia0\n" not in out and "nvidia1\n" in out
    assert out.endswith(f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpu1})\n")
    m = mig_node.migs[1]
    out = run(m.uuid).stdout.splitlines()
    assert f"nvidia-cap{m.gi_minor}" in out and f"nvidia-cap{m.ci_minor}" in out and "nvidia-cap2" not in out
    assert out[-1].endswith(f"Device  0: (UUID: {m.uuid})") and "nvidia1" not in out
    bad = run("GPU-nothing")
    assert bad.returncode == 2 and "no GPU or MIG device 'GPU-nothing'" in bad.stderr


@pytest.fixture(scope="module")
def real_node():
    """A node whose driver version is NVIDIA's nvidia-smi 535's, for that binary."""
    for mounted in world_readable_node("h100", 4, ("--driver-version", driver_version(535))):
        yield mounted


def test_nvidias_own_nvidia_smi_sees_only_the_given_gpu(real_node):
    uuid = real_node.read("gpu2/info").split("uuid: ")[1].split()[0]
    out = in_dev(real_node, ["nvidiactl", "nvidia2"], str(real_smi(535)), "-L").stdout
    assert out == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid})\n"
