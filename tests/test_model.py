"""The pure model — composition, every Xid's consequences, reset, and dynamics in
virtual time."""
from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
import trio

from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model.commands import gpu, parse_line, parse_write
from mokkafs.model.counters import EccCounter, EccKind, EccScope, MemoryLocation, NvLinkCounter
from mokkafs.model.events import IbPortCommand, InjectXid, NvLinkCommand, Pin, Reset, SetLost
from mokkafs.model.dynamics import THERMAL_TAU_S
from mokkafs.model.outcome import EVENT_DBE, EVENT_RECOVERY, EVENT_SBE, EVENT_XID, SYSTEM_BIND, SYSTEM_UNBIND
from mokkafs.model.schema import ProfileError
from mokkafs.model.profiles import load_profile

pytestmark = pytest.mark.level("model")

T0 = 1_800_000_000.0


def ecc(scope: str, kind: str, location: str) -> EccCounter:
    return EccCounter(EccScope.from_spelling(scope), EccKind.from_spelling(kind), MemoryLocation.from_spelling(location))


@pytest.fixture
def h100():
    return Node(compose(load_profile("h100"), hostname="test"), T0)


@pytest.fixture
def t4():
    return Node(compose(load_profile("t4"), gpus=2, hostname="test"), T0)


def test_composition_is_deterministic_and_consistent(h100):
    again = Node(compose(load_profile("h100"), hostname="test"), T0)
    assert [i.uuid for i in h100.identities] == [i.uuid for i in again.identities]
    assert len({i.uuid for i in h100.identities}) == 8
    assert len({i.bdf for i in h100.identities}) == 8
    first = h100.identities[0]
    assert first.bdf.nvml == "00000000:18:00.0"
    assert first.bdf.sysfs == "0000:18:00.0"
    assert first.bdf.xid == "0000:18:00"
    assert [i.numa_node for i in h100.identities] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [i.minor for i in h100.identities] == list(range(8))
    other_host = Node(compose(load_profile("h100"), hostname="other"), T0)
    assert other_host.identities[0].uuid != first.uuid


def test_64_gpus_fit_in_valid_bus_numbers():
    # l40s: a PCIe board with no per-node limit (b200's baseboard holds 8).
    node = Node(compose(load_profile("l40s"), gpus=64, hostname="big"), T0)
    bdfs = [i.bdf for i in node.identities]
    assert len(set(bdfs)) == 64
    assert all(0 < b.bus <= 0xFF for b in bdfs)
    assert {b.domain for b in bdfs} == {0, 1}


@pytest.mark.parametrize("gpus", [0, 65, -1])
def test_gpu_count_out_of_range_is_refused(gpus):
    with pytest.raises(ProfileError, match="between 1 and 64"):
        compose(load_profile("h100"), gpus=gpus)


def test_idle_readings_match_the_profile(h100):
    r = h100.readings(0, T0)
    p = h100.profile
    assert r.temperature_c == p.thermal.idle_c
    assert r.power_w == pytest.approx(p.power.idle_w)
    assert r.clock_graphics == p.clocks.idle_graphics
    assert r.clock_mem == p.clocks.max_mem
    assert r.memory_used_mib == 0
    assert r.memory_free_mib == p.memory.total_mib - p.memory.reserved_mib
    assert r.throttle_reasons == ["gpu_idle"]


@pytest.mark.parametrize("driver, total, reserved", [("470.256.02", 40536, 0), ("495.29.05", 40536, 0),
                                                     ("510.47.03", 40960, 518), ("535.261.03", 40960, 518)])
