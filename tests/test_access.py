"""Who may change the node, on a real mount. Control files are root's (or the
control group's), the kernel and the daemon both refuse everyone else, and refusals cannot grow
the daemon log without bound. Unit tests of the pure rate limiter come first."""
from __future__ import annotations

import grp
import os
import stat
import subprocess
import tempfile
import types
from pathlib import Path

import pytest

from mokkafs.daemon.ratelimit import RateLimiter
from tests.conftest import MountedNode, force_unmount

pytestmark = pytest.mark.level("mount")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


# --- the limiter (pure, explicit times) ---------------------------------------------------------


def test_limiter_logs_the_first_then_counts_repeats_per_key():
    lim = RateLimiter(window_s=10, max_keys=8)
    assert lim.hit(("EACCES", "open", "gpu0/lost"), 0.0) == (True, [])
    for t in range(1, 6):
        assert lim.hit(("EACCES", "open", "gpu0/lost"), float(t)) == (False, [])
    # another file is another key: logged at once
    assert lim.hit(("EACCES", "open", "gpu1/lost"), 6.0)[0] is True
    due = lim.flush(10.5)
    assert [(s.key[2], s.count) for s in due] == [("gpu0/lost", 5)]
    assert "and 5 more like it" in due[0].line()
    # after the window, the same key logs its line again
    assert lim.hit(("EACCES", "open", "gpu0/lost"), 11.0)[0] is True


def test_limiter_state_is_bounded_and_loses_no_count():
    lim = RateLimiter(window_s=10, max_keys=4)
    due = []
    for i in range(100):
        for _ in range(3):
            due += lim.hit(("EINVAL", "write", f"f{i}"), 1.0)[1]
        assert len(lim) <= 4
    due += lim.flush(1.0, everything=True)
    assert sum(s.count for s in due) == 200  # 100 keys x 2 repeats each, all summarised
    assert len(lim) == 0


# --- a real mount -------------------------------------------------------------------------------


@pytest.fixture
def public_tmp():
    """A directory every user may traverse: pytest's own tmp_path is root's 0700, so nobody would
    be refused there by the path, and the test could not tell our check from it."""
    d = Path(tempfile.mkdtemp(prefix="mokka-access-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    for mnt in d.glob("mnt*"):
        force_unmount(mnt)
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


def _mount(tmp: Path, extra: tuple[str, ...] = (), name: str = "mnt") -> MountedNode:
    node = MountedNode(tmp, gpus=2, name=name)
    node.mount(extra)
    return node


def _control_files(node: MountedNode) -> list[Path]:
    """Every file of the tree a write can reach the model through: found by its mode over the
    whole tree, not listed by hand. Links are not followed (sysfs links make cycles)."""
    out = []
    for dirpath, dirs, files in os.walk(node.mnt):
        if Path(dirpath) == node.mnt:
            dirs.remove("driver")  # the shims' files: 0755 like the driver's, refused to root too
        for f in files:
            p = Path(dirpath, f)
            st = p.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o222:
                out.append(p)
    return sorted(out)


def _as(user: list[str], *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([*user, *cmd], capture_output=True, text=True, timeout=30)


def _write_as(user: list[str], path: Path, data: str) -> subprocess.CompletedProcess:
    return _as(user, "sh", "-c", 'printf "%s" "$2" > "$1"', "sh", str(path), data)


def test_nobody_cannot_write_any_control_file(public_tmp):
    node = _mount(public_tmp)
    try:
        files = _control_files(node)
        assert node.path("gpu0/inject_xid") in files and node.path("node/reset") in files
        assert node.path("ib/mlx5_0/port1") in files, "the HCA port control files are control files too"
        before = (node.read("node/events"), node.read("gpu0/info"), node.read("gpu1/info"))
        for f in files:
            st = f.stat()
            # root's alone to write (0644, or 0200 for reset as in sysfs), everyone's to read
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode) & 0o222) == (0, 0, 0o200), f
            r = _write_as(NOBODY, f, "1\n")
            assert r.returncode != 0 and "Permission denied" in r.stderr, (f, r.stderr)
            r = _as(NOBODY, "/usr/bin/python3", "-c", f"import os; os.open({str(f)!r}, os.O_WRONLY)")
            assert "PermissionError" in r.stderr, (f, r.stderr)
        # the Xid that would have taken gpu0 off the bus, as nobody: nothing happened
        r = _write_as(NOBODY, node.path("gpu0/inject_xid"), "79")
        assert r.returncode != 0
        assert (node.read("node/events"), node.read("gpu0/info"), node.read("gpu1/info")) == before
        assert node.read("gpu0/lost").strip() == "0"
        # root may not write the driver's files either: they are not control files
        with pytest.raises(PermissionError):
            os.open(node.path("driver/usr/bin/nvidia-smi"), os.O_WRONLY)
        node.expect_warning(r"EACCES open driver/usr/bin/nvidia-smi: not writable")
        # nobody may still read everything
        assert _as(NOBODY, "cat", str(node.path("gpu0/info"))).returncode == 0
        # root may write
        assert node.write("gpu0/inject_xid", b"79\n") == 0
        assert node.read("gpu0/lost").strip() == "1"
        assert node.unexpected_log_lines() == []
    finally:
        node.umount()


def test_the_control_group_may_write_and_others_may_not(public_tmp):
    gid = grp.getgrnam("users").gr_gid
    node = _mount(public_tmp, ("--control-group", "users"))
    try:
        f = node.path("gpu1/temperature")
        st = f.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o664)
        member = ["setpriv", "--reuid=65534", "--regid=65534", f"--groups={gid}"]
        r = _write_as(member, f, "85")
        assert r.returncode == 0, r.stderr
        assert node.read("gpu1/temperature").strip() == "85"
        r = _write_as(NOBODY, f, "40")
        assert r.returncode != 0 and "Permission denied" in r.stderr
        assert node.read("gpu1/temperature").strip() == "85"
        # read-only files stay read-only for the group too
        assert stat.S_IMODE(node.path("gpu1/info").stat().st_mode) == 0o444
    finally:
        node.umount()


