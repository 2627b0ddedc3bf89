"""The shared state's one client (shims/common/mokka_client.c) as the three shims use it, and
the daemon's repair of the state file. Levels: shims loaded by real consumers (pynvml,
cuda-python, nvidia-smi) over a published state and over real mounts: a shim finds the node of
the tree it was loaded from; NVML, CUDA and nvidia-smi read bus ids alike; a state file
overwritten, replaced or removed is repaired under live consumers, which follow it."""
from __future__ import annotations

import ctypes as C
import json
import os
import re
import shutil
import stat
import subprocess
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers_nvml import Nvml, Published, consumer_env
from helpers_smi import smi_binary
from mokkafs.render import native
from mokkafs.model.events import Pin
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("shims")

SUCCESS, INVALID_ARGUMENT, NOT_FOUND = 0, 2, 6
CUDA_INVALID_VALUE, CUDA_INVALID_DEVICE = 1, 101


def bare_env(**extra: str) -> dict[str, str]:
    """The caller's environment with no pointer to a node or a library: what a user has who only
    sets LD_LIBRARY_PATH to a mounted driver root (or nothing, for its nvidia-smi)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MOKKA_STATE", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")}
    env.update(extra)
    return env


def with_default_node(state_dir: Path, cmd: list[str]) -> list[str]:
    """`cmd` in a private mount namespace whose /run/mokka is `state_dir`: another node answers
    at the default place, as on a host with a node mounted there, without touching the host."""
    script = 'mount -t tmpfs none /run && mkdir /run/mokka && mount --bind "$1" /run/mokka && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(state_dir), *cmd]


NVML_NODE = """
import json, pynvml as p
p.nvmlInit()
n = p.nvmlDeviceGetCount()
print(json.dumps([p.nvmlDeviceGetName(p.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]))
"""

NVML_NO_NODE = """
import json, pynvml as p
try:
    p.nvmlInit()
    print(json.dumps("initialised"))
except p.NVMLError as e:
    print(json.dumps(str(e)))
"""

CUDA_NODE = """
import json, os, pynvml as p
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
n = d.cuDeviceGetCount()[1]
names = [d.cuDeviceGetName(96, d.cuDeviceGet(i)[1])[1].split(b"\\0")[0].decode() for i in range(n)]
err, ctx = d.cuCtxCreate(None, 0, d.cuDeviceGet(0)[1])
assert err == 0, err
assert d.cuMemAlloc(1 << 30)[0] == 0
p.nvmlInit()  # NVML of the same tree lists us: the process table's socket was found beside the state
procs = [x.pid for x in p.nvmlDeviceGetComputeRunningProcesses(p.nvmlDeviceGetHandleByIndex(0))]
print(json.dumps([names, procs == [os.getpid()]]))
"""


def _py(cmd_prefix: list[str], env: dict[str, str], code: str) -> list:
    r = subprocess.run([*cmd_prefix, sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_shim_loaded_from_a_mounted_tree_reads_that_tree_s_node(node_factory):
    """With only LD_LIBRARY_PATH=<mount>/driver/usr/lib64 (or <mount>/driver/usr/bin/nvidia-smi
    run by its path), each shim answers for its own tree while another node answers at
    /run/mokka/state; a library outside any tree finds no node (never that default place), and
    MOKKA_STATE still wins. The libraries of both trees are the same bytes: only discovery tells them apart."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is in the test extra")
    a = node_factory(profile="h100", gpus=2, name="a")
    b = node_factory(profile="a100", gpus=1, name="b")
    h100, a100 = [load_profile("h100").product_name] * 2, [load_profile("a100").product_name]

    def in_b(cmd: list[str]) -> list[str]:
        return with_default_node(b.state_dir, cmd)

    def lib(node) -> str:
        return str(node.mnt / "driver/usr/lib64")

    assert os.readlink(a.mnt / "driver/run/mokka") == str(a.state_dir)
    assert _py(in_b([]), bare_env(LD_LIBRARY_PATH=lib(a)), NVML_NODE) == h100
    assert _py([], bare_env(LD_LIBRARY_PATH=lib(b)), NVML_NODE) == a100
    # the package's own library, in no driver root and with no node socket: no node at all, even
    # with B at /run/mokka, which may be anyone's (docs/containers.md, "Finding the node")
    assert _py(in_b([]), bare_env(LD_LIBRARY_PATH=str(native.LIB_DIR)), NVML_NO_NODE) == "Driver Not Loaded"
    # MOKKA_STATE first: A's library told to read B reads B
    assert _py([], bare_env(LD_LIBRARY_PATH=lib(a), MOKKA_STATE=str(b.state_dir / "state")), NVML_NODE) == a100

    smi = in_b([str(a.mnt / "driver/usr/bin/nvidia-smi"), "-L"])
    out = subprocess.run(smi, env=bare_env(), capture_output=True, text=True, timeout=60)
    assert [re.sub(r" \(UUID.*", "", line) for line in out.stdout.splitlines()] == \
        [f"GPU {i}: {name}" for i, name in enumerate(h100)], out.stdout + out.stderr

    assert _py(in_b([]), bare_env(LD_LIBRARY_PATH=lib(a)), CUDA_NODE) == [h100, True]


