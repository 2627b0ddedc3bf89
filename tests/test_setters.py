"""Settings and their write channel (docs/setters.md), by level: the model and its table (level 0),
the control socket called directly and served (levels 1-2), and real consumers on a mounted node
(level 4): pynvml processes as root and as nobody, our nvidia-smi, /metrics, `mokka inject`,
a daemon killed, stopped and restarted."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, ServedInThread, force_unmount, world_readable_node
from mokkafs.daemon.clock import WallClock
from mokkafs.cli.control_client import NoDaemon, send
from mokkafs.daemon.control_protocol import control_path
from mokkafs.daemon.control_socket import CONNECTIONS_PER_UID, Caller, ControlSocket
from mokkafs.daemon.controller import Controller
from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model.commands import parse_line
from mokkafs.model.config import SETTINGS, Configure, GpuIsLost, NotSupported
from mokkafs.model.counters import EccScope
from mokkafs.model.events import Pin, Reset, SetLost, SetProcesses
from mokkafs.daemon.persist import StateDir
from mokkafs.model.profiles import load_profile
from mokkafs.render.control import render_config
from mokkafs.render.metrics import render_dcgm
from mokkafs.render.vfs import Ctx
from helpers import free_port, mount_env, run_py_json

pytestmark = pytest.mark.level("shims")

T0 = 1_800_000_000.0
# What follows locked_clocks in an H100's gpuN/config, all at their defaults.
LATER_DEFAULTS = "ecc_mode: 1\naccounting: 0\napplications_clocks: 2619 1980\nlocked_memory_clocks: 1593 2619\n"
DEFAULT_CONFIG = "persistence: 1\ncompute_mode: default\npower_limit: 700\nlocked_clocks: 345 1980\n" + LATER_DEFAULTS
SW_POWER_CAP = 0x4
NVML_NO_PERMISSION, NVML_INVALID_ARGUMENT, NVML_NOT_SUPPORTED, NVML_GPU_IS_LOST, NVML_UNKNOWN = 4, 2, 3, 15, 999
NVML_ARGUMENT_VERSION_MISMATCH = 25


def h100(gpus: int = 2) -> Node:
    return Node(compose(load_profile("h100"), gpus=gpus), T0)


# --- level 0: the model -------------------------------------------------------------------------


def test_a_lower_power_limit_caps_the_draw_and_raises_sw_power_cap():
    node = h100()
    for i in (0, 1):
        node.apply(Pin(i, "utilization", (90, 40)), T0)
    free = node.readings(1, T0 + 1)
    assert 630 < free.power_w < 640 and not free.throttle_mask & SW_POWER_CAP  # 90 % of 700 W asks ~637 W
    node.apply(Configure(1, "power_limit", 500.0), T0 + 1)
    capped = node.readings(1, T0 + 2)
    assert (capped.power_w, capped.power_limit_w) == (500.0, 500.0)
    assert capped.throttle_mask & SW_POWER_CAP and capped.clock_sm < free.clock_sm
    assert node.readings(0, T0 + 2) == node.readings(0, T0 + 2) and node.readings(0, T0 + 2).power_w == free.power_w
    # Temperature follows the draw: the capped GPU settles cooler than its uncapped twin.
    assert node.readings(1, T0 + 600).temperature_c < node.readings(0, T0 + 600).temperature_c
    node.apply(Pin(1, "utilization", (50, 20)), T0 + 3)  # asks ~384 W: under the cap
    assert not node.readings(1, T0 + 4).throttle_mask & SW_POWER_CAP


@pytest.mark.parametrize(
    "event,error,reason",
    [
        (Configure(1, "power_limit", 199.999), InvalidCommand, "power limit 199.999 W is outside h100's 200..700 W"),
        (Configure(1, "power_limit", 701.0), InvalidCommand, "outside h100's 200..700 W"),
        (Configure(1, "compute_mode", "exclusive_thread"), NotSupported, "no longer supported"),
        (Configure(0, "persistence", False), GpuIsLost, "gpu0 has fallen off the bus"),  # gpu0 is lost below
        (Configure(5, "persistence", False), InvalidCommand, "no GPU 5"),
    ],
)
def test_a_setting_the_board_refuses_changes_nothing(event, error, reason):
    node = h100()
    node.apply(SetLost(0, True), T0)
    before = ([g.to_dict() for g in node.gpus], node.generation, list(node.log))
    with pytest.raises(error, match=re.escape(reason)):
        node.apply(event, T0 + 1)
    assert ([g.to_dict() for g in node.gpus], node.generation, list(node.log)) == before


@pytest.mark.parametrize(
    "args,reason",
    [(("power_limit", "500"), "power limit must be a number"), (("power_limit", float("nan")), "a number"),
     (("persistence", 1), "expected a boolean"), (("compute_mode", "turbo"), "compute mode must be one of"),
     (("fan", 50), "unknown setting 'fan'")],
)
def test_a_configure_event_checks_its_own_value(args, reason):
    with pytest.raises(InvalidCommand, match=reason):
        Configure(0, *args)


H100_DEFAULTS = [True, "default", 700.0, (345, 1980), True, False, (2619, 1980), (1593, 2619)]


def test_a_gpu_reset_keeps_persistence_and_a_node_reset_restores_every_default():
    node = h100()
    changed = [False, "prohibited", 450.5, (1500, 1500), False, True, (2619, 1500), (2619, 2619)]
    for i in (0, 1):
        for setting, value in zip(SETTINGS, changed):
            node.apply(Configure(i, setting, value), T0)
    assert [node.setting(0, s) for s in SETTINGS] == changed and node.ecc_enabled(0)  # ECC: pending
    node.apply(Reset(1), T0 + 1)
    # Persistence, ECC mode (now in effect) and accounting are kept; the rest is back to the default.
    assert [node.setting(1, s) for s in SETTINGS] == [False, "default", 700.0, (345, 1980), False, True,
                                                      (2619, 1980), (1593, 2619)]
    assert not node.ecc_enabled(1)
    assert [node.setting(0, s) for s in SETTINGS] == changed and node.ecc_enabled(0)  # not reset
    node.apply(Reset(None), T0 + 2)
    # A driver reload: every default but the board's ECC mode, which gpu0's reset now brings in.
    assert [node.setting(i, s) for i in (0, 1) for s in SETTINGS] == [*H100_DEFAULTS[:4], False,
                                                                      *H100_DEFAULTS[5:]] * 2
    assert not node.ecc_enabled(0) and not node.ecc_enabled(1)


def test_ecc_mode_is_pending_until_a_reset_and_clearing_needs_it_on():
    node = h100()
    node.apply(parse_line("gpu=1 ecc sbe 3").event, T0)
    node.apply(Configure(1, "ecc_mode", False), T0)
    assert node.setting(1, "ecc_mode") is False and node.ecc_enabled(1)  # pending
    assert "ecc_mode: 0 (default 1) (current 1 until a reset)\n" in render_config(Ctx(node, T0), 1)
    node.apply(parse_line("gpu=1 clear_ecc volatile").event, T0)  # still on: allowed
    metrics = render_dcgm(node, T0)
    assert re.search(r'^DCGM_FI_DEV_ECC_CURRENT\{gpu="1",.*\} 1$', metrics, re.M)
    assert re.search(r'^DCGM_FI_DEV_ECC_PENDING\{gpu="1",.*\} 0$', metrics, re.M)
    assert re.search(r'^DCGM_FI_DEV_ECC_PENDING\{gpu="0",.*\} 1$', metrics, re.M)
    node.apply(Reset(1), T0 + 1)
    assert re.search(r'^DCGM_FI_DEV_ECC_CURRENT\{gpu="1",.*\} 0$', render_dcgm(node, T0), re.M)
    assert not node.ecc_enabled(1) and "ecc_mode: 0 (default 1)\n" in render_config(Ctx(node, T0), 1)
    with pytest.raises(NotSupported, match="runs with ECC off"):
        node.apply(parse_line("gpu=1 clear_ecc aggregate").event, T0 + 2)
    node.apply(Configure(1, "ecc_mode", True), T0 + 3)
    assert not node.ecc_enabled(1)
    node.apply(Reset(None), T0 + 4)
    assert node.ecc_enabled(1) and node.gpus[1].ecc_mode is None


def test_clearing_ecc_counts_zeroes_one_scope():
    node = h100()
    node.apply(parse_line("gpu=0 ecc sbe 3").event, T0)
    node.apply(parse_line("gpu=0 ecc dbe 2 l2").event, T0)
    scopes = lambda: {sc.name: sum(n for c, n in node.gpus[0].ecc.items() if c.scope is sc) for sc in EccScope}
    assert scopes() == {"VOLATILE": 5, "AGGREGATE": 5}
    node.apply(parse_line("gpu=0 clear_ecc volatile").event, T0 + 1)
    assert scopes() == {"VOLATILE": 0, "AGGREGATE": 5}
    node.apply(parse_line("gpu=0 ecc sbe 1").event, T0 + 2)
    node.apply(parse_line("gpu=0 clear_ecc aggregate").event, T0 + 3)
    assert scopes() == {"VOLATILE": 1, "AGGREGATE": 0}
    assert "mokka: gpu0 aggregate ECC counts cleared" in [e.text for e in node.log]


def test_accounting_keeps_a_record_per_process_after_it_exits():
    node = h100()
    node.apply(SetProcesses(1, ((50, 1 << 20),)), T0)  # running before accounting is on: never accounted
    node.apply(Configure(1, "accounting", True), T0)
    node.apply(Pin(1, "utilization", (80, 40)), T0)
    node.apply(SetProcesses(1, ((50, 1 << 20), (100, 1 << 30))), T0 + 1)
    node.apply(SetProcesses(1, ((50, 1 << 20), (100, 3 << 30))), T0 + 2)
    node.apply(Pin(1, "utilization", (0, 0)), T0 + 2)
    node.apply(SetProcesses(1, ((50, 1 << 20), (100, 2 << 30))), T0 + 3)
    running = node.accounting[1][100]
    assert (running.end, running.time_ms, running.max_memory) == (None, 0, 3 << 30)
    node.apply(SetProcesses(1, ((50, 1 << 20), (200, 0))), T0 + 5)
    assert list(node.accounting[1]) == [100, 200]
    done = node.accounting[1][100]
    # 80 % for 1 s, then 80 % until the fold at 3 s that saw it idle, then 0 % for 2 s: 40 %.
    assert (done.start, done.end, done.time_ms, done.max_memory, done.utilization()) == \
        (T0 + 1, T0 + 5, 4000, 3 << 30, (40, 20))
    node.apply(SetProcesses(1, ()), T0 + 6)  # pid 50 exits: a process of after the switch-on may reuse it
    node.apply(SetProcesses(1, ((50, 0),)), T0 + 7)
    assert list(node.accounting[1]) == [100, 200, 50]
    node.apply(parse_line("gpu=1 clear_accounting").event, T0 + 8)
    assert list(node.accounting[1]) == [50]  # the running one stays
    node.apply(Reset(1), T0 + 9)
    assert list(node.accounting[1]) == [50] and node.setting(1, "accounting")
    node.apply(Configure(1, "accounting", False), T0 + 10)
    assert node.accounting[1] == {} and node.accounting[0] == {}


def test_the_accounting_buffer_keeps_the_newest_4000():
    from mokkafs.model.accounting import ACCOUNTING_BUFFER

    node = h100()
    node.apply(Configure(0, "accounting", True), T0)
    for pid in range(1, ACCOUNTING_BUFFER + 11):
        node.apply(SetProcesses(0, ((pid, 0),)), T0 + pid)
    assert len(node.accounting[0]) == ACCOUNTING_BUFFER == 4000
    assert next(iter(node.accounting[0])) == 11


def test_applications_clocks_set_the_clocks_work_runs_at():
    node = h100()
    node.apply(Pin(1, "utilization", (90, 40)), T0)
    assert node.readings(1, T0).clock_graphics == 1980
    node.apply(Configure(1, "applications_clocks", (2619, 1500)), T0)
    loaded = node.readings(1, T0)
    assert (loaded.clock_graphics, loaded.clock_mem) == (1500, 2619) and loaded.throttle_mask & 0x2
    node.apply(Pin(1, "utilization", (0, 0)), T0)
    assert node.readings(1, T0).clock_graphics == 345  # idle: the idle clock, no reason
    assert not node.readings(1, T0).throttle_mask & 0x2
    # A pair nvmlDeviceGetSupportedMemoryClocks/GraphicsClocks list, and only those: the board's
    # second memory clock, and graphics clocks on the list's 15 MHz steps from the top.
    node.apply(Configure(1, "applications_clocks", (1593, 1980)), T0)
    node.apply(Pin(1, "utilization", (90, 40)), T0)
    loaded = node.readings(1, T0)
    assert (loaded.clock_graphics, loaded.clock_mem) == (1980, 1593)
    for bad in ((1000, 1500), (2619, 2000), (2619, 100), (2619, 1501), (1593, 1979), (2619, 330)):
        with pytest.raises(InvalidCommand, match="not a supported pair on h100"):
            node.apply(Configure(1, "applications_clocks", bad), T0)
    with pytest.raises(InvalidCommand, match="not h100's memory clocks"):
        node.apply(Configure(1, "locked_memory_clocks", (1000, 2619)), T0)


def test_resetting_nvlink_errors_clears_one_link():
    node = h100()
    for line in ("gpu=0 nvlink 1 errors 5", "gpu=0 nvlink 2 errors 7", "gpu=0 nvlink 1 reset_errors"):
        node.apply(parse_line(line).event, T0)
    assert list(node.gpus[0].nvlink_errors) == [2]
    with pytest.raises(InvalidCommand, match="link must be at most 17, got 18"):
        node.apply(parse_line("gpu=0 nvlink 18 reset_errors").event, T0)
    l40s = Node(compose(load_profile("l40s"), gpus=1), T0)
    with pytest.raises(NotSupported, match="l40s has no NVLinks"):
        l40s.apply(parse_line("gpu=0 nvlink 0 reset_errors").event, T0)


def test_the_reset_table_in_faults_md_is_the_model_s():
    doc = (REPO / "docs" / "faults.md").read_text()
    names = {"persistence mode": "persistence", "compute mode": "compute_mode", "power limit": "power_limit",
             "locked clocks": "locked_clocks", "ECC mode": "ecc_mode", "accounting mode": "accounting",
             "applications clocks": "applications_clocks", "locked memory clocks": "locked_memory_clocks"}
    rows = {m[1]: (m[2], m[3]) for m in re.finditer(rf"^\| ({'|'.join(names)}) \| (.+?) \| (.+?) \|$", doc, re.M)}
    assert set(rows) == set(names) and set(names.values()) == set(SETTINGS)
    for row, (gpu_reset, node_reset) in rows.items():
        s = SETTINGS[names[row]]
        assert gpu_reset.startswith("kept") == s.kept_by_gpu_reset, row
        assert node_reset.startswith("kept") == s.kept_by_node_reset, row
        assert node_reset.startswith(("back to", "kept")) or node_reset == "unlocked", row
        assert ("pending mode takes effect" in gpu_reset) == s.pending_until_reset, row
    table = (REPO / "docs" / "setters.md").read_text()
    for s in SETTINGS.values():
        assert f"| `{s.name}` |" in table and s.nvml in table, s.name


def test_a_value_equal_to_the_default_is_stored_as_the_default_and_logged():
    node = h100()
    node.apply(Configure(1, "power_limit", 500.0), T0)
    node.apply(Configure(1, "power_limit", 700.0), T0 + 1)
    node.apply(Configure(1, "persistence", None), T0 + 2)
    assert node.gpus[1].power_limit_w is None and node.gpus[1].persistence_mode is None
    assert [e.text for e in node.log] == ["mokka: gpu1 power_limit 500", "mokka: gpu1 power_limit 700 (default)",
                                          "mokka: gpu1 persistence 1 (default)"]


def test_gpu_config_shows_every_setting_and_marks_what_differs():
    node = h100()
    assert render_config(Ctx(node, T0), 1) == DEFAULT_CONFIG
    node.apply(Configure(1, "compute_mode", "exclusive_process"), T0)
    node.apply(Configure(1, "power_limit", 450.5), T0)
    assert render_config(Ctx(node, T0), 1) == (
        "persistence: 1\ncompute_mode: exclusive_process (default default)\npower_limit: 450.5 (default 700)\n"
        "locked_clocks: 345 1980\n" + LATER_DEFAULTS
    )
    assert render_config(Ctx(node, T0), 0) == DEFAULT_CONFIG


def test_the_publisher_copies_every_setting_from_the_model():
    from mokkafs.daemon.shm.layout import make_ffi
    from mokkafs.daemon.shm.publisher import fill_gpu

    node = h100()
    g = make_ffi().new("struct mokka_gpu *")
    fill_gpu(g, node, 1, T0)
    assert (g.persistence_mode, g.compute_mode, g.power_limit, g.power_enforced_limit) == (1, 0, 700000, 700000)
    for setting, value in (("persistence", False), ("compute_mode", "exclusive_process"), ("power_limit", 450.5)):
        node.apply(Configure(1, setting, value), T0)
    fill_gpu(g, node, 1, T0)
    assert (g.persistence_mode, g.compute_mode, g.power_limit, g.power_enforced_limit) == (0, 3, 450500, 450500)
    node.apply(Configure(1, "compute_mode", "prohibited"), T0)
    fill_gpu(g, node, 1, T0)
    assert g.compute_mode == 2
    assert (g.ecc_enabled, g.ecc_pending, g.accounting_mode, list(g.clock_app)) == (1, 1, 0, [1980, 1980, 2619, 1545])
    for setting, value in (("ecc_mode", False), ("accounting", True), ("applications_clocks", (2619, 1500))):
        node.apply(Configure(1, setting, value), T0)
    fill_gpu(g, node, 1, T0)
    assert (g.ecc_enabled, g.ecc_pending, g.accounting_mode, list(g.clock_app)) == (1, 0, 1, [1500, 1500, 2619, 1545])
    assert list(g.clock_default_app) == [1980, 1980, 2619, 1545]


def test_to_dict_is_a_copy_that_later_changes_never_reach():
    node = h100()
    for line in ("gpu=1 clocks 1400 2619", "gpu=1 power_limit 500", "gpu=1 xid 48", "gpu=1 xid 74",
                 "gpu=1 nvlink 3 down"):
        node.apply(parse_line(line).event, T0)
    saved = node.gpus[1].to_dict()
    frozen = json.dumps(saved, sort_keys=True)
    for line in ("gpu=1 xid 48", "gpu=1 nvlink 4 down", "gpu=1 clocks auto", "gpu=1 power_limit 300", "gpu=1 reset"):
        node.apply(parse_line(line).event, T0 + 1)
    assert json.dumps(saved, sort_keys=True) == frozen


# --- persistence -------------------------------------------------------------------------------


def test_settings_survive_a_restore_and_a_state_dir_from_before_them_restores_with_defaults(tmp_path):
    shutil.copytree(REPO / "tests" / "fixtures" / "state-v1", tmp_path / "v1")
    node = Node(compose(load_profile("h100"), gpus=2, hostname="fixture-v1"), T0)
    assert StateDir(tmp_path / "v1").open(node)
    assert [node.setting(i, s) for i in (0, 1) for s in SETTINGS] == H100_DEFAULTS * 2

    node = Node(compose(load_profile("h100"), gpus=2, hostname="h"), T0)
    state = StateDir(tmp_path / "new")
    state.open(node)
    ctl = Controller(node, state, clock=lambda: T0 + 1)
    changed = [False, "exclusive_process", 450.5, (1200, 1500), False, True, (2619, 1500), (2619, 2619)]
    for setting, value in zip(SETTINGS, changed):
        ctl.apply(Configure(1, setting, value))
    ctl.apply(Reset(1))  # the pending ECC mode takes effect (and the rest but persistence, ECC and accounting go)
    for setting, value in zip(SETTINGS, changed):
        ctl.apply(Configure(1, setting, value))
    ctl.apply(Configure(1, "ecc_mode", True))  # pending again: current off, pending on
    again = Node(compose(load_profile("h100"), gpus=2, hostname="h"), T0)
    assert StateDir(tmp_path / "new").open(again)
    assert [again.setting(1, s) for s in SETTINGS] == [*changed[:4], True, *changed[5:]]
    assert not again.ecc_enabled(1)
    assert [again.setting(0, s) for s in SETTINGS] == H100_DEFAULTS


# --- level 1: the control socket's decisions ---------------------------------------------------


@pytest.fixture
def control():
    """A control socket over a 2 x H100 node, with the mount's own rule for who may write
    (MokkaOperations.may_write) and control group 4242; in a directory every user may enter
    (pytest's tmp_path is 0700), so that another user can be refused by the socket itself."""
    from mokkafs.daemon.fuse_ops import MokkaOperations
    from mokkafs.render.tree import root
    from mokkafs.render.vfs import Tree

    base = Path(tempfile.mkdtemp(prefix="mokka-ctl-"))
    base.chmod(0o755)
    node = h100()
    controller = Controller(node, None, WallClock())
    ops = MokkaOperations(Tree(root(node.config)), controller, WallClock(), control_gid=4242)
    yield ControlSocket(base / "state.ctl.sock", controller, ops.may_write, WallClock())
    shutil.rmtree(base, ignore_errors=True)


def test_a_caller_who_may_not_write_gets_no_permission_and_nothing_changes(control, expect_log, caplog):
    expect_log(r"no_permission from uid 65534 pid 1: 'gpu=1 power_limit 500': root and the control group only")
    node = control.controller.node
    before = (node.gpus[1].to_dict(), node.generation)
    for _ in range(3):
        reply = control.handle(Caller(1, 65534, 65534), b"gpu=1 power_limit 500\n")
        assert (reply.status, reply.message) == ("no_permission", "root and the control group only")
    assert (node.gpus[1].to_dict(), node.generation) == before
    assert len([r for r in caplog.records if "no_permission" in r.getMessage()]) == 1, "logged once, then counted"
    # The control group may, by gid or as a supplementary group of the caller (read from /proc).
    assert control.handle(Caller(1, 1000, 4242), b"gpu=1 power_limit 500\n").ok
    assert control.handle(Caller(os.getpid(), 0, 0), b"gpu=1 persistence 0\n").ok
    assert [node.setting(1, s) for s in SETTINGS] == [False, "default", 500.0, *H100_DEFAULTS[3:]]


@pytest.mark.parametrize(
    "request_,status,reason",
    [
        (b"gpu=1 power_limit 100\n", "invalid_argument", "power limit 100 W is outside h100's 200..700 W"),
        (b"gpu=1 compute_mode exclusive_thread\n", "not_supported", "compute mode exclusive_thread is no longer"),
        (b"gpu=2 power_limit 500\n", "invalid_argument", "no gpu2, the node has 2 GPUs (0..1)"),
        (b"gpu=1 frob 1\n", "invalid_argument", "unknown command 'frob' for gpu=1"),
        (b"gpu=1 power_limit 500", "invalid_argument", "a request is one line of at most 512 bytes"),
        (b"gpu=1 power_limit 500\n\n", "invalid_argument", "empty command or control characters"),
        (b"gpu=1 power_limit 5\xc3\xa900\n", "invalid_argument", "not ASCII"),
        (b"\n", "invalid_argument", "empty command"),
        (b"gpu=0 power_limit 500\n", "gpu_is_lost", "gpu0 has fallen off the bus"),
    ],
)
def test_a_refused_request_says_why_and_changes_nothing(control, expect_log, request_, status, reason):
    expect_log(rf"ctl\.sock: {status} from uid 0")
    node = control.controller.node
    control.controller.apply(SetLost(0, True))
    before = ([g.to_dict() for g in node.gpus], node.generation)
    reply = control.handle(Caller(os.getpid(), 0, 0), request_)
    assert reply.status == status and reply.message.startswith(reason), reply
    assert ([g.to_dict() for g in node.gpus], node.generation) == before


# --- level 2: the socket served ----------------------------------------------------------------


@pytest.fixture
def served(control):
    service = ServedInThread(control.serve)
    yield control
    service.stop()


def test_the_served_socket_answers_once_applied_and_bounds_what_it_reads(served, expect_log):
    expect_log(r"ctl\.sock: invalid_argument from uid 0")
    node = served.controller.node
    assert oct(served.path.stat().st_mode & 0o777) == "0o666"  # anyone may ask, and be told no
    reply = send(served.path, "gpu=1 power_limit 500")
    assert reply.ok and node.setting(1, "power_limit") == 500.0  # applied before the reply was sent
    with socket.socket(socket.AF_UNIX) as s:  # more than a request may hold, and no newline
        s.connect(os.fspath(served.path))
        s.sendall(b"g" * 4096)
        s.settimeout(5)
        assert s.recv(512).startswith(b"invalid_argument a request is one line of at most 512 bytes")
    t = time.monotonic()
    with socket.socket(socket.AF_UNIX) as s:  # nothing sent: dropped after the timeout, no reply
        s.connect(os.fspath(served.path))
        s.settimeout(10)
        assert s.recv(512) == b""
    assert 1.5 < time.monotonic() - t < 5


def test_a_request_its_caller_gave_up_on_is_not_applied(control, expect_log):
    import trio

    expect_log(r"ctl\.sock: error from uid 0 pid \d+: 'gpu=1 power_limit 300': the caller gave up")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Request and hang-up are both there when the daemon gets to the connection, as when a
    # stopped daemon wakes to a caller whose 2 s ran out.
    theirs.sendall(b"gpu=1 power_limit 300\n")
    theirs.close()
    trio.run(control._connection, trio.socket.from_stdlib_socket(ours))
    assert control.answered == {"error": 1} and control.controller.node.setting(1, "power_limit") == 700.0
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.sendall(b"gpu=1 power_limit 300\n")  # the same, from a caller still waiting
    trio.run(control._connection, trio.socket.from_stdlib_socket(ours))
    with theirs:
        assert theirs.recv(512) == b"ok\n" and control.controller.node.setting(1, "power_limit") == 300.0


NOBODY_FLOOD = r"""
import socket, sys
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); held.append(s)
last = socket.socket(socket.AF_UNIX); last.connect(sys.argv[1]); last.settimeout(5)
print(last.recv(512).decode().strip())
"""


def test_a_uid_other_than_root_has_a_bounded_number_of_connections(served, expect_log):
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user")
    expect_log(r"ctl\.sock: busy from uid 65534")
    expect_log(r"ctl\.sock: no_permission from uid 65534")  # the held ones, closed with nothing sent
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                        NOBODY_FLOOD, str(served.path), str(CONNECTIONS_PER_UID)],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert r.stdout.strip() == f"busy more than {CONNECTIONS_PER_UID} connections open", r.stderr
    assert send(served.path, "gpu=1 power_limit 400").ok  # root is not held up by it


