"""`mokka run` against a real mount: Debian's real lspci, ibstat and ibstatus see the simulated node
at the real paths, faults show up there, CMD's exit code and environment pass through, and the
host's mount table is untouched. No mocks: the tools and the namespace are real."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import MountedNode, force_unmount, mokka_cmd

from mokkafs.render import native

pytestmark = pytest.mark.level("tools")

TOOLS = ("lspci", "ibstat", "ibstatus", "unshare", "fusermount3")
H100_LINE = re.compile(r"^[0-9a-f]{2}:00\.0 3D controller \[0302\]: NVIDIA Corporation GH100 ?\[H100 SXM5 80GB\] \[10de:2330\]")


@pytest.fixture(scope="module")
def node():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"real tools missing (apt install pciutils infiniband-diags fuse3): {missing}"
    # Not under pytest's 0700 tmp dir: the unprivileged test must be able to reach the mount.
    tmp = Path(tempfile.mkdtemp(prefix="mokka-run-"))
    tmp.chmod(0o755)
    n = MountedNode(tmp, "h100")
    n.expected_warnings.append(re.compile("EINVAL"))
    n.mount()
    yield n
    n.umount()
    force_unmount(n.mnt)
    problems = n.unexpected_log_lines()
    shutil.rmtree(tmp, ignore_errors=True)
    assert problems == []


def run(node: MountedNode, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*mokka_cmd(), "run", "--root", str(node.mnt), "--", *cmd],
        capture_output=True, text=True, env=node.env, timeout=60, check=check,
    )


def gpu_lines(node: MountedNode) -> list[str]:
    return [line for line in run(node, "lspci", "-nn").stdout.splitlines() if H100_LINE.match(line)]


def test_lspci_lists_the_gpus_by_their_pci_ids_names(node):
    out = run(node, "lspci", "-nn").stdout
    assert len(gpu_lines(node)) == 8, out
    assert out.count("Infiniband controller [0207]: Mellanox Technologies MT2910 Family [ConnectX-7] [15b3:1021]") == 8
    assert out.count("[10de:22a3]") == 4  # the NVSwitches


def test_lspci_vvv_shows_numa_and_links(node):
    out = run(node, "lspci", "-vvv", "-s", "36:00.0").stdout
    assert "NUMA node: 1" in out
    assert "LnkCap:\tPort #0, Speed 32GT/s, Width x16" in out
    assert "LnkSta:\tSpeed 32GT/s, Width x16" in out
    assert "Region 1: Memory at" in out and "[virtual]" not in out
    assert "Kernel driver in use: nvidia" in out


def test_lspci_t_shows_the_root_complexes(node):
    out = run(node, "lspci", "-t").stdout
    for bus in ("15", "1b", "21", "27", "2d", "33", "39", "3f", "d8"):
        assert f"[0000:{bus}]" in out
    assert "-[17-19]--+-00.0-[18]----00.0" in out


def test_ibstat_and_ibstatus_show_every_hca_active(node):
    out = run(node, "ibstat").stdout
    assert out.count("CA type: MT4129") == 8
    assert out.count("State: Active") == 8 and out.count("Physical state: LinkUp") == 8
    assert out.count("Rate: 400") == 8 and "Firmware version: 28.43.3608" in out
    assert run(node, "ibstat", "-l").stdout.split() == [f"mlx5_{j}" for j in range(8)]
    status = run(node, "ibstatus").stdout
    assert status.count("state:\t\t 4: ACTIVE") == 8
    assert status.count("phys state:\t 5: LinkUp") == 8
    assert status.count("rate:\t\t 400 Gb/sec (4X NDR)") == 8


def test_xid_79_takes_a_gpu_off_the_bus_until_reset(node):
    assert node.write("gpu2/inject_xid", b"79\n") == 0
    assert len(gpu_lines(node)) == 7
    gone = run(node, "sh", "-c", "ls /proc/driver/nvidia/gpus; ls /sys/bus/pci/devices").stdout
    assert "0000:24:00.0" not in gone
    assert node.write("gpu2/reset", b"1\n") == 0
    assert len(gpu_lines(node)) == 8


def test_ib_port_down_and_up(node):
    assert node.write("ib/mlx5_3/port1", b"down\n") == 0
    for bad in (b"sideways\n", b"errors -3\n", b"errors nope 1\n", b"down down\n"):
        assert node.write("ib/mlx5_3/port1", bad) == 22  # EINVAL, nothing changed
    out = run(node, "ibstat", "mlx5_3").stdout
    assert "State: Down" in out and "Physical state: Disabled" in out
    status = run(node, "ibstatus", "mlx5_3").stdout
    assert "1: DOWN" in status and "3: Disabled" in status
    assert node.write("ib/mlx5_3/port1", b"up\n") == 0
    assert "State: Active" in run(node, "ibstat", "mlx5_3").stdout
    assert node.write("node/reset", b"1\n") == 0


def test_exit_code_environment_and_device_nodes(node):
    res = run(node, "sh", "-c", "exit 42", check=False)
    assert res.returncode == 42
    env = run(node, "sh", "-c", 'echo "$MOKKA_STATE"; echo "$LD_LIBRARY_PATH"; echo "$PATH"').stdout.split("\n")
    assert env[0] == f"{node.state_dir.resolve()}/state"
    # The built shims' directories, which hold the files the mount's driver root serves
    # (docs/containers.md, "Where consumers load the shims from").
    assert env[1].split(":")[0] == str(native.LIB_DIR)
    assert env[2].split(":")[0] == str(native.LIB_DIR.parent / "bin")
    assert run(node, "sh", "-c", 'echo "$MOKKA_ROOT"').stdout == f"{node.mnt}\n"
    stat = run(node, "stat", "-c", "%n %t:%T", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm",
               "/dev/nvidia-caps/nvidia-cap1").stdout.split("\n")
    assert stat[:4] == ["/dev/nvidia0 c3:0", "/dev/nvidiactl c3:ff", "/dev/nvidia-uvm 1fe:0",
                        "/dev/nvidia-caps/nvidia-cap1 1fa:1"]
    assert "NVRM version: NVIDIA UNIX Open Kernel Module" in run(node, "cat", "/proc/driver/nvidia/version").stdout
    assert run(node, "cat", "/sys/module/nvidia/version").stdout == "580.105.08\n"
    # the host's own entries are still there inside the namespace
    assert run(node, "sh", "-c", "test -e /dev/null && test -d /sys/devices/system/cpu && echo ok").stdout == "ok\n"


def test_a_program_searches_no_fuse_directory_for_its_libraries(node):
    """Every program CMD starts searches LD_LIBRARY_PATH for libc and the rest; a miss in the
    mount is a round trip to the daemon (/bin/true 0.7 -> 2.7 ms). The loader's own trace
    (LD_DEBUG=libs) lists each file it tries."""
    trace = run(node, "env", "LD_DEBUG=libs", "/bin/true").stderr
    tried = re.findall(r"trying file=(\S+)", trace)
    assert tried, trace  # the trace is there: /bin/true links libc
    assert [path for path in tried if path.startswith(f"{node.mnt}/")] == []
    # ...and the libraries consumers load by soname are still ours, reading this node
    probe = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    assert run(node, sys.executable, "-c", probe).stdout == "8\n"
    smi = run(node, "sh", "-c", "command -v nvidia-smi; nvidia-smi -L").stdout.splitlines()
    assert smi[0] == str(native.LIB_DIR.parent / "bin" / "nvidia-smi")
    assert len(smi) == 9 and smi[1].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")


def test_a_daemon_serving_other_shims_keeps_the_mounts_driver_root(node, monkeypatch, tmp_path):
    """The built directories stand in for the mount's only when they hold the same bytes."""
    from mokkafs.cli import run as run_mod

    assert run_mod.driver_dirs(str(node.mnt)) == (str(native.LIB_DIR), str(native.LIB_DIR.parent / "bin"))
    (tmp_path / "lib").mkdir()
    for name in os.listdir(native.LIB_DIR):
        (tmp_path / "lib" / name).write_bytes(b"another build")
    monkeypatch.setattr(native, "LIB_DIR", tmp_path / "lib")
    assert run_mod.driver_dirs(str(node.mnt)) == (f"{node.mnt}/driver/usr/lib64", f"{node.mnt}/driver/usr/bin")


