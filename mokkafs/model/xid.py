"""The Xid catalogue as data: per code, the text the driver logs after
`NVRM: Xid (PCI:dddd:bb:dd): N, ` and what the fault does to the GPU; the model applies an Xid by
reading its row, and docs/faults.md's tables are generated from it (scripts/gen_faults_doc.py)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mokkafs.model.counters import EccKind, MemoryLocation, NvLinkCounter


class Remap(Enum):
    """What an Xid does to the row remapper (page retirement on boards without one)."""

    PENDING = "pending"  # a row remapped as uncorrectable (Turing: a page retired), pending until reset
    FAILED = "failed"  # the remap failed: the board needs replacing (Turing: a retirement pending)


@dataclass(frozen=True)
class EccErrors:
    """Errors an Xid counts, volatile and aggregate; they raise NVML's SBE or DBE event."""

    kind: EccKind
    count: int
    location: MemoryLocation = MemoryLocation.DRAM


@dataclass(frozen=True)
class XidRule:
    """One row of the catalogue. Every Xid also sets the last Xid, counts it, raises NVML's Xid
    event and logs the kernel line; these say what else it does."""

    message: str  # `{link}` names the link an NVLink Xid counted on
    ecc: EccErrors | None = None
    remap: Remap | None = None
    nvlink_errors: tuple[NvLinkCounter, ...] = ()  # +1 each on the first link that is up
    lost: bool = False  # off the bus until `lost 0` or a reset
    needs_reset: bool = False  # catalogue action RESET_GPU or worse
    health: str = "degraded"  # what `gpuN/info` reports right after it on a fresh GPU (tested)

    @property
    def nvml_events(self) -> tuple[str, ...]:
        """The NVML event types it raises (nvml.h names), the Xid's own first."""
        if self.ecc is None:
            return ("nvmlEventTypeXidCriticalError",)
        ecc = "DoubleBit" if self.ecc.kind is EccKind.UNCORRECTED else "SingleBit"
        return ("nvmlEventTypeXidCriticalError", f"nvmlEventType{ecc}EccError")


_DBE = EccErrors(EccKind.UNCORRECTED, 1)

# Messages follow real driver lines where one is known; the rest use the catalogue's description.
XIDS: dict[int, XidRule] = {
    8: XidRule("Ch 00000008, errorString FIFO idle timeout"),
    13: XidRule("Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter"),
    31: XidRule(
        "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f00_00000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    ),
    32: XidRule("Ch 00000008, Invalid or corrupted push buffer stream"),
    43: XidRule("Ch 00000008, errorString RESET_CHANNEL_VERIF_ERROR"),
    45: XidRule("Ch 00000008, errorString Preemptive Channel Removal"),
    46: XidRule("GPU stopped processing", needs_reset=True, health="unhealthy"),
    48: XidRule(
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
        "subpartition 0.",
        ecc=_DBE,
        remap=Remap.PENDING,
        health="unhealthy",
    ),
    61: XidRule("Internal micro-controller breakpoint/warning (PMU)"),
    62: XidRule("Internal micro-controller halt", needs_reset=True, health="unhealthy"),
    63: XidRule(
        "Row Remapper: New row marked for remapping, reset gpu to activate.", remap=Remap.PENDING, health="unhealthy"
    ),
    64: XidRule(
        "Row Remapper: Failed to remap row, GPU needs reset and may need replacement.",
        remap=Remap.FAILED,
        needs_reset=True,
        health="unhealthy",
    ),
    68: XidRule("NVDEC0 Exception"),
    69: XidRule("Graphics Exception: Class error"),
    74: XidRule(
        "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
        nvlink_errors=(NvLinkCounter.REPLAY, NvLinkCounter.RECOVERY),
    ),
    79: XidRule("GPU has fallen off the bus.", lost=True, health="lost"),
    92: XidRule("High single-bit ECC error rate detected", ecc=EccErrors(EccKind.CORRECTED, 10)),
    94: XidRule("Contained: SM (0x1). RST: No, D-RST: No", ecc=_DBE, remap=Remap.PENDING, health="unhealthy"),
    95: XidRule(
        "Uncontained: FBHUB. RST: Yes, D-RST: No", ecc=_DBE, remap=Remap.PENDING, needs_reset=True, health="unhealthy"
    ),
    109: XidRule("Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"),
    110: XidRule("Security Fault Error", needs_reset=True, health="unhealthy"),
    119: XidRule(
        "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
        needs_reset=True,
        health="unhealthy",
    ),
    120: XidRule("GSP task exception: GSP Error", needs_reset=True, health="unhealthy"),
    121: XidRule("C2C Error"),
    136: XidRule("Link Training Failed", needs_reset=True, health="unhealthy"),
    140: XidRule("ECC Unrecovered Error", needs_reset=True, health="unhealthy"),
    143: XidRule("GPU Initialization Error", needs_reset=True, health="unhealthy"),
    154: XidRule("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
}


def xid_rule(code: int) -> XidRule:
    """The catalogue's row, or for a code it does not know: logged and counted, nothing else."""
    return XIDS.get(code) or XidRule(f"Xid {code} reported")


def xid_message(code: int, **details: object) -> str:
    template = xid_rule(code).message
    return template.format(**details) if details else template.replace("{link}", "0")


def kernel_log_line(bdf_xid: str, code: int, gi: int | None = None, ci: int | None = None, **details: object) -> str:
    """The driver's printk text, without the kmsg header: what gpud and NPD rules match. An Xid
    the driver attributes to a MIG instance carries it in the parenthesis, as the open kernel
    modules print it: `(PCI:0000:18:00 GPU-I:02 GPU-CI:00)`."""
    where = f"PCI:{bdf_xid}" + ("" if gi is None else f" GPU-I:{gi:02d}") + ("" if ci is None else f" GPU-CI:{ci:02d}")
    return f"NVRM: Xid ({where}): {code}, pid='<unknown>', name=<unknown>, {xid_message(code, **details)}"