def test_bus_ids_read_alike_in_nvml_cuda_and_nvidia_smi(tmp_path, monkeypatch, tmp_path_factory):
    """One grammar (the forms NVML and CUDA both document) and one answer per id, in all three."""
    pub = Published(tmp_path, "h100", 4)
    try:
        ident = pub.node.identities[2]
        bus = f"{ident.bdf.bus:02x}"
        found = [ident.bdf.nvml, ident.bdf.legacy, ident.bdf.nvml.lower(), f"{bus}:00.0", f"0000:{bus.upper()}:00"]
        absent = [f"0000:{bus}:00.1", "0000:99:00.0", f"0001:{bus}:00.0"]
        malformed = ["", "zz", f"{bus}:00", f"0x{bus}:00.0", f" {bus}:00.0", f"0000:{bus}:00.0 ", f"+{bus}:00.0",
                     f"000000000:{bus}:00.0", f"0000:{bus}:00.0.0", f"0000:{bus}:20.0", f"0000:{bus}:00.8"]
        cases = found + absent + malformed

        monkeypatch.setenv("MOKKA_STATE", str(pub.path))
        nvml = Nvml()
        assert nvml.nvmlInit_v2() == SUCCESS
        want_handle = C.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(2, C.byref(want_handle)) == SUCCESS
        nv = []
        for text in cases:
            h = C.c_void_p()
            r = nvml.nvmlDeviceGetHandleByPciBusId_v2(text.encode(), C.byref(h))
            nv.append(2 if r == SUCCESS and h.value == want_handle.value else r)
        nvml.nvmlShutdown()

        code = f"""
            import ctypes, json, os
            cu = ctypes.CDLL(os.environ["MOKKA_CUDA_LIB"])
            assert cu.cuInit(0) == 0
            out = []
            for text in {cases!r}:
                d = ctypes.c_int(-1)
                r = cu.cuDeviceGetByPCIBusId(ctypes.byref(d), text.encode())
                out.append(d.value if r == 0 else r)
            print(json.dumps(out))
        """
        env = dict(consumer_env(pub.path), MOKKA_CUDA_LIB=str(native.cuda_library()))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        cu = json.loads(r.stdout)

        smi = smi_binary(tmp_path_factory)
        sm = []
        for text in cases[: len(found) + len(absent)] + [c for c in malformed if c and not c.startswith(" ")]:
            # (its -i list drops the blanks before an item, and an empty -i is a usage error)
            r = subprocess.run([str(smi), "-i", text, "--query-gpu=index", "--format=csv,noheader"],
                               env=consumer_env(pub.path), capture_output=True, text=True, timeout=30)
            sm.append(int(r.stdout) if r.returncode == 0 else f"exit {r.returncode}")

        n = len(found), len(absent), len(malformed)
        assert nv == [2] * n[0] + [NOT_FOUND] * n[1] + [INVALID_ARGUMENT] * n[2]
        assert cu == [2] * n[0] + [CUDA_INVALID_DEVICE] * n[1] + [CUDA_INVALID_VALUE] * n[2]
        # nvidia-smi -i takes indices and UUIDs too; an id that names no GPU is "not found" (6)
        assert sm[: n[0]] == [2] * n[0] and set(sm[n[0]:]) == {"exit 6"}
    finally:
        pub.close()


