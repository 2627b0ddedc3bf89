"""A whole daemon: an hour of a node in virtual time, in well under a second.

The daemon is started as `mokka mount` starts it (`daemon.start`: controller and persistence,
the publisher's tick into the state file, the process table, the mirror, /metrics, the refusal
summaries), on a `TrioClock` driven by trio's `MockClock`; only the kernel mount is left out and
the FUSE operations are called directly. Events go in at chosen simulated times, and what time
does to them is read back through the surfaces: the control files, the state file NVML reads,
the event log on disk and /metrics.
"""
from __future__ import annotations

import contextlib
import errno
import gc
import logging
import math
import mmap
import os
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyfuse3
import pytest
import trio
import trio.testing

import mokkafs.daemon.metrics_server  # noqa: F401  (the daemon imports it when asked for /metrics: not inside the timed hour)
from mokkafs.daemon.clock import TrioClock
from mokkafs.daemon.lifetime import Options, start
from mokkafs.model.profiles import load_profile
from mokkafs.daemon.shm.layout import RING, STATE_SIZE, ffi, state_path
from mokkafs.render.vfs import ROOT_INO

pytestmark = pytest.mark.level("daemon")

T0 = 1_800_000_000.0  # the simulated node's epoch
HOUR = 3600.0
TICK_S = 1.0
ROOT = pyfuse3.RequestContext()  # uid 0, as the kernel reports a root caller

H100 = load_profile("h100")
IDLE_W, LIMIT_W = H100.power.idle_w, H100.power.default_limit_w
IDLE_C, LOAD_C = H100.thermal.idle_c, H100.thermal.max_load_c
TAU_S = 40.0  # the die's thermal time constant (docs: temperature follows power)


class Stamped(logging.Handler):
    """Log records with the simulated time they were logged at."""

    def __init__(self, clock) -> None:
        super().__init__(logging.INFO)
        self.clock, self.lines = clock, []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((self.clock() - T0, record.getMessage()))


async def _inode(ops, path: str) -> int:
    inode = ROOT_INO
    for part in path.split("/"):
        inode = (await ops.lookup(inode, part.encode(), ROOT)).st_ino
    return inode


async def read(ops, path: str) -> str:
    info = await ops.open(await _inode(ops, path), os.O_RDONLY, ROOT)
    try:
        return (await ops.read(info.fh, 0, 65536)).decode()
    finally:
        await ops.release(info.fh)


async def write(ops, path: str, data: bytes) -> int:
    """0, or the errno the write was refused with."""
    info = await ops.open(await _inode(ops, path), os.O_WRONLY, ROOT)
    try:
        await ops.write(info.fh, 0, data)
    except pyfuse3.FUSEError as e:
        return e.errno
    finally:
        await ops.release(info.fh)
    return 0


async def http_get(port: int, path: str) -> str:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        body = b""
        while chunk := await stream.receive_some(65536):
            body += chunk
    return body.decode()


def metric(text: str, name: str, gpu: int) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'gpu="{gpu}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for gpu {gpu} not in /metrics")


def temperature_after(t: float, start_c: float, target_c: float) -> float:
    """First-order lag toward `target_c`, `t` seconds after it was `start_c`."""
    return target_c + (start_c - target_c) * math.exp(-t / TAU_S)


class Published:
    """The state file as NVML maps it."""

    def __init__(self, path) -> None:
        self._f = open(path, "rb")
        self._mm = mmap.mmap(self._f.fileno(), STATE_SIZE, prot=mmap.PROT_READ)
        self.st = ffi.from_buffer("struct mokka_state *", self._mm)

    def close(self) -> None:
        ffi.release(self.st)
        self._mm.close()
        self._f.close()


