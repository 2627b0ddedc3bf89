"""`node/` and `gpuN/`: the control and status files of DESIGN §4, rendered from the model. A
writable file is the command of model/commands.py its name stands for, on its GPU or the node."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial

from mokkafs.model import Node
from mokkafs.model.commands import NODE, control_writer, gpu
from mokkafs.model.config import SETTINGS
from mokkafs.model.counters import ECC_ROWS, NVLINK_COUNTERS, ecc_total
from mokkafs.model.state import LogEntry
from mokkafs.render.vfs import Ctx, Dir, File, const, lazy_static_dir, static_dir, text


def _scenario_request(data: bytes):
    """A write to node/scenario as its request (model/scenario.py, imported at the first one:
    the scenario schema is not part of every daemon's start)."""
    from mokkafs.model.scenario import parse_request

    return parse_request(data)


def iso_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def log_line(entry: LogEntry) -> str:
    return f"{iso_time(entry.time)} {entry.text}\n"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render_info(ctx: Ctx, i: int) -> str:
    node, ident = ctx.node, ctx.node.identities[i]
    faults = node.active_faults(i)
    rows = [
        ("name", node.profile.product_name),
        ("index", ident.index),
        ("minor", ident.minor),
        ("uuid", ident.uuid),
        ("serial", ident.serial),
        ("bus_id", ident.bdf.nvml),
        ("numa_node", ident.numa_node),
        ("profile", node.profile.name),
        ("health", node.health(i)),
        ("faults", " ".join(faults) if faults else "none"),
        ("recovery_action", node.gpus[i].recovery_action),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's
    ]
    return "".join(f"{k}: {v}\n" for k, v in rows)


def render_config(ctx: Ctx, i: int) -> str:
    """`NAME: VALUE` per setting, VALUE spelled as the command that sets it takes it; a value
    other than the default is followed by `(default D)`, a pending one (ECC mode) that is not yet
    in effect by `(current C until a reset)`."""
    node, lines = ctx.node, []
    for s in SETTINGS.values():
        value, default = node.setting(i, s.name), s.default(node.profile)
        mark = "" if value == default else f" (default {s.spell(default)})"
        if s.pending_until_reset and node.ecc_enabled(i) != value:
            mark += f" (current {s.spell(node.ecc_enabled(i))} until a reset)"
        lines.append(f"{s.name}: {s.spell(value)}{mark}\n")
    return "".join(lines)


def render_mig(ctx: Ctx, i: int) -> str:
    """MIG mode and instances (docs/mig.md): `mode` and `pending`, then one `gi` line per GPU
    instance (id, profile name and id, placement start:size, memory, SMs, capability minor), each
    followed by its `ci` lines (id, profile name and id, placement, SMs, minor, MIG UUID, name).
    None are listed while the GPU is off the bus."""
    node = ctx.node
    if node.profile.mig is None:
        return "mode: not supported\n"
    st = node.gpus[i].mig
    lines = [f"mode: {'enabled' if st.enabled else 'disabled'}", f"pending: {'enabled' if st.pending else 'disabled'}"]
    gis, devices = node.mig_devices(i)
    for gi in gis:
        p = gi.profile
        lines.append(f"gi {gi.id} profile {p.name} id {p.id} placement {gi.start}:{gi.size} "
                     f"memory_mib {p.memory_mib} sm {p.sm} minor {gi.minor}")
        for d in devices:
            if d.gi.id == gi.id:
                lines.append(f"  ci {d.ci.id} profile {d.profile.name} id {d.profile.profile} "
                             f"placement {d.ci.start}:{d.ci.size} sm {d.profile.sm} minor {d.minor} uuid {d.uuid} "
                             f"name {d.name}")
    return "".join(f"{line}\n" for line in lines)


def render_xid(ctx: Ctx, i: int) -> str:
    g = ctx.node.gpus[i]
    if g.last_xid is None:
        return "none\n"
    return f"{g.last_xid} {iso_time(g.last_xid_time)}\n"


def render_ecc(ctx: Ctx, i: int) -> str:
    g = ctx.node.gpus[i]
    lines = []
    for scope, kind, row in ECC_ROWS:
        lines.append(f"{scope.spelling} {kind.short} {ecc_total(g.ecc, scope, kind)}")
        lines += [f"{scope.spelling} {kind.short} {c.location.spelling} {g.ecc[c]}" for c in row if g.ecc[c]]
    lines.append(f"retired_pages sbe {g.retired_sbe} dbe {g.retired_dbe} pending {_yes(g.retired_pending)}")
    lines.append(
        f"remapped_rows correctable {g.remapped_corr} uncorrectable {g.remapped_unc} "
        f"pending {_yes(g.remap_pending)} failure {_yes(g.remap_failure)}"
    )
    return "".join(f"{line}\n" for line in lines)


def render_nvlink(ctx: Ctx, i: int) -> str:
    g = ctx.node.gpus[i]
    out = []
    for link in range(ctx.node.profile.nvlink.links):
        errs = g.nvlink_errors.get(link, {})
        counters = " ".join(f"{c.spelling}={errs.get(c, 0)}" for c in NVLINK_COUNTERS)
        out.append(f"{link} {'down' if link in g.nvlink_down else 'up'} {counters}\n")
    return "".join(out)


def _reading(ctx: Ctx, i: int, fmt) -> str:
    return fmt(ctx.node.readings(i, ctx.now)) + "\n"


_SIGNALS = {
    "temperature": lambda r: f"{round(r.temperature_c)}",
    "power": lambda r: f"{r.power_w:.2f}",
    "utilization": lambda r: f"{r.util_gpu} {r.util_mem}",
    "clocks": lambda r: f"{r.clock_sm} {r.clock_mem}",
    "memory_used": lambda r: f"{r.memory_used_mib}",
    "throttle": lambda r: " ".join(r.throttle_reasons) or "none",
}


def _events(ctx: Ctx, gpu: int | None) -> str:
    return "".join(log_line(e) for e in ctx.node.log if gpu is None or e.gpu == gpu)


class EventLogText:
    """`node/events` and every `gpuN/events` of one tree: the log's lines, each formatted once.

    A line's timestamp costs ~2 us to format and a full log is LOG_LIMIT lines: rendered whole at
    every open and every stat (the file's size is its length), `node/events` held the daemon's
    loop ~8 ms and each `gpuN/events` ~1 ms once the log was full, in front of every request
    queued behind it. Here each new entry is formatted once, into the node's lines and its GPU's;
    the bytes are joined again only when the log changed since the last read. What is served is
    what `_events` renders (tests/test_render_events.py compares them after every event kind).

    The log is a deque that only grows at the right and drops at the left (LOG_LIMIT), or is
    replaced whole (a restore, a rolled-back event): the cache finds the last entry it formatted
    in the log by identity (it holds that object, so its identity cannot be reused), formats what
    follows it and drops what left; anything else, another node included, formats anew."""

    def __init__(self) -> None:
        self._node: Node | None = None
        self._last: LogEntry | None = None  # the last entry formatted
        self._next = 0  # the number the next entry formatted gets (entries count up from 0)
        # None: the node's lines; i: GPU i's. Per key, the numbers of its entries and their lines.
        self._seqs: dict[int | None, deque[int]] = {}
        self._lines: dict[int | None, deque[bytes]] = {}
        self._data: dict[int | None, bytes] = {}  # joined lines, for keys unchanged since

    def data(self, ctx: Ctx, gpu: int | None) -> bytes:
        self._sync(ctx.node)
        data = self._data.get(gpu)
        if data is None:
            data = self._data[gpu] = b"".join(self._lines.get(gpu, ()))
        return data

    def _sync(self, node: Node) -> None:
        log = node.log
        if node is self._node and log and log[-1] is self._last:
            return  # nothing new: the common case, no formatting, no join
        start = self._find_last(node)
        if start is None:
            self._node, self._last, self._next = node, None, 0
            self._seqs, self._lines, self._data = {}, {}, {}
            start = 0
        seqs, lines, data = self._seqs, self._lines, self._data
        for k in range(start, len(log)):
            e = log[k]
            line = log_line(e).encode()
            for key in (None, e.gpu) if e.gpu is not None else (None,):
                if key not in seqs:
                    seqs[key], lines[key] = deque(), deque()
                seqs[key].append(self._next)
                lines[key].append(line)
                data.pop(key, None)
            self._next += 1
        self._last = log[-1] if log else None
        first = self._next - len(log)  # the number of the log's first entry: older ones left it
        for key, numbers in seqs.items():
            while numbers and numbers[0] < first:
                numbers.popleft()
                lines[key].popleft()
                data.pop(key, None)

    def _find_last(self, node: Node) -> int | None:
        """Where in the log the entries not yet formatted start, or None: format it all anew."""
        if node is not self._node or self._last is None:
            return None
        log = node.log
        for k in range(len(log) - 1, -1, -1):  # from the right: a few entries are new
            if log[k] is self._last:
                return k + 1
        return None


def gpu_dir(i: int, events: EventLogText | None = None) -> Dir:
    """gpuN/: its files are made at its first lookup (a 64-GPU mount answers sooner)."""
    return lazy_static_dir(partial(_gpu_files, i, events))


def _gpu_files(i: int, events: EventLogText | None = None) -> dict[str, File]:
    target = gpu(i)
    files: dict[str, File] = {
        "info": text(partial(render_info, i=i)),
        "config": text(partial(render_config, i=i)),
        "mig": text(partial(render_mig, i=i)),
        "inject_xid": text(partial(render_xid, i=i), write=control_writer(target, "xid")),
        "inject_ecc": text(partial(render_ecc, i=i), write=control_writer(target, "ecc")),
        "lost": text(lambda ctx: "1\n" if ctx.node.gpus[i].lost else "0\n", write=control_writer(target, "lost")),
        "nvlink": text(partial(render_nvlink, i=i), write=control_writer(target, "nvlink")),
        "reset": const(b"", write=control_writer(target, "reset"), mode=0o200),
        # grows: stat says its length
        "events": File(partial(events.data, gpu=i), size=None) if events else text(partial(_events, gpu=i), size=None),
    }
    for signal, fmt in _SIGNALS.items():
        files[signal] = text(partial(_reading, i=i, fmt=fmt), write=control_writer(target, signal))
    return files


def node_dir(scenario_status: Callable[[float], str] | None = None, events: EventLogText | None = None) -> Dir:
    files = {
        "profile": text(lambda ctx: f"{ctx.node.profile.name}\n"),
        "driver_version": text(lambda ctx: f"{ctx.node.config.driver_version}\n"),
        "cuda_version": text(lambda ctx: f"{ctx.node.config.cuda_version}\n"),
        "gpu_count": text(lambda ctx: f"{len(ctx.node.gpus)}\n"),
        "events": File(partial(events.data, gpu=None), size=None) if events else text(partial(_events, gpu=None),
                                                                                            size=None),
        "reset": const(b"", write=control_writer(NODE, "reset"), mode=0o200),
    }
    if scenario_status is not None:
        # What runs, its step and the next one (the daemon's runner says); a write is a
        # scenario to run or `stop` (model/scenario.py, docs/scenarios.md).
        files["scenario"] = text(lambda ctx: scenario_status(ctx.now), write=_scenario_request)
    return static_dir(files)


def control_tree(gpu_count: int, scenario_status: Callable[[float], str] | None = None) -> dict[str, Dir]:
    """The `node/` and `gpuN/` directories for the mount's root."""
    events = EventLogText()  # one per tree: the node's lines and each GPU's, formatted once
    tree: dict[str, Dir] = {"node": node_dir(scenario_status, events)}
    tree.update({f"gpu{i}": gpu_dir(i, events) for i in range(gpu_count)})
    return tree
