"""Level t5: containers made by a real OCI runtime from CDI specs see exactly their devices
(docs/containers.md). Debian's podman, running Debian's runc, makes each container from a spec
(`--device VENDOR/gpu=N --rootfs DIR`, no registry); inside, our nvidia-smi, pynvml and cuda-python
(unmodified) list the one GPU given, and a fault injected on the host shows inside at once.

Specs: the one NVIDIA's `nvidia-ctk cdi generate --mode nvml --driver-root MNT/driver` writes (the
node reached through the spec's own run/nvidia-persistenced/socket mount), and the one the agent
writes (mokkafs/agent/node_files.py: the state directory at /run/mokka). Each spec is written under
a vendor of its own into /var/run/cdi (podman 4.3 reads only /etc/cdi and /var/run/cdi) and
removed after. The rootfs is Debian's python3 and the test extra's pynvml and cuda-bindings,
hard-linked from this machine (nothing downloaded, nothing of the node in it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid as uuidlib
from pathlib import Path

import pytest

from conftest import mokka_cmd, world_readable_node
from helpers_go import go_tool
from mokkafs.agent.node_files import DRIVER_FILES, GpuDevice, cdi_spec
from mokkafs.agent.watch import MountedTree

pytestmark = pytest.mark.level("tools")

CDI_DIR = Path("/var/run/cdi")

PROBE = r"""
import json, sys
import pynvml as N
from cuda.bindings import driver as d
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
(err,) = d.cuInit(0)
cuda = []
if int(err) == 0:
    for i in range(d.cuDeviceGetCount()[1]):
        cuda.append(bytes(d.cuDeviceGetUuid(d.cuDeviceGet(i)[1])[1].bytes).hex())
print(json.dumps({"nvml": N.nvmlDeviceGetCount(), "minor": N.nvmlDeviceGetMinorNumber(h), "uuid": N.nvmlDeviceGetUUID(h),
                  "cuda": [int(err), cuda], "temp": N.nvmlDeviceGetTemperature(h, 0)}), flush=True)