async def an_hour(base: Path, mock: trio.testing.MockClock) -> dict:
    origin = trio.current_time()
    clock = TrioClock(epoch=T0)  # T0 at `origin`
    opts = Options(
        mountpoint=str(base / "mnt"),  # never mounted: the operations are called directly
        gpus=2,
        state_dir=str(base / "state"),
        hostname="virtual",
        metrics="127.0.0.1:0",
        tick_s=TICK_S,
    )
    stamped = Stamped(clock)
    logging.getLogger("mokkafs").addHandler(stamped)
    out: dict = {"log": stamped.lines}

    async def at(t: float) -> None:
        await trio.sleep_until(origin + t)  # exactly T0 + t on the daemon's clock

    events = []  # (simulated time, event): every event the controller applied
    with contextlib.ExitStack() as stack:
        stack.callback(logging.getLogger("mokkafs").removeHandler, stamped)
        async with trio.open_nursery() as nursery:
            d = await start(opts, clock, stack, nursery)
            d.controller.subscribers.append(lambda node, outcome: events.append(clock() - T0))
            # Start-up takes no simulated time (no autojump while the mirror's first write runs in
            # its thread); from here on, time jumps whenever the daemon is idle.
            await d.mirror.ready.wait()
            mock.autojump_threshold = 0
            pub = Published(state_path(opts.state_dir))
            stack.callback(pub.close)
            st, ops = pub.st, d.ops
            generation0 = st.generation

            out["temp_start"] = await read(ops, "gpu0/temperature")
            await at(60)
            assert not await write(ops, "gpu0/utilization", b"100 100\n")  # full load: 700 W
            await at(60 + TAU_S)
            out["temp_tau"] = await read(ops, "gpu0/temperature")
            out["temp_tau_nvml"] = st.gpus[0].temp_gpu
            out["metrics_tau"] = await http_get(d.metrics[1], "/metrics")
            await at(60 + 10 * TAU_S)
            out["temp_settled"] = await read(ops, "gpu0/temperature")

            await at(1234.5)
            assert not await write(ops, "gpu1/inject_xid", b"13\n")
            slot = st.ring[(st.event_head - 1) % RING]
            out["xid_ring_ns"] = slot.time_ns
            out["xid_file"] = await read(ops, "gpu1/inject_xid")

            await at(1800)
            assert not await write(ops, "gpu0/utilization", b"auto\n")  # back to idle
            await at(1800 + TAU_S)
            out["temp_cooling"] = await read(ops, "gpu0/temperature")

            await at(2000)
            for _ in range(5):
                assert await write(ops, "gpu0/inject_xid", b"not a number\n") == errno.EINVAL

            # A CUDA process (a child standing in for one) with 2 GiB on GPU 0: its record is
            # folded into the model on the next tick, and dropped on the tick after it exits.
            child = subprocess.Popen(["sleep", "600"])
            try:
                await at(2500)
                record = d.procs.record_for(child.pid, os.getuid(), os.pidfd_open(child.pid))
                assert record is not None
                os.pwrite(record.fd, (1).to_bytes(8, "little"), ffi.offsetof("struct mokka_proc_record", "contexts"))
                os.pwrite(record.fd, (2 << 30).to_bytes(8, "little"), ffi.offsetof("struct mokka_proc_record", "mem"))
                await at(2500 + 1.5 * TICK_S)
                out["mem_with_process"] = await read(ops, "gpu0/memory_used")
                out["nvml_procs"] = [(p.pid, p.used_memory) for p in st.gpus[0].processes[0 : st.gpus[0].process_count]]
                out["child"] = child.pid
            finally:
                child.kill()
                child.wait()
            await at(2600)
            out["mem_after_process"] = await read(ops, "gpu0/memory_used")

            await at(3000)
            bdf = d.controller.node.identities[1].bdf.nvml.lower()[4:]
            out["mirror_had_gpu1"] = (d.mirror.path / "sys/bus/pci/devices" / bdf).exists()
            assert not await write(ops, "gpu1/inject_xid", b"79\n")  # fallen off the bus
            out["mirror_has_gpu1"] = (d.mirror.path / "sys/bus/pci/devices" / bdf).exists()

            await at(HOUR)
            out["now"] = clock()
            out["events"] = events
            out["ticks"] = st.generation - generation0 - len(events)
            out["publish_time_ns"] = st.publish_time_ns
            out["energy_mj"] = st.gpus[0].energy_mj
            out["metrics_end"] = await http_get(d.metrics[1], "/metrics")
            out["events_log"] = (base / "state" / "events.log").read_text()
            nursery.cancel_scope.cancel()
    return out