def test_the_framebuffer_is_the_one_the_driver_branch_reports(driver, total, reserved):
    """Before R510 the driver leaves what it holds back out of the total and reports none
    reserved (an idle A100 40GB at 470: "0MiB / 40536MiB"); from R510 the total is the board's
    and the reserved share is reported apart. Free, and the largest memory pin, is what is left
    either way; MIG mode's idle instances count as used on both."""
    node = Node(compose(load_profile("a100"), gpus=2, hostname="test", driver_version=driver), T0)
    usable = total - reserved
    assert (node.framebuffer.total_mib, node.framebuffer.reserved_mib, node.framebuffer.usable_mib) == \
        (total, reserved, usable)
    r = node.readings(0, T0)
    assert (r.memory_total_mib, r.memory_reserved_mib, r.memory_used_mib, r.memory_free_mib) == \
        (total, reserved, 0, usable)
    node.apply(Pin(0, "memory_used", (usable,)), T0)
    assert node.readings(0, T0).memory_free_mib == 0
    with pytest.raises(InvalidCommand, match=f"memory_used at most {usable} MiB"):
        node.validate(Pin(1, "memory_used", (usable + 1,)))
    for line in ("gpu=1 mig enable", "gpu=1 mig create 9,14,19"):
        node.apply(parse_line(line).event, T0)
    r = node.readings(1, T0)
    assert (r.memory_total_mib, r.memory_reserved_mib, r.memory_used_mib) == (total, reserved, 26 + 17 + 9)
    assert r.memory_free_mib == usable - 52


def test_a_board_without_its_pre_510_share_holds_back_its_reserved_mib():
    """A profile that does not know what a pre-510 driver held back (T4's) takes reserved_mib."""
    node = Node(compose(load_profile("t4"), gpus=1, hostname="test", driver_version="470.256.02"), T0)
    assert (node.framebuffer.total_mib, node.framebuffer.reserved_mib) == (15360 - 448, 0)


# --- each Xid and its consequences (DESIGN §5) ---------------------------------------------


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_xids_change_nothing_but_the_log(h100, code):
    before = h100.gpus[0].to_dict()
    notes = h100.apply(InjectXid(0, code), T0).notifications
    after = h100.gpus[0].to_dict()
    assert [(n.event_type, n.data) for n in notes] == [(EVENT_XID, code)]
    assert {k for k in after if after[k] != before[k]} == {"last_xid", "last_xid_time", "xid_counts"}
    assert h100.health(0) == "degraded"
    assert h100.log[-1].text.startswith(f"NVRM: Xid (PCI:0000:18:00): {code}, pid='<unknown>', name=<unknown>, ")


def test_xid_48_counts_a_dbe_raises_the_dbe_event_and_pends_a_row_remap(h100):
    notes = h100.apply(InjectXid(3, 48), T0).notifications
    g = h100.gpus[3]
    assert (EVENT_XID, 48) in [(n.event_type, n.data) for n in notes]
    assert (EVENT_DBE, 1) in [(n.event_type, n.data) for n in notes]
    assert g.ecc[ecc("volatile", "uncorrected", "dram")] == 1
    assert g.ecc[ecc("aggregate", "uncorrected", "dram")] == 1
    assert g.remapped_unc == 1 and g.remap_pending
    assert h100.health(3) == "unhealthy"


def test_xid_48_on_turing_retires_a_page_instead(t4):
    t4.apply(InjectXid(1, 48), T0)
    g = t4.gpus[1]
    assert g.retired_dbe == 1 and g.retired_pending
    assert g.remapped_unc == 0


def test_xid_63_and_64_record_a_remap_and_its_failure(h100):
    h100.apply(InjectXid(0, 63), T0)
    assert h100.gpus[0].remap_pending and not h100.gpus[0].remap_failure
    h100.apply(InjectXid(0, 64), T0)
    assert h100.gpus[0].remap_failure and h100.gpus[0].needs_reset


def test_xid_74_raises_nvlink_error_counters(h100):
    h100.apply(NvLinkCommand(1, 0, "down"), T0)
    h100.apply(InjectXid(1, 74), T0)
    errs = h100.gpus[1].nvlink_errors[1]  # link 0 is down; the first link up takes the error
    assert errs[NvLinkCounter.REPLAY] == 1 and errs[NvLinkCounter.RECOVERY] == 1
    assert "link 1(" in h100.log[-1].text


