"""The daemon's side of CUDA process accounting (level: the daemon's service and its records,
no mount): real processes connect to the real socket the way the shim does, as root and as
nobody, and do with their record what a buggy or hostile program would. The shim's side is in
test_cuda.py."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mokkafs.daemon.shm.layout import ffi
from mokkafs.daemon.shm.proctable import PER_UID, RECORD_SIZE, ProcessTable

pytestmark = pytest.mark.level("daemon")

GIB = 1 << 30
CONTEXTS = ffi.offsetof("struct mokka_proc_record", "contexts")
MEM = ffi.offsetof("struct mokka_proc_record", "mem")
OTHERS = ffi.offsetof("struct mokka_proc_record", "others")

# COUNT processes (forked) that each connect as the shim does, claim `used` bytes on GPU G and a
# context there, forge the record's pid as FORGE, ask to be folded, and report what they got:
# [pid, got a record, resize errnos, others on G]. They live until stdin closes.
CLAIMERS = """
import json, os, socket, struct, sys
sock, count, g, used, forge = sys.argv[1], *map(int, sys.argv[2:])
CONTEXTS, MEM, OTHERS = %(contexts)d, %(mem)d, %(others)d
rd, wr = os.pipe()
hold_r, hold_w = os.pipe()
for _ in range(count):
    if os.fork() == 0:
        os.close(rd)
        os.close(hold_w)
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        msg, fds, _, _ = socket.recv_fds(s, 1, 1)
        res = [os.getpid(), bool(fds), [], 0]
        if fds:
            fd = fds[0]
            for size in (0, os.fstat(fd).st_size + 4096):
                try:
                    os.ftruncate(fd, size)
                except OSError as e:
                    res[2].append(e.errno)
            os.pwrite(fd, struct.pack("<I", forge), 12)
            os.pwrite(fd, struct.pack("<Q", 1 << g), CONTEXTS)
            os.pwrite(fd, struct.pack("<Q", used), MEM + 8 * g)
            s.send(b"?")
            assert s.recv(1) == b"\\1"
            res[3] = struct.unpack("<Q", os.pread(fd, 8, OTHERS + 8 * g))[0]
        os.write(wr, (json.dumps(res) + "\\n").encode())
        os.read(hold_r, 1)  # until the parent goes
        os._exit(0)
os.close(wr)
with os.fdopen(rd) as f:
    out = [json.loads(f.readline()) for _ in range(count)]
