"""Faults and their recovery: Xids (by the catalogue's rows, model/xid.py), ECC errors, a GPU
off the bus, NVLink and InfiniBand port faults and their error counters, ECC counts cleared, and
the GPU or node reset that clears what a reset clears; and what they leave a GPU as (its health,
its active faults). Each transition validates, then changes `Node`'s GPU and HCA records and
returns its `Outcome`; counters saturate at their real width (`Change.add`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mokkafs.model import accounting, mig
from mokkafs.model.config import SETTINGS, GpuIsLost, NotSupported
from mokkafs.model.counters import EccCounter, EccKind, EccScope, MemoryLocation, NvLinkCounter, ecc_total, zero_nvlink
from mokkafs.model.events import (
    ClearEcc, IbPortCommand, InjectEcc, InjectXid, InvalidCommand, NvLinkCommand, Reset, SetLost,
)
from mokkafs.model.mig import MigState
from mokkafs.model.outcome import (
    EVENT_DBE, EVENT_RECOVERY, EVENT_SBE, EVENT_XID, SYSTEM_BIND, SYSTEM_UNBIND, Change, Outcome,
)
from mokkafs.model.schema import GpuProfile
from mokkafs.model.state import GpuState, HcaState
from mokkafs.model.xid import RecoveryAction, Remap, kernel_log_line, xid_rule

if TYPE_CHECKING:
    from mokkafs.model.node import Node


def has_row_remapper(profile: GpuProfile) -> bool:
    """Ampere and later remap rows; Turing and earlier retire pages (nvidia-smi -q shows which)."""
    return profile.architecture not in ("Turing", "Volta")


def has_error_containment(profile: GpuProfile) -> bool:
    """Ampere and later contain an uncorrectable error (Xid 94, or 95 when they cannot: the
    catalogue's "GPUs that support error containment, starting with NVIDIA A100"); Volta and
    Turing report it as Xid 48."""
    return profile.architecture not in ("Turing", "Volta")


def require_on_bus(node: Node, i: int) -> None:
    """A GPU off the bus answers nothing it is asked to change: NVML_ERROR_GPU_IS_LOST."""
    if node.gpus[i].lost:
        raise GpuIsLost(f"gpu{i} has fallen off the bus")


# --- Xids and ECC errors -----------------------------------------------------------------------


def inject_xid(node: Node, e: InjectXid, now: float) -> Outcome:
    if e.gi is not None:
        _check_instance(node, e.gpu, e.gi, e.ci)
    change = Change(now)
    xid(node, e.gpu, e.code, change, e.gi, e.ci)
    return change.outcome()


def _check_instance(node: Node, i: int, gi: int, ci: int | None) -> None:
    """An Xid names a MIG instance of GPU i that exists now (NotFound otherwise)."""
    for g in node.mig_instances(i):
        if g.id == gi:
            if ci is not None:
                g.ci(ci)
            return
    raise mig.NotFound(f"gpu{i} has no GPU instance {gi}")


def xid(node: Node, i: int, code: int, change: Change, gi: int | None = None, ci: int | None = None,
        reported: bool = False) -> None:
    """What Xid `code` does to GPU `i`: a row of the catalogue (model/xid.py). `reported`: the
    driver reports an error the caller has already counted (an injected ECC error's Xids), so the
    row's own ECC counts and remap are not made again."""
    g, ident = node.gpus[i], node.identities[i]
    rule = xid_rule(code)
    details: dict = {}
    change.notify(i, EVENT_XID, code, gi, ci)
    if reported:
        pass
    elif rule.ecc is not None:
        _count_ecc(g, i, rule.ecc.kind, rule.ecc.location, rule.ecc.count, change)
        event = EVENT_DBE if rule.ecc.kind is EccKind.UNCORRECTED else EVENT_SBE
        change.notify(i, event, rule.ecc.count)
    if reported:
        pass
    elif rule.remap is Remap.PENDING:
        _record_remap_or_retire(node, i, change, uncorrectable=True)
    elif rule.remap is Remap.FAILED:
        if has_row_remapper(node.profile):
            g.remap_failure = True
        else:
            g.retired_pending = True
    if rule.nvlink_errors:
        link = _first_up_link(node.profile, g)
        details["link"] = link
        _count_nvlink(g, i, link, rule.nvlink_errors, 1, change)
    if rule.lost:
        g.lost = True
    if rule.needs_reset:
        g.needs_reset = True
    raise_recovery(g, i, rule.recovery, change)
    g.last_xid, g.last_xid_time = code, change.now
    g.xid_counts[str(code)] = change.add(f"gpu{i} xid_counts.{code}", "xid_counts", g.xid_counts.get(str(code), 0), 1)
    change.log(i, kernel_log_line(ident.bdf.xid, code, gi, ci, has_row_remapper(node.profile), **details))


def _record_remap_or_retire(node: Node, i: int, change: Change, uncorrectable: bool) -> None:
    g = node.gpus[i]
    if has_row_remapper(node.profile):
        key = "remapped_unc" if uncorrectable else "remapped_corr"
        setattr(g, key, change.add(f"gpu{i} {key}", "remapped_rows", getattr(g, key), 1))
        g.remap_pending = True
    else:
        key = "retired_dbe" if uncorrectable else "retired_sbe"
        setattr(g, key, change.add(f"gpu{i} {key}", "retired_pages", getattr(g, key), 1))
        g.retired_pending = True


def recovery_action(g: GpuState) -> RecoveryAction:
    return RecoveryAction.from_spelling(g.recovery_action)


def _set_recovery(g: GpuState, i: int, action: RecoveryAction, change: Change) -> None:
    if action is not recovery_action(g):
        g.recovery_action = action.spelling
        # nvmlEventTypeGpuRecoveryAction: the driver's notice that the action changed (its data is
        # the new action here; NVML hands a waiter 0, as for every event but an Xid).
        change.notify(i, EVENT_RECOVERY, int(action))


def raise_recovery(g: GpuState, i: int, action: RecoveryAction, change: Change) -> None:
    """A fault asks for `action`; a later fault never lowers what an earlier one asked for
    (a GPU reset does not answer a node reboot)."""
    if action.rank > recovery_action(g).rank:
        _set_recovery(g, i, action, change)


def _first_up_link(profile: GpuProfile, g: GpuState) -> int:
    for link in range(profile.nvlink.links):
        if link not in g.nvlink_down:
            return link
    return 0


def _count_ecc(g: GpuState, i: int, kind: EccKind, location: MemoryLocation, count: int, change: Change) -> None:
    for scope in EccScope:
        key = EccCounter(scope, kind, location)
        g.ecc[key] = change.add(f"gpu{i} ecc.{key.key}", "ecc", g.ecc[key], count)


def _count_nvlink(g: GpuState, i: int, link: int, counters: tuple[NvLinkCounter, ...], count: int,
                  change: Change) -> None:
    errs = g.nvlink_errors.setdefault(link, zero_nvlink())
    for c in counters:
        errs[c] = change.add(f"gpu{i} nvlink_errors.{link}.{c.spelling}", "nvlink_errors", errs[c], count)


def inject_ecc(node: Node, e: InjectEcc, now: float) -> Outcome:
    """ECC errors; an uncorrectable one as the driver couples it (docs/faults.md): its DBE event,
    then its Xid (95 uncontained, 94 contained; 48 before Ampere), then, in DRAM, the remapper's
    (or page retirement's) Xid 63 for the row it marked, 64 when the board's remapping has failed."""
    change = Change(now)
    i, g = e.gpu, node.gpus[e.gpu]
    _count_ecc(g, i, EccKind.from_short(e.kind), MemoryLocation.from_spelling(e.location), e.count, change)
    change.log(i, f"mokka: gpu{i} {e.count} {e.kind.upper()} ECC error(s) in {e.location}")
    if e.kind != "dbe":
        change.notify(i, EVENT_SBE, e.count)
        return change.outcome()
    change.notify(i, EVENT_DBE, e.count)
    if not has_error_containment(node.profile):
        code = 48
    else:
        code = 94 if e.contained else 95
    xid(node, i, code, change, reported=True)
    if e.location == "dram":
        failed = g.remap_failure if has_row_remapper(node.profile) else False
        if not failed:
            _record_remap_or_retire(node, i, change, uncorrectable=True)
        xid(node, i, 64 if failed else 63, change, reported=True)
    return change.outcome()


def validate_clear_ecc(node: Node, e: ClearEcc) -> None:
    require_on_bus(node, e.gpu)
    if not node.ecc_enabled(e.gpu):
        # nvml.h: clearing "requires ECC Mode to be enabled".
        raise NotSupported(f"gpu{e.gpu} runs with ECC off: there are no ECC counters to clear")


def clear_ecc(node: Node, e: ClearEcc, now: float) -> Outcome:
    change = Change(now)
    ecc = node.gpus[e.gpu].ecc
    scope = EccScope.VOLATILE if e.scope == "volatile" else EccScope.AGGREGATE
    for counter in ecc:
        if counter.scope is scope:
            ecc[counter] = 0
    change.log(e.gpu, f"mokka: gpu{e.gpu} {e.scope} ECC counts cleared")
    return change.outcome()


# --- off the bus, NVLinks, InfiniBand ports ----------------------------------------------------


def set_lost(node: Node, e: SetLost, now: float) -> Outcome:
    change = Change(now)
    i, g = e.gpu, node.gpus[e.gpu]
    if e.lost and not g.lost:
        # Writing `lost` is the same fault as Xid 79, with the same consequences, log line and
        # NVML events (a consumer waiting on Xids hears of it as of the driver's).
        xid(node, i, 79, change)
    elif not e.lost and g.lost:
        g.lost = False
        change.log(i, f"mokka: gpu{i} back on the bus")
    return change.outcome()


def validate_nvlink(node: Node, e: NvLinkCommand) -> None:
    links = node.profile.nvlink.links
    if e.link >= links:
        if e.action == "reset_errors" and not links:
            # nvmlDeviceResetNvLinkErrorCounters on a board without NVLink: NOT_SUPPORTED.
            raise NotSupported(f"{node.profile.name} has no NVLinks")
        raise InvalidCommand(f"{node.profile.name} has {links} NVLinks, no link {e.link}")


def nvlink(node: Node, e: NvLinkCommand, now: float) -> Outcome:
    change = Change(now)
    g = node.gpus[e.gpu]
    if e.action == "down" and e.link not in g.nvlink_down:
        g.nvlink_down = sorted(g.nvlink_down + [e.link])
    elif e.action == "up" and e.link in g.nvlink_down:
        g.nvlink_down = [link for link in g.nvlink_down if link != e.link]
    elif e.action == "errors":
        _count_nvlink(g, e.gpu, e.link, (NvLinkCounter.REPLAY, NvLinkCounter.CRC_FLIT), e.count, change)
    elif e.action == "reset_errors":
        g.nvlink_errors.pop(e.link, None)
    change.log(e.gpu, f"mokka: gpu{e.gpu} nvlink {e.link} {e.action}{f' {e.count}' if e.count else ''}")
    return change.outcome()


def validate_ib_port(node: Node, e: IbPortCommand) -> None:
    if e.hca >= len(node.hcas):
        raise InvalidCommand(f"no HCA mlx5_{e.hca} (node has {len(node.hcas)})")


def ib_port(node: Node, e: IbPortCommand, now: float) -> Outcome:
    change = Change(now)
    h = node.hcas[e.hca]
    name = f"mlx5_{e.hca} port {e.port}"
    if e.action == "down" and not h.port_down:
        h.port_down = True
        # The port counts each time its link goes down.
        h.counters["link_downed"] = change.add(f"{name} link_downed", "ib.link_downed", h.counters["link_downed"], 1)
        change.log(None, f"mokka: {name} down")
    elif e.action == "up" and h.port_down:
        h.port_down = False
        change.log(None, f"mokka: {name} up")
    elif e.action == "errors":
        h.counters[e.counter] = change.add(f"{name} {e.counter}", f"ib.{e.counter}", h.counters[e.counter], e.count)
        change.log(None, f"mokka: {name} {e.count} {e.counter}")
    return change.outcome()


# --- resets -------------------------------------------------------------------------------------


def _reset_targets(node: Node, e: Reset) -> list[int]:
    if e.gpus:
        return list(e.gpus)
    return list(range(len(node.gpus))) if e.gpu is None else [e.gpu]


def validate_reset(node: Node, e: Reset) -> None:
    for i in e.gpus:
        if i >= len(node.gpus):
            raise InvalidCommand(f"no gpu{i} (node has {len(node.gpus)})")
    if e.idle:
        # NVIDIA's reset: the driver refuses a GPU a client holds (nvidia-smi -r: "In use by
        # another client"), and a set of GPUs as a whole: one busy GPU and none is reset. The
        # control files' reset (not idle) resets under processes.
        busy = [i for i in _reset_targets(node, e) if node.processes[i]]
        if busy:
            raise mig.InUse("in use: " + ", ".join(f"GPU {i} ({len(node.processes[i])} process(es))" for i in busy))


def reset(node: Node, e: Reset, now: float) -> Outcome:
    """A GPU reset, or (`gpu=None`) a node reset: every GPU as on a driver reload, and the HCAs;
    or (`gpus`) a GPU reset of each of those GPUs."""
    change = Change(now)
    node_reset = e.gpu is None and not e.gpus
    targets = _reset_targets(node, e)
    if node_reset:  # the driver lets go of every GPU, and binds each again once reloaded
        for i in targets:
            change.notify(i, SYSTEM_UNBIND, pci_gpu_id(node, i))
    for i in targets:
        _reset_gpu(node, i, change, driver_reload=node_reset, answers_reboot=node_reset or not e.idle)
    if node_reset:
        for i in targets:
            change.notify(i, SYSTEM_BIND, pci_gpu_id(node, i))
        _reset_hcas(node, change)
    return change.outcome()


def pci_gpu_id(node: Node, i: int) -> int:
    """A system event's gpuId ("in PCI format", nvml.h): (domain << 16) | (bus << 8) | device."""
    bdf = node.identities[i].bdf
    return bdf.domain << 16 | bdf.bus << 8 | bdf.device


def _reset_gpu(node: Node, i: int, change: Change, driver_reload: bool = False, answers_reboot: bool = True) -> None:
    """What a GPU reset does: the GPU comes back, volatile counters clear, pending row remaps
    and page retirements take effect, links retrain, pins return to the simulated curves,
    settings return to their defaults but those the driver keeps (on a node reset, a driver
    reload, only those the board keeps), a pending ECC mode takes effect. Aggregate (InfoROM)
    counters, remapped rows and a remap failure stay, as on a real board."""
    g = node.gpus[i]
    # A pending setting (ECC mode) takes effect: the board comes up with it.
    g.ecc_mode_current = g.ecc_mode
    for s in SETTINGS.values():
        if not (s.kept_by_node_reset or (not driver_reload and s.kept_by_gpu_reset)):
            setattr(g, s.field, None)
    if not node.setting(i, "accounting"):  # a driver reload switches it off, and the records go
        accounting.switched(node, i, False)
    g.lost = False
    g.needs_reset = False
    # A reset answers what a reset answers. A node reboot is asked of the node: NVIDIA's reset
    # (nvidia-smi -r, NVML's) leaves it; a driver reload (`node/reset`) starts the driver's state,
    # this action included, over; and the control files' fault-clearing reset clears every fault.
    if answers_reboot or recovery_action(g) is not RecoveryAction.NODE_REBOOT:
        _set_recovery(g, i, RecoveryAction.NONE, change)
    g.pins.clear()
    for counter in g.ecc:
        if counter.scope is EccScope.VOLATILE:
            g.ecc[counter] = 0
    g.remap_pending = False
    g.retired_pending = False
    g.nvlink_down = []
    g.nvlink_errors = {}
    g.last_xid = None
    g.last_xid_time = None
    # A reset is the activation a pending MIG mode waits for; instances do not survive it.
    if g.mig.instances or g.mig.pending != g.mig.enabled:
        g.mig = MigState(g.mig.pending, g.mig.pending)
    change.log(i, f"mokka: gpu{i} reset")


def _reset_hcas(node: Node, change: Change) -> None:
    """A node reset brings every port up and clears its counters (as `perfquery -R` would)."""
    if any(h.port_down or any(h.counters.values()) for h in node.hcas):
        node.hcas = [HcaState() for _ in node.hcas]
        change.log(None, "mokka: InfiniBand ports reset")


# --- what the faults leave ----------------------------------------------------------------------


def active_faults(g: GpuState) -> list[str]:
    faults = []
    if g.lost:
        faults.append("lost")
    if g.needs_reset:
        faults.append("reset_required")
    if g.recovery_action == RecoveryAction.NODE_REBOOT.spelling:
        faults.append("reboot_required")
    if g.remap_pending:
        faults.append("row_remap_pending")
    if g.remap_failure:
        faults.append("row_remap_failure")
    if g.retired_pending:
        faults.append("page_retirement_pending")
    if ecc_total(g.ecc, EccScope.VOLATILE, EccKind.UNCORRECTED):
        faults.append("uncorrectable_ecc")
    faults += [f"nvlink{link}_down" for link in g.nvlink_down]
    faults += [f"pinned_{signal}" for signal in sorted(g.pins)]
    return faults


def health(g: GpuState) -> str:
    if g.lost:
        return "lost"
    if g.needs_reset or g.remap_failure or g.remap_pending or g.retired_pending or g.recovery_action != "none":
        return "unhealthy"
    if g.last_xid is not None or g.nvlink_down:
        return "degraded"
    return "healthy"