def test_xid_79_loses_the_gpu_and_reset_brings_it_back(h100):
    h100.apply(InjectXid(2, 79), T0)
    assert h100.gpus[2].lost and h100.health(2) == "lost"
    assert h100.log[-1].text == "NVRM: Xid (PCI:0000:24:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    h100.apply(Reset(2), T0 + 1)  # the control file's reset, which clears every fault
    assert not h100.gpus[2].lost and h100.gpus[2].recovery_action == "none" and h100.health(2) == "healthy"


def test_writing_lost_is_xid_79(h100):
    h100.apply(SetLost(0, True), T0)
    assert h100.gpus[0].lost and h100.gpus[0].last_xid == 79
    h100.apply(SetLost(0, False), T0)
    assert not h100.gpus[0].lost


def test_xid_92_raises_corrected_counters_and_the_sbe_event(h100):
    notes = h100.apply(InjectXid(0, 92), T0).notifications
    assert h100.gpus[0].ecc[ecc("volatile", "corrected", "dram")] > 0
    assert EVENT_SBE in [n.event_type for n in notes]


def test_xid_94_is_contained_and_95_requires_reset(h100):
    h100.apply(InjectXid(0, 94), T0)
    assert h100.gpus[0].ecc[ecc("volatile", "uncorrected", "dram")] == 1 and not h100.gpus[0].needs_reset
    h100.apply(InjectXid(1, 95), T0)
    assert h100.gpus[1].needs_reset and h100.health(1) == "unhealthy"


@pytest.mark.parametrize("code", [119, 120])
def test_gsp_errors_require_reset(h100, code):
    h100.apply(InjectXid(0, code), T0)
    assert h100.gpus[0].needs_reset


def test_reset_clears_volatile_state_but_keeps_inforom_counters(h100):
    h100.apply(InjectXid(0, 48), T0)
    h100.apply(Pin(0, "temperature", (90,)), T0)
    h100.apply(NvLinkCommand(0, 3, "down"), T0)
    h100.apply(Reset(0), T0 + 5)
    g = h100.gpus[0]
    assert g.ecc[ecc("volatile", "uncorrected", "dram")] == 0
    assert g.ecc[ecc("aggregate", "uncorrected", "dram")] == 1
    assert g.remapped_unc == 1 and not g.remap_pending  # the pending remap took effect
    assert g.pins == {} and g.nvlink_down == []
    assert h100.health(0) == "healthy"


def test_node_reset_resets_every_gpu(h100):
    for i in range(8):
        h100.apply(InjectXid(i, 79), T0)
    h100.apply(Reset(None), T0)
    assert not any(g.lost for g in h100.gpus)


def test_apply_says_what_the_event_did_in_one_outcome(h100):
    """One value per applied event, which the controller hands to every edge: what subscribers
    are told, the lines it logged (the sender's note first), the GPUs and HCAs whose records it
    touched, the counters it brought to their maximum (once), and the sender's reply."""
    out = h100.apply(InjectXid(3, 48), T0 + 1, note="scenario s step 1: gpu=3 xid 48")
    assert [(n.gpu, n.event_type, n.data) for n in out.notifications] == [
        (3, EVENT_XID, 48), (3, EVENT_DBE, 1), (3, EVENT_RECOVERY, 1)]  # GPU_RESET
    assert list(out.log) == list(h100.log)[-2:] and out.log[0].text == "scenario s step 1: gpu=3 xid 48"
    assert out.log[1].text.startswith("NVRM: Xid (PCI:0000:") and out.log[1].gpu == 3
    assert (out.gpus, out.hcas, out.saturated, out.reply) == ((3,), False, (), "")
    node_wide = h100.apply(Reset(None), T0 + 2)
    assert node_wide.gpus == tuple(range(8)) and node_wide.hcas
    # the driver unbinds every GPU, GPU 3's recovery action is NONE again, and it binds every GPU
    assert [(n.gpu, n.event_type) for n in node_wide.notifications] == [
        *((i, SYSTEM_UNBIND) for i in range(8)), (3, EVENT_RECOVERY), *((i, SYSTEM_BIND) for i in range(8))]
    flood = IbPortCommand(None, 0, 1, "errors", "symbol_error", 1_000_000)  # a 16-bit counter
    assert h100.apply(flood, T0 + 3).saturated == ("mlx5_0 port 1 symbol_error",)
    assert h100.apply(flood, T0 + 4).saturated == ()  # named once: it stays at its maximum
    h100.apply(parse_line("gpu=0 mig enable").event, T0 + 5)
    assert h100.apply(parse_line("gpu=0 mig create 3g.40gb").event, T0 + 5).reply == "gi=2/ci=0"


