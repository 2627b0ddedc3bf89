"""`/metrics`: the node as dcgm-exporter (4.8.x, default counters) would expose it, plus
mokkafs' own counters. Pure: `(node, now) -> bytes`; docs/metrics.md says what is simulated.

The DCGM part is written here line by line rather than through prometheus_client's
`generate_latest`, because that function appends `_total` to every counter and sorts labels,
and dcgm-exporter does neither: its template prints `NAME{gpu=..,UUID=..,...} value` with the
field name verbatim and the labels in a fixed order. mokkafs' own metrics are ordinary
prometheus_client families on a private registry.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from mokkafs.model import Node, Readings
from mokkafs.model.counters import EccKind, EccScope, NvLinkCounter, ecc_total
from mokkafs.model.dynamics import energy_mj
from mokkafs.model.mig import GpuInstanceView
from mokkafs.model.schema import Fabric
from mokkafs.model.state import GpuState
from mokkafs.model.xid import RecoveryAction

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# dcgm-exporter <= 4.8.2 spells it `Hostname`; 4.8.3 renamed it `hostname` (NVIDIA/dcgm-exporter
# #655). Dashboards and alerts in the field were written against the older spelling.
DEFAULT_HOSTNAME_LABEL = "Hostname"

# What the simulated DCP (profiling) gauges are made of: there is no profiler, so they follow
# utilization. A tensor-heavy workload keeps its tensor pipes busy about half the active time.
TENSOR_SHARE = 0.5


@dataclass(frozen=True)
class Sample:
    """One GPU at one instant: what every field's value is computed from."""

    r: Readings
    g: GpuState
    ecc_mode: tuple[bool, bool] = (True, True)  # (current, pending): the pending one waits for a reset
    fabric: Fabric | None = None  # the board's NVLink fabric, as nvmlDeviceGetGpuFabricInfoV reports it


@dataclass(frozen=True)
class Field:
    name: str  # the DCGM field name, which dcgm-exporter uses verbatim as the metric name
    kind: str  # Prometheus type: gauge or counter
    help: str  # column 3 of dcgm-exporter's counters CSV
    value: Callable[[Sample], float]
    is_float: bool = False  # DCGM double fields print as Go's %f ("40.979000"); int64 as %d
    polled: bool = True  # False: set from driver events, so DCGM still has it for a lost GPU
    fabric: bool = False  # read from nvmlDeviceGetGpuFabricInfoV: blank (no series) on a board without a fabric
    # What moves with time without an event (docs/metrics.md, "One text per model change"):
    # `timed` values follow the temperature (it and what it drives: throttle reasons, clocks),
    # which moves until it reaches its target; a `grows` value (the energy counter) moves at
    # every instant, at a rate an event sets: `grows(sample)` is its value as a function of a
    # later instant with no event between. Every other value holds until the next event.
    timed: bool = False
    grows: Callable[[Sample], Callable[[float], float]] | None = None


def _ecc(scope: EccScope, kind: EccKind) -> Callable[[Sample], int]:
    return lambda s: ecc_total(s.g.ecc, scope, kind)


def _energy_after(s: Sample) -> Callable[[float], int]:
    """The energy counter at a later instant, as `s.r.energy_mj` is computed (dynamics.energy_mj)
    from the checkpoint and the power, which hold until the next event. Copied out of the GPU's
    record, which a rolled-back event can leave behind changed (daemon/controller.py)."""
    energy0_mj, t0, power_w = s.g.energy0_mj, s.g.t0, s.r.power_w
    return lambda now: int(energy_mj(energy0_mj, t0, power_w, now))


def _nvlink(counter: NvLinkCounter) -> Callable[[Sample], int]:
    return lambda s: sum(errs[counter] for errs in s.g.nvlink_errors.values())