sys.stdin.readline()  # the host injected a fault
print(json.dumps({"temp": N.nvmlDeviceGetTemperature(h, 0)}), flush=True)
"""


def build_rootfs(root: Path) -> None:
    """A minimal rootfs: dash, Debian's python3 and its standard library, pynvml and cuda-bindings,
    and the C libraries, hard-linked (or copied where links cannot cross file systems)."""
    def put(src: Path, rel: str) -> None:
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            try:
                subprocess.run(["cp", "-al", str(src), str(dst)], check=True, capture_output=True)
            except subprocess.CalledProcessError:
                shutil.copytree(src, dst, symlinks=True)
        else:
            try:
                os.link(src, dst, follow_symlinks=False)
            except OSError:
                shutil.copy2(src, dst, follow_symlinks=False)

    for d in ("usr/bin", "usr/lib64", "etc", "proc", "sys", "dev", "tmp", "run", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
        os.symlink(target, root / link)
    put(Path("/usr/lib/x86_64-linux-gnu"), "usr/lib/x86_64-linux-gnu")
    put(Path(f"/usr/lib/python3.{sys.version_info.minor}"), f"usr/lib/python3.{sys.version_info.minor}")
    put(Path("/usr/lib64/ld-linux-x86-64.so.2"), "usr/lib64/ld-linux-x86-64.so.2")
    put(Path(f"/usr/bin/python3.{sys.version_info.minor}"), f"usr/bin/python3.{sys.version_info.minor}")
    put(Path("/usr/bin/dash"), "usr/bin/dash")
    os.symlink(f"python3.{sys.version_info.minor}", root / "usr/bin/python3")
    os.symlink("dash", root / "usr/bin/sh")
    import cuda.bindings
    import pynvml

    site = Path(pynvml.__file__).parent
    put(Path(pynvml.__file__), "usr/lib/python3/dist-packages/pynvml.py")
    put(Path(cuda.bindings.__file__).parent.parent, "usr/lib/python3/dist-packages/cuda")
    assert (site / "cuda").is_dir()
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "root/probe.py").write_text(PROBE)


class Podman:
    """Debian's podman with its own storage, runroot and containers.conf under `base`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        conf = base / "containers.conf"
        # Root here cannot raise rlimits: podman's default nofile/nproc ulimits would fail the start.
        conf.write_text("[containers]\ndefault_ulimits = []\n")
        self.env = dict(os.environ, CONTAINERS_CONF=str(conf))
        self.env.pop("MOKKA_STATE", None)
        self.env.pop("LD_LIBRARY_PATH", None)

    def cmd(self, device: str, *args: str) -> list[str]:
        # rootfs:O: an overlay per container, for what the spec's hooks write into the rootfs
        # (ld.so.cache, the libraries' links), which must not outlive that container.
        return ["podman", "--root", str(self.base / "storage"), "--runroot", str(self.base / "run"),
                "--cgroup-manager", "cgroupfs", "run", "-i", "--rm", "--network", "none", "--device", device,
                "--rootfs", f"{self.base / 'rootfs'}:O", *args]

    def run(self, device: str, *args: str) -> subprocess.CompletedProcess:
        r = subprocess.run(self.cmd(device, *args), capture_output=True, text=True, env=self.env, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return r


@pytest.fixture(scope="module")
def podman():
    missing = [t for t in ("podman", "runc") if shutil.which(t) is None]
    assert not missing, f"{missing} missing: scripts/setup.sh installs them (apt install podman runc)"
    assert os.geteuid() == 0, "podman here runs rootful, as the node's runtime does"
    base = Path(tempfile.mkdtemp(prefix="mokka-podman-"))
    base.chmod(0o755)
    try:
        build_rootfs(base / "rootfs")
        yield Podman(base)
    finally:
        subprocess.run(["podman", "--root", str(base / "storage"), "--runroot", str(base / "run"), "system", "reset",
                        "-f"], capture_output=True, env=dict(os.environ, CONTAINERS_CONF=str(base / "containers.conf")))
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def node():
    for mounted in world_readable_node("h100", 4):
        mounted.uuids = [mounted.read(f"gpu{i}/info").split("uuid: ")[1].split()[0] for i in range(4)]
        yield mounted


@pytest.fixture
def vendor():
    """A CDI vendor of this test's own, so its spec never meets the node's (nvidia.com)."""
    name = f"mokka-test-{uuidlib.uuid4().hex[:8]}.example.com"
    yield name
    for p in CDI_DIR.glob(f"{name}*.yaml"):
        p.unlink()


def nvidia_ctk_spec(node, vendor: str) -> None:
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    # On the node, as NVIDIA runs it: under `mokka run`, so that /proc/driver (MIG's capability
    # minors, which nvidia-ctk reads at the real path, not under the driver root) is the node's.
    r = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt), "--",
                        str(go_tool("nvidia-ctk")), "cdi", "generate", "--quiet", "--mode", "nvml",
                        "--driver-root", str(node.mnt / "driver"),
                        "--nvidia-cdi-hook-path", str(go_tool("nvidia-cdi-hook")),
                        "--vendor", vendor, "--output", str(CDI_DIR / f"{vendor}.yaml")],
                       capture_output=True, text=True, timeout=120, env=node.env)
    assert r.returncode == 0, r.stderr
    spec = (CDI_DIR / f"{vendor}.yaml").read_text()
    # What the spec gives: the persistenced socket, no state directory, no MOKKA_STATE.
    assert "containerPath: /run/nvidia-persistenced/socket" in spec and "MOKKA_STATE" not in spec