print(json.dumps(out), flush=True)
sys.stdin.read()
""" % {"contexts": CONTEXTS, "mem": MEM, "others": OTHERS}


class Claimers:
    def __init__(self, pub, count: int, gpu: int, used: int, forge: int = 0, user: str | None = None) -> None:
        cmd = [sys.executable, "-c", CLAIMERS, str(pub.table.path) + ".sock", str(count), str(gpu), str(used),
               str(forge)]
        if user:
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        line = self.proc.stdout.readline()
        assert line, "the claimers failed"
        self.got = json.loads(line)
        self.pids = [pid for pid, *_ in self.got]

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def open_pub():
    """conftest's `pub`, under a directory every user may enter (pytest's tmp_path is 0700)."""
    import shutil
    import tempfile

    from conftest import _Service
    from helpers_nvml import Published
    from mokkafs.daemon.controller import Controller
    from mokkafs.daemon.shm.proctable import procs_path

    base = Path(tempfile.mkdtemp(prefix="mokka-"))
    base.chmod(0o755)
    p = Published(base, "h100", 4)
    p.table = ProcessTable(procs_path(p.path))
    p.table.open()
    p.controller = Controller(p.node, None, time.time)
    p.controller.subscribers.append(p.publisher)
    service = _Service(p.table, p.controller)
    yield p
    service.stop()
    p.table.close()
    p.close()
    shutil.rmtree(base, ignore_errors=True)


def gone(pub, pids) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.table.fold(pub.controller)
        if not set(pids) & set(pub.table.records):
            return True
        time.sleep(0.05)
    return False


def test_the_kernels_pid_is_listed_at_once_and_its_exit_frees_the_record(pub):
    c = Claimers(pub, 1, 1, 2 * GIB, forge=12345)  # the record's pid field is not how we know it
    try:
        pid, got, errnos, _ = c.got[0]
        assert got and errnos == [1, 1]  # its holder can write it, never resize it (EPERM)
        assert pub.node.processes[1] == ((pid, 2 * GIB),)  # folded before the answer, no tick
        assert pub.publisher._st.gpus[1].processes[0].pid == pid
        assert int.from_bytes(os.pread(pub.table.records[pid].fd, 4, 12), "little") == 12345
    finally:
        c.end()
    assert gone(pub, c.pids)
    assert pub.node.processes[1] == ()
    assert (pub.table.path.parent / "state.procs.id").read_text() == ""


def test_garbage_counters_are_clamped_without_a_warning(pub, caplog):
    cap = pub.node.profile.memory.total_mib << 20
    with caplog.at_level(logging.WARNING, logger="mokkafs.daemon.shm.proctable"):
        c = Claimers(pub, 1, 2, (1 << 63) + 5)
        try:
            for _ in range(3):
                pub.table.fold(pub.controller)
            assert pub.node.processes[2] == ((c.pids[0], cap),)
        finally:
            c.end()
    assert caplog.records == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as nobody")
def test_nobody_is_capped_and_counts_against_nobody_else(open_pub, expect_log):
    pub = open_pub
    expect_log(rf"uid 65534 has {PER_UID} CUDA processes accounted, its cap: pid \d+ and later ones run unaccounted")
    root = Claimers(pub, 2, 0, GIB)
    flood = Claimers(pub, PER_UID + 6, 0, 60 * GIB, forge=root.pids[0], user="nobody")
    try:
        assert [got for _, got, _, _ in flood.got].count(True) == PER_UID  # the rest: declined
        late = Claimers(pub, 1, 0, GIB)  # root is not limited by what nobody holds
        try:
            pub.table.fold(pub.controller)
            listed = dict(pub.node.processes[0])
            assert all(listed[p] == GIB for p in root.pids + late.pids)
            assert len(listed) == 64  # the state file's list is full, and root's are in it
            # root's processes count each other and nothing of nobody's; nobody's count root's
            others = {pid: int.from_bytes(os.pread(r.fd, 8, OTHERS), "little") for pid, r in pub.table.records.items()}
            assert [others[p] for p in root.pids + late.pids] == [2 * GIB] * 3
            cap = pub.node.profile.memory.total_mib << 20
            assert {others[p] for p, got, _, _ in flood.got if got} == {cap}  # 63 x 60 GiB + root's, clamped
        finally:
            late.end()
    finally:
        flood.end()
        root.end()
    assert gone(pub, flood.pids + root.pids)


def test_a_daemon_restart_adopts_the_live_records(pub):
    c = Claimers(pub, 2, 0, GIB)
    try:
        pub.table.close()  # the daemon is gone; only the claimers hold their records now
        again = ProcessTable(pub.table.path)
        again.open()
        try:
            assert sorted(again.records) == sorted(c.pids)
            assert all(os.fstat(r.fd).st_size == RECORD_SIZE for r in again.records.values())
            pub.node.processes[0] = ()
            again.fold(pub.controller)
            assert pub.node.processes[0] == tuple(sorted((p, GIB) for p in c.pids))
        finally:
            again.close()
    finally:
        c.end()


def test_the_id_file_is_not_trusted(pub, tmp_path):
    """A line naming a live process whose start time differs (a reused pid), garbage, and a
    link in place of the file: nothing adopted, and the link is replaced, not followed."""
    target = tmp_path / "target"
    target.write_text("keep\n")
    id_file = pub.table.path.parent / "state.procs.id"
    id_file.write_text(f"{os.getpid()} 1 2 3\nnot numbers\n-5 0 0 0\n")
    again = ProcessTable(pub.table.path)
    again.open()
    assert again.records == {}
    again.close()
    id_file.unlink()
    id_file.symlink_to(target)
    again = ProcessTable(pub.table.path)
    again.open()
    again.close()
    assert target.read_text() == "keep\n" and not id_file.is_symlink()


# One process that opens N connections and keeps them, reporting how many came with a record
# and how many distinct records it got; then pings one connection 1000 times.
CONNECTOR = """
import json, os, socket, sys
path, n = sys.argv[1], int(sys.argv[2])
socks, inos = [], set()
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(2)
    try:
        _, fds, _, _ = socket.recv_fds(s, 1, 1)
    except OSError:
        fds = []
    for fd in fds:
        inos.add(os.fstat(fd).st_ino)
        os.close(fd)
    socks.append((s, bool(fds)))
got = [s for s, ok in socks if ok]
for _ in range(1000):
    got[0].send(b"?")
    got[0].recv(1)
print(json.dumps([len(got), len(inos)]), flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as nobody")
def test_a_connection_flood_is_bounded_per_uid_and_pings_cannot_spin_the_daemon(open_pub, expect_log):
    from mokkafs.daemon.shm.proctable import CONNECTIONS_PER_UID, FOLDS_PER_CONNECTION

    pub = open_pub
    folds = []
    real_fold = pub.table.fold
    pub.table.fold = lambda controller: (folds.append(1), real_fold(controller))  # the service's calls
    expect_log(rf"uid 65534 has {CONNECTIONS_PER_UID} connections open to .*: refusing more")
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                          CONNECTOR, str(pub.table.path) + ".sock", str(CONNECTIONS_PER_UID + 40)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        got, records = json.loads(p.stdout.readline())
        assert (got, records) == (CONNECTIONS_PER_UID, 1)  # one process, one record, however it asks
        assert len(folds) == FOLDS_PER_CONNECTION  # 1000 pings, folded only up to the budget
        root = Claimers(pub, 1, 0, GIB)  # root still gets its record, listed at once
        try:
            assert root.got[0][1] and (root.pids[0], GIB) in pub.node.processes[0]
        finally:
            root.end()
    finally:
        p.stdin.close()
        p.wait(timeout=10)
        p.stdout.close()