def test_an_unknown_control_group_is_refused_at_mount(public_tmp):
    node = MountedNode(public_tmp, gpus=1)
    r = node.cli(
        "mount", str(node.mnt), "--state-dir", str(node.state_dir), "--control-group", "no-such-group-here",
        check=False,
    )
    assert r.returncode != 0 and "no group 'no-such-group-here'" in r.stderr


def test_the_daemon_refuses_a_write_the_kernel_let_through(expect_log):
    """The daemon's own check, for a mount without default_permissions: a non-root request
    context is refused in open() with EACCES, whatever the modes said."""
    import errno

    import pyfuse3
    import trio

    from tests.test_fuse_ops import ROOT, ops as make_ops, walk

    ops = make_ops.__wrapped__()
    # pyfuse3's RequestContext is read-only: the handler reads uid, gid and pid, nothing else
    nobody = types.SimpleNamespace(uid=65534, gid=65534, pid=0, umask=0o022)
    expect_log(r"EACCES open gpu0/inject_xid: uid 65534 gid 65534 pid 0 may not write \(root only\)")

    async def main():
        inode = await walk(ops, "gpu0/inject_xid")
        with pytest.raises(pyfuse3.FUSEError) as e:
            await ops.open(inode, os.O_WRONLY, nobody)
        await ops.open(inode, os.O_WRONLY, ROOT)  # root is let through
        return e.value.errno

    assert trio.run(main) == errno.EACCES


def test_ten_thousand_bad_writes_grow_the_log_by_a_bounded_amount(public_tmp):
    node = _mount(public_tmp)
    try:
        log = node.state_dir / "daemon.log"
        size0 = log.stat().st_size
        fd = os.open(node.path("gpu0/inject_xid"), os.O_WRONLY)
        try:
            for _ in range(10_000):
                with pytest.raises(OSError):
                    os.write(fd, b"not an xid\n")
        finally:
            os.close(fd)
        node.umount()  # flushes the last summary
        text = log.read_text()
        grown = log.stat().st_size - size0
        assert grown < 4096, grown  # one line, one summary and the unmount lines; not 10,000 lines
        assert sum("not an xid" in line for line in text.splitlines()) == 1
        assert "more like it" in text
        node.expect_warning(r"EINVAL write gpu0/inject_xid")
        assert node.unexpected_log_lines() == []
    finally:
        node.umount()


def test_a_symlink_planted_as_the_daemon_log_is_not_followed(public_tmp):
    node = MountedNode(public_tmp, gpus=1)
    node.state_dir.mkdir(mode=0o755)
    target = public_tmp / "victim"
    target.write_text("untouched\n")
    (node.state_dir / "daemon.log").symlink_to(target)
    r = node.cli("mount", str(node.mnt), "--state-dir", str(node.state_dir), "--gpus", "1", check=False)
    assert r.returncode != 0
    assert target.read_text() == "untouched\n"