# --- repair ----------------------------------------------------------------------------------

CONSUMER = """
import sys, pynvml as p
p.nvmlInit()
h = p.nvmlDeviceGetHandleByIndex(1)
s = p.nvmlEventSetCreate()
p.nvmlDeviceRegisterEvents(h, p.nvmlEventTypeXidCriticalError, s)
print("ready", flush=True)
for line in sys.stdin:
    if line.startswith("temp"):
        print(p.nvmlDeviceGetTemperature(h, 0), flush=True)
    elif line.startswith("wait"):
        try:
            print(p.nvmlEventSetWait_v2(s, 5000).eventData, flush=True)
        except p.NVMLError as e:
            print("error", e, flush=True)
"""

ONE_SHOT = """
import pynvml as p
p.nvmlInit()
print(p.nvmlDeviceGetTemperature(p.nvmlDeviceGetHandleByIndex(1), 0))
"""


def _ask(proc: subprocess.Popen, line: str) -> str:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def _overwrite_header(state: Path) -> None:
    with open(state, "r+b") as f:
        f.write(os.urandom(64))  # magic, version, size, seq, the event counters, generation


def _replace_with_copy(state: Path) -> None:
    copy = state.with_name("copy")
    shutil.copyfile(state, copy)
    os.replace(copy, state)


def _remove(state: Path) -> None:
    os.unlink(state)


@pytest.mark.parametrize("damage,message", [
    (_overwrite_header, r"the state file's header was overwritten; restoring it"),
    (_replace_with_copy, r"the state file was replaced by another file; putting a new one in its place"),
    (_remove, r"the state file was removed; putting a new one in its place"),
], ids=["header", "renamed-copy", "removed"])
def test_a_damaged_state_file_is_repaired_under_a_live_consumer(node_factory, damage, message):
    """On the daemon's next ticks the file is whole again, logged once; a pynvml process that
    mapped it before keeps answering current values and receiving events without re-init, and
    new consumers (pynvml, nvidia-smi) work."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    node.expect_warning(message)
    state = node.state_dir / "state"
    env = bare_env(LD_LIBRARY_PATH=str(node.mnt / "driver/usr/lib64"))  # found through the tree
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert consumer.stdout.readline().strip() == "ready"
        assert node.write("gpu1/temperature", b"61") == 0
        assert _ask(consumer, "temp") == "61"
        before = state.stat().st_ino
        damage(state)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # whole and ours again: a header of this layout at the path
            time.sleep(0.05)
            try:
                head = state.read_bytes()[:8]
            except FileNotFoundError:
                continue
            if head == b"MKASTATE" and (damage is _overwrite_header or state.stat().st_ino != before):
                break
        assert state.read_bytes()[:8] == b"MKASTATE"
        time.sleep(0.3)  # a few more ticks: still one line

        assert node.write("gpu1/temperature", b"73") == 0
        assert _ask(consumer, "temp") == "73"  # the consumer follows the repaired file
        consumer.stdin.write("wait\n")
        consumer.stdin.flush()
        time.sleep(0.2)
        assert node.write("gpu1/inject_xid", b"13") == 0
        assert consumer.stdout.readline().strip() == "13"

        one = subprocess.run([sys.executable, "-c", ONE_SHOT], env=env, capture_output=True, text=True, timeout=60)
        assert one.stdout.strip() == "73", one.stderr
        smi = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "-i", "1", "--query-gpu=temperature.gpu",
                              "--format=csv,noheader"], env=bare_env(), capture_output=True, text=True, timeout=60)
        assert smi.stdout.strip() == "73", smi.stdout + smi.stderr
    finally:
        consumer.kill()
        consumer.wait()
        consumer.stdin.close()
        consumer.stdout.close()
    lines = [l for l in (node.state_dir / "daemon.log").read_text().splitlines() if " WARNING " in l]
    assert [l for l in lines if re.search(message, l)] == lines and len(lines) == 1, lines


STALE_READER = """
import sys, time, pynvml as p
p.nvmlInit()
h = p.nvmlDeviceGetHandleByIndex(0)
print(p.nvmlDeviceGetTemperature(h, 0), flush=True)
sys.stdin.readline()
deadline = time.monotonic() + 5
while time.monotonic() < deadline:  # a poller's round: count the devices, read a value
    p.nvmlDeviceGetCount()
    t = p.nvmlDeviceGetTemperature(h, 0)
    if t == 77:
        break
