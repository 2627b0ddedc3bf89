"""The process table's side of memory claims: a record naming a MIG device is clamped to that
device's GPU instance, so a process cannot make the instance report more used than it has."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mokkafs.daemon.shm.layout import ffi, libc
from mokkafs.model.commands import parse_line

pytestmark = pytest.mark.level("daemon")

MIB = 1 << 20
OFFSETS = {f: ffi.offsetof("struct mokka_proc_record", f) for f in ("contexts", "mem", "mig")}

# One process that connects as the shim does, claims `used` bytes on GPU G on MIG device (gi, 0),
# asks to be folded, prints its pid and lives until stdin closes.
CLAIMER = """
import os, socket, struct, sys
sock, g, used, gi = sys.argv[1], *map(int, sys.argv[2:])
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
_, fds, _, _ = socket.recv_fds(s, 1, 1)
fd = fds[0]
os.pwrite(fd, struct.pack("<Q", 1 << g), %(contexts)d)
os.pwrite(fd, struct.pack("<Q", used), %(mem)d + 8 * g)
os.pwrite(fd, struct.pack("<I", %(on_mig)d | gi << 8), %(mig)d + 4 * g)
s.send(b"?")
assert s.recv(1) == b"\\1"
print(os.getpid(), flush=True)
sys.stdin.read()
""" % {**OFFSETS, "on_mig": libc.MOKKA_PROC_ON_MIG}


def test_a_claim_on_a_mig_device_is_capped_at_its_instance(pub):
    for line in ("gpu=1 mig enable", "gpu=1 mig create 1g.10gb"):
        pub.controller.apply(parse_line(line).event)
    (gi,), _ = pub.node.mig_devices(1)
    room = gi.profile.memory_mib * MIB
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(pub.table.path) + ".sock", "1",
                               str(81_559 * MIB), str(gi.id)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        pids = sorted(int(p.stdout.readline()) for p in procs)
        pub.table.fold(pub.controller)
        assert pub.node.processes[1] == tuple((pid, room) for pid in pids)  # listed, each at most its instance
        (gi,), (dev,) = pub.node.mig_devices(1)
        assert gi.memory_used_bytes == room  # two of them: still no more than it has
        pub.publisher.publish(pub.node)
        g = pub.publisher._st.gpus[1]
        (rec,) = [r for r in g.mig_gi[0:g.mig_gi_count] if r.id == gi.id]
        assert rec.memory_used == rec.memory_total
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=10)
            p.stdout.close()
