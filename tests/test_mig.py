"""MIG in the model (docs/mig.md): mode, placement, ids and refusals as the driver gives them, the
vocabulary's spelling, what a reset and a lost GPU do, persistence, the shared state's MIG
section, the control socket's answers, and a layout that survives a daemon restart."""
from __future__ import annotations

import json
import os
import re

import pytest

from mokkafs.daemon.controller import Controller
from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model import mig
from mokkafs.model.commands import parse_line
from mokkafs.model.config import GpuIsLost, NotSupported
from mokkafs.model.events import SetLost, SetProcesses
from mokkafs.model.mig import InsufficientResources, InUse, MigState, NotFound
from mokkafs.daemon.persist import StateDir, StateError
from mokkafs.model.profiles import load_profile
from mokkafs.render.control import render_mig
from mokkafs.render.vfs import Ctx

pytestmark = pytest.mark.level("model")

T0 = 1_800_000_000.0
DONE_WHEN = "3g.40gb,2g.20gb,1g.10gb,1g.10gb"  # the issue's layout


def h100(gpus: int = 2, hostname: str = "mig") -> Node:
    return Node(compose(load_profile("h100"), gpus=gpus, hostname=hostname), T0)


def run(node: Node, *lines: str) -> str:
    """Apply each line; the reply of the last."""
    reply = ""
    for line in lines:
        reply = node.apply(parse_line(line).event, T0).reply
    return reply


def layout(node: Node, i: int = 0) -> list[tuple]:
    """(gi id, profile name, start, size, [(ci id, ci profile name, start, size)])."""
    mg = node.profile.mig
    out = []
    for g in node.mig_instances(i):
        gp = mig.gi_profile_by_index(mg, g.profile)
        out.append((g.id, gp.name, g.start, g.size,
                    [(c.id, mig.ci_profile(gp, c.profile).name, c.start, c.size) for c in g.compute]))
    return out


# --- mode --------------------------------------------------------------------------------------


def test_mig_mode_takes_effect_at_once_on_an_idle_gpu_and_waits_for_a_reset_on_a_busy_one():
    node = h100()
    assert run(node, "gpu=0 mig enable") == ""
    assert (node.gpus[0].mig.enabled, node.gpus[0].mig.pending) == (True, True)
    node.apply(SetProcesses(1, ((4242, 1 << 20),)), T0)
    assert run(node, "gpu=1 mig enable") == "pending in_use"
    assert (node.gpus[1].mig.enabled, node.gpus[1].mig.pending) == (False, True)
    with pytest.raises(NotSupported, match="MIG mode is not enabled on gpu1"):
        run(node, "gpu=1 mig create 1g.10gb")
    assert run(node, "gpu=1 mig disable") == ""  # asking for the current mode cancels the pending change
    assert (node.gpus[1].mig.enabled, node.gpus[1].mig.pending) == (False, False)
    run(node, "gpu=1 mig enable", "gpu=1 reset")  # the reset activates it
    assert (node.gpus[1].mig.enabled, node.gpus[1].mig.pending) == (True, True)
    assert [e.text for e in node.log if e.gpu == 1][-3:] == [
        "mokka: gpu1 MIG mode disabled", "mokka: gpu1 MIG mode enabled on next reset (GPU in use)", "mokka: gpu1 reset"]


def test_disabling_mig_under_instances_is_in_use_and_a_reset_destroys_them():
    node = h100()
    run(node, "gpu=0 mig enable", "gpu=0 mig create 7g.80gb")
    with pytest.raises(InUse, match="destroy them before disabling MIG"):
        run(node, "gpu=0 mig disable")
    run(node, "gpu=0 reset")
    assert node.gpus[0].mig == MigState(True, True) and layout(node) == []


@pytest.mark.parametrize("line", ["gpu=0 mig enable", "gpu=0 mig create 1g.10gb", "gpu=0 mig clear",
                                  "gpu=0 mig destroy_gi all"])
def test_a_board_without_mig_refuses_every_mig_command(line):
    node = Node(compose(load_profile("l40s"), gpus=1), T0)
    with pytest.raises(NotSupported, match="l40s does not support MIG"):
        node.validate(parse_line(line).event)
    assert render_mig(Ctx(node, T0), 0) == "mode: not supported\n"