@pytest.fixture
def state_base(tmp_path):
    """Where the state directory goes: a tmpfs, as the daemon's default /run/mokka is, so that
    what the test measures is the daemon and not a busy disk under its persistence."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    base = Path(tempfile.mkdtemp(prefix="mokka-virtual-", dir="/dev/shm"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)  # nothing is mounted here: no kernel mount


def test_an_hour_in_virtual_time(state_base, expect_log):
    expect_log(r"EINVAL write gpu0/inject_xid")  # the refused writes at 2000 s, and their summary
    mock = trio.testing.MockClock()  # no autojump until the daemon has started
    # What the tests before this one left in the heap is not the daemon's: out of the
    # collector's sight, as `serve` does with what start-up made, or full collections over it
    # (0.3 s of CPU after the whole suite) would be timed as the daemon's hour.
    gc.collect()
    gc.freeze()
    try:
        began, cpu = time.perf_counter(), time.process_time()
        out = trio.run(an_hour, state_base, mock, clock=mock)
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        gc.unfreeze()
    print(f"an hour of the daemon in {wall:.3f} s ({cpu:.3f} s of CPU)")

    # Temperature follows power with a 40 s lag, read on every surface at its simulated time.
    assert out["temp_start"] == f"{IDLE_C}\n"
    at_tau = temperature_after(TAU_S, IDLE_C, LOAD_C)  # 63 % of the way to the load temperature
    assert out["temp_tau"] == f"{round(at_tau)}\n"
    assert abs(out["temp_tau_nvml"] - at_tau) <= 1  # published at the last tick, within TICK_S
    assert abs(metric(out["metrics_tau"], "DCGM_FI_DEV_GPU_TEMP", 0) - at_tau) <= 0.5
    assert out["temp_settled"] == f"{LOAD_C}\n"
    assert out["temp_cooling"] == f"{round(temperature_after(TAU_S, LOAD_C, IDLE_C))}\n"

    # Energy integrates power over the hour: idle, 1740 s at the limit, idle again.
    def energy_mj(t: float) -> float:
        return 1000 * (IDLE_W * 60 + LIMIT_W * 1740 + IDLE_W * (t - 1800))

    assert out["now"] == T0 + HOUR
    published_at = out["publish_time_ns"] / 1e9
    assert T0 + HOUR - TICK_S <= published_at <= T0 + HOUR  # the last tick's simulated time
    assert abs(out["energy_mj"] - energy_mj(published_at - T0)) <= 1
    metrics_j = metric(out["metrics_end"], "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0)
    assert abs(metrics_j - energy_mj(HOUR)) <= 1  # dcgm-exporter reports mJ under this name

    # The publisher ticked once per TICK_S of simulated time, besides publishing each event.
    assert abs(out["ticks"] - HOUR / TICK_S) <= 1, out["ticks"]

    # Events carry the simulated time they happened at: in the ring, the control file, the log.
    assert out["xid_ring_ns"] == int((T0 + 1234.5) * 1e9)
    iso = datetime.fromtimestamp(T0 + 1234.5, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert out["xid_file"] == f"13 {iso}\n"
    logged = [line.split(",", 1)[0] for line in out["events_log"].splitlines()]
    assert f"[{T0 + 1234.5}" in logged and f"[{T0 + 3000.0}" in logged

    # Refusals: one line at once, and the repeats summarised when the 10 s window has passed.
    refusals = [(t, m) for t, m in out["log"] if "inject_xid" in m]
    assert len(refusals) == 2, refusals
    assert refusals[0][0] == 2000 and "not a number" in refusals[0][1]
    assert "4 more like it" in refusals[1][1] and 2010 <= refusals[1][0] <= 2011

    # The process was listed from the tick after its record appeared, and gone after it exited.
    assert out["mem_with_process"] == "2048\n"
    assert out["nvml_procs"] == [(out["child"], 2 << 30)]
    assert out["mem_after_process"] == "0\n"
    # The mirror followed the Xid 79 (the GPU left the bus), as `mokka run` would see it.
    assert out["mirror_had_gpu1"] and not out["mirror_has_gpu1"]
    # What the hour costs (target: under 1 s of CPU) is bench/bench_virtual_time.py's to measure,
    # on a quiet machine: CPU time too moves with other load on 2 cores.
