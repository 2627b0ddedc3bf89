"""The shared state layout: Python (cffi) and C agree on every size and offset, and the publisher
writes what a reader of the header expects."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from mokkafs.model import Node, compose
from mokkafs.model.outcome import Notification
from mokkafs.model.profiles import load_profile
from mokkafs.daemon.shm.layout import MAGIC, STATE_SIZE, VERSION, ffi, header_path
from mokkafs.daemon.shm.publisher import Publisher

pytestmark = pytest.mark.level("daemon")

STRUCTS = ["mokka_nvlink", "mokka_gpu_process", "mokka_gpu", "mokka_event", "mokka_state", "mokka_proc_record"]


def _python_layout() -> dict[str, int]:
    out = {}
    for name in STRUCTS:
        t = ffi.typeof(f"struct {name}")
        out[f"sizeof {name}"] = ffi.sizeof(t)
        for field, _ in t.fields:
            out[f"{name}.{field}"] = ffi.offsetof(t, field)
    return out


def test_c_and_cffi_agree(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH")
    layout = _python_layout()
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "mokka_state.h"', "int main(void) {"]
    for key in layout:
        if key.startswith("sizeof "):
            struct = key.split()[1]
            lines.append(f'printf("%s %zu\\n", "{key}", sizeof(struct {struct}));')
        else:
            struct, field = key.split(".")
            lines.append(f'printf("%s %zu\\n", "{key}", offsetof(struct {struct}, {field}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", str(header_path().parent), str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c_layout = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in out.splitlines()}
    assert c_layout == layout
    assert len(layout) > 100  # every field was compared, not just the sizes


def test_publisher_writes_a_valid_file(tmp_path):
    node = Node(compose(load_profile("h100"), gpus=4), 1000.0)
    pub = Publisher(tmp_path / "state", clock=lambda: 1000.0)
    pub.open()
    try:
        pub.publish(node)
        st = pub._st
        assert (st.magic, st.version, st.size, st.gpu_count) == (MAGIC, VERSION, STATE_SIZE, 4)
        assert st.seq % 2 == 0 and st.generation == 1
        g = st.gpus[2]
        assert ffi.string(g.name) == b"NVIDIA H100 80GB HBM3"
        assert ffi.string(g.bus_id) == node.identities[2].bdf.nvml.encode()
        assert g.mem_total == 81559 << 20
        assert g.pci_device_id == 0x233010DE
        pub.append_events([Notification(2, 0x8, 48), Notification(2, 0x2, 1)])
        assert st.event_head == 2 and st.event_wake == 1
        assert (st.ring[0].seq, st.ring[0].gpu, st.ring[0].type, st.ring[0].data) == (1, 2, 8, 48)
        assert (st.ring[1].seq, st.ring[1].type) == (2, 2)
    finally:
        pub.close()
    assert os.path.getsize(tmp_path / "state") == STATE_SIZE


def test_restart_keeps_event_counters_and_replaces_bad_files(tmp_path, expect_log):
    expect_log(r"replacing an incompatible state file")
    path = tmp_path / "state"
    node = Node(compose(load_profile("t4"), gpus=1), time.time())
    pub = Publisher(path)
    pub.open()
    pub.publish(node)
    pub.append_events([Notification(0, 0x8, 13)])
    pub.close()
    pub = Publisher(path)
    pub.open()
    assert pub._st.event_head == 1 and pub._st.event_wake == 1
    pub.close()
    path.write_bytes(b"garbage")  # short and wrong: replaced, counters start over
    pub = Publisher(path)
    pub.open()
    assert pub._st.event_head == 0 and pub._st.magic == MAGIC
    pub.close()
    assert os.path.getsize(path) == STATE_SIZE


def test_the_arm_fence_is_built_and_callable():
    """x86 needs no barrier between the daemon's stores; Arm does, from libmokka-fence.so. The
    library must be built and load here too, or an Arm install would first fail on Arm."""
    from mokkafs.daemon.shm.layout import load_fence

    assert load_fence(tso=True)() is None
    fence = load_fence(tso=False)
    assert fence is not None and fence() is None


def test_an_event_checks_the_file_once_before_its_wake(tmp_path, monkeypatch, expect_log):
    """The subscriber publishes, then appends the event and wakes: the publish has just checked
    the file (a stat of the path and of the descriptor), so the append does not check it again,
    ~10 us less before every NVML waiter wakes. A file replaced meanwhile is still repaired, its
    ring with it, at the next publish."""
    import mokkafs.daemon.shm.publisher as publisher_module
    from mokkafs.model.events import InjectXid

    expect_log(r"the state file was replaced by another file")
    path = tmp_path / "state"
    node = Node(compose(load_profile("h100"), gpus=2), 1000.0)
    pub = Publisher(path, clock=lambda: 1000.0)
    pub.open()
    try:
        pub.publish(node)
        stats = []
        real_stat = publisher_module.os.stat
        monkeypatch.setattr(publisher_module.os, "stat",
                            lambda p, *a, **k: stats.append(p) or real_stat(p, *a, **k))
        pub(node, node.apply(InjectXid(1, 13), 1000.0))
        assert stats == [path]  # once, by the publish
        st = pub._st
        assert st.event_head == 1 and st.event_wake == 1 and st.ring[0].gpu == 1
        # Replaced between two events: the next event's publish puts a new file in its place,
        # with the first event's ring, then appends the second.
        os.rename(path, tmp_path / "moved")
        path.write_bytes(b"x" * STATE_SIZE)
        pub(node, node.apply(InjectXid(0, 13), 1000.0))
        assert os.stat(path).st_ino != os.stat(tmp_path / "moved").st_ino
        st = pub._st
        assert st.event_head == 2 and [st.ring[k].gpu for k in range(2)] == [1, 0]
    finally:
        pub.close()