# Rows enabled in dcgm-exporter 4.8.4's etc/default-counters.csv, in the file's order, with its
# types and help texts (the DCGM_FI_DRIVER_VERSION `label` row becomes a label, below).
DEFAULT_FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda s: s.r.clock_sm, timed=True),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda s: s.r.clock_mem,
          timed=True),
    # A board without a memory sensor reads 0 through DCGM, not blank (seen on Ada parts).
    Field(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        lambda s: round(s.r.memory_temperature_c or 0),
        timed=True,
    ),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda s: round(s.r.temperature_c),
          timed=True),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda s: s.r.power_w, is_float=True),
    Field(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since the driver was last reloaded (in mJ).",
        lambda s: int(s.r.energy_mj),
        grows=_energy_after,
    ),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda s: s.g.pcie_replay),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda s: s.r.util_gpu),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda s: s.r.util_mem),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda s: 0),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda s: 0),
    Field(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        lambda s: s.g.last_xid or 0,
        polled=False,
    ),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda s: s.r.memory_free_mib),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda s: s.r.memory_used_mib),
    Field(
        "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", lambda s: s.r.memory_reserved_mib
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "gauge",
        "Aggregate NVLink throughput across all lanes (in MB/s).",
        lambda s: 0,
    ),
    Field("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", lambda s: 0),
    Field(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        lambda s: s.g.remapped_unc,
    ),
    Field(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        lambda s: s.g.remapped_corr,
    ),
    Field(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        lambda s: int(s.g.remap_failure),
    ),
    Field(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda s: s.r.util_gpu / 100.0,
        is_float=True,
    ),
    Field(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda s: s.r.util_gpu / 100.0 * TENSOR_SHARE,
        is_float=True,
    ),
    Field(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda s: s.r.util_mem / 100.0,
        is_float=True,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
        lambda s: 0.0,
        is_float=True,
    ),
    Field(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
        lambda s: 0.0,
        is_float=True,
    ),
)

# Rows that ship commented out in the CSV (or in dcgm-exporter's other counter files), enabled
# here because they are what health checks and alerts watch: the opt-in rows 4.8.4 added (the
# configured and enforced power limits, which power-capping tools set, and the fabric health of
# NVSwitch and NVL boards), ECC, retired pages, NVLink errors, and clock throttle reasons (under
# both the pre- and post-DCGM-3.3 names of field 112).
EXTRA_FIELDS: tuple[Field, ...] = (
    Field(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Configured power management limit (in W).",
        lambda s: s.r.power_limit_w,
        is_float=True,
    ),
    # The driver enforces the configured limit: nothing else limits a simulated board, so NVML's
    # nvmlDeviceGetEnforcedPowerLimit answers the same number (the publisher writes both).
    Field(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Effective power limit enforced by the driver after all limiters (in W).",
        lambda s: s.r.power_limit_w,
        is_float=True,
    ),
    # DCGM fields 175 and 174, nvmlGpuFabricInfo_v3's healthSummary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*:
    # 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity) and healthMask (2 bits per
    # condition: 0 not supported, 1 true, 2 false), as the shim's nvmlDeviceGetGpuFabricInfoV gives them.
    Field(
        "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
        "gauge",
        "Overall health of the GPU fabric.",
        lambda s: s.fabric.health.summary_code,
        fabric=True,
    ),
    Field(
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
        "gauge",
        "GPU fabric health status mask.",
        lambda s: s.fabric.health.mask,
        fabric=True,
    ),
    # DCGM field 1523 (dcgm_fields.h: "GPU Recovery Action (see nvmlDeviceGpuRecoveryAction_t for
    # return values)"), which health checks read to drain or reset a GPU.
    Field(
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "gauge",
        "GPU Recovery Action (see nvmlDeviceGpuRecoveryAction_t for return values).",
        lambda s: int(RecoveryAction.from_spelling(s.g.recovery_action)),
        polled=False,
    ),
    Field("DCGM_FI_DEV_ECC_CURRENT", "gauge", "Current ECC mode for the device.", lambda s: int(s.ecc_mode[0])),
    Field("DCGM_FI_DEV_ECC_PENDING", "gauge", "Pending ECC mode for the device.", lambda s: int(s.ecc_mode[1])),
    Field(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        _ecc(EccScope.VOLATILE, EccKind.CORRECTED),
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        _ecc(EccScope.VOLATILE, EccKind.UNCORRECTED),
    ),
    Field(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        _ecc(EccScope.AGGREGATE, EccKind.CORRECTED),
    ),
    Field(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        _ecc(EccScope.AGGREGATE, EccKind.UNCORRECTED),
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_SBE",
        "counter",
        "Total number of retired pages due to single-bit errors.",
        lambda s: s.g.retired_sbe,
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_DBE",
        "counter",
        "Total number of retired pages due to double-bit errors.",
        lambda s: s.g.retired_dbe,
    ),
    Field(
        "DCGM_FI_DEV_RETIRED_PENDING",
        "gauge",
        "Whether pages are pending retirement (1 means pending and 0 means not pending).",
        lambda s: int(s.g.retired_pending),
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        _nvlink(NvLinkCounter.CRC_FLIT),
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
        _nvlink(NvLinkCounter.CRC_DATA),
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        _nvlink(NvLinkCounter.REPLAY),
    ),
    Field(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
        _nvlink(NvLinkCounter.RECOVERY),
    ),
    Field(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons.",
        lambda s: s.r.throttle_mask,
        timed=True,
    ),
    Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons.",
        lambda s: s.r.throttle_mask,
        timed=True,
    ),
)