def test_ecc_injection_by_location(h100):
    notes = h100.apply(parse_write(gpu(5), "ecc", b"sbe 7 l2\n"), T0).notifications
    assert h100.gpus[5].ecc[ecc("volatile", "corrected", "l2")] == 7
    assert [(n.event_type, n.data) for n in notes] == [(EVENT_SBE, 7)]
    notes = h100.apply(parse_write(gpu(5), "ecc", b"dbe 2"), T0).notifications
    assert h100.gpus[5].ecc[ecc("aggregate", "uncorrected", "dram")] == 2
    # the DBE, then the driver's Xids: 95 (uncontained), GPU_RESET asked, 63 (the row it remapped)
    assert [(n.event_type, n.data) for n in notes] == [(EVENT_DBE, 2), (EVENT_XID, 95), (EVENT_RECOVERY, 1),
                                                       (EVENT_XID, 63)]


# --- validation: a bad event changes nothing ------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        InjectXid(8, 79),  # no GPU 8
        Pin(0, "clocks", (99999, 1)),
        Pin(0, "memory_used", (10_000_000,)),
    ],
)
def test_invalid_events_change_nothing(h100, event):
    before = [g.to_dict() for g in h100.gpus]
    generation = h100.generation
    with pytest.raises(InvalidCommand):
        h100.apply(event, T0)
    assert [g.to_dict() for g in h100.gpus] == before
    assert h100.generation == generation


def test_nvlink_link_beyond_the_profile_is_refused(t4):
    with pytest.raises(InvalidCommand, match="0 NVLinks"):
        t4.apply(NvLinkCommand(0, 0, "down"), T0)


@pytest.mark.parametrize(
    "verb,data",
    [
        ("xid", b""),
        ("xid", b"79 "),
        ("xid", b" 79"),
        ("xid", b"79\n\n"),
        ("xid", b"0"),
        ("xid", b"1000"),
        ("xid", b"-1"),
        ("xid", b"0x4f"),
        ("xid", b"\xff\xfe"),
        ("xid", b"7" * 300),
        ("ecc", b"sbe"),
        ("ecc", b"sbe 0"),
        ("ecc", b"tbe 1"),
        ("ecc", b"sbe 1 moon"),
        ("ecc", b"sbe  1"),
        ("nvlink", b"18 down"),
        ("nvlink", b"0 sideways"),
        ("nvlink", b"0 errors"),
        ("throttle", b"hw_thermal_slowdown bogus"),
    ],
)
def test_parsers_reject_junk(verb, data):
    with pytest.raises(InvalidCommand):
        parse_write(gpu(0), verb, data)


def test_throttle_parser_adds_implied_reasons():
    pin = parse_write(gpu(0), "throttle", b"hw_thermal_slowdown\n")
    assert pin.values == ("hw_slowdown", "hw_thermal_slowdown")


# --- dynamics ---------------------------------------------------------------------------------