# --- level 4: real consumers on a mounted node --------------------------------------------------


SETTERS = """
    import ctypes, json, time, pynvml as n
    n.nvmlInit()
    lib = n.nvml_lib if hasattr(n, "nvml_lib") else n.nvmlLib

    class PowerValue(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("powerScope", ctypes.c_ubyte), ("powerValueMw", ctypes.c_uint)]

    def v2(h, mw, scope=0, version=0x0200000C):
        # pynvml's own wrapper drops the return code: call the library the way it does, and keep it
        value = PowerValue(version, scope, mw)
        return n._nvmlGetFunctionPointer("nvmlDeviceSetPowerManagementLimit_v2")(h, ctypes.byref(value))

    def code(fn, *args):
        try:
            fn(*args)
            return 0
        except n.NVMLError as e:
            return e.value

    def config(i):
        h = n.nvmlDeviceGetHandleByIndex(i)
        return [n.nvmlDeviceGetPersistenceMode(h), n.nvmlDeviceGetComputeMode(h),
                n.nvmlDeviceGetPowerManagementLimit(h), n.nvmlDeviceGetEnforcedPowerLimit(h)]
"""


def script(body: str) -> str:
    """SETTERS, then `body`: a consumer's program."""
    return textwrap.dedent(SETTERS) + textwrap.dedent(body)


def scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def test_a_power_limit_one_process_sets_is_what_every_surface_reports_when_the_call_returns(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(mount=False)
    port = free_port()
    node.mount(("--metrics", f"127.0.0.1:{port}"))
    env = mount_env(node)
    assert node.write("gpu1/utilization", b"90 40\n") == 0
    # One process sets, and as soon as its call has returned the others look: no wait, no retry.
    setter = subprocess.Popen([sys.executable, "-c", script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        assert n.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200000, 700000]
        n.nvmlDeviceSetPowerManagementLimit(h, 500000)
        print("returned", flush=True)
        input()
    """)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert setter.stdout.readline().strip() == "returned"
        other = run_py_json(env, script("""
            h = n.nvmlDeviceGetHandleByIndex(1)
            print(json.dumps(config(1) + [n.nvmlDeviceGetPowerUsage(h),
                                          n.nvmlDeviceGetCurrentClocksEventReasons(h), config(0)]))
        """))
        smi = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "-i", "1", "--format=csv,noheader",
                              "--query-gpu=power.limit,enforced.power.limit,power.draw,clocks_event_reasons.sw_power_cap"],
                             env=env, capture_output=True, text=True, timeout=30)
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        setter.communicate("\n", timeout=30)
    assert other[:4] == [1, 0, 500000, 500000]
    assert other[4] == 500000 and other[5] & SW_POWER_CAP  # 90 % asks ~637 W: capped, and says so
    assert other[6] == [1, 0, 700000, 700000]  # GPU 0 keeps its own limit
    assert smi.stdout.strip() == "500.00 W, 500.00 W, 500.00 W, Active", smi.stderr
    assert re.search(r'^DCGM_FI_DEV_POWER_MGMT_LIMIT\{gpu="1",.*\} 500\.000000$', metrics, re.M)
    assert re.search(r'^DCGM_FI_DEV_POWER_USAGE\{gpu="1",.*\} 500\.000000$', metrics, re.M)
    assert re.search(r'^DCGM_FI_DEV_POWER_MGMT_LIMIT\{gpu="0",.*\} 700\.000000$', metrics, re.M)
    assert node.read("gpu1/config") == DEFAULT_CONFIG.replace("power_limit: 700", "power_limit: 500 (default 700)")
    assert "mokka: gpu1 power_limit 500\n" in node.read("gpu1/events")


def test_a_unix_address_is_the_path_or_its_directory_s_descriptor(tmp_path):
    from mokkafs.daemon.unix_path import unix_address

    with unix_address(tmp_path / "s.sock") as short:
        assert short == str(tmp_path / "s.sock")
    deep = tmp_path / ("d" * 200)
    deep.mkdir()
    with unix_address(deep / "s.sock") as address, socket.socket(socket.AF_UNIX) as server:
        assert re.fullmatch(r"/proc/self/fd/\d+/s\.sock", address)
        server.bind(address)
        server.listen(1)
        with unix_address(deep / "s.sock") as again, socket.socket(socket.AF_UNIX) as client:
            client.connect(again)
    assert (deep / "s.sock").is_socket()
    with pytest.raises(OSError, match="AF_UNIX path too long"), unix_address(deep / ("s" * 100)):
        pass


def test_a_node_mounted_under_a_path_past_sun_path_has_its_setters(node_factory):
    """sun_path holds 108 bytes; the socket beside a long state path is bound and reached through
    its directory's descriptor (/proc/self/fd/N/state.ctl.sock), by the daemon, the shims and
    the Python client alike (mokkafs/daemon/unix_path.py, mokka_control.c)."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2, name="n" * 120)
    socket_path = control_path(node.state_dir / "state")
    assert len(os.fsencode(socket_path)) > 108 and socket_path.exists()
    out = run_py_json(mount_env(node), script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        n.nvmlDeviceSetPowerManagementLimit(h, 500000)
        print(json.dumps(config(1)))
    """))
    assert out == [1, 0, 500000, 500000]
    assert send(socket_path, "gpu=1 power_limit 600").ok  # the Python client: mokka inject, the agent
    assert node.cli("inject", "--root", str(node.mnt), "0", "power_limit", "400").returncode == 0
    assert "power_limit: 600 (default 700)" in node.read("gpu1/config")
    assert "power_limit: 400 (default 700)" in node.read("gpu0/config")


def test_every_setting_is_refused_or_taken_as_nvml_says_and_a_refusal_changes_nothing(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    node.expect_warning(r"ctl\.sock: (invalid_argument|not_supported|gpu_is_lost) from uid 0")
    node.expect_warning(r"ctl\.sock: .* more like it")
    out = run_py_json(mount_env(node), script(f"""
        h, h0 = n.nvmlDeviceGetHandleByIndex(1), n.nvmlDeviceGetHandleByIndex(0)
        open("{node.mnt}/gpu0/lost", "w").write("1\\n")  # gpu0 falls off the bus; its handle stays
        before = config(1)
        refused = [code(n.nvmlDeviceSetPowerManagementLimit, h, 199999), code(n.nvmlDeviceSetPowerManagementLimit, h, 700001),
                   code(n.nvmlDeviceSetPowerManagementLimit, h, 4294967295),
                   v2(h, 500000, scope=1), v2(h, 500000, scope=9), v2(h, 500000, version=0x0100000C),
                   code(n.nvmlDeviceSetComputeMode, h, 1), code(n.nvmlDeviceSetComputeMode, h, 7),
                   code(n.nvmlDeviceSetPersistenceMode, h, 2),
                   code(n.nvmlDeviceSetPowerManagementLimit, h0, 500000),
                   code(n.nvmlDeviceSetGpuLockedClocks, h, 100, 1500), code(n.nvmlDeviceSetGpuLockedClocks, h, 1500, 1400),
                   code(n.nvmlDeviceSetGpuLockedClocks, h, 1500, 0xFFFFFF02),
                   code(n.nvmlDeviceSetGpuLockedClocks, h, 0xFFFFFF01, 0xFFFFFF01)]
        after_refusals = config(1)
        taken = [v2(h, 450500), code(n.nvmlDeviceSetComputeMode, h, 2), code(n.nvmlDeviceSetPersistenceMode, h, 0)]
        print(json.dumps(dict(before=before, refused=refused, after_refusals=after_refusals, taken=taken,
                              after=config(1))))
    """))
    assert out["refused"] == [NVML_INVALID_ARGUMENT, NVML_INVALID_ARGUMENT, NVML_INVALID_ARGUMENT,
                              NVML_NOT_SUPPORTED, NVML_INVALID_ARGUMENT, NVML_ARGUMENT_VERSION_MISMATCH,
                              NVML_NOT_SUPPORTED, NVML_INVALID_ARGUMENT, NVML_INVALID_ARGUMENT, NVML_GPU_IS_LOST,
                              NVML_INVALID_ARGUMENT, NVML_INVALID_ARGUMENT, NVML_INVALID_ARGUMENT, NVML_NOT_SUPPORTED]
    assert out["before"] == out["after_refusals"] == [1, 0, 700000, 700000]
    assert out["taken"] == [0, 0, 0] and out["after"] == [0, 2, 450500, 450500]
    assert node.read("gpu1/config") == ("persistence: 0 (default 1)\ncompute_mode: prohibited (default default)\n"
                                        "power_limit: 450.5 (default 700)\nlocked_clocks: 345 1980\n" + LATER_DEFAULTS)


@pytest.fixture
def open_node():
    """A mounted 2 x H100 node under a directory every user may enter (pytest's tmp_path is 0700)."""
    yield from world_readable_node("h100", 2)


def test_nobody_gets_no_permission_from_every_setter_and_nothing_changes(open_node):
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    node = open_node
    node.expect_warning(r"ctl\.sock: no_permission from uid 65534 pid \d+: 'gpu=1 persistence 0'")
    node.expect_warning(r"ctl\.sock: no_permission from uid 65534: and 15 more like it")
    env = mount_env(node)
    config_before = node.read("gpu1/config")
    # The system python, as nobody, with pynvml from where it is installed (readable by all).
    code = f"import sys; sys.path.insert(0, {os.path.dirname(pynvml.__file__)!r})\n" + textwrap.dedent(SETTERS) + """
h = n.nvmlDeviceGetHandleByIndex(1)
codes = [code(n.nvmlDeviceSetPersistenceMode, h, 0), code(n.nvmlDeviceSetComputeMode, h, 3),
         code(n.nvmlDeviceSetPowerManagementLimit, h, 500000), v2(h, 500000),
         code(n.nvmlDeviceSetGpuLockedClocks, h, 1500, 1500), code(n.nvmlDeviceResetGpuLockedClocks, h),
         code(n.nvmlDeviceSetEccMode, h, 0), code(n.nvmlDeviceClearEccErrorCounts, h, 0),
         code(n.nvmlDeviceClearEccErrorCounts, h, 1), code(n.nvmlDeviceSetAccountingMode, h, 1),
         code(n.nvmlDeviceClearAccountingPids, h), code(n.nvmlDeviceSetApplicationsClocks, h, 2619, 1500),
         code(n.nvmlDeviceResetApplicationsClocks, h), code(n.nvmlDeviceSetMemoryLockedClocks, h, 2619, 2619),
         code(n.nvmlDeviceResetMemoryLockedClocks, h), code(n.nvmlDeviceResetNvLinkErrorCounters, h, 0)]
ecc = n.nvmlDeviceGetEccMode(h) + [n.nvmlDeviceGetTotalEccErrors(h, 0, s) for s in (0, 1)]
print(json.dumps(dict(codes=codes, config=config(1), ecc=ecc, accounting=n.nvmlDeviceGetAccountingMode(h),
                      nvlink=n.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0))))
"""
    assert node.write("gpu1/inject_ecc", b"sbe 2\n") == 0 and node.write("gpu1/nvlink", b"0 errors 3\n") == 0
    config_before = node.read("gpu1/config")
    out = run_py_json(env, code, python="/usr/bin/python3", user=True)
    assert out["codes"] == [NVML_NO_PERMISSION] * 16
    assert out["config"] == [1, 0, 700000, 700000]
    assert (out["ecc"], out["accounting"], out["nvlink"]) == ([1, 1, 2, 2], 0, 3)
    assert node.read("gpu1/config") == config_before == DEFAULT_CONFIG
    root_sees = run_py_json(env, script("print(json.dumps(config(1)))"))
    assert root_sees == [1, 0, 700000, 700000]


def test_root_without_cap_sys_admin_gets_no_permission(open_node):
    """A container's root: uid 0, but the capability the driver checks for privileged calls
    dropped. Its setters are refused, as a pod's would be on a real node; its reads work."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    if os.geteuid() != 0:
        pytest.skip("needs root")
    node = open_node
    node.expect_warning(r"ctl\.sock: no_permission from uid 0 pid \d+: 'gpu=1 power_limit 500\.000': root without "
                        r"CAP_SYS_ADMIN")
    env = mount_env(node)
    code = script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        print(json.dumps(dict(code=code(n.nvmlDeviceSetPowerManagementLimit, h, 500000), config=config(1))))
    """)
    r = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-c", code],
                       env=env, capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"code": NVML_NO_PERMISSION, "config": [1, 0, 700000, 700000]}
    assert run_py_json(env, script("print(json.dumps(config(1)))")) == [1, 0, 700000, 700000]


def test_a_dead_or_stopped_daemon_is_an_error_within_the_timeout_never_a_hang(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    timed = script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        t = time.monotonic()
        r = code(n.nvmlDeviceSetPowerManagementLimit, h, 400000)
        print(json.dumps([r, time.monotonic() - t, n.nvmlDeviceGetPowerManagementLimit(h)]))
    """)
    stopped = node_factory(gpus=2, name="stopped")
    stopped.expect_warning(r"ctl\.sock: error from uid 0 pid \d+: 'gpu=1 power_limit 400\.000': the caller gave up")
    env = mount_env(stopped, from_mount=False)
    pid = stopped.daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        code, seconds, limit = run_py_json(env, timed)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert code == NVML_UNKNOWN and 1.8 < seconds < 3.0 and limit == 700000
    # Woken, the daemon finds the request of a caller that gave up: it is not applied.
    deadline = time.monotonic() + 5
    while "the caller gave up" not in (stopped.state_dir / "daemon.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stopped.read("gpu1/config") == DEFAULT_CONFIG

    dead = node_factory(gpus=2, name="dead")
    env = mount_env(dead, from_mount=False)
    dead.kill9()
    code, seconds, limit = run_py_json(env, timed)
    assert code == NVML_UNKNOWN and seconds < 0.5 and limit == 700000  # refused at connect, at once
    with pytest.raises(NoDaemon):
        send(control_path(dead.state_dir / "state"), "gpu=1 power_limit 400")


def test_every_setting_survives_a_daemon_restart_and_a_kill(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    env = mount_env(node)
    run_py_json(env, script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        n.nvmlDeviceSetPersistenceMode(h, 0); n.nvmlDeviceSetComputeMode(h, 3)
        n.nvmlDeviceSetPowerManagementLimit(h, 450500)
        n.nvmlDeviceSetEccMode(h, 0); n.nvmlDeviceSetAccountingMode(h, 1)
        n.nvmlDeviceSetApplicationsClocks(h, 2619, 1500); n.nvmlDeviceSetMemoryLockedClocks(h, 2619, 2619)
        print("{}")
    """))
    expected = [0, 3, 450500, 450500, [1, 0], 1, 1500]
    read = script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        print(json.dumps(config(1) + [n.nvmlDeviceGetEccMode(h), n.nvmlDeviceGetAccountingMode(h),
                                      n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_GRAPHICS)]))
    """)
    node.umount()
    assert node.mount().returncode == 0
    assert run_py_json(env, read) == expected
    node.kill9()
    force_unmount(node.mnt)
    assert node.mount().returncode == 0
    assert run_py_json(env, read) == expected
    assert node.read("gpu1/config") == ("persistence: 0 (default 1)\ncompute_mode: exclusive_process (default default)"
                                        "\npower_limit: 450.5 (default 700)\nlocked_clocks: 345 1980\n"
                                        "ecc_mode: 0 (default 1) (current 1 until a reset)\naccounting: 1 (default 0)\n"
                                        "applications_clocks: 2619 1500 (default 2619 1980)\n"
                                        "locked_memory_clocks: 2619 2619 (default 1593 2619)\n")
    smi = subprocess.run([str(node.mnt / "driver/usr/bin/nvidia-smi"), "--format=csv,noheader",
                          "--query-gpu=index,persistence_mode,compute_mode,power.limit"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert smi.stdout.splitlines() == ["0, Enabled, Default, 700.00 W", "1, Disabled, Exclusive_Process, 450.50 W"]


def test_mokka_inject_and_an_annotation_set_through_the_same_socket(node_factory):
    from mokkafs.agent import grammar, watch

    node = node_factory(gpus=2)
    assert node.cli("inject", "--root", str(node.mnt), "1", "power_limit", "400").returncode == 0
    assert "power_limit: 400 (default 700)\n" in node.read("gpu1/config")
    bad = node.cli("inject", "--root", str(node.mnt), "1", "compute_mode", "exclusive_thread", check=False)
    assert bad.returncode == 2 and bad.stderr == "mokka: gpu1 compute_mode: compute mode exclusive_thread is no " \
                                                 "longer supported\n"
    node.expect_warning(r"ctl\.sock: not_supported from uid 0")
    tree = watch.MountedTree(str(node.mnt))
    commands = grammar.parse_injection("gpu=all power_limit=300; gpu=0 compute_mode=prohibited", tree.node_config())
    assert [c.command.__str__() for c in commands] == ["gpu=0 power_limit 300", "gpu=1 power_limit 300",
                                                       "gpu=0 compute_mode prohibited"]
    for c in commands:
        tree.write(c)
    assert [node.read(f"gpu{i}/config").splitlines()[1:3] for i in (0, 1)] == [
        ["compute_mode: prohibited (default default)", "power_limit: 300 (default 700)"],
        ["compute_mode: default", "power_limit: 300 (default 700)"],
    ]
    status = node.cli("status", "--root", str(node.mnt)).stdout.splitlines()
    assert status[-2:] == ["gpu0 settings: compute_mode: prohibited (default default); power_limit: 300 (default 700)",
                           "gpu1 settings: power_limit: 300 (default 700)"]
    with pytest.raises(InvalidCommand, match="'gpu=all power_limit=100': power limit 100 W is outside"):
        grammar.parse_injection("gpu=all power_limit=100", tree.node_config())


def test_locked_clocks_hold_the_clock_every_process_reads_and_say_why(node_factory):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    node = node_factory(gpus=2)
    assert node.write("gpu1/utilization", b"90 40\n") == 0
    out = run_py_json(mount_env(node), script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        n.nvmlDeviceSetGpuLockedClocks(h, 1200, 1500)
        print("{}")
    """))
    assert out == {}
    seen = run_py_json(mount_env(node), script("""
        h = n.nvmlDeviceGetHandleByIndex(1)
        locked = [n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), n.nvmlDeviceGetCurrentClocksEventReasons(h)]
        n.nvmlDeviceSetGpuLockedClocks(h, 0xFFFFFF02, 0xFFFFFF02)  # UNLIMITED, UNLIMITED: unlocked
        print(json.dumps(locked + [n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                                   n.nvmlDeviceGetCurrentClocksEventReasons(h)]))
    """))
    applications_clocks_setting = 0x2
    assert seen[0] == 1500 and seen[1] & applications_clocks_setting
    assert seen[2] == 1980 and not seen[3] & applications_clocks_setting
    assert node.read("gpu1/config").endswith("locked_clocks: 345 1980\n" + LATER_DEFAULTS)