FIELDS: tuple[Field, ...] = DEFAULT_FIELDS + EXTRA_FIELDS

# MIG (docs/metrics.md): dcgm-exporter's default `-d f` ("flex") watches each GPU instance of a
# GPU that has any (DCGM entity group GPU_I) instead of the GPU, and labels its series with the
# parent's labels plus GPU_I_PROFILE and GPU_I_ID. Framebuffer fields are the instance's own;
# utilization, which NVML does not report on a MIG-enabled GPU, reads blank and is dropped; the
# other fields are the parent's values.
_MIG_OWN: dict[str, Callable[[GpuInstanceView], int]] = {
    "DCGM_FI_DEV_FB_FREE": lambda v: v.profile.memory_mib - (v.memory_used_bytes >> 20),
    "DCGM_FI_DEV_FB_USED": lambda v: v.memory_used_bytes >> 20,
    "DCGM_FI_DEV_FB_RESERVED": lambda v: 0,
}
_MIG_BLANK = frozenset(
    {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL"}
)


def _escape(value: str) -> str:
    """A label value as the text format wants it."""
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


class _Meter:
    """One series of a `grows` field: its line up to the value, and the value as a function of
    the scrape's instant."""

    __slots__ = ("line", "value", "is_float")

    def __init__(self, line: str, value: Callable[[float], float], is_float: bool) -> None:
        self.line, self.value, self.is_float = line, value, is_float

    def at(self, now: float) -> str:
        v = self.value(now)
        return f"{self.line}{v:f}\n" if self.is_float else f"{self.line}{int(v)}\n"


_TIMED = tuple(f for f in FIELDS if f.timed)

# What one GPU contributes to a scrape: per field of `_fields(fabric)`, the lines of its series
# (one, one per GPU instance, or none) as text, or for a `grows` field as meters; and its `timed`
# values, or None when its temperature holds (nothing of it moves with time but the meters).
_GpuLines = tuple[list, tuple | None]


def _sample(node: Node, i: int, now: float, fabric: Fabric | None) -> Sample:
    return Sample(node.readings(i, now), node.gpus[i], (node.ecc_enabled(i), node.setting(i, "ecc_mode")), fabric)


def _timed_of(s: Sample) -> tuple:
    """The `timed` fields' values in a sample."""
    return tuple(f.value(s) for f in _TIMED)


def _timed_values(node: Node, i: int, now: float) -> tuple:
    return _timed_of(_sample(node, i, now, node.profile.fabric))


@functools.lru_cache(maxsize=4)
def _fields(fabric: Fabric | None) -> tuple[tuple[Field, str], ...]:
    """The fields a node with this fabric has series of, each with its HELP and TYPE lines. On a
    board without a fabric, NVML answers NOT_SUPPORTED for the fabric fields, DCGM stores a blank
    for every GPU, and dcgm-exporter, which drops blank values, prints no series of them (nor
    their HELP and TYPE)."""
    return tuple((f, f"# HELP {f.name} {f.help}\n# TYPE {f.name} {f.kind}\n")
                 for f in FIELDS if not (f.fabric and fabric is None))


@functools.lru_cache(maxsize=4)
def _specs(fabric: Fabric | None) -> tuple[tuple, ...]:
    """`_fields(fabric)` as plain tuples (name, value, is_float, polled, grows), unpacked once
    per line of the some 2,700 of 64 GPUs instead of read as five attributes."""
    return tuple((f.name, f.value, f.is_float, f.polled, f.grows) for f, _ in _fields(fabric))


def _gpu_lines(node: Node, i: int, now: float, host: str, hostname_label: str, watch: bool = True) -> _GpuLines:
    """GPU `i`'s part of the text at `now` (`_GpuLines`; its `timed` values only if `watch`)."""
    fabric, g = node.profile.fabric, node.gpus[i]
    s = _sample(node, i, now, fabric)
    instances = node.mig_devices(i)[0]
    lines: list = []
    append = lines.append
    if not instances:  # one series per field (most GPUs): each line formatted inline, no call per value
        prefix = _label_set(node, i, host, hostname_label, None)
        lost = g.lost
        for name, value, is_float, polled, grows in _specs(fabric):
            if polled and lost:  # a lost GPU reads blank, which dcgm-exporter drops
                append(() if grows else "")
            elif grows:
                append((_Meter(f"{name}{prefix}", grows(s), is_float),))
            elif is_float:
                append(f"{name}{prefix}{value(s):f}\n")
            else:
                append(f"{name}{prefix}{int(value(s))}\n")
    else:  # one series per GPU instance, which carries its own value of a few fields, none of some
        prefixes = [(_label_set(node, i, host, hostname_label, instance), instance) for instance in instances]
        for f, _ in _fields(fabric):
            name = f.name
            if f.polled and g.lost:
                append(() if f.grows else "")
                continue
            blank, own = name in _MIG_BLANK, _MIG_OWN.get(name)
            if f.grows:
                at = f.grows(s)  # the GPU's value: its instances share it
                append(tuple(_Meter(f"{name}{prefix}", at, f.is_float) for prefix, _ in prefixes if not blank))
                continue
            out = []
            for prefix, instance in prefixes:
                if blank:
                    continue
                v = own(instance) if own else f.value(s)
                out.append(f"{name}{prefix}{v:f}\n" if f.is_float else f"{name}{prefix}{int(v)}\n")
            append("".join(out))
    timed = None if not watch or g.lost or node.temperature_holds(i, now) else _timed_of(s)
    return lines, timed


def _assemble(fabric: Fabric | None, gpus: list[_GpuLines]) -> list:
    """The text from every GPU's part, field by field: runs of text, and between them the
    meters of the `grows` fields (written at each scrape)."""
    parts: list = []
    out: list[str] = []
    per_gpu = [lines for lines, _ in gpus]
    for k, (f, head) in enumerate(_fields(fabric)):
        out.append(head)
        if f.grows:
            parts.append("".join(out))
            out = []
            parts.append(tuple(m for lines in per_gpu for m in lines[k]))
        else:
            out.extend(map(itemgetter(k), per_gpu))
    parts.append("".join(out))
    return parts


def render_dcgm(
    node: Node, now: float, hostname: str | None = None, hostname_label: str = DEFAULT_HOSTNAME_LABEL
) -> str:
    """The dcgm-exporter part of a scrape, every value read from the model at `now`.

    A lost GPU reads blank for every polled field, and dcgm-exporter drops blank values, so such
    a GPU keeps only the event-sourced DCGM_FI_DEV_XID_ERRORS (which is how Xid 79 is seen). A
    board without an NVLink fabric (PCIe, pre-Hopper) has no fabric health series at all."""
    host = node.config.hostname if hostname is None else hostname
    gpus = [_gpu_lines(node, i, now, host, hostname_label, watch=False) for i in range(len(node.gpus))]
    return "".join(p if isinstance(p, str) else "".join(m.at(now) for m in p)
                   for p in _assemble(node.profile.fabric, gpus))


def _label_set(node: Node, i: int, host: str, hostname_label: str, instance: GpuInstanceView | None) -> str:
    """`{gpu="0",...} `, the labels of GPU `i` (or its instance) as a series prints them; the
    same for every scrape until the instance or the hostname changes, so made once."""
    ident, p = node.identities[i], node.profile
    gi = None if instance is None else (instance.profile.name, instance.id)
    return _labels_text(ident, p.product_name, node.config.driver_version, host, hostname_label, gi)


@functools.lru_cache(maxsize=4096)
def _labels_text(ident, product_name: str, driver: str, host: str, hostname_label: str, gi) -> str:
    """dcgm-exporter's labels in its order (the MIG labels after modelName, as its template puts
    them); `gi` is the GPU instance's (profile name, id), or None for a whole GPU."""
    labels = {"gpu": str(ident.index), "UUID": ident.uuid, "pci_bus_id": ident.bdf.nvml,
              "device": f"nvidia{ident.minor}", "modelName": product_name}
    if gi is not None:
        labels["GPU_I_PROFILE"], labels["GPU_I_ID"] = gi[0], str(gi[1])
    labels[hostname_label] = host
    labels["DCGM_FI_DRIVER_VERSION"] = driver
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "} "


class _OwnMetrics(Collector):
    def __init__(self, injections: Mapping[str, int], fuse_operations: int, fuse_errors: int) -> None:
        self.injections = injections
        self.fuse_operations = fuse_operations
        self.fuse_errors = fuse_errors

    def collect(self) -> Iterable[CounterMetricFamily]:
        inj = CounterMetricFamily(
            "mokka_injections", "Events applied to the simulated node, by event kind.", labels=["kind"]
        )
        for kind in sorted(self.injections):
            inj.add_metric([kind], self.injections[kind])
        yield inj
        yield CounterMetricFamily(
            "mokka_fuse_operations", "FUSE requests served by the mokkafs daemon.", value=self.fuse_operations
        )
        yield CounterMetricFamily(
            "mokka_fuse_errors",
            "FUSE requests answered with an error (EINVAL for a refused command, EIO for a bug).",
            value=self.fuse_errors,
        )


def render_own(node: Node, fuse_operations: int = 0, fuse_errors: int = 0) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_OwnMetrics(dict(node.injections), fuse_operations, fuse_errors))
    return generate_latest(registry)