def test_power_follows_utilization_and_temperature_lags_it(h100):
    p = h100.profile
    h100.apply(Pin(0, "utilization", (100, 50)), T0)
    r0 = h100.readings(0, T0)
    assert r0.power_w == pytest.approx(p.power.default_limit_w)
    assert r0.temperature_c == pytest.approx(p.thermal.idle_c)  # no jump
    r_tau = h100.readings(0, T0 + THERMAL_TAU_S)
    expected = p.thermal.max_load_c + (p.thermal.idle_c - p.thermal.max_load_c) * math.exp(-1)
    assert r_tau.temperature_c == pytest.approx(expected)
    r_hour = h100.readings(0, T0 + 3600)
    assert r_hour.temperature_c == pytest.approx(p.thermal.max_load_c, abs=0.01)
    assert r_hour.energy_mj == pytest.approx(p.power.default_limit_w * 1000 * 3600)
    assert "sw_power_cap" in r_hour.throttle_reasons
    assert r_hour.clock_sm == int(p.clocks.max_sm * 0.9)


def test_energy_integrates_piecewise_power(h100):
    p = h100.profile
    h100.apply(Pin(0, "power", (300,)), T0)
    h100.apply(Pin(0, "power", (500,)), T0 + 10)
    h100.apply(Pin(0, "power", None), T0 + 30)
    expected_mj = (300 * 10 + 500 * 20 + p.power.idle_w * 70) * 1000
    assert h100.readings(0, T0 + 100).energy_mj == pytest.approx(expected_mj)


def test_power_pin_is_clamped_to_the_limit(h100):
    h100.apply(Pin(0, "power", (5000,)), T0)
    r = h100.readings(0, T0)
    assert r.power_w == h100.profile.power.default_limit_w
    assert "sw_power_cap" in r.throttle_reasons


