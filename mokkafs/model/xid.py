"""The Xid catalogue as data: per code, the text the driver logs after
`NVRM: Xid (PCI:dddd:bb:dd): N, ` and what the fault does to the GPU; the model applies an Xid by
reading its row, and docs/faults.md's tables are generated from it (scripts/gen_faults_doc.py)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from mokkafs.model.counters import EccKind, MemoryLocation, NvLinkCounter
from mokkafs.model.nvml_consts import RECOVERY_ACTIONS


class Remap(Enum):
    """What an Xid does to the row remapper (page retirement on boards without one)."""

    PENDING = "pending"  # a row remapped as uncorrectable (Turing: a page retired), pending until reset
    FAILED = "failed"  # the remap failed: the board needs replacing (Turing: a retirement pending)


class RecoveryAction(IntEnum):
    """nvmlDeviceGpuRecoveryAction_t (nvml.h's values): what the driver says a GPU needs after a
    fault, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION. The ones the catalogue below can set."""

    NONE = RECOVERY_ACTIONS["NONE"]
    GPU_RESET = RECOVERY_ACTIONS["GPU_RESET"]
    NODE_REBOOT = RECOVERY_ACTIONS["NODE_REBOOT"]
    DRAIN_P2P = RECOVERY_ACTIONS["DRAIN_P2P"]
    DRAIN_AND_RESET = RECOVERY_ACTIONS["DRAIN_AND_RESET"]

    @property
    def spelling(self) -> str:
        """How the control files and the saved state write it: `gpu_reset`."""
        return self.name.lower()

    @classmethod
    def from_spelling(cls, text: str) -> "RecoveryAction":
        # A dict lookup: every publish of a GPU and every GPU of a /metrics scrape asks.
        try:
            return _BY_SPELLING[text]
        except (KeyError, TypeError):  # TypeError: not hashable, not a spelling either
            pass
        raise ValueError(f"{text[:40]!r} is not a recovery action")

    @property
    def words(self) -> str:
        """The driver's words for it, as Xid 154's line prints them (the catalogue's row 154)."""
        return _ACTION_WORDS[self]

    @property
    def rank(self) -> int:
        """How much it asks: a later fault never lowers what an earlier one asked for."""
        return _ACTION_RANK.index(self)


_BY_SPELLING = {action.spelling: action for action in RecoveryAction}
_ACTION_WORDS = {
    RecoveryAction.NONE: "None",
    RecoveryAction.GPU_RESET: "GPU Reset Required",
    RecoveryAction.NODE_REBOOT: "Node Reboot Required",
    RecoveryAction.DRAIN_P2P: "Drain P2P",
    RecoveryAction.DRAIN_AND_RESET: "Drain and Reset",
}
_ACTION_RANK = (RecoveryAction.NONE, RecoveryAction.DRAIN_P2P, RecoveryAction.GPU_RESET,
                RecoveryAction.DRAIN_AND_RESET, RecoveryAction.NODE_REBOOT)

# NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate
# Action)") to the recovery action the driver sets. RESET_GPU is a GPU reset; WORKFLOW_XID_48's
# first step is one ("A GPU reset or node reboot is needed to clear this error"); RESTART_BM
# (restart the bare-metal node, Xid 79) a node reboot; WORKFLOW_NVLINK_ERR (Xid 74) drains the
# peer-to-peer traffic the link carried, then resets (an inference: the catalogue says "a GPU reset
# or node reboot is needed", and the P2P drains exist for NVLink faults). Every other bucket
# (RESTART_APP, IGNORE, WORKFLOW_XID_45, CONTACT_SUPPORT, XID_154) leaves the action as it was.
RECOVERY_BY_BUCKET = {
    "RESET_GPU": RecoveryAction.GPU_RESET,
    "WORKFLOW_XID_48": RecoveryAction.GPU_RESET,
    "RESTART_BM": RecoveryAction.NODE_REBOOT,
    "WORKFLOW_NVLINK_ERR": RecoveryAction.DRAIN_AND_RESET,
}


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
    bucket: str = ""  # the catalogue's immediate action, verbatim ("" for a code it does not list)
    ecc: EccErrors | None = None
    remap: Remap | None = None
    nvlink_errors: tuple[NvLinkCounter, ...] = ()  # +1 each on the first link that is up
    lost: bool = False  # off the bus until `lost 0` or a reset
    retirement_message: str = ""  # the text on boards that retire pages instead of remapping rows
    health: str = "degraded"  # what `gpuN/info` reports right after it on a fresh GPU (tested)

    @property
    def recovery(self) -> RecoveryAction:
        """The recovery action the driver sets for it (NONE: it leaves the action as it was)."""
        return RECOVERY_BY_BUCKET.get(self.bucket, RecoveryAction.NONE)

    @property
    def needs_reset(self) -> bool:
        """A GPU reset clears it (and nothing less does)."""
        return self.recovery in (RecoveryAction.GPU_RESET, RecoveryAction.DRAIN_AND_RESET)

    @property
    def nvml_events(self) -> tuple[str, ...]:
        """The NVML event types it raises on a fresh GPU (nvml.h names), the Xid's own first."""
        events = ["nvmlEventTypeXidCriticalError"]
        if self.ecc is not None:
            bits = "DoubleBit" if self.ecc.kind is EccKind.UNCORRECTED else "SingleBit"
            events.append(f"nvmlEventType{bits}EccError")
        if self.recovery is not RecoveryAction.NONE:  # on a GPU whose action it raises
            events.append("nvmlEventTypeGpuRecoveryAction")
        return tuple(events)


_DBE = EccErrors(EccKind.UNCORRECTED, 1)

# Messages follow real driver lines where one is known; the rest use the catalogue's description.
# `bucket` is the catalogue's "Resolution Bucket (Immediate Action)" column for the code.
XIDS: dict[int, XidRule] = {
    8: XidRule("Ch 00000008, errorString FIFO idle timeout", bucket="RESTART_APP"),
    13: XidRule(
        "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter", bucket="RESTART_APP"
    ),
    31: XidRule(
        "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f00_00000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        bucket="RESTART_APP",
    ),
    32: XidRule("Ch 00000008, Invalid or corrupted push buffer stream", bucket="RESTART_APP"),
    43: XidRule("Ch 00000008, errorString RESET_CHANNEL_VERIF_ERROR", bucket="IGNORE"),
    45: XidRule("Ch 00000008, errorString Preemptive Channel Removal", bucket="WORKFLOW_XID_45"),
    46: XidRule("GPU stopped processing", bucket="RESET_GPU", health="unhealthy"),
    48: XidRule(
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
        "subpartition 0.",
        bucket="WORKFLOW_XID_48",
        ecc=_DBE,
        remap=Remap.PENDING,
        health="unhealthy",
    ),
    61: XidRule("Internal micro-controller breakpoint/warning (PMU)", bucket="CONTACT_SUPPORT"),
    62: XidRule("Internal micro-controller halt", bucket="RESET_GPU", health="unhealthy"),
    # Pages retired instead (Turing and earlier): NVIDIA's dynamic page retirement docs' lines.
    63: XidRule(
        "Row Remapper: New row marked for remapping, reset gpu to activate.",
        bucket="IGNORE",
        remap=Remap.PENDING,
        retirement_message="Dynamic Page Retirement: New retired page, reload the driver to activate. "
        "(0x0000000000000000)",
        health="unhealthy",
    ),
    64: XidRule(
        "Row Remapper: Failed to remap row, GPU needs reset and may need replacement.",
        bucket="RESET_GPU",
        remap=Remap.FAILED,
        retirement_message="Dynamic Page Retirement: Fatal error, unable to retire page (0x0000000000000000)",
        health="unhealthy",
    ),
    68: XidRule("NVDEC0 Exception", bucket="RESTART_APP"),
    69: XidRule("Graphics Exception: Class error", bucket="RESTART_APP"),
    74: XidRule(
        "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
        bucket="WORKFLOW_NVLINK_ERR",
        nvlink_errors=(NvLinkCounter.REPLAY, NvLinkCounter.RECOVERY),
        health="unhealthy",
    ),
    79: XidRule("GPU has fallen off the bus.", bucket="RESTART_BM", lost=True, health="lost"),
    92: XidRule("High single-bit ECC error rate detected", bucket="IGNORE", ecc=EccErrors(EccKind.CORRECTED, 10)),
    94: XidRule(
        "Contained: SM (0x1). RST: No, D-RST: No",
        bucket="RESTART_APP",
        ecc=_DBE,
        remap=Remap.PENDING,
        health="unhealthy",
    ),
    95: XidRule(
        "Uncontained: FBHUB. RST: Yes, D-RST: No", bucket="RESET_GPU", ecc=_DBE, remap=Remap.PENDING, health="unhealthy"
    ),
    109: XidRule("Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005", bucket="RESET_GPU", health="unhealthy"),
    110: XidRule("Security Fault Error", bucket="RESET_GPU", health="unhealthy"),
    119: XidRule(
        "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
        bucket="RESET_GPU",
        health="unhealthy",
    ),
    120: XidRule("GSP task exception: GSP Error", bucket="RESET_GPU", health="unhealthy"),
    121: XidRule("C2C Error", bucket="IGNORE"),
    136: XidRule("Link Training Failed", bucket="RESET_GPU", health="unhealthy"),
    140: XidRule("ECC Unrecovered Error", bucket="RESET_GPU", health="unhealthy"),
    143: XidRule("GPU Initialization Error", bucket="RESET_GPU", health="unhealthy"),
    154: XidRule("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", bucket="XID_154"),
}


def xid_rule(code: int) -> XidRule:
    """The catalogue's row, or for a code it does not know: logged and counted, nothing else."""
    return XIDS.get(code) or XidRule(f"Xid {code} reported")


def xid_message(code: int, remapper: bool = True, **details: object) -> str:
    """The text after the code; `remapper=False`: on a board that retires pages instead."""
    rule = xid_rule(code)
    template = rule.message if remapper or not rule.retirement_message else rule.retirement_message
    return template.format(**details) if details else template.replace("{link}", "0")


def kernel_log_line(bdf_xid: str, code: int, gi: int | None = None, ci: int | None = None, remapper: bool = True,
                    **details: object) -> str:
    """The driver's printk text, without the kmsg header: what gpud and NPD rules match. An Xid
    the driver attributes to a MIG instance carries it in the parenthesis, as the open kernel
    modules print it: `(PCI:0000:18:00 GPU-I:02 GPU-CI:00)`."""
    where = f"PCI:{bdf_xid}" + ("" if gi is None else f" GPU-I:{gi:02d}") + ("" if ci is None else f" GPU-CI:{ci:02d}")
    return f"NVRM: Xid ({where}): {code}, pid='<unknown>', name=<unknown>, {xid_message(code, remapper, **details)}"