def render(
    node: Node,
    now: float,
    hostname: str | None = None,
    *,
    fuse_operations: int = 0,
    fuse_errors: int = 0,
    hostname_label: str = DEFAULT_HOSTNAME_LABEL,
) -> bytes:
    """One whole scrape: the dcgm-exporter series, then mokkafs' own."""
    dcgm = render_dcgm(node, now, hostname, hostname_label).encode()
    return dcgm + render_own(node, fuse_operations, fuse_errors)


class Exposition:
    """Scrapes of one node's /metrics, the text made once per model change.

    Each GPU's part of the text is made again when an event has targeted that GPU (the model's
    `gpu_generations`), or when its temperature moves with time and now gives another `timed`
    value (a degree more, a throttle reason, a clock); otherwise the text is served again, with
    only the `grows` lines (the energy counter, which moves at every instant) written for `now`.
    So every scrape is byte for byte what `render` would give at the same instant
    (tests/test_metrics.py checks it over events and time), at the cost of a few lines per
    scrape, and an event on one GPU costs the next scrape that GPU's lines. mokkafs' own
    counters are rendered again when they have changed."""

    def __init__(self, hostname: str | None = None, hostname_label: str = DEFAULT_HOSTNAME_LABEL) -> None:
        self.hostname = hostname
        self.hostname_label = hostname_label
        self.composed = 0  # times the text was assembled from its GPUs' parts (a test counts them)
        self._node: Node | None = None
        self._now = 0.0  # the latest instant served
        self._gpus: list[_GpuLines] = []
        self._seen: list[int] = []  # each GPU's generation when its part was made
        self._watch: dict[int, tuple] = {}  # the GPUs whose temperature moves: their `timed` values
        self._parts: list[bytes | tuple[_Meter, ...]] = []
        self._own_key: tuple | None = None
        self._own = b""

    def _stale(self, node: Node, now: float) -> list[int]:
        """The GPUs whose part must be made again for `now`."""
        if node is not self._node or not now >= self._now or len(self._seen) != len(node.gpus):
            # Another node, or an instant before one served (the daemon's clock never goes
            # back, a caller's may; NaN is never after one): a temperature found settled then
            # may not have been.
            return list(range(len(node.gpus)))
        stale = [i for i, (seen, gen) in enumerate(zip(self._seen, node.gpu_generations)) if seen != gen]
        for i, timed in list(self._watch.items()):
            if i in stale:
                continue
            if _timed_values(node, i, now) != timed:
                stale.append(i)
            elif node.temperature_holds(i, now):
                # At its target from now until the next event: no need to read it again.
                del self._watch[i]
        return stale

    def parts(self, node: Node, now: float, fuse_operations: int = 0, fuse_errors: int = 0) -> list[bytes]:
        """One whole scrape at `now`, as the byte strings to send one after the other."""
        stale = self._stale(node, now)
        if stale:
            host = node.config.hostname if self.hostname is None else self.hostname
            if node is not self._node or len(self._gpus) != len(node.gpus):
                self._node, self._gpus, self._seen, self._watch = node, [None] * len(node.gpus), [-1] * len(node.gpus), {}
            for i in stale:
                self._gpus[i] = _gpu_lines(node, i, now, host, self.hostname_label)
                self._seen[i] = node.gpu_generations[i]
                timed = self._gpus[i][1]
                if timed is None:
                    self._watch.pop(i, None)
                else:
                    self._watch[i] = timed
            # The runs of text are encoded once; a later change makes new ones.
            self._parts = [p.encode() if isinstance(p, str) else p
                           for p in _assemble(node.profile.fabric, self._gpus)]
            self.composed += 1
        self._now = now
        key = (node, node.generation, fuse_operations, fuse_errors)
        if key != self._own_key:
            self._own, self._own_key = render_own(node, fuse_operations, fuse_errors), key
        out = [p if isinstance(p, bytes) else "".join(m.at(now) for m in p).encode() for p in self._parts]
        out.append(self._own)
        return out

    def render(self, node: Node, now: float, fuse_operations: int = 0, fuse_errors: int = 0) -> bytes:
        return b"".join(self.parts(node, now, fuse_operations, fuse_errors))