def test_pinned_temperature_above_slowdown_throttles_and_unpinning_is_continuous(h100):
    p = h100.profile
    h100.apply(Pin(0, "temperature", (p.thermal.slowdown_c + 1,)), T0)
    r = h100.readings(0, T0 + 1)
    assert {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"} <= set(r.throttle_reasons)
    h100.apply(Pin(0, "temperature", None), T0 + 2)
    assert h100.readings(0, T0 + 2).temperature_c == pytest.approx(p.thermal.slowdown_c + 1)
    assert h100.readings(0, T0 + 600).temperature_c == pytest.approx(p.thermal.idle_c, abs=0.5)


def test_throttle_pin_overrides_the_simulated_reasons(h100):
    h100.apply(Pin(0, "throttle", ("sw_power_cap",)), T0)
    assert h100.readings(0, T0).throttle_reasons == ["sw_power_cap"]
    h100.apply(Pin(0, "throttle", ()), T0)
    assert h100.readings(0, T0).throttle_reasons == []


async def test_an_hour_of_dynamics_in_virtual_time(h100, autojump_clock):
    """Drive the model with trio's clock for an hour of virtual time, sampling every second,
    the way the daemon's tick does; it must take milliseconds of real time."""
    start_real = time.monotonic()
    base = trio.current_time()
    h100.apply(Pin(0, "utilization", (100, 80)), T0)
    temps = []
    while trio.current_time() - base < 3600:
        await trio.sleep(1)
        temps.append(h100.readings(0, T0 + trio.current_time() - base).temperature_c)
    assert len(temps) == 3600
    assert all(b >= a for a, b in zip(temps, temps[1:]))  # monotone warm-up, no overshoot
    assert temps[-1] == pytest.approx(h100.profile.thermal.max_load_c, abs=0.01)
    assert time.monotonic() - start_real < 5


def test_model_and_renderers_import_without_io_libraries():
    """The pure core imports neither trio, pyfuse3 nor cffi."""
    code = (
        "import sys\n"
        "for m in ('trio', 'pyfuse3', 'cffi'): sys.modules[m] = None\n"
        "import mokkafs.model, mokkafs.render.control, mokkafs.render.tree, mokkafs.render.vfs\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_throttle_pin_built_directly_gets_the_implied_reasons(h100):
    h100.apply(Pin(0, "throttle", ("hw_power_brake_slowdown",)), T0)
    assert h100.readings(0, T0).throttle_reasons == ["hw_slowdown", "hw_power_brake_slowdown"]
    with pytest.raises(InvalidCommand, match="unknown throttle reason"):
        Pin(0, "throttle", ("sideways",))


# --- facts of the composition: topology levels, NVLink ends, CPU masks, SM limits ---------------


def test_topology_level_follows_the_pci_tree():
    from dataclasses import replace

    from mokkafs.model.topology import (
        TOPOLOGY_HOSTBRIDGE, TOPOLOGY_INTERNAL, TOPOLOGY_MULTIPLE, TOPOLOGY_NODE, TOPOLOGY_SINGLE, TOPOLOGY_SYSTEM,
        pci_layout, topology_level)

    layout = pci_layout(compose(load_profile("h100")))
    gpu0, gpu1, gpu4 = (layout.chain(layout.of("gpu", i)) for i in (0, 1, 4))
    hca0 = layout.chain(layout.of("hca", 0))
    assert topology_level(gpu0, gpu0) == TOPOLOGY_INTERNAL
    assert topology_level(gpu0, hca0) == TOPOLOGY_SINGLE  # one switch: down, up, down
    assert topology_level(gpu0, gpu1) == TOPOLOGY_NODE  # own host bridges, one NUMA node
    assert topology_level(gpu0, gpu4) == TOPOLOGY_SYSTEM
    # The same GPU behind a second switch under GPU 0's root port: the paths meet at the root port.
    rp, up, down, gpu = gpu0
    other = [rp, replace(up, bdf=replace(up.bdf, device=1)), replace(down, bdf=replace(down.bdf, device=9)),
             replace(gpu, bdf=replace(gpu.bdf, bus=0x77))]
    assert topology_level(gpu0, other) == TOPOLOGY_MULTIPLE
    # Another root port of GPU 0's host bridge.
    beside = [replace(f, bdf=replace(f.bdf, bus=f.bdf.bus + 0x40)) for f in gpu1]
    beside = [replace(f, root_bus=rp.root_bus) for f in beside]
    assert topology_level(gpu0, beside) == TOPOLOGY_HOSTBRIDGE
    assert layout.levels[0] == (0, 40, 40, 40, 50, 50, 50, 50)
    assert all(layout.levels[i][j] == layout.levels[j][i] for i in range(8) for j in range(8))


@pytest.mark.parametrize("profile, kinds, on_pci", [
    ("h100", {"switch"}, True),  # 4 NVSwitches with a PCI id: NVLinks name them
    ("b200", {"switch"}, False),  # switches without a published PCI id: nothing to name
    ("gb200", {"switch"}, False),  # NVL72: the switches sit in other trays
    ("l40s", set(), False),
])
def test_nvlink_ends_are_functions_of_the_layout(profile, kinds, on_pci):
    node = Node(compose(load_profile(profile)), T0)
    layout = node.layout
    switches = {f.bdf: f for f in layout.functions if f.kind == "nvswitch"}
    for i, links in enumerate(layout.nvlinks):
        assert len(links) == node.profile.nvlink.links
        assert {r.kind for r in links} == kinds
        for r in links:
            assert (r.bdf is not None) == on_pci
            if r.bdf is not None:
                f = switches[r.bdf]
                assert (r.vendor, r.device) == (f.vendor, f.device)
    if on_pci:  # round robin: every switch carries links of every GPU
        assert {r.bdf for r in layout.nvlinks[0]} == set(switches)


def test_nvlink_bridged_pairs_without_switches():
    """A board with NVLinks, no switches and no multi-node fabric pairs GPUs 0-1, 2-3 by bridges."""
    import json

    data = load_profile("a100").model_dump(mode="json")
    data["node"]["nvswitches"] = 0
    data["node"]["nvswitch_device_id"] = None
    from mokkafs.model.schema import GpuProfile

    layout = Node(compose(GpuProfile.model_validate(json.loads(json.dumps(data))), gpus=3), T0).layout
    gpus = {f.index: f.bdf for f in layout.functions if f.kind == "gpu"}
    assert {r.bdf for r in layout.nvlinks[0]} == {gpus[1]} and {r.bdf for r in layout.nvlinks[1]} == {gpus[0]}
    assert {(r.kind, r.bdf) for r in layout.nvlinks[2]} == {("gpu", None)}  # an odd GPU out has no peer


def test_gpu_cpus_are_the_numa_nodes_cpus():
    layout = Node(compose(load_profile("h100")), T0).layout
    assert layout.gpu_cpus(0) == [*range(0, 56), *range(112, 168)]
    assert layout.gpu_cpus(7) == [*range(56, 112), *range(168, 224)]
    grace = Node(compose(load_profile("gb200")), T0).layout
    assert grace.gpu_cpus(0) == list(range(72)) and grace.gpu_cpus(3) == list(range(72, 144))


@pytest.mark.parametrize("cc, threads, blocks", [("7.5", 1024, 16), ("8.0", 2048, 32), ("8.7", 1536, 16),
                                                 ("8.9", 1536, 24), ("9.0", 2048, 32), ("11.0", 2048, 32),
                                                 ("12.1", 1536, 24), ("6.1", 1024, 16)])
def test_compute_limits_by_capability(cc, threads, blocks):
    from mokkafs.model.compute import compute_limits

    limits = compute_limits(cc)
    assert (limits.max_threads_per_sm, limits.max_blocks_per_sm) == (threads, blocks)


@pytest.mark.parametrize("cc, fabric, ampere, hopper, multicast", [
    ("7.5", False, False, False, False), ("8.0", True, True, False, False), ("8.9", False, True, False, False),
    ("9.0", False, True, True, False), ("9.0", True, True, True, True), ("10.3", True, True, True, True),
    ("12.0", False, True, True, False)])
def test_compute_features_by_capability(cc, fabric, ampere, hopper, multicast):
    from mokkafs.model.compute import compute_features

    f = compute_features(cc, 40 << 20, fabric)
    assert (f.generic_compression, f.max_persisting_l2_bytes, f.max_access_policy_window_bytes,
            f.reserved_shared_memory_per_block, f.rdma_writes_ordering) == (
        (True, 30 << 20, 134213632, 1024, 100) if ampere else (False, 0, 0, 0, 0))
    assert (f.cluster_launch, f.mem_sync_domain_count, f.tensor_map_access) == (
        (True, 4, True) if hopper else (False, 1, False))
    assert f.multicast == multicast


@pytest.mark.parametrize("arch, answers", [
    ("TURING", ()), ("AMPERE", ("sram_ecc_status",)),
    ("ADA", ("sram_ecc_status", "repair_status", "power_average")),
    ("HOPPER", ("sram_ecc_status", "repair_status", "power_average", "unrepairable_memory_flag", "edpp_multiplier",
                "gpm")),
    ("BLACKWELL", ("sram_ecc_status", "repair_status", "power_average", "unrepairable_memory_flag",
                   "edpp_multiplier", "gpm")),
    ("UNKNOWN", ("sram_ecc_status", "repair_status", "power_average", "unrepairable_memory_flag",
                 "edpp_multiplier"))])
def test_nvml_support_by_architecture(arch, answers):
    from dataclasses import asdict

    from mokkafs.model.compute import nvml_support
    from mokkafs.model.nvml_consts import DEVICE_ARCHS

    assert {k for k, v in asdict(nvml_support(DEVICE_ARCHS[arch])).items() if v} == set(answers)