def agent_spec(node, vendor: str, proc_hook: bool = True) -> None:
    """As the agent writes it, with its createContainer hook when the driver root serves one."""
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    gpus = [GpuDevice(i, int(node.read(f"gpu{i}/info").split("minor: ")[1].split()[0]), u)
            for i, u in enumerate(node.uuids)]
    files = [rel for rel in DRIVER_FILES if (node.mnt / "driver" / rel).exists()]
    tree = MountedTree(str(node.mnt))
    (CDI_DIR / f"{vendor}.yaml").write_text(cdi_spec(str(node.mnt), str(node.state_dir / "state"), gpus, files,
                                                     os.uname().machine, kind=f"{vendor}/gpu",
                                                     proc_hook=proc_hook and tree.has_cdi_hook(),
                                                     mig_monitor=tree.mig_monitor_node()))


def cuda_hex(uuid: str) -> str:
    return uuid.split("-", 1)[1].replace("-", "")


def check_container(podman, node, device: str, gpu: int) -> None:
    """nvidia-smi -L, then NVML and CUDA before and after a fault injected on the host."""
    out = podman.run(device, "nvidia-smi", "-L").stdout
    assert out == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {node.uuids[gpu]})\n"
    with subprocess.Popen(podman.cmd(device, "python3", "/root/probe.py"), stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=podman.env) as proc:
        probe(proc, node, gpu)
    # A fault that takes the GPU off the bus: the container's nvidia-smi says so.
    try:
        assert node.cli("inject", "--root", str(node.mnt), str(gpu), "xid", "79").returncode == 0
        lost = subprocess.run(podman.cmd(device, "nvidia-smi", "-L"), capture_output=True, text=True,
                              env=podman.env, timeout=120)
        assert "GPU is lost" in lost.stdout, lost.stdout + lost.stderr
    finally:
        node.cli("inject", "--root", str(node.mnt), str(gpu), "reset", check=False)


def probe(proc, node, gpu: int) -> None:
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        before = json.loads(line)
        assert before["nvml"] == 1 and before["minor"] == gpu and before["uuid"] == node.uuids[gpu]
        assert before["cuda"] == [0, [cuda_hex(node.uuids[gpu])]]
        hot = 93 if before["temp"] != 93 else 94
        assert node.cli("inject", "--root", str(node.mnt), str(gpu), "temperature", str(hot)).returncode == 0
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"temp": hot}
    finally:
        proc.kill()
        proc.wait(timeout=30)
        node.cli("inject", "--root", str(node.mnt), str(gpu), "temperature", "auto", check=False)


def test_nvidia_ctk_spec_gives_gpu_2_and_only_it(podman, node, vendor):
    nvidia_ctk_spec(node, vendor)
    check_container(podman, node, f"{vendor}/gpu=2", 2)


def test_nvidia_ctk_spec_by_uuid(podman, node, vendor):
    nvidia_ctk_spec(node, vendor)
    out = podman.run(f"{vendor}/gpu={node.uuids[3]}", "nvidia-smi", "-L").stdout
    assert out == f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {node.uuids[3]})\n"


def test_the_agents_spec_gives_gpu_1_and_only_it(podman, node, vendor):
    agent_spec(node, vendor)
    check_container(podman, node, f"{vendor}/gpu=1", 1)


READ_PROC = r"""
import json, os
out = {}
for rel in ("nvidia/version", "nvidia-caps/mig-minors", "nvidia/gpus"):
    p = "/proc/driver/" + rel
    try:
        out[rel] = sorted(os.listdir(p)) if os.path.isdir(p) else open(p).read()
    except OSError as e:
        out[rel] = e.strerror
out["devices"] = [l for l in open("/proc/devices").read().splitlines() if "nvidia" in l]
try:
    open("/proc/driver/nvidia/version", "w")
except OSError as e:
    out["write"] = e.strerror
print(json.dumps(out))
"""


