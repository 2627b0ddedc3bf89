"""Faults as the driver couples them and the recovery lifecycle, in the pure model: an injected
uncorrectable ECC error comes with its Xids (95 or 94, 48 before Ampere; the remapper's 63 or
64), each Xid sets the recovery action its catalogue row asks for, and the matching reset clears
it (docs/faults.md)."""
from __future__ import annotations

import pytest

from mokkafs.model import InvalidCommand, Node, compose
from mokkafs.model.commands import gpu, parse_write
from mokkafs.model.events import InjectXid, Reset, SetLost
from mokkafs.model.outcome import EVENT_DBE, EVENT_RECOVERY, EVENT_XID, SYSTEM_BIND, SYSTEM_UNBIND
from mokkafs.model.profiles import load_profile
from mokkafs.model.state import GpuState
from mokkafs.model.xid import RecoveryAction

pytestmark = pytest.mark.level("model")

T0 = 1_800_000_000.0


def node(profile: str = "h100") -> Node:
    return Node(compose(load_profile(profile), gpus=2, hostname="recovery"), T0)


def ecc(n: Node, i: int, args: bytes) -> list[tuple[int, int]]:
    return [(x.event_type, x.data) for x in n.apply(parse_write(gpu(i), "ecc", args), T0).notifications]


def xids(n: Node, i: int) -> list[str]:
    return [e.text.split("): ", 1)[1].split(",")[0] for e in n.log if e.gpu == i and e.text.startswith("NVRM: Xid")]


@pytest.mark.parametrize("profile", ["a100", "h100", "h200", "b200"])
def test_an_uncorrectable_error_on_ampere_and_later_comes_with_xid_95_and_the_remappers_63(profile):
    n = node(profile)
    assert ecc(n, 1, b"dbe 1\n") == [(EVENT_DBE, 1), (EVENT_XID, 95), (EVENT_RECOVERY, 1), (EVENT_XID, 63)]
    g = n.gpus[1]
    assert xids(n, 1) == ["95", "63"] and g.xid_counts == {"95": 1, "63": 1} and g.last_xid == 63
    assert (g.remapped_unc, g.remap_pending, g.needs_reset, g.recovery_action) == (1, True, True, "gpu_reset")
    assert n.health(1) == "unhealthy"
    assert sum(v for k, v in g.ecc.items() if k.kind.name == "UNCORRECTED") == 2  # volatile and aggregate, once


def test_a_contained_error_is_xid_94_and_asks_for_no_reset():
    n = node()
    assert ecc(n, 0, b"dbe 1 dram contained") == [(EVENT_DBE, 1), (EVENT_XID, 94), (EVENT_XID, 63)]
    g = n.gpus[0]
    assert (g.needs_reset, g.recovery_action, g.remap_pending) == (False, "none", True)


def test_an_error_outside_dram_remaps_no_row():
    n = node()
    assert ecc(n, 0, b"dbe 3 sram") == [(EVENT_DBE, 3), (EVENT_XID, 95), (EVENT_RECOVERY, 1)]
    assert (n.gpus[0].remapped_unc, n.gpus[0].remap_pending) == (0, False)


def test_on_turing_it_is_xid_48_and_a_page_retired():
    n = node("t4")
    assert ecc(n, 1, b"dbe 1") == [(EVENT_DBE, 1), (EVENT_XID, 48), (EVENT_RECOVERY, 1), (EVENT_XID, 63)]
    g = n.gpus[1]
    assert (g.retired_dbe, g.retired_pending, g.remapped_unc) == (1, True, 0)


def test_on_a_board_whose_remapping_failed_the_row_fails_again_xid_64():
    n = node()
    n.apply(InjectXid(0, 64), T0)
    rows = n.gpus[0].remapped_unc
    assert ecc(n, 0, b"dbe 1") == [(EVENT_DBE, 1), (EVENT_XID, 95), (EVENT_XID, 64)]  # GPU_RESET already asked
    assert n.gpus[0].remapped_unc == rows and n.gpus[0].xid_counts["64"] == 2