def _other_node(line: str) -> bool:
    """A test node's own mount: a whole mokkafs tree on a temporary directory. A bind that `mokka
    run` leaked would show a subtree (root not "/") or a real path, and stays in the comparison."""
    fields = line.split()
    return " - fuse.mokkafs " in line and fields[3] == "/" and fields[4].startswith("/tmp/")


def _mounts() -> set[str]:
    """The host's mount table, less test nodes (a parallel run mounts and unmounts its own)."""
    with open("/proc/self/mountinfo") as f:
        return {line for line in f if not _other_node(line)}


def test_the_host_is_untouched(node):
    before = _mounts()
    with open("/proc/self/mountinfo") as f:
        assert f" {node.mnt} " in f.read()  # the node's own mount is there, and stays out of the comparison
    run(node, "true")
    assert _mounts() == before
    assert not os.path.exists("/dev/nvidia0") and not os.path.exists("/sys/class/infiniband/mlx5_0")


def test_command_not_found_and_not_a_mount(node, tmp_path):
    res = run(node, "no-such-command-xyz", check=False)
    assert res.returncode == 127 and "no-such-command-xyz" in res.stderr
    res = subprocess.run([*mokka_cmd(), "run", "--root", str(tmp_path), "--", "true"], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2 and "not a mokkafs mount" in res.stderr
    res = subprocess.run([*mokka_cmd(), "run", "--root", str(node.mnt)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "no command given" in res.stderr


def test_unprivileged_user_gets_a_user_namespace_or_a_clear_error(node):
    res = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *mokka_cmd(), "run",
         "--root", str(node.mnt), "--", "lspci", "-n"],
        capture_output=True, text=True, timeout=60, env=node.env, cwd="/",
    )
    if res.returncode == 0:
        assert res.stdout.count("0302: 10de:2330") == 8
    else:
        assert "cannot create a mount namespace" in res.stderr and "unprivileged user namespaces" in res.stderr


CUDA_AND_SMI = """
import ctypes, os, subprocess, time
cu = ctypes.CDLL("libcuda.so.1")  # the driver root's, through the LD_LIBRARY_PATH mokka run sets
ctx, p = ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, 2) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 30)) == 0
for _ in range(100):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    if out:
        break
    time.sleep(0.05)
print(os.getpid(), out.strip())
"""


def test_a_cuda_program_under_mokka_run_is_accounted(node):
    out = run(node, sys.executable, "-c", CUDA_AND_SMI).stdout.strip().split(maxsplit=1)
    assert out[1] == f"{out[0]}, 1024 MiB"


# /proc/modules and /sys/module: what mig-parted, the GPU Operator's validator and kmod's lsmod read.
NODE_MODULES = {  # name: (size, use count, users) on 8 x H100 with 8 HCAs, driver 580
    "nvidia_peermem": (16384, 0, set()),
    "nvidia_uvm": (2232320, 0, set()),
    "nvidia_drm": (151552, 0, set()),
    "nvidia_modeset": (1908736, 2, {"nvidia_drm"}),
    "nvidia": (111489024, 100, {"nvidia_uvm", "nvidia_peermem", "nvidia_drm", "nvidia_modeset"}),
}
# Where the kernel has no module support (no /proc/modules to cover, and /proc is never
# shadowed), lsmod is given the mount's proc/modules in a namespace of its own; /sys/module is
# still the one `mokka run` set up.
STAGED_LSMOD = """set -e
stage=$(mktemp -d)
mount -t tmpfs none "$stage"
: > "$stage/modules"
mount --bind "$MOKKA_ROOT/proc/modules" "$stage/modules"
mount --rbind "$stage" /proc
exec lsmod
"""


def _parse_modules(text: str) -> dict[str, tuple[int, int, set[str]]]:
    out = {}
    for line in text.splitlines():
        f = line.split()
        out[f[0]] = (int(f[1]), int(f[2]), set() if f[3] == "-" else set(f[3].rstrip(",").split(",")))
    return out


def test_the_mounts_proc_modules_lists_the_driver_for_mig_parted(node):
    text = node.read("proc/modules")
    mods = _parse_modules(text)
    assert {k: v for k, v in mods.items() if k.startswith("nvidia")} == NODE_MODULES
    # mig-parted's IsNvidiaModuleLoaded: the file's trimmed lines, one whose first field is nvidia
    assert any(line.split()[0] == "nvidia" for line in text.strip().split("\n"))
    assert all(" Live 0x0000000000000000" in line for line in text.splitlines())
    assert node.read("driver/proc/modules") == text


def test_mokka_run_shows_proc_modules_where_the_kernel_has_it(node):
    res = run(node, "cat", "/proc/modules", check=False)
    if os.path.exists("/proc/modules"):
        host = Path("/proc/modules").read_text()
        mods = _parse_modules(res.stdout)
        assert res.returncode == 0 and {k: mods[k] for k in NODE_MODULES} == NODE_MODULES
        assert {k for k in mods if not k.startswith("nvidia")} == {
            line.split()[0] for line in host.splitlines() if not line.startswith("nvidia")}
    else:
        # a kernel without module support (this VM's): nothing to cover, and mokka run says so
        assert res.returncode == 1 and "No such file" in res.stderr
        assert f"the node's list is {node.mnt}/proc/modules" in res.stderr


def test_lsmod_lists_the_driver_modules(node):
    assert shutil.which("lsmod"), "kmod's lsmod missing (apt install kmod)"
    cmd = ("lsmod",) if os.path.exists("/proc/modules") else ("unshare", "-m", "sh", "-c", STAGED_LSMOD)
    lines = run(node, *cmd).stdout.splitlines()
    assert lines[0].split() == ["Module", "Size", "Used", "by"]
    seen = {}
    for line in lines[1:]:
        f = line.split()
        seen[f[0]] = (int(f[1]), int(f[2]), set(f[3].split(",")) if len(f) > 3 else set())
    # lsmod takes the size from sys/module/<name>/coresize, the count from refcnt, the users from
    # holders/: all of them bound by mokka run, agreeing with proc/modules
    assert {k: seen[k] for k in NODE_MODULES} == NODE_MODULES
    out = run(node, "sh", "-c", "cat /sys/module/nvidia_uvm/refcnt /sys/module/nvidia/initstate; "
                                "readlink /sys/module/nvidia/holders/nvidia_uvm; "
                                "cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm").stdout
    assert out == "0\nlive\n../../nvidia_uvm\nN\n"