def test_the_agents_spec_gives_the_drivers_proc_entries(podman, node, vendor):
    """A real kernel shows /proc/driver/nvidia and nvidia-caps in every container's procfs; no
    spec mount may target /proc, so the agent's spec runs mokka-cdi-hook, which binds the node's
    proc/driver there, read-only. NVIDIA's device plugin reads nvidia-caps/mig-minors there."""
    agent_spec(node, vendor)
    got = json.loads(podman.run(f"{vendor}/gpu=1", "python3", "-c", READ_PROC).stdout)
    assert got["nvidia/version"] == node.read("proc/driver/nvidia/version")
    assert got["nvidia-caps/mig-minors"] == node.read("proc/driver/nvidia-caps/mig-minors")
    # /proc/driver/nvidia/gpus lists every GPU, as procfs does on a real node: it is not a device.
    assert len(got["nvidia/gpus"]) == 4
    assert got["write"] == "Read-only file system"
    # The driver's majors in /proc/devices, where NVIDIA's DRA plugin finds nvidia-caps'.
    assert [d.split()[1] for d in got["devices"]] == [l.split()[1] for l in node.read("proc/devices").splitlines()
                                                      if "nvidia" in l] and "nvidia-caps" in str(got["devices"])
    # Without the hook (an agent whose driver root has none) the container's procfs has none of it.
    agent_spec(node, vendor, proc_hook=False)
    got = json.loads(podman.run(f"{vendor}/gpu=1", "python3", "-c", READ_PROC).stdout)
    assert got["nvidia/version"] == "No such file or directory" and got["devices"] == []


@pytest.fixture(scope="module")
def mig_node():
    """GPU 0 in MIG mode with two 1g instances, GPU 1 whole."""
    from mokkafs.cli.allocation import parse_mig

    for mounted in world_readable_node("h100", 2):
        assert mounted.cli("inject", "--root", str(mounted.mnt), "0", "mig", "enable").returncode == 0
        assert mounted.cli("inject", "--root", str(mounted.mnt), "0", "mig", "create", "19,19").returncode == 0
        mounted.migs = parse_mig(mounted.read("gpu0/mig"))
        mounted.uuids = [mounted.read(f"gpu{i}/info").split("uuid: ")[1].split()[0] for i in range(2)]
        yield mounted


def test_nvidia_ctk_spec_gives_one_mig_device_and_only_it(podman, mig_node, vendor):
    """nvidia-ctk names MIG devices GPU:MIG (`0:1`) and gives each its GPU's node and its two
    capability nodes: the container lists that MIG device alone, and CUDA has it as its device."""
    nvidia_ctk_spec(mig_node, vendor)
    m = mig_node.migs[1]
    lines = podman.run(f"{vendor}/gpu=0:1", "nvidia-smi", "-L").stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: ")
    assert lines[1].endswith(f"Device  0: (UUID: {m.uuid})")
    code = ("from cuda.bindings import driver as d; d.cuInit(0); "
            "print(d.cuDeviceGetCount()[1], bytes(d.cuDeviceGetUuid(d.cuDeviceGet(0)[1])[1].bytes).hex())")
    assert podman.run(f"{vendor}/gpu=0:1", "python3", "-c", code).stdout.split() == ["1", cuda_hex(m.uuid)]


def test_the_agents_all_sees_every_mig_device(podman, mig_node, vendor):
    """The agent's `all` carries the MIG monitor capability, as NVIDIA's runtime gives a container
    NVIDIA_MIG_MONITOR_DEVICES=all: every MIG device of every GPU is listed, where `gpu=0` (the
    GPU's node alone, no capability) lists GPU 0 without its MIG devices."""
    agent_spec(mig_node, vendor)
    lines = podman.run(f"{vendor}/gpu=all", "nvidia-smi", "-L").stdout.splitlines()
    assert [line.split("(UUID: ")[1].rstrip(")") for line in lines if "MIG" in line] == [m.uuid for m in mig_node.migs]
    assert len(lines) == 4, lines  # GPU 0, its two MIG devices, GPU 1
    lines = podman.run(f"{vendor}/gpu=0", "nvidia-smi", "-L").stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3"), lines
