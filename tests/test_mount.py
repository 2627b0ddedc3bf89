"""A real mount in a subprocess, driven from a shell the way a user drives it."""
from __future__ import annotations

import errno
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MountedNode, mokka_cmd
from mokkafs.daemon.paths import DEAD_MOUNT_ERRNOS

pytestmark = pytest.mark.level("mount")


def mounts_at_or_under(mnt: Path) -> list[str]:
    """The mount points of this namespace at `mnt` or below it (the FUSE mount, the node's socket
    a root daemon binds into its driver root)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p == str(mnt) or p.startswith(f"{mnt}/")]


SOCKET_BIND = "driver/run/nvidia-persistenced/socket"


def sh(script: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, **kw)


def test_the_readme_walkthrough(mounted: MountedNode):
    m = mounted.mnt
    out = sh(f"cat {m}/gpu0/info {m}/gpu0/temperature")
    assert out.returncode == 0, out.stderr
    assert "name: NVIDIA H100 80GB HBM3\n" in out.stdout
    assert "bus_id: 00000000:18:00.0\n" in out.stdout
    assert out.stdout.endswith("29\n")
    assert sh(f"echo 79 > {m}/gpu0/inject_xid").returncode == 0
    events = mounted.read("node/events")
    assert "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in events
    assert mounted.read("gpu0/lost") == "1\n"
    assert "health: lost" in mounted.read("gpu0/info")
    status = mounted.cli("status", "--root", str(m)).stdout
    assert "lost" in status.splitlines()[2] and "healthy" in status.splitlines()[3]
    assert sh(f"echo 1 > {m}/gpu0/reset").returncode == 0
    assert "health: healthy" in mounted.read("gpu0/info")


def test_tree_listing(mounted: MountedNode):
    top = sorted(os.listdir(mounted.mnt))
    assert {f"gpu{i}" for i in range(8)} | {"node"} <= set(top)
    assert sorted(os.listdir(mounted.path("gpu3"))) == sorted(
        [
            "info", "inject_xid", "inject_ecc", "temperature", "power", "utilization", "clocks",
            "throttle", "memory_used", "lost", "nvlink", "reset", "events", "config", "mig",
        ]
    )
    assert {"profile", "driver_version", "cuda_version", "gpu_count", "events", "reset"} <= set(
        os.listdir(mounted.path("node"))
    )
    assert mounted.read("node/gpu_count") == "8\n"
    assert mounted.read("node/driver_version") == "580.105.08\n"


def test_junk_writes_are_einval_and_change_nothing(mounted: MountedNode):
    mounted.expect_warning("EINVAL write")
    before = {f: mounted.read(f"gpu1/{f}") for f in ("info", "inject_xid", "inject_ecc", "nvlink", "throttle")}
    for rel, data in [
        ("gpu1/inject_xid", b"junk\n"),
        ("gpu1/inject_xid", b"79 79\n"),
        ("gpu1/inject_ecc", b"dbe -1\n"),
        ("gpu1/temperature", b"\x00\x01"),
        ("gpu1/nvlink", b"99 down\n"),
        ("gpu1/throttle", b"everything\n"),
        ("gpu1/lost", b"true\n"),
    ]:
        assert mounted.write(rel, data) == errno.EINVAL, rel
    assert {f: mounted.read(f"gpu1/{f}") for f in before} == before
    out = sh(f"echo banana > {mounted.mnt}/gpu2/inject_xid")
    assert out.returncode != 0 and "Invalid argument" in out.stderr
    log = (mounted.state_dir / "daemon.log").read_text()
    assert "EINVAL write gpu2/inject_xid: b'banana\\n': Xid must be a decimal number" in log
    # the second junk write to gpu1/inject_xid within the window is counted, not logged
    assert "b'junk\\n'" in log and "b'79 79\\n'" not in log


def test_read_only_files_and_unknown_paths(mounted: MountedNode):
    mounted.expect_warning("EACCES open gpu0/info: not writable")
    with pytest.raises(PermissionError):
        mounted.path("gpu0/info").write_text("x")
    with pytest.raises(FileNotFoundError):
        mounted.read("gpu8/info")
    with pytest.raises(OSError):
        (mounted.mnt / "newfile").write_text("x")


def test_pins_show_on_read(mounted: MountedNode):
    assert mounted.write("gpu2/utilization", b"90 40\n") == 0
    assert mounted.read("gpu2/utilization") == "90 40\n"
    assert float(mounted.read("gpu2/power")) > 600
    assert mounted.write("gpu2/throttle", b"hw_thermal_slowdown\n") == 0
    assert mounted.read("gpu2/throttle") == "hw_slowdown hw_thermal_slowdown\n"
    assert mounted.write("gpu2/memory_used", b"40000\n") == 0
    assert mounted.read("gpu2/memory_used") == "40000\n"
    assert mounted.write("gpu2/clocks", b"1400 2619\n") == 0
    assert mounted.read("gpu2/clocks") == "1400 2619\n"
    assert mounted.write("gpu2/nvlink", b"3 down\n") == 0
    assert mounted.read("gpu2/nvlink").splitlines()[3].startswith("3 down")
    assert mounted.write("node/reset", b"1\n") == 0
    assert mounted.read("gpu2/utilization") == "0 0\n"


def test_cli_inject_and_its_errors(mounted: MountedNode):
    root = str(mounted.mnt)
    assert mounted.cli("inject", "--root", root, "3", "xid", "48").returncode == 0
    assert "volatile dbe 1" in mounted.read("gpu3/inject_ecc")
    bad = mounted.cli("inject", "--root", root, "3", "xid", "zero", check=False)
    assert bad.returncode == 2 and "Xid must be a decimal number" in bad.stderr
    missing = mounted.cli("inject", "--root", root, "9", "xid", "79", check=False)
    assert missing.returncode == 2 and "No such file" in missing.stderr


def test_sigterm_unmounts_cleanly(mounted: MountedNode):
    from mokkafs.cli.main import _alive
    from mokkafs.daemon.paths import is_mounted

    pid = mounted.daemon_pid()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(pid)
    assert not is_mounted(str(mounted.mnt))  # unmounted by the daemon itself, not left dead
    assert mounts_at_or_under(mounted.mnt) == []  # the node's socket bound below it too
    assert os.listdir(mounted.mnt) == []


def test_kill_9_then_remount_clears_the_stale_mount_and_restores_state(node_factory):
    node = node_factory(profile="h100", gpus=4)
    node.expect_warning("clearing stale mount")
    assert node.write("gpu1/inject_xid", b"79\n") == 0
    assert node.write("gpu2/inject_ecc", b"sbe 12 l2\n") == 0
    assert node.write("gpu3/temperature", b"91\n") == 0
    node.kill9()
    with pytest.raises(OSError) as err:
        os.stat(node.mnt / "node")
    assert err.value.errno in DEAD_MOUNT_ERRNOS
    assert mounts_at_or_under(node.mnt) == [str(node.mnt), str(node.mnt / SOCKET_BIND)]
    node.mount()
    # The dead daemon's mount went with the socket bound below it; the new daemon bound its own.
    assert mounts_at_or_under(node.mnt) == [str(node.mnt), str(node.mnt / SOCKET_BIND)]
    assert node.read("gpu1/lost") == "1\n"
    assert "volatile sbe l2 12" in node.read("gpu2/inject_ecc")
    assert node.read("gpu3/temperature") == "91\n"
    assert node.read("node/events").count("NVRM: Xid (PCI:0000:1e:00): 79,") == 1


def test_mounting_twice_is_refused(node_factory):
    node = node_factory(gpus=1)
    other_state = node.state_dir.parent / "other-state"
    out = node.cli("mount", str(node.mnt), "--gpus", "1", "--state-dir", str(other_state), check=False)
    assert out.returncode == 1 and "already a mount point" in out.stderr
    assert node.read("node/gpu_count") == "1\n"


def test_bad_profile_and_state_are_clear_errors(tmp_path, node_factory):
    node = node_factory(mount=False)
    node.expect_warning(" ERROR ")
    out = node.cli("mount", str(node.mnt), "--profile", "h900", "--state-dir", str(node.state_dir), check=False)
    assert out.returncode == 2 and "unknown profile 'h900'" in out.stderr and "h100" in out.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nproduct_nam: y\n")
    out = node.cli("mount", str(node.mnt), "--profile", str(broken), "--state-dir", str(node.state_dir), check=False)
    assert out.returncode == 2 and "broken.yaml" in out.stderr and "product_nam" in out.stderr
    node.state_dir.mkdir(exist_ok=True)
    (node.state_dir / "node.json").write_text("{torn")
    out = node.cli("mount", str(node.mnt), "--state-dir", str(node.state_dir), check=False)
    assert out.returncode == 1 and "node.json" in out.stderr and "unreadable state" in out.stderr
    assert not os.path.ismount(node.mnt)


def test_a_driver_branch_that_cannot_drive_the_board_is_refused(tmp_path, node_factory):
    """A B200 at 550 (Blackwell needs R570): the mount is refused with the first branch that can."""
    node = node_factory(mount=False)
    node.expect_warning(" ERROR ")
    out = node.cli("mount", str(node.mnt), "--profile", "b200", "--driver-version", "550.163.01",
                   "--state-dir", str(tmp_path / "b200-state"), check=False)
    assert out.returncode == 2, out
    assert "driver 550.163.01 cannot drive NVIDIA B200" in out.stderr and "R570" in out.stderr, out.stderr
    assert not os.path.ismount(node.mnt)


def test_profiles_command_lists_all_shipped(node_factory):
    node = node_factory(mount=False)
    lines = node.cli("profiles").stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["a100", "a100-80gb", "a10g", "b200", "gb200", "gb300", "h100",
                                                   "h100-nvl", "h200", "l4", "l40s", "t4"]
    assert "NVIDIA H100 80GB HBM3" in lines[6]
    # one column for every name, however long; one GPU is "1 GPU"
    assert len({line.index("NVIDIA") if "NVIDIA" in line else line.index("Tesla") for line in lines}) == 1, lines
    assert "1 GPU, driver" in lines[2] and "1 GPUs" not in "\n".join(lines)


@pytest.mark.parametrize("args", [("status", "--root", "MNT"), ("profile", "list"), ("profile", "nodes")])
def test_a_reader_that_goes_away_ends_the_listing_quietly(mounted: MountedNode, args):
    """`mokka status | head -1`: exit 0 with nothing on stderr (no BrokenPipeError traceback)
    when the reader has gone away, as other tools stop when their reader has what it wanted.
    `true` reads nothing and exits long before mokka has started, so every write meets EPIPE."""
    cmd = " ".join(shlex.quote(a.replace("MNT", str(mounted.mnt))) for a in (*mokka_cmd(), *args))
    res = subprocess.run(["bash", "-o", "pipefail", "-c", f"{cmd} | true"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stderr == "", res


def test_state_files_are_plain_json(mounted: MountedNode):
    assert mounted.write("gpu0/inject_xid", b"63\n") == 0
    saved = json.loads((mounted.state_dir / "gpu0.json").read_text())
    assert saved["remap_pending"] is True and saved["last_xid"] == 63


def test_kmsg_gets_the_driver_line(node_factory):
    """`--kmsg`: each Xid also lands in the kernel log, where node-problem-detector reads it."""
    node = node_factory(gpus=2, mount=False)
    node.mount(extra=("--kmsg",))
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(fd, 0, os.SEEK_END)  # only records written from now on
        assert node.write("gpu1/inject_xid", b"48\n") == 0
        assert node.write("gpu1/temperature", b"80\n") == 0  # not an Xid: not for the kernel log
        records = []
        while True:
            try:
                records.append(os.read(fd, 8192).decode(errors="replace"))
            except BlockingIOError:
                break
    finally:
        os.close(fd)
    ours = [r.split(";", 1)[1].strip() for r in records if "NVRM" in r or "mokka:" in r]
    assert ours == [
        "NVRM: Xid (PCI:0000:1e:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error "
        "(DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
    ]


def test_cached_names_follow_events(mounted: MountedNode):
    """The kernel caches names and absences; an event that removes or adds a name must be seen
    at once, however often the name was looked up before."""
    dev = mounted.path("sys/bus/pci/devices/0000:24:00.0")
    for _ in range(3):
        assert dev.exists()
    assert mounted.write("gpu2/inject_xid", b"79\n") == 0
    for _ in range(3):
        assert not dev.exists()  # the absence is now cached...
    assert mounted.write("gpu2/reset", b"1\n") == 0
    assert dev.exists()  # ...and forgotten when the GPU comes back
    assert (dev / "vendor").read_text() == "0x10de\n"


def test_cli_inject_kinds_are_the_control_commands():
    from mokkafs.cli.main import INJECT_KINDS
    from mokkafs.model.commands import VERBS

    assert sorted(INJECT_KINDS) == sorted(VERBS["gpu"])


def test_a_truncated_shared_state_file_is_restored_not_fatal(node_factory):
    """Root can truncate the mapped state file; the daemon must not die of the SIGBUS."""
    node = node_factory(gpus=2)
    node.expect_warning(r"the state file was truncated under the daemon; restoring it")
    state = node.state_dir / "state"
    size = state.stat().st_size
    os.truncate(state, 0)
    deadline = time.monotonic() + 10
    while state.stat().st_size != size and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state.stat().st_size == size
    assert node.write("gpu1/temperature", b"91") == 0  # an event publishes into the restored file
    smi = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "--query-gpu=index,temperature.gpu",
                          "--format=csv,noheader"], env=dict(os.environ, MOKKA_STATE=str(state),
                                                             LD_LIBRARY_PATH=str(node.mnt / "driver/usr/lib64")),
                         capture_output=True, text=True, timeout=30)
    assert smi.stdout.splitlines()[1] == "1, 91", smi.stdout + smi.stderr


def test_a_second_daemon_on_the_same_state_directory_is_refused_and_changes_nothing(node_factory):
    import socket

    node = node_factory(gpus=1)
    node.expect_warning(r"is in use by another mokka daemon")  # the refused one's own log line
    sock = node.state_dir / "state.procs.sock"
    before = sock.stat().st_ino
    out = node.cli("mount", str(node.mnt.parent / "elsewhere"), "--gpus", "1", "--state-dir", str(node.state_dir),
                   check=False)
    assert out.returncode == 1 and "in use by another mokka daemon" in out.stderr
    assert sock.stat().st_ino == before  # the first daemon's socket was not taken over
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        assert s.recv(1) == b"\0"
    assert not (node.mnt.parent / "elsewhere").is_mount()


def test_the_readme_tree_table_lists_every_control_entry(mounted: MountedNode):
    """The README's table of the tree names every file of `node/`, `gpuN/` and `ib/mlx5_N/`
    a mounted node has, so a user reading it misses none."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("## The tree"):]
    table = table[: table.index("\n\n", table.index("| path |"))]
    named = set(re.findall(r"`((?:node|gpuN|ib/mlx5_N)/\w+)`", table))
    short = next(line for line in table.splitlines() if "`node/profile`, " in line)  # node/profile, `driver_version`...
    named |= {f"node/{n}" for n in re.findall(r", `(\w+)`", short)}
    have = {f"node/{n}" for n in os.listdir(mounted.mnt / "node")}
    have |= {f"gpuN/{n}" for n in os.listdir(mounted.mnt / "gpu0")}
    have |= {f"ib/mlx5_N/{n}" for n in os.listdir(mounted.mnt / "ib" / "mlx5_0")}
    assert sorted(have - named) == [], "README's tree table lacks these"