print(t, round(time.monotonic() - deadline + 5, 1), flush=True)
"""


def test_a_consumer_that_mapped_a_copy_moves_to_the_daemon_s_file(tmp_path, expect_log):
    """A copy put at the path is never written nor retired by the daemon: a consumer that mapped
    it notices, on its once-a-round calls, that its generation stopped moving, and maps what is
    at the path then."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    expect_log(r"the state file was replaced by another file")
    pub = Published(tmp_path, "h100", 2)
    try:
        _replace_with_copy(pub.path)
        reader = subprocess.Popen([sys.executable, "-c", STALE_READER], env=consumer_env(pub.path),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            first = int(reader.stdout.readline())
            assert first != 77
            pub.apply(Pin(gpu=0, signal="temperature", values=(77,)))  # the daemon's publish: it repairs the path first
            reader.stdin.write("\n")
            reader.stdin.flush()
            temp, seconds = reader.stdout.readline().split()
            assert temp == "77" and float(seconds) < 3
        finally:
            reader.kill()
            reader.wait()
            reader.stdin.close()
            reader.stdout.close()
    finally:
        pub.close()


def test_the_publisher_logs_one_line_per_incident_and_keeps_its_counters(tmp_path, caplog, expect_log):
    """Without a mount: each kind of damage is one warning however many ticks see it, and the
    event counters consumers hold cursors into come back (or move over) unchanged."""
    from mokkafs.model.events import InjectXid
    from mokkafs.daemon.shm.layout import MAGIC, RETIRED

    caplog.set_level("WARNING", logger="mokkafs.daemon.shm.publisher")
    expect_log(r"the state file('s header)? was (overwritten|replaced by another file|removed)")
    pub = Published(tmp_path, "t4", 1)
    try:
        for _ in range(3):
            pub.apply(InjectXid(0, 13))
        counters = (pub.publisher._st.event_head, pub.publisher._st.event_wake)
        assert counters == (3, 3)
        for damage in (_overwrite_header, _replace_with_copy, _remove):
            caplog.clear()
            old = os.open(pub.path, os.O_RDONLY)
            damage(pub.path)
            for _ in range(5):  # five ticks
                pub.publisher.publish(pub.node)
            assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
            st = pub.publisher._st
            assert (st.magic, st.event_head, st.event_wake) == (MAGIC, *counters)
            assert os.stat(pub.path).st_ino == os.fstat(pub.publisher._fd).st_ino
            assert int.from_bytes(pub.path.read_bytes()[:8], "little") == MAGIC
            # the file readers mapped before: repaired in place, or retired for the new one
            was = int.from_bytes(os.pread(old, 8, 0), "little")
            os.close(old)
            assert was == (MAGIC if damage is _overwrite_header else RETIRED)
    finally:
        pub.close()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory-link"])
def test_the_daemon_never_follows_or_blocks_on_what_is_at_the_path(tmp_path, expect_log, kind):
    """A link at the path is replaced, its target untouched even when it is a valid state file
    (which a daemon following the link would adopt and write into); a FIFO is replaced at once.
    One line each."""
    from mokkafs.daemon.shm.layout import MAGIC

    expect_log(r"replacing what is there, not a (state|regular) file")
    path = tmp_path / "state"
    (tmp_path / "other").mkdir()
    Published(tmp_path / "other", "t4", 1).close()
    target = tmp_path / "other" / "state"
    before = target.read_bytes()
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "directory-link":
        path.symlink_to(tmp_path)
    else:
        os.mkfifo(path)
    pub = Published(tmp_path, "t4", 1)
    try:
        assert path.is_file() and not path.is_symlink()
        assert int.from_bytes(path.read_bytes()[:8], "little") == MAGIC
        assert target.read_bytes() == before
    finally:
        pub.close()


def with_socket_at_persistenced(sock: Path, cmd: list[str]) -> list[str]:
    """`cmd` in a private mount namespace whose /run/nvidia-persistenced/socket is `sock` (bound
    through any link, as a container runtime binds a CDI spec's mount) and /run holds nothing else."""
    script = ('mount -t tmpfs none /run && mkdir /run/nvidia-persistenced && touch /run/nvidia-persistenced/socket'
              ' && mount --bind "$1" /run/nvidia-persistenced/socket && shift && exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(sock), *cmd]


def the_node_socket_is_bound_at(link: Path, node_sock: Path) -> bool:
    """Whether `link` is the node's socket itself (a root daemon binds it there), not a link."""
    got, want = os.lstat(link), os.stat(node_sock)
    return stat.S_ISSOCK(got.st_mode) and (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino)


def test_a_library_outside_any_tree_finds_the_node_through_the_persistenced_socket(node_factory, tmp_path):
    """What NVIDIA's CDI spec mounts from a driver root, run/nvidia-persistenced/socket, is in a
    root mount's driver root the node's socket itself (bound there), which hands over the state
    file; a socket that answers nothing (a real nvidia-persistenced's) is no node, within a
    bounded wait."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    a = node_factory(profile="h100", gpus=2, name="a")
    link = a.mnt / "driver/run/nvidia-persistenced/socket"
    assert the_node_socket_is_bound_at(link, a.state_dir / "node.sock")
    env = bare_env(LD_LIBRARY_PATH=str(native.LIB_DIR))
    assert _py(with_socket_at_persistenced(link, []), env, NVML_NODE) == [load_profile("h100").product_name] * 2
    smi = subprocess.run(with_socket_at_persistenced(link, [str(native.LIB_DIR.parent / "bin" / "nvidia-smi"), "-L"]),
                         env=env, capture_output=True, text=True, timeout=60)
    assert smi.stdout.count("GPU ") == 2, smi.stdout + smi.stderr

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with silent:
        silent.bind(str(tmp_path / "silent.sock"))
        silent.listen(4)
        t0 = time.monotonic()
        assert _py(with_socket_at_persistenced(tmp_path / "silent.sock", []), env, NVML_NO_NODE) == "Driver Not Loaded"
        assert time.monotonic() - t0 < 10


def with_driver_root_alone(driver: Path, hide: Path, cmd: list[str]) -> list[str]:
    """`cmd` in a private mount namespace that has `driver` bound (recursively, as a runtime binds
    a hostPath) at /run/driver-root, `hide` (what holds the state directory) covered by an empty
    tmpfs, and nothing else in /run: a pod given the host's driver root alone, as NVIDIA's
    device plugin chart gives it at /driver-root."""
    script = ('mount -t tmpfs none /run && mkdir /run/driver-root && mount --rbind "$1" /run/driver-root'
              ' && mount -t tmpfs none "$2" && ! test -e "$3" && shift 3 && exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(driver), str(hide),
            str(hide / "a-state" / "node.sock"), *cmd]


POD_SMI = "/run/driver-root/usr/bin/nvidia-smi"


def test_a_pod_given_the_driver_root_alone_finds_the_node(node_factory, tmp_path):
    """The device plugin's pod mounts the host's driver root and loads our libnvidia-ml.so.1 from
    it, with no MOKKA_STATE and no state directory: a link to the node's socket would dangle
    there, the socket bound over the name does not. Bound again when someone removes the
    socket, and gone with the mount."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    a = node_factory(profile="h100", gpus=2, name="a")
    a.expect_warning("was removed or replaced; binding it again")
    env = bare_env(LD_LIBRARY_PATH="/run/driver-root/usr/lib64")
    names = [load_profile("h100").product_name] * 2

    def pod_sees_the_node() -> None:
        assert _py(with_driver_root_alone(a.mnt / "driver", tmp_path, []), env, NVML_NODE) == names
        smi = subprocess.run(with_driver_root_alone(a.mnt / "driver", tmp_path, [POD_SMI, "-L"]),
                             env=bare_env(), capture_output=True, text=True, timeout=60)
        assert smi.stdout.count("GPU ") == 2, smi.stdout + smi.stderr

    pod_sees_the_node()
    link, node_sock = a.mnt / "driver/run/nvidia-persistenced/socket", a.state_dir / "node.sock"
    node_sock.unlink()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (node_sock.exists() and the_node_socket_is_bound_at(link, node_sock)):
        time.sleep(0.05)
    assert the_node_socket_is_bound_at(link, node_sock)
    pod_sees_the_node()
    a.umount()
    with open("/proc/self/mounts") as f:
        assert not [line for line in f if f" {a.mnt}/" in line or f" {a.mnt} " in line]


NVML_SET = """
import json, pynvml as p
p.nvmlInit()
h = p.nvmlDeviceGetHandleByIndex(0)
out = {}
try:
    p.nvmlDeviceSetPowerManagementLimit(h, 500000)
    out["power"] = "ok"
except p.NVMLError as e:
    out["power"] = str(e)
try:
    p.nvmlDeviceSetMigMode(h, 1)
    info = p.nvmlDeviceGetGpuInstanceProfileInfo(h, p.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    gi = p.nvmlDeviceCreateGpuInstance(h, info.id)
    out["mig"] = p.nvmlGpuInstanceGetInfo(gi).id
except p.NVMLError as e:
    out["mig"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("who, allowed", [
    ([], True),  # the DRA plugin's pod: privileged, root with CAP_SYS_ADMIN
    (["setpriv", "--bounding-set", "-sys_admin"], False),  # a container's root
    (["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"], False),  # nobody
])
def test_a_pod_given_the_driver_root_alone_sets_and_makes_mig_devices_when_privileged(node_factory, tmp_path, who,
                                                                                        allowed):
    """A pod given the driver root alone (NVIDIA's DRA plugin: its dynamic MIG creates GPU
    instances through NVML) has the node's socket, not the control socket beside the state file:
    NVML's setters send their command over the node's socket, under the control socket's rule
    (root with CAP_SYS_ADMIN, or the control group). Anyone else gets NO_PERMISSION, and nothing
    changes."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    a = node_factory(profile="h100", gpus=2, name="a")
    os.chmod(tmp_path, 0o755)
    env = bare_env(LD_LIBRARY_PATH="/run/driver-root/usr/lib64")
    before = a.read("gpu0/config"), a.read("gpu0/mig")
    got = _py([*with_driver_root_alone(a.mnt / "driver", tmp_path, []), *who], env, NVML_SET)
    if allowed:
        assert got["power"] == "ok" and isinstance(got["mig"], int), got
        assert "power_limit: 500" in a.read("gpu0/config")
        assert "mode: enabled" in a.read("gpu0/mig") and f"gi {got['mig']} " in a.read("gpu0/mig")
    else:
        assert got == {"power": "Insufficient Permissions", "mig": "Insufficient Permissions"}, got
        assert (a.read("gpu0/config"), a.read("gpu0/mig")) == before
        a.expect_warning("no_permission from uid")