@pytest.mark.parametrize("args", [b"sbe 1 contained", b"dbe 1 dram contained extra", b"dbe contained", b"dbe 1 hbm"])
def test_bad_ecc_commands_are_refused(args):
    with pytest.raises(InvalidCommand):
        parse_write(gpu(0), "ecc", args)


def test_a_gpu_reset_answers_gpu_reset_and_drain_and_reset():
    n = node()
    n.apply(InjectXid(0, 95), T0)
    n.apply(InjectXid(1, 74), T0)
    assert [n.gpus[i].recovery_action for i in (0, 1)] == ["gpu_reset", "drain_and_reset"]
    for i in (0, 1):
        out = n.apply(Reset(i), T0 + 1)
        assert [(x.event_type, x.data) for x in out.notifications] == [(EVENT_RECOVERY, int(RecoveryAction.NONE))]
        assert n.gpus[i].recovery_action == "none" and n.health(i) == "healthy"
    assert n.apply(Reset(0), T0 + 2).notifications == ()  # nothing changed: no event


def test_a_node_reboot_outlasts_nvidias_reset_and_lost_0_until_the_node_resets():
    n = node()
    out = n.apply(SetLost(1, True), T0)
    # `lost 1` is Xid 79 to every consumer, its NVML event included
    assert [(x.event_type, x.data) for x in out.notifications] == [(EVENT_XID, 79), (EVENT_RECOVERY, 2)]
    n.apply(InjectXid(1, 95), T0)  # a later, lesser ask does not lower it
    assert n.gpus[1].recovery_action == "node_reboot"
    n.apply(SetLost(1, False), T0)
    n.apply(Reset(1, idle=True), T0)  # nvidia-smi -r
    assert (n.gpus[1].lost, n.gpus[1].recovery_action, n.health(1)) == (False, "node_reboot", "unhealthy")
    assert "reboot_required" in n.active_faults(1)
    out = n.apply(Reset(None), T0)
    assert [(x.gpu, x.event_type, x.data) for x in out.notifications if x.event_type == EVENT_RECOVERY] == [
        (1, EVENT_RECOVERY, 0)]
    assert n.gpus[1].recovery_action == "none" and n.health(1) == "healthy"


def test_the_recovery_action_is_saved_and_read_back_strictly():
    g = GpuState(t0=T0, temp0=30.0, recovery_action="drain_and_reset")
    assert GpuState.from_dict(g.to_dict()).recovery_action == "drain_and_reset"
    assert GpuState.from_dict({k: v for k, v in g.to_dict().items() if k != "recovery_action"}).recovery_action == "none"
    for bad in ("reboot", "", 2, None):
        with pytest.raises(ValueError, match="recovery_action"):
            GpuState.from_dict({**g.to_dict(), "recovery_action": bad})


def test_a_node_reset_unbinds_and_binds_every_gpu_for_system_event_sets():
    """A driver reload, as nvmlSystemEventSetWait reports it: every GPU's driver unbound, then bound
    again, each named by its PCI location; a GPU reset is no driver reload and raises neither."""
    n = node()
    assert not [x for x in n.apply(Reset(0), T0).notifications if x.event_type in (SYSTEM_UNBIND, SYSTEM_BIND)]
    out = [(x.gpu, x.event_type, x.data) for x in n.apply(Reset(None), T0).notifications]
    ids = [b.domain << 16 | b.bus << 8 | b.device for b in (n.identities[i].bdf for i in range(2))]
    assert ids == [0x1800, 0x1E00]  # an H100 node's first two GPUs, 0000:18:00.0 and 0000:1e:00.0
    assert out == [(0, SYSTEM_UNBIND, ids[0]), (1, SYSTEM_UNBIND, ids[1]), (0, SYSTEM_BIND, ids[0]),
                   (1, SYSTEM_BIND, ids[1])]


def test_the_control_files_reset_clears_a_node_reboot_too():
    """`gpuN/reset` (1) is the simulator's fault-clearing reset: it answers every fault, a node
    reboot's action included, so a test can start a GPU over without resetting the node."""
    n = node()
    n.apply(InjectXid(0, 79), T0)
    n.apply(Reset(0), T0)
    assert (n.gpus[0].recovery_action, n.health(0)) == ("none", "healthy")
