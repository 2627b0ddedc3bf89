"""Xid catalog: the text the driver logs after `NVRM: Xid (PCI:dddd:bb:dd): N, ` for each code,
and the kernel log line itself (format from real dmesg; see consumer-contracts.md §6)."""
from __future__ import annotations

# Messages follow real driver lines where one is known; the rest use the catalog's description.
XID_MESSAGES: dict[int, str] = {
    8: "Ch 00000008, errorString FIFO idle timeout",
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f00_00000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    32: "Ch 00000008, Invalid or corrupted push buffer stream",
    43: "Ch 00000008, errorString RESET_CHANNEL_VERIF_ERROR",
    45: "Ch 00000008, errorString Preemptive Channel Removal",
    46: "GPU stopped processing",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0.",
    61: "Internal micro-controller breakpoint/warning (PMU)",
    62: "Internal micro-controller halt",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row, GPU needs reset and may need replacement.",
    68: "NVDEC0 Exception",
    69: "Graphics Exception: Class error",
    74: "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    110: "Security Fault Error",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
    120: "GSP task exception: GSP Error",
    121: "C2C Error",
    136: "Link Training Failed",
    140: "ECC Unrecovered Error",
    143: "GPU Initialization Error",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}

# Xids after which the GPU cannot be used until it is reset (catalog action RESET_GPU or worse).
NEEDS_RESET = frozenset({46, 62, 64, 95, 110, 119, 120, 136, 140, 143})


def xid_message(code: int, **details: object) -> str:
    template = XID_MESSAGES.get(code, f"Xid {code} reported")
    return template.format(**details) if details else template.replace("{link}", "0")


def kernel_log_line(bdf_xid: str, code: int, **details: object) -> str:
    """The driver's printk text, without the kmsg header: what gpud and NPD rules match."""
    return f"NVRM: Xid (PCI:{bdf_xid}): {code}, pid='<unknown>', name=<unknown>, {xid_message(code, **details)}"
