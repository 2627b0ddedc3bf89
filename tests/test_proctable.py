"""The daemon's side of the CUDA process table, against the file itself: real processes hold
real slot locks (the protocol of mokka_state.h), and the table is damaged the ways a person or
a buggy program would damage it. The shim's side is in test_cuda.py."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from mokkafs.controller import Controller
from mokkafs.proctable import PROCS_SIZE, ProcessTable, ffi, lock_owner

GIB = 1 << 30
SLOT = ffi.sizeof("struct mokka_proc_slot")
SLOT0 = ffi.offsetof("struct mokka_procs", "slot")
MEM0 = ffi.offsetof("struct mokka_procs", "mem")
SLOTS = 256

# A process that claims slot S the way the shim does (lock, then fill, then state 2), with
# `used` bytes on GPU G, and holds the lock until its stdin closes.
CLAIMER = """
import fcntl, os, struct, sys
path, s, g, used, pid = sys.argv[1], *map(int, sys.argv[2:])
fd = os.open(path, os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, s)
os.pwrite(fd, struct.pack("<IIQQ", 1, pid, 7, 1 << g), %(slot0)d + s * %(slot)d)
os.pwrite(fd, struct.pack("<Q", used), %(mem0)d + (g * %(slots)d + s) * 8)
os.pwrite(fd, struct.pack("<I", 2), %(slot0)d + s * %(slot)d)
print("ready", flush=True)
sys.stdin.read()
""" % {"slot0": SLOT0, "slot": SLOT, "mem0": MEM0, "slots": SLOTS}


@pytest.fixture
def pub(pub):
    """conftest's published node and table, with a controller that folds into it."""
    pub.controller = Controller(pub.node, None, time.time)
    pub.controller.subscribers.append(pub.publisher)
    return pub


def table_path(table: ProcessTable) -> str:
    """A path that opens the daemon's memfd: its descriptor in this (the daemon's) process."""
    return f"/proc/{os.getpid()}/fd/{table._fd}"


class Claimer:
    def __init__(self, table: ProcessTable, slot: int, gpu: int, used: int, pid: int = 0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLAIMER, table_path(table), str(slot), str(gpu), str(used), str(pid)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


def write_slot(table: ProcessTable, s: int, state: int, pid: int) -> None:
    with open(table_path(table), "r+b") as f:
        f.seek(SLOT0 + s * SLOT)
        f.write(state.to_bytes(4, "little") + pid.to_bytes(4, "little"))


def test_the_lock_holder_is_the_listed_pid_and_its_exit_frees_the_slot(pub):
    c = Claimer(pub.table, 3, 1, 2 * GIB, pid=12345)  # the slot's pid is not how we know it
    try:
        assert lock_owner(pub.table._fd, 3) == c.pid
        pub.table.fold(pub.controller)
        assert pub.node.processes[1] == ((c.pid, 2 * GIB),)
    finally:
        c.end()
    pub.table.fold(pub.controller)
    assert pub.node.processes[1] == ()
    assert pub.table.read().slot[3].state == 0


def test_a_slot_left_half_claimed_or_without_a_lock_is_freed(pub):
    write_slot(pub.table, 200, 1, os.getpid())  # a claimer that died between its steps, past `high`
    write_slot(pub.table, 5, 2, os.getpid())  # "live", but nobody holds its lock
    pub.table.fold(pub.controller)
    t = pub.table.read()
    assert (t.slot[200].state, t.slot[5].state, t.slot[5].pid) == (0, 0, 0)
    assert pub.node.processes == [()] * 4


def test_garbage_counters_are_clamped_and_warned_about_once(pub, caplog):
    cap = pub.node.profile.memory.total_mib << 20
    c = Claimer(pub.table, 0, 2, (1 << 63) + 5)
    try:
        with caplog.at_level(logging.WARNING, logger="mokkafs.proctable"):
            for _ in range(3):
                pub.table.fold(pub.controller)
        assert pub.node.processes[2] == ((c.pid, cap),)
        assert caplog.records == []
    finally:
        c.end()


def test_no_holder_can_resize_the_table_and_a_scribbled_header_is_rewritten(pub, caplog, expect_log):
    expect_log(r"the process table's header was overwritten by a consumer; rewrote it")
    c = Claimer(pub.table, 0, 1, GIB)
    try:
        with open(table_path(pub.table), "r+b") as f:
            for size in (0, PROCS_SIZE // 2, PROCS_SIZE + 4096):
                with pytest.raises(PermissionError):
                    os.ftruncate(f.fileno(), size)
            f.write(b"\xff" * 24)  # the header only
        with caplog.at_level(logging.WARNING, logger="mokkafs.proctable"):
            for _ in range(3):
                pub.table.fold(pub.controller)
        assert len(caplog.records) == 1
        assert pub.table.read().magic == 0x53434F5250414B4D and os.fstat(pub.table._fd).st_size == PROCS_SIZE
        assert pub.node.processes[1] == ((c.pid, GIB),)  # the slots were never at risk
    finally:
        c.end()


def test_a_daemon_restart_keeps_the_live_slots(pub):
    c = Claimer(pub.table, 9, 0, GIB)
    try:
        pub.table.close()  # the daemon is gone; only the claimer holds the table now
        again = ProcessTable(pub.table.path)
        again.open()
        try:
            again.fold(pub.controller)
            assert pub.node.processes[0] == ((c.pid, GIB),)
        finally:
            again.close()
    finally:
        c.end()