def test_the_event_log_reports_its_real_size_so_tail_shows_the_last_line(mounted: MountedNode):
    """node/events grows past 4 KiB: stat says its length, so `tail -1` (which seeks from the
    size stat gives) prints the last line, not a stale cut one."""
    import subprocess

    for k in range(120):
        mounted.write(f"gpu{k % 8}/temperature", f"{40 + k % 50}\n".encode())
    text = mounted.read("node/events")
    assert len(text) > 4096
    assert (mounted.mnt / "node/events").stat().st_size == len(text.encode())
    last = subprocess.run(["tail", "-1", str(mounted.mnt / "node/events")], capture_output=True, text=True,
                          check=True).stdout
    assert last == text.splitlines(keepends=True)[-1]
    gpu3 = mounted.read("gpu3/events")
    assert (mounted.mnt / "gpu3/events").stat().st_size == len(gpu3.encode())
    # A stat with no read between: the kernel keeps no size of a file that grows, or `tail -f`
    # (which reads only when stat says the file grew) sat on the length it saw last.
    mounted.write("gpu3/inject_xid", b"13\n")
    assert (mounted.mnt / "gpu3/events").stat().st_size > len(gpu3.encode())
    assert (mounted.mnt / "node/events").stat().st_size > len(text.encode())


def test_tail_f_follows_the_event_log(mounted: MountedNode):
    """`tail -f node/events` keeps its descriptor, sleeps, stats it and reads on from where it
    was: it printed nothing after its start, the size stat gave being kept by the kernel and
    every read of the descriptor the text at its open."""
    import select

    from helpers import killed_at_end

    assert mounted.write("gpu0/inject_xid", b"13\n") == 0
    tail = subprocess.Popen(["tail", "-n", "1", "-s", "0.1", "-f", str(mounted.mnt / "node/events")],
                            stdout=subprocess.PIPE)
    out = b""

    def next_line(timeout: float = 5.0) -> str:
        nonlocal out
        deadline = time.monotonic() + timeout
        while b"\n" not in out and select.select([tail.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            out += os.read(tail.stdout.fileno(), 65536)
        line, _, out = out.partition(b"\n")
        return line.decode()

    with killed_at_end(tail):
        assert ": 13, " in next_line()  # it has opened the log and read to its end
        for code in (48, 63):
            assert mounted.write("gpu1/inject_xid", f"{code}\n".encode()) == 0
            assert f"(PCI:0000:1e:00): {code}, " in next_line()


def test_umount_after_kill_9_clears_the_mount_and_the_socket_bound_in_it(node_factory):
    """`mokka umount` of a dead daemon's mount detaches the socket bound in its driver root too:
    nothing of the node stays mounted, and the mount point is a plain directory again."""
    node = node_factory(gpus=1)
    assert mounts_at_or_under(node.mnt) == [str(node.mnt), str(node.mnt / SOCKET_BIND)]
    node.kill9()
    node.umount()
    assert mounts_at_or_under(node.mnt) == []
    assert os.listdir(node.mnt) == []