# --- placement, ids, refusals ------------------------------------------------------------------


def test_the_issue_s_layout_is_placed_and_numbered_as_the_driver_does():
    """The layout of GPU 0 in NVIDIA/DCGM#138 (a real H100 node: 3g.40gb id 2 at 4:4, 2g.20gb
    id 3 at 0:2, 1g.10gb ids 9 and 10 at 2:1 and 3:1); the 3g.40gb compute instance spans 0:4
    as a real H100's `-lci` lists it."""
    node = h100()
    assert run(node, "gpu=0 mig enable", f"gpu=0 mig create {DONE_WHEN}") == "gi=2/ci=0 gi=3/ci=0 gi=9/ci=0 gi=10/ci=0"
    assert layout(node) == [
        (2, "3g.40gb", 4, 4, [(0, "3g.40gb", 0, 4)]),
        (3, "2g.20gb", 0, 2, [(0, "2g.20gb", 0, 2)]),
        (9, "1g.10gb", 2, 1, [(0, "1g.10gb", 0, 1)]),
        (10, "1g.10gb", 3, 1, [(0, "1g.10gb", 0, 1)]),
    ]
    _, devices = node.mig_devices(0)
    assert [d.name for d in devices] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
                                         "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H100 80GB HBM3 MIG 1g.10gb"]
    assert [d.memory_total_bytes >> 20 for d in devices] == [40448, 20096, 9984, 9984]
    assert all(re.fullmatch(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", d.uuid) for d in devices)
    assert len({d.uuid for d in devices}) == 4
    assert [(d.gi.minor, d.minor) for d in devices] == [(21, 22), (30, 31), (84, 85), (93, 94)]


def test_the_user_guide_s_examples_give_the_guide_s_ids():
    """MIG user guide (A100, same slice tree): `-cgi 9,3g.20gb` gives GPU instances 2 then 1;
    `-cgi 19,14,5` gives 13, 5, 1; `-cci 0,0,0` in a 3g instance gives 0, 1, 2."""
    node = h100()
    assert run(node, "gpu=0 mig enable", "gpu=0 mig create_gi 9,3g.40gb") == "gi=2 gi=1"
    assert run(node, "gpu=1 mig enable", "gpu=1 mig create_gi 19,14,5") == "gi=13 gi=5 gi=1"
    assert run(node, "gpu=0 mig create_ci 1 0,0,0") == "gi=1/ci=0 gi=1/ci=1 gi=1/ci=2"
    assert layout(node)[0][4] == [(0, "1c.3g.40gb", 0, 1), (1, "1c.3g.40gb", 1, 1), (2, "1c.3g.40gb", 2, 1)]


def test_remaining_capacity_is_what_still_fits_where_the_driver_would_put_it():
    node = h100()
    names = [g.name for g in node.profile.mig.gpu_instance_profiles]
    run(node, "gpu=0 mig enable")
    assert dict(zip(names, node.mig_capacity(0))) == {
        "1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
    run(node, "gpu=0 mig create_gi 3g.40gb")  # at 4:4
    assert dict(zip(names, node.mig_capacity(0))) == {
        "1g.10gb": 4, "1g.10gb+me": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 1, "4g.40gb": 1, "7g.80gb": 0}
    run(node, "gpu=0 mig create_ci 2 1c.3g.40gb")
    gis, _ = node.mig_devices(0)
    assert [(cp.name, n) for cp, n in zip(gis[0].profile.compute_profiles, gis[0].remaining)] == [
        ("1c.3g.40gb", 2), ("2c.3g.40gb", 1), ("3g.40gb", 0)]  # the 1c is at 0:1, a 2c fits at 2:2
    assert node.mig_capacity(1) == (0,) * 7  # MIG off


def test_seven_1g_instances_fill_the_gpu_and_an_eighth_is_refused():
    node = h100()
    run(node, "gpu=0 mig enable", "gpu=0 mig create " + ",".join(["1g.10gb"] * 7))
    assert [g[0] for g in layout(node)] == [7, 8, 9, 10, 11, 12, 13]
    with pytest.raises(InsufficientResources):
        run(node, "gpu=0 mig create 1g.10gb")


@pytest.mark.parametrize(
    "setup,line,error,reason",
    [
        ((), "gpu=0 mig create 3g.40gb,3g.40gb,1g.10gb", InsufficientResources, "1g.10gb: no free placement"),
        ((), "gpu=0 mig create 4g.40gb,4g.40gb", InsufficientResources, "4g.40gb: all 1 instances are in use"),
        ((), "gpu=0 mig create 1g.10gb+me,1g.10gb+me", InsufficientResources, "1g.10gb+me: all 1 instances"),
        (("gpu=0 mig create_gi 3g.40gb:4",), "gpu=0 mig create_gi 19:5", InsufficientResources,
         "1g.10gb at 5:1 overlaps an instance"),
        ((), "gpu=0 mig create_gi 19:7", InvalidCommand, "1g.10gb cannot start at memory slice 7"),
        ((), "gpu=0 mig create_gi 3g.40gb:2", InvalidCommand, "3g.40gb cannot start at memory slice 2"),
        ((), "gpu=0 mig create 5g.50gb", InvalidCommand, "no GPU instance profile '5g.50gb'"),
        ((), "gpu=0 mig create 42", InvalidCommand, "no GPU instance profile 42"),
        (("gpu=0 mig create_gi 9",), "gpu=0 mig create_ci 2 1c.3g.40gb:3", InvalidCommand,
         "1c.3g.40gb cannot start at compute slice 3"),
        (("gpu=0 mig create_gi 9", "gpu=0 mig create_ci 2 2c.3g.40gb"), "gpu=0 mig create_ci 2 1c.3g.40gb:1",
         InsufficientResources, "1c.3g.40gb at 1:1 overlaps a compute instance"),
        (("gpu=0 mig create 9",), "gpu=0 mig create_ci 2 3g.40gb", InsufficientResources, "3g.40gb: all 1"),
        ((), "gpu=0 mig create_ci 3 0", NotFound, "no GPU instance 3"),
        (("gpu=0 mig create 9",), "gpu=0 mig destroy_gi 2", InUse, "GPU instance 2 has compute instances"),
        (("gpu=0 mig create 9",), "gpu=0 mig destroy_ci 2 1", NotFound, "GPU instance 2 has no compute instance 1"),
        ((), "gpu=0 mig destroy_gi all", NotFound, "gpu0 has no GPU instances"),
    ],
)
def test_what_does_not_fit_is_refused_with_the_driver_s_error_and_changes_nothing(setup, line, error, reason):
    node = h100()
    run(node, "gpu=0 mig enable", *setup)
    before, generation = node.gpus[0].mig, node.generation
    with pytest.raises(error) as e:
        run(node, line)
    assert type(e.value) is error and str(e.value).startswith(reason), str(e.value)
    assert (node.gpus[0].mig, node.generation) == (before, generation)


def test_an_instance_with_a_process_on_it_is_in_use_and_others_are_not():
    node = h100()
    run(node, "gpu=0 mig enable", "gpu=0 mig create_gi 3g.40gb", "gpu=0 mig create 1g.10gb",
        "gpu=0 mig create_ci 2 1c.3g.40gb,1c.3g.40gb")
    node.apply(SetProcesses(0, ((77, 1 << 30), (78, 0)), instances=((77, 2, 1),)), T0)
    for line, reason in (("gpu=0 mig destroy_ci 2 1", "a process runs on compute instance 1 of GPU instance 2"),
                         ("gpu=0 mig destroy_ci all all", "a process runs on compute instance 1"),
                         ("gpu=0 mig clear", "a process runs on GPU instance 2")):
        with pytest.raises(InUse, match=reason):
            run(node, line)
    run(node, "gpu=0 mig destroy_ci 2 0", "gpu=0 mig destroy_ci 7 0", "gpu=0 mig destroy_gi 7")
    assert layout(node) == [(2, "3g.40gb", 4, 4, [(1, "1c.3g.40gb", 1, 1)])]
    gis, _ = node.mig_devices(0)
    # the process's memory counts to its instance, on top of the 26 MiB a 3g instance holds idle
    assert gis[0].memory_used_bytes == (1 << 30) + (26 << 20)
    node.apply(SetProcesses(0, ()), T0)
    run(node, "gpu=0 mig clear", "gpu=0 mig clear")  # nothing left: clear is a no-op
    assert layout(node) == []


def test_a_lost_gpu_lists_no_instances_refuses_mig_commands_and_brings_them_back():
    node = h100()
    run(node, "gpu=0 mig enable", "gpu=0 mig create 7g.80gb")
    node.apply(SetLost(0, True), T0)
    assert node.mig_instances(0) == () and node.mig_devices(0) == ((), ())
    assert "gi " not in render_mig(Ctx(node, T0), 0)
    with pytest.raises(GpuIsLost):
        run(node, "gpu=0 mig destroy_ci all all")
    node.apply(SetLost(0, False), T0)
    assert layout(node) == [(0, "7g.80gb", 0, 8, [(0, "7g.80gb", 0, 8)])]


def test_uuids_are_stable_across_re_creation_and_differ_between_gpus():
    node = h100()
    run(node, "gpu=0 mig enable", "gpu=1 mig enable", "gpu=0 mig create 1g.10gb", "gpu=1 mig create 1g.10gb")
    first = node.mig_devices(0)[1][0].uuid
    assert first != node.mig_devices(1)[1][0].uuid
    run(node, "gpu=0 mig clear", "gpu=0 mig create 1g.10gb")
    assert node.mig_devices(0)[1][0].uuid == first
    assert first == mig.mig_uuid(node.identities[0].uuid, 13, 0)


# --- the vocabulary ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line,reason",
    [
        ("gpu=0 mig", "mig needs arguments"),
        ("gpu=0 mig on", "expected one of: enable|disable"),
        ("gpu=0 mig enable 1", "mig enable takes 0 argument(s)"),
        ("gpu=0 mig create", "mig create takes 1 argument(s)"),
        ("gpu=0 mig create 1g.10gb,", "expected PROFILE[:START], got ''"),
        ("gpu=0 mig create 1g.10gb:x", "expected PROFILE[:START], got '1g.10gb:x'"),
        ("gpu=0 mig create 1g.10gb:9", "bad placement start 9"),
        ("gpu=0 mig create " + ",".join(["19"] * 9), "a create command takes 1..8 profiles"),
        ("gpu=0 mig create_ci x 0", "GPU instance must be an id, got 'x'"),
        ("gpu=0 mig destroy_ci 1", "mig destroy_ci takes 2 argument(s)"),
        ("gpu=0 mig destroy_gi -1", "GPU instance must be an id or all, got '-1'"),
        ("gpu=0 mig create 1G.10GB", "expected PROFILE[:START]"),
    ],
)
def test_a_bad_mig_command_says_why(line, reason):
    with pytest.raises(InvalidCommand) as e:
        parse_line(line)
    assert str(e.value).startswith(reason), str(e.value)


def test_each_command_line_reads_back_as_the_same_event():
    for line in ("gpu=0 mig enable", "gpu=3 mig disable", "gpu=0 mig create 3g.40gb:4,19", "gpu=0 mig create_gi 9",
                 "gpu=0 mig create_ci 2 1c.3g.40gb:1,0", "gpu=0 mig destroy_ci all 1", "gpu=0 mig destroy_gi 2",
                 "gpu=0 mig clear"):
        command = parse_line(line)
        assert str(command) == line and parse_line(str(command)).event == command.event


# --- gpuN/mig, persistence -----------------------------------------------------------------------


def test_gpu_mig_shows_mode_and_instances():
    node = h100()
    assert render_mig(Ctx(node, T0), 0) == "mode: disabled\npending: disabled\n"
    run(node, "gpu=0 mig enable", "gpu=0 mig create_gi 9:0", "gpu=0 mig create_ci 1 1c.3g.40gb")
    u = mig.mig_uuid(node.identities[0].uuid, 1, 0)
    assert render_mig(Ctx(node, T0), 0) == (
        "mode: enabled\npending: enabled\n"
        "gi 1 profile 3g.40gb id 9 placement 0:4 memory_mib 40448 sm 60 minor 12\n"
        f"  ci 0 profile 1c.3g.40gb id 0 placement 0:1 sm 16 minor 13 uuid {u} name NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb\n"
    )


def test_a_layout_survives_a_restore_and_a_state_dir_from_before_mig_restores_with_mig_off(tmp_path):
    node = h100(hostname="h")
    state = StateDir(tmp_path / "s")
    state.open(node)
    ctl = Controller(node, state, clock=lambda: T0 + 1)
    for line in ("gpu=1 mig enable", "gpu=1 mig create_gi 9", "gpu=1 mig create_ci 2 0:2,1c.3g.40gb",
                 "gpu=1 mig create 2g.20gb,1g.10gb"):
        ctl.apply(parse_line(line).event)
    again = h100(hostname="h")
    assert StateDir(tmp_path / "s").open(again)
    assert layout(again, 1) == layout(node, 1) and again.gpus[1].mig == node.gpus[1].mig
    assert [d.uuid for d in again.mig_devices(1)[1]] == [d.uuid for d in node.mig_devices(1)[1]]
    record = json.loads((tmp_path / "s" / "gpu0.json").read_text())
    del record["mig"]
    (tmp_path / "s" / "gpu0.json").write_text(json.dumps(record))
    third = h100(hostname="h")
    assert StateDir(tmp_path / "s").open(third) and third.gpus[0].mig == MigState()


def test_a_layout_saved_with_the_older_compute_instance_sizes_restores_with_today_s(tmp_path):
    """Before compute instances were sized by span, a 3g.40gb one was saved as 0:3 and a 7g.80gb
    one as 0:7: such a state directory still opens, and lists them as a real -lci does."""
    node = h100(hostname="h")
    StateDir(tmp_path / "s").open(node)
    for gpu, instance in ((0, {"id": 2, "profile": 2, "start": 4, "size": 4, "compute": [[0, 2, 0, 3]]}),
                          (1, {"id": 0, "profile": 4, "start": 0, "size": 8, "compute": [[0, 4, 0, 7]]})):
        record = json.loads((tmp_path / "s" / f"gpu{gpu}.json").read_text())
        record["mig"] = {"enabled": True, "pending": True, "instances": [instance]}
        (tmp_path / "s" / f"gpu{gpu}.json").write_text(json.dumps(record))
    again = h100(hostname="h")
    assert StateDir(tmp_path / "s").open(again)
    assert layout(again, 0) == [(2, "3g.40gb", 4, 4, [(0, "3g.40gb", 0, 4)])]
    assert layout(again, 1) == [(0, "7g.80gb", 0, 8, [(0, "7g.80gb", 0, 8)])]


@pytest.mark.parametrize(
    "mig_record,words",
    [
        ({"enabled": False, "pending": False, "instances": [{"id": 0, "profile": 4, "start": 0, "size": 8,
                                                               "compute": []}]}, "instances while MIG mode is disabled"),
        ({"enabled": True, "pending": True, "instances": [{"id": 3, "profile": 4, "start": 0, "size": 8,
                                                             "compute": []}]}, "does not match its placement"),
        ({"enabled": True, "pending": True, "instances": [{"id": 7, "profile": 0, "start": 0, "size": 1,
                                                             "compute": []}] * 2}, "overlaps an instance"),
        ({"enabled": True, "pending": True, "instances": [{"id": 0, "profile": 4, "start": 0, "size": 8,
                                                             "compute": [[0, 4, 0, 8], [1, 0, 0, 1]]}]}, "overlaps a compute"),
        ({"enabled": "yes", "pending": True, "instances": []}, "not booleans"),
        ({"enabled": True, "pending": True, "instances": [{"id": -1, "profile": 4, "start": 0, "size": 8,
                                                             "compute": []}]}, "not a small whole number"),
    ],
)
def test_restore_refuses_a_mig_record_no_command_could_make(tmp_path, mig_record, words):
    node = h100(hostname="h")
    StateDir(tmp_path / "s").open(node)
    record = json.loads((tmp_path / "s" / "gpu1.json").read_text())
    record["mig"] = mig_record
    (tmp_path / "s" / "gpu1.json").write_text(json.dumps(record))
    with pytest.raises(StateError, match=re.escape(words)):
        StateDir(tmp_path / "s").open(h100(hostname="h"))


def test_restore_refuses_mig_on_a_board_without_it(tmp_path):
    node = Node(compose(load_profile("l40s"), gpus=1, hostname="h"), T0)
    StateDir(tmp_path / "s").open(node)
    record = json.loads((tmp_path / "s" / "gpu0.json").read_text())
    record["mig"] = {"enabled": True, "pending": True, "instances": []}
    (tmp_path / "s" / "gpu0.json").write_text(json.dumps(record))
    with pytest.raises(StateError, match="l40s does not support MIG"):
        StateDir(tmp_path / "s").open(Node(compose(load_profile("l40s"), gpus=1, hostname="h"), T0))


# --- the shared state ----------------------------------------------------------------------------


def test_the_publisher_copies_the_tables_and_each_gpu_s_instances_from_the_model(tmp_path):
    from mokkafs.daemon.shm.layout import NO_MIG, ffi
    from mokkafs.daemon.shm.publisher import Publisher

    node = h100()
    run(node, "gpu=1 mig enable", "gpu=1 mig create_gi 9", "gpu=1 mig create_ci 2 0,0",
        "gpu=1 mig create 2g.20gb,1g.10gb,1g.10gb")
    pub = Publisher(tmp_path / "state", clock=lambda: T0)
    pub.open()
    try:
        node.apply(SetProcesses(1, ((55, 3 << 20), (56, 1 << 20)), instances=((55, 10, 0),)), T0)
        pub.publish(node)
        st = pub._st
        mg = node.profile.mig
        assert (st.mig_memory_slices, st.mig_compute_slices, st.mig_profile_count) == (8, 7, 7)
        rows = [(p.index, p.id, ffi.string(p.name).decode(), p.memory_mib, p.placement_size,
                 list(p.placements)[: p.placement_count], p.ci_profile_count) for p in st.mig_profiles[0:7]]
        assert rows == [(g.profile, g.id, g.name, g.memory_mib, g.placement_size, list(g.placements),
                         len(g.compute_profiles)) for g in mg.gpu_instance_profiles]
        g0, g1 = st.gpus[0], st.gpus[1]
        assert (g0.mig_mode, g0.mig_gi_count, g0.mig_device_count) == (0, 0, 0)
        assert (g1.mig_mode, g1.mig_pending, g1.mig_gi_count, g1.mig_device_count) == (1, 1, 4, 5)
        gis, devices = node.mig_devices(1)
        assert [(r.id, r.profile_id, r.start, r.size, r.minor, r.ci_count, r.memory_total >> 20, r.memory_used,
                 ffi.string(r.profile_name).decode()) for r in g1.mig_gi[0:4]] == [
            (v.id, v.profile.id, v.start, v.size, v.minor, len(v.compute), v.profile.memory_mib, v.memory_used_bytes,
             v.profile.name) for v in gis]
        assert gis[3].memory_used_bytes == (3 + 9) << 20  # the process's 3 MiB and a 1g's idle 9
        assert list(g1.mig_gi_remaining)[:7] == list(node.mig_capacity(1)) == [0] * 7  # full
        assert [list(r.ci_remaining)[: len(v.remaining)] for r, v in zip(g1.mig_gi[0:4], gis)] == \
            [list(v.remaining) for v in gis]
        assert [(r.gi_slot, r.gi_id, r.ci_id, r.profile, r.start, r.size, r.multiprocessor_count, r.minor,
                 ffi.string(r.name).decode(), ffi.string(r.uuid).decode()) for r in g1.mig_devices[0:5]] == [
            ([v.id for v in gis].index(d.gi.id), d.gi.id, d.ci.id, d.profile.profile, d.ci.start, d.ci.size,
             d.profile.sm, d.minor, d.name, d.uuid) for d in devices]
        assert [(d.gi_id, d.ci_id) for d in g1.mig_devices[0:5]] == [(2, 0), (2, 1), (3, 0), (9, 0), (10, 0)]
        assert [(p.pid, p.mig_gi, p.mig_ci) for p in g1.processes[0:2]] == [(55, 10, 0), (56, NO_MIG, NO_MIG)]
        node.apply(SetLost(1, True), T0)
        pub.publish(node, {1})
        assert (st.gpus[1].mig_gi_count, st.gpus[1].mig_device_count) == (0, 0)
    finally:
        pub.close()


def test_the_model_s_limits_are_the_header_s():
    from mokkafs.daemon.shm.layout import MAX_CI_PROFILES, MAX_GPU_INSTANCES, MAX_MIG_DEVICES, MAX_MIG_PLACEMENTS, MAX_MIG_PROFILES

    assert mig.MAX_GPU_INSTANCES == MAX_GPU_INSTANCES and mig.MAX_COMPUTE_INSTANCES <= MAX_MIG_DEVICES
    assert mig.MAX_LIST <= MAX_MIG_DEVICES
    for name in ("h100",):  # other boards' tables come with their own data
        mg = load_profile(name).mig
        assert len(mg.gpu_instance_profiles) <= MAX_MIG_PROFILES
        for g in mg.gpu_instance_profiles:
            assert len(g.placements) <= MAX_MIG_PLACEMENTS and len(g.compute_profiles) <= MAX_CI_PROFILES
            assert len(g.name) < 32 and all(len(c.name) < 32 for c in g.compute_profiles)
        assert mg.compute_slices <= MAX_MIG_DEVICES  # one MIG device takes at least a compute slice


def test_every_mig_capable_board_with_tables_places_a_full_layout_of_each_profile():
    """Generic over any board's table: each profile's instances fit alone, at the placements the
    table lists, and the driver-chosen ones are ids of the slice tree."""
    from mokkafs.model.profiles import available_profiles

    for name in available_profiles():
        profile = load_profile(name)
        if profile.mig is None:
            continue
        node = Node(compose(profile, gpus=1), T0)
        run(node, "gpu=0 mig enable")
        for gp in profile.mig.gpu_instance_profiles:
            fits = min(gp.instances, profile.mig.compute_slices // gp.slices)
            run(node, "gpu=0 mig create " + ",".join([str(gp.id)] * fits))
            assert len(node.mig_instances(0)) == fits
            assert all(g.start in gp.placements for g in node.mig_instances(0))
            run(node, "gpu=0 mig clear")


# --- the control socket ---------------------------------------------------------------------------


def test_the_control_socket_answers_with_the_new_ids_and_the_driver_s_error(expect_log):
    from mokkafs.daemon.clock import WallClock
    from mokkafs.daemon.control_socket import Caller, ControlSocket

    expect_log(r"ctl\.sock: (insufficient_resources|in_use|not_found|not_supported|invalid_argument) from uid 0")
    node = h100()
    control = ControlSocket(__import__("pathlib").Path("/nonexistent.ctl.sock"), Controller(node, None, WallClock()),
                            lambda caller: caller.uid == 0, WallClock())
    root = Caller(os.getpid(), 0, 0)

    def ask(line: str):
        reply = control.handle(root, line.encode() + b"\n")
        return reply.status, reply.message

    assert ask("gpu=0 mig create 1g.10gb") == ("not_supported", "MIG mode is not enabled on gpu0")
    assert ask("gpu=0 mig enable") == ("ok", "")
    assert ask(f"gpu=0 mig create {DONE_WHEN}") == ("ok", "gi=2/ci=0 gi=3/ci=0 gi=9/ci=0 gi=10/ci=0")
    assert ask("gpu=0 mig create_gi 19:6")[0] == "insufficient_resources"
    assert ask("gpu=0 mig create_gi 19:7")[0] == "invalid_argument"
    assert ask("gpu=0 mig destroy_gi 2")[0] == "in_use"
    assert ask("gpu=0 mig destroy_gi 5")[0] == "not_found"
    assert ask("gpu=0 power_limit 500") == ("ok", "")  # only MIG creates say what they made
    node.apply(SetProcesses(1, ((99, 0),)), T0)
    assert ask("gpu=1 mig enable") == ("ok", "pending in_use")


# --- a daemon --------------------------------------------------------------------------------------


@pytest.mark.level("mount")
def test_a_layout_set_by_mokka_inject_survives_a_daemon_restart_and_a_kill(node_factory):
    from conftest import force_unmount

    node = node_factory(gpus=2)
    for args in (("mig", "enable"), ("mig", "create", DONE_WHEN)):
        assert node.cli("inject", "--root", str(node.mnt), "1", *args).returncode == 0
    shown = node.read("gpu1/mig")
    assert shown.count("\ngi ") == 4 and shown.count("\n  ci ") == 4
    bad = node.cli("inject", "--root", str(node.mnt), "1", "mig", "create", "1g.10gb", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("mokka: gpu1 mig: 1g.10gb: ")
    node.expect_warning(r"ctl\.sock: insufficient_resources from uid 0")
    node.umount()
    assert node.mount().returncode == 0
    assert node.read("gpu1/mig") == shown
    node.kill9()
    force_unmount(node.mnt)
    assert node.mount().returncode == 0
    assert node.read("gpu1/mig") == shown
    assert "MIG created gi=2 3g.40gb at 4:4 with ci=0" in node.read("gpu1/events")


# --- scenarios and annotations --------------------------------------------------------------------


def test_a_scenario_and_an_annotation_set_a_layout_through_the_same_vocabulary():
    from mokkafs.agent import grammar
    from mokkafs.model.scenario import expand, load_text

    node = h100()
    loaded = load_text(
        "name: mig-layout\ndescription: partition gpu 0\nsource: docs/mig.md\nseed: 1\nend: keep\nsteps:\n"
        "  - {at: 1s, gpu: 0, command: mig enable}\n"
        f"  - {{after: 1s, gpu: 0, command: 'mig create {DONE_WHEN}'}}\n"
    )
    plan = expand(loaded, None, len(node.gpus), node.validate)  # checked at load, before MIG is on
    for p in plan:
        node.apply(p.command.event, T0 + p.offset)
    assert [g[0] for g in layout(node)] == [2, 3, 9, 10]
    bad = load_text("name: x\ndescription: x\nsource: x\nseed: 1\nend: keep\nsteps:\n"
                    "  - {at: 1s, gpu: 0, command: 'mig create 5g.50gb'}\n")
    with pytest.raises(InvalidCommand, match="no GPU instance profile '5g.50gb'"):
        expand(bad, None, len(node.gpus), node.validate)

    commands = grammar.parse_injection(f"gpu=all mig=enable; gpu=1 mig=create {DONE_WHEN}", node.config)
    assert [str(c.command) for c in commands] == ["gpu=0 mig enable", "gpu=1 mig enable",
                                                  f"gpu=1 mig create {DONE_WHEN}"]
    with pytest.raises(InvalidCommand, match="1g.10gb: 0 compute slices left"):
        grammar.parse_injection(f"gpu=0 mig=enable; gpu=0 mig=create {DONE_WHEN},1g.10gb", node.config)


# --- an Xid that names an instance -------------------------------------------------------------------


def test_an_xid_can_name_a_mig_instance_as_the_driver_prints_it(tmp_path):
    from mokkafs.daemon.shm.layout import NO_MIG
    from mokkafs.daemon.shm.publisher import Publisher

    node = h100()
    run(node, "gpu=0 mig enable", "gpu=0 mig create 3g.40gb")
    notes = node.apply(parse_line("gpu=0 xid 31 gi=2 ci=0").event, T0).notifications
    assert node.log[-1].text.startswith("NVRM: Xid (PCI:0000:18:00 GPU-I:02 GPU-CI:00): 31, pid='<unknown>'")
    assert [(n.data, n.gi, n.ci) for n in notes] == [(31, 2, 0)]
    node.apply(parse_line("gpu=0 xid 43 gi=2").event, T0)
    assert node.log[-1].text.startswith("NVRM: Xid (PCI:0000:18:00 GPU-I:02): 43,")
    for line, reason in (("gpu=0 xid 31 gi=5", "gpu0 has no GPU instance 5"),
                         ("gpu=0 xid 31 gi=2 ci=3", "GPU instance 2 has no compute instance 3"),
                         ("gpu=1 xid 31 gi=0", "gpu1 has no GPU instance 0")):  # MIG off there
        with pytest.raises(NotFound, match=reason):
            run(node, line)
    with pytest.raises(InvalidCommand, match="Xid must be a decimal number"):
        parse_line("gpu=0 xid 31 ci=0")

    pub = Publisher(tmp_path / "state", clock=lambda: T0)
    pub.open()
    try:
        pub.publish(node)
        pub.append_events(notes + node.apply(parse_line("gpu=1 xid 13").event, T0).notifications)
        st = pub._st
        assert [(st.ring[k].data, st.ring[k].mig_gi, st.ring[k].mig_ci) for k in range(2)] == [
            (31, 2, 0), (13, NO_MIG, NO_MIG)]
    finally:
        pub.close()
